//! # daqflow-rundb: the run database
//!
//! Run numbers, run records and the message log, kept by the operator and by the message logger
//! (DIALOG's MessageLogger) of `daqflow-runcontrol`. Two backends hold the same tables and answer
//! the same queries:
//!
//! - **SQLite** (the default): one file, embedded, nothing to set up. The operator and the
//!   message logger open the same file from two processes, and `daqflow runs` reads it while
//!   they write; SQLite's file locks and a busy timeout make that safe. The database is kept
//!   in SQLite's rollback-journal mode (`journal_mode = DELETE`), not its write-ahead log: the
//!   log's index is a shared-memory file (`-shm`) that every process maps, and a mapping the
//!   kernel refuses to write (the file made immutable or read-only, truncated) kills the
//!   process with SIGBUS instead of failing a call. Without it every failure of the database
//!   is an error the caller reports. A database in WAL mode (made by an earlier version) is
//!   turned into rollback mode when it is opened with no other connection.
//! - **PostgreSQL**: a server named by a URL, `postgres://USER@HOST:PORT/DBNAME`, for a run
//!   history that several systems share or that other tools query while runs go on. The tables
//!   are created on first use. Run numbers are given out under a table lock and log records
//!   count by a sequence, so the operator and message loggers of any number of processes write
//!   at once without a duplicate number or a lost record. A broken connection fails the call
//!   that found it with [`DbError::ConnectionLost`]; the next call connects again. The
//!   connection is not encrypted: reach a remote server over a private network or an ssh
//!   tunnel. The URL's password is never shown ([`Location`]'s `Display` redacts it) and is
//!   better not written in it at all: `PGPASSWORD` or `~/.pgpass` give it.
//!
//! Tables (documented in `docs/operator-guide.md`):
//! - `runs`: one row per run: number, system, start and stop time (Unix ms), state
//!   (`running`, `stopped`, `failed`, `abandoned`), the configuration snapshot (the system file,
//!   any PostgreSQL password in it redacted), totals (events built, recorded, lost, bytes), the
//!   error if any and the whole summary;
//! - `run_components`: each component's counters at the end of a run;
//! - `run_files`: the files written in a run;
//! - `run_provenance`: each run's digests, overrides, components' parameters and the run it
//!   repeats; `run_changes`: the parameters changed during a run ([`RunDb::set_provenance`],
//!   [`RunDb::add_change`]);
//! - `logs`: every log record the message logger received;
//! - `history_names`, `history`: the history of slow values, samples `(time, name, value)`
//!   written by the operator ([`RunDb::add_samples`]) and read down-sampled
//!   ([`RunDb::history`]);
//! - `alarm_events`: every alarm raised, acknowledged and cleared (`RunDb::add_alarm_events`).
//!
//! Counters are signed 64-bit integers in both backends: a count above `i64::MAX`
//! (9.2 × 10¹⁸) is stored as `i64::MAX` (the summary's JSON keeps it exactly). Text cannot hold
//! a NUL character in PostgreSQL: both backends store it as U+FFFD.
//!
//! ```
//! use daqflow_rundb::{Location, RunDb};
//! let dir = tempfile::tempdir().unwrap();
//! // Or `Location::parse("postgres://daq@db.example/runs")`.
//! let location = Location::parse("runs.sqlite").unwrap().under(dir.path());
//! let db = RunDb::connect(&location).unwrap();
//! let run = db.begin_run("demo", "# system file", None).unwrap();
//! assert_eq!(run, 1);
//! let summary = daqflow_rundb::example_summary(run, 10);
//! db.end_run(&summary).unwrap();
//! assert_eq!(db.runs(10).unwrap()[0].events, Some(10));
//! ```
#![warn(missing_docs)]

mod alarms;
mod history;
mod location;
mod provenance;
mod sql;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use daqflow_api::{LogRecord, RunAccounting, RunDetail, RunRecord, RunState, RunSummary, Severity};
use daqflow_component::Stats;

pub use daqflow_api::LogQuery;
pub use history::Sample;
pub use location::{Location, LocationError, PostgresUrl, redact_text, redact_url};

