//! What the three chain components share: addresses, connection options, the live counters
//! behind `stats`, a sending side that never blocks without looking at the stop flag, and the
//! end of a component's thread.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_component::{ComponentError, Info, Stats};
use daqflow_transport::{Connection, ConnectionOptions, Listener};
use daqflow_wire::frame::{FRAME_HEADER_LEN, Frame};

use crate::protocol::StreamCheck;

/// How long a component's thread waits in one `poll(2)` before it looks at its flags again.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// Most frames a receiving thread handles between two publications of its counters.
pub(crate) const BATCH: usize = 256;

/// Resolves `addr` (`host:port`) for the key `key`.
/// The schema's `advertise` key of a kind that listens.
pub(crate) fn advertise_key() -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::text(
        "advertise",
        "The address `configure` gives instead of the bound one, `HOST` or `HOST:PORT`, for an upstream on another host; default: the bound address, or for a wildcard `listen` this host's address towards the control server.",
    )
}

/// `recv_chunk_bytes`, the same key in every kind that reads an upstream.
pub(crate) fn recv_chunk_key() -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::integer(
        "recv_chunk_bytes",
        4096,
        1 << 30,
        "Size of the buffers the upstream is read into.",
    )
    .unit("bytes")
}

/// The keys of a kind that ends a chain (sink, logger, chain monitor): how long `stop` waits for
/// the end marker, the receive buffers, the socket buffers of its one connection.
pub(crate) fn end_receiver_keys() -> [daqflow_component::schema::Key; 3] {
    use daqflow_component::schema::Key;
    [
        Key::integer(
            "stop_timeout_ms",
            1,
            86_400_000,
            "How long `stop` waits for the end marker; then the run ends without it and the summary says so.",
        )
        .unit("ms"),
        recv_chunk_key(),
        Key::integer(
            "socket_buffer_bytes",
            1024,
            1 << 30,
            "`SO_RCVBUF` (and `SO_SNDBUF`) of the connection; unset: the kernel's default and auto-tuning.",
        )
        .unit("bytes"),
    ]
}

/// What `configure` answers for a kind with one upstream: `listen`.
pub(crate) fn listen_output() -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::address("listen", "The address its upstream is configured with.")
}

/// Adds the problem of an `advertise` that is no `HOST` or `HOST:PORT` to `c`.
pub(crate) fn check_advertise(c: &mut daqflow_component::checks::Checks, advertise: Option<&str>) {
    if let Some(Err(e)) = advertise.map(daqflow_transport::advertise::check) {
        c.problem("advertise", e.to_string().trim_start_matches("advertise "));
    }
}

pub(crate) fn resolve(name: &str, key: &str, addr: &str) -> Result<SocketAddr, ComponentError> {
    if addr.is_empty() {
        return Err(ComponentError::Config(format!("{name}: `{key}` is required (HOST:PORT)")));
    }
    addr.to_socket_addrs()
        .map_err(|e| ComponentError::Config(format!("{name}: {key} = `{addr}`: {e}")))?
        .next()
        .ok_or_else(|| ComponentError::Config(format!("{name}: {key} = `{addr}` resolves to no address")))
}

/// The transport keys every chain kind has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub send_queue_bytes: usize,
    pub recv_chunk_bytes: usize,
    pub socket_buffer_bytes: Option<usize>,
}

impl Tuning {
    pub(crate) fn options(self) -> ConnectionOptions {
        ConnectionOptions {
            send_queue_bytes: self.send_queue_bytes.max(1),
            recv_chunk_bytes: self.recv_chunk_bytes.max(4096),
            send_buffer_bytes: self.socket_buffer_bytes,
            recv_buffer_bytes: self.socket_buffer_bytes,
            ..ConnectionOptions::for_protocol(super::protocol::PROTOCOL)
        }
    }
}

