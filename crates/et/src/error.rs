//! Errors of the ET system and its clients.

/// An ET operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum EtError {
    /// No ET system of that name runs on this machine (or answers at that address).
    #[error("no ET system named `{0}` is running here (start one with `daqflow et start --name {0}`)")]
    NotFound(String),
    /// An ET system of that name runs already.
    #[error("an ET system named `{0}` is running already")]
    NameTaken(String),
    /// The ET system died or stopped; attach again when it is back.
    #[error("the ET system `{0}` is gone (it stopped or died)")]
    SystemDead(String),
    /// The attachment was declared dead (its heartbeat stopped) and its events taken back.
    #[error("attachment {0} was declared dead by the ET system; attach again")]
    AttachmentDead(u32),
    /// No such station.
    #[error("no station named `{0}`")]
    NoSuchStation(String),
    /// A station of that name exists already.
    #[error("a station named `{0}` exists already")]
    StationExists(String),
    /// The request is not possible (the message says why).
    #[error("{0}")]
    Refused(String),
    /// No event came within the wait.
    #[error("no event within the wait")]
    Timeout,
    /// An event was put to an attachment that did not hand it out.
    #[error("event {idx} belongs to another attachment")]
    NotOwned {
        /// The event's index.
        idx: u32,
    },
    /// The operating system refused something.
    #[error("{context}: {message}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        message: String,
    },
    /// The peer (ET process or remote client) sent something malformed.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl EtError {
    pub(crate) fn io(context: impl Into<String>, e: impl std::fmt::Display) -> EtError {
        EtError::Io { context: context.into(), message: e.to_string() }
    }
}
