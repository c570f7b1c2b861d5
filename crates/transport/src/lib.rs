//! # daqflow-transport: framed TCP for every daqflow protocol
//!
//! Every daqflow process talks to the others over TCP connections carrying
//! [`daqflow_wire::frame`] frames. This crate moves them:
//!
//! - a **framing and coalescing core** with no I/O inside: [`SendQueue`] copies small frames
//!   together into chunks of up to 128 KiB and gathers queued bytes for one vectored write,
//!   passing large payloads from their own memory; [`RecvBuffer`] receives into reusable buffers
//!   and hands out frames whose payloads are slices of them, never copies;
//! - a **data-plane layer** ([`Connection`], [`Listener`]) for threads and engine tasks: blocking
//!   calls wait in the kernel, `try_*` calls never wait;
//! - a **control-plane layer** on tokio ([`AsyncConnection`], [`AsyncListener`],
//!   [`FrameSender`], [`FrameReceiver`]) with a writer task per connection.
//!
//! Every connection starts with an [authentication handshake](auth): the listener proves and
//! checks the system token (when one is set) and names its protocol before the first protocol
//! frame, accepted connections take only small frames until the protocol has read the peer's
//! hello, and partial frames held by the process are bounded ([`budget`]). `docs/security.md`
//! says what each port accepts from whom.
//!
//! Both layers connect with retry and back-off ([`RetryPolicy`]), set `TCP_NODELAY` and socket
//! buffer sizes ([`ConnectionOptions`]), bound their send queues in bytes with a policy to block
//! or fail when full ([`WhenFull`]), close cleanly, and treat garbage from a peer as that
//! connection's error: it is logged, that connection is closed, and nothing else is affected.
//!
//! ```
//! use bytes::Bytes;
//! use daqflow_transport::{Connection, ConnectionOptions, Listener};
//! use daqflow_wire::frame::Frame;
//!
//! let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::default()).unwrap();
//! let addr = listener.local_addr();
//! std::thread::spawn(move || {
//!     let mut conn = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
//!     conn.send(Frame::new(1, Bytes::from_static(b"fragment")).with_channel(7)).unwrap();
//!     conn.flush().unwrap();
//! });
//! let mut conn = listener.accept().unwrap();
//! let frame = conn.recv().unwrap();
//! assert_eq!((frame.kind, frame.channel, &frame.payload[..]), (1, 7, &b"fragment"[..]));
//! ```
//!
//! A listener bound to a wildcard tells its peers an address they reach ([`advertise`]).
//!
//! `docs/transport.md` describes the design and its measurements.
#![warn(missing_docs)]

pub mod advertise;
mod async_io;
pub mod auth;
mod blocking;
mod error;
mod options;
mod queue;
mod recv_buffer;
mod sys;

pub use async_io::{AsyncConnection, AsyncListener, FrameReceiver, FrameSender};
pub use blocking::{Connection, HandshakeStats, ListenError, Listener, RecvHalf, SendHalf};
pub use error::{ConnectError, FlushError, RecvError, SendError};
pub use options::{ConnectionOptions, RetryPolicy, WhenFull};
pub use queue::{MAX_WRITE_SLICES, SendQueue};
pub use recv_buffer::{DirectionStats, RecvBuffer, budget};
pub use sys::wait_ready;
