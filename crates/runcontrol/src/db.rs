//! The run database: run numbers, run records and the message log, in one SQLite file.
//!
//! Tables (the schema is created on open and documented in `docs/operator-guide.md`):
//! - `runs`: one row per run: number, system, start and stop time (Unix ms), state
//!   (`running`, `stopped`, `failed`, `abandoned`), the configuration snapshot (the system file),
//!   totals (events built, recorded, lost, bytes), the error if any and the whole summary;
//! - `run_components`: each component's counters at the end of a run;
//! - `run_files`: the files written in a run;
//! - `logs`: every log record the message logger received.
//!
//! The operator and the message logger open the same file from two processes; SQLite's
//! write-ahead log and a busy timeout make that safe.
//!
//! ```
//! use daqflow_runcontrol::db::RunDb;
//! let dir = tempfile::tempdir().unwrap();
//! let db = RunDb::open(&dir.path().join("runs.sqlite")).unwrap();
//! let run = db.begin_run("demo", "# system file", None).unwrap();
//! assert_eq!(run, 1);
//! let summary = daqflow_runcontrol::db::example_summary(run, 10);
//! db.end_run(&summary).unwrap();
//! assert_eq!(db.runs(10).unwrap()[0].events, Some(10));
//! ```

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use daqflow_component::Stats;
use daqflow_component::api::{RunDetail, RunRecord, RunState, RunSummary};
use rusqlite::{Connection, OptionalExtension, params};

use crate::log::{LogRecord, Severity, now_ms};

/// Why the run database failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite refused an operation.
    #[error("run database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The run is not open (never begun, or closed already): its record is left as it is.
    #[error("run {0} is not open in the run database; its record is left as it is")]
    Closed(u32),
    /// The database directory could not be created.
    #[error("run database directory {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

pub use daqflow_component::api::LogQuery;

