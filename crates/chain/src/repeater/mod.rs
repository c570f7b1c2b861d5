//! The repeater: a component that passes every chunk from its upstream to its downstream
//! (DAQ-Middleware's "repeater", the filter of figs. 5, 7, 8 and 9). `configure` binds `listen`;
//! `start` connects to `downstream` and accepts the upstream; every frame (begin marker,
//! chunks, end marker) goes on as it came, its payload a slice of the buffer it was received
//! into: no copy in user space. The end marker ends the repeater's run.
//!
//! One thread per repeater reads what has arrived, queues it towards the downstream while
//! there is room, writes what the socket takes, and waits in `poll(2)` on both sockets when
//! neither can move. A full downstream queue stops the reading, so back-pressure travels up
//! the chain. Each frame is checked on the way (kinds, lengths, marker order, sequence
//! numbers; not CRCs): garbage closes the upstream connection and fails the repeater.
//!
//! That is `forward = "transport"`, the default. `forward = "splice"` moves the data of large
//! chunks from socket to socket through a pipe with `splice(2)` instead (see the `splice` module
//! docs): no copy at all in the repeater, but on loopback it was measured slower than the
//! transport path (`docs/performance.md`, chain), so it is not the default.
//!
//! ```no_run
//! use daqflow_chain::repeater::{Repeater, RepeaterConfig, RepeaterDetail};
//! use daqflow_component::Component;
//! let mut r = Repeater::new("rep-1", RepeaterConfig { downstream: "127.0.0.1:7302".into(), ..Default::default() });
//! let listen = r.configure()?["listen"].as_str().unwrap().to_owned(); // the generator connects here
//! r.start(1)?;
//! // … the generator runs and stops …
//! let summary = r.stop(None)?; // waits for the end marker: events (chunks passed on), bytes, rates
//! let detail: RepeaterDetail = summary.detail_as().unwrap();
//! assert!(detail.end_seen && detail.sequence_errors == 0);
//! # let _ = listen;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;
mod splice;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use daqflow_transport::{Connection, Listener, RecvError, RetryPolicy};
use daqflow_wire::frame::Frame;
use serde::{Deserialize, Serialize};

pub use self::config::{Forward, RepeaterConfig, schema};
use super::link::{BATCH, Cut, Live, Outlet, TICK, Work, Worker, accept, bind, read, resolve, wait, worker_component};
use super::protocol::{StreamCheck, StreamEvent};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The repeater component (its hooks are the chain's one worker's: the thread, the stop, the report).
pub struct Repeater(Worker<Forwarding>);

/// The repeater's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// passed on, its `bytes` their data bytes (headers not counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepeaterDetail {
    /// The address it listens on (after configure).
    pub listen: Option<String>,
    /// The upstream's address, once it connected.
    pub upstream: Option<String>,
    /// How it moves the data.
    pub forward: Forward,
    /// Seconds from the first chunk passed on to the latest.
    pub seconds: f64,
    /// Chunks per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Megabytes (10⁶ bytes) per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Chunks whose sequence number was not the one expected.
    pub sequence_errors: u64,
    /// Whether the end marker came (and was queued towards the downstream).
    pub end_seen: bool,
    /// Why the run failed or was cut, if it was.
    pub error: Option<String>,
}

/// Builds a repeater named `name` from its configuration table (the registry's entry for the
/// `repeater` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: RepeaterConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Repeater::new(name, c)))
}

/// The `repeater` kind: outside the event accounting; it starts after its downstream and
/// before its upstream, and stops after its upstream and before its downstream.
pub fn kind() -> Kind {
    Kind::new("repeater", "passes a chain's chunks from its upstream to its downstream", Role::Other, factory)
        .stages(3, 4)
        .schema(config::schema())
}

impl Repeater {
    /// A repeater named `name`.
    pub fn new(name: &str, config: RepeaterConfig) -> Repeater {
        Repeater(Worker::new(name, Forwarding { config, listener: None }))
    }
}

/// What a repeater does; [`Worker`] runs it.
struct Forwarding {
    config: RepeaterConfig,
    listener: Option<Arc<Listener>>,
}

impl Work for Forwarding {
    const THREAD: &'static str = "forward";

