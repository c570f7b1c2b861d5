//! The history of slow values kept by a real operator (`daqflow run`) over a real system, in
//! SQLite and in a real PostgreSQL server: with `[history] interval_s = 0.3`, a run of a
//! generator into a sink leaves samples of every component's counters (`gen.events` growing),
//! of the operator's own (`system.state`) and of a service a `daqflow dialog publish` process
//! provides, in the run database and through `GET /api/history`; and while the PostgreSQL
//! server is stopped, the history drops and counts its samples while run control goes on.

#[path = "../../web/tests/support/client.rs"]
mod client;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use client::{get, wait_until};
use daqflow_api::HistoryQuery;
use daqflow_runcontrol::db::RunDb;
use daqflow_rundb::testing::{Backend, TestDb};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// A process killed if the test ends early.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A generator into a sink, sampled every 0.3 s with the service `probe/value`.
fn system_file(data: &Path, database: &str) -> String {
    format!(
        r#"[system]
name = "history-test"
control = "127.0.0.1:0"
data = "{data}"
database = "{database}"

[history]
interval_s = 0.3
retention_days = 1
services = ["probe/value"]

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
rate_hz = 200.0
"#,
        data = data.display()
    )
}

/// The values of a series' points.
fn values(series: &Value) -> Vec<f64> {
    series["points"].as_array().map_or_else(Vec::new, |p| p.iter().filter_map(|p| p["value"].as_f64()).collect())
}

