//! The generator: the source of a chain (DAQ-Middleware's "source" component of figs. 4–9). At
//! `start` it connects to `downstream` and sends a begin marker, then chunks of `chunk_bytes`
//! with sequence numbers 1, 2, 3, …, free-running or at `rate_hz`; `stop` ends the stream with
//! an end marker that says how many chunks and bytes were sent.
//!
//! The data is one pattern buffer, sent by reference for every chunk with a fresh header (and
//! its CRC, computed once): the generator costs the chain as little as the paper's source did,
//! so that what is measured is the chain.
//!
//! ```no_run
//! use daqflow_chain::generator::{Generator, GeneratorConfig, GeneratorDetail};
//! use daqflow_component::Component;
//! let mut g = Generator::new("gen", GeneratorConfig { downstream: "127.0.0.1:7301".into(), ..Default::default() });
//! g.configure()?;
//! g.start(1)?;
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! let summary = g.stop(None)?; // events (chunks sent), bytes, rates; the detail:
//! let detail: GeneratorDetail = summary.detail_as().unwrap();
//! assert!(detail.error.is_none());
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_transport::{Connection, RetryPolicy};
use serde::{Deserialize, Serialize};

pub use self::config::{GeneratorConfig, schema};
use super::link::{Cut, Live, Outlet, Work, Worker, resolve, worker_component};
use super::protocol::{CHUNK_HEADER_LEN, ChunkHeader, FLAG_CRC, KIND_CHUNK, begin_frame, end_frame};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The generator component (its hooks are the chain's one worker's: the thread, the stop, the report).
pub struct Generator(Worker<Sending>);

/// The generator's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// sent, its `bytes` their data bytes (headers not counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GeneratorDetail {
    /// Bytes of data in each chunk.
    pub chunk_bytes: usize,
    /// Seconds from the first chunk sent to the latest (to the end of the stream, after stop).
    pub seconds: f64,
    /// Chunks per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Megabytes (10⁶ bytes) per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Why the stream failed or was cut, if it was.
    pub error: Option<String>,
}

/// Builds a generator named `name` from its configuration table (the registry's entry for the
/// `generator` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: GeneratorConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Generator::new(name, c)))
}

/// The `generator` kind: a source outside the event accounting; it starts last and stops
/// first, so that its end marker flows down a chain whose receivers are all running.
pub fn kind() -> Kind {
    Kind::new("generator", "the chain's source: sends numbered chunks downstream", Role::Other, factory)
        .stages(7, 1)
        .schema(config::schema())
}

impl Generator {
    /// A generator named `name`.
    pub fn new(name: &str, config: GeneratorConfig) -> Generator {
        Generator(Worker::new(name, Sending { config }))
    }
}

/// What a generator does; [`Worker`] runs it.
struct Sending {
    config: GeneratorConfig,
}

impl Work for Sending {
    const THREAD: &'static str = "send";

    /// Checks the configuration; answers `{"chunk_bytes": N}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let mut info = Info::new();
        info.insert("chunk_bytes".into(), self.config.chunk_bytes.into());
        Ok(info)
    }

    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let c = &self.config;
        let addr = resolve(name, "downstream", &c.downstream)?;
        let policy = RetryPolicy::for_duration(Duration::from_millis(c.connect_timeout_ms));
        let conn = Connection::connect_with_retry(&[addr], &c.tuning().options(), &policy)
            .map_err(|e| ComponentError::Failed(format!("{name}: downstream: {e}")))?;
        let (name, config, live) = (name.to_owned(), self.config.clone(), live.clone());
        let outlet = Outlet::new(conn, config.send_queue_bytes);
        Ok(Box::new(move || produce(&name, &config, run, outlet, &live)))
    }

    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// Ends the stream after chunk `last_event` (if more were sent already: at once) with an
    /// end marker.
    fn stopping(&mut self, live: &Live, last_event: Option<u64>) {
        let sent = live.chunks.load(Ordering::SeqCst);
        live.stop_at.store(last_event.unwrap_or(sent), Ordering::SeqCst);
        live.paused.store(false, Ordering::SeqCst);
    }

    /// Chunks sent, their bytes, the rates; a [`GeneratorDetail`] (`error` set if the stream
    /// was cut).
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        stats.with_detail(&GeneratorDetail {
            chunk_bytes: self.config.chunk_bytes,
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            error: live.failure(),
        })
    }
}

