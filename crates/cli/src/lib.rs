//! The `daqflow` binary's library part: what its commands and its integration tests share.
#![warn(missing_docs)]

pub mod hosts;
/// The standard component kinds ([`daqflow_kinds`]), as `daqflow::registry`.
pub use daqflow_kinds as registry;
