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
    /// The request goes over one of the system's limits; nothing was taken or allocated for it.
    #[error("{}", .limit.describe(*.requested, *.max))]
    OverLimit {
        /// Which limit.
        limit: Limit,
        /// What the request would have brought the limited quantity to.
        requested: u64,
        /// The limit.
        max: u64,
    },
    /// The ET system does not accept local connections from this process's user.
    #[error(
        "the ET system `{name}` (run by uid {owner}) does not accept local connections from uid {uid}; \
         its owner can allow them with allowed_uids (`daqflow et start --allow-uid {uid}`)"
    )]
    AccessDenied {
        /// The system's name.
        name: String,
        /// The user the ET process runs as.
        owner: u32,
        /// The user refused.
        uid: u32,
    },
}

/// A limit of an ET system (a field of [`SystemConfig`](crate::SystemConfig)) that protects its
/// memory and its attachment slots from what one client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Limit {
    /// The largest event `new_events` may ask for, in bytes: `max_event_bytes`.
    EventBytes,
    /// Temporary buffers of large events in the whole system: `max_temp_events`.
    TempEvents,
    /// Large events one attachment holds at a time: `max_temp_per_attachment`.
    TempEventsPerAttachment,
    /// Bytes of temporary buffers in the whole system: `max_temp_bytes`.
    TempBytes,
    /// Attachments of one connection (a local `EtClient`, a remote client's TCP connection):
    /// `max_attachments_per_connection`.
    AttachmentsPerConnection,
}

impl Limit {
    /// The [`SystemConfig`](crate::SystemConfig) field, and the `et` component's key, that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Limit::EventBytes => "max_event_bytes",
            Limit::TempEvents => "max_temp_events",
            Limit::TempEventsPerAttachment => "max_temp_per_attachment",
            Limit::TempBytes => "max_temp_bytes",
            Limit::AttachmentsPerConnection => "max_attachments_per_connection",
        }
    }

    /// The `daqflow et start` flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::EventBytes => "--max-event-bytes",
            Limit::TempEvents => "--max-temp",
            Limit::TempEventsPerAttachment => "--max-temp-per-attachment",
            Limit::TempBytes => "--max-temp-bytes",
            Limit::AttachmentsPerConnection => "--max-attachments-per-connection",
        }
    }

    fn describe(self, requested: u64, max: u64) -> String {
        let what = match self {
            Limit::EventBytes => format!("an event of {requested} bytes is larger than the limit of {max} bytes"),
            Limit::TempEvents => {
                format!("{requested} temporary buffers for large events would be in use, more than the limit of {max}")
            }
            Limit::TempEventsPerAttachment => format!(
                "the attachment would hold {requested} large events, more than the limit of {max} per attachment"
            ),
            Limit::TempBytes => {
                format!("temporary buffers for large events would take {requested} bytes, more than the limit of {max}")
            }
            Limit::AttachmentsPerConnection => format!(
                "the connection would have {requested} attachments, more than the limit of {max} per connection"
            ),
        };
        format!("{what}; the ET system's {} raises it (`daqflow et start {}`)", self.key(), self.flag())
    }
}

impl EtError {
    pub(crate) fn io(context: impl Into<String>, e: impl std::fmt::Display) -> EtError {
        EtError::Io { context: context.into(), message: e.to_string() }
    }
}

impl From<EtError> for daqflow_component::ComponentError {
    fn from(e: EtError) -> Self {
        daqflow_component::ComponentError::Failed(format!("ET: {e}"))
    }
}
