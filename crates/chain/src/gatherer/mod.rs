//! The gatherer: DAQ-Middleware's "gatherer", which reads one or more readout links and puts
//! their data into the chain. Its links (`inputs`) are any mix of
//! - **raw TCP** (`kind = "tcp"`): it listens (bound at `configure`), the front end connects and
//!   sends frames cut by a length field in their headers ([`crate::framing`]: `header_bytes`,
//!   `length_offset`, `length_width` 1/2/4/8, `length_endian`, `length_includes_header`); each
//!   frame, header included, becomes one chunk. The link ends when the front end closes the
//!   connection after a whole frame; a connection closed inside a frame, or a frame longer than
//!   `max_frame_bytes`, fails the gatherer with the reason. The link speaks no daqflow handshake
//!   (a front end does not), so bind it to the readout network only;
//! - **a daqflow data file** (`kind = "file"`): each record one chunk, in order; it ends at the
//!   file's end;
//! - **a source** (`kind = "source"`): generated chunks as the generator makes them, paced at
//!   `rate_hz`; it ends at `stop`.
//!
//! Every link is read by a thread of its own; their chunks go downstream as one stream (begin
//! marker, chunks numbered 1, 2, 3, … in the order they arrived, with their CRC32C), and the
//! end markers are **merged**: one end marker goes out when every link has ended. `stop` ends
//! the sources, waits (at most `stop_timeout_ms`) for the TCP links to close and the file links
//! to finish, then sends the end marker; a TCP link still open then is cut, and its detail says
//! so.

mod config;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_transport::{Connection, RetryPolicy};
use serde::{Deserialize, Serialize};

pub use self::config::{FileInput, GathererConfig, InputConfig, SourceInput, TcpInput, schema};
use crate::framing::Deframer;
use crate::link::{Cut, Live, Outlet, TICK, Work, Worker, read, resolve, spawn, worker_component};
use crate::protocol::{CHUNK_HEADER_LEN, ChunkHeader, FLAG_CRC, KIND_CHUNK, begin_frame, end_frame};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The gatherer component (its hooks are the chain's one worker's: the thread, the stop, the
/// report).
pub struct Gatherer(Worker<Gathering>);

#[derive(Default)]
struct LinkCounters {
    chunks: AtomicU64,
    bytes: AtomicU64,
    ended: AtomicBool,
    note: Mutex<Option<String>>,
}

/// What one link of a gatherer read (an element of [`GathererDetail::inputs`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkDetail {
    /// `tcp`, `file` or `source`.
    pub kind: String,
    /// Its address (TCP), path (file), or none.
    pub address: Option<String>,
    /// Chunks read from it.
    pub chunks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Whether it ended (closed by the front end, file read to its end, source stopped).
    pub ended: bool,
    /// How it ended if not cleanly (a TCP link cut at stop), or why it failed.
    pub note: Option<String>,
}

/// The gatherer's own figures, the `detail` of its [`Stats`]; its `events` are the chunks sent
/// downstream, its `bytes` their data bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GathererDetail {
    /// Each link.
    pub inputs: Vec<LinkDetail>,
    /// Seconds from the first chunk sent to the latest.
    pub seconds: f64,
    /// Chunks per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Megabytes (10⁶ bytes) per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Whether the end marker was sent.
    pub end_sent: bool,
    /// Why the run failed, if it did.
    pub error: Option<String>,
}

/// Builds a gatherer from its configuration table: the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: GathererConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Gatherer::new(name, c)))
}

/// The `gatherer` kind: the chain's readout, outside the event accounting; it starts last and
/// stops first, as the generator.
pub fn kind() -> Kind {
    Kind::new("gatherer", "reads readout links (raw TCP, data files, a source) into the chain", Role::Other, factory)
        .stages(7, 1)
        .schema(config::schema())
}

