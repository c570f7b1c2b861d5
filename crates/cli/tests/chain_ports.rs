//! DAQ-Middleware's standard components under the operator, each a process of its own: a
//! gatherer (its link a source) into a dispatcher that copies every chunk to a logger (a blocking output: nothing
//! dropped) and to a monitor that takes 10 ms per chunk (a sampling output: it takes what it
//! can, the dispatcher counts the drops), from a system file with `daqflow run`.

use std::path::Path;
use std::process::Command;

use daqflow_runcontrol::db::RunDb;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

fn system_file(data: &Path) -> String {
    format!(
        r#"[system]
name = "ports-test"
control = "127.0.0.1:0"
data = "{data}"
web = "none"

[[component]]
name = "log"
kind = "logger"
[component.params]
directory = "{files}"
sync_on_close = false

[[component]]
name = "mon"
kind = "chain_monitor"
[component.params]
work_us = 10000
socket_buffer_bytes = 65536

[[component]]
name = "dispatch"
kind = "dispatcher"
[component.params]
policy = "copy"
outputs = [
  {{ downstream = "${{log.listen}}", mode = "blocking" }},
  {{ downstream = "${{mon.listen}}", mode = "sampling", queue_bytes = 65536 }},
]

[[component]]
name = "gen"
kind = "gatherer"
[component.params]
downstream = "${{dispatch.listen}}"
inputs = [{{ kind = "source", chunk_bytes = 16384, rate_hz = 2000.0 }}]
"#,
        data = data.display(),
        files = data.join("files").display(),
    )
}

#[test]
fn a_slow_sampling_monitor_drops_and_the_blocking_logger_gets_every_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    std::fs::write(&file, system_file(&data)).unwrap();
    let check = Command::new(BIN).arg("run").arg(&file).arg("--check").output().unwrap();
    assert!(check.status.success(), "--check: {}", String::from_utf8_lossy(&check.stderr));
    let out = Command::new(BIN).arg("run").arg(&file).args(["--start", "--seconds", "2"]).output().unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "daqflow run failed:\n{text}");

    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let summary = db.run(1).unwrap().unwrap().summary.unwrap();
    let stats = |name: &str| summary.components[name].summary.clone().unwrap_or_else(|| panic!("{name}: {text}"));
    let (sent, dispatch, log, mon) = (stats("gen"), stats("dispatch"), stats("log"), stats("mon"));
    let d: &Value = &dispatch.detail;
    assert!(sent.events > 100, "{sent:?}");
    assert_eq!(dispatch.events, sent.events, "the dispatcher received every chunk: {d}");
    assert_eq!((d["end_seen"].as_bool(), d["error"].as_str()), (Some(true), None), "{d}");
    let (to_log, to_mon) = (&d["outputs"][0], &d["outputs"][1]);
    assert_eq!((to_log["passed"].as_u64(), to_log["dropped"].as_u64()), (Some(sent.events), Some(0)), "{d}");
    let (passed, dropped) = (to_mon["passed"].as_u64().unwrap(), to_mon["dropped"].as_u64().unwrap());
    assert!(dropped > 0, "the slow monitor's drops are counted: {d}");
    assert_eq!(passed + dropped, sent.events, "every chunk accounted for at the monitor's output: {d}");

    assert_eq!(log.events, sent.events, "the logger lost nothing: {log:?}");
    assert_eq!((log.detail["missing"].as_u64(), log.detail["sequence_errors"].as_u64()), (Some(0), Some(0)));
    let mut records = 0;
    for f in log.detail["files"].as_array().unwrap() {
        let mut r = daqflow_wire::file::FileReader::open(f["path"].as_str().unwrap()).unwrap();
        records += r.len().unwrap();
    }
    assert_eq!(records, sent.events, "every chunk is a record of the logger's files");

    assert_eq!(mon.events, passed, "the monitor looked at what it was given: {mon:?}");
    assert_eq!(mon.detail["end_seen"].as_bool(), Some(true), "the end marker was copied to the monitor too");
    assert_eq!(mon.detail["histograms"][0]["entries"].as_u64(), Some(passed));
}

/// The example of a chain component of one's own (`crates/chain/examples/threshold.rs`),
/// built into this build's target directory (`cargo test --workspace` has built it already).
fn threshold_example() -> std::path::PathBuf {
    let debug = Path::new(BIN).parent().unwrap();
    let exe = debug.join("examples").join("threshold");
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "daqflow-chain", "--example", "threshold"])
        .env("CARGO_TARGET_DIR", debug.parent().unwrap())
        .status()
        .unwrap();
    assert!(status.success() && exe.exists(), "building the example: {status}");
    exe
}

/// A generator into the example's typed input; its output `accepted` into a logger, `rejected`
/// into a sink. The generator's data begins with the bytes 0, 1: a first sample of 256.
fn user_component_system(data: &Path, example: &Path, threshold: u16) -> String {
    format!(
        r#"[system]
name = "ports-user-test"
control = "127.0.0.1:0"
data = "{data}"
web = "none"

[[component]]
name = "log"
kind = "logger"
[component.params]
directory = "{files}"
sync_on_close = false

[[component]]
name = "sink"
kind = "sink"

[[component]]
name = "cut"
kind = "threshold"
command = ["{example}"]
[component.params]
threshold = {threshold}
downstream.accepted = "${{log.listen}}"
downstream.rejected = "${{sink.listen}}"

[[component]]
name = "gen"
kind = "generator"
[component.params]
downstream = "${{cut.raw}}"
chunk_bytes = 1024
rate_hz = 1000.0
"#,
        data = data.display(),
        files = data.join("files").display(),
        example = example.display(),
    )
}

#[test]
fn a_component_written_in_rust_with_named_typed_ports_runs_under_the_operator() {
    let example = threshold_example();
    // 256 ≥ 200: every chunk to `accepted`; 256 < 300: every chunk to `rejected`.
    for (threshold, to_log) in [(200u16, true), (300, false)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let file = dir.path().join("system.toml");
        std::fs::write(&file, user_component_system(&data, &example, threshold)).unwrap();
        let out = Command::new(BIN).arg("run").arg(&file).args(["--start", "--seconds", "1"]).output().unwrap();
        let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "daqflow run failed:\n{text}");
        let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
        let summary = db.run(1).unwrap().unwrap().summary.unwrap();
        let stats = |name: &str| summary.components[name].summary.clone().unwrap_or_else(|| panic!("{name}: {text}"));
        let (sent, cut, log, sink) = (stats("gen"), stats("cut"), stats("log"), stats("sink"));
        assert!(sent.events > 50, "{sent:?}");
        assert_eq!(cut.events, sent.events, "the component received every chunk: {cut:?}");
        let (accepted, rejected) = if to_log { (sent.events, 0) } else { (0, sent.events) };
        assert_eq!(cut.detail["logic"], serde_json::json!({"accepted": accepted, "rejected": rejected}), "{cut:?}");
        assert_eq!((log.events, sink.events), (accepted, rejected));
        // Both outputs ended their streams: each receiver saw its end marker, nothing missing.
        for s in [&log, &sink] {
            assert_eq!((s.detail["end_seen"].as_bool(), s.detail["missing"].as_u64()), (Some(true), Some(0)), "{s:?}");
        }
    }
}