    /// Binds `listen`; answers `{"listen": ADDR}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let (listener, answer) =
            bind(name, &self.config.listen, self.config.advertise.as_deref(), self.config.tuning())?;
        self.listener = Some(listener);
        Ok(answer)
    }

    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let c = &self.config;
        let listener = self.listener.clone().ok_or_else(|| ComponentError::Failed("not configured".into()))?;
        let addr = resolve(name, "downstream", &c.downstream)?;
        let policy = RetryPolicy::for_duration(Duration::from_millis(c.connect_timeout_ms));
        let conn = Connection::connect_with_retry(&[addr], &c.tuning().options(), &policy)
            .map_err(|e| ComponentError::Failed(format!("{name}: downstream: {e}")))?;
        let (name, live, config) = (name.to_owned(), live.clone(), self.config.clone());
        let outlet = Outlet::new(conn, c.send_queue_bytes);
        Ok(Box::new(move || forward(&name, run, &config, &listener, outlet, &live)))
    }

    /// How long `stop` waits for the end marker to pass.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// Chunks passed on, their bytes, the rates; a [`RepeaterDetail`].
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        stats.with_detail(&RepeaterDetail {
            listen: self.listener.as_ref().map(|l| l.local_addr().to_string()),
            upstream: read(&live.upstream),
            forward: self.config.forward,
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            sequence_errors: live.sequence_errors.load(Ordering::Relaxed),
            end_seen: read(&live.end).is_some(),
            error: live.failure(),
        })
    }

    fn release(&mut self) {
        self.listener = None;
    }
}

worker_component!(Repeater);

/// Why forwarding ended early.
pub(super) enum Broken {
    Cut(Cut),
    Upstream(String),
}

impl From<Cut> for Broken {
    fn from(c: Cut) -> Self {
        Broken::Cut(c)
    }
}

/// The forwarding thread: accept the upstream, forward until the end marker has passed. What
/// it did is in `live`, a failure too.
fn forward(name: &str, run: u32, config: &RepeaterConfig, listener: &Listener, mut out: Outlet, live: &Live) {
    let mut check = StreamCheck::new(run, false);
    let mut upstream: Option<String> = None;
    let result: Result<(), Broken> = (|| {
        let up = match accept(listener, live, run, name) {
            Ok(Some(c)) => c,
            Ok(None) => return Err(Cut::Abandoned.into()),
            Err(e) => return Err(Broken::Upstream(e)),
        };
        upstream = Some(up.peer_addr().to_string());
        *live.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream.clone();
        match config.forward {
            Forward::Splice => {
                let sizes = splice::SpliceSizes {
                    min_bytes: config.splice_min_bytes,
                    pipe_bytes: config.pipe_bytes,
                    buffer_bytes: config.recv_chunk_bytes,
                };
                set_nonblocking(&out.conn).map_err(|e| Broken::Cut(Cut::Failed(e.to_string())))?;
                splice::forward(&up, &out.conn, &mut check, live, sizes)
            }
            Forward::Transport => {
                forward_frames(up, &mut out, &mut check, live)?;
                out.finish(&live.abandon).map_err(Broken::from)
            }
        }
    })();
    live.observe(&check);
    let error = match result {
        Ok(()) => None,
        Err(Broken::Cut(Cut::Abandoned)) if check.end().is_some() => Some(format!(
            "downstream {} stopped reading: the end marker was not passed on in time",
            out.conn.peer_addr()
        )),
        Err(Broken::Cut(Cut::Abandoned)) => Some(match &upstream {
            None => "stopped before an upstream connected".to_owned(),
            Some(u) => {
                format!("stopped before the end marker came from upstream {u} ({} chunks passed on)", check.chunks())
            }
        }),
        Err(Broken::Cut(Cut::Failed(e))) => Some(format!("downstream {}: {e}", out.conn.peer_addr())),
        Err(Broken::Upstream(e)) => Some(e),
    };
    if let Some(e) = error {
        live.fail(name, e);
    }
}