use sql::{Arg, Fail, PostgresTx, Row, Sql, SqliteTx};

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
    /// The PostgreSQL server could not be reached, or refused the connection (wrong user,
    /// password or database name).
    #[error("cannot connect to the run database {location}: {}", describe(.source))]
    Connect {
        /// The URL, its password redacted.
        location: String,
        /// The client's error.
        source: postgres::Error,
    },
    /// The connection to the PostgreSQL server broke (the server stopped or restarted, or the
    /// network failed); this call's work was not done, and the next call connects again.
    #[error("the connection to the run database {location} broke ({}); the next call connects again", describe(.source))]
    ConnectionLost {
        /// The URL, its password redacted.
        location: String,
        /// The client's error.
        source: postgres::Error,
    },
    /// PostgreSQL refused an operation.
    #[error("run database {location}: {}", describe(.source))]
    Postgres {
        /// The URL, its password redacted.
        location: String,
        /// The server's or the client's error.
        source: postgres::Error,
    },
    /// A row holds what this version does not expect (a table changed by hand?).
    #[error("run database {location}: {what}")]
    Unreadable {
        /// The database, its password redacted.
        location: String,
        /// What was found.
        what: String,
    },
    /// The run is not open (never begun, or closed already): its record is left as it is.
    #[error("run {0} is not open in the run database; its record is left as it is")]
    Closed(u32),
    /// There is no run of this number in the database.
    #[error("no run {0} in the run database")]
    NoRun(u32),
    /// A run of this number was taken before (a run number is used once): nothing was written.
    #[error(
        "run {run} was taken before (by system `{system}`, its record is {state}); a run number is used once: \
         leave it out for the next one ({next}), or give one never used"
    )]
    RunTaken {
        /// The run number asked for.
        run: u32,
        /// The system whose run it is.
        system: String,
        /// The state of its record (`running`, `stopped`, `failed`, `abandoned`).
        state: String,
        /// The number the next run would get.
        next: u32,
    },
    /// The database directory could not be created.
    #[error("run database directory {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The run database.
pub struct RunDb {
    location: Location,
    backend: Mutex<Backend>,
}

enum Backend {
    Sqlite(rusqlite::Connection),
    Postgres {
        config: Box<postgres::Config>,
        /// The connection, made again when it broke.
        client: Option<postgres::Client>,
    },
}

/// A transaction that writes (SQLite takes its write lock at the start) or only reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Write,
    Read,
}