fn a_run_leaves_growing_samples_in_the_database_and_the_api(backend: Backend) {
    let Some(t) = TestDb::new(backend, "history_run") else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    std::fs::write(&file, system_file(&data, &t.location_without_password())).unwrap();
    let mut command = Command::new(BIN);
    command.args(["run", "--web", "127.0.0.1:0", "--data"]).arg(&data).arg(&file).env_remove("PGPASSWORD");
    if let Some(p) = t.password() {
        command.env("PGPASSWORD", p);
    }
    let mut op = Proc(command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap());
    let mut lines = BufReader::new(op.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first.split("web UI: ").nth(1).unwrap_or_else(|| panic!("no web address in {first:?}")).trim().to_owned();
    let base = url.split("?token=").next().unwrap();
    let addr: SocketAddr = base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();

    // A process of the user's provides the service the history names.
    let control = get(addr, "/api/status").json()["control"].as_str().unwrap().to_owned();
    let mut publisher = Proc(
        Command::new(BIN)
            .arg("--token-file")
            .arg(data.join("token"))
            .args(["dialog", "--control", &control, "publish", "probe/value"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdin = publisher.0.stdin.as_mut().unwrap();
    stdin.write_all(b"{\"temperature\": 4.2, \"valve\": {\"open\": true}}\n").unwrap();
    stdin.flush().unwrap();

    let console = op.0.stdin.as_mut().unwrap();
    console.write_all(b"configure\nstart\n").unwrap();
    console.flush().unwrap();

    // The names arrive: every component's counters, the operator's, the service's.
    let names = wait_until("the history's names", || {
        let r = get(addr, "/api/history/names");
        let names: Vec<String> = serde_json::from_value(r.json()).ok()?;
        let wanted = ["gen.events", "sink.events", "gen.detail.chunk_bytes", "system.state", "probe/value.temperature"];
        wanted.iter().all(|w| names.iter().any(|n| n == w)).then_some(names)
    });
    assert!(names.iter().any(|n| n == "probe/value.valve.open"), "{names:?}");
    assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted: {names:?}");

    // The generator's events grow from sample to sample while the run goes on.
    let deadline = Instant::now() + Duration::from_secs(60);
    let series = loop {
        let s = get(addr, "/api/history?name=gen.events&from=0").json();
        let v = values(&s);
        let growing = v.windows(2).filter(|w| w[1] > w[0]).count();
        if growing >= 3 {
            break s;
        }
        assert!(Instant::now() < deadline, "gen.events does not grow: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let v = values(&series);
    assert!(v.windows(2).all(|w| w[1] >= w[0]), "never going down in a run: {v:?}");
    assert_eq!(series["bucket_ms"], 0, "a few samples come back as they are");
    let times: Vec<u64> = series["points"].as_array().unwrap().iter().map(|p| p["t_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[1] > w[0]), "{times:?}");
    let temperature = get(addr, "/api/history?name=probe%2Fvalue.temperature&from=0").json();
    assert!(values(&temperature).iter().all(|x| *x == 4.2) && !values(&temperature).is_empty(), "{temperature}");
    let states = values(&get(addr, "/api/history?name=system.state&from=0").json());
    assert!(states.contains(&2.0), "Running (2) sampled: {states:?}");
    let one = get(addr, "/api/history?name=gen.events&from=0&points=1").json();
    assert_eq!(one["points"].as_array().map(Vec::len), Some(1), "{one}");

    console.write_all(b"stop\nquit\n").unwrap();
    console.flush().unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());
    drop(publisher);

    // The same samples in the run database itself, read by a client of our own.
    let db = RunDb::connect(t.location()).unwrap();
    let q = |name: &str| HistoryQuery { name: name.into(), from_ms: 0, to_ms: u64::MAX >> 1, points: 10_000 };
    let sink = db.history(&q("sink.events")).unwrap().expect("sink.events in the database");
    let v: Vec<f64> = sink.points.iter().map(|p| p.value).collect();
    assert!(v.windows(2).filter(|w| w[1] > w[0]).count() >= 2, "sink.events grows: {v:?}");
    assert!(v.last().is_some_and(|x| *x > 0.0), "{v:?}");
    let stored = db.history(&q("gen.events")).unwrap().unwrap();
    assert!(stored.points.len() >= v.len().min(values(&series).len()), "the API's samples are the database's");
    assert!(db.history_names().unwrap().iter().any(|n| n == "system.history_dropped"));
    let dropped = db.history(&q("system.history_dropped")).unwrap().unwrap();
    assert!(dropped.points.iter().all(|p| p.value == 0.0), "nothing dropped: {dropped:?}");
}

daqflow_rundb::for_each_backend!(a_run_leaves_growing_samples_in_the_database_and_the_api);

/// `daqflow run FILE --web 127.0.0.1:0 --data DATA` with `PGPASSWORD`: the process and its web
/// address.
fn run_with_web(file: &Path, data: &Path, pgpassword: &str) -> (Proc, SocketAddr) {
    let mut op = Proc(
        Command::new(BIN)
            .args(["run", "--web", "127.0.0.1:0", "--data"])
            .arg(data)
            .arg(file)
            .env("PGPASSWORD", pgpassword)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(op.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first.split("web UI: ").nth(1).unwrap_or_else(|| panic!("no web address in {first:?}")).trim().to_owned();
    let base = url.split("?token=").next().unwrap();
    (op, base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap())
}

#[test]
fn while_its_database_is_gone_the_history_drops_and_counts_and_run_control_goes_on() {
    let Some(server) = daqflow_rundb::testing::private() else { return };
    let (db, _) = server.create_database("history_outage");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    std::fs::write(&file, system_file(&data, &server.url(&db, false)).replace("interval_s = 0.3", "interval_s = 0.2"))
        .unwrap();
    let (mut op, addr) = run_with_web(&file, &data, server.password());
    wait_until("the first samples", || {
        let names: Vec<String> = serde_json::from_value(get(addr, "/api/history/names").json()).ok()?;
        names.iter().any(|n| n == "gen.events").then_some(())
    });

    // The database goes away: the history's writes fail, run control does not wait for them.
    server.stop().unwrap();
    let gone = get(addr, "/api/history/names");
    assert_eq!(gone.status, 500, "{}", gone.text());
    assert!(gone.error().contains("run database"), "{}", gone.error());
    let console = op.0.stdin.as_mut().unwrap();
    console.write_all(b"configure\n").unwrap();
    console.flush().unwrap();
    wait_until("configured without the database", || {
        (get(addr, "/api/status").json()["state"] == "Configured").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let back_ms = daqflow_component::log::now_ms();
    server.start_again().unwrap();

    // Back: the samples flow again, and those dropped meanwhile are counted.
    let dropped = wait_until("the dropped samples counted", || {
        let s = get(addr, &format!("/api/history?name=system.history_dropped&from={back_ms}"));
        (s.status == 200).then(|| values(&s.json())).filter(|v| v.last().is_some_and(|x| *x > 0.0))
    });
    assert!(dropped.windows(2).all(|w| w[1] >= w[0]), "{dropped:?}");
    let states = wait_until("samples after the outage", || {
        let s = get(addr, &format!("/api/history?name=system.state&from={back_ms}")).json();
        Some(values(&s)).filter(|v| v.len() >= 3)
    });
    assert!(states.iter().all(|s| *s == 1.0), "Configured (1): {states:?}");
    let console = op.0.stdin.as_mut().unwrap();
    console.write_all(b"quit\n").unwrap();
    console.flush().unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());
}
