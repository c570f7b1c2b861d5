//! The errors of the component framework.

/// Why a component refused or failed a command.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The command is not allowed in the component's state (the state machine of `docs/architecture.md`).
    #[error("cannot {command} in state {state}")]
    IllegalTransition {
        /// The command refused.
        command: &'static str,
        /// The state the component is in.
        state: &'static str,
    },
    /// The configuration is wrong: an unknown or missing key, a bad value.
    #[error("configuration: {0}")]
    Config(String),
    /// The component kind is not known to this binary.
    #[error("unknown component kind `{0}` (known: {1})")]
    UnknownKind(String, String),
    /// A command's payload could not be read; the text says why.
    #[error("bad command: {0}")]
    BadCommand(String),
    /// A request the component does not take in its state (a live parameter it does not
    /// declare, or not now); nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The hook failed; the text says why.
    #[error("{0}")]
    Failed(String),
}

impl From<std::io::Error> for ComponentError {
    fn from(e: std::io::Error) -> Self {
        ComponentError::Failed(e.to_string())
    }
}