impl Gatherer {
    /// A gatherer named `name`.
    pub fn new(name: &str, config: GathererConfig) -> Gatherer {
        Gatherer(Worker::new(
            name,
            Gathering {
                config,
                listeners: Vec::new(),
                links: Arc::new(Vec::new()),
                ending: Arc::new(AtomicBool::new(false)),
            },
        ))
    }
}

/// What a gatherer does; [`Worker`] runs it.
struct Gathering {
    config: GathererConfig,
    /// The TCP links' listeners, by input index.
    listeners: Vec<Option<Arc<TcpListener>>>,
    links: Arc<Vec<LinkCounters>>,
    /// Raised by `stop`: sources end, TCP links get `stop_timeout_ms` to close.
    ending: Arc<AtomicBool>,
}

impl Work for Gathering {
    const THREAD: &'static str = "gather";

    /// Binds the TCP links; answers `{"listen": ADDR}` (the first TCP link's) and `{"inputs":
    /// [ADDR or null, …]}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        self.listeners.clear();
        let mut answer = Info::new();
        let mut addresses = Vec::new();
        for (i, input) in self.config.inputs.iter().enumerate() {
            let InputConfig::Tcp(t) = input else {
                self.listeners.push(None);
                addresses.push(serde_json::Value::Null);
                continue;
            };
            let addr = resolve(name, &format!("inputs[{i}].listen"), &t.listen)?;
            let l = TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| ComponentError::Failed(format!("{name}: inputs[{i}]: binding {addr}: {e}")))?;
            let bound = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
            answer.entry("listen").or_insert_with(|| bound.clone().into());
            addresses.push(bound.into());
            self.listeners.push(Some(Arc::new(l)));
        }
        answer.insert("inputs".into(), addresses.into());
        Ok(answer)
    }

    /// Connects `downstream`, starts a thread per link; the gathering thread merges them.
    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        if self.listeners.len() != self.config.inputs.len() {
            return Err(ComponentError::Failed("not configured".into()));
        }
        let c = &self.config;
        let addr = resolve(name, "downstream", &c.downstream)?;
        let policy = RetryPolicy::for_duration(Duration::from_millis(c.connect_timeout_ms));
        let conn = Connection::connect_with_retry(&[addr], &c.tuning().options(), &policy)
            .map_err(|e| ComponentError::Failed(format!("{name}: downstream: {e}")))?;
        let mut out = Outlet::new(conn, c.send_queue_bytes);
        self.links = Arc::new(c.inputs.iter().map(|_| LinkCounters::default()).collect());
        self.ending = Arc::new(AtomicBool::new(false));
        let (tx, rx) = sync_channel::<FromLink>(1024);
        let mut threads = Vec::new();
        for (i, input) in c.inputs.iter().enumerate() {
            let (tx, live, links, ending) = (tx.clone(), live.clone(), self.links.clone(), self.ending.clone());
            let input = input.clone();
            let listener = self.listeners[i].clone();
            let patience = Duration::from_millis(c.stop_timeout_ms);
            threads.push(spawn(name, &format!("link-{i}"), move || {
                let result = match (&input, listener) {
                    (InputConfig::Tcp(t), Some(l)) => read_tcp(i, t, &l, &tx, &live, &links[i], &ending, patience),
                    (InputConfig::File(f), _) => read_file(i, f, &tx),
                    (InputConfig::Source(s), _) => read_source(i, s, &tx, &live, &ending),
                    (InputConfig::Tcp(_), None) => Err("not configured".into()),
                };
                let _ = tx.send(FromLink::Ended(i, result.err()));
            })?);
        }
        let (name, live, links) = (name.to_owned(), live.clone(), self.links.clone());
        let n = c.inputs.len();
        Ok(Box::new(move || {
            let result = gather(run, n, &rx, &mut out, &live, &links);
            drop(rx);
            for t in threads {
                let _ = t.join();
            }
            if let Err(e) = result {
                live.fail(&name, e);
            }
        }))
    }

    /// The TCP links have their own patience (`stop_timeout_ms`); the end marker needs a
    /// little more.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms.saturating_mul(2))
    }

    /// Ends the sources; the other links get `stop_timeout_ms` to end.
    fn stopping(&mut self, _live: &Live, _last_event: Option<u64>) {
        self.ending.store(true, Ordering::SeqCst);
    }

    /// Chunks sent on, their bytes; a [`GathererDetail`] with each link's.
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        let inputs = self
            .config
            .inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let c = self.links.get(i);
                let (kind, address) = match input {
                    InputConfig::Tcp(_) => (
                        "tcp",
                        self.listeners.get(i).and_then(|l| l.as_ref()?.local_addr().ok()).map(|a| a.to_string()),
                    ),
                    InputConfig::File(f) => ("file", Some(f.path.display().to_string())),
                    InputConfig::Source(_) => ("source", None),
                };
                LinkDetail {
                    kind: kind.into(),
                    address,
                    chunks: c.map_or(0, |c| c.chunks.load(Ordering::Relaxed)),
                    bytes: c.map_or(0, |c| c.bytes.load(Ordering::Relaxed)),
                    ended: c.is_some_and(|c| c.ended.load(Ordering::Relaxed)),
                    note: c.and_then(|c| read(&c.note)),
                }
            })
            .collect();
        stats.with_detail(&GathererDetail {
            inputs,
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            end_sent: read(&live.end).is_some(),
            error: live.failure(),
        })
    }

    fn release(&mut self) {
        self.ending.store(true, Ordering::SeqCst);
        self.listeners.clear();
    }
}

