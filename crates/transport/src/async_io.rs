//! The control-plane I/O layer, on tokio.
//!
//! [`AsyncConnection::split`] gives a [`FrameSender`] (cheap to clone, usable from many tasks)
//! and a [`FrameReceiver`]. Senders put frames into a queue bounded in bytes; a writer task per
//! connection takes everything queued (coalesced into chunks of up to 128 KiB) and writes it with
//! one vectored write, so frames sent while a write is under way leave together in the next one.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, Bytes, BytesMut};
use daqflow_wire::frame::{FRAME_HEADER_LEN, Frame, FrameCodec, FrameHeader, FrameLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;

use crate::auth::{AuthError, ClientSide, HANDSHAKE_MAX_FRAME, ServerSide};
use crate::blocking::{HandshakeStats, ListenError};
use crate::error::{ConnectError, FlushError, RecvError, SendError};
use crate::options::Attempts;
use crate::queue::{MAX_WRITE_SLICES, SendQueue};
use crate::recv_buffer::{DirectionStats, Inbox};
use crate::sys;
use crate::{ConnectionOptions, RetryPolicy, WhenFull};

/// A connected framed TCP stream, before it is split into sender and receiver.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use bytes::Bytes;
/// use daqflow_transport::{AsyncConnection, AsyncListener, ConnectionOptions};
/// use daqflow_wire::frame::Frame;
/// let listener = AsyncListener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::default()).await.unwrap();
/// let addr = listener.local_addr();
/// let client = tokio::spawn(async move {
///     let (tx, _rx) = AsyncConnection::connect(addr, &ConnectionOptions::default()).await.unwrap().split();
///     tx.send(Frame::new(1, Bytes::from_static(b"hello"))).await.unwrap();
///     tx.close().await.unwrap();
/// });
/// let (_tx, mut rx) = listener.accept().await.unwrap().split();
/// assert_eq!(&rx.recv().await.unwrap().payload[..], b"hello");
/// assert!(rx.recv().await.unwrap_err().is_clean_close());
/// client.await.unwrap();
/// # });
/// ```
#[derive(Debug)]
pub struct AsyncConnection {
    stream: TcpStream,
    peer: SocketAddr,
    opts: ConnectionOptions,
    /// The limits the receiver starts with.
    limits: FrameLimits,
}

impl AsyncConnection {
    /// Connects to `addr` once.
    pub async fn connect(addr: SocketAddr, opts: &ConnectionOptions) -> Result<AsyncConnection, ConnectError> {
        Self::connect_with_retry(&[addr], opts, &RetryPolicy::once()).await
    }

    /// Connects to the first of `addrs` that answers and completes the
    /// [handshake](crate::auth), trying them in turn and backing off between rounds as `policy`
    /// says. Dropping the future stops trying. A handshake that fails for good (a wrong or
    /// missing token, the wrong port) is not retried: it ends with [`ConnectError::Auth`].
    pub async fn connect_with_retry(
        addrs: &[SocketAddr],
        opts: &ConnectionOptions,
        policy: &RetryPolicy,
    ) -> Result<AsyncConnection, ConnectError> {
        if addrs.is_empty() {
            return Err(ConnectError::NoAddress("empty address list".into()));
        }
        let mut attempts = Attempts::new(policy);
        loop {
            let mut last = None;
            for &addr in addrs {
                let attempt = attempts.attempt();
                let e = match connect_once(addr, opts).await {
                    Ok(mut stream) => match client_handshake(&mut stream, addr, opts).await {
                        Ok(()) => {
                            let limits = FrameLimits::uniform(opts.max_frame_bytes);
                            return Ok(AsyncConnection { stream, peer: addr, opts: opts.clone(), limits });
                        }
                        Err(e) if e.is_permanent() => return Err(ConnectError::Auth(e)),
                        Err(e) => io::Error::other(e.to_string()),
                    },
                    Err(e) => e,
                };
                tracing::debug!(%addr, attempt, error = %e, "connect failed");
                last = Some(e);
            }
            tokio::time::sleep(attempts.after_failed_round(addrs, last)?).await;
        }
    }

    /// Wraps a connected tokio stream as it is: no [handshake](crate::auth) is made, so the
    /// stream must have been authenticated otherwise (or be a test's).
    pub fn from_tokio(stream: TcpStream, opts: &ConnectionOptions) -> io::Result<AsyncConnection> {
        let peer = stream.peer_addr()?;
        stream.set_nodelay(opts.nodelay)?;
        Ok(AsyncConnection { stream, peer, opts: opts.clone(), limits: FrameLimits::uniform(opts.max_frame_bytes) })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The largest payloads the receiver will accept (see [`FrameReceiver::set_frame_limits`]).
    pub fn set_frame_limits(&mut self, limits: FrameLimits) {
        self.limits = limits;
    }

    /// Accepts frames up to [`ConnectionOptions::max_frame_bytes`] (see [`FrameReceiver::admit`]).
    pub fn admit(&mut self) {
        self.limits = FrameLimits::uniform(self.opts.max_frame_bytes);
    }

    /// Splits into a sender and a receiver, and spawns the writer task on the current tokio
    /// runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn split(self) -> (FrameSender, FrameReceiver) {
        let (read, write) = self.stream.into_split();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: SendQueue::new(
                    self.opts.send_queue_bytes,
                    self.opts.coalesce_bytes,
                    self.opts.copy_threshold_bytes,
                )
                .with_max_write(self.opts.max_write_bytes),
                closed: None,
                closing: false,
                finished: false,
                enqueued: 0,
                written: 0,
                senders: 1,
                stats: DirectionStats::default(),
            }),
            writer_wake: Notify::new(),
            progress: Notify::new(),
            abort: Notify::new(),
            peer: self.peer,
            when_full: self.opts.when_full,
            max_write: self.opts.max_write_bytes,
        });
        tokio::spawn(writer_task(shared.clone(), write));
        let receiver = FrameReceiver {
            read,
            peer: self.peer,
            inbox: Inbox::new(
                self.peer,
                self.limits,
                FrameLimits::uniform(self.opts.max_frame_bytes),
                self.opts.recv_chunk_bytes,
            ),
        };
        (FrameSender { shared }, receiver)
    }
}

