//! # daqflow-runcontrol: components, the operator, the run database and the message logger
//!
//! Every long-running daqflow process is a **component** (`DESIGN.md`, process model): a name,
//! a kind and the state machine Initial → Configured → Running ⇄ Paused, with Error and reset.
//! This crate holds
//!
//! - the component framework ([`component`]): the [`Component`](component::Component) trait, the
//!   [`Driver`](component::Driver) that enforces the state machine, and the [`process`] run loop
//!   that binds a component to the control plane (commands `<name>/…`, services `<name>/state`,
//!   `<name>/stats`, `<name>/log`) and to its standard input;
//! - the standard components: `et`, `recorder`, `monitor`, `repeater`, `sink`, `generator`,
//!   `msglogger`, besides the event builder's `source`, `evm`, `ru`, `bu` ([`registry`]);
//! - the operator: the system file, process launching, transitions in order, policies, the run
//!   database.
//!
//! The operator guide (`docs/operator-guide.md`) describes the system file and writing a
//! component of one's own.
#![warn(missing_docs)]

pub mod accounting;
pub mod alarm;
mod children;
mod control_servers;
/// The run database (the crate `daqflow-rundb`): SQLite or PostgreSQL.
pub use daqflow_rundb as db;
pub mod log;
pub mod msglogger;
pub mod operator;
pub mod process;
pub mod provenance;
pub mod system;
