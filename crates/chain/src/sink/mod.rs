//! The sink: the end of a chain (DAQ-Middleware's "sink" of figs. 4–9). `configure` binds
//! `listen`; at `start` it accepts its upstream and then counts chunks and bytes, checks the
//! order of the markers and the run, the sequence numbers and (with `check = true`) each
//! chunk's CRC32C, and discards the data. The end marker ends its run; `stop` waits for it
//! (at most `stop_timeout_ms`), so that nothing in flight is lost, and reports the chunks
//! received as its `events`, their bytes, and a [`SinkDetail`]: sequence and CRC errors, what
//! the end marker announced, chunks missing.
//!
//! Garbage from the upstream (bytes that are not frames, frames of another protocol, a chunk
//! before the begin marker, a wrong run) closes the connection and fails the sink with the
//! reason. A run of the sink takes one upstream connection: the first to connect.
//!
//! ```no_run
//! use daqflow_chain::sink::{Sink, SinkConfig, SinkDetail};
//! use daqflow_component::Component;
//! let mut s = Sink::new("sink", SinkConfig::default());
//! let listen = s.configure()?["listen"].as_str().unwrap().to_owned(); // upstream connects here
//! s.start(1)?;
//! // … the chain runs, the generator stops …
//! let summary = s.stop(None)?;
//! let detail: SinkDetail = summary.detail_as().unwrap();
//! assert_eq!((detail.sequence_errors, detail.crc_errors, detail.missing), (0, 0, 0));
//! # let _ = listen;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use daqflow_transport::{Listener, RecvError};
use serde::{Deserialize, Serialize};

pub use self::config::{SinkConfig, schema};
use super::link::{BATCH, Live, TICK, Work, Worker, accept, bind, read, wait, worker_component};
use super::protocol::{StreamCheck, StreamEvent};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The sink component (its hooks are the chain's one worker's: the thread, the stop, the report).
pub struct Sink(Worker<Receiving>);

/// The sink's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// received, its `bytes` their data bytes (headers not counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SinkDetail {
    /// The address it listens on (after configure).
    pub listen: Option<String>,
    /// The upstream's address, once it connected.
    pub upstream: Option<String>,
    /// Seconds from the first chunk received to the latest.
    pub seconds: f64,
    /// Chunks per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Megabytes (10⁶ bytes) per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Chunks whose sequence number was not the one expected.
    pub sequence_errors: u64,
    /// Chunks whose data did not match their CRC32C (with `check = true`).
    pub crc_errors: u64,
    /// Chunks whose CRC32C was checked.
    pub crc_checked: u64,
    /// Chunks the end marker announced (its last sequence number), once it came.
    pub chunks_announced: Option<u64>,
    /// Bytes the end marker announced, once it came.
    pub bytes_announced: Option<u64>,
    /// Chunks announced by the end marker that did not arrive (0 before the end marker).
    pub missing: u64,
    /// Whether the end marker came.
    pub end_seen: bool,
    /// Why the run failed or ended without the end marker, if it did.
    pub error: Option<String>,
}

/// Builds a sink named `name` from its configuration table (the registry's entry for the
/// `sink` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: SinkConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Sink::new(name, c)))
}

/// The `sink` kind: outside the event accounting; it starts before the chain's senders and
/// stops after them, when the end marker has come.
pub fn kind() -> Kind {
    Kind::new("sink", "the chain's end: checks, counts and discards the chunks", Role::Other, factory)
        .stages(2, 5)
        .schema(config::schema())
}

impl Sink {
    /// A sink named `name`.
    pub fn new(name: &str, config: SinkConfig) -> Sink {
        Sink(Worker::new(name, Receiving { config, listener: None }))
    }
}

/// What a sink does; [`Worker`] runs it.
struct Receiving {
    config: SinkConfig,
    listener: Option<Arc<Listener>>,
}

impl Work for Receiving {
    const THREAD: &'static str = "receive";

