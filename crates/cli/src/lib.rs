//! The `daqflow` binary's library part: what its commands and its integration tests share.
#![warn(missing_docs)]

pub mod hosts;
pub mod registry;
