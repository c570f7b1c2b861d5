//! # daqflow-evb: the distributed event builder
//!
//! daqflow's implementation of the CMS DAQ2 event builder (J-M Andre et al., "Performance of the CMS
//! Event Builder", J. Phys.: Conf. Ser. 898 (2017) 032020; `docs/architecture.md` maps its words to
//! the code):
//!
//! - **sources** ([`source`]) push fragments over their own TCP connection to one readout unit,
//!   free-running or paced, with sizes from a [`model`] (fixed, uniform, log-normal per stream);
//! - the **event manager** ([`evm`]) takes triggers (emulated level-1 accepts or a trigger
//!   source), hands events to builder units that asked for them with credits, tells every RU,
//!   emulates level-2 rejects, re-assigns the events of a BU that died, and accounts for every
//!   event;
//! - **readout units** ([`ru`]) store their streams' fragments in the engine's event manager
//!   without copying them, check the streams (event ids in sequence, CRCs), send the
//!   super-fragments of assigned events to their BU, and free fragments once built or rejected;
//! - **builder units** ([`bu`]) collect the super-fragments from every RU, build and check the
//!   event on builder threads, and hand it to an output: discard, files, or an ET system.
//!
//! Every component implements the component contract, [`daqflow_component::Component`]
//! (configure, start, stop, pause, resume, reset, stats); the contract's `Driver` is the one
//! state machine that runs it, and refuses illegal transitions before any hook runs. Each kind
//! module has its [`Kind`](daqflow_component::Kind) descriptor, [`evm::kind`], [`ru::kind`],
//! [`bu::kind`] and [`source::kind`]: a line each in the registry of the `daqflow` binary, where
//! `daqflow component KIND` runs one as a process and `daqflow evb local` a whole builder. Every
//! kind reports [`Stats`](daqflow_component::Stats), its own figures in the `detail` ([`stats`]).
//! The messages are in [`protocol`]; `docs/evb.md` walks through them.
//!
//! ```no_run
//! use daqflow_component::Component;
//! use daqflow_evb::{bu::{Bu, BuConfig}, evm::{Evm, EvmConfig}, ru::{Ru, RuConfig}, source::{Source, SourceConfig}};
//!
//! let mut evm = Evm::new("evm", EvmConfig { rus: 1, ..Default::default() });
//! let evm_addr = evm.configure()?["listen"].as_str().unwrap().to_owned();
//! let mut ru = Ru::new("ru-0", RuConfig { id: 0, evm: evm_addr.clone(), streams: 2, ..Default::default() });
//! let ru_addr = ru.configure()?["listen"].as_str().unwrap().to_owned();
//! let mut bu = Bu::new("bu-0", BuConfig { id: 0, evm: evm_addr, ..Default::default() });
//! bu.configure()?;
//! let mut sources: Vec<Source> = (0..2)
//!     .map(|s| Source::new(&format!("src-{s}"), SourceConfig { source_id: s, ru: ru_addr.clone(), ..Default::default() }))
//!     .collect();
//! evm.start(1)?; ru.start(1)?; bu.start(1)?;
//! for s in &mut sources { s.configure()?; s.start(1)?; }
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! let run = evm.stop(None)?;                        // the EVM stops triggering and drains
//! let trigger = run.trigger.unwrap();               // its accounting
//! for s in &mut sources { s.stop(Some(trigger.triggered))?; }
//! println!("{:?}", ru.stop(None)?);
//! let built = bu.stop(None)?;
//! assert_eq!((built.events, trigger.lost), (trigger.built, 0));
//! // Every component is ready for the next run: `start` again, no `configure`.
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```
//!
//! The kinds in a registry, driven by the contract's state machine (a configuration is
//! range-checked when the component is made, every problem naming its key):
//!
//! ```
//! use daqflow_component::{Command, Driver, Registry, State};
//! let mut registry = Registry::new();
//! registry.add(daqflow_evb::evm::kind()).add(daqflow_evb::ru::kind()).add(daqflow_evb::bu::kind(None));
//! registry.add(daqflow_evb::source::kind());
//! assert_eq!(registry.kind("source").map(|k| (k.start_stage, k.stop_stage)), Some((7, 1)));
//!
//! let mut ru = Driver::new(registry, "ru", "ru-0", Default::default());
//! assert_eq!(ru.start(1).unwrap_err().to_string(), "cannot start in state Initial");
//! // `configure` with keys over the process's own configuration, as the protocol carries it.
//! let configure: Command = serde_json::from_value(serde_json::json!({
//!     "command": "configure", "config": {"streams": 0}
//! })).unwrap();
//! let e = ru.execute(configure).unwrap_err().to_string();
//! assert_eq!(e, "configuration: ru-0: `streams` = 0 is out of range: 1 … 4096");
//! assert_eq!(ru.state(), State::Error);
//! ```
#![warn(missing_docs)]

