//! The data-plane I/O layer: framed connections driven by a thread, without an async runtime.
//!
//! The socket stays in blocking mode. Blocking calls ([`Connection::recv`],
//! [`Connection::flush`]) wait in the kernel, which is the cheapest wait for a dedicated I/O
//! thread; `try_*` calls pass `MSG_DONTWAIT` and never wait, which is what an engine task
//! polling many connections from one scheduler thread needs. Both styles work on the same
//! connection; `docs/transport.md` has the measurement that compares them.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::frame::{Frame, FrameLimits};
use socket2::Socket;

use crate::auth::{AuthError, ClientSide, HANDSHAKE_MAX_FRAME, ServerSide};
use crate::error::{ConnectError, FlushError, RecvError, SendError};
use crate::options::Attempts;
use crate::queue::{MAX_WRITE_SLICES, SendQueue};
use crate::recv_buffer::{DirectionStats, Inbox};
use crate::sys;
use crate::{ConnectionOptions, RetryPolicy, WhenFull};

const DONTWAIT: libc::c_int = libc::MSG_DONTWAIT;
/// Never raise SIGPIPE on a closed peer; report `EPIPE` instead.
const NOSIGNAL: libc::c_int = libc::MSG_NOSIGNAL;

/// A framed TCP connection for the data plane. See the module docs of `daqflow_transport::blocking`.
///
/// ```
/// use bytes::Bytes;
/// use daqflow_transport::{Connection, ConnectionOptions, Listener};
/// use daqflow_wire::frame::Frame;
/// let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::default()).unwrap();
/// let addr = listener.local_addr();
/// let sender = std::thread::spawn(move || {
///     let mut conn = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
///     for i in 0..1000u32 {
///         conn.send(Frame::new(1, Bytes::from(i.to_le_bytes().to_vec()))).unwrap();
///     }
///     conn.close().unwrap();
/// });
/// let mut conn = listener.accept().unwrap();
/// let mut n = 0u32;
/// loop {
///     match conn.recv() {
///         Ok(frame) => { assert_eq!(&frame.payload[..], &n.to_le_bytes()); n += 1 }
///         Err(e) if e.is_clean_close() => break,
///         Err(e) => panic!("{e}"),
///     }
/// }
/// assert_eq!(n, 1000);
/// sender.join().unwrap();
/// ```
#[derive(Debug)]
pub struct Connection {
    tx: SendHalf,
    rx: RecvHalf,
}

/// The sending half of a [`Connection`]; may live on another thread than the receiving half.
#[derive(Debug)]
pub struct SendHalf {
    socket: Arc<Socket>,
    peer: SocketAddr,
    queue: SendQueue,
    when_full: WhenFull,
    closed: Option<String>,
    stats: DirectionStats,
}

/// The receiving half of a [`Connection`].
#[derive(Debug)]
pub struct RecvHalf {
    socket: Arc<Socket>,
    peer: SocketAddr,
    inbox: Inbox,
}

impl Connection {
    /// Connects to `addr` once.
    pub fn connect(addr: SocketAddr, opts: &ConnectionOptions) -> Result<Connection, ConnectError> {
        Self::connect_with_retry(&[addr], opts, &RetryPolicy::once())
    }

    /// Connects to the first of `addrs` that answers and completes the
    /// [handshake](crate::auth), trying them in turn and backing off between rounds as `policy`
    /// says. A handshake that fails for good (a wrong or missing token, the wrong port) is not
    /// retried: it ends with [`ConnectError::Auth`].
    pub fn connect_with_retry(
        addrs: &[SocketAddr],
        opts: &ConnectionOptions,
        policy: &RetryPolicy,
    ) -> Result<Connection, ConnectError> {
        if addrs.is_empty() {
            return Err(ConnectError::NoAddress("empty address list".into()));
        }
        let mut attempts = Attempts::new(policy);
        loop {
            let mut last = None;
            for &addr in addrs {
                let attempt = attempts.attempt();
                let result = match sys::connect(addr, opts) {
                    Ok(socket) => {
                        let mut conn =
                            Connection::from_socket(socket, addr, opts, FrameLimits::uniform(HANDSHAKE_MAX_FRAME));
                        match conn.client_handshake(opts) {
                            Ok(()) => return Ok(conn),
                            Err(e) if e.is_permanent() => return Err(ConnectError::Auth(e)),
                            Err(e) => io::Error::other(e.to_string()),
                        }
                    }
                    Err(e) => e,
                };
                tracing::debug!(%addr, attempt, error = %result, "connect failed");
                last = Some(result);
            }
            std::thread::sleep(attempts.after_failed_round(addrs, last)?);
        }
    }

