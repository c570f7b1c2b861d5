//! [`Kind`]: what the framework knows of a component kind besides its code: its role in the
//! run's accounting, its start and stop stages, where it writes data files, and the factory that
//! builds it; and the [`Registry`] of the kinds a binary runs.
//!
//! Adding a kind is one folder with its code and `config.rs`, and one line in the registry of
//! the `daqflow` binary (`daqflow::registry::standard()`):
//!
//! ```
//! use daqflow_component::{Component, ComponentError, Kind, Registry, Role, Stats};
//! struct Scaler;
//! impl Component for Scaler {
//!     fn start(&mut self, _run: u32) -> Result<(), ComponentError> { Ok(()) }
//!     fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> { Ok(Stats::default()) }
//! }
//! let mut registry = Registry::new();
//! registry.add(Kind::new("scaler", "reads the scalers", Role::Other, |_name, _config| Ok(Box::new(Scaler))));
//! assert_eq!(registry.kind("scaler").unwrap().start_stage, 4);
//! assert!(registry.make("scaler", "scaler-1", toml::Table::new()).is_ok());
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Component, ComponentError};

/// Builds a component of one kind from its name and configuration table.
pub type Factory = Arc<dyn Fn(&str, toml::Table) -> Result<Box<dyn Component>, ComponentError> + Send + Sync>;

/// Where a component of a kind writes the data files of a run, from its configuration.
pub type DataFiles = fn(&toml::Table) -> Option<PathBuf>;

/// The values of a component's configuration (its defaults applied) that no other component of
/// the same kind in a system may have: its identity (`source_id`, an RU's `id`), each as
/// (key, value as text). `daqflow run --check` refuses a system file where two share one.
pub type UniqueValues = fn(&toml::Table) -> Vec<(&'static str, String)>;

/// What a kind's counters mean to the accounting of a run (`Stats::events` in each sense).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Decides which events exist (the event manager): its [`TriggerCounts`](crate::TriggerCounts)
    /// say what was triggered, rejected, built and lost.
    Trigger,
    /// Reads out fragments (sources, readout units): when one dies, events not built are
    /// explained by it.
    Readout,
    /// Builds events (builder units): `events` built.
    Builder,
    /// Holds built events on their way to the recorders (the ET system).
    Buffer,
    /// Records events into data files (recorders): the files on disk are what was recorded.
    Recorder,
    /// Not part of the event accounting (message logger, monitors, the chain's components).
    Other,
}

/// A component kind, as the framework sees it.
#[derive(Clone)]
pub struct Kind {
    /// Its name in system files and on the command line (`recorder`, `bu`, …).
    pub name: &'static str,
    /// What it does, in one line (`daqflow component --list`).
    pub about: &'static str,
    /// How its counters enter the run's accounting.
    pub role: Role,
    /// Start stage: lower stages start first, the same stage together (consumers before
    /// producers). A system file may override it per component (`start_order`).
    pub start_stage: i64,
    /// Stop stage: lower stages stop first (producers before consumers; `stop_order`).
    pub stop_stage: i64,
    /// Where it writes data files, if it does: the operator reads them after the run.
    pub data_files: Option<DataFiles>,
    /// Whether the operator gives it the system file's digest in its configuration (the
    /// reserved key `system_digest`, [`crate::provenance`]), for the headers of the data
    /// files it writes.
    pub system_digest: bool,
    /// The values no two components of the kind in one system may share, if any.
    pub unique: Option<UniqueValues>,
    /// Builds a component of the kind.
    pub factory: Factory,
}

impl Kind {
    /// A kind with the stages of its role: the trigger stops first and starts after the
    /// consumers, readout starts last, recorders start early and stop late.
    pub fn new(
        name: &'static str,
        about: &'static str,
        role: Role,
        factory: impl Fn(&str, toml::Table) -> Result<Box<dyn Component>, ComponentError> + Send + Sync + 'static,
    ) -> Kind {
        let (start_stage, stop_stage) = match role {
            Role::Buffer => (1, 6),
            Role::Recorder => (2, 5),
            Role::Trigger => (4, 0),
            Role::Builder => (5, 3),
            Role::Readout => (6, 2),
            Role::Other => (DEFAULT_STAGE, DEFAULT_STAGE),
        };
        Kind {
            name,
            about,
            role,
            start_stage,
            stop_stage,
            data_files: None,
            system_digest: false,
            unique: None,
            factory: Arc::new(factory),
        }
    }

    /// With other stages.
    pub fn stages(mut self, start: i64, stop: i64) -> Kind {
        self.start_stage = start;
        self.stop_stage = stop;
        self
    }

    /// Writes data files where `f` says.
    pub fn data_files(mut self, f: DataFiles) -> Kind {
        self.data_files = Some(f);
        self
    }

    /// No two components of the kind in one system may have the same values of `f` (their
    /// identity: a source's `source_id`, a readout unit's `id`).
    pub fn unique(mut self, f: UniqueValues) -> Kind {
        self.unique = Some(f);
        self
    }

    /// Takes the system file's digest in the reserved configuration key `system_digest`
    /// ([`crate::provenance::SYSTEM_DIGEST_KEY`]): its configuration must accept that key and
    /// put the digest in its data files' headers.
    pub fn takes_system_digest(mut self) -> Kind {
        self.system_digest = true;
        self
    }
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kind")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("start_stage", &self.start_stage)
            .field("stop_stage", &self.stop_stage)
            .finish_non_exhaustive()
    }
}

/// The stages of a component whose kind the binary does not know (a foreign process).
pub const DEFAULT_STAGE: i64 = 4;

/// The component kinds a binary can run, by name.
#[derive(Clone, Default, Debug)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Kind>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds (or replaces) a kind.
    pub fn add(&mut self, kind: Kind) -> &mut Registry {
        self.kinds.insert(kind.name, kind);
        self
    }

    /// The kinds' names, sorted.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.kinds.keys().copied().collect()
    }

    /// A kind by name.
    pub fn kind(&self, name: &str) -> Option<&Kind> {
        self.kinds.get(name)
    }

    /// Every kind, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Kind> {
        self.kinds.values()
    }

    /// Builds a component.
    pub fn make(&self, kind: &str, name: &str, config: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
        let k = self
            .kinds
            .get(kind)
            .ok_or_else(|| ComponentError::UnknownKind(kind.to_owned(), self.kinds().join(", ")))?;
        (k.factory)(name, config)
    }
}
