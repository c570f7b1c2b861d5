//! Errors of the event builder.

use crate::protocol::ProtocolError;

/// What can go wrong in an event-builder component.
#[derive(Debug, thiserror::Error)]
pub enum EvbError {
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(String),
    /// The component cannot carry out the command now: `start` before `configure` or during a
    /// run, `stop` or `pause` with no run. Called through the component contract's `Driver`,
    /// which refuses illegal transitions before any hook runs, a component never says this.
    #[error("cannot {command}: {why}")]
    Refused {
        /// The command.
        command: &'static str,
        /// Why not.
        why: &'static str,
    },
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

    pub(crate) fn refused(command: &'static str, why: &'static str) -> EvbError {
        EvbError::Refused { command, why }
    }
}

/// Why a command cannot be carried out now.
pub(crate) const NOT_CONFIGURED: &str = "the component is not configured";
/// Why a command cannot be carried out now.
pub(crate) const IN_RUN: &str = "a run is taken";
/// Why a command cannot be carried out now.
pub(crate) const NO_RUN: &str = "no run is taken";

impl From<EvbError> for daqflow_component::ComponentError {
    fn from(e: EvbError) -> Self {
        match e {
            EvbError::Config(c) => daqflow_component::ComponentError::Config(c),
            other => daqflow_component::ComponentError::Failed(other.to_string()),
        }
    }
}