/// Runs `f` where a blocking PostgreSQL client may run: on a thread of its own when called from
/// inside a tokio runtime (the client runs a runtime of its own, which may not be nested).
fn outside_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(f).join()).unwrap_or_else(|p| std::panic::resume_unwind(p))
    } else {
        f()
    }
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl RunDb {
    /// Opens (creating if needed) the SQLite database at `path`.
    pub fn open(path: &Path) -> Result<RunDb, DbError> {
        RunDb::connect(&Location::Sqlite(path.to_owned()))
    }

    /// Opens the database at `location`, creating the SQLite file or the PostgreSQL tables if
    /// missing.
    pub fn connect(location: &Location) -> Result<RunDb, DbError> {
        let backend = match location {
            Location::Sqlite(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| DbError::Io { path: dir.to_owned(), source })?;
                }
                let err = |source| DbError::Sqlite { path: path.to_owned(), source };
                let conn = rusqlite::Connection::open(path).map_err(err)?;
                conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
                conn.execute_batch(sql::SQLITE_SCHEMA).map_err(err)?;
                conn.execute_batch(provenance::SQLITE_SCHEMA).map_err(err)?;
                conn.execute_batch(history::SQLITE_SCHEMA).map_err(err)?;
                conn.execute_batch(alarms::SQLITE_SCHEMA).map_err(err)?;
                Backend::Sqlite(conn)
            }
            Location::Postgres(url) => {
                let config = url.config();
                let client = outside_runtime(|| postgres_connect(&config, location))?;
                Backend::Postgres { config: Box::new(config), client: Some(client) }
            }
        };
        Ok(RunDb { location: location.clone(), backend: Mutex::new(backend) })
    }

    /// Where the database is; its `Display` redacts a password.
    pub fn location(&self) -> &Location {
        &self.location
    }

    fn backend(&self) -> MutexGuard<'_, Backend> {
        self.backend.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` in one transaction, committed if it succeeds; connects to PostgreSQL again first
    /// if the connection broke.
    fn transact<T: Send>(
        &self,
        mode: Mode,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, Fail> + Send,
    ) -> Result<T, DbError> {
        let mut backend = self.backend();
        match &mut *backend {
            Backend::Sqlite(conn) => {
                let behavior = match mode {
                    Mode::Write => rusqlite::TransactionBehavior::Immediate,
                    Mode::Read => rusqlite::TransactionBehavior::Deferred,
                };
                let result = conn.transaction_with_behavior(behavior).map_err(Fail::from).and_then(|tx| {
                    let mut tx = SqliteTx(tx);
                    let value = f(&mut tx)?;
                    tx.0.commit()?;
                    Ok(value)
                });
                result.map_err(|e| self.error(e))
            }
            Backend::Postgres { config, client } => outside_runtime(|| {
                let lost = |source| DbError::ConnectionLost { location: self.location.to_string(), source };
                // A connection found broken when the transaction begins is made again at once:
                // nothing was done yet. One that breaks later fails this call.
                let mut retried = false;
                let mut conn = loop {
                    let mut conn = match client.take().filter(|c| !c.is_closed()) {
                        Some(c) => c,
                        None => postgres_connect(config, &self.location)?,
                    };
                    match conn.batch_execute("BEGIN") {
                        Ok(()) => break conn,
                        Err(source) if broken(&source) && !retried => retried = true,
                        Err(source) if broken(&source) => return Err(lost(source)),
                        Err(source) => {
                            *client = Some(conn);
                            return Err(self.error(Fail::Postgres(source)));
                        }
                    }
                };
                let result = f(&mut PostgresTx(&mut conn));
                let result = result.and_then(|value| {
                    conn.batch_execute("COMMIT")?;
                    Ok(value)
                });
                match result {
                    Ok(value) => {
                        *client = Some(conn);
                        Ok(value)
                    }
                    Err(Fail::Postgres(source)) if broken(&source) || conn.is_closed() => Err(lost(source)),
                    Err(e) => {
                        if conn.batch_execute("ROLLBACK").is_ok() {
                            *client = Some(conn);
                        }
                        Err(self.error(e))
                    }
                }
            }),
        }
    }

    fn error(&self, fail: Fail) -> DbError {
        let location = self.location.to_string();
        match fail {
            Fail::Sqlite(source) => DbError::Sqlite { path: location.into(), source },
            Fail::Postgres(source) => DbError::Postgres { location, source },
            Fail::Unreadable(what) => DbError::Unreadable { location, what },
        }
    }

    /// Opens a run record and returns its number: `run` if given (it must not exist), else one
    /// more than the highest so far. Any PostgreSQL password in `config` is stored redacted.
    ///
    /// A number taken before is refused before anything is written ([`DbError::RunTaken`],
    /// with the record's system and state and the next free number).
    pub fn begin_run(&self, system: &str, config: &str, run: Option<u32>) -> Result<u32, DbError> {
        let config = redact_text(config);
        let started = now_ms();
        // The outer error: the database failed; the inner one: the number is taken.
        self.transact(Mode::Write, |tx| {
            if let Some(lock) = tx.dialect().lock_runs() {
                tx.execute(lock, &[])?;
            }
            let max = tx.query("SELECT MAX(run) FROM runs", &[])?;
            let max = max.first().map_or(Ok(None), |r| r.opt_int(0))?.unwrap_or(0);
            let next = u32::try_from(max + 1);
            let n = match run {
                Some(n) => {
                    let taken = tx.query("SELECT system, state FROM runs WHERE run = ?1", &[Arg::Int(n.into())])?;
                    if let Some(row) = taken.first() {
                        let (system, state) = (row.text(0)?, row.text(1)?);
                        return Ok(Err(DbError::RunTaken { run: n, system, state, next: next.unwrap_or(u32::MAX) }));
                    }
                    n
                }
                None => {
                    next.map_err(|_| Fail::Unreadable(format!("the highest run number ({max}) is the last there is")))?
                }
            };
            tx.execute(
                "INSERT INTO runs (run, system, started_ms, state, config) VALUES (?1, ?2, ?3, 'running', ?4)",
                &[Arg::Int(n.into()), Arg::text(system), Arg::count(started), Arg::text(&config)],
            )?;
            Ok(Ok(n))
        })?
    }

    /// Closes a run record with its summary: state, error, totals, every component's counters
    /// (`run_components`) and the files (`run_files`). A record is closed once: a run that is
    /// not `running` any more is left as it is ([`DbError::Closed`]).
    pub fn end_run(&self, summary: &RunSummary) -> Result<(), DbError> {
        let run = summary.run;
        let text = serde_json::to_string(summary).unwrap_or_default();
        let components: Vec<(&str, &str, String)> = summary
            .components
            .iter()
            .map(|(name, c)| {
                let counters = c.summary.as_ref().or(c.last_stats.as_ref()).unwrap_or(&Stats::default()).clone();
                (name.as_str(), c.kind.as_str(), serde_json::to_string(&counters).unwrap_or_default())
            })
            .collect();
        let updated = self.transact(Mode::Write, |tx| {
            let updated = tx.execute(
                "UPDATE runs SET stopped_ms = ?2, state = ?3, events = ?4, recorded = ?5, lost = ?6, bytes = ?7,
                 error = ?8, summary = ?9 WHERE run = ?1 AND state = 'running'",
                &[
                    Arg::Int(run.into()),
                    Arg::count(summary.stopped_ms),
                    Arg::text(summary.state.name()),
                    Arg::count(summary.events),
                    Arg::count(summary.recorded),
                    Arg::count(summary.lost),
                    Arg::count(summary.bytes),
                    Arg::opt_text(summary.error.as_deref()),
                    Arg::text(&text),
                ],
            )?;
            if updated == 0 {
                return Ok(false);
            }
            let rows: Vec<Vec<Arg<'_>>> = components
                .iter()
                .map(|(name, kind, counters)| {
                    vec![Arg::Int(run.into()), Arg::text(name), Arg::text(kind), Arg::text(counters)]
                })
                .collect();
            tx.execute_each(
                "INSERT INTO run_components (run, component, kind, counters) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (run, component) DO UPDATE SET kind = excluded.kind, counters = excluded.counters",
                &rows,
            )?;
            let paths: Vec<String> = summary.files.iter().map(|f| f.path.to_string_lossy().into_owned()).collect();
            let rows: Vec<Vec<Arg<'_>>> = summary
                .files
                .iter()
                .zip(&paths)
                .map(|(f, path)| {
                    vec![
                        Arg::Int(run.into()),
                        Arg::text(&f.component),
                        Arg::text(path),
                        Arg::count(f.events),
                        Arg::count(f.bytes),
                    ]
                })
                .collect();
            tx.execute_each(
                "INSERT INTO run_files (run, component, path, events, bytes) VALUES (?1, ?2, ?3, ?4, ?5)",
                &rows,
            )?;
            Ok(true)
        })?;
        if updated { Ok(()) } else { Err(DbError::Closed(run)) }
    }

    /// The data files written in run `run` (`run_files`, filled when the run was closed), by
    /// writer and path: a writer's files in their sequence order. Empty for a run that is not
    /// closed yet, or wrote no file.
    pub fn files(&self, run: u32) -> Result<Vec<RunFile>, DbError> {
        self.transact(Mode::Read, |tx| {
            let rows = tx.query(
                "SELECT component, path, events, bytes FROM run_files WHERE run = ?1 ORDER BY component, path",
                &[Arg::Int(run.into())],
            )?;
            rows.iter()
                .map(|r| {
                    Ok(RunFile {
                        component: r.text(0)?,
                        path: PathBuf::from(r.text(1)?),
                        events: r.count(2)?,
                        bytes: r.count(3)?,
                    })
                })
                .collect()
        })
    }

    /// The runs of `system` left `running` by an operator that died are marked `abandoned`;
    /// returns how many. Other systems' runs (in a database several systems share) are left as
    /// they are.
    pub fn abandon_open_runs(&self, system: &str) -> Result<usize, DbError> {
        self.transact(Mode::Write, |tx| {
            Ok(tx.execute(
                "UPDATE runs SET state = 'abandoned' WHERE state = 'running' AND system = ?1",
                &[Arg::text(system)],
            )? as usize)
        })
    }

    /// Finishes the record of run `run` of `system`, left `running` because it could not be
    /// finished when the run ended, as `abandoned`, with `reason` as its error and `stopped_ms`
    /// as its stop time. Whether it did: a record not `running` any more is left as it is.
    pub fn abandon_run(&self, run: u32, system: &str, stopped_ms: u64, reason: &str) -> Result<bool, DbError> {
        self.transact(Mode::Write, |tx| {
            Ok(tx.execute(
                "UPDATE runs SET state = 'abandoned', stopped_ms = ?3, error = ?4
                 WHERE run = ?1 AND system = ?2 AND state = 'running'",
                &[Arg::Int(run.into()), Arg::text(system), Arg::count(stopped_ms), Arg::text(reason)],
            )? == 1)
        })
    }

    /// The run history, newest first (without the configuration and summary).
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, DbError> {
        self.transact(Mode::Read, |tx| {
            let rows = tx.query(
                "SELECT run, system, started_ms, stopped_ms, state, events, recorded, lost, bytes, error
                 FROM runs ORDER BY run DESC LIMIT ?1",
                &[Arg::count(limit as u64)],
            )?;
            rows.iter().map(run_row).collect()
        })
    }

    /// One run's whole record: the row, its configuration snapshot, its summary (none for a
    /// run abandoned, or one recorded by a version whose summary this one cannot read), its
    /// provenance and the parameters changed during it.
    pub fn run(&self, run: u32) -> Result<Option<RunDetail>, DbError> {
        self.transact(Mode::Read, |tx| {
            let rows = tx.query(
                "SELECT run, system, started_ms, stopped_ms, state, events, recorded, lost, bytes, error, config, summary
                 FROM runs WHERE run = ?1",
                &[Arg::Int(run.into())],
            )?;
            let Some(r) = rows.first() else { return Ok(None) };
            Ok(Some(RunDetail {
                record: run_row(r)?,
                config: r.text(10)?,
                summary: r.opt_text(11)?.and_then(|s| serde_json::from_str(&s).ok()),
                provenance: provenance::read_provenance(tx, run)?,
                changes: provenance::read_changes(tx, run)?,
            }))
        })
    }

    /// Stores log records, all or none.
    pub fn add_logs(&self, records: &[LogRecord]) -> Result<(), DbError> {
        if records.is_empty() {
            return Ok(());
        }
        let rows: Vec<Vec<Arg<'_>>> = records
            .iter()
            .map(|r| {
                vec![
                    Arg::count(r.t_ms),
                    Arg::text(&r.process),
                    Arg::text(r.severity.name()),
                    Arg::Int(i64::from(r.severity.rank())),
                    Arg::text(&r.target),
                    Arg::text(&r.message),
                    Arg::count(r.seq),
                ]
            })
            .collect();
        self.transact(Mode::Write, |tx| {
            tx.execute_each(
                "INSERT INTO logs (t_ms, process, severity, rank, target, message, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &rows,
            )
        })
    }

    /// The highest sequence number stored per process (where a message logger resumes).
    pub fn log_positions(&self) -> Result<Vec<(String, u64)>, DbError> {
        self.transact(Mode::Read, |tx| {
            let rows = tx.query("SELECT process, MAX(seq) FROM logs GROUP BY process", &[])?;
            rows.iter().map(|r| Ok((r.text(0)?, r.count(1)?))).collect()
        })
    }

    /// Log records, newest first.
    pub fn logs(&self, q: &LogQuery) -> Result<Vec<LogRecord>, DbError> {
        let mut sql = String::from("SELECT seq, t_ms, severity, process, target, message FROM logs WHERE 1 = 1");
        let mut args: Vec<Arg<'_>> = Vec::new();
        let mut condition = |sql: &mut String, text: &str, arg: Arg<'static>| {
            args.push(arg);
            sql.push_str(&text.replace('#', &format!("?{}", args.len())));
        };
        if let Some(s) = q.since_ms {
            condition(&mut sql, " AND t_ms >= #", Arg::count(s));
        }
        if let Some(u) = q.until_ms {
            condition(&mut sql, " AND t_ms <= #", Arg::count(u));
        }
        if let Some(p) = q.process.as_ref().filter(|p| !p.is_empty()) {
            condition(&mut sql, " AND process = #", Arg::text(p).into_owned());
        }
        if let Some(s) = q.min_severity {
            condition(&mut sql, " AND rank >= #", Arg::Int(i64::from(s.rank())));
        }
        if let Some(t) = q.text.as_ref().filter(|t| !t.is_empty()) {
            // A substring, case-insensitively, in either backend: LIKE with its wildcards escaped.
            let pattern =
                format!("%{}%", t.to_lowercase().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
            condition(&mut sql, " AND lower(message) LIKE # ESCAPE '\\'", Arg::text(&pattern).into_owned());
        }
        condition(&mut sql, " ORDER BY t_ms DESC, id DESC LIMIT #", Arg::count(q.limit() as u64));
        self.transact(Mode::Read, |tx| {
            let rows = tx.query(&sql, &args)?;
            rows.iter()
                .map(|r| {
                    Ok(LogRecord {
                        seq: r.count(0)?,
                        t_ms: r.count(1)?,
                        severity: Severity::parse(&r.text(2)?).unwrap_or(Severity::Info),
                        process: r.text(3)?,
                        target: r.text(4)?,
                        message: r.text(5)?,
                    })
                })
                .collect()
        })
    }
}

impl Drop for RunDb {
    /// A PostgreSQL client is closed where it may block (not inside a tokio runtime).
    fn drop(&mut self) {
        let backend = self.backend.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Backend::Postgres { client, .. } = backend
            && let Some(c) = client.take()
        {
            outside_runtime(move || drop(c));
        }
    }
}

/// A PostgreSQL error in full: the server's message (with its detail and hint) for an error
/// the server sent, else the client's with its causes.
fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        for (what, part) in [("detail", db.detail()), ("hint", db.hint())] {
            if let Some(part) = part {
                text.push_str(&format!(" ({what}: {part})"));
            }
        }
        return text;
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// Whether a PostgreSQL error means the connection is gone: closed, a connection exception
/// (SQLSTATE class 08) or the server ending it (57P: shut down, restarted, the backend
/// terminated).
fn broken(e: &postgres::Error) -> bool {
    e.is_closed() || e.code().is_some_and(|c| c.code().starts_with("08") || c.code().starts_with("57P"))
}

/// Connects to PostgreSQL and makes the tables if missing.
fn postgres_connect(config: &postgres::Config, location: &Location) -> Result<postgres::Client, DbError> {
    let err = |source| DbError::Connect { location: location.to_string(), source };
    let mut client = config.connect(postgres::NoTls).map_err(err)?;
    client.batch_execute(sql::POSTGRES_SCHEMA).map_err(err)?;
    client.batch_execute(provenance::POSTGRES_SCHEMA).map_err(err)?;
    client.batch_execute(history::POSTGRES_SCHEMA).map_err(err)?;
    client.batch_execute(alarms::POSTGRES_SCHEMA).map_err(err)?;
    Ok(client)
}

/// A data file of a run, as its run record lists it ([`RunDb::files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFile {
    /// The component that wrote it.
    pub component: String,
    /// Its path, as the writer gave it.
    pub path: PathBuf,
    /// Whole event records in it at the end of the run.
    pub events: u64,
    /// Its size in bytes at the end of the run.
    pub bytes: u64,
}

/// The columns `run` … `error` of a `runs` row (in that order, the first ten selected).
fn run_row(r: &Row) -> Result<RunRecord, Fail> {
    let run = r.int(0)?;
    Ok(RunRecord {
        run: u32::try_from(run).map_err(|_| Fail::Unreadable(format!("run number {run} is out of range")))?,
        system: r.text(1)?,
        started_ms: r.count(2)?,
        stopped_ms: r.opt_count(3)?,
        state: RunState::parse(&r.text(4)?).unwrap_or(RunState::Abandoned),
        events: r.opt_count(5)?,
        recorded: r.opt_count(6)?,
        lost: r.opt_count(7)?,
        bytes: r.opt_count(8)?,
        error: r.opt_text(9)?,
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
        accounting: RunAccounting {
            triggered: Some(events),
            rejected: Some(0),
            events,
            recorded: events,
            bytes: events * 100,
            accounting_complete: true,
            ..RunAccounting::default()
        },
        files: Vec::new(),
        file_problems: Vec::new(),
        components: Default::default(),
        errors: Vec::new(),
        overrides: Default::default(),
        degraded: Default::default(),
        changes: Default::default(),
        histograms: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