worker_component!(Gatherer);

/// What a link's thread hands to the gathering thread.
enum FromLink {
    Chunk(usize, Bytes),
    /// The link ended: cleanly (`None`) or failed (why).
    Ended(usize, Option<String>),
}

fn hand(tx: &SyncSender<FromLink>, i: usize, data: Bytes) -> Result<(), String> {
    tx.send(FromLink::Chunk(i, data)).map_err(|_| "the gatherer stopped".to_owned())
}

/// A raw TCP link: accept the front end, cut its bytes into frames until it closes.
#[allow(clippy::too_many_arguments)]
fn read_tcp(
    i: usize,
    t: &TcpInput,
    listener: &TcpListener,
    tx: &SyncSender<FromLink>,
    live: &Live,
    counters: &LinkCounters,
    ending: &AtomicBool,
    patience: Duration,
) -> Result<(), String> {
    let mut deframer = Deframer::new(t.framing()).map_err(|e| e.to_string())?;
    let mut ending_since: Option<Instant> = None;
    let mut out_of_time = || {
        if live.abandon.load(Ordering::Relaxed) {
            return true;
        }
        if ending.load(Ordering::Relaxed) {
            return ending_since.get_or_insert_with(Instant::now).elapsed() >= patience;
        }
        false
    };
    let mut stream: TcpStream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if out_of_time() {
                    *counters.note.lock().unwrap_or_else(|p| p.into_inner()) = Some("no front end connected".into());
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accepting the front end: {e}")),
        }
    };
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    stream.set_nonblocking(false).and_then(|()| stream.set_read_timeout(Some(TICK))).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match stream.read(&mut buf) {
            Ok(0) if deframer.pending() == 0 => return Ok(()),
            Ok(0) => {
                return Err(format!(
                    "front end {peer} closed the link inside a frame ({} bytes of it received)",
                    deframer.pending()
                ));
            }
            Ok(n) => {
                deframer.push(&buf[..n]);
                while let Some(frame) = deframer.next_frame().map_err(|e| format!("front end {peer}: {e}"))? {
                    hand(tx, i, frame)?;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("front end {peer}: {e}")),
        }
        if out_of_time() {
            *counters.note.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("still open at stop: cut ({} bytes of a frame dropped)", deframer.pending()));
            return Ok(());
        }
    }
}