/// Puts the downstream socket in non-blocking mode: `splice(2)` into a socket only returns
/// instead of waiting when the socket itself is non-blocking.
fn set_nonblocking(conn: &Connection) -> std::io::Result<()> {
    let fd = conn.as_raw_fd();
    // SAFETY: fcntl on the connection's socket, which `conn` keeps open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `forward = "transport"`: frames received as slices of the transport's buffers and queued
/// towards the downstream as they are, until the end marker is queued.
fn forward_frames(mut up: Connection, out: &mut Outlet, check: &mut StreamCheck, live: &Live) -> Result<(), Broken> {
    let peer = up.peer_addr();
    // A frame taken off the upstream that does not fit in the downstream queue yet.
    let mut pending: Option<Frame> = None;
    loop {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(Cut::Abandoned.into());
        }
        let mut progress = false;
        // At most a batch between publications of the counters.
        for _ in 0..BATCH {
            let frame = match pending.take() {
                Some(f) => f,
                None => match up.try_recv() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(RecvError::Closed { .. }) => {
                        return Err(Broken::Upstream(format!(
                            "upstream {peer} closed the connection without an end marker after chunk {}",
                            check.chunks()
                        )));
                    }
                    Err(e) => return Err(Broken::Upstream(format!("upstream: {e}"))),
                },
            };
            if !out.has_room(frame.payload.len()) {
                pending = Some(frame);
                break;
            }
            let event = check
                .on_frame(&frame)
                .map_err(|e| Broken::Upstream(format!("upstream {peer} sent {e}; connection closed")))?;
            out.send(frame)?;
            progress = true;
            if event == StreamEvent::End {
                return Ok(());
            }
        }
        live.observe(check);
        progress |= out.push()?;
        if !progress {
            let read = pending.is_none().then(|| up.as_raw_fd());
            let write = (out.conn.queued_bytes() > 0).then(|| out.conn.as_raw_fd());
            wait(read, write, TICK).map_err(|e| Broken::Upstream(format!("waiting for data: {e}")))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ChunkHeader, begin_frame, chunk_frame, end_frame};
    use daqflow_transport::ConnectionOptions;

    fn repeater_to(downstream: &Listener, forward: Forward) -> (Repeater, std::net::SocketAddr) {
        let config = RepeaterConfig {
            downstream: downstream.local_addr().to_string(),
            forward,
            splice_min_bytes: 4096,
            recv_chunk_bytes: 64 << 10,
            ..Default::default()
        };
        let mut r = Repeater::new("rep", config);
        let listen = r.configure().unwrap()["listen"].as_str().unwrap().parse().unwrap();
        (r, listen)
    }

    /// Small and large chunks (spliced: 4 KiB and more) in a mixed order, sent in pieces of
    /// every size so that headers and data arrive split anywhere.
    fn forwards_every_frame_as_it_came(forward: Forward) {
        use std::io::Write;
        let down =
            Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(crate::protocol::PROTOCOL))
                .unwrap();
        let (mut r, listen) = repeater_to(&down, forward);
        r.start(9).unwrap();
        let mut sent = vec![begin_frame(9)];
        let sizes = [0usize, 1, 1000, 5000, 300_000, 4095, 4096, 70_000, 16, 2 << 20, 3, 100_000, 100_001];
        for (i, &len) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
            sent.push(chunk_frame(&ChunkHeader::for_data(i as u64 + 1, &data, true), true, &data));
        }
        let total: usize = sizes.iter().sum();
        sent.push(end_frame(sizes.len() as u64, total as u64));
        let mut wire = bytes::BytesMut::new();
        for f in &sent {
            daqflow_wire::frame::FrameCodec::default().encode(f, &mut wire);
        }
        let writer = std::thread::spawn(move || {
            let mut up = std::net::TcpStream::connect(listen).unwrap();
            let proto = crate::protocol::PROTOCOL;
            daqflow_transport::auth::handshake_std(&mut up, proto, None, Duration::from_secs(10)).unwrap();
            let mut at = 0;
            let mut piece = 1;
            while at < wire.len() {
                let n = piece.min(wire.len() - at);
                up.write_all(&wire[at..at + n]).unwrap();
                at += n;
                piece = piece * 3 % 200_003 + 7;
            }
        });
        let mut d = down.accept().unwrap();
        d.admit();
        for f in &sent {
            assert_eq!(&d.recv().unwrap(), f);
        }
        assert!(d.recv().unwrap_err().is_clean_close(), "the repeater closes after the end marker");
        writer.join().unwrap();
        let summary = r.stop(None).unwrap();
        let n = sizes.len() as u64;
        assert_eq!((summary.events, summary.bytes), (n, total as u64), "{summary:?}");
        let detail: RepeaterDetail = summary.detail_as().unwrap();
        assert_eq!((detail.end_seen, detail.sequence_errors, detail.forward), (true, 0, forward), "{detail:?}");
        assert_eq!(detail.listen, Some(listen.to_string()));
        assert!(detail.upstream.is_some() && detail.error.is_none(), "{detail:?}");
        assert!(r.failure().is_none());
    }

    #[test]
    fn forwards_every_frame_as_it_came_through_the_transport() {
        forwards_every_frame_as_it_came(Forward::Transport);
    }

    #[test]
    fn forwards_every_frame_as_it_came_through_a_pipe() {
        forwards_every_frame_as_it_came(Forward::Splice);
    }

    #[test]
    fn garbage_from_a_stranger_is_refused_and_the_real_upstream_is_forwarded() {
        for forward in [Forward::Transport, Forward::Splice] {
            strangers_are_refused(forward);
        }
    }

    fn strangers_are_refused(forward: Forward) {
        use std::io::Write;
        let opts = ConnectionOptions::for_protocol(crate::protocol::PROTOCOL);
        let down = Listener::bind("127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap();
        let (mut r, listen) = repeater_to(&down, forward);
        r.start(1).unwrap();
        let mut raw = std::net::TcpStream::connect(listen).unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut other = Connection::connect(listen, &opts).unwrap();
        other.send(daqflow_wire::frame::Frame::new(0x0E02, bytes::Bytes::from_static(b"fragment"))).unwrap();
        other.flush().unwrap();
        assert!(other.recv_timeout(Duration::from_secs(10)).is_err(), "{forward:?}: closed by the repeater");
        assert!(r.failure().is_none(), "{forward:?}");
        let mut up = Connection::connect(listen, &opts).unwrap();
        let sent =
            [begin_frame(1), chunk_frame(&ChunkHeader::for_data(1, b"abc", false), false, b"abc"), end_frame(1, 3)];
        for f in &sent {
            up.send(f.clone()).unwrap();
        }
        up.close().unwrap();
        let mut d = down.accept().unwrap();
        for f in &sent {
            assert_eq!(&d.recv().unwrap(), f, "{forward:?}");
        }
        let detail: RepeaterDetail = r.stop(None).unwrap().detail_as().unwrap();
        assert!(detail.error.is_none() && detail.end_seen, "{forward:?}: {detail:?}");
    }

    #[test]
    fn a_chunk_announcing_more_than_the_frame_holds_fails_the_splicing_repeater() {
        let down =
            Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(crate::protocol::PROTOCOL))
                .unwrap();
        let (mut r, listen) = repeater_to(&down, Forward::Splice);
        r.start(1).unwrap();
        let mut up = Connection::connect(listen, &ConnectionOptions::for_protocol(crate::protocol::PROTOCOL)).unwrap();
        up.send(begin_frame(1)).unwrap();
        let mut bad = ChunkHeader::for_data(1, &[0u8; 10_000], false);
        bad.len = 20_000;
        up.send(chunk_frame(&bad, false, &[0u8; 10_000])).unwrap();
        up.flush().unwrap();
        let mut d = down.accept().unwrap();
        d.admit();
        // The begin marker may or may not have been passed on; nothing else is.
        while let Ok(f) = d.recv() {
            assert_eq!(f, begin_frame(1));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while r.failure().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let f = r.failure().unwrap();
        assert!(f.contains("chunk 1 announces 20000 bytes of data and carries 10000"), "{f}");
        r.stop(None).unwrap();
    }

    #[test]
    fn stop_without_an_upstream_returns_after_the_timeout_with_the_reason() {
        let down =
            Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(crate::protocol::PROTOCOL))
                .unwrap();
        let config =
            RepeaterConfig { downstream: down.local_addr().to_string(), stop_timeout_ms: 100, ..Default::default() };
        let mut r = Repeater::new("rep", config);
        r.configure().unwrap();
        r.start(1).unwrap();
        let detail: RepeaterDetail = r.stop(None).unwrap().detail_as().unwrap();
        assert_eq!(detail.error.as_deref(), Some("stopped before an upstream connected"), "{detail:?}");
    }
}