worker_component!(Generator);

/// The pattern of the generator's data: a byte counter, so that a corrupted or shifted chunk
/// does not look like a good one.
fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i as u8) ^ ((i >> 8) as u8)).collect::<Vec<u8>>().into()
}

/// The sending thread: begin marker, chunks until told to stop, end marker. What it did is in
/// `live`, a failure too.
fn produce(name: &str, config: &GeneratorConfig, run: u32, mut out: Outlet, live: &Live) {
    let data = pattern(config.chunk_bytes);
    let crc = if config.check { ChunkHeader::for_data(0, &data, true).crc } else { 0 };
    let flags = if config.check { FLAG_CRC } else { 0 };
    let len = data.len() as u32;
    let frame_len = CHUNK_HEADER_LEN + data.len();
    let mut sent: u64 = 0;
    let mut bytes: u64 = 0;
    // Pacing restarts from here after a pause.
    let mut paced_from: Option<(Instant, u64)> = None;
    let result: Result<(), Cut> = (|| {
        out.wait_room(super::protocol::BEGIN_LEN, &live.abandon)?;
        out.send(begin_frame(run))?;
        loop {
            if sent >= live.stop_at.load(Ordering::Relaxed) {
                return Ok(());
            }
            if live.abandon.load(Ordering::Relaxed) {
                return Err(Cut::Abandoned);
            }
            if live.paused.load(Ordering::Relaxed) {
                out.push()?;
                std::thread::sleep(Duration::from_millis(1));
                paced_from = None;
                continue;
            }
            if config.rate_hz > 0.0 {
                let (t0, n0) = *paced_from.get_or_insert((Instant::now(), sent));
                let due = t0 + Duration::from_secs_f64((sent - n0) as f64 / config.rate_hz);
                let now = Instant::now();
                if due > now {
                    out.push()?;
                    // Short steps, so that a stop is seen promptly.
                    std::thread::sleep((due - now).min(Duration::from_millis(5)));
                    continue;
                }
            }
            out.wait_room(frame_len, &live.abandon)?;
            let header = ChunkHeader { sequence: sent + 1, len, crc };
            out.send_prefixed(KIND_CHUNK, flags, &header.encode(), data.clone())?;
            sent += 1;
            bytes += data.len() as u64;
            live.publish(sent, bytes);
            if config.rate_hz > 0.0 {
                // Paced chunks leave at once instead of waiting for a full write.
                out.push()?;
            }
        }
    })();
    let error = match result {
        Ok(()) => {
            let ended = out.wait_room(super::protocol::END_LEN, &live.abandon).and_then(|()| {
                out.send(end_frame(sent, bytes))?;
                out.finish(&live.abandon)
            });
            match ended {
                Ok(()) => None,
                Err(Cut::Abandoned) => Some(format!(
                    "downstream {} stopped reading: the stream was cut after chunk {sent}, before its end marker",
                    out.conn.peer_addr()
                )),
                Err(Cut::Failed(e)) => Some(format!("ending the stream after chunk {sent}: {e}")),
            }
        }
        Err(Cut::Abandoned) => Some(format!(
            "downstream {} stopped reading: the stream was cut after chunk {sent}, before its end marker",
            out.conn.peer_addr()
        )),
        Err(Cut::Failed(e)) => Some(format!("sending chunk {}: {e}", sent + 1)),
    };
    live.publish(sent, bytes);
    if let Some(e) = error {
        live.fail(name, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, StreamCheck, StreamEvent};
    use daqflow_transport::{ConnectionOptions, Listener};

    fn listener() -> Listener {
        Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(crate::protocol::PROTOCOL))
            .unwrap()
    }

    #[test]
    fn sends_begin_numbered_chunks_with_crcs_and_an_end_marker() {
        let l = listener();
        // Paced, so that the stop (after chunk 50) comes before the generator got that far,
        // however slow this thread is on a loaded machine.
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 3000,
            rate_hz: 20.0,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.configure().unwrap();
        g.start(4).unwrap();
        let mut conn = l.accept().unwrap();
        conn.admit();
        let summary = g.stop(Some(50)).unwrap();
        assert_eq!((summary.events, summary.bytes), (50, 150_000), "{summary:?}");
        let detail: GeneratorDetail = summary.detail_as().unwrap();
        assert_eq!((detail.chunk_bytes, detail.error), (3000, None), "{summary:?}");
        assert!(summary.events_per_s > 0.0 && summary.events_per_s == detail.mean_events_per_s, "{summary:?}");
        let mut check = StreamCheck::new(4, true);
        loop {
            let f = conn.recv().unwrap();
            if let Ok(Message::Chunk { header, has_crc }) = Message::decode(&f) {
                assert!(has_crc && header.len == 3000);
            }
            if check.on_frame(&f).unwrap() == StreamEvent::End {
                break;
            }
        }
        assert!(conn.recv().unwrap_err().is_clean_close());
        assert_eq!((check.chunks(), check.sequence_errors(), check.crc_errors(), check.crc_checked()), (50, 0, 0, 50));
        assert_eq!(check.end(), Some((50, 150_000)));
    }

    #[test]
    fn without_check_the_chunks_carry_no_crc_and_rate_hz_paces_them() {
        let l = listener();
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 100,
            check: false,
            rate_hz: 1000.0,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.start(1).unwrap();
        let mut conn = l.accept().unwrap();
        conn.admit();
        // Paced chunks leave one by one: they arrive before the stop.
        let mut check = StreamCheck::new(1, true);
        while check.chunks() < 5 {
            check.on_frame(&conn.recv().unwrap()).unwrap();
        }
        assert_eq!(check.crc_checked(), 0);
        let stats = g.stats();
        assert!(stats.events >= 5 && stats.detail["chunk_bytes"] == 100, "{stats:?}");
        g.stop(None).unwrap();
    }

    #[test]
    fn a_downstream_that_does_not_read_is_cut_at_stop_after_the_timeout() {
        let l = listener();
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 1 << 20,
            stop_timeout_ms: 200,
            send_queue_bytes: 4 << 20,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.start(1).unwrap();
        let _conn = l.accept().unwrap(); // never read
        // Until the generator is blocked (the socket's buffers and its queue full): a stop
        // before would end a stream that still fits in them (a loaded machine is slow to fill
        // them).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = g.stats().events;
            if now == last && now > 0 || std::time::Instant::now() > deadline {
                break;
            }
            last = now;
        }
        let summary = g.stop(None).unwrap();
        let e = summary.detail_as::<GeneratorDetail>().unwrap().error.unwrap_or_default();
        assert!(e.contains("stopped reading") && e.contains("before its end marker"), "{summary:?}");
    }

    #[test]
    fn bad_configurations_are_refused() {
        let e = |c: GeneratorConfig| Generator::new("g", c).configure().unwrap_err().to_string();
        assert!(e(GeneratorConfig::default()).contains("`downstream` is required"));
        let d = || GeneratorConfig { downstream: "127.0.0.1:1".into(), ..Default::default() };
        assert!(e(GeneratorConfig { chunk_bytes: 0, ..d() }).contains("`chunk_bytes` = 0 is out of range"));
        assert!(e(GeneratorConfig { rate_hz: -1.0, ..d() }).contains("rate_hz"));
        assert!(
            e(GeneratorConfig { downstream: "nowhere".into(), ..d() })
                .contains("`downstream` = \"nowhere\" is not an address")
        );
        let mut g = Generator::new("g", GeneratorConfig { connect_timeout_ms: 0, ..d() });
        assert!(g.start(1).unwrap_err().to_string().contains("g: downstream: could not connect"));
    }
}