/// Reads one handshake frame (at most [`HANDSHAKE_MAX_FRAME`] bytes) straight off the stream.
async fn read_handshake_frame(stream: &mut TcpStream, peer: SocketAddr) -> Result<Frame, AuthError> {
    let io = |e: io::Error| AuthError::Io {
        peer,
        detail: if e.kind() == io::ErrorKind::UnexpectedEof {
            "closed the connection during the handshake (too busy, or it refused us)".into()
        } else {
            e.to_string()
        },
    };
    let mut h = [0u8; FRAME_HEADER_LEN];
    stream.read_exact(&mut h).await.map_err(io)?;
    let header = FrameHeader::decode(&h, HANDSHAKE_MAX_FRAME).map_err(|e| AuthError::Malformed {
        peer,
        detail: format!("{e} (the peer is not a daqflow server of this version?)"),
    })?;
    let mut payload = BytesMut::zeroed(header.len as usize);
    stream.read_exact(&mut payload).await.map_err(io)?;
    Ok(Frame { kind: header.kind, flags: header.flags, channel: header.channel, payload: payload.freeze() })
}

async fn write_handshake_frame(stream: &mut TcpStream, peer: SocketAddr, frame: &Frame) -> Result<(), AuthError> {
    let mut b = BytesMut::new();
    FrameCodec::default().encode(frame, &mut b);
    stream.write_all(&b).await.map_err(|e| AuthError::Io { peer, detail: e.to_string() })
}

