//! The logger: DAQ-Middleware's "logger", which writes the data it receives into files.
//! `configure` binds `listen`; at `start` it opens a data file writer for the run and accepts
//! its upstream; each chunk becomes one record of a daqflow data file (`docs/file-format.md`),
//! its event id the chunk's sequence number, its payload the chunk's data: the files read back
//! with `daqflow file` like a recorder's. Files are named
//! `run<RUN>_<NAME>_<SEQ>.daq` in `directory` and rotate at `max_file_bytes`. Every chunk is
//! checked as the sink checks it (sequence numbers, the markers, the run, CRCs with
//! `check = true`); the end marker ends the run, and the last file is closed before `stop`
//! returns. A file that cannot be written fails the logger with the path and the reason.
//!
//! A logger is fed by a blocking output: it takes its time and loses nothing, the upstream
//! waits for it.
//!
//! ```no_run
//! use daqflow_chain::logger::{Logger, LoggerConfig, LoggerDetail};
//! use daqflow_component::Component;
//! let mut l = Logger::new("log", LoggerConfig { directory: "/data/run".into(), ..Default::default() });
//! let listen = l.configure()?["listen"].as_str().unwrap().to_owned(); // the upstream connects here
//! l.start(1)?;
//! // … the chain runs, the generator stops …
//! let detail: LoggerDetail = l.stop(None)?.detail_as().unwrap();
//! assert_eq!((detail.missing, detail.sequence_errors), (0, 0));
//! println!("{:?}", detail.files); // each file's path, chunks, bytes
//! # let _ = listen;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daqflow_transport::Listener;
use daqflow_wire::EventId;
use daqflow_wire::file::{FileWriter, FileWriterConfig};
use serde::{Deserialize, Serialize};

pub use self::config::{LoggerConfig, schema};
use super::link::{Live, Work, Worker, bind, read, worker_component};
use daqflow_component::sync::set;
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The logger component (its hooks are the chain's one worker's: the thread, the stop, the
/// report).
pub struct Logger(Worker<Logging>);

/// A file the logger closed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoggedFile {
    /// Its path.
    pub path: PathBuf,
    /// Chunks (records) in it.
    pub events: u64,
    /// Their data bytes.
    pub bytes: u64,
}

/// The logger's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// received (each written), its `bytes` their data bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoggerDetail {
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
    /// Chunks whose data did not match their CRC32C (with `check = true`; written all the same).
    pub crc_errors: u64,
    /// Chunks the end marker announced, once it came.
    pub chunks_announced: Option<u64>,
    /// Chunks announced by the end marker that did not arrive.
    pub missing: u64,
    /// Whether the end marker came.
    pub end_seen: bool,
    /// The files closed in this run (in the summary; live, those closed so far).
    pub files: Vec<LoggedFile>,
    /// Why the run failed or ended without the end marker, if it did.
    pub error: Option<String>,
}

/// Builds a logger named `name` from its configuration table (the registry's entry for the
/// `logger` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: LoggerConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Logger::new(name, c)))
}

/// Where a logger configured with `config` writes its files: its `directory`.
fn data_directory(config: &toml::Table) -> Option<PathBuf> {
    config.get("directory").and_then(|d| d.as_str()).map(PathBuf::from)
}

/// The `logger` kind: outside the event accounting (its `events` are chunks); it starts
/// before the chain's senders and stops after them, with the sink.
pub fn kind() -> Kind {
    Kind::new("logger", "the chain's end that writes every chunk into data files", Role::Other, factory)
        .stages(2, 5)
        .data_files(data_directory)
        .schema(config::schema())
}

impl Logger {
    /// A logger named `name`.
    pub fn new(name: &str, config: LoggerConfig) -> Logger {
        Logger(Worker::new(name, Logging { config, listener: None, files: Arc::new(Mutex::new(Vec::new())) }))
    }
}

/// What a logger does; [`Worker`] runs it.
struct Logging {
    config: LoggerConfig,
    listener: Option<Arc<Listener>>,
    files: Arc<Mutex<Vec<LoggedFile>>>,
}

impl Work for Logging {
    const THREAD: &'static str = "log";

