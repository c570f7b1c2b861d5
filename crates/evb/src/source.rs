//! A source: one front-end readout stream (the FEROL of the CMS paper). It pushes fragments over
//! its own TCP connection to one RU, free-running (as fast as the RU takes them, as in the
//! paper's measurements) or paced at a trigger rate, with payload sizes drawn from a
//! [`SizeModel`](crate::model::SizeModel) (or its line of a stream table).
//!
//! The wire protocol is small enough for a user's hardware or program to be a source: connect,
//! send a hello frame, then one frame per fragment with event ids 1, 2, 3, …, then an end frame
//! (`docs/evb.md`). With `role = "trigger"` a source feeds the EVM's triggers instead.
//!
//! ```no_run
//! use daqflow_evb::component::Component;
//! use daqflow_evb::model::SizeModel;
//! use daqflow_evb::source::{Source, SourceConfig};
//! let mut s = Source::new("src-3", SourceConfig {
//!     source_id: 3,
//!     ru: "127.0.0.1:7200".into(),
//!     size: SizeModel::LogNormal { mean: 2048.0, rms: 512.0 },
//!     rate_hz: 100_000.0,
//!     ..Default::default()
//! });
//! s.configure()?;
//! s.start(1)?;
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! let summary = s.stop(Some(100_000))?; // produce up to event 100000, then end the stream
//! # let _ = summary;
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_transport::Connection;
use daqflow_wire::{EventId, FRAGMENT_HEADER_LEN, FragmentFlags, FragmentHeader, pad8};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::EvbError;
use crate::component::{Component, State, expect_run, expect_state, reported, set_paused};
use crate::link::{connect, data_options, unix_ns};
use crate::model::{Rng, SizeModel, StreamTable, fill_pattern};
use crate::protocol::{KIND_FRAGMENT, Message, Role};

/// What a source's payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The pattern of (event, source), written for every fragment: checkable end to end.
    #[default]
    Pattern,
    /// One pattern buffer sent for every fragment (sizes rounded up to 8 bytes), with a fresh
    /// header each time and the payload's CRC (computed once per size): what hardware emulators
    /// do, so that a measurement on a shared machine is not dominated by generating data.
    Cached,
}

/// Who the source feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourceRole {
    /// A readout unit (`ru` address).
    #[default]
    Data,
    /// The EVM's trigger input (`ru` is then the EVM's address).
    Trigger,
}

/// Configuration of a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    /// The source id, unique in the system.
    pub source_id: u32,
    /// Address of the RU it feeds (or of the EVM with `role = "trigger"`).
    pub ru: String,
    /// What it feeds.
    pub role: SourceRole,
    /// Payload sizes.
    pub size: SizeModel,
    /// A stream table; this source's line overrides `size`.
    pub stream_table: Option<PathBuf>,
    /// Largest payload.
    pub max_bytes: usize,
    /// Fragments per second; 0: free-running.
    pub rate_hz: f64,
    /// Trigger type written in every fragment.
    pub trigger_type: u32,
    /// Payload content.
    pub payload: Payload,
    /// Flip one payload byte of this event after the CRC is computed (to test detection).
    pub corrupt_event: Option<u64>,
    /// Seed of the size model.
    pub seed: u64,
    /// How long (ms) `start` retries connecting.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for a stream its RU no longer reads before cutting it.
    pub stop_timeout_ms: u64,
}

impl SourceConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::component::Checks::new("source");
        c.address("ru", &self.ru);
        if let Err(e) = self.size.validate() {
            c.problem("size", e);
        }
        c.int("max_bytes", self.max_bytes as u64, 1, 1 << 30);
        c.float("rate_hz", self.rate_hz, 0.0, 1e9);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000);
        c.int("stop_timeout_ms", self.stop_timeout_ms, 1, 3_600_000);
        c.finish()
    }
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            source_id: 0,
            ru: "127.0.0.1:7200".into(),
            role: SourceRole::Data,
            size: SizeModel::default(),
            stream_table: None,
            max_bytes: 1 << 20,
            rate_hz: 0.0,
            trigger_type: 1,
            payload: Payload::Pattern,
            corrupt_event: None,
            seed: 0,
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 5_000,
        }
    }
}