/// Binds the listening socket of a repeater or a sink: the listener, and the configure answer
/// `{"listen": ADDR}` that tells the upstream component where to connect (the `advertise`
/// value, or the bound address as another host reaches it: [`daqflow_transport::advertise`]).
pub(crate) fn bind(
    name: &str,
    listen: &str,
    advertise: Option<&str>,
    tuning: Tuning,
) -> Result<(Arc<Listener>, Info), ComponentError> {
    let addr = resolve(name, "listen", listen)?;
    let listener =
        Listener::bind(addr, tuning.options()).map_err(|e| ComponentError::Failed(format!("{name}: {e}")))?;
    let told = daqflow_transport::advertise::advertised(listener.local_addr(), advertise)
        .map_err(|e| ComponentError::Config(format!("{name}: {e}")))?;
    let mut answer = Info::new();
    answer.insert("listen".into(), told.into());
    Ok((Arc::new(listener), answer))
}

/// Waits at most `timeout` until `read` is readable or `write` writable (either may be absent).
pub(crate) fn wait(read: Option<RawFd>, write: Option<RawFd>, timeout: Duration) -> std::io::Result<()> {
    wait_any(read, write.as_slice(), timeout)
}

/// Waits at most `timeout` until `read` is readable or one of `writes` writable.
pub(crate) fn wait_any(read: Option<RawFd>, writes: &[RawFd], timeout: Duration) -> std::io::Result<()> {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(1 + writes.len());
    if let Some(fd) = read {
        fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
    }
    for &fd in writes {
        fds.push(libc::pollfd { fd, events: libc::POLLOUT, revents: 0 });
    }
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of `fds.len()` initialised pollfd structures that lives
    // across the call; the descriptors belong to connections the caller keeps open.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// The sending side of a chain connection. The transport's queue is bounded by
/// `send_queue_bytes` with the blocking policy; a frame is only queued once it fits, so that no
/// send ever waits in the kernel: the thread waits in `poll(2)` in steps of [`TICK`] instead
/// and sees the stop flag between them.
pub(crate) struct Outlet {
    pub conn: Connection,
    capacity: usize,
}

/// Why sending ended early.
pub(crate) enum Cut {
    /// The stop flag was raised while waiting for the peer.
    Abandoned,
    /// Writing failed (the text says why).
    Failed(String),
}

impl Outlet {
    pub(crate) fn new(conn: Connection, capacity: usize) -> Outlet {
        Outlet { conn, capacity: capacity.max(1) }
    }

    /// Whether a frame of `len` payload bytes fits in the queue now (an empty queue takes any).
    pub(crate) fn has_room(&self, len: usize) -> bool {
        let q = self.conn.queued_bytes();
        q == 0 || q + FRAME_HEADER_LEN + len <= self.capacity
    }

    /// Writes what the socket takes now; whether anything was written.
    pub(crate) fn push(&mut self) -> Result<bool, Cut> {
        let before = self.conn.queued_bytes();
        if before == 0 {
            return Ok(false);
        }
        self.conn.try_flush().map_err(|e| Cut::Failed(e.to_string()))?;
        Ok(self.conn.queued_bytes() < before)
    }

    /// Waits until a frame of `len` payload bytes fits.
    pub(crate) fn wait_room(&mut self, len: usize, abandon: &AtomicBool) -> Result<(), Cut> {
        while !self.has_room(len) {
            if abandon.load(Ordering::Relaxed) {
                return Err(Cut::Abandoned);
            }
            if !self.push()? {
                wait(None, Some(self.conn.as_raw_fd()), TICK).map_err(|e| Cut::Failed(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Queues `frame` (it must fit: [`Outlet::wait_room`]).
    pub(crate) fn send(&mut self, frame: Frame) -> Result<(), Cut> {
        self.conn.send(frame).map_err(|e| Cut::Failed(e.to_string()))
    }

    /// Queues a frame of `prefix` and `payload` (it must fit).
    pub(crate) fn send_prefixed(&mut self, kind: u16, flags: u8, prefix: &[u8], payload: Bytes) -> Result<(), Cut> {
        self.conn.send_prefixed(kind, flags, 0, prefix, payload).map_err(|e| Cut::Failed(e.to_string()))
    }

    /// Writes everything queued, then shuts the sending direction down: the peer sees a clean
    /// end after the last frame.
    pub(crate) fn finish(&mut self, abandon: &AtomicBool) -> Result<(), Cut> {
        while self.conn.queued_bytes() > 0 {
            if abandon.load(Ordering::Relaxed) {
                return Err(Cut::Abandoned);
            }
            if !self.push()? {
                wait(None, Some(self.conn.as_raw_fd()), TICK).map_err(|e| Cut::Failed(e.to_string()))?;
            }
        }
        self.conn.close().map_err(|e| Cut::Failed(e.to_string()))
    }
}

/// Counters of one run, written by the component's thread and read by `stats` and `stop`.
pub(crate) struct Live {
    /// When the run started (the origin of the time stamps below).
    pub origin: Instant,
    pub chunks: AtomicU64,
    pub bytes: AtomicU64,
    pub sequence_errors: AtomicU64,
    pub crc_errors: AtomicU64,
    pub crc_checked: AtomicU64,
    /// Nanoseconds from `origin` to the first chunk (`u64::MAX`: none yet) and the latest.
    pub first_ns: AtomicU64,
    pub last_ns: AtomicU64,
    /// The thread must end now, without waiting for anything.
    pub abandon: AtomicBool,
    /// Set with `abandon` by `reset`: the thread ends without reporting a failure.
    pub quiet: AtomicBool,
    /// The generator sends nothing while set.
    pub paused: AtomicBool,
    /// The generator ends its stream after this chunk.
    pub stop_at: AtomicU64,
    pub failure: Mutex<Option<String>>,
    /// The upstream's address, once it connected (repeater, sink).
    pub upstream: Mutex<Option<String>>,
    /// What the end marker announced (last sequence number, bytes), once it came.
    pub end: Mutex<Option<(u64, u64)>>,
    /// The previous `stats` call: when, chunks, bytes; and the rates over the interval before it.
    recent: Mutex<(Instant, u64, u64, f64, f64)>,
}

/// The flow of a run as every chain kind reports it, besides its events (chunks) and bytes.
pub(crate) struct Flow {
    /// Seconds from the first chunk to the latest.
    pub seconds: f64,
    /// Chunks per second over those seconds.
    pub mean_events_per_s: f64,
    /// Megabytes (10^6 bytes of data, headers not counted) per second over those seconds.
    pub mean_mb_per_s: f64,
}

pub(crate) use daqflow_component::sync::read;

impl Live {
    pub(crate) fn new() -> Arc<Live> {
        let now = Instant::now();
        Arc::new(Live {
            origin: now,
            chunks: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sequence_errors: AtomicU64::new(0),
            crc_errors: AtomicU64::new(0),
            crc_checked: AtomicU64::new(0),
            first_ns: AtomicU64::new(u64::MAX),
            last_ns: AtomicU64::new(0),
            abandon: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            stop_at: AtomicU64::new(u64::MAX),
            failure: Mutex::new(None),
            upstream: Mutex::new(None),
            end: Mutex::new(None),
            recent: Mutex::new((now, 0, 0, 0.0, 0.0)),
        })
    }

    /// Publishes the counters after a batch of chunks.
    pub(crate) fn publish(&self, chunks: u64, bytes: u64) {
        let now = self.origin.elapsed().as_nanos() as u64;
        if self.first_ns.load(Ordering::Relaxed) == u64::MAX && chunks > 0 {
            self.first_ns.store(now, Ordering::Relaxed);
        }
        self.last_ns.store(now, Ordering::Relaxed);
        self.chunks.store(chunks, Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Publishes what a receiver's stream check counted: chunks, bytes, errors, the end marker.
    pub(crate) fn observe(&self, check: &StreamCheck) {
        self.publish(check.chunks(), check.bytes());
        self.sequence_errors.store(check.sequence_errors(), Ordering::Relaxed);
        self.crc_errors.store(check.crc_errors(), Ordering::Relaxed);
        self.crc_checked.store(check.crc_checked(), Ordering::Relaxed);
        if let Some(end) = check.end() {
            *self.end.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
        }
    }

    /// Records why the run of component `name` failed (the first reason) and logs it, unless
    /// the component is being reset.
    pub(crate) fn fail(&self, name: &str, why: String) {
        if self.quiet.load(Ordering::Relaxed) {
            return;
        }
        tracing::error!(component = %name, "{why}");
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(why);
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        read(&self.failure)
    }

    /// Seconds from the first chunk to the latest (0 before two publications).
    pub(crate) fn seconds(&self) -> f64 {
        let first = self.first_ns.load(Ordering::Relaxed);
        let last = self.last_ns.load(Ordering::Relaxed);
        if first == u64::MAX { 0.0 } else { last.saturating_sub(first) as f64 / 1e9 }
    }

    /// The counters every chain kind reports (`docs/operator-guide.md`, "Statistics of the
    /// standard kinds"): `events` are chunks, `bytes` their data bytes (headers not counted).
    /// Live (`summary` false), the rates are those since the previous call (at least 0.2 s
    /// before; otherwise the previous values); in a summary, the means over the run (first
    /// chunk to latest), which [`Flow`] has in both cases.
    pub(crate) fn counted(&self, summary: bool) -> (Stats, Flow) {
        let chunks = self.chunks.load(Ordering::Relaxed);
        let bytes = self.bytes.load(Ordering::Relaxed);
        let seconds = self.seconds();
        let flow = Flow {
            seconds,
            mean_events_per_s: if seconds > 0.0 { chunks as f64 / seconds } else { 0.0 },
            mean_mb_per_s: if seconds > 0.0 { bytes as f64 / seconds / 1e6 } else { 0.0 },
        };
        let (events_per_s, mb_per_s) = if summary {
            (flow.mean_events_per_s, flow.mean_mb_per_s)
        } else {
            let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            let dt = r.0.elapsed().as_secs_f64();
            if dt >= 0.2 {
                *r = (
                    Instant::now(),
                    chunks,
                    bytes,
                    chunks.saturating_sub(r.1) as f64 / dt,
                    bytes.saturating_sub(r.2) as f64 / dt,
                );
            }
            (r.3, r.4 / 1e6)
        };
        (Stats::counted(chunks, bytes).with_rates(events_per_s, mb_per_s), flow)
    }
}

/// Waits up to `patience` for the component's thread to end by itself; then raises the
/// abandon flag (the thread sees it within [`TICK`]) and joins it. An error if the thread
/// panicked.
pub(crate) fn end_thread(
    name: &str,
    thread: JoinHandle<()>,
    live: &Live,
    patience: Duration,
) -> Result<(), ComponentError> {
    end_thread_and(name, thread, live, patience, || {})
}

/// [`end_thread`], calling `abandon_also` with the abandon flag raised (for threads of the
/// component's own that the thread joins).
pub(crate) fn end_thread_and(
    name: &str,
    thread: JoinHandle<()>,
    live: &Live,
    patience: Duration,
    abandon_also: impl FnOnce(),
) -> Result<(), ComponentError> {
    let deadline = Instant::now() + patience;
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    live.abandon.store(true, Ordering::SeqCst);
    abandon_also();
    thread.join().map_err(|_| ComponentError::Failed(format!("{name}: the component's thread panicked")))
}

/// Ends the thread at once, for `reset`: no failure is reported.
pub(crate) fn abandon_thread(thread: Option<JoinHandle<()>>, live: &Live) {
    if let Some(t) = thread {
        live.quiet.store(true, Ordering::SeqCst);
        live.abandon.store(true, Ordering::SeqCst);
        let _ = t.join();
    }
}

/// What a chain kind whose run is one thread of its own does (its configuration, the thread's
/// body, its report); [`Worker`] is the rest of the component, the same for every such kind:
/// the thread started at `start`, waited for at `stop` (at most [`Work::stop_timeout`], then
/// abandoned), abandoned at `reset` and on drop, the counters of [`Live`] reported.
pub(crate) trait Work: Send + 'static {
    /// The thread's role, in its name (`send`, `forward`, `receive`).
    const THREAD: &'static str;
    /// Checks the configuration and binds what the kind listens on; what it tells the others.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError>;
    /// Connects what the kind sends to; the thread's body for run `run`, counting into `live`.
    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError>;
    /// How long `stop` waits for the thread to end by itself.
    fn stop_timeout(&self) -> Duration;
    /// At `stop`, before waiting for the thread (a generator says where its stream ends).
    fn stopping(&mut self, _live: &Live, _last_event: Option<u64>) {}
    /// The counters with the kind's detail: live (rates over the last interval) or as the
    /// run's summary (rates over the run).
    fn report(&self, live: &Live, summary: bool) -> Stats;
    /// At `reset` and on drop, before the thread is abandoned: releases what `configure` made
    /// (and tells threads of the kind's own to end).
    fn release(&mut self) {}
}

/// A [`Work`] as a component: the kind's struct holds one and [`worker_component!`] gives it
/// the component's hooks.
pub(crate) struct Worker<W: Work> {
    name: String,
    work: W,
    live: Arc<Live>,
    thread: Option<JoinHandle<()>>,
}

impl<W: Work> Worker<W> {
    /// A component named `name` doing `work`.
    pub(crate) fn new(name: &str, work: W) -> Worker<W> {
        Worker { name: name.into(), work, live: Live::new(), thread: None }
    }

    pub(crate) fn configure(&mut self) -> Result<Info, ComponentError> {
        self.work.configure(&self.name)
    }

    pub(crate) fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let live = Live::new();
        let body = self.work.start(&self.name, run, &live)?;
        self.live = live;
        self.thread = Some(spawn(&self.name, W::THREAD, body)?);
        Ok(())
    }

    pub(crate) fn stop(&mut self, last_event: Option<u64>) -> Result<Stats, ComponentError> {
        if let Some(thread) = self.thread.take() {
            self.work.stopping(&self.live, last_event);
            end_thread(&self.name, thread, &self.live, self.work.stop_timeout())?;
        }
        Ok(self.work.report(&self.live, true))
    }

    /// Holds a producer back (its thread reads [`Live::paused`]); nothing for the others.
    pub(crate) fn pause(&mut self, paused: bool) -> Result<(), ComponentError> {
        self.live.paused.store(paused, Ordering::SeqCst);
        Ok(())
    }

    pub(crate) fn reset(&mut self) -> Result<(), ComponentError> {
        self.work.release();
        abandon_thread(self.thread.take(), &self.live);
        Ok(())
    }

    pub(crate) fn stats(&self) -> Stats {
        self.work.report(&self.live, false)
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.live.failure()
    }
}

impl<W: Work> Drop for Worker<W> {
    fn drop(&mut self) {
        let _ = self.reset();
    }
}

/// The component hooks of a kind whose struct is a [`Worker`] (`Kind(Worker<…>)`).
macro_rules! worker_component {
    ($kind:ty) => {
        impl daqflow_component::Component for $kind {
            fn configure(&mut self) -> Result<daqflow_component::Info, daqflow_component::ComponentError> {
                self.0.configure()
            }
            fn start(&mut self, run: u32) -> Result<(), daqflow_component::ComponentError> {
                self.0.start(run)
            }
            fn stop(
                &mut self,
                last_event: Option<u64>,
            ) -> Result<daqflow_component::Stats, daqflow_component::ComponentError> {
                self.0.stop(last_event)
            }
            fn pause(&mut self) -> Result<(), daqflow_component::ComponentError> {
                self.0.pause(true)
            }
            fn resume(&mut self) -> Result<(), daqflow_component::ComponentError> {
                self.0.pause(false)
            }
            fn reset(&mut self) -> Result<(), daqflow_component::ComponentError> {
                self.0.reset()
            }
            fn stats(&self) -> daqflow_component::Stats {
                self.0.stats()
            }
            fn failure(&self) -> Option<String> {
                self.0.failure()
            }
        }
    };
}
pub(crate) use worker_component;

/// Spawns a component's thread.
pub(crate) fn spawn(
    name: &str,
    role: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, ComponentError> {
    std::thread::Builder::new()
        .name(format!("{name}-{role}"))
        .spawn(f)
        .map_err(|e| ComponentError::Failed(format!("{name}: starting the {role} thread: {e}")))
}

/// Longest an accepted connection has to send its begin marker (the chain's hello).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What the first bytes of an accepted connection are.
enum Hello {
    /// Not all of the begin marker has arrived yet.
    Waiting,
    /// The begin marker of our run: this is the upstream.
    Begin,
    /// Something else: not an upstream of this run.
    Not(String),
}

/// Looks at the first frame of `conn` without taking it (`MSG_PEEK`), so that the begin
/// marker stays in the socket for the reader, whichever way it reads (the transport, or
/// `splice(2)` straight from the socket).
fn peek_hello(conn: &Connection, run: u32) -> Hello {
    use super::protocol::{BEGIN_LEN, KIND_BEGIN};
    let mut buf = [0u8; FRAME_HEADER_LEN + BEGIN_LEN];
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, a local array; the descriptor
    // belongs to `conn`, which outlives the call.
    let n = unsafe {
        libc::recv(conn.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if n == 0 {
        return Hello::Not("closed before its begin marker".into());
    }
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Hello::Waiting,
            _ => Hello::Not(e.to_string()),
        };
    }
    let got = &buf[..n as usize];
    let Some(h) = got.first_chunk::<FRAME_HEADER_LEN>() else { return Hello::Waiting };
    let header = match daqflow_wire::frame::FrameHeader::decode(h, BEGIN_LEN as u32) {
        Ok(h) => h,
        Err(e) => return Hello::Not(format!("not a chain stream: {e}")),
    };
    if header.kind != KIND_BEGIN || header.len as usize != BEGIN_LEN {
        return Hello::Not(format!("its first frame is of kind {:#06x}, not a begin marker", header.kind));
    }
    let Some(payload) = got[FRAME_HEADER_LEN..].first_chunk::<4>() else { return Hello::Waiting };
    match u32::from_le_bytes(*payload) {
        r if r == run => Hello::Begin,
        r => Hello::Not(format!("its begin marker is for run {r}; this is run {run}")),
    }
}

/// Accepts the upstream: the first connection whose first frame is the begin marker of run
/// `run` (the chain's hello; the transport's handshake has proven the system token before it,
/// if one is set). Other connections are closed and logged, and never disturb the run. Looks
/// at the abandon flag every [`TICK`]; `None` if abandoned first. The begin marker is left for
/// the reader.
pub(crate) fn accept(listener: &Listener, live: &Live, run: u32, name: &str) -> Result<Option<Connection>, String> {
    use super::protocol::{CHUNK_HEADER_LEN, KIND_CHUNK};
    let mut candidates: Vec<(Connection, Instant)> = Vec::new();
    loop {
        if live.abandon.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let wait_for = if candidates.is_empty() { TICK } else { Duration::from_millis(2) };
        match listener.accept_timeout(wait_for) {
            Ok(Some(c)) => candidates.push((c, Instant::now())),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        let mut i = 0;
        while i < candidates.len() {
            match peek_hello(&candidates[i].0, run) {
                Hello::Begin => {
                    let (mut conn, _) = candidates.swap_remove(i);
                    let max = u32::try_from(super::MAX_CHUNK_BYTES + CHUNK_HEADER_LEN).unwrap_or(u32::MAX);
                    conn.set_frame_limits(
                        daqflow_wire::frame::FrameLimits::uniform(64 << 10).with_kind(KIND_CHUNK, max),
                    );
                    return Ok(Some(conn));
                }
                Hello::Waiting if candidates[i].1.elapsed() < HELLO_TIMEOUT => i += 1,
                Hello::Waiting => {
                    let (c, _) = candidates.swap_remove(i);
                    tracing::warn!(component = %name, peer = %c.peer_addr(), "closing a connection that sent no begin marker within {HELLO_TIMEOUT:?}");
                }
                Hello::Not(why) => {
                    let (c, _) = candidates.swap_remove(i);
                    tracing::warn!(component = %name, peer = %c.peer_addr(), "closing a connection that is not this run's upstream: {why}");
                }
            }
        }
    }
}
