//! Connections between components: binding, connecting, the hello exchange, and a peer record
//! for the polling tasks.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use daqflow_engine::readiness;
use daqflow_transport::{Connection, ConnectionOptions, Listener, RecvError, RetryPolicy, WhenFull};
use daqflow_wire::frame::Frame;

use crate::EvbError;
use crate::protocol::{Message, Role};

/// Resolves `addr` (`host:port`).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr, EvbError> {
    addr.to_socket_addrs()
        .map_err(|e| EvbError::Config(format!("address `{addr}`: {e}")))?
        .next()
        .ok_or_else(|| EvbError::Config(format!("address `{addr}` resolves to nothing")))
}

/// Options for control links: a full queue is the peer's problem, never a hang of ours.
pub(crate) fn control_options() -> ConnectionOptions {
    ConnectionOptions {
        when_full: WhenFull::Fail,
        send_queue_bytes: 64 << 20,
        ..ConnectionOptions::for_protocol(crate::protocol::PROTOCOL)
    }
}

/// Options for data links (fragments, super-fragments).
pub(crate) fn data_options() -> ConnectionOptions {
    ConnectionOptions { send_queue_bytes: 16 << 20, ..ConnectionOptions::for_protocol(crate::protocol::PROTOCOL) }
}

/// What a peer that said hello may send: every message small (64 KiB), and `large` for the
/// kinds its role sends in bulk.
pub(crate) fn limits(large: &[(u16, u32)]) -> daqflow_wire::frame::FrameLimits {
    large.iter().fold(daqflow_wire::frame::FrameLimits::uniform(64 << 10), |l, &(kind, max)| l.with_kind(kind, max))
}

/// Options for the RU's side of its data links: super-fragments are gathered from the memory
/// their fragments were received into; only fragments under 512 bytes are copied together.
/// Fragments are received into 1 MiB chunks, so that fragments up to 128 KiB (an eighth) come
/// many to a read: with the default 256 KiB, a 64 KiB fragment took a read of its header and
/// one of its body, and every read's window update made the RU's thread transmit the sources'
/// queued data in its own system call (loopback).
pub(crate) fn ru_data_options() -> ConnectionOptions {
    ConnectionOptions { copy_threshold_bytes: GATHER_FROM - 1, recv_chunk_bytes: 1 << 20, ..data_options() }
}

/// Payloads of this size and more that a sender holds already (the RU's stored fragments, a
/// cached-payload source's pattern) are written from their own memory; smaller ones are copied
/// into the send chunk with their headers.
pub(crate) const GATHER_FROM: usize = 512;

pub(crate) fn bind(addr: &str, opts: ConnectionOptions) -> Result<Listener, EvbError> {
    let a = resolve(addr)?;
    Listener::bind(a, opts)
        .map_err(|e| EvbError::Io { what: format!("listening on {addr}"), source: std::io::Error::other(e) })
}

/// Connects (retrying for `patience`) and says hello.
pub(crate) fn connect(
    addr: &str,
    opts: &ConnectionOptions,
    patience: Duration,
    hello: &Message,
) -> Result<Connection, EvbError> {
    let a = resolve(addr)?;
    let mut conn = Connection::connect_with_retry(&[a], opts, &RetryPolicy::for_duration(patience))
        .map_err(|e| EvbError::Failed(format!("cannot connect to {addr}: {e}")))?;
    conn.send(hello.to_frame()).map_err(|e| EvbError::Failed(format!("saying hello to {addr}: {e}")))?;
    conn.flush().map_err(|e| EvbError::Failed(format!("saying hello to {addr}: {e}")))?;
    Ok(conn)
}

/// A connected peer as the polling tasks see it.
pub(crate) struct Peer {
    pub conn: Connection,
    pub role: Option<Role>,
    pub id: u32,
    pub name: String,
    pub since: Instant,
    /// A frame taken off the socket by a poll and not handled yet.
    pub stash: Option<Frame>,
    pub closed: Option<String>,
    /// Frames received so far.
    pub frames: u64,
}

impl Peer {
    pub fn new(conn: Connection) -> Peer {
        let now = Instant::now();
        Peer { conn, role: None, id: 0, name: String::new(), since: now, stash: None, closed: None, frames: 0 }
    }