/// The run database.
pub struct RunDb {
    path: PathBuf,
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS runs (
    run INTEGER PRIMARY KEY,
    system TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    stopped_ms INTEGER,
    state TEXT NOT NULL,
    config TEXT NOT NULL,
    events INTEGER,
    recorded INTEGER,
    lost INTEGER,
    bytes INTEGER,
    error TEXT,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS run_components (
    run INTEGER NOT NULL,
    component TEXT NOT NULL,
    kind TEXT NOT NULL,
    counters TEXT NOT NULL,
    PRIMARY KEY (run, component)
);
CREATE TABLE IF NOT EXISTS run_files (
    run INTEGER NOT NULL,
    component TEXT NOT NULL,
    path TEXT NOT NULL,
    events INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    id INTEGER PRIMARY KEY,
    t_ms INTEGER NOT NULL,
    process TEXT NOT NULL,
    severity TEXT NOT NULL,
    rank INTEGER NOT NULL,
    target TEXT NOT NULL,
    message TEXT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_t ON logs (t_ms);
CREATE INDEX IF NOT EXISTS logs_process ON logs (process, t_ms);
";

impl RunDb {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<RunDb, DbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| DbError::Io { path: dir.to_owned(), source })?;
        }
        let err = |source| DbError::Sqlite { path: path.to_owned(), source };
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(RunDb { path: path.to_owned(), conn: Mutex::new(conn) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, DbError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c).map_err(|source| DbError::Sqlite { path: self.path.clone(), source })
    }

    /// Opens a run record and returns its number: `run` if given (it must not exist), else one
    /// more than the highest so far.
    pub fn begin_run(&self, system: &str, config: &str, run: Option<u32>) -> Result<u32, DbError> {
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = match run {
                Some(n) => n,
                None => {
                    let max: Option<u32> = tx.query_row("SELECT MAX(run) FROM runs", [], |r| r.get(0))?;
                    max.unwrap_or(0) + 1
                }
            };
            tx.execute(
                "INSERT INTO runs (run, system, started_ms, state, config) VALUES (?1, ?2, ?3, 'running', ?4)",
                params![n, system, now_ms() as i64, config],
            )?;
            tx.commit()?;
            Ok(n)
        })
    }

    /// Closes a run record with its summary: state, error, totals, every component's counters
    /// (`run_components`) and the files (`run_files`). A record is closed once: a run that is
    /// not `running` any more is left as it is ([`DbError::Closed`]).
    pub fn end_run(&self, summary: &RunSummary) -> Result<(), DbError> {
        let run = summary.run;
        let text = serde_json::to_string(summary).unwrap_or_default();
        let updated = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let updated = tx.execute(
                "UPDATE runs SET stopped_ms = ?2, state = ?3, events = ?4, recorded = ?5, lost = ?6, bytes = ?7,
                 error = ?8, summary = ?9 WHERE run = ?1 AND state = 'running'",
                params![
                    run,
                    summary.stopped_ms as i64,
                    summary.state.name(),
                    summary.events as i64,
                    summary.recorded as i64,
                    summary.lost as i64,
                    summary.bytes as i64,
                    summary.error,
                    text
                ],
            )?;
            if updated == 0 {
                return Ok(false);
            }
            for (name, c) in &summary.components {
                let counters =
                    serde_json::to_string(c.summary.as_ref().or(c.last_stats.as_ref()).unwrap_or(&Stats::default()))
                        .unwrap_or_default();
                tx.execute(
                    "INSERT OR REPLACE INTO run_components (run, component, kind, counters) VALUES (?1, ?2, ?3, ?4)",
                    params![run, name, c.kind, counters],
                )?;
            }
            for f in &summary.files {
                tx.execute(
                    "INSERT INTO run_files (run, component, path, events, bytes) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![run, f.component, f.path.to_string_lossy(), f.events as i64, f.bytes as i64],
                )?;
            }
            tx.commit()?;
            Ok(true)
        })?;
        if updated { Ok(()) } else { Err(DbError::Closed(run)) }
    }

    /// Runs left `running` by an operator that died are marked `abandoned`; returns how many.
    pub fn abandon_open_runs(&self) -> Result<usize, DbError> {
        self.with(|c| c.execute("UPDATE runs SET state = 'abandoned' WHERE state = 'running'", []))
    }

    /// The run history, newest first (without the configuration and summary).
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, DbError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT run, system, started_ms, stopped_ms, state, events, recorded, lost, bytes, error
                 FROM runs ORDER BY run DESC LIMIT ?1",
            )?;
            let rows = st.query_map(params![limit as i64], run_row)?;
            rows.collect()
        })
    }

    /// One run's whole record: the row, its configuration snapshot and its summary (none for a
    /// run abandoned, or one recorded by a version whose summary this one cannot read).
    pub fn run(&self, run: u32) -> Result<Option<RunDetail>, DbError> {
        self.with(|c| {
            c.query_row(
                "SELECT run, system, started_ms, stopped_ms, state, events, recorded, lost, bytes, error, config, summary
                 FROM runs WHERE run = ?1",
                params![run],
                |r| {
                    Ok(RunDetail {
                        record: run_row(r)?,
                        config: r.get(10)?,
                        summary: r.get::<_, Option<String>>(11)?.and_then(|s| serde_json::from_str(&s).ok()),
                    })
                },
            )
            .optional()
        })
    }

    /// Stores log records.
    pub fn add_logs(&self, records: &[LogRecord]) -> Result<(), DbError> {
        if records.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            {
                let mut st = tx.prepare_cached(
                    "INSERT INTO logs (t_ms, process, severity, rank, target, message, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for r in records {
                    st.execute(params![
                        r.t_ms as i64,
                        r.process,
                        r.severity.name(),
                        r.severity.rank(),
                        r.target,
                        r.message,
                        r.seq as i64
                    ])?;
                }
            }
            tx.commit()
        })
    }

    /// The highest sequence number stored per process (where a message logger resumes).
    pub fn log_positions(&self) -> Result<Vec<(String, u64)>, DbError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT process, MAX(seq) FROM logs GROUP BY process")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))?;
            rows.collect()
        })
    }

    /// Log records, newest first.
    pub fn logs(&self, q: &LogQuery) -> Result<Vec<LogRecord>, DbError> {
        let mut sql = String::from("SELECT seq, t_ms, severity, process, target, message FROM logs WHERE 1 = 1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(s) = q.since_ms {
            sql.push_str(" AND t_ms >= ?");
            args.push((s as i64).into());
        }
        if let Some(u) = q.until_ms {
            sql.push_str(" AND t_ms <= ?");
            args.push((u as i64).into());
        }
        if let Some(p) = q.process.as_ref().filter(|p| !p.is_empty()) {
            sql.push_str(" AND process = ?");
            args.push(p.clone().into());
        }
        if let Some(s) = q.min_severity {
            sql.push_str(" AND rank >= ?");
            args.push(i64::from(s.rank()).into());
        }
        if let Some(t) = q.text.as_ref().filter(|t| !t.is_empty()) {
            sql.push_str(" AND instr(lower(message), lower(?)) > 0");
            args.push(t.clone().into());
        }
        sql.push_str(" ORDER BY t_ms DESC, id DESC LIMIT ?");
        args.push((q.limit() as i64).into());
        self.with(|c| {
            let mut st = c.prepare(&sql)?;
            let rows = st.query_map(rusqlite::params_from_iter(args), |r| {
                Ok(LogRecord {
                    seq: r.get::<_, i64>(0)? as u64,
                    t_ms: r.get::<_, i64>(1)? as u64,
                    severity: Severity::parse(&r.get::<_, String>(2)?).unwrap_or(Severity::Info),
                    process: r.get(3)?,
                    target: r.get(4)?,
                    message: r.get(5)?,
                })
            })?;
            rows.collect()
        })
    }
}

/// The columns `run` … `error` of a `runs` row (in that order, the first ten selected).
fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let opt = |i: usize| -> rusqlite::Result<Option<u64>> { Ok(r.get::<_, Option<i64>>(i)?.map(|n| n.max(0) as u64)) };
    Ok(RunRecord {
        run: r.get(0)?,
        system: r.get(1)?,
        started_ms: r.get::<_, i64>(2)?.max(0) as u64,
        stopped_ms: opt(3)?,
        state: RunState::parse(&r.get::<_, String>(4)?).unwrap_or(RunState::Abandoned),
        events: opt(5)?,
        recorded: opt(6)?,
        lost: opt(7)?,
        bytes: opt(8)?,
        error: r.get(9)?,
    })
}