    /// Wraps a connected standard-library stream as it is: no [handshake](crate::auth) is made,
    /// so the stream must have been authenticated otherwise (or be a test's).
    pub fn from_std(stream: TcpStream, opts: &ConnectionOptions) -> io::Result<Connection> {
        let peer = stream.peer_addr()?;
        stream.set_nonblocking(false)?;
        let socket = Socket::from(stream);
        sys::configure(&socket, opts)?;
        Ok(Connection::from_socket(socket, peer, opts, FrameLimits::uniform(opts.max_frame_bytes)))
    }

    /// The client's side of the handshake, on a fresh connection.
    fn client_handshake(&mut self, opts: &ConnectionOptions) -> Result<(), AuthError> {
        let peer = self.peer_addr();
        let deadline = Instant::now() + opts.handshake_timeout;
        let challenge = self.handshake_frame(deadline, opts)?;
        let (client, response) = ClientSide::on_challenge(opts.credentials(), peer, &challenge)?;
        let io = |e: &dyn std::fmt::Display| AuthError::Io { peer, detail: e.to_string() };
        self.send(response).map_err(|e| io(&e))?;
        self.flush().map_err(|e| io(&e))?;
        let answer = self.handshake_frame(deadline, opts)?;
        client.on_answer(peer, &answer)?;
        self.rx.inbox.admit();
        self.reset_stats();
        Ok(())
    }

    /// Counters start after the handshake: they describe the protocol's traffic.
    fn reset_stats(&mut self) {
        self.tx.stats = DirectionStats::default();
        self.rx.inbox.stats = DirectionStats::default();
    }

    fn handshake_frame(&mut self, deadline: Instant, opts: &ConnectionOptions) -> Result<Frame, AuthError> {
        let peer = self.peer_addr();
        let left = deadline.saturating_duration_since(Instant::now());
        match self.recv_timeout(left) {
            Ok(Some(f)) => Ok(f),
            Ok(None) => Err(AuthError::Timeout { peer, millis: opts.handshake_timeout.as_millis() as u64 }),
            Err(RecvError::Closed { .. }) => Err(AuthError::Io {
                peer,
                detail: "closed the connection during the handshake (too busy, or it refused us)".into(),
            }),
            Err(RecvError::Protocol { source, .. }) => Err(AuthError::Malformed {
                peer,
                detail: format!("{source} (the peer is not a daqflow server of this version?)"),
            }),
            Err(e) => Err(AuthError::Io { peer, detail: e.to_string() }),
        }
    }

    fn from_socket(socket: Socket, peer: SocketAddr, opts: &ConnectionOptions, limits: FrameLimits) -> Connection {
        let socket = Arc::new(socket);
        Connection {
            tx: SendHalf {
                socket: socket.clone(),
                peer,
                queue: SendQueue::new(opts.send_queue_bytes, opts.coalesce_bytes, opts.copy_threshold_bytes)
                    .with_max_write(opts.max_write_bytes),
                when_full: opts.when_full,
                closed: None,
                stats: DirectionStats::default(),
            },
            rx: RecvHalf {
                socket,
                peer,
                inbox: Inbox::new(peer, limits, FrameLimits::uniform(opts.max_frame_bytes), opts.recv_chunk_bytes),
            },
        }
    }

    /// The largest payloads accepted from the peer from now on: a protocol sets them once the
    /// peer's hello says what it is (see [`crate::auth`]).
    pub fn set_frame_limits(&mut self, limits: FrameLimits) {
        self.rx.set_frame_limits(limits);
    }

    /// Accepts frames up to [`ConnectionOptions::max_frame_bytes`] from now on.
    pub fn admit(&mut self) {
        self.rx.admit();
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.tx.peer
    }

