//! # daqflow-runcontrol: the operator, the system file, the run's accounting and the message logger
//!
//! What drives a system of components (DAQ-Middleware's DAQ-Operator, DIALOG's master): the
//! components themselves, their contract and the run loop of a component process are in
//! `daqflow-component`; the types the operator shows its clients are in `daqflow-api`. This
//! crate holds
//!
//! - the system file ([`system`]): components, hosts, policies, groups, alarms, history, with
//!   every problem reported with its line;
//! - the [`operator`]: the pure [`operator::sequencer`] (every transition, timeout, restart,
//!   degraded running and live parameter, tested on virtual time), the supervisor of the
//!   component processes, the control servers it starts, the history's sampler and writer and
//!   the alarms' evaluator;
//! - the alarms' condition language ([`alarm`]), run [`provenance`] and the [`accounting`] of
//!   a run by the components' roles;
//! - the message logger kind ([`msglogger`]), which stores every process's log records;
//! - [`db`]: the run database (`daqflow-rundb`), SQLite or PostgreSQL.
//!
//! It knows the component kinds only through the `daqflow_component::Registry` it is given.
//! The operator guide (`docs/operator-guide.md`) describes the system file and the operator.
//!
//! ```no_run
//! let text = std::fs::read_to_string("my-system.toml")?;
//! let system = daqflow_runcontrol::system::SystemFile::parse(&text, &daqflow_component::Registry::new())?;
//! println!("{} components", system.components.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod accounting;
pub mod alarm;
mod children;
mod control_servers;
/// The run database (the crate `daqflow-rundb`): SQLite or PostgreSQL.
pub use daqflow_rundb as db;
pub mod first_error;
pub mod msglogger;
pub mod operator;
pub mod provenance;
pub mod system;
