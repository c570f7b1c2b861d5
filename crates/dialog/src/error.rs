//! Errors of the dialog client and server, each naming what to look at.

use std::net::SocketAddr;
use std::time::Duration;

/// An operation of the dialog client failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialogError {
    /// Another live process provides the service; nothing was registered.
    #[error("service `{service}` is already provided by `{owner}`{}", if owner_addr.is_empty() { String::new() } else { format!(" on {owner_addr}") })]
    ServiceTaken {
        /// The service.
        service: String,
        /// Its provider.
        owner: String,
        /// The provider's address.
        owner_addr: String,
    },
    /// This process provides the service already (use the [`Service`](crate::Service) handle
    /// it got the first time).
    #[error("service `{0}` is already provided by this process")]
    AlreadyProvided(String),
    /// After the control server came back, another process had registered the service: this
    /// process no longer provides it.
    #[error("service `{service}` is no longer provided by this process: {reason}")]
    ServiceRevoked {
        /// The service.
        service: String,
        /// Why.
        reason: String,
    },
    /// A name is empty, too long, or has characters other than ASCII letters, digits and
    /// `- _ . : / @ +`.
    #[error("{0:?} is not a valid name (1 to 200 ASCII letters, digits or - _ . : / @ +)")]
    InvalidName(String),
    /// The name starts with `dialog/`: such services and commands are the control server's own
    /// (its directory services); nothing was registered.
    #[error("`{0}` is reserved: names starting with `dialog/` are the control server's; choose another name")]
    Reserved(String),
    /// No control server answered in time.
    #[error("no control server reachable at {addrs} within {waited:?}")]
    ControlServerUnavailable {
        /// The addresses tried.
        addrs: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The connection to the control server was lost while waiting for its answer.
    #[error("the connection to the control server was lost before it answered")]
    ControlServerLost,
    /// The control server refused the handshake.
    #[error("the control server refused the connection: {0}")]
    Refused(String),
    /// The client was shut down.
    #[error("the dialog client is shut down")]
    Shutdown,
    /// The system's random number source failed (a subscription's key could not be drawn).
    #[error("the system's random number source failed: {0}")]
    Random(String),
    /// The configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// Setting up the client (its runtime, its listening socket) failed.
    #[error("{context}: {message}")]
    Setup {
        /// What was being done.
        context: String,
        /// The error.
        message: String,
    },
}

/// The control server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("the control server cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: daqflow_transport::ListenError,
    },
    /// The server did not run for longer than its processes wait for it, and it is one of
    /// several ([`ServerConfig::end_after_stall`](crate::ServerConfig::end_after_stall)): its
    /// processes have moved to another control server, so it ended rather than serve a second
    /// directory beside theirs. Started again, it is an empty server the processes come back to
    /// when the other one goes.
    #[error(
        "the control server did not run for {stalled_ms} ms, longer than its processes wait for it: they have moved to \
         another control server, so this one ends rather than serve a second directory (start it again once they are \
         settled there)"
    )]
    Superseded {
        /// How long it did not run, in milliseconds.
        stalled_ms: u64,
    },
    /// The system's processes are split between this server and another of its set (after a
    /// network partition healed, say), and the other serves more of them (or as many, and has
    /// the lower address): this one ends, so that its processes move to the other.
    #[error(
        "the processes of this system are split between this control server ({here} of them) and {sibling} \
         ({there}): this one ends so that they join the other (start it again once they are settled there)"
    )]
    Split {
        /// The other server.
        sibling: SocketAddr,
        /// The processes this one served.
        here: u32,
        /// The processes the other serves.
        there: u32,
    },
}
