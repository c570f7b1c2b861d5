//! The run database's tests, each run against SQLite and against a real PostgreSQL server
//! (`testing`), and the PostgreSQL backend's own: connection loss, passwords.

use super::*;
use crate::sql::Cell;
use crate::testing::{Backend, TestDb};
use daqflow_api::{ComponentRecord, FileRecord};

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

/// One value read with SQL of our own.
fn scalar(db: &RunDb, sql: &'static str) -> Cell {
    db.transact(Mode::Read, |tx| Ok(tx.query(sql, &[])?.remove(0).0.remove(0))).unwrap()
}

fn runs_are_numbered_recorded_and_listed_newest_first(backend: Backend) {
    let Some(t) = TestDb::new(backend, "runs_numbered") else { return };
    let db = t.open();
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
    for (path, events, bytes) in [("/d/run000001_rec_0002.daq", 2, 40), ("/d/run000001_rec_0001.daq", 3, 60)] {
        summary.files.push(FileRecord {
            component: "rec".into(),
            path: path.into(),
            events,
            bytes,
            first_event: Some(1),
            last_event: Some(events),
            complete: true,
        });
    }
    db.end_run(&summary).unwrap();
    let mut late = example_summary(1, 0);
    late.state = RunState::Failed;
    assert!(matches!(db.end_run(&late), Err(DbError::Closed(1))), "a closed record is never overwritten");
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 2);
    let taken = db.begin_run("s", "cfg", Some(2)).unwrap_err();
    assert!(matches!(&taken, DbError::RunTaken { run: 2, next: 3, .. }), "a run number is used once: {taken:?}");
    assert_eq!(
        taken.to_string(),
        "run 2 was taken before (by system `s`, its record is running); a run number is used once: leave it out for \
         the next one (3), or give one never used"
    );
    let taken = db.begin_run("s2", "cfg", Some(1)).unwrap_err().to_string();
    assert!(taken.contains("run 1 was taken before (by system `s`, its record is stopped)"), "{taken}");
    assert_eq!(db.begin_run("s", "cfg", Some(10)).unwrap(), 10);
    assert_eq!(db.begin_run("other", "cfg", Some(11)).unwrap(), 11);
    assert_eq!(db.abandon_open_runs("s").unwrap(), 2, "only this system's");
    assert_eq!(db.run(11).unwrap().unwrap().record.state, RunState::Running);
    let runs = db.runs(10).unwrap();
    assert_eq!(runs.iter().map(|r| r.run).collect::<Vec<_>>(), vec![11, 10, 2, 1]);
    assert_eq!(runs[2].state, RunState::Abandoned);
    assert_eq!(db.runs(1).unwrap().len(), 1);
    let one = db.run(1).unwrap().unwrap();
    assert_eq!(one.config, "cfg");
    assert_eq!((one.record.state, one.record.events, one.record.stopped_ms), (RunState::Stopped, Some(5), Some(2)));
    assert_eq!(one.summary.as_ref().unwrap(), &summary);
    let files = db.files(1).unwrap();
    let listed: Vec<(&str, &str, u64, u64)> =
        files.iter().map(|f| (f.component.as_str(), f.path.to_str().unwrap(), f.events, f.bytes)).collect();
    assert_eq!(
        listed,
        [("rec", "/d/run000001_rec_0001.daq", 3, 60), ("rec", "/d/run000001_rec_0002.daq", 2, 40)],
        "a writer's files in sequence order"
    );
    assert_eq!(db.files(2).unwrap(), [], "a run still running has no files yet");
    let Cell::Text(counters) = scalar(&db, "SELECT counters FROM run_components WHERE run = 1") else { panic!() };
    assert_eq!(serde_json::from_str::<Stats>(&counters).unwrap().events, 5);
    assert!(db.run(99).unwrap().is_none());
    let two = db.run(2).unwrap().unwrap();
    assert_eq!((two.record.stopped_ms, two.record.events, two.summary), (None, None, None));
}

