//! # daqflow-evb: the distributed event builder
//!
//! daqflow's implementation of the CMS DAQ2 event builder (`../shared/seeds/002_*.txt`):
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
//! Every component implements [`component::Component`] (configure, start, stop, reset, stats);
//! `daqflow component KIND` runs one as a process and `daqflow evb local` a whole builder.
//! The messages are in [`protocol`]; `docs/evb.md` walks through them.
//!
//! ```no_run
//! use daqflow_evb::component::Component;
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
//! let last = evm.stop(None)?;                       // the EVM stops triggering and drains
//! # let _ = last;
//! for s in &mut sources { s.stop(None)?; }
//! println!("{}", ru.stop(None)?);
//! println!("{}", bu.stop(None)?);
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```
#![warn(missing_docs)]

pub mod bu;
pub mod component;
mod error;
pub mod evm;
mod link;
pub mod model;
pub mod protocol;
pub mod ru;
pub mod source;

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