async fn client_handshake(stream: &mut TcpStream, peer: SocketAddr, opts: &ConnectionOptions) -> Result<(), AuthError> {
    let exchange = async {
        let challenge = read_handshake_frame(stream, peer).await?;
        let (client, response) = ClientSide::on_challenge(opts.credentials(), peer, &challenge)?;
        write_handshake_frame(stream, peer, &response).await?;
        let answer = read_handshake_frame(stream, peer).await?;
        client.on_answer(peer, &answer)
    };
    tokio::time::timeout(opts.handshake_timeout, exchange)
        .await
        .unwrap_or(Err(AuthError::Timeout { peer, millis: opts.handshake_timeout.as_millis() as u64 }))
}

/// The server's side of the handshake; the error says why the peer was refused or dropped.
async fn server_handshake(stream: &mut TcpStream, peer: SocketAddr, opts: &ConnectionOptions) -> Result<(), AuthError> {
    let (server, challenge) = ServerSide::start(opts.credentials());
    let exchange = async {
        write_handshake_frame(stream, peer, &challenge).await?;
        let response = read_handshake_frame(stream, peer).await?;
        match server.on_response(peer, &response) {
            Ok(accept) => write_handshake_frame(stream, peer, &accept).await,
            Err((refuse, e)) => {
                let _ = write_handshake_frame(stream, peer, &refuse).await;
                let _ = stream.shutdown().await;
                Err(e)
            }
        }
    };
    tokio::time::timeout(opts.handshake_timeout, exchange)
        .await
        .unwrap_or(Err(AuthError::Timeout { peer, millis: opts.handshake_timeout.as_millis() as u64 }))
}

async fn connect_once(addr: SocketAddr, opts: &ConnectionOptions) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(n) = opts.send_buffer_bytes {
        socket.set_send_buffer_size(n.try_into().unwrap_or(u32::MAX))?;
    }
    if let Some(n) = opts.recv_buffer_bytes {
        socket.set_recv_buffer_size(n.try_into().unwrap_or(u32::MAX))?;
    }
    let stream = tokio::time::timeout(opts.connect_timeout, socket.connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(opts.nodelay)?;
    Ok(stream)
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Senders wake the writer (a stored permit covers a wake-up before it waits).
    writer_wake: Notify,
    /// The writer wakes everyone waiting for room, a flush, or the end.
    progress: Notify,
    /// Stops the writer at once, even in the middle of a write.
    abort: Notify,
    peer: SocketAddr,
    when_full: WhenFull,
    max_write: usize,
}

#[derive(Debug)]
struct State {
    queue: SendQueue,
    /// Why the connection is closed for sending; set on a write error or once closing finished.
    closed: Option<String>,
    /// `close()` was called: the writer drains the queue, shuts the socket down and finishes.
    closing: bool,
    finished: bool,
    /// Bytes ever queued and ever written: a flush waits until `written` reaches the `enqueued`
    /// it saw.
    enqueued: u64,
    written: u64,
    senders: usize,
    stats: DirectionStats,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The lock is never held across an await or a call that can panic; a poisoned lock
        // still holds a consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends frames on a connection; clone it to send from several tasks. See
/// [`AsyncConnection::split`]. When the last sender is dropped, the writer finishes what is
/// queued and shuts the sending direction down.
#[derive(Debug)]
pub struct FrameSender {
    shared: Arc<Shared>,
}

impl Clone for FrameSender {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        FrameSender { shared: self.shared.clone() }
    }
}

impl Drop for FrameSender {
    fn drop(&mut self) {
        let last = {
            let mut st = self.shared.lock();
            st.senders -= 1;
            st.senders == 0
        };
        if last {
            self.shared.writer_wake.notify_one();
        }
    }
}

impl FrameSender {
    /// Queues `frame`. If the queue is full, waits for room ([`WhenFull::Block`]) or gives the
    /// frame back ([`WhenFull::Fail`]).
    pub async fn send(&self, frame: Frame) -> Result<(), SendError> {
        let mut frame = frame;
        loop {
            let mut progress = pin!(self.shared.progress.notified());
            progress.as_mut().enable();
            match self.push(frame, false) {
                Ok(_) => return Ok(()),
                Err(SendError::Full { frame: f, .. }) if self.shared.when_full == WhenFull::Block => frame = f,
                Err(e) => return Err(e),
            }
            progress.await;
        }
    }

