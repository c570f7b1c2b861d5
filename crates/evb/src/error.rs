//! Errors of the event builder.

use crate::protocol::ProtocolError;

/// What can go wrong in an event-builder component.
#[derive(Debug, thiserror::Error)]
pub enum EvbError {
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(String),
    /// A socket could not be opened, connected or used.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A peer sent something that is not a valid message.
    #[error("{peer}: {source}")]
    Protocol {
        /// Who sent it.
        peer: String,
        /// What is wrong.
        source: ProtocolError,
    },
    /// The run cannot go on (a peer died, a stream broke, the EVM aborted).
    #[error("run failed: {0}")]
    Failed(String),
    /// Writing the output failed.
    #[error("output: {0}")]
    Output(String),
}

impl EvbError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> EvbError {
        EvbError::Io { what: what.into(), source }
    }
}

impl From<EvbError> for daqflow_component::ComponentError {
    fn from(e: EvbError) -> Self {
        match e {
            EvbError::Config(c) => daqflow_component::ComponentError::Config(c),
            other => daqflow_component::ComponentError::Failed(other.to_string()),
        }
    }
}
