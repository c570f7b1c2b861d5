//! `msglogger`: the message logger. It follows every process on the control plane and stores
//! the log records each one publishes in `<name>/log` (`crate::log`) in the run database's
//! `logs` table, where the web UI's message browser (and `sqlite3`) find them.
//!
//! It works from `configure` to `reset`, whether a run is on or not: it lists the processes
//! every `poll_ms`, subscribes to each new `…/log` service, and keeps the highest record
//! number stored per process, so that the overlapping windows the processes publish are stored
//! once, and a restarted message logger goes on where it stopped.
//!
//! Its statistics count the records stored since configure as its `events` (`bytes` stay 0:
//! records are not sized), with the processes followed in its [`MsgLoggerDetail`].
//!
//! ```
//! let kind = daqflow_runcontrol::msglogger::kind();
//! assert_eq!((kind.name, kind.start_stage, kind.stop_stage), ("msglogger", 0, 7)); // first up, last down
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::db::RunDb;
use crate::log::LogRecord;
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

mod config;
pub use config::MsgLoggerConfig;

/// Builds a `msglogger` component named `name` from its configuration table (the registry's
/// entry for the kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: MsgLoggerConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(MsgLogger::new(name, c)))
}

/// The `msglogger` kind: outside the event accounting; it starts first and stops last, so that
/// it stores the records of every other component's transitions.
pub fn kind() -> Kind {
    Kind::new("msglogger", "stores every process's log records in the run database", Role::Other, factory).stages(0, 7)
}

/// The message logger's own figures, the `detail` of its [`Stats`]; its `events` are the log
/// records stored since configure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MsgLoggerDetail {
    /// Processes whose log it follows.
    pub processes: u64,
}

/// A copy of what a mutex holds, even if a thread panicked while holding it.
fn read<T: Clone>(m: &Mutex<T>) -> T {
    m.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Sets what a mutex holds.
fn set<T>(m: &Mutex<T>, v: T) {
    *m.lock().unwrap_or_else(|p| p.into_inner()) = v;
}

#[derive(Default)]
struct Counters {
    records: AtomicU64,
    processes: AtomicU64,
}

/// The rates of live statistics: over the interval since the previous call, at least 0.2 s
/// long (a call sooner gets the previous rate).
struct Recent(Mutex<(Instant, u64, f64)>);

impl Recent {
    fn new(records: u64) -> Recent {
        Recent(Mutex::new((Instant::now(), records, 0.0)))
    }

    /// Records per second, given the count now.
    fn rate(&self, records: u64) -> f64 {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let dt = r.0.elapsed().as_secs_f64();
        if dt >= 0.2 {
            *r = (Instant::now(), records, records.saturating_sub(r.1) as f64 / dt);
        }
        r.2
    }
}

/// The message logger component.
pub struct MsgLogger {
    name: String,
    config: MsgLoggerConfig,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    worker: Option<JoinHandle<()>>,
    /// Records stored when the run started, and when.
    run_start: (u64, Instant),
    recent: Recent,
}

impl MsgLogger {
    /// A message logger; nothing is opened before configure.
    pub fn new(name: &str, config: MsgLoggerConfig) -> MsgLogger {
        MsgLogger {
            name: name.to_owned(),
            config,
            counters: Arc::default(),
            stop: Arc::default(),
            failure: Arc::default(),
            worker: None,
            run_start: (0, Instant::now()),
            recent: Recent::new(0),
        }
    }

    /// The counters: live (the rate over the last interval) or as the summary of a run (the
    /// mean rate over the run).
    fn report(&self, summary: bool) -> Stats {
        let records = self.counters.records.load(Ordering::Relaxed);
        let per_s = if summary {
            let seconds = self.run_start.1.elapsed().as_secs_f64();
            let in_run = records.saturating_sub(self.run_start.0);
            if seconds > 0.0 { in_run as f64 / seconds } else { 0.0 }
        } else {
            self.recent.rate(records)
        };
        Stats::counted(records, 0)
            .with_rates(per_s, 0.0)
            .with_detail(&MsgLoggerDetail { processes: self.counters.processes.load(Ordering::Relaxed) })
    }

    fn end_worker(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Decodes one `<name>/log` value: a JSON array of records (or a single record).
pub fn decode_records(data: &[u8]) -> Result<Vec<LogRecord>, String> {
    match serde_json::from_slice::<Value>(data).map_err(|e| e.to_string())? {
        Value::Array(a) => a.into_iter().map(|v| serde_json::from_value(v).map_err(|e| e.to_string())).collect(),
        v @ Value::Object(_) => Ok(vec![serde_json::from_value(v).map_err(|e| e.to_string())?]),
        _ => Err("expected a JSON array of log records".into()),
    }
}

impl Component for MsgLogger {
    /// Opens the database, joins the control plane and starts following; answers
    /// `{"database": PATH}`.
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let db = RunDb::open(&self.config.database).map_err(|e| ComponentError::Failed(e.to_string()))?;
        let dialog =
            daqflow_dialog::Dialog::connect(&self.config.control, &format!("{}-reader", self.name)).map_err(|e| {
                ComponentError::Failed(format!("joining the control plane at {}: {e}", self.config.control))
            })?;
        self.counters = Arc::default();
        self.stop = Arc::default();
        set(&self.failure, None);
        self.run_start = (0, Instant::now());
        self.recent = Recent::new(0);
        let (counters, stop, failure) = (self.counters.clone(), self.stop.clone(), self.failure.clone());
        let poll = Duration::from_millis(self.config.poll_ms.max(50));
        self.worker = Some(std::thread::Builder::new().name("msglogger".into()).spawn(move || {
            if let Err(e) = follow(&dialog, &db, &counters, &stop, poll) {
                set(&failure, Some(e));
            }
            dialog.shutdown();
        })?);
        let mut info = Info::new();
        info.insert("database".into(), self.config.database.to_string_lossy().into_owned().into());
        Ok(info)
    }

    fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
        self.run_start = (self.counters.records.load(Ordering::Relaxed), Instant::now());
        Ok(())
    }

    /// The records stored since configure, the mean rate of those stored in the run.
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        Ok(self.report(true))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.end_worker();
        Ok(())
    }

    /// The records stored since configure, their rate over the last interval; a
    /// [`MsgLoggerDetail`].
    fn stats(&self) -> Stats {
        self.report(false)
    }

    fn failure(&self) -> Option<String> {
        read(&self.failure)
    }
}