/// A summary of run `run` that built and recorded `events` events, for examples and tests.
pub fn example_summary(run: u32, events: u64) -> RunSummary {
    RunSummary {
        run,
        system: "demo".into(),
        state: RunState::Stopped,
        error: None,
        started_ms: 1,
        stopped_ms: 2,
        seconds: 0.001,
        triggered: Some(events),
        rejected: Some(0),
        events,
        recorded: events,
        bytes: events * 100,
        lost: 0,
        lost_reasons: Vec::new(),
        unknown: Vec::new(),
        accounting_complete: true,
        lost_in_builder: 0,
        not_recorded: 0,
        duplicates: 0,
        died: Vec::new(),
        files: Vec::new(),
        file_problems: Vec::new(),
        components: Default::default(),
        errors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_component::api::{ComponentRecord, FileRecord};

    fn rec(seq: u64, t_ms: u64, process: &str, severity: &str, message: &str) -> LogRecord {
        LogRecord {
            seq,
            t_ms,
            severity: Severity::parse(severity).unwrap(),
            process: process.into(),
            target: "t".into(),
            message: message.into(),
        }
    }

    #[test]
    fn runs_are_numbered_recorded_and_listed_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::open(&dir.path().join("db/runs.sqlite")).unwrap();
        assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 1);
        let mut summary = example_summary(1, 5);
        summary.components.insert(
            "rec".into(),
            ComponentRecord {
                kind: "recorder".into(),
                summary: Some(Stats::counted(5, 100)),
                last_stats: None,
                died: None,
                earlier_lives: 0,
            },
        );
        summary.files.push(FileRecord {
            component: "rec".into(),
            path: "/d/run000001_rec_0001.daq".into(),
            events: 5,
            bytes: 100,
            first_event: Some(1),
            last_event: Some(5),
            complete: true,
        });
        db.end_run(&summary).unwrap();
        let mut late = example_summary(1, 0);
        late.state = RunState::Failed;
        assert!(matches!(db.end_run(&late), Err(DbError::Closed(1))), "a closed record is never overwritten");
        assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 2);
        assert!(db.begin_run("s", "cfg", Some(2)).is_err(), "a run number is used once");
        assert_eq!(db.begin_run("s", "cfg", Some(10)).unwrap(), 10);
        assert_eq!(db.abandon_open_runs().unwrap(), 2);
        let runs = db.runs(10).unwrap();
        assert_eq!(runs.iter().map(|r| r.run).collect::<Vec<_>>(), vec![10, 2, 1]);
        assert_eq!(runs[1].state, RunState::Abandoned);
        let one = db.run(1).unwrap().unwrap();
        assert_eq!(one.config, "cfg");
        assert_eq!((one.record.state, one.record.events), (RunState::Stopped, Some(5)));
        assert_eq!(one.summary.as_ref().unwrap(), &summary);
        let rows: i64 =
            db.with(|c| c.query_row("SELECT COUNT(*) FROM run_files WHERE run = 1", [], |r| r.get(0))).unwrap();
        assert_eq!(rows, 1);
        let counters: String =
            db.with(|c| c.query_row("SELECT counters FROM run_components WHERE run = 1", [], |r| r.get(0))).unwrap();
        assert_eq!(serde_json::from_str::<Stats>(&counters).unwrap().events, 5);
        assert!(db.run(99).unwrap().is_none());
    }

    #[test]
    fn logs_filter_by_time_process_severity_and_text() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::open(&dir.path().join("runs.sqlite")).unwrap();
        db.add_logs(&[
            rec(1, 1000, "ru-0", "info", "run started"),
            rec(2, 2000, "ru-0", "warn", "Buffer almost full"),
            rec(1, 3000, "bu-0", "error", "disk full"),
            rec(3, 4000, "ru-0", "debug", "noise"),
        ])
        .unwrap();
        let all = db.logs(&LogQuery::default()).unwrap();
        assert_eq!(all.iter().map(|r| r.t_ms).collect::<Vec<_>>(), vec![4000, 3000, 2000, 1000]);
        let q = LogQuery { min_severity: Some(Severity::Warn), ..Default::default() };
        assert_eq!(db.logs(&q).unwrap().len(), 2);
        let q = LogQuery { process: Some("ru-0".into()), text: Some("buffer".into()), ..Default::default() };
        assert_eq!(db.logs(&q).unwrap()[0].seq, 2);
        let q = LogQuery { since_ms: Some(1500), until_ms: Some(3500), limit: Some(1), ..Default::default() };
        assert_eq!(db.logs(&q).unwrap()[0].t_ms, 3000);
        let mut pos = db.log_positions().unwrap();
        pos.sort();
        assert_eq!(pos, vec![("bu-0".to_owned(), 1), ("ru-0".to_owned(), 3)]);
    }
}