/// Whether one of the mutation tests' deliberate faults is on ([`mutation`], feature
/// `mutation`): always false in a build without the feature.
macro_rules! mutated {
    ($m:ident) => {{
        #[cfg(feature = "mutation")]
        {
            $crate::mutation::active($crate::mutation::Mutation::$m)
        }
        #[cfg(not(feature = "mutation"))]
        {
            false
        }
    }};
}

pub mod bu;
mod common;
mod error;
pub mod evm;
mod link;
pub mod model;
#[cfg(feature = "mutation")]
pub mod mutation;
pub mod protocol;
pub mod ru;
pub mod source;
pub mod stats;
mod unit;

pub use error::EvbError;

use daqflow_engine::IdleStrategy;
use serde::{Deserialize, Serialize};

/// How a component's schedulers idle (see the engine's [`IdleStrategy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Idle {
    /// Never sleep: a core of its own, lowest latency.
    Busy,
    /// Spin a little, then yield, then park up to 1 ms.
    Default,
    /// Sleep soon: many components sharing few cores (the default).
    #[default]
    Lazy,
}

impl Idle {
    /// The engine's idle strategy.
    pub fn strategy(self) -> IdleStrategy {
        match self {
            Idle::Busy => IdleStrategy::BUSY,
            Idle::Default => IdleStrategy::default(),
            Idle::Lazy => IdleStrategy {
                spins: 20,
                yields: 4,
                park_min: std::time::Duration::from_micros(20),
                park_max: std::time::Duration::from_micros(500),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use daqflow_component::{Command, Role};
    use serde_json::json;

    #[test]
    fn each_kind_has_its_role_and_the_stages_of_the_run_order() {
        let kinds = [
            (crate::evm::kind(), "evm", Role::Trigger, (4, 0)),
            (crate::bu::kind(None), "bu", Role::Builder, (5, 3)),
            (crate::ru::kind(), "ru", Role::Readout, (6, 2)),
            (crate::source::kind(), "source", Role::Readout, (7, 1)),
        ];
        for (kind, name, role, stages) in kinds {
            assert_eq!((kind.name, kind.role, (kind.start_stage, kind.stop_stage)), (name, role, stages));
            assert_eq!(kind.data_files.is_some(), name == "bu", "{name}");
        }
    }

    #[test]
    fn a_bu_writes_data_files_in_its_directory_with_output_files() {
        let table =
            |config: serde_json::Value| match serde_json::from_value(json!({"command": "configure", "config": config}))
            {
                Ok(Command::Configure { config: Some(t) }) => t,
                other => panic!("{other:?}"),
            };
        let files = crate::bu::kind(None).data_files.expect("the BU writes files");
        assert_eq!(files(&table(json!({"output": "files", "directory": "/dev/shm/run"}))), Some("/dev/shm/run".into()));
        assert_eq!(files(&table(json!({"output": "files"}))), Some("data".into()));
        assert_eq!(files(&table(json!({"output": "discard", "directory": "/x"}))), None);
        assert_eq!(files(&table(json!({}))), None);
    }

    #[test]
    fn a_factory_refuses_a_configuration_with_every_problem_and_the_component_named() {
        let table =
            |config: serde_json::Value| match serde_json::from_value(json!({"command": "configure", "config": config}))
            {
                Ok(Command::Configure { config: Some(t) }) => t,
                other => panic!("{other:?}"),
            };
        let made =
            |kind: daqflow_component::Kind, config| (kind.factory)("c-1", table(config)).err().map(|e| e.to_string());
        assert_eq!(
            made(crate::bu::kind(None), json!({"credits": 0, "threads": 65})).as_deref(),
            Some(
                "configuration: c-1: bu: `credits` = 0 is out of range: 1 … 1048576; \
                 `threads` = 65 is out of range: 1 … 64; `request_batch` = 32 must be at most credits = 0"
            )
        );
        assert_eq!(
            made(crate::evm::kind(), json!({"rus": 0})).as_deref(),
            Some("configuration: c-1: evm: `rus` = 0 is out of range: 1 … 4096")
        );
        assert_eq!(
            made(crate::source::kind(), json!({"rate_hz": -3.0})).as_deref(),
            Some("configuration: c-1: source: `rate_hz` = -3 is out of range: 0 … 1000000000 Hz")
        );
        let unknown = made(crate::ru::kind(), json!({"streamz": 2})).unwrap_or_default();
        assert!(unknown.starts_with("configuration: c-1: unknown field `streamz`"), "{unknown}");
        // Through a registry, the kind's schema checks the table first: the key it meant.
        let mut registry = daqflow_component::Registry::new();
        registry.add(crate::ru::kind());
        let e = registry.make("ru", "c-1", table(json!({"streamz": 2}))).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("configuration: c-1: `streamz`: no such key; did you mean `streams`?"));
        for kind in [crate::evm::kind(), crate::bu::kind(None), crate::ru::kind(), crate::source::kind()] {
            assert_eq!(made(kind, json!({})), None, "the defaults are valid");
        }
    }
}