    /// Queues `frame` without waiting, whatever the policy: a full queue gives it back.
    pub fn try_send(&self, frame: Frame) -> Result<(), SendError> {
        self.push(frame, false).map(|_| ())
    }

    /// Queues `frame` even if the queue is over its bound (like `Sink::start_send`), failing
    /// only if the connection is closed; returns whether the queue is still below its bound. A
    /// caller that must keep several queues in one order (the same update to many
    /// subscribers) pushes with this under its own lock, then waits for
    /// [`FrameSender::ready`] outside it: the queue then exceeds its bound by at most one frame
    /// per such caller.
    pub fn start_send(&self, frame: Frame) -> Result<bool, SendError> {
        self.push(frame, true)
    }

    /// [`FrameSender::start_send`] of a frame whose payload is `prefix` then `payload`; the
    /// prefix is copied, `payload` is written from its own memory (see
    /// [`SendQueue::push_prefixed_unbounded`]). Returns whether the queue is below its bound.
    pub fn start_send_prefixed(
        &self,
        kind: u16,
        flags: u8,
        channel: u32,
        prefix: &[u8],
        payload: Bytes,
    ) -> Result<bool, SendError> {
        let peer = self.shared.peer;
        let mut st = self.shared.lock();
        let reason = match (&st.closed, st.closing) {
            (Some(r), _) => Some(r.clone()),
            (None, true) => Some("closing".to_owned()),
            _ => None,
        };
        if let Some(reason) = reason {
            let mut joined = bytes::BytesMut::with_capacity(prefix.len() + payload.len());
            joined.extend_from_slice(prefix);
            joined.extend_from_slice(&payload);
            let frame = Frame::new(kind, joined.freeze()).with_flags(flags).with_channel(channel);
            return Err(SendError::Closed { peer, reason, frame });
        }
        let was_empty = st.queue.is_empty();
        let wire_len = daqflow_wire::frame::FRAME_HEADER_LEN + prefix.len() + payload.len();
        st.queue.push_prefixed_unbounded(kind, flags, channel, prefix, payload);
        Ok(self.queued(st, was_empty, wire_len))
    }

    /// Books a frame of `wire_len` bytes just queued, wakes the writer if the queue was empty,
    /// and says whether the queue is below its bound.
    fn queued(&self, mut st: MutexGuard<'_, State>, was_empty: bool, wire_len: usize) -> bool {
        st.enqueued += wire_len as u64;
        st.stats.frames += 1;
        let room = st.queue.has_room_for(0);
        drop(st);
        if was_empty {
            self.shared.writer_wake.notify_one();
        }
        room
    }

    /// Whether the queue is below its bound.
    pub fn has_room(&self) -> bool {
        let st = self.shared.lock();
        st.closed.is_some() || st.queue.has_room_for(0)
    }

    /// Waits until the queue is below its bound (or the connection closed; the next send then
    /// says so).
    pub async fn ready(&self) {
        loop {
            let mut progress = pin!(self.shared.progress.notified());
            progress.as_mut().enable();
            if self.has_room() {
                return;
            }
            progress.await;
        }
    }

    /// Queues a frame; `Ok(room)` says whether the queue is below its bound afterwards.
    fn push(&self, frame: Frame, ignore_bound: bool) -> Result<bool, SendError> {
        let peer = self.shared.peer;
        let mut st = self.shared.lock();
        if let Some(reason) = &st.closed {
            return Err(SendError::Closed { peer, reason: reason.clone(), frame });
        }
        if st.closing {
            return Err(SendError::Closed { peer, reason: "closing".into(), frame });
        }
        let len = frame.wire_len();
        let was_empty = st.queue.is_empty();
        let pushed = if ignore_bound { st.queue.push_unbounded(frame) } else { st.queue.push(frame) };
        match pushed {
            Ok(()) => Ok(self.queued(st, was_empty, len)),
            Err(frame) => Err(SendError::Full { peer, queued: st.queue.queued_bytes(), frame }),
        }
    }