    pub fn label(&self) -> String {
        match self.role {
            Some(r) => format!("{} {} ({}, {})", role_name(r), self.id, self.name, self.conn.peer_addr()),
            None => format!("unidentified peer {}", self.conn.peer_addr()),
        }
    }

    /// Takes the next frame (the stashed one first) without waiting; a closed or broken
    /// connection is remembered in `closed`. A socket found empty is not read again until the
    /// scheduler running this thread learns it is readable ([`daqflow_engine::readiness`]):
    /// an idle cycle then costs no system call for it.
    pub fn next(&mut self) -> Option<Frame> {
        if let Some(f) = self.stash.take() {
            return Some(f);
        }
        if self.closed.is_some() {
            return None;
        }
        // A frame already read comes first; the cache is asked only before a system call.
        let got = match self.conn.try_recv_buffered() {
            Ok(None) => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(&self.conn);
                if readiness::worth_reading(fd) {
                    let got = self.conn.try_recv();
                    if matches!(got, Ok(None)) {
                        readiness::found_empty(fd);
                    }
                    got
                } else {
                    Ok(None)
                }
            }
            other => other,
        };
        match got {
            Ok(Some(f)) => {
                self.frames += 1;
                Some(f)
            }
            Ok(None) => None,
            Err(e) => {
                self.closed = Some(match e {
                    RecvError::Closed { .. } => "closed the connection".to_owned(),
                    e => e.to_string(),
                });
                None
            }
        }
    }

    /// Polls for a frame and keeps it for the action: whether there is one (or the connection
    /// just closed, which the action must handle too).
    pub fn poll(&mut self) -> bool {
        if self.stash.is_some() {
            return true;
        }
        if self.closed.is_some() {
            return false;
        }
        let was_open = self.closed.is_none();
        self.stash = self.next();
        self.stash.is_some() || (was_open && self.closed.is_some())
    }

    /// Whether the peer is still there, for a connection nothing is read from (a BU's at the
    /// RU): looks at the socket without taking anything (`MSG_PEEK`); an end of stream or an
    /// error marks the peer closed. A peer that is merely stuck (stopped, swapping) is still
    /// there.
    pub fn alive(&mut self) -> bool {
        if self.closed.is_some() {
            return false;
        }
        let mut b = [0u8; 1];
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.conn);
        // SAFETY: recv writes at most one byte into `b`, a local array, from a descriptor the
        // connection keeps open.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        let gone = match n {
            0 => Some("closed the connection".to_owned()),
            n if n > 0 => None,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => None,
                    _ => Some(e.to_string()),
                }
            }
        };
        if let Some(why) = gone {
            self.closed = Some(why);
            return false;
        }
        true
    }

    /// The socket to wait on for this peer's next frame (none once it closed).
    pub fn wait_fd(&self, out: &mut Vec<std::os::fd::RawFd>) {
        if self.closed.is_none() && self.stash.is_none() {
            out.push(std::os::fd::AsRawFd::as_raw_fd(&self.conn));
        }
    }

    /// Sends a frame; an error closes the peer.
    pub fn send(&mut self, frame: Frame) -> bool {
        if self.closed.is_some() {
            return false;
        }
        match self.conn.send(frame) {
            Ok(()) => true,
            Err(e) => {
                self.closed = Some(format!("sending failed: {e}"));
                false
            }
        }
    }

    /// Sends a frame gathered from a prefix and parts; an error closes the peer.
    pub fn send_parts(&mut self, kind: u16, prefix: &[u8], parts: &[bytes::Bytes]) -> bool {
        if self.closed.is_some() {
            return false;
        }
        match self.conn.send_parts(kind, 0, 0, prefix, parts) {
            Ok(()) => true,
            Err(e) => {
                self.closed = Some(format!("sending failed: {e}"));
                false
            }
        }
    }

    /// Pushes queued bytes without waiting.
    pub fn try_flush(&mut self) {
        if self.closed.is_none()
            && self.conn.queued_bytes() > 0
            && let Err(e) = self.conn.try_flush()
        {
            self.closed = Some(format!("sending failed: {e}"));
        }
    }
}

pub(crate) fn role_name(r: Role) -> &'static str {
    match r {
        Role::Source => "source",
        Role::Ru => "RU",
        Role::Bu => "BU",
        Role::Trigger => "trigger source",
    }
}

/// Milliseconds since the Unix epoch, for summaries.
pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}