fn logs_filter_by_time_process_severity_and_text(backend: Backend) {
    let Some(t) = TestDb::new(backend, "logs_filter") else { return };
    let db = t.open();
    db.add_logs(&[
        rec(1, 1000, "ru-0", "info", "run started"),
        rec(2, 2000, "ru-0", "warn", "Buffer almost full"),
        rec(1, 3000, "bu-0", "error", "disk full"),
        rec(3, 4000, "ru-0", "debug", "noise"),
        rec(4, 5000, "ru-0", "info", "100% of a_b done"),
        rec(5, 6000, "ru-0", "info", "100 of aXb done"),
    ])
    .unwrap();
    db.add_logs(&[]).unwrap();
    let all = db.logs(&LogQuery::default()).unwrap();
    assert_eq!(all.iter().map(|r| r.t_ms).collect::<Vec<_>>(), vec![6000, 5000, 4000, 3000, 2000, 1000]);
    assert_eq!((all[3].process.as_str(), all[3].severity, all[3].target.as_str()), ("bu-0", Severity::Error, "t"));
    let q = LogQuery { min_severity: Some(Severity::Warn), ..Default::default() };
    assert_eq!(db.logs(&q).unwrap().len(), 2);
    let q = LogQuery { process: Some("ru-0".into()), text: Some("buffer".into()), ..Default::default() };
    assert_eq!(db.logs(&q).unwrap()[0].seq, 2);
    let q = LogQuery { since_ms: Some(1500), until_ms: Some(3500), limit: Some(1), ..Default::default() };
    assert_eq!(db.logs(&q).unwrap()[0].t_ms, 3000);
    // The text is a substring, not a pattern: `%` and `_` match only themselves.
    let q = LogQuery { text: Some("100%".into()), ..Default::default() };
    assert_eq!(db.logs(&q).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
    let q = LogQuery { text: Some("A_B".into()), ..Default::default() };
    assert_eq!(db.logs(&q).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
    let mut pos = db.log_positions().unwrap();
    pos.sort();
    assert_eq!(pos, vec![("bu-0".to_owned(), 1), ("ru-0".to_owned(), 5)]);
}

fn counters_round_trip_up_to_the_signed_64_bit_limit(backend: Backend) {
    let Some(t) = TestDb::new(backend, "counters_limit") else { return };
    let db = t.open();
    let run = db.begin_run("s", "cfg", Some(u32::MAX)).unwrap();
    assert_eq!(run, u32::MAX, "the run number is 32 bits in both backends");
    let mut summary = example_summary(run, 0);
    summary.events = i64::MAX as u64;
    summary.recorded = (1 << 40) + 3;
    summary.bytes = u64::MAX;
    summary.stopped_ms = u64::MAX;
    db.end_run(&summary).unwrap();
    let r = &db.runs(1).unwrap()[0];
    assert_eq!((r.run, r.events, r.recorded), (u32::MAX, Some(i64::MAX as u64), Some((1 << 40) + 3)));
    assert_eq!((r.bytes, r.stopped_ms), (Some(i64::MAX as u64), Some(i64::MAX as u64)), "held at the top");
    assert_eq!(db.run(run).unwrap().unwrap().summary.unwrap().bytes, u64::MAX, "the summary keeps it exactly");
    db.add_logs(&[rec(i64::MAX as u64, u64::MAX, "p", "info", "nul\0inside")]).unwrap();
    let back = &db.logs(&LogQuery::default()).unwrap()[0];
    assert_eq!((back.seq, back.t_ms, back.message.as_str()), (i64::MAX as u64, i64::MAX as u64, "nul\u{FFFD}inside"));
    assert_eq!(db.log_positions().unwrap(), vec![("p".to_owned(), i64::MAX as u64)]);
    assert!(db.begin_run("s", "cfg", None).is_err(), "no run number after the last one");
}

fn concurrent_writers_get_distinct_run_numbers_and_lose_no_log_record(backend: Backend) {
    let Some(t) = TestDb::new(backend, "concurrent") else { return };
    const WRITERS: usize = 4;
    const RUNS: usize = 10;
    const BATCHES: usize = 20;
    let numbers: Vec<u32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let t = &t;
                s.spawn(move || {
                    // A connection of its own, as the operator's and the message logger's are.
                    let db = t.open();
                    let mut mine = Vec::new();
                    for i in 0..BATCHES {
                        if i < RUNS {
                            mine.push(db.begin_run(&format!("w{w}"), "cfg", None).unwrap());
                        }
                        let batch: Vec<LogRecord> =
                            (0..5).map(|k| rec((i * 5 + k + 1) as u64, 1, &format!("w{w}"), "info", "m")).collect();
                        db.add_logs(&batch).unwrap();
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = numbers.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=(WRITERS * RUNS) as u32).collect::<Vec<_>>(), "every number once: {numbers:?}");
    let db = t.open();
    let logs = db.logs(&LogQuery { limit: Some(100_000), ..Default::default() }).unwrap();
    assert_eq!(logs.len(), WRITERS * BATCHES * 5);
    let mut positions = db.log_positions().unwrap();
    positions.sort();
    assert_eq!(positions, (0..WRITERS).map(|w| (format!("w{w}"), (BATCHES * 5) as u64)).collect::<Vec<_>>());
}

fn a_password_in_the_configuration_snapshot_is_not_stored(backend: Backend) {
    let Some(t) = TestDb::new(backend, "snapshot_redacted") else { return };
    let db = t.open();
    let config = "[system]\nname = \"x\"\ndatabase = \"postgres://daq:hunter2@db/runs\"\n";
    let run = db.begin_run("x", config, None).unwrap();
    let stored = db.run(run).unwrap().unwrap().config;
    assert_eq!(stored, "[system]\nname = \"x\"\ndatabase = \"postgres://daq:***@db/runs\"\n");
}

fn alarm_events_are_stored_and_listed_newest_first_by_system(backend: Backend) {
    use daqflow_api::alarms::{AlarmEvent, AlarmEventKind, AlarmSeverity};
    let Some(t) = TestDb::new(backend, "alarm_events") else { return };
    let db = t.open();
    let event = |t_ms, system: &str, kind, who: Option<&str>| AlarmEvent {
        t_ms,
        system: system.into(),
        name: "slow".into(),
        kind,
        severity: AlarmSeverity::Error,
        message: "the rate is low (evm.events_per_s = 12)".into(),
        who: who.map(str::to_owned),
    };
    db.add_alarm_events(&[]).unwrap();
    db.add_alarm_events(&[
        event(1, "s", AlarmEventKind::Raised, None),
        event(2, "other", AlarmEventKind::Raised, None),
    ])
    .unwrap();
    db.add_alarm_events(&[event(3, "s", AlarmEventKind::Acknowledged, Some("alice"))]).unwrap();
    db.add_alarm_events(&[event(4, "s", AlarmEventKind::Cleared, None)]).unwrap();
    let mine = db.alarm_events(Some("s"), 10).unwrap();
    assert_eq!(mine.iter().map(|e| e.t_ms).collect::<Vec<_>>(), vec![4, 3, 1]);
    assert_eq!(mine[1], event(3, "s", AlarmEventKind::Acknowledged, Some("alice")));
    assert_eq!(db.alarm_events(None, 10).unwrap().len(), 4);
    assert_eq!(db.alarm_events(Some("s"), 1).unwrap(), vec![event(4, "s", AlarmEventKind::Cleared, None)]);
    // A database opened again keeps them.
    drop(db);
    assert_eq!(t.open().alarm_events(Some("other"), 10).unwrap().len(), 1);
}

fn a_record_that_could_not_be_finished_is_abandoned_with_its_reason(backend: Backend) {
    let Some(t) = TestDb::new(backend, "abandon_run") else { return };
    let db = t.open();
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 1);
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 2);
    db.end_run(&example_summary(2, 3)).unwrap();
    let reason = "the operator could not finish the record: database or disk is full";
    assert!(!db.abandon_run(1, "other", 77, reason).unwrap(), "another system's run");
    assert!(db.abandon_run(1, "s", 77, reason).unwrap());
    assert!(!db.abandon_run(1, "s", 78, "again").unwrap(), "finished once");
    assert!(!db.abandon_run(2, "s", 78, reason).unwrap(), "a closed record is left as it is");
    let one = db.run(1).unwrap().unwrap().record;
    assert_eq!((one.state, one.stopped_ms, one.error.as_deref()), (RunState::Abandoned, Some(77), Some(reason)));
    assert_eq!(db.run(2).unwrap().unwrap().record.state, RunState::Stopped);
}

crate::for_each_backend!(
    a_record_that_could_not_be_finished_is_abandoned_with_its_reason,
    alarm_events_are_stored_and_listed_newest_first_by_system,
    runs_are_numbered_recorded_and_listed_newest_first,
    logs_filter_by_time_process_severity_and_text,
    counters_round_trip_up_to_the_signed_64_bit_limit,
    concurrent_writers_get_distinct_run_numbers_and_lose_no_log_record,
    a_password_in_the_configuration_snapshot_is_not_stored,
);

#[test]
fn a_connection_ended_by_the_server_is_made_again_by_the_next_call() {
    let Some(t) = TestDb::new(Backend::Postgres, "reconnect") else { return };
    let db = t.open();
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 1);
    assert!(t.break_connections() >= 1);
    // The transaction had not begun: the broken connection is replaced, the call succeeds.
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 2);
    assert_eq!(db.runs(10).unwrap().len(), 2);
}