impl Drop for MsgLogger {
    fn drop(&mut self) {
        self.end_worker();
    }
}

/// Subscribes to every process's log and stores the new records until `stop`.
fn follow(
    dialog: &daqflow_dialog::Dialog,
    db: &RunDb,
    counters: &Counters,
    stop: &AtomicBool,
    poll: Duration,
) -> Result<(), String> {
    let mut stored: HashMap<String, u64> = db.log_positions().map_err(|e| e.to_string())?.into_iter().collect();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut subscriptions = Vec::new();
    let mut followed: HashSet<String> = HashSet::new();
    let mut next_poll = std::time::Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if std::time::Instant::now() >= next_poll {
            next_poll = std::time::Instant::now() + poll;
            if let Ok(processes) = dialog.processes(Duration::from_secs(2)) {
                for p in processes {
                    for service in p.provides.iter().filter(|s| s.ends_with("/log")) {
                        if followed.insert(service.clone()) {
                            let tx = tx.clone();
                            let sub = dialog
                                .subscribe(service, move |event| {
                                    if let daqflow_dialog::ServiceEvent::Update { data, .. } = event {
                                        let _ = tx.send(data.to_vec());
                                    }
                                })
                                .map_err(|e| format!("subscribing to {service}: {e}"))?;
                            subscriptions.push(sub);
                            counters.processes.store(followed.len() as u64, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        let mut batch = Vec::new();
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(data) => {
                let mut values = vec![data];
                values.extend(rx.try_iter());
                for data in values {
                    match decode_records(&data) {
                        Ok(records) => {
                            for r in records {
                                let last = stored.entry(r.process.clone()).or_insert(0);
                                if r.seq > *last {
                                    *last = r.seq;
                                    batch.push(r);
                                }
                            }
                        }
                        Err(e) => tracing::warn!("a log value that is not log records was skipped: {e}"),
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
        if !batch.is_empty() {
            db.add_logs(&batch).map_err(|e| e.to_string())?;
            counters.records.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_values_decode_or_fail_cleanly() {
        let r = decode_records(br#"[{"seq":1,"t_ms":5,"severity":"info","process":"a","target":"t","message":"m"}]"#)
            .unwrap();
        assert_eq!(r[0].process, "a");
        assert!(decode_records(b"\x00garbage").is_err());
        assert!(decode_records(b"42").is_err());
        assert!(decode_records(br#"[{"seq":"x"}]"#).is_err());
    }

    #[test]
    fn records_are_its_events_and_the_summary_rate_is_that_of_the_run() {
        let config: MsgLoggerConfig = toml::from_str("control = '127.0.0.1:1'\ndatabase = 'runs.sqlite'").unwrap();
        let mut m = MsgLogger::new("msglogger", config);
        m.counters.records.store(5, Ordering::Relaxed);
        m.counters.processes.store(3, Ordering::Relaxed);
        m.start(1).unwrap();
        m.counters.records.store(8, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(10));
        let summary = m.stop(None).unwrap();
        assert_eq!((summary.events, summary.bytes), (8, 0), "{summary:?}");
        let seconds = m.run_start.1.elapsed().as_secs_f64();
        assert!(summary.events_per_s > 0.0 && summary.events_per_s <= 3.0 / 0.01, "{summary:?} over {seconds} s");
        assert_eq!(summary.detail_as(), Some(MsgLoggerDetail { processes: 3 }));
        assert_eq!(m.stats().detail, summary.detail);
    }
}