    /// Waits until every frame queued before the call has been written to the socket.
    pub async fn flush(&self) -> Result<(), FlushError> {
        let target = self.shared.lock().enqueued;
        loop {
            let mut progress = pin!(self.shared.progress.notified());
            progress.as_mut().enable();
            {
                let st = self.shared.lock();
                if st.written >= target {
                    return Ok(());
                }
                if let Some(reason) = &st.closed {
                    return Err(FlushError::Closed {
                        peer: self.shared.peer,
                        reason: reason.clone(),
                        unsent: (target - st.written) as usize,
                    });
                }
            }
            progress.await;
        }
    }

    /// Writes everything queued, shuts the sending direction down (the peer sees a clean end)
    /// and waits until that is done. Further sends fail with [`SendError::Closed`].
    pub async fn close(&self) -> Result<(), FlushError> {
        {
            let mut st = self.shared.lock();
            st.closing = true;
        }
        self.shared.writer_wake.notify_one();
        loop {
            let mut progress = pin!(self.shared.progress.notified());
            progress.as_mut().enable();
            {
                let st = self.shared.lock();
                if st.finished {
                    let unsent = st.queue.queued_bytes();
                    return match &st.closed {
                        Some(reason) if unsent > 0 || reason != CLOSED_BY_US => {
                            Err(FlushError::Closed { peer: self.shared.peer, reason: reason.clone(), unsent })
                        }
                        _ => Ok(()),
                    };
                }
            }
            progress.await;
        }
    }

    /// Closes the connection for sending at once, dropping what is queued, even if the writer
    /// is blocked because the peer stopped reading. Waiting senders wake up and see
    /// [`SendError::Closed`].
    pub fn abort(&self) {
        {
            let mut st = self.shared.lock();
            st.closed.get_or_insert_with(|| "aborted by this end".to_owned());
        }
        self.shared.abort.notify_one();
        self.shared.progress.notify_waiters();
    }

    /// Bytes waiting in the queue.
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().queue.queued_bytes()
    }

    /// Whether `other` sends on the same connection as this sender (one is a clone of the
    /// other).
    pub fn same_connection(&self, other: &FrameSender) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Whether the connection is closed for sending.
    pub fn is_closed(&self) -> bool {
        let st = self.shared.lock();
        st.closed.is_some() || st.closing
    }

    /// Counters of the sending direction.
    pub fn stats(&self) -> DirectionStats {
        self.shared.lock().stats
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.peer
    }
}

const CLOSED_BY_US: &str = "closed by this end";

async fn writer_task(shared: Arc<Shared>, mut write: OwnedWriteHalf) {
    let mut batch: Vec<Bytes> = Vec::with_capacity(MAX_WRITE_SLICES);
    enum Next {
        Write(usize),
        Idle,
        Drained,
        Aborted,
    }
    loop {
        let next = {
            let mut st = shared.lock();
            if st.closed.is_some() {
                Next::Aborted
            } else {
                match st.queue.take(shared.max_write, &mut batch) {
                    0 if st.closing || st.senders == 0 => Next::Drained,
                    0 => Next::Idle,
                    n => Next::Write(n),
                }
            }
        };
        let taken = match next {
            Next::Write(n) => n,
            Next::Idle => {
                tokio::select! {
                    _ = shared.writer_wake.notified() => {}
                    _ = shared.abort.notified() => {}
                }
                continue;
            }
            Next::Aborted => {
                finish(&shared);
                return;
            }
            Next::Drained => {
                let _ = write.shutdown().await;
                {
                    let mut st = shared.lock();
                    st.closed.get_or_insert_with(|| CLOSED_BY_US.to_owned());
                    st.finished = true;
                }
                shared.progress.notify_waiters();
                return;
            }
        };
        let result = tokio::select! {
            r = write_all(&mut write, &mut batch) => r,
            _ = shared.abort.notified() => {
                finish(&shared);
                return;
            }
        };
        let mut st = shared.lock();
        match result {
            Ok(syscalls) => {
                st.written += taken as u64;
                st.stats.bytes += taken as u64;
                st.stats.syscalls += syscalls;
            }
            Err(e) => {
                tracing::debug!(peer = %shared.peer, error = %e, "write failed; connection closed for sending");
                st.closed = Some(format!("write failed: {e}"));
                st.finished = true;
                drop(st);
                shared.progress.notify_waiters();
                return;
            }
        }
        drop(st);
        shared.progress.notify_waiters();
    }
}