#[test]
fn a_server_that_goes_away_gives_a_clear_error_and_is_used_again_when_back() {
    let Some(server) = crate::testing::private() else { return };
    let db = server.open_new_database("goes_away");
    db.add_logs(&[rec(1, 1, "p", "info", "before")]).unwrap();
    server.stop().unwrap();
    let e = db.add_logs(&[rec(2, 2, "p", "info", "while down")]).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, DbError::Connect { .. } | DbError::ConnectionLost { .. }), "{e:?}");
    assert!(text.contains(&format!("postgres://daqflow:***@127.0.0.1:{}/", server.port())), "{text}");
    assert!(!text.contains(server.password()) && !format!("{e:?}").contains(server.password()), "{text}");
    server.start_again().unwrap();
    db.add_logs(&[rec(3, 3, "p", "info", "after")]).unwrap();
    let logs = db.logs(&LogQuery::default()).unwrap();
    assert_eq!(logs.iter().map(|r| r.message.as_str()).collect::<Vec<_>>(), vec!["after", "before"]);
}

#[test]
fn connecting_to_nothing_or_with_a_wrong_password_fails_without_showing_it() {
    let Some(server) = crate::testing::shared() else { return };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let nobody = Location::parse(&format!("postgres://daq:hunter2@127.0.0.1:{port}/runs")).unwrap();
    let e = RunDb::connect(&nobody).err().unwrap();
    assert!(matches!(e, DbError::Connect { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot connect to the run database postgres://daq:***@127.0.0.1:{port}/runs: ")),
        "{e}"
    );
    assert!(!format!("{e} {e:?}").contains("hunter2"));
    let wrong = Location::parse(&format!("postgres://daqflow:hunter2@127.0.0.1:{}/postgres", server.port())).unwrap();
    let e = RunDb::connect(&wrong).err().unwrap();
    assert!(e.to_string().contains("password authentication failed"), "{e}");
    assert!(!format!("{e} {e:?}").contains("hunter2"));
}

#[test]
fn the_password_comes_from_the_url_else_the_environment_else_the_password_file() {
    let url = |text: &str| match Location::parse(text).unwrap() {
        Location::Postgres(u) => u,
        Location::Sqlite(_) => unreachable!(),
    };
    let file = Some("db:5432:runs:daq:from-file\n".to_owned());
    let password = |u: &PostgresUrl, env: Option<&str>, file: &Option<String>| {
        u.config_from(env.map(str::to_owned), || file.clone())
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
    };
    let with = url("postgres://daq:in-url@db/runs");
    assert_eq!(password(&with, Some("env"), &file).as_deref(), Some("in-url"));
    let without = url("postgres://daq@db/runs");
    assert_eq!(password(&without, Some("env"), &file).as_deref(), Some("env"));
    assert_eq!(password(&without, None, &file).as_deref(), Some("from-file"));
    assert_eq!(password(&without, None, &None), None);
    assert_eq!(password(&url("postgres://daq@db:6000/runs"), None, &file), None, "the port must match");
    let c = without.config_from(None, || None);
    assert_eq!((c.get_connect_timeout(), c.get_application_name()), (Some(&Duration::from_secs(10)), Some("daqflow")));
}

#[test]
fn an_sqlite_database_uses_no_shared_memory_file_and_a_write_ahead_log_is_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.sqlite");
    // A database an earlier version made, in WAL mode.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }
    let db = RunDb::open(&path).unwrap();
    let other = RunDb::open(&path).unwrap();
    assert_eq!(db.begin_run("s", "cfg", None).unwrap(), 1);
    db.end_run(&example_summary(1, 3)).unwrap();
    assert_eq!(other.runs(10).unwrap().len(), 1, "a second connection reads what the first wrote");
    // No file any process maps into memory: a `-shm` file made immutable (the kernel's SIGBUS
    // on a write into its mapping) cannot touch it.
    for suffix in ["-shm", "-wal"] {
        let mut f = path.as_os_str().to_owned();
        f.push(suffix);
        assert!(!std::path::Path::new(&f).exists(), "{} is there", std::path::Path::new(&f).display());
    }
    let mode: String = db
        .transact(Mode::Read, |tx| Ok(tx.query("PRAGMA journal_mode", &[])?.remove(0).0.remove(0)))
        .map(|c| match c {
            Cell::Text(t) => t,
            other => format!("{other:?}"),
        })
        .unwrap();
    assert_eq!(mode, "delete");
}

#[test]
fn an_sqlite_file_is_made_with_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/runs.sqlite");
    let db = RunDb::open(&path).unwrap();
    assert_eq!(db.location(), &Location::Sqlite(path.clone()));
    assert!(path.is_file());
    let e = RunDb::open(&dir.path().join("a/b/runs.sqlite/x.sqlite")).err().unwrap();
    assert!(matches!(e, DbError::Io { .. }), "{e:?}");
}