struct Shared {
    /// The connection's socket while the sending thread owns it (to cut a stream the RU no
    /// longer reads when stopping).
    fd: Mutex<Option<RawFd>>,
    stop_at: AtomicU64,
    paused: AtomicBool,
    sent: AtomicU64,
    bytes: AtomicU64,
    abandon: AtomicBool,
    failure: Mutex<Option<String>>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            fd: Mutex::new(None),
            stop_at: AtomicU64::new(u64::MAX),
            paused: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            abandon: AtomicBool::new(false),
            failure: Mutex::new(None),
        }
    }
}

/// The source component.
pub struct Source {
    name: String,
    config: SourceConfig,
    model: SizeModel,
    state: State,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Value>>,
    run: u32,
    started: Option<Instant>,
}

impl Source {
    /// A source named `name`.
    pub fn new(name: &str, config: SourceConfig) -> Source {
        Source {
            name: name.into(),
            model: config.size,
            config,
            state: State::Initial,
            shared: Arc::default(),
            thread: None,
            run: 0,
            started: None,
        }
    }
}

impl Component for Source {
    fn kind(&self) -> &'static str {
        "source"
    }
    fn state(&self) -> State {
        reported(self.state, self.failure().is_some())
    }

    fn configure(&mut self) -> Result<Value, EvbError> {
        expect_state("configure", self.state, State::Initial)?;
        self.config.validate()?;
        self.model = self.config.size;
        if let Some(path) = &self.config.stream_table {
            let table = StreamTable::load(path).map_err(EvbError::Config)?;
            self.model = table.model_for(self.config.source_id).ok_or_else(|| {
                EvbError::Config(format!(
                    "source {}: not in the stream table {}",
                    self.config.source_id,
                    path.display()
                ))
            })?;
        }
        self.model.validate().map_err(EvbError::Config)?;
        if !(self.config.rate_hz >= 0.0 && self.config.rate_hz.is_finite()) {
            return Err(EvbError::Config(format!("source: rate_hz {} must be 0 or positive", self.config.rate_hz)));
        }
        self.state = State::Configured;
        Ok(json!({ "mean_bytes": self.model.mean() }))
    }

    fn start(&mut self, run: u32) -> Result<(), EvbError> {
        expect_state("start", self.state, State::Configured)?;
        let role = match self.config.role {
            SourceRole::Data => Role::Source,
            SourceRole::Trigger => Role::Trigger,
        };
        let hello =
            Message::Hello { role, id: self.config.source_id, run, name: self.name.clone(), addr: String::new() };
        let conn =
            connect(&self.config.ru, &data_options(), Duration::from_millis(self.config.connect_timeout_ms), &hello)?;
        self.shared = Arc::default();
        self.run = run;
        let (config, model, shared) = (self.config.clone(), self.model, self.shared.clone());
        let name = self.name.clone();
        self.thread = Some(
            std::thread::Builder::new()
                .name(format!("{name}-send"))
                .spawn(move || produce(name, config, model, run, conn, shared))
                .map_err(|e| EvbError::io("starting the source thread", e))?,
        );
        self.started = Some(Instant::now());
        self.state = State::Running;
        Ok(())
    }

    fn stop(&mut self, arg: Option<u64>) -> Result<Value, EvbError> {
        expect_run("stop", self.state)?;
        let sent = self.shared.sent.load(Ordering::SeqCst);
        let patience = Duration::from_millis(self.config.stop_timeout_ms);
        let summary = self.end_thread(arg.unwrap_or(sent), patience).unwrap_or(Value::Null);
        self.state = State::Configured;
        Ok(summary)
    }

    fn pause(&mut self) -> Result<(), EvbError> {
        set_paused(&mut self.state, true, Some(&self.shared.paused))
    }

    fn resume(&mut self) -> Result<(), EvbError> {
        set_paused(&mut self.state, false, Some(&self.shared.paused))
    }

    fn reset(&mut self) -> Result<(), EvbError> {
        self.shared.abandon.store(true, Ordering::SeqCst);
        self.end_thread(0, Duration::from_secs(1));
        self.state = State::Initial;
        Ok(())
    }

    fn stats(&self) -> Value {
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-9);
        let sent = self.shared.sent.load(Ordering::Relaxed);
        let bytes = self.shared.bytes.load(Ordering::Relaxed);
        json!({
            "state": self.state().name(),
            "run": self.run,
            "fragments": sent,
            "bytes": bytes,
            "fragments_per_s": sent as f64 / secs,
            "mb_per_s": bytes as f64 / secs / 1e6,
        })
    }

    fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Source {
    /// Tells the sending thread to end after event `stop_at` and joins it; a thread still blocked
    /// after `patience` (its RU no longer reads) has its socket shut down.
    fn end_thread(&mut self, stop_at: u64, patience: Duration) -> Option<Value> {
        let thread = self.thread.take()?;
        self.shared.stop_at.store(stop_at, Ordering::SeqCst);
        // A stop ends a pause: the source produces up to `stop_at` (or is cut off below).
        self.shared.paused.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + patience;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !thread.is_finished() {
            // Whether it waits in a write (its RU no longer reads) or for its pacing: end it.
            self.shared.abandon.store(true, Ordering::SeqCst);
            let fd = self.shared.fd.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(fd) = *fd {
                // SAFETY: the sending thread clears `fd` under this lock before it closes the
                // socket, so `fd` is still its open socket; shutdown(2) only wakes its write.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        }
        Some(thread.join().unwrap_or_else(|_| json!({ "error": "the source thread panicked" })))
    }
}

fn produce(
    name: String,
    config: SourceConfig,
    model: SizeModel,
    run: u32,
    mut conn: Connection,
    shared: Arc<Shared>,
) -> Value {
    let mut rng = Rng::new(config.seed ^ u64::from(config.source_id).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let max = config.max_bytes;
    let cached: Bytes = if config.payload == Payload::Cached {
        let mut b = vec![0u8; pad8(max)];
        fill_pattern(&mut b, 0, config.source_id);
        Bytes::from(b)
    } else {
        Bytes::new()
    };
    // The payload CRC of each prefix length of the cached buffer, computed the first time that
    // length is sent (a multiple of 8: one entry per 8 bytes).
    let mut cached_crcs: Vec<Option<u32>> = vec![None; cached.len() / 8 + 1];
    *shared.fd.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.as_raw_fd());
    let started = Instant::now();
    let mut id: u64 = 1;
    // The trigger time stamp: read once per 64 fragments when free-running (a clock read per
    // fragment is a measurable share of a source's time at a million fragments a second).
    let mut stamp = unix_ns();
    // Pacing restarts from here after a pause.
    let mut paced_from: Option<(Instant, u64)> = None;
    let mut error = None;
    let mut buf = BytesMut::new();
    loop {
        if id > shared.stop_at.load(Ordering::Relaxed) {
            break;
        }
        if shared.abandon.load(Ordering::Relaxed) {
            break;
        }
        if shared.paused.load(Ordering::Relaxed) {
            // What was produced before the pause goes out now, not after it.
            if let Err(e) = conn.try_flush() {
                error = Some(format!("sending before a pause: {e}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            paced_from = None;
            continue;
        }
        if config.rate_hz > 0.0 {
            let (t0, id0) = *paced_from.get_or_insert((Instant::now(), id));
            let due = t0 + Duration::from_secs_f64((id - id0) as f64 / config.rate_hz);
            let now = Instant::now();
            if due > now {
                // A paced source writes what it has before it waits: the transport writes by
                // itself only once a chunk is full, which slow or small fragments take seconds
                // to fill (the builder then looked stalled).
                if let Err(e) = conn.try_flush() {
                    error = Some(format!("sending event {}: {e}", id - 1));
                    break;
                }
                // Sleep in short steps so that a stop is seen promptly.
                std::thread::sleep((due - now).min(Duration::from_millis(5)));
                continue;
            }
        }
        let mut size = model.sample(&mut rng, max);
        if id % 64 == 1 || config.rate_hz > 0.0 {
            stamp = unix_ns();
        }
        let mut info = FragmentHeader {
            flags: FragmentFlags::empty(),
            source_id: config.source_id,
            event_id: EventId(id),
            run_number: run,
            trigger_type: config.trigger_type,
            timestamp: stamp,
            payload_len: 0,
            payload_crc: 0,
        };
        let sent = match config.payload {
            Payload::Cached => {
                size = pad8(size).min(cached.len());
                info.payload_len = size as u32;
                info.payload_crc =
                    *cached_crcs[size / 8].get_or_insert_with(|| daqflow_wire::crc::crc32c(&cached[..size]));
                // Small fragments are copied into the send chunk from the cached buffer; large
                // ones are written from it (a slice of the same memory, no copy).
                if size <= 2048 {
                    conn.send_slices(KIND_FRAGMENT, 0, 0, &[&info.encode(), &cached[..size]])
                } else {
                    conn.send_prefixed(KIND_FRAGMENT, 0, 0, &info.encode(), cached.slice(..size))
                }
            }
            Payload::Pattern => {
                let padded = pad8(size);
                buf.reserve(FRAGMENT_HEADER_LEN + padded);
                buf.put_bytes(0, FRAGMENT_HEADER_LEN + padded);
                fill_pattern(&mut buf[FRAGMENT_HEADER_LEN..FRAGMENT_HEADER_LEN + size], id, config.source_id);
                info.payload_len = size as u32;
                info.payload_crc = daqflow_wire::crc::crc32c(&buf[FRAGMENT_HEADER_LEN..FRAGMENT_HEADER_LEN + size]);
                buf[..FRAGMENT_HEADER_LEN].copy_from_slice(&info.encode());
                if config.corrupt_event == Some(id) && size > 0 {
                    buf[FRAGMENT_HEADER_LEN] ^= 0xA5;
                    tracing::warn!(source = config.source_id, "corrupting event {id} on purpose");
                }
                conn.send(daqflow_wire::frame::Frame::new(KIND_FRAGMENT, buf.split().freeze()))
            }
        };
        if let Err(e) = sent {
            if !shared.abandon.load(Ordering::Relaxed) {
                error = Some(format!("sending event {id}: {e}"));
            }
            break;
        }
        shared.sent.store(id, Ordering::Relaxed);
        shared.bytes.fetch_add((FRAGMENT_HEADER_LEN + pad8(size)) as u64, Ordering::Relaxed);
        id += 1;
    }
    let last = id - 1;
    if shared.abandon.load(Ordering::Relaxed) {
        error = Some(format!("the RU stopped reading: stream cut after event {last}"));
    }
    if error.is_none() {
        let end = conn.send(Message::End { last_event: last }.to_frame()).map_err(|e| e.to_string());
        if let Err(e) = end.and_then(|()| conn.close().map_err(|e| e.to_string())) {
            error = Some(format!("ending the stream: {e}"));
        }
    }
    *shared.fd.lock().unwrap_or_else(|p| p.into_inner()) = None;
    drop(conn);
    if let Some(e) = &error {
        tracing::error!(source = %name, "{e}");
        *shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let bytes = shared.bytes.load(Ordering::Relaxed);
    json!({
        "component": name,
        "kind": "source",
        "source_id": config.source_id,
        "run": run,
        "last_event": last,
        "fragments": last,
        "bytes": bytes,
        "seconds": secs,
        "mb_per_s": bytes as f64 / secs / 1e6,
        "error": error,
    })
}