/// Marks the writer finished after an abort and wakes every waiter.
fn finish(shared: &Shared) {
    {
        let mut st = shared.lock();
        st.finished = true;
        let n = st.queue.queued_bytes();
        let mut drop_all = Vec::new();
        st.queue.take(n.max(1), &mut drop_all);
    }
    shared.progress.notify_waiters();
}

/// Writes every byte of `batch` with vectored writes; returns the number of system calls.
async fn write_all(write: &mut OwnedWriteHalf, batch: &mut Vec<Bytes>) -> io::Result<u64> {
    let mut segments: VecDeque<Bytes> = batch.drain(..).collect();
    let mut syscalls = 0;
    while !segments.is_empty() {
        let slices: Vec<IoSlice<'_>> = segments.iter().map(|b| IoSlice::new(b)).collect();
        let mut n = write.write_vectored(&slices).await?;
        syscalls += 1;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(front) = segments.front_mut() else { break };
            if front.len() <= n {
                n -= front.len();
                segments.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Ok(syscalls)
}

/// Receives frames from a connection. See [`AsyncConnection::split`].
#[derive(Debug)]
pub struct FrameReceiver {
    read: OwnedReadHalf,
    peer: SocketAddr,
    inbox: Inbox,
}

impl FrameReceiver {
    /// The largest payloads accepted from the peer from now on: a protocol sets them once the
    /// peer's hello says what it is (see [`crate::auth`]).
    pub fn set_frame_limits(&mut self, limits: FrameLimits) {
        self.inbox.set_limits(limits);
    }

    /// Accepts frames up to [`ConnectionOptions::max_frame_bytes`] from now on.
    pub fn admit(&mut self) {
        self.inbox.admit();
    }

    /// The next frame. Cancel-safe: if the future is dropped (e.g. in `tokio::select!`), no
    /// data is lost and the next call continues where this one stopped.
    pub async fn recv(&mut self) -> Result<Frame, RecvError> {
        loop {
            if let Some(frame) = self.inbox.take_frame()? {
                return Ok(frame);
            }
            let (buf, limit) = self.inbox.read_buf()?;
            match self.read.read_buf(&mut bytes::BufMut::limit(buf, limit)).await {
                Ok(0) => return Err(self.inbox.on_eof()),
                Ok(n) => self.inbox.on_read(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.inbox.on_error(e)),
            }
        }
    }

    /// Counters of the receiving direction.
    pub fn stats(&self) -> DirectionStats {
        self.inbox.stats
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

/// Listens for framed connections on tokio. A task of its own accepts connections and runs
/// their [handshakes](crate::auth) side by side (at most
/// [`ConnectionOptions::max_pending_handshakes`]; a newcomer past it drops the oldest), so that
/// a silent or slow peer never holds up the others; [`AsyncListener::accept`] hands out the
/// connections that completed it. Dropping the listener stops that task.
#[derive(Debug)]
pub struct AsyncListener {
    local: SocketAddr,
    incoming: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Result<AsyncConnection, io::Error>>>,
    stats: Arc<Mutex<HandshakeStats>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AsyncListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AsyncListener {
    /// Listens on `addr` (port 0 picks a free port).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn bind(addr: SocketAddr, opts: ConnectionOptions) -> Result<AsyncListener, ListenError> {
        let bind = |source| ListenError::Bind { addr, source };
        let socket = sys::listen(addr, &opts).map_err(bind)?;
        socket.set_nonblocking(true).map_err(bind)?;
        let listener = tokio::net::TcpListener::from_std(socket.into()).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        let (tx, rx) = tokio::sync::mpsc::channel(opts.max_pending_handshakes.max(1));
        let stats = Arc::new(Mutex::new(HandshakeStats::default()));
        let task = tokio::spawn(acceptor(listener, opts, tx, stats.clone()));
        Ok(AsyncListener { local, incoming: tokio::sync::Mutex::new(rx), stats, task })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters of the handshakes so far.
    pub fn handshake_stats(&self) -> HandshakeStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the next authenticated connection. It takes frames of at most
    /// [`ConnectionOptions::hello_max_frame_bytes`] until the protocol sets its limits
    /// ([`FrameReceiver::set_frame_limits`], [`FrameReceiver::admit`]).
    pub async fn accept(&self) -> Result<AsyncConnection, ListenError> {
        match self.incoming.lock().await.recv().await {
            Some(Ok(conn)) => Ok(conn),
            Some(Err(source)) => Err(ListenError::Accept { addr: self.local, source }),
            None => Err(ListenError::Accept { addr: self.local, source: io::Error::other("the accepting task ended") }),
        }
    }
}

type Accepted = tokio::sync::mpsc::Sender<Result<AsyncConnection, io::Error>>;

/// Accepts connections and runs their handshakes, handing out those that complete.
async fn acceptor(
    listener: tokio::net::TcpListener,
    opts: ConnectionOptions,
    out: Accepted,
    stats: Arc<Mutex<HandshakeStats>>,
) {
    let local = listener.local_addr().ok();
    let pending: Arc<Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>> = Arc::default();
    let mut next_id = 0u64;
    let count = |f: fn(&mut HandshakeStats)| f(&mut stats.lock().unwrap_or_else(|p| p.into_inner()));
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: tell the caller, wait a little, go on.
                tracing::warn!(addr = ?local, error = %e, "accepting a connection failed");
                if out.try_send(Err(e)).is_err() && out.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        if stream.set_nodelay(opts.nodelay).is_err() {
            continue;
        }
        next_id += 1;
        let id = next_id;
        let (opts2, out2, pending2, stats2) = (opts.clone(), out.clone(), pending.clone(), stats.clone());
        let handle = tokio::spawn(async move {
            let result = server_handshake(&mut stream, peer, &opts2).await;
            pending2.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
            let bump = |f: fn(&mut HandshakeStats)| f(&mut stats2.lock().unwrap_or_else(|p| p.into_inner()));
            match result {
                Ok(()) => {
                    bump(|s| s.accepted += 1);
                    let limits = FrameLimits::uniform(opts2.hello_limit());
                    let _ = out2.send(Ok(AsyncConnection { stream, peer, opts: opts2, limits })).await;
                }
                Err(e @ (AuthError::Timeout { .. } | AuthError::Io { .. })) => {
                    bump(|s| s.abandoned += 1);
                    tracing::debug!(%peer, protocol = opts2.protocol, "connection dropped during the handshake: {e}");
                }
                Err(e) => {
                    bump(|s| s.refused += 1);
                    tracing::warn!(%peer, protocol = opts2.protocol, "connection refused: {e}");
                }
            }
        });
        let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
        p.push_back((id, handle.abort_handle()));
        if p.len() > opts.max_pending_handshakes.max(1)
            && let Some((_, oldest)) = p.pop_front()
        {
            oldest.abort();
            count(|s| s.evicted += 1);
            tracing::warn!(addr = ?local, "too many handshakes under way ({}): dropping the oldest", opts.max_pending_handshakes);
        }
    }
}