/// A data file replayed, record by record.
fn read_file(i: usize, f: &FileInput, tx: &SyncSender<FromLink>) -> Result<(), String> {
    let mut r = daqflow_wire::file::FileReader::open(&f.path).map_err(|e| e.to_string())?;
    for k in 0..r.len().map_err(|e| e.to_string())? {
        hand(tx, i, r.read_record(k).map_err(|e| e.to_string())?.payload)?;
    }
    Ok(())
}

/// Generated chunks until `stop`.
fn read_source(
    i: usize,
    s: &SourceInput,
    tx: &SyncSender<FromLink>,
    live: &Live,
    ending: &AtomicBool,
) -> Result<(), String> {
    let data: Bytes = (0..s.chunk_bytes).map(|k| (k as u8) ^ ((k >> 8) as u8)).collect::<Vec<u8>>().into();
    let start = Instant::now();
    let mut sent = 0u64;
    while !ending.load(Ordering::Relaxed) && !live.abandon.load(Ordering::Relaxed) {
        if s.rate_hz > 0.0 {
            let due = start + Duration::from_secs_f64(sent as f64 / s.rate_hz);
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(TICK));
                continue;
            }
        }
        hand(tx, i, data.clone())?;
        sent += 1;
    }
    Ok(())
}

/// The gathering thread: the begin marker, every link's chunks as they come, and one end
/// marker once every link has ended.
fn gather(
    run: u32,
    n: usize,
    rx: &Receiver<FromLink>,
    out: &mut Outlet,
    live: &Live,
    links: &[LinkCounters],
) -> Result<(), String> {
    let failed = |c: Cut| match c {
        Cut::Abandoned => "stopped while waiting for the downstream".to_owned(),
        Cut::Failed(e) => format!("downstream: {e}"),
    };
    out.send(begin_frame(run)).map_err(failed)?;
    let (mut sequence, mut bytes, mut open) = (0u64, 0u64, n);
    while open > 0 {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(format!("stopped before every link ended ({open} of {n} still open)"));
        }
        match rx.recv_timeout(TICK) {
            Ok(FromLink::Chunk(i, data)) => {
                out.wait_room(CHUNK_HEADER_LEN + data.len(), &live.abandon).map_err(failed)?;
                let header = ChunkHeader::for_data(sequence + 1, &data, true);
                let len = data.len() as u64;
                out.send_prefixed(KIND_CHUNK, FLAG_CRC, &header.encode(), data).map_err(failed)?;
                sequence += 1;
                bytes += len;
                links[i].chunks.fetch_add(1, Ordering::Relaxed);
                links[i].bytes.fetch_add(len, Ordering::Relaxed);
                live.publish(sequence, bytes);
                out.push().map_err(failed)?;
            }
            Ok(FromLink::Ended(i, why)) => {
                links[i].ended.store(true, Ordering::Relaxed);
                if let Some(e) = why {
                    *links[i].note.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                    return Err(format!("inputs[{i}]: {e}"));
                }
                open -= 1;
            }
            Err(RecvTimeoutError::Timeout) => {
                out.push().map_err(failed)?;
            }
            Err(RecvTimeoutError::Disconnected) => return Err("every link thread ended".into()),
        }
    }
    live.publish(sequence, bytes);
    out.wait_room(crate::protocol::END_LEN, &live.abandon).map_err(failed)?;
    out.send(end_frame(sequence, bytes)).map_err(failed)?;
    *live.end.lock().unwrap_or_else(|p| p.into_inner()) = Some((sequence, bytes));
    out.finish(&live.abandon).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::{Endian, Framing};
    use crate::sink::{Sink, SinkConfig, SinkDetail};
    use std::io::Write;

    fn sink() -> (Sink, String) {
        let mut s = Sink::new("sink", SinkConfig::default());
        let listen = s.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        s.start(1).unwrap();
        (s, listen)
    }

    #[test]
    fn two_tcp_links_and_a_file_are_merged_into_one_stream_with_one_end_marker() {
        let dir = std::env::temp_dir().join(format!("daqflow-gatherer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut fw = daqflow_wire::file::FileWriterConfig::new(&dir, 1);
        fw.sync_on_close = false;
        let mut w = daqflow_wire::file::FileWriter::new(fw).unwrap();
        for k in 0..7u64 {
            w.write_event(daqflow_wire::EventId(k), &[k as u8; 33]).unwrap();
        }
        let file = w.finish().unwrap()[0].path.clone();
        let (mut s, listen) = sink();
        let big = TcpInput {
            header_bytes: 8,
            length_offset: 2,
            length_width: 4,
            length_endian: Endian::Big,
            ..Default::default()
        };
        let small = TcpInput { length_width: 2, header_bytes: 2, length_includes_header: true, ..Default::default() };
        let config = GathererConfig {
            downstream: listen,
            inputs: vec![
                InputConfig::Tcp(big.clone()),
                InputConfig::Tcp(small.clone()),
                InputConfig::File(FileInput { path: file }),
            ],
            ..Default::default()
        };
        let mut g = Gatherer::new("g", config);
        let answer = g.configure().unwrap();
        let addrs: Vec<String> =
            answer["inputs"].as_array().unwrap()[..2].iter().map(|a| a.as_str().unwrap().to_owned()).collect();
        assert_eq!(answer["listen"].as_str(), Some(addrs[0].as_str()));
        g.start(1).unwrap();
        let front_end = |addr: String, framing: Framing, n: usize, len: usize| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                let wire: Vec<u8> = (0..n).flat_map(|k| framing.encode(&vec![k as u8; len]).unwrap()).collect();
                // In pieces of odd sizes, so that headers arrive split.
                for piece in wire.chunks(77) {
                    c.write_all(piece).unwrap();
                }
            })
        };
        let a = front_end(addrs[0].clone(), big.framing(), 40, 1000);
        let b = front_end(addrs[1].clone(), small.framing(), 25, 10);
        a.join().unwrap();
        b.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while g.stats().detail["end_sent"] != true && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(g.stats().detail["end_sent"] == true, "the end marker went out once every link ended, before stop");
        let summary = g.stop(None).unwrap();
        let d: GathererDetail = summary.detail_as().unwrap();
        assert!(d.error.is_none() && d.end_sent, "{d:?}");
        let per: Vec<(u64, u64, bool)> = d.inputs.iter().map(|l| (l.chunks, l.bytes, l.ended)).collect();
        assert_eq!(per, [(40, 40 * 1008, true), (25, 25 * 12, true), (7, 7 * 33, true)], "{d:?}");
        assert_eq!(summary.events, 72);
        let got = s.stop(None).unwrap();
        let sd: SinkDetail = got.detail_as().unwrap();
        assert!(sd.end_seen && sd.error.is_none(), "{sd:?}");
        assert_eq!((got.events, sd.sequence_errors, sd.crc_errors, sd.missing), (72, 0, 0, 0), "{sd:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_link_closed_inside_a_frame_fails_the_gatherer_and_a_source_ends_at_stop() {
        let (mut s, listen) = sink();
        let config = GathererConfig {
            downstream: listen,
            inputs: vec![InputConfig::Tcp(TcpInput::default()), InputConfig::Source(SourceInput::default())],
            ..Default::default()
        };
        let mut g = Gatherer::new("g", config);
        let addr = g.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        g.start(1).unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&100u32.to_le_bytes()).unwrap();
        c.write_all(&[0u8; 10]).unwrap();
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(20);
        while g.failure().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let f = g.failure().expect("failed");
        assert!(f.contains("closed the link inside a frame (14 bytes of it received)"), "{f}");
        g.stop(None).unwrap();
        let _ = s.reset();
    }
}