fn provenance_and_changes_are_kept_per_run(backend: Backend) {
    use daqflow_api::{ParameterChange, RunProvenance};
    let Some(t) = TestDb::new(backend, "provenance") else { return };
    let db = t.open();
    let run = db.begin_run("s", "cfg", None).unwrap();
    let other = db.begin_run("s", "cfg", None).unwrap();
    assert_eq!(db.provenance(run).unwrap(), None, "none until stored");
    let mut p = RunProvenance {
        system_digest: "ab".repeat(32),
        effective_digest: "cd".repeat(32),
        overrides: [("bu-0.credits".to_owned(), serde_json::json!(64))].into_iter().collect(),
        params: [("bu-0".to_owned(), serde_json::json!({"credits": 64, "size": {"mean": 1024.5}}))]
            .into_iter()
            .collect(),
        repeat_of: None,
    };
    db.set_provenance(run, &p).unwrap();
    assert_eq!(db.provenance(run).unwrap().as_ref(), Some(&p));
    p.repeat_of = Some(u32::MAX);
    db.set_provenance(run, &p).unwrap();
    assert_eq!(db.provenance(run).unwrap().as_ref(), Some(&p), "stored again: replaced");
    assert!(matches!(db.set_provenance(99, &p), Err(DbError::NoRun(99))));
    let change = |t_ms, key: &str, value| ParameterChange { t_ms, component: "bu-0".into(), key: key.into(), value };
    let changes = [
        change(300, "credits", serde_json::json!(32)),
        change(100, "size.mean", serde_json::json!(2048.0)),
        change(100, "name\0with nul", serde_json::json!("x")),
    ];
    for c in &changes {
        db.add_change(run, c).unwrap();
    }
    assert!(matches!(db.add_change(99, &changes[0]), Err(DbError::NoRun(99))));
    let mut expected = vec![changes[1].clone(), changes[2].clone(), changes[0].clone()];
    expected[1].key = "name\u{FFFD}with nul".into();
    assert_eq!(db.changes(run).unwrap(), expected, "in time order, then in the order recorded");
    assert_eq!(db.changes(other).unwrap(), vec![]);
    let detail = db.run(run).unwrap().unwrap();
    assert_eq!((detail.provenance.as_ref(), &detail.changes), (Some(&p), &expected));
    let plain = db.run(other).unwrap().unwrap();
    assert_eq!((plain.provenance, plain.changes), (None, vec![]));
    // A database made before these tables existed gets them when it is opened.
    db.transact(Mode::Write, |tx| {
        tx.execute("DROP TABLE run_provenance", &[])?;
        tx.execute("DROP TABLE run_changes", &[])
    })
    .unwrap();
    drop(db);
    let db = t.open();
    assert_eq!(db.run(run).unwrap().unwrap().provenance, None);
    db.set_provenance(run, &p).unwrap();
    assert_eq!(db.provenance(run).unwrap(), Some(p));
}

crate::for_each_backend!(provenance_and_changes_are_kept_per_run);