    /// Binds `listen`; answers `{"listen": ADDR}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let (listener, answer) =
            bind(name, &self.config.listen, self.config.advertise.as_deref(), self.config.tuning())?;
        self.listener = Some(listener);
        Ok(answer)
    }

    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let listener = self.listener.clone().ok_or_else(|| ComponentError::Failed("not configured".into()))?;
        let (name, live, check_crc) = (name.to_owned(), live.clone(), self.config.check);
        Ok(Box::new(move || receive(&name, run, check_crc, &listener, &live)))
    }

    /// How long `stop` waits for the end marker.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// Chunks received, their bytes, the rates; a [`SinkDetail`].
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        let end = read(&live.end);
        let detail = SinkDetail {
            listen: self.listener.as_ref().map(|l| l.local_addr().to_string()),
            upstream: read(&live.upstream),
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            sequence_errors: live.sequence_errors.load(Ordering::Relaxed),
            crc_errors: live.crc_errors.load(Ordering::Relaxed),
            crc_checked: live.crc_checked.load(Ordering::Relaxed),
            chunks_announced: end.map(|(last, _)| last),
            bytes_announced: end.map(|(_, bytes)| bytes),
            missing: end.map_or(0, |(last, _)| last.saturating_sub(stats.events)),
            end_seen: end.is_some(),
            error: live.failure(),
        };
        stats.with_detail(&detail)
    }

    fn release(&mut self) {
        self.listener = None;
    }
}

worker_component!(Sink);

