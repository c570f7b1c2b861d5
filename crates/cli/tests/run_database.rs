//! `daqflow run` keeping its run database in SQLite and in a real PostgreSQL server: two
//! operators one after the other number their runs on, the message logger stores every
//! process's log records, and a password in the URL is shown nowhere.

use std::path::Path;
use std::process::Command;

use daqflow_api::RunState;
use daqflow_runcontrol::db::{LogQuery, RunDb};
use daqflow_rundb::testing::{Backend, TestDb};

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// A generator into a sink, and the message logger.
fn system_file(data: &Path, database: &str) -> String {
    format!(
        r#"[system]
name = "rundb-test"
control = "127.0.0.1:0"
data = "{data}"
database = "{database}"
web = "none"

[[component]]
name = "msglogger"
kind = "msglogger"
[component.params]
control = "${{system.control}}"
database = "${{system.database}}"

[[component]]
name = "sink"
kind = "sink"
[component.params]
listen = "127.0.0.1:0"

[[component]]
name = "gen"
kind = "generator"
[component.params]
downstream = "${{sink.listen}}"
chunk_bytes = 1024
rate_hz = 500.0
"#,
        data = data.display()
    )
}

/// `daqflow run FILE --start --seconds 2`, with `PGPASSWORD` set or not; its output.
fn run(file: &Path, pgpassword: Option<&str>) -> String {
    let mut c = Command::new(BIN);
    c.arg("run").arg(file).args(["--start", "--seconds", "2"]).env_remove("PGPASSWORD");
    if let Some(p) = pgpassword {
        c.env("PGPASSWORD", p);
    }
    let out = c.output().unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "daqflow run failed:\n{text}");
    text
}

fn runs_and_logs_are_recorded_and_no_password_is_shown(backend: Backend) {
    let Some(t) = TestDb::new(backend, "daqflow_run") else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    // First the password in the URL, then (PostgreSQL) out of it, in PGPASSWORD.
    std::fs::write(&file, system_file(&data, &t.location().to_config_value())).unwrap();
    let first = run(&file, None);
    std::fs::write(&file, system_file(&data, &t.location_without_password())).unwrap();
    let second = run(&file, t.password());
    assert!(first.contains(&format!("  database:   {}\n", t.location())), "{first}");
    assert!(second.contains(&format!("  database:   {}\n", t.location_without_password())), "{second}");

    let db = RunDb::connect(t.location()).unwrap();
    let runs = db.runs(10).unwrap();
    assert_eq!(runs.iter().map(|r| r.run).collect::<Vec<_>>(), vec![2, 1], "{runs:?}");
    for r in &runs {
        assert_eq!((r.state, r.system.as_str(), r.lost), (RunState::Stopped, "rundb-test", Some(0)), "{r:?}");
        let summary = db.run(r.run).unwrap().unwrap().summary.unwrap();
        let sink = &summary.components["sink"];
        assert!(sink.summary.as_ref().is_some_and(|s| s.events > 0), "the sink received nothing: {sink:?}");
    }
    let detail = db.run(1).unwrap().unwrap();
    assert!(detail.config.contains("kind = \"generator\""));
    let logs = db.logs(&LogQuery { limit: Some(10_000), ..Default::default() }).unwrap();
    for p in ["operator", "msglogger", "sink", "gen"] {
        assert!(logs.iter().any(|r| r.process == p), "no log record of {p}");
    }

    if let Some(password) = t.password() {
        assert!(first.contains(":***@"), "{first}");
        let mut shown =
            vec![("the output".to_owned(), first + &second), ("the stored system file".to_owned(), detail.config)];
        shown.extend(logs.iter().map(|r| (format!("the log record {r:?}"), r.message.clone())));
        for f in std::fs::read_dir(data.join("logs")).unwrap() {
            let path = f.unwrap().path();
            shown.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap_or_default()));
        }
        for (what, text) in shown {
            assert!(!text.contains(password), "{what} shows the password:\n{text}");
        }
    }
}

daqflow_rundb::for_each_backend!(runs_and_logs_are_recorded_and_no_password_is_shown);