    /// This end's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tx.socket.local_addr()?.as_socket().ok_or_else(|| io::Error::other("not an IP socket"))
    }

    /// Splits into halves that can be used from two threads.
    pub fn split(self) -> (SendHalf, RecvHalf) {
        (self.tx, self.rx)
    }

    /// See [`SendHalf::send`].
    pub fn send(&mut self, frame: Frame) -> Result<(), SendError> {
        self.tx.send(frame)
    }
    /// See [`SendHalf::send_slice`].
    pub fn send_slice(&mut self, kind: u16, flags: u8, channel: u32, payload: &[u8]) -> Result<(), SendError> {
        self.tx.send_slice(kind, flags, channel, payload)
    }
    /// See [`SendHalf::send_slices`].
    pub fn send_slices(&mut self, kind: u16, flags: u8, channel: u32, parts: &[&[u8]]) -> Result<(), SendError> {
        self.tx.send_slices(kind, flags, channel, parts)
    }
    /// See [`SendHalf::send_parts`].
    pub fn send_parts(
        &mut self,
        kind: u16,
        flags: u8,
        channel: u32,
        prefix: &[u8],
        parts: &[Bytes],
    ) -> Result<(), SendError> {
        self.tx.send_parts(kind, flags, channel, prefix, parts)
    }
    /// See [`SendHalf::send_prefixed`].
    pub fn send_prefixed(
        &mut self,
        kind: u16,
        flags: u8,
        channel: u32,
        prefix: &[u8],
        payload: Bytes,
    ) -> Result<(), SendError> {
        self.tx.send_prefixed(kind, flags, channel, prefix, payload)
    }
    /// See [`SendHalf::flush`].
    pub fn flush(&mut self) -> Result<(), FlushError> {
        self.tx.flush()
    }
    /// See [`SendHalf::try_flush`].
    pub fn try_flush(&mut self) -> Result<bool, FlushError> {
        self.tx.try_flush()
    }
    /// See [`SendHalf::close`]. Receiving still works until the peer closes its side.
    pub fn close(&mut self) -> Result<(), FlushError> {
        self.tx.close()
    }
    /// See [`RecvHalf::recv`].
    pub fn recv(&mut self) -> Result<Frame, RecvError> {
        self.rx.recv()
    }
    /// See [`RecvHalf::try_recv`].
    pub fn try_recv(&mut self) -> Result<Option<Frame>, RecvError> {
        self.rx.try_recv()
    }
    /// See [`RecvHalf::try_recv_buffered`].
    pub fn try_recv_buffered(&mut self) -> Result<Option<Frame>, RecvError> {
        self.rx.try_recv_buffered()
    }
    /// See [`RecvHalf::recv_timeout`].
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Frame>, RecvError> {
        self.rx.recv_timeout(timeout)
    }
    /// Counters of the sending direction.
    pub fn send_stats(&self) -> DirectionStats {
        self.tx.stats
    }
    /// Counters of the receiving direction.
    pub fn recv_stats(&self) -> DirectionStats {
        self.rx.inbox.stats
    }
    /// Bytes waiting in the send queue.
    pub fn queued_bytes(&self) -> usize {
        self.tx.queue.queued_bytes()
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for Connection {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.socket.as_raw_fd()
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == ErrorKind::WouldBlock
}

impl SendHalf {
    /// Queues `frame`. Small frames are coalesced; once [`ConnectionOptions::coalesce_bytes`]
    /// are queued, they are written as far as the socket takes them without waiting. When the
    /// queue is full, [`WhenFull`] decides: wait for the peer, or give the frame back. Call
    /// [`SendHalf::flush`] (or [`SendHalf::try_flush`] from a polling task) to push out the
    /// rest.
    pub fn send(&mut self, mut frame: Frame) -> Result<(), SendError> {
        if let Some(reason) = &self.closed {
            return Err(SendError::Closed { peer: self.peer, reason: reason.clone(), frame });
        }
        loop {
            match self.queue.push(frame) {
                Ok(()) => break,
                Err(f) => {
                    frame = f;
                    match self.make_room(frame.payload.len()) {
                        Ok(()) => {}
                        Err(Room::Full) => {
                            return Err(SendError::Full { peer: self.peer, queued: self.queue.queued_bytes(), frame });
                        }
                        Err(Room::Io(source)) => return Err(SendError::Io { peer: self.peer, source }),
                    }
                }
            }
        }
        self.stats.frames += 1;
        self.write_eagerly()
    }

    /// Queues a frame copied from `payload`: no allocation for small messages.
    pub fn send_slice(&mut self, kind: u16, flags: u8, channel: u32, payload: &[u8]) -> Result<(), SendError> {
        if let Some(reason) = &self.closed {
            let frame = Frame::new(kind, Bytes::copy_from_slice(payload)).with_flags(flags).with_channel(channel);
            return Err(SendError::Closed { peer: self.peer, reason: reason.clone(), frame });
        }
        while !self.queue.push_slice(kind, flags, channel, payload) {
            if u32::try_from(payload.len()).is_err() {
                return Err(SendError::Io {
                    peer: self.peer,
                    source: io::Error::other("frame payload of 4 GiB or more"),
                });
            }
            self.make_room(payload.len()).map_err(|e| match e {
                Room::Full => SendError::Full {
                    peer: self.peer,
                    queued: self.queue.queued_bytes(),
                    frame: Frame::new(kind, Bytes::copy_from_slice(payload)).with_flags(flags).with_channel(channel),
                },
                Room::Io(source) => SendError::Io { peer: self.peer, source },
            })?;
        }
        self.stats.frames += 1;
        self.write_eagerly()
    }

    /// Queues a frame whose payload is `prefix` (copied: a sub-header) followed by `payload`
    /// (written from its own memory when large): a producer sends a fresh header in front of
    /// data it already holds without copying the data.
    pub fn send_prefixed(
        &mut self,
        kind: u16,
        flags: u8,
        channel: u32,
        prefix: &[u8],
        payload: Bytes,
    ) -> Result<(), SendError> {
        let whole = |payload: &Bytes| {
            let mut v = Vec::with_capacity(prefix.len() + payload.len());
            v.extend_from_slice(prefix);
            v.extend_from_slice(payload);
            Frame::new(kind, Bytes::from(v)).with_flags(flags).with_channel(channel)
        };
        if let Some(reason) = &self.closed {
            return Err(SendError::Closed { peer: self.peer, reason: reason.clone(), frame: whole(&payload) });
        }
        let len = prefix.len() + payload.len();
        if u32::try_from(len).is_err() {
            return Err(SendError::Io { peer: self.peer, source: io::Error::other("frame payload of 4 GiB or more") });
        }
        while !self.queue.has_room_for(len) {
            match self.make_room(len) {
                Ok(()) => {}
                Err(Room::Full) => {
                    return Err(SendError::Full {
                        peer: self.peer,
                        queued: self.queue.queued_bytes(),
                        frame: whole(&payload),
                    });
                }
                Err(Room::Io(source)) => return Err(SendError::Io { peer: self.peer, source }),
            }
        }
        self.queue.push_prefixed_unbounded(kind, flags, channel, prefix, payload);
        self.stats.frames += 1;
        self.write_eagerly()
    }

    /// Queues a frame whose payload is `prefix` followed by `parts`, gathered without copying
    /// the large parts ([`SendQueue::push_parts_unbounded`]).
    pub fn send_parts(
        &mut self,
        kind: u16,
        flags: u8,
        channel: u32,
        prefix: &[u8],
        parts: &[Bytes],
    ) -> Result<(), SendError> {
        let whole = || {
            let mut v = prefix.to_vec();
            for p in parts {
                v.extend_from_slice(p);
            }
            Frame::new(kind, Bytes::from(v)).with_flags(flags).with_channel(channel)
        };
        if let Some(reason) = &self.closed {
            return Err(SendError::Closed { peer: self.peer, reason: reason.clone(), frame: whole() });
        }
        let len = prefix.len() + parts.iter().map(Bytes::len).sum::<usize>();
        if u32::try_from(len).is_err() {
            return Err(SendError::Io { peer: self.peer, source: io::Error::other("frame payload of 4 GiB or more") });
        }
        while !self.queue.has_room_for(len) {
            match self.make_room(len) {
                Ok(()) => {}
                Err(Room::Full) => {
                    return Err(SendError::Full { peer: self.peer, queued: self.queue.queued_bytes(), frame: whole() });
                }
                Err(Room::Io(source)) => return Err(SendError::Io { peer: self.peer, source }),
            }
        }
        self.queue.push_parts_unbounded(kind, flags, channel, prefix, parts);
        self.stats.frames += 1;
        self.write_eagerly()
    }

    /// Queues a frame whose payload is the concatenation of `parts`, copied
    /// ([`SendQueue::push_slices`]): no allocation for small frames.
    pub fn send_slices(&mut self, kind: u16, flags: u8, channel: u32, parts: &[&[u8]]) -> Result<(), SendError> {
        let whole = || {
            let v: Vec<u8> = parts.concat();
            Frame::new(kind, Bytes::from(v)).with_flags(flags).with_channel(channel)
        };
        if let Some(reason) = &self.closed {
            return Err(SendError::Closed { peer: self.peer, reason: reason.clone(), frame: whole() });
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if u32::try_from(len).is_err() {
            return Err(SendError::Io { peer: self.peer, source: io::Error::other("frame payload of 4 GiB or more") });
        }
        while !self.queue.push_slices(kind, flags, channel, parts) {
            match self.make_room(len) {
                Ok(()) => {}
                Err(Room::Full) => {
                    return Err(SendError::Full { peer: self.peer, queued: self.queue.queued_bytes(), frame: whole() });
                }
                Err(Room::Io(source)) => return Err(SendError::Io { peer: self.peer, source }),
            }
        }
        self.stats.frames += 1;
        self.write_eagerly()
    }

    fn make_room(&mut self, payload_len: usize) -> Result<(), Room> {
        match self.when_full {
            WhenFull::Block => match self.write_once(NOSIGNAL) {
                Ok(_) => Ok(()),
                Err(e) => Err(Room::Io(self.fail(e))),
            },
            WhenFull::Fail => {
                match self.write_once(DONTWAIT | NOSIGNAL) {
                    Ok(_) => {}
                    Err(e) if would_block(&e) => {}
                    Err(e) => return Err(Room::Io(self.fail(e))),
                }
                if self.queue.has_room_for(payload_len) { Ok(()) } else { Err(Room::Full) }
            }
        }
    }

    fn write_eagerly(&mut self) -> Result<(), SendError> {
        while self.queue.wants_write() {
            match self.write_once(DONTWAIT | NOSIGNAL) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(SendError::Io { peer: self.peer, source: self.fail(e) }),
            }
        }
        Ok(())
    }

    /// One vectored write of what is queued; returns the bytes written.
    fn write_once(&mut self, flags: libc::c_int) -> io::Result<usize> {
        let mut slices = Vec::with_capacity(MAX_WRITE_SLICES);
        let offered = self.queue.gather(&mut slices);
        if offered == 0 {
            return Ok(0);
        }
        loop {
            match self.socket.send_vectored_with_flags(&slices, flags) {
                Ok(n) => {
                    drop(slices);
                    self.queue.advance(n);
                    self.queue.note_write(offered, n);
                    self.stats.bytes += n as u64;
                    self.stats.syscalls += 1;
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if would_block(&e) {
                        drop(slices);
                        self.queue.note_write(offered, 0);
                    }
                    return Err(e);
                }
            }
        }
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        self.closed = Some(format!("write failed: {e}"));
        let _ = self.socket.shutdown(Shutdown::Write);
        e
    }

    fn flush_error(&self, reason: &str) -> FlushError {
        FlushError::Closed { peer: self.peer, reason: reason.to_owned(), unsent: self.queue.queued_bytes() }
    }

    /// Writes everything queued, waiting for the peer as long as needed.
    pub fn flush(&mut self) -> Result<(), FlushError> {
        if let Some(reason) = &self.closed {
            return if self.queue.is_empty() { Ok(()) } else { Err(self.flush_error(&reason.clone())) };
        }
        while !self.queue.is_empty() {
            if let Err(e) = self.write_once(NOSIGNAL) {
                return Err(FlushError::Io { peer: self.peer, source: self.fail(e) });
            }
        }
        Ok(())
    }

    /// Writes as much as the socket takes now, without waiting; `true` when nothing is left.
    pub fn try_flush(&mut self) -> Result<bool, FlushError> {
        if let Some(reason) = &self.closed {
            return if self.queue.is_empty() { Ok(true) } else { Err(self.flush_error(&reason.clone())) };
        }
        while !self.queue.is_empty() {
            match self.write_once(DONTWAIT | NOSIGNAL) {
                Ok(_) => {}
                Err(e) if would_block(&e) => return Ok(false),
                Err(e) => return Err(FlushError::Io { peer: self.peer, source: self.fail(e) }),
            }
        }
        Ok(true)
    }

    /// Flushes, then shuts down the sending direction: the peer receives everything and then
    /// [`RecvError::Closed`]. Further sends fail with [`SendError::Closed`].
    pub fn close(&mut self) -> Result<(), FlushError> {
        let flushed = self.flush();
        if self.closed.is_none() {
            self.closed = Some("closed by this end".into());
            let _ = self.socket.shutdown(Shutdown::Write);
        }
        flushed
    }

    /// Bytes waiting in the send queue.
    pub fn queued_bytes(&self) -> usize {
        self.queue.queued_bytes()
    }

    /// Counters.
    pub fn stats(&self) -> DirectionStats {
        self.stats
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the sending direction is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }
}

enum Room {
    Full,
    Io(io::Error),
}

impl RecvHalf {
    /// See [`Connection::set_frame_limits`].
    pub fn set_frame_limits(&mut self, limits: FrameLimits) {
        self.inbox.set_limits(limits);
    }

    /// See [`Connection::admit`].
    pub fn admit(&mut self) {
        self.inbox.admit();
    }

    /// The next frame, waiting for it as long as needed.
    pub fn recv(&mut self) -> Result<Frame, RecvError> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            self.read_more(0)?;
        }
    }

    /// The next frame if it has been read from the socket already (a frame of the last read
    /// that was not taken yet), without a system call.
    pub fn try_recv_buffered(&mut self) -> Result<Option<Frame>, RecvError> {
        self.take_frame()
    }

    /// The next frame if one has arrived, without waiting.
    pub fn try_recv(&mut self) -> Result<Option<Frame>, RecvError> {
        if let Some(frame) = self.take_frame()? {
            return Ok(Some(frame));
        }
        if self.read_more(DONTWAIT)? { self.take_frame() } else { Ok(None) }
    }

    /// The next frame, waiting at most `timeout`; `Ok(None)` if none came.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Frame>, RecvError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(Some(frame));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = sys::wait_ready(&[self.socket.as_fd()], libc::POLLIN, Some(left))
                .map_err(|source| RecvError::Io { peer: self.peer, source })?;
            if ready == 0 {
                return Ok(None);
            }
            self.read_more(DONTWAIT)?;
        }
    }

    #[inline]
    fn take_frame(&mut self) -> Result<Option<Frame>, RecvError> {
        self.inbox.take_frame().inspect_err(|_| self.shutdown_if_poisoned())
    }

    fn shutdown_if_poisoned(&self) {
        if self.inbox.is_poisoned() {
            let _ = self.socket.shutdown(Shutdown::Both);
        }
    }

    /// One read; `Ok(false)` if nothing was there (only with `MSG_DONTWAIT`).
    fn read_more(&mut self, flags: libc::c_int) -> Result<bool, RecvError> {
        let (buf, limit) = match self.inbox.read_buf() {
            Ok(b) => b,
            Err(e) => {
                self.shutdown_if_poisoned();
                return Err(e);
            }
        };
        let spare: &mut [MaybeUninit<u8>] = &mut buf.spare_capacity_mut()[..limit];
        let result = loop {
            match self.socket.recv_with_flags(spare, flags) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        match result {
            Ok(0) => Err(self.inbox.on_eof()),
            Ok(n) => {
                let len = buf.len();
                // SAFETY: `recv` initialised the first `n` bytes of the spare capacity, which
                // start at `len` and hold at least `n` bytes.
                unsafe { buf.set_len(len + n) };
                self.inbox.on_read(n);
                Ok(true)
            }
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(self.inbox.on_error(e)),
        }
    }

    /// Counters.
    pub fn stats(&self) -> DirectionStats {
        self.inbox.stats
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

impl AsFd for RecvHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// A listening socket that accepts framed connections, each once its peer completed the
/// [handshake](crate::auth).
///
/// A thread of the listener's own accepts connections and runs their handshakes side by side
/// (at most [`ConnectionOptions::max_pending_handshakes`]; a newcomer past it makes the oldest
/// be dropped, and each gets [`ConnectionOptions::handshake_timeout`]), so that a silent or slow
/// peer never holds up the others, and [`Listener::accept_timeout`] with a zero timeout costs a
/// polling task no system call. Dropping the listener stops that thread and closes the socket.
#[derive(Debug)]
pub struct Listener {
    local: SocketAddr,
    incoming: Mutex<std::sync::mpsc::Receiver<Connection>>,
    stats: Arc<Mutex<HandshakeStats>>,
    stop: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Counters of a listener's handshakes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Connections that completed the handshake and were handed out.
    pub accepted: u64,
    /// Connections refused: wrong or missing token, another protocol, garbage.
    pub refused: u64,
    /// Connections that did not complete the handshake in time, or closed during it.
    pub abandoned: u64,
    /// Handshakes dropped to make room for a newer one, and connections dropped because the
    /// application did not take the ones waiting.
    pub evicted: u64,
}

/// Connections that completed the handshake and wait for [`Listener::accept`].
const ACCEPTED_QUEUE: usize = 256;

#[derive(Debug)]
struct Handshaking {
    conn: Connection,
    server: ServerSide,
    deadline: Instant,
}

/// Listening or accepting failed.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("accepting on {addr}: {source}")]
    Accept {
        /// The listening address.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
}

impl Listener {
    /// Listens on `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
    pub fn bind(addr: SocketAddr, opts: ConnectionOptions) -> Result<Listener, ListenError> {
        let bind = |source| ListenError::Bind { addr, source };
        let socket = sys::listen(addr, &opts).map_err(bind)?;
        socket.set_nonblocking(true).map_err(bind)?;
        let local =
            socket.local_addr().map_err(bind)?.as_socket().ok_or_else(|| bind(io::Error::other("not an IP socket")))?;
        let stop = Arc::new(sys::eventfd().map_err(bind)?);
        let stats = Arc::new(Mutex::new(HandshakeStats::default()));
        let (tx, rx) = std::sync::mpsc::sync_channel(ACCEPTED_QUEUE);
        let acceptor =
            Acceptor { socket, local, opts, out: tx, stats: stats.clone(), stop: stop.clone(), list: VecDeque::new() };
        let thread = std::thread::Builder::new()
            .name(format!("accept-{}", local.port()))
            .spawn(move || acceptor.run())
            .map_err(bind)?;
        Ok(Listener { local, incoming: Mutex::new(rx), stats, stop, thread: Some(thread) })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters of the handshakes so far.
    pub fn handshake_stats(&self) -> HandshakeStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the next authenticated connection.
    pub fn accept(&self) -> Result<Connection, ListenError> {
        loop {
            if let Some(c) = self.accept_timeout(Duration::from_secs(3600))? {
                return Ok(c);
            }
        }
    }

    /// Waits at most `timeout` for the next authenticated connection (a zero timeout only
    /// looks). The connection takes frames of at most
    /// [`ConnectionOptions::hello_max_frame_bytes`] until the protocol sets its limits
    /// ([`Connection::set_frame_limits`], [`Connection::admit`]).
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Option<Connection>, ListenError> {
        use std::sync::mpsc::RecvTimeoutError;
        let rx = self.incoming.lock().unwrap_or_else(|p| p.into_inner());
        let got = if timeout.is_zero() {
            rx.try_recv().map_err(|e| match e {
                std::sync::mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                std::sync::mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        } else {
            rx.recv_timeout(timeout)
        };
        match got {
            Ok(c) => Ok(Some(c)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(ListenError::Accept { addr: self.local, source: io::Error::other("the accepting thread ended") })
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        sys::signal_eventfd(&self.stop);
        if let Some(t) = self.thread.take() {
            // It closes the listening socket as it returns: the port is free again after this.
            let _ = t.join();
        }
    }
}

/// The listener's thread: accepts, runs handshakes, hands out the connections that completed.
struct Acceptor {
    socket: Socket,
    local: SocketAddr,
    opts: ConnectionOptions,
    out: std::sync::mpsc::SyncSender<Connection>,
    stats: Arc<Mutex<HandshakeStats>>,
    stop: Arc<OwnedFd>,
    list: VecDeque<Handshaking>,
}

impl Acceptor {
    fn count(&self, f: impl FnOnce(&mut HandshakeStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn run(mut self) {
        loop {
            let now = Instant::now();
            let wait = self.list.iter().map(|h| h.deadline.saturating_duration_since(now)).min();
            let mut fds = vec![self.stop.as_fd(), self.socket.as_fd()];
            fds.extend(self.list.iter().map(|h| h.conn.as_fd()));
            if let Err(e) = sys::wait_ready(&fds, libc::POLLIN, wait) {
                tracing::warn!(addr = %self.local, error = %e, "waiting for connections failed");
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(fds);
            if sys::eventfd_signalled(&self.stop) {
                return;
            }
            self.accept_new();
            self.progress();
        }
    }

    /// Accepts what waits in the kernel's queue and sends each its challenge.
    fn accept_new(&mut self) {
        loop {
            let (socket, peer) = match self.socket.accept() {
                Ok(x) => x,
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == ErrorKind::ConnectionAborted || e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, say: serve the handshakes under way, try again later.
                    tracing::warn!(addr = %self.local, error = %e, "accepting a connection failed");
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            };
            let configured = socket.set_nonblocking(false).and_then(|()| socket.set_cloexec(true));
            if let Err(e) = configured.and_then(|()| sys::configure(&socket, &self.opts)) {
                tracing::debug!(addr = %self.local, error = %e, "configuring an accepted socket failed");
                continue;
            }
            let Some(peer) = peer.as_socket() else { continue };
            let mut conn = Connection::from_socket(socket, peer, &self.opts, FrameLimits::uniform(HANDSHAKE_MAX_FRAME));
            let (server, challenge) = ServerSide::start(self.opts.credentials());
            if conn.send(challenge).is_err() || !matches!(conn.try_flush(), Ok(true)) {
                self.count(|s| s.abandoned += 1);
                continue;
            }
            self.list.push_back(Handshaking { conn, server, deadline: Instant::now() + self.opts.handshake_timeout });
            if self.list.len() > self.opts.max_pending_handshakes.max(1) {
                let old = self.list.pop_front().expect("non-empty");
                self.count(|s| s.evicted += 1);
                tracing::warn!(addr = %self.local, peer = %old.conn.peer_addr(),
                    "too many handshakes under way ({}): dropping the oldest", self.opts.max_pending_handshakes);
            }
        }
    }

    /// Reads the responses that arrived; hands out the connections that completed.
    fn progress(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.list.len() {
            let h = &mut self.list[i];
            let peer = h.conn.peer_addr();
            match h.conn.try_recv() {
                Ok(Some(frame)) => {
                    let mut h = self.list.remove(i).expect("index in range");
                    match h.server.on_response(peer, &frame) {
                        Ok(accept) => {
                            if h.conn.send(accept).is_ok() && matches!(h.conn.try_flush(), Ok(true)) {
                                h.conn.set_frame_limits(FrameLimits::uniform(self.opts.hello_limit()));
                                h.conn.reset_stats();
                                // Counted before it is handed out: whoever takes it sees the count.
                                self.count(|s| s.accepted += 1);
                                match self.out.try_send(h.conn) {
                                    Ok(()) => {}
                                    Err(std::sync::mpsc::TrySendError::Full(_)) => {
                                        self.count(|s| {
                                            s.accepted -= 1;
                                            s.evicted += 1;
                                        });
                                        tracing::warn!(addr = %self.local, %peer,
                                            "{ACCEPTED_QUEUE} connections wait to be taken: dropping the newest");
                                    }
                                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return,
                                }
                            } else {
                                self.count(|s| s.abandoned += 1);
                            }
                        }
                        Err((refuse, e)) => {
                            self.count(|s| s.refused += 1);
                            tracing::warn!(addr = %self.local, protocol = self.opts.protocol, "connection refused: {e}");
                            let _ = h.conn.send(refuse);
                            let _ = h.conn.try_flush();
                        }
                    }
                }
                Ok(None) if now < h.deadline => i += 1,
                Ok(None) => {
                    self.count(|s| s.abandoned += 1);
                    tracing::warn!(addr = %self.local, %peer, "connection dropped: no handshake within {:?}", self.opts.handshake_timeout);
                    self.list.remove(i);
                }
                Err(e) => {
                    // Garbage was logged where it was read; a close is a peer that gave up.
                    match e {
                        RecvError::Protocol { .. } => self.count(|s| s.refused += 1),
                        _ => self.count(|s| s.abandoned += 1),
                    }
                    tracing::debug!(addr = %self.local, %peer, "connection ended during the handshake: {e}");
                    self.list.remove(i);
                }
            }
        }
    }
}
