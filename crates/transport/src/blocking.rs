//! The data-plane I/O layer: framed connections driven by a thread, without an async runtime.
//!
//! The socket stays in blocking mode. Blocking calls ([`Connection::recv`],
//! [`Connection::flush`]) wait in the kernel, which is the cheapest wait for a dedicated I/O
//! thread; `try_*` calls pass `MSG_DONTWAIT` and never wait, which is what an engine task
//! polling many connections from one scheduler thread needs. Both styles work on the same
//! connection; `docs/transport.md` has the measurement that compares them.

use std::io::{self, ErrorKind};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::frame::{Frame, FrameCodec};
use socket2::Socket;

use crate::error::{ConnectError, FlushError, RecvError, SendError};
use crate::options::Attempts;
use crate::queue::{MAX_WRITE_SLICES, SendQueue};
use crate::recv_buffer::{DirectionStats, Inbox};
use crate::sys;
use crate::{ConnectionOptions, RetryPolicy, WhenFull};

const DONTWAIT: libc::c_int = libc::MSG_DONTWAIT;
/// Never raise SIGPIPE on a closed peer; report `EPIPE` instead.
const NOSIGNAL: libc::c_int = libc::MSG_NOSIGNAL;

/// A framed TCP connection for the data plane. See the [module docs](self).
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

    /// Connects to the first of `addrs` that answers, trying them in turn and backing off
    /// between rounds as `policy` says.
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
                match sys::connect(addr, opts) {
                    Ok(socket) => return Ok(Connection::from_socket(socket, addr, opts)),
                    Err(e) => {
                        tracing::debug!(%addr, attempt, error = %e, "connect failed");
                        last = Some(e);
                    }
                }
            }
            std::thread::sleep(attempts.after_failed_round(addrs, last)?);
        }
    }

    /// Wraps a connected standard-library stream.
    pub fn from_std(stream: TcpStream, opts: &ConnectionOptions) -> io::Result<Connection> {
        let peer = stream.peer_addr()?;
        stream.set_nonblocking(false)?;
        let socket = Socket::from(stream);
        sys::configure(&socket, opts)?;
        Ok(Connection::from_socket(socket, peer, opts))
    }

    fn from_socket(socket: Socket, peer: SocketAddr, opts: &ConnectionOptions) -> Connection {
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
                inbox: Inbox::new(peer, FrameCodec::new(opts.max_frame_bytes), opts.recv_chunk_bytes),
            },
        }
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
    /// The next frame, waiting for it as long as needed.
    pub fn recv(&mut self) -> Result<Frame, RecvError> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            self.read_more(0)?;
        }
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

/// A listening socket that accepts framed connections.
#[derive(Debug)]
pub struct Listener {
    socket: Socket,
    local: SocketAddr,
    opts: ConnectionOptions,
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
        let local =
            socket.local_addr().map_err(bind)?.as_socket().ok_or_else(|| bind(io::Error::other("not an IP socket")))?;
        Ok(Listener { socket, local, opts })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits for the next connection.
    pub fn accept(&self) -> Result<Connection, ListenError> {
        loop {
            if let Some(c) = self.accept_timeout(Duration::from_secs(3600))? {
                return Ok(c);
            }
        }
    }

    /// Waits at most `timeout` for the next connection.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Option<Connection>, ListenError> {
        let err = |source| ListenError::Accept { addr: self.local, source };
        if sys::wait_ready(&[self.socket.as_fd()], libc::POLLIN, Some(timeout)).map_err(err)? == 0 {
            return Ok(None);
        }
        let (socket, peer) = match self.socket.accept() {
            Ok(x) => x,
            Err(e) if would_block(&e) || e.kind() == ErrorKind::ConnectionAborted => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        socket.set_cloexec(true).map_err(err)?;
        sys::configure(&socket, &self.opts).map_err(err)?;
        let peer = peer.as_socket().ok_or_else(|| err(io::Error::other("not an IP peer")))?;
        Ok(Some(Connection::from_socket(socket, peer, &self.opts)))
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}
