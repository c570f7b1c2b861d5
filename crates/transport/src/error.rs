//! Errors of the transport, one enum per operation. Sends hand the frame back when they fail
//! before it was queued, so that nothing is lost silently.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use daqflow_wire::frame::{Frame, FrameError};

/// Connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Every attempt failed; the policy's attempts or deadline ran out.
    #[error("could not connect to {addrs} ({attempts} attempts in {elapsed:.1?}): {last}")]
    GaveUp {
        /// The addresses tried, comma-separated.
        addrs: String,
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
        /// The last attempt's error.
        last: io::Error,
    },
    /// No address was given, or a name did not resolve to one.
    #[error("no address to connect to: {0}")]
    NoAddress(String),
    /// The handshake failed in a way that trying again cannot mend (a wrong or missing token,
    /// the wrong port).
    #[error("{0}")]
    Auth(#[from] crate::auth::AuthError),
}

/// A frame could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The send queue is full and the policy is [`WhenFull::Fail`](crate::WhenFull::Fail); the
    /// frame was not queued and is given back.
    #[error("send queue to {peer} is full ({queued} bytes wait); frame of kind {} not queued", frame.kind)]
    Full {
        /// The peer.
        peer: SocketAddr,
        /// Bytes waiting in the queue.
        queued: usize,
        /// The frame, not sent.
        frame: Frame,
    },
    /// The connection was closed (by us, or after an error); the frame is given back.
    #[error("connection to {peer} is closed ({reason}); frame of kind {} not sent", frame.kind)]
    Closed {
        /// The peer.
        peer: SocketAddr,
        /// Why it is closed.
        reason: String,
        /// The frame, not sent.
        frame: Frame,
    },
    /// Writing failed; queued frames are lost with the connection, which is now closed.
    #[error("writing to {peer}: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

impl SendError {
    /// The frame, if the error gave it back.
    pub fn into_frame(self) -> Option<Frame> {
        match self {
            SendError::Full { frame, .. } | SendError::Closed { frame, .. } => Some(frame),
            SendError::Io { .. } => None,
        }
    }
}

/// Flushing or closing failed.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The connection was closed before everything was written.
    #[error("connection to {peer} closed with {unsent} bytes unsent ({reason})")]
    Closed {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: String,
        /// Bytes that were queued and not written.
        unsent: usize,
    },
    /// Writing failed.
    #[error("writing to {peer}: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

/// A frame could not be received.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The peer closed the connection cleanly, between two frames.
    #[error("{peer} closed the connection")]
    Closed {
        /// The peer.
        peer: SocketAddr,
    },
    /// The peer closed the connection in the middle of a frame.
    #[error("{peer} closed the connection in the middle of a frame ({buffered} bytes of it received)")]
    Truncated {
        /// The peer.
        peer: SocketAddr,
        /// Bytes of the partial frame.
        buffered: usize,
    },
    /// The peer sent bytes that are not daqflow frames (or a frame over the size limit); the
    /// connection was closed and the error logged.
    #[error("{peer} sent invalid data, connection closed: {source}")]
    Protocol {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong.
        source: FrameError,
    },
    /// The peer's frame under way would take this process past its budget for partial frames
    /// (`DAQFLOW_RECV_BUDGET_BYTES`); the connection was closed.
    #[error(
        "{peer}: a frame of {need} bytes under way would take partial frames past this process's budget ({in_use} of {budget} bytes in use; DAQFLOW_RECV_BUDGET_BYTES raises it); connection closed"
    )]
    OverBudget {
        /// The peer.
        peer: SocketAddr,
        /// The frame's size.
        need: usize,
        /// Bytes of partial frames held when it came.
        in_use: usize,
        /// The budget.
        budget: usize,
    },
    /// Reading failed.
    #[error("reading from {peer}: {source}")]
    Io {
        /// The peer.
        peer: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

impl RecvError {
    /// Whether the peer simply went away (closed cleanly), as opposed to an error.
    pub fn is_clean_close(&self) -> bool {
        matches!(self, RecvError::Closed { .. })
    }
}
