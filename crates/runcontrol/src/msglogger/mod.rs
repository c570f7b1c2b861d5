//! `msglogger`: the message logger. It follows every process on the control plane and stores
//! the log records each one publishes in `<name>/log` (`daqflow_component::log`) in the run database's
//! `logs` table, where the web UI's message browser (and `sqlite3`) find them.
//!
//! It works from `configure` to `reset`, whether a run is on or not: it lists the processes
//! every `poll_ms`, subscribes to each new `…/log` service, and keeps the highest record
//! number stored per process, so that the overlapping windows the processes publish are stored
//! once, and a restarted message logger goes on where it stopped.
//!
//! The database is SQLite or PostgreSQL (`crate::db`). When it refuses a write (a PostgreSQL
//! server restarting, a connection that broke), the records are kept and written again every
//! second; the message logger fails only when the database has refused for
//! [`DATABASE_GRACE`].
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

use crate::db::{Location, RunDb};
use daqflow_component::log::LogRecord;
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

mod config;
pub use config::{MsgLoggerConfig, schema};

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
    Kind::new("msglogger", "stores every process's log records in the run database", Role::Other, factory)
        .stages(0, 7)
        .schema(config::schema())
}

/// The message logger's own figures, the `detail` of its [`Stats`]; its `events` are the log
/// records stored since configure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MsgLoggerDetail {
    /// Processes whose log it follows.
    pub processes: u64,
}

use daqflow_component::sync::{read, set};

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
    /// `{"database": LOCATION}` (a URL's password redacted).
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let location = Location::parse(&self.config.database)
            .map_err(|e| ComponentError::Config(format!("{}: `database` {e}", self.name)))?;
        let db = RunDb::connect(&location).map_err(|e| ComponentError::Failed(e.to_string()))?;
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
        info.insert("database".into(), location.to_string().into());
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

/// How long the database may refuse to store records before the message logger fails (the
/// records are kept meanwhile, and written again every second).
pub const DATABASE_GRACE: Duration = Duration::from_secs(30);

/// Records not yet stored, and since when the database refuses them.
struct Pending {
    records: Vec<LogRecord>,
    failing_since: Option<Instant>,
    next_try: Instant,
}

impl Pending {
    /// Stores what waits (unless the last refusal was less than a second ago); an error when
    /// the database has refused for longer than the grace.
    fn store(&mut self, db: &RunDb, counters: &Counters, grace: Duration) -> Result<(), String> {
        if self.records.is_empty() || Instant::now() < self.next_try {
            return Ok(());
        }
        match db.add_logs(&self.records) {
            Ok(()) => {
                if self.failing_since.take().is_some() {
                    tracing::info!("the run database stores log records again");
                }
                counters.records.fetch_add(self.records.len() as u64, Ordering::Relaxed);
                self.records.clear();
                Ok(())
            }
            Err(e) => {
                let since = *self.failing_since.get_or_insert_with(|| {
                    tracing::warn!("storing log records failed, trying again every second: {e}");
                    Instant::now()
                });
                if since.elapsed() >= grace {
                    return Err(format!(
                        "the run database refused log records for {} s ({} waiting): {e}",
                        since.elapsed().as_secs(),
                        self.records.len()
                    ));
                }
                self.next_try = Instant::now() + Duration::from_secs(1);
                Ok(())
            }
        }
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
    let mut pending = Pending { records: Vec::new(), failing_since: None, next_try: Instant::now() };
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
        let batch = &mut pending.records;
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
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        pending.store(db, counters, DATABASE_GRACE)?;
    }
    pending.next_try = Instant::now();
    pending.store(db, counters, Duration::ZERO)
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

    use crate::db::LogQuery;
    use daqflow_rundb::testing::{Backend, TestDb};

    fn records(process: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let r: Vec<LogRecord> = seqs
            .map(|seq| LogRecord {
                seq,
                t_ms: seq * 10,
                severity: daqflow_component::log::Severity::Info,
                process: process.into(),
                target: "t".into(),
                message: format!("record {seq}"),
            })
            .collect();
        serde_json::to_vec(&r).unwrap()
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A message logger on a real control plane, into either backend: every record stored once
    /// from overlapping windows, and a second message logger goes on where the first stopped.
    fn every_record_is_stored_once_and_a_new_logger_resumes(backend: Backend) {
        let Some(t) = TestDb::new(backend, "msglogger") else { return };
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let config =
            daqflow_dialog::ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), token: None, ..Default::default() };
        let server = rt.block_on(daqflow_dialog::ControlServer::start(config)).unwrap();
        let control = server.local_addr().to_string();
        let producer = daqflow_dialog::Dialog::connect(&control, "producer").unwrap();
        let log = producer.provide("producer/log").unwrap();
        log.update(&records("producer", 1..=3)).unwrap();
        let text = format!("control = '{control}'\ndatabase = '{}'\npoll_ms = 50", t.location().to_config_value());
        let mut m = MsgLogger::new("msglogger", toml::from_str(&text).unwrap());
        let info = m.configure().unwrap();
        assert_eq!(info["database"], t.location().to_string(), "a URL's password is not in the answer");
        let db = t.open();
        let stored = |n: usize| db.logs(&LogQuery { limit: Some(100), ..Default::default() }).unwrap().len() == n;
        wait_for("3 records", || stored(3));
        log.update(&records("producer", 2..=5)).unwrap();
        wait_for("5 records", || stored(5));
        assert_eq!(m.stats().events, 5);
        m.reset().unwrap();
        assert_eq!(m.failure(), None);
        let mut again = MsgLogger::new("msglogger", toml::from_str(&text).unwrap());
        again.configure().unwrap();
        log.update(&records("producer", 4..=6)).unwrap();
        wait_for("6 records", || stored(6));
        std::thread::sleep(Duration::from_millis(300));
        let seqs: Vec<u64> = db.logs(&LogQuery::default()).unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![6, 5, 4, 3, 2, 1]);
        assert_eq!(again.stats().events, 1);
        again.reset().unwrap();
        producer.shutdown();
    }

    daqflow_rundb::for_each_backend!(every_record_is_stored_once_and_a_new_logger_resumes);

    #[test]
    fn records_wait_while_the_database_is_down_and_are_stored_when_it_is_back() {
        let Some(server) = daqflow_rundb::testing::private() else { return };
        let db = server.open_new_database("msglogger_down");
        let counters = Counters::default();
        let decoded = |seqs| decode_records(&records("p", seqs)).unwrap();
        let mut pending = Pending { records: decoded(1..=2), failing_since: None, next_try: Instant::now() };
        server.stop().unwrap();
        pending.store(&db, &counters, DATABASE_GRACE).unwrap();
        assert_eq!((pending.records.len(), counters.records.load(Ordering::Relaxed)), (2, 0), "kept");
        assert!(pending.failing_since.is_some());
        pending.records.extend(decoded(3..=3));
        pending.next_try = Instant::now();
        let e = pending.store(&db, &counters, Duration::ZERO).unwrap_err();
        assert!(e.contains("3 waiting") && e.contains("***") && !e.contains(server.password()), "{e}");
        server.start_again().unwrap();
        pending.next_try = Instant::now();
        pending.store(&db, &counters, DATABASE_GRACE).unwrap();
        assert_eq!((pending.records.len(), counters.records.load(Ordering::Relaxed)), (0, 3));
        assert_eq!(pending.failing_since, None);
        assert_eq!(db.log_positions().unwrap(), vec![("p".to_owned(), 3)]);
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
