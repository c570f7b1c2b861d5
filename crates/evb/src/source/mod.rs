//! A source: one front-end readout stream (the FEROL of the CMS paper). It pushes fragments over
//! its own TCP connection to one RU, free-running (as fast as the RU takes them, as in the
//! paper's measurements) or paced at a trigger rate, with payload sizes drawn from a
//! [`SizeModel`] (or its line of a stream table).
//!
//! The wire protocol is small enough for a user's hardware or program to be a source: connect,
//! send a hello frame, then one frame per fragment with event ids 1, 2, 3, …, then an end frame
//! (`docs/evb.md`). With `role = "trigger"` a source feeds the EVM's triggers instead.
//!
//! Its [`Stats`] count fragments sent (`events`) and their bytes; the [`SourceDetail`] adds the
//! source id, the last event sent and, in the summary, why the stream ended badly.
//!
//! ```no_run
//! use daqflow_component::Component;
//! use daqflow_evb::model::SizeModel;
//! use daqflow_evb::source::{Source, SourceConfig, SourceDetail};
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
//! assert_eq!(summary.detail_as::<SourceDetail>().unwrap().last_event, summary.events);
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```
//!
//! In the `daqflow` binary it is the kind [`kind()`] makes: `daqflow component source`.

pub mod adc;
mod config;
mod stream;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_component::{Component, ComponentError, Info, Kind, Role as KindRole, Stats, Verb, parse_config};
use daqflow_transport::Connection;
use daqflow_wire::{EventId, FRAGMENT_HEADER_LEN, FragmentFlags, FragmentHeader, pad8};

pub use self::config::{Payload, SourceConfig, SourceRole, schema};
pub use self::stream::{MAX_FRAGMENT_PAYLOAD, SourceStream};
use crate::EvbError;
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{connect, data_options, unix_ns};
use crate::model::{Rng, SizeModel, StreamTable, fill_pattern};
use crate::protocol::{KIND_FRAGMENT, Message, Role};
pub use crate::stats::SourceDetail;

/// The `source` kind: a readout stream feeding an RU (or the EVM's triggers). It starts last
/// and stops right after the EVM (stages 7 and 1), so that every event triggered has its
/// fragments.
pub fn kind() -> Kind {
    Kind::new(
        "source",
        "a front-end readout stream: pushes fragments to a readout unit",
        KindRole::Readout,
        |name, t| {
            let config = checked(name, parse_config::<SourceConfig>(name, t)?, SourceConfig::validate)?;
            Ok(Box::new(Source::new(name, config)))
        },
    )
    .stages(7, 1)
    .schema(config::schema())
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
    /// The pace (`rate_hz`, an f64's bits): a live parameter the sending thread follows.
    rate_bits: AtomicU64,
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
            rate_bits: AtomicU64::new(0f64.to_bits()),
        }
    }
}

/// The source component.
pub struct Source {
    name: String,
    config: SourceConfig,
    /// The size model, once configured.
    model: Option<SizeModel>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Stats>>,
    run: u32,
    started: Option<Instant>,
    /// When the last run's stream ended (its thread was joined).
    ended: Option<Instant>,
    rates: Mutex<Rates<2>>,
}

impl Source {
    /// A source named `name`.
    pub fn new(name: &str, config: SourceConfig) -> Source {
        Source {
            name: name.into(),
            config,
            model: None,
            shared: Arc::default(),
            thread: None,
            run: 0,
            started: None,
            ended: None,
            rates: Mutex::new(Rates::new(Instant::now())),
        }
    }

    fn detail(&self, last_event: u64, error: Option<String>) -> SourceDetail {
        SourceDetail {
            source_id: self.config.source_id,
            run: self.run,
            seconds: self
                .started
                .map_or(0.0, |t| self.ended.unwrap_or_else(Instant::now).saturating_duration_since(t).as_secs_f64()),
            last_event,
            error,
        }
    }
}

impl Component for Source {
    // The schema declares `rate_hz` live in any configured state and checked its range.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        match (key, value.as_float()) {
            ("rate_hz", Some(r)) => {
                self.config.rate_hz = r;
                self.shared.rate_bits.store(r.to_bits(), Ordering::Relaxed);
                tracing::info!(rate_hz = r, "rate_hz is now {r}");
                Ok(())
            }
            _ => Err(ComponentError::Refused(format!("`{key}` cannot change after configure"))),
        }
    }

    fn configure(&mut self) -> Result<Info, ComponentError> {
        self.config.validate()?;
        let mut model = self.config.size;
        if let Some(path) = &self.config.stream_table {
            let table = StreamTable::load(path).map_err(EvbError::Config)?;
            model = table.model_for(self.config.source_id).ok_or_else(|| {
                EvbError::Config(format!(
                    "source {}: not in the stream table {}",
                    self.config.source_id,
                    path.display()
                ))
            })?;
        }
        model.validate().map_err(EvbError::Config)?;
        if !(self.config.rate_hz >= 0.0 && self.config.rate_hz.is_finite()) {
            return Err(
                EvbError::Config(format!("source: rate_hz {} must be 0 or positive", self.config.rate_hz)).into()
            );
        }
        self.model = Some(model);
        let mut info = Info::new();
        info.insert("mean_bytes".into(), serde_json::json!(model.mean()));
        Ok(info)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let Some(model) = self.model else { return Err(ComponentError::out_of_order(Verb::Start, "not configured")) };
        let role = match self.config.role {
            SourceRole::Data => Role::Source,
            SourceRole::Trigger => Role::Trigger,
        };
        let hello = Message::Hello {
            role,
            id: self.config.source_id,
            run,
            name: self.name.clone(),
            addr: String::new(),
            generation: 0,
        };
        let conn = connect(
            &self.config.ru,
            &source_options(self.config.payload),
            Duration::from_millis(self.config.connect_timeout_ms),
            &hello,
        )?;
        self.shared = Arc::default();
        self.shared.rate_bits.store(self.config.rate_hz.to_bits(), Ordering::Relaxed);
        self.run = run;
        let (config, shared) = (self.config.clone(), self.shared.clone());
        let name = self.name.clone();
        self.thread = Some(
            std::thread::Builder::new()
                .name(format!("{name}-send"))
                .spawn(move || produce(name, config, model, run, conn, shared))
                .map_err(|e| EvbError::io("starting the source thread", e))?,
        );
        let now = Instant::now();
        self.started = Some(now);
        self.ended = None;
        *self.rates.lock().unwrap_or_else(|p| p.into_inner()) = Rates::new(now);
        Ok(())
    }

    fn stop(&mut self, last_event: Option<u64>) -> Result<Stats, ComponentError> {
        if self.thread.is_none() {
            return Err(ComponentError::out_of_order(Verb::Stop, "no run is taken"));
        }
        let sent = self.shared.sent.load(Ordering::SeqCst);
        let patience = Duration::from_millis(self.config.stop_timeout_ms);
        Ok(self.end_thread(last_event.unwrap_or(sent), patience).unwrap_or_default())
    }

    fn pause(&mut self) -> Result<(), ComponentError> {
        self.set_paused(Verb::Pause, true)
    }

    fn resume(&mut self) -> Result<(), ComponentError> {
        self.set_paused(Verb::Resume, false)
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.shared.abandon.store(true, Ordering::SeqCst);
        self.end_thread(0, Duration::from_secs(1));
        self.model = None;
        Ok(())
    }

    fn stats(&self) -> Stats {
        let sent = self.shared.sent.load(Ordering::Relaxed);
        let bytes = self.shared.bytes.load(Ordering::Relaxed);
        let [events_per_s, bytes_per_s] =
            self.rates.lock().unwrap_or_else(|p| p.into_inner()).sample(Instant::now(), [sent, bytes]);
        Stats::counted(sent, bytes)
            .with_rates(events_per_s, bytes_per_s / 1e6)
            .with_detail(&self.detail(sent, self.failure()))
    }

    fn failure(&self) -> Option<String> {
        read(&self.shared.failure)
    }
}

impl Source {
    /// Holds the stream back (`pause`) or lets it go on.
    fn set_paused(&mut self, command: Verb, paused: bool) -> Result<(), ComponentError> {
        if self.thread.is_none() {
            return Err(ComponentError::out_of_order(command, "no run is taken"));
        }
        self.shared.paused.store(paused, Ordering::SeqCst);
        Ok(())
    }

    /// Tells the sending thread to end after event `stop_at` and joins it; a thread still blocked
    /// after `patience` (its RU no longer reads) has its socket shut down. The run's summary.
    fn end_thread(&mut self, stop_at: u64, patience: Duration) -> Option<Stats> {
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
        let joined = thread.join();
        self.ended = Some(Instant::now());
        Some(joined.unwrap_or_else(|_| {
            let sent = self.shared.sent.load(Ordering::SeqCst);
            let why = "the source thread panicked".to_owned();
            set(&self.shared.failure, Some(why.clone()));
            Stats::counted(sent, self.shared.bytes.load(Ordering::SeqCst)).with_detail(&self.detail(sent, Some(why)))
        }))
    }
}

/// The options of a source's data connection. A cached payload is written from its one buffer
/// from [`GATHER_FROM`](crate::link::GATHER_FROM) bytes up, as the RU sends: copying it into the
/// send chunk first was a third of a source's time at 1 KiB (docs/performance.md, "Sources that
/// do not copy"), where a slice of its own costs the kernel one more element of the vectored
/// write.
fn source_options(payload: Payload) -> daqflow_transport::ConnectionOptions {
    match payload {
        Payload::Cached => daqflow_transport::ConnectionOptions {
            copy_threshold_bytes: crate::link::GATHER_FROM - 1,
            ..data_options()
        },
        Payload::Pattern | Payload::Adc => data_options(),
    }
}

fn produce(
    name: String,
    config: SourceConfig,
    model: SizeModel,
    run: u32,
    mut conn: Connection,
    shared: Arc<Shared>,
) -> Stats {
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
    let mut rate = f64::from_bits(shared.rate_bits.load(Ordering::Relaxed));
    loop {
        let now_rate = f64::from_bits(shared.rate_bits.load(Ordering::Relaxed));
        if now_rate != rate {
            // A new pace (a live `rate_hz`) counts from now.
            rate = now_rate;
            paced_from = None;
        }
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
        if rate > 0.0 {
            let (t0, id0) = *paced_from.get_or_insert((Instant::now(), id));
            let due = t0 + Duration::from_secs_f64((id - id0) as f64 / rate);
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
        if id % 64 == 1 || rate > 0.0 {
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
                // The header is copied into the send chunk; the payload is written from the
                // cached buffer (a slice of the same memory, no copy) unless it is smaller than
                // the connection's copy threshold ([`source_options`]).
                conn.send_prefixed(KIND_FRAGMENT, 0, 0, &info.encode(), cached.slice(..size))
            }
            Payload::Pattern | Payload::Adc => {
                let padded = pad8(size);
                buf.reserve(FRAGMENT_HEADER_LEN + padded);
                buf.put_bytes(0, FRAGMENT_HEADER_LEN + padded);
                let payload = &mut buf[FRAGMENT_HEADER_LEN..FRAGMENT_HEADER_LEN + size];
                if config.payload == Payload::Adc {
                    adc::fill(payload, id, config.source_id, config.channels);
                } else {
                    fill_pattern(payload, id, config.source_id);
                }
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
    let seconds = started.elapsed().as_secs_f64();
    let bytes = shared.bytes.load(Ordering::Relaxed);
    let detail = SourceDetail { source_id: config.source_id, run, seconds, last_event: last, error };
    Stats::counted(last, bytes)
        .with_rates(per_second(last, seconds), per_second(bytes, seconds) / 1e6)
        .with_detail(&detail)
}
