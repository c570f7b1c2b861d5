//! Log records of a process, captured from `tracing` and published on the control plane as
//! the service `<name>/log`, from which the message logger (`msglogger`) stores them.
//!
//! [`layer`] is a `tracing_subscriber` layer that keeps the process's recent records (info
//! and above) with sequence numbers. The component run loop publishes them: each update of
//! `<name>/log` is a JSON array holding the records of the last 30 seconds (at most 200), so
//! that a message logger subscribing late still gets what was logged at start-up; it keeps
//! the highest `seq` it stored per process and skips the rest.
//!
//! ```
//! use tracing_subscriber::layer::SubscriberExt;
//! let subscriber = tracing_subscriber::registry().with(daqflow_component::log::layer());
//! tracing::subscriber::with_default(subscriber, || tracing::warn!(disk = "/data", "disk almost full"));
//! let recent = daqflow_component::log::recent(0);
//! assert!(recent.iter().any(|r| r.message.contains("disk almost full") && r.severity == daqflow_component::log::Severity::Warn));
//! ```

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

use serde::{Deserialize, Serialize};

/// Sets up a process's logging, as every daqflow process does: records at `DAQFLOW_LOG`'s
/// level (else `default_level`, e.g. `info`) on standard error (coloured on a terminal), and
/// records at info and above kept for the process's `NAME/log` service ([`layer`]), which the
/// message logger stores, whatever standard error shows. Does nothing if the process already
/// has a subscriber.
pub fn init(default_level: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("DAQFLOW_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        // A terminal that is gone (EIO) must not make a log record panic on its report.
        .log_internal_errors(false)
        .with_filter(filter);
    let capture = layer().with_filter(tracing_subscriber::filter::LevelFilter::INFO);
    let _ = tracing_subscriber::registry().with(fmt).with(capture).try_init();
}

/// How many records a process keeps.
const KEEP: usize = 200;
/// How long a record stays in the published window.
pub const WINDOW_MS: u64 = 30_000;

/// How severe a log record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Trace.
    Trace,
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error.
    Error,
}

impl Severity {
    /// Every severity, least severe first.
    pub const ALL: [Severity; 5] = [Severity::Trace, Severity::Debug, Severity::Info, Severity::Warn, Severity::Error];

    /// The name (`warn`, …).
    pub fn name(self) -> &'static str {
        match self {
            Severity::Trace => "trace",
            Severity::Debug => "debug",
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }

    /// The severity of a name (`warn`, `WARN`, `warning`, …).
    pub fn parse(s: &str) -> Option<Severity> {
        let s = s.trim().to_ascii_lowercase();
        let s = if s == "warning" { "warn".to_owned() } else { s };
        Severity::ALL.into_iter().find(|v| v.name() == s)
    }

    /// Its rank: 0 (trace) … 4 (error).
    pub fn rank(self) -> u8 {
        self as u8
    }
}

/// One log record of a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Sequence number within the process, from 1.
    pub seq: u64,
    /// When (Unix ms).
    pub t_ms: u64,
    /// How severe.
    pub severity: Severity,
    /// The process (component name; filled in by the publisher).
    #[serde(default)]
    pub process: String,
    /// The module that logged it.
    pub target: String,
    /// The message with its fields (`message key=value …`).
    pub message: String,
}

struct Buffer {
    next_seq: u64,
    records: VecDeque<LogRecord>,
}

static BUFFER: Mutex<Buffer> = Mutex::new(Buffer { next_seq: 1, records: VecDeque::new() });

thread_local! {
    static MUTED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` without capturing what it logs on this thread (the publisher uses it so that
/// publishing cannot feed itself).
pub fn muted<T>(f: impl FnOnce() -> T) -> T {
    MUTED.with(|m| m.set(true));
    let r = f();
    MUTED.with(|m| m.set(false));
    r
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The severity of a level.
pub fn severity(level: &Level) -> Severity {
    match *level {
        Level::ERROR => Severity::Error,
        Level::WARN => Severity::Warn,
        Level::INFO => Severity::Info,
        Level::DEBUG => Severity::Debug,
        Level::TRACE => Severity::Trace,
    }
}

/// Records one log record (what the layer does; also usable by code that has a record from
/// elsewhere).
pub fn push(severity: Severity, target: &str, message: String) {
    let mut b = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
    let seq = b.next_seq;
    b.next_seq += 1;
    b.records.push_back(LogRecord {
        seq,
        t_ms: now_ms(),
        severity,
        process: String::new(),
        target: target.to_owned(),
        message,
    });
    while b.records.len() > KEEP {
        b.records.pop_front();
    }
}

/// The kept records with `seq > after`, oldest first.
pub fn recent(after: u64) -> Vec<LogRecord> {
    let b = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
    b.records.iter().filter(|r| r.seq > after).cloned().collect()
}

/// The highest sequence number given so far (0 before the first record).
pub fn last_seq() -> u64 {
    BUFFER.lock().unwrap_or_else(|p| p.into_inner()).next_seq - 1
}

/// The records of the published window: the last [`WINDOW_MS`], named after `process`.
pub fn window(process: &str) -> Vec<LogRecord> {
    let since = now_ms().saturating_sub(WINDOW_MS);
    let b = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
    b.records
        .iter()
        .filter(|r| r.t_ms >= since)
        .map(|r| LogRecord { process: process.to_owned(), ..r.clone() })
        .collect()
}

/// The capturing layer: records events at info and above.
pub struct CaptureLayer;

/// The layer to add to the process's subscriber.
pub fn layer() -> CaptureLayer {
    CaptureLayer
}

struct MessageVisitor(String, String);

impl Visit for MessageVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.1, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.1, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for CaptureLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > Level::INFO || MUTED.with(Cell::get) {
            return;
        }
        let mut v = MessageVisitor(String::new(), String::new());
        event.record(&mut v);
        push(severity(meta.level()), meta.target(), format!("{}{}", v.0, v.1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn info_and_above_are_kept_with_their_fields_debug_is_not() {
        let before = last_seq();
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(run = 7, "run started");
            tracing::debug!("noise");
            muted(|| tracing::error!("not captured"));
        });
        let got = recent(before);
        assert!(got.iter().any(|r| r.message == "run started run=7" && r.severity == Severity::Info), "{got:?}");
        assert!(!got.iter().any(|r| r.message.contains("noise") || r.message.contains("not captured")));
        assert!(window("x").iter().all(|r| r.process == "x"));
    }
}