/// The receiving thread: accept the upstream, count and check until the end marker. What it
/// counted is in `live`, a failure too.
fn receive(name: &str, run: u32, check_crc: bool, listener: &Listener, live: &Live) {
    let mut check = StreamCheck::new(run, check_crc);
    let mut upstream: Option<String> = None;
    // `Ok(true)`: the end marker came; `Ok(false)`: abandoned before it.
    let result: Result<bool, String> = (|| {
        let Some(mut up) = accept(listener, live, run, name)? else { return Ok(false) };
        let peer = up.peer_addr();
        upstream = Some(peer.to_string());
        *live.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream.clone();
        loop {
            if live.abandon.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let mut got = false;
            // At most a batch between publications of the counters.
            for _ in 0..BATCH {
                let frame = match up.try_recv() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(RecvError::Closed { .. }) => {
                        return Err(format!(
                            "upstream {peer} closed the connection without an end marker after chunk {}",
                            check.chunks()
                        ));
                    }
                    Err(e) => return Err(format!("upstream: {e}")),
                };
                got = true;
                let event =
                    check.on_frame(&frame).map_err(|e| format!("upstream {peer} sent {e}; connection closed"))?;
                if event == StreamEvent::End {
                    return Ok(true);
                }
            }
            live.observe(&check);
            if !got {
                wait(Some(up.as_raw_fd()), None, TICK).map_err(|e| format!("waiting for data: {e}"))?;
            }
        }
    })();
    live.observe(&check);
    let error = match result {
        Ok(true) => None,
        Ok(false) => Some(match &upstream {
            None => "stopped before an upstream connected".to_owned(),
            Some(u) => {
                format!("stopped before the end marker came from upstream {u} ({} chunks received)", check.chunks())
            }
        }),
        Err(e) => Some(e),
    };
    if let Some(e) = error {
        live.fail(name, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ChunkHeader, begin_frame, chunk_frame, end_frame};
    use daqflow_transport::{Connection, ConnectionOptions};
    use daqflow_wire::frame::Frame;

    fn started(config: SinkConfig, run: u32) -> (Sink, Connection) {
        let mut s = Sink::new("sink", config);
        let listen = s.configure().unwrap()["listen"].as_str().unwrap().parse().unwrap();
        s.start(run).unwrap();
        (s, Connection::connect(listen, &ConnectionOptions::for_protocol(crate::protocol::PROTOCOL)).unwrap())
    }

    fn wait_failure(s: &Sink) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.failure().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        s.failure().expect("the sink failed")
    }

    #[test]
    fn counts_and_checks_sequences_crcs_and_the_end_marker() {
        let (mut s, mut up) = started(SinkConfig::default(), 2);
        up.send(begin_frame(2)).unwrap();
        let data = b"0123456789";
        for seq in [1u64, 2, 4, 5] {
            up.send(chunk_frame(&ChunkHeader::for_data(seq, data, true), true, data)).unwrap();
        }
        let mut bad = ChunkHeader::for_data(6, data, true);
        bad.crc ^= 1;
        up.send(chunk_frame(&bad, true, data)).unwrap();
        up.send(end_frame(6, 60)).unwrap();
        up.close().unwrap();
        let summary = s.stop(None).unwrap();
        let d: SinkDetail = summary.detail_as().unwrap();
        assert_eq!(
            (summary.events, summary.bytes, d.sequence_errors, d.crc_errors, d.crc_checked, d.missing),
            (5, 50, 1, 1, 5, 1),
            "{summary:?}"
        );
        assert_eq!((d.end_seen, d.chunks_announced, d.bytes_announced), (true, Some(6), Some(60)));
        assert!(d.upstream.is_some() && d.listen.is_some(), "{d:?}");
        assert!(d.error.is_none() && s.failure().is_none(), "{d:?}");
        let stats = s.stats();
        assert_eq!((stats.events, stats.detail["crc_errors"].as_u64()), (5, Some(1)), "{stats:?}");
    }

    fn wait_state(s: &Sink, what: &str, f: impl Fn(&Sink) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !f(s) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(f(s), "{what}");
    }

    /// Sends a whole stream of run `run` (begin, two chunks, end) and closes.
    fn send_stream(up: &mut Connection, run: u32) {
        up.send(begin_frame(run)).unwrap();
        for seq in [1u64, 2] {
            up.send(chunk_frame(&ChunkHeader::for_data(seq, b"data", true), true, b"data")).unwrap();
        }
        up.send(end_frame(2, 8)).unwrap();
        up.close().unwrap();
    }

    #[test]
    fn strangers_are_refused_and_the_real_upstream_still_connects() {
        use std::io::Write;
        let (mut s, mut up) = started(SinkConfig::default(), 1);
        let listen = up.peer_addr();
        // Random bytes (no handshake), a frame of another protocol, a stream of another run:
        // each is closed, none fails the run.
        let mut raw = std::net::TcpStream::connect(listen).unwrap();
        raw.write_all(&[0xff; 64]).unwrap();
        let opts = ConnectionOptions::for_protocol(crate::protocol::PROTOCOL);
        let mut other = Connection::connect(listen, &opts).unwrap();
        other.send(Frame::new(0x0E02, bytes::Bytes::from_static(b"a fragment"))).unwrap();
        other.flush().unwrap();
        let mut wrong_run = Connection::connect(listen, &opts).unwrap();
        wrong_run.send(begin_frame(2)).unwrap();
        wrong_run.flush().unwrap();
        for c in [&mut other, &mut wrong_run] {
            assert!(c.recv_timeout(Duration::from_secs(10)).is_err(), "closed by the sink");
        }
        assert!(s.failure().is_none());
        send_stream(&mut up, 1);
        let summary = s.stop(None).unwrap();
        let d: SinkDetail = summary.detail_as().unwrap();
        assert!(d.error.is_none(), "{d:?}");
        assert_eq!((summary.events, d.end_seen), (2, true), "{summary:?}");
    }

    #[test]
    fn an_upstream_that_breaks_its_stream_fails_the_sink() {
        let (s, mut up) = started(SinkConfig::default(), 1);
        up.send(begin_frame(1)).unwrap();
        up.send(Frame::new(0x0E02, bytes::Bytes::from_static(b"a fragment"))).unwrap();
        up.flush().unwrap();
        assert!(wait_failure(&s).contains("kind 0x0e02 is not a chain message"));

        let (s, mut up) = started(SinkConfig::default(), 1);
        up.send(begin_frame(1)).unwrap();
        up.close().unwrap();
        assert!(wait_failure(&s).contains("closed the connection without an end marker after chunk 0"));
        wait_state(&s, "in error", |s| s.failure().is_some());
    }

    #[test]
    fn stop_waits_a_bounded_time_for_the_end_marker() {
        let (mut s, mut up) = started(SinkConfig { stop_timeout_ms: 100, ..Default::default() }, 1);
        up.send(begin_frame(1)).unwrap();
        up.flush().unwrap();
        let d: SinkDetail = s.stop(None).unwrap().detail_as().unwrap();
        assert!(d.error.as_deref().unwrap_or_default().contains("stopped before the end marker"), "{d:?}");
        assert!(!d.end_seen && d.chunks_announced.is_none());
    }
}