    /// Binds `listen`; answers `{"listen": ADDR}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let (listener, answer) =
            bind(name, &self.config.listen, self.config.advertise.as_deref(), self.config.tuning())?;
        self.listener = Some(listener);
        Ok(answer)
    }

    /// Opens the run's file writer (an error names the directory) and accepts the upstream.
    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let listener = self.listener.clone().ok_or_else(|| ComponentError::Failed("not configured".into()))?;
        let mut fw = FileWriterConfig::new(&self.config.directory, run);
        fw.stream = Some(name.to_owned());
        fw.max_file_bytes = self.config.max_file_bytes;
        fw.sync_on_close = self.config.sync_on_close;
        let mut writer = FileWriter::new(fw).map_err(|e| ComponentError::Failed(format!("{name}: {e}")))?;
        self.files = Arc::new(Mutex::new(Vec::new()));
        let (name, live, files, check_crc) = (name.to_owned(), live.clone(), self.files.clone(), self.config.check);
        Ok(Box::new(move || {
            let ended =
                crate::receiver::receive_chunks(&name, run, check_crc, None, &listener, &live, |header, data| {
                    writer
                        .write_event(EventId(header.sequence), &data)
                        .map_err(|e| format!("writing chunk {}: {e}", header.sequence))
                });
            match writer.finish() {
                Ok(closed) => set(
                    &files,
                    closed
                        .into_iter()
                        .map(|f| LoggedFile { path: f.path, events: f.events, bytes: f.payload_bytes })
                        .collect(),
                ),
                Err(e) if ended => live.fail(&name, format!("closing the last file: {e}")),
                Err(e) => tracing::warn!(component = %name, "closing the last file: {e}"),
            }
        }))
    }

    /// How long `stop` waits for the end marker and the last file to be closed.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// Chunks written, their bytes; a [`LoggerDetail`] with the files.
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        let received = stats.events;
        let end = read(&live.end);
        stats.with_detail(&LoggerDetail {
            listen: self.listener.as_ref().map(|l| l.local_addr().to_string()),
            upstream: read(&live.upstream),
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            sequence_errors: live.sequence_errors.load(Ordering::Relaxed),
            crc_errors: live.crc_errors.load(Ordering::Relaxed),
            chunks_announced: end.map(|(last, _)| last),
            missing: end.map_or(0, |(last, _)| last.saturating_sub(received)),
            end_seen: end.is_some(),
            files: read(&self.files),
            error: live.failure(),
        })
    }

    fn release(&mut self) {
        self.listener = None;
    }
}

worker_component!(Logger);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{Generator, GeneratorConfig};
    use daqflow_wire::file::FileReader;

    #[test]
    fn every_chunk_becomes_a_record_of_the_run_s_files() {
        let dir = std::env::temp_dir().join(format!("daqflow-logger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = LoggerConfig {
            directory: dir.clone(),
            max_file_bytes: 100_000,
            sync_on_close: false,
            ..Default::default()
        };
        let mut l = Logger::new("log", config);
        let listen = l.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        l.start(4).unwrap();
        let mut g = Generator::new(
            "gen",
            GeneratorConfig { downstream: listen, chunk_bytes: 1000, rate_hz: 1000.0, ..Default::default() },
        );
        g.configure().unwrap();
        g.start(4).unwrap();
        g.stop(Some(300)).unwrap();
        let summary = l.stop(None).unwrap();
        let d: LoggerDetail = summary.detail_as().unwrap();
        assert!(d.end_seen && d.error.is_none(), "{d:?}");
        assert_eq!((summary.events, d.missing, d.sequence_errors, d.crc_errors), (300, 0, 0, 0), "{d:?}");
        assert!(d.files.len() >= 3, "rotated at 100 kB: {d:?}");
        let mut ids = Vec::new();
        for f in &d.files {
            assert!(f.path.file_name().unwrap().to_str().unwrap().starts_with("run000004_log_"), "{f:?}");
            let mut r = FileReader::open(&f.path).unwrap();
            for i in 0..r.len().unwrap() {
                let rec = r.read_record(i).unwrap();
                assert_eq!(rec.payload.len(), 1000);
                ids.push(rec.event_id.0);
            }
        }
        assert_eq!(ids, (1..=300).collect::<Vec<u64>>());
        assert_eq!(d.files.iter().map(|f| f.events).sum::<u64>(), 300);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
