//! # daqflow-component: the contract every component process follows, and its run loop
//!
//! Every long-running daqflow process is a **component** (DAQ-Middleware's components, iFDAQ's
//! slaves): a name, a kind, and one state machine, the same for every kind:
//!
//! ```text
//! Initial ──configure──▶ Configured ──start(run)──▶ Running ──pause──▶ Paused
//!    ▲                      │  ▲                      │  ▲               │
//!    └──────reset───────────┘  └────────stop──────────┘  └────resume─────┘
//! any state ──fault──▶ Error ──reset──▶ Initial
//! ```
//!
//! This crate holds that contract and nothing of any subsystem:
//! - the [`State`]s, and the [`Component`] trait a kind implements (only what happens in each
//!   transition);
//! - the [`Driver`], which is the state machine: it refuses illegal transitions before any
//!   hook runs, builds the component from its configuration on `configure`, and goes to Error
//!   when a hook fails or the component reports a failure during the run;
//! - the [`Kind`] descriptor (role in the run's accounting, start and stop stages, data files,
//!   factory) and the [`Registry`] of kinds a binary runs;
//! - [`Stats`], the typed counters every kind reports live and as the summary of a run;
//! - the component protocol's messages: [`Request`] ([`Command`] with a request id),
//!   [`CommandReply`], [`ComponentStatus`];
//! - [`schema`], the typed schema of a kind's configuration (keys, types, ranges, units,
//!   defaults, live states, what `configure` gives): the one place those facts live;
//! - [`checks`], the range checks between keys a kind makes itself, and
//!   [`provenance`], the system file's digest a kind that writes data files puts in them;
//! - the runtime: [`process`], the run loop every component process runs (a [`Driver`] fed
//!   from the control plane and from standard input, publishing the component's state,
//!   statistics and log), and [`log`], the capture of its log records.
//!
//! It has no database and no HTTP: a component binary, or the Python package, links this crate
//! and the control plane (`daqflow-dialog`), not the operator. The operator's types for its
//! clients are in `daqflow-api`. The event builder, the ET system and the chain implement the
//! contract; run control drives it; the `daqflow` binary registers the standard kinds.
//!
//! ```
//! use daqflow_component::{Answer, Command, Component, ComponentError, Driver, Kind, Registry, Role, State, Stats};
//!
//! struct Counter { n: u64 }
//! impl Component for Counter {
//!     fn start(&mut self, _run: u32) -> Result<(), ComponentError> { self.n = 0; Ok(()) }
//!     fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> { Ok(Stats::counted(self.n, 0)) }
//!     fn stats(&self) -> Stats { Stats::counted(self.n, 0) }
//! }
//!
//! let mut registry = Registry::new();
//! registry.add(Kind::new("counter", "counts", Role::Other, |_name, _config| Ok(Box::new(Counter { n: 0 }))));
//! let mut driver = Driver::new(registry, "counter", "c-1", toml::Table::new());
//! driver.configure(None)?;
//! driver.execute(Command::Start { run: 7 })?;
//! assert_eq!(driver.state(), State::Running);
//! assert!(driver.configure(None).is_err()); // refused: configure while running
//! let summary = driver.execute(Command::Stop { last_event: None })?;
//! assert_eq!(summary, Answer::Summary(Stats::counted(0, 0)));
//! assert_eq!(driver.state(), State::Configured); // after stop, every kind is ready for the next run
//! # Ok::<(), ComponentError>(())
//! ```
#![warn(missing_docs)]

pub mod checks;
mod command;
mod component;
mod error;
pub mod histogram;
mod kind;
pub mod log;
pub mod process;
pub mod provenance;
pub mod schema;
mod state;
mod stats;
pub mod stdin;
pub mod sync;

pub use command::{Answer, Command, CommandReply, ComponentStatus, Outcome, Request, SEQ_WINDOW, Verb};
pub use component::{Component, Driver, merge, parse_config};
pub use error::{ComponentError, ErrorKind, WireError};
pub use kind::{DEFAULT_STAGE, DataFiles, Factory, Kind, Registry, Role};
pub use state::State;
pub use stats::{Info, SlowValue, Stats, TriggerCounts};
