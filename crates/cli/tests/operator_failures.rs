//! Components killed with SIGKILL during real operator runs (`daqflow run SYSTEM --start
//! --seconds N` on the demo's system): a dead component never falsifies the run record (the
//! printed summary and the run database agree with the files on disk), and a component
//! restarted by its policy never ends the run nor makes the live event counter go down.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Proc;
use daqflow_runcontrol::db::RunDb;
use daqflow_wire::file::FileReader;
use serde_json::Value;

/// One operator run at a time: each is a dozen processes on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The demo's system with every policy `policy`, the data in `data`.
fn demo_system(dir: &Path, policy: &str) -> PathBuf {
    let text = include_str!("../src/demo.toml")
        .replace("policy = \"restart\"", &format!("policy = \"{policy}\""))
        .replace("policy = \"stop\"", &format!("policy = \"{policy}\""));
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `daqflow run SYSTEM --start --seconds SECONDS` with its data in `data`, once its run started.
fn operator_run(system: &Path, data: &Path, seconds: u32) -> Proc {
    let seconds = seconds.to_string();
    let args = ["run", system.to_str().unwrap(), "--start", "--seconds", &seconds, "--web", "none", "--data"];
    let mut op = Proc::spawn(&[&args[..], &[data.to_str().unwrap()]].concat());
    op.expect("run 1 started");
    op
}

/// The pid of component `name` among the children of process `parent`.
fn component_pid(parent: u32, name: &str) -> Option<u32> {
    let want = format!("DAQFLOW_COMPONENT={name}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(after) = stat.rsplit_once(')').map(|(_, a)| a) else { continue };
        let ppid: Option<u32> = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid != Some(parent) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

fn kill_component(operator: &Proc, name: &str) {
    let pid = component_pid(operator.child.id(), name).unwrap_or_else(|| panic!("no process for {name}"));
    // SAFETY: kill(2) on a process the operator under test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// The `events` of a progress line (`… events 1234 (…`).
fn progress_events(line: &str) -> Option<u64> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == "events")?;
    words.next()?.parse().ok()
}

/// Reads every progress line until the events pass `n`; the events of each line.
fn wait_events(op: &mut Proc, n: u64, seen: &mut Vec<u64>) {
    loop {
        let line = op.next_line();
        if let Some(e) = progress_events(&line).filter(|_| line.contains(" s  ")) {
            seen.push(e);
            if e > n {
                return;
            }
        }
    }
}

/// Collects the rest of the operator's output until it exits; (exit code, stdout).
fn finish(mut op: Proc) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(s) = op.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(300));
            let out = op.drain();
            return (s.code().unwrap_or(-1), out);
        }
        assert!(Instant::now() < deadline, "the operator did not end: {}", op.drain());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A `name: N` count on a summary line (`  recorded:   123  (…`).
fn count(out: &str, label: &str) -> u64 {
    let line = out.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no {label}: {out}"));
    let rest = line.trim_start()[label.len()..].trim_start();
    rest.split_whitespace().next().and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// Every data file of run 1 on disk, with its whole events.
fn files_on_disk(data: &Path) -> Vec<(PathBuf, u64)> {
    let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(data.join("files"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("run000001_") && (n.ends_with(".daq") || n.ends_with(".daq.part"))
        })
        .map(|p| {
            let mut r = FileReader::open(&p).unwrap();
            let n = r.len().unwrap();
            (p, n)
        })
        .collect();
    out.sort();
    out
}

/// Run `run`'s record as the web API serves it, with its files beside.
fn record_json(db: &RunDb, run: u32) -> Value {
    let detail = db.run(run).unwrap().unwrap();
    let mut v = serde_json::to_value(&detail).unwrap();
    v["files"] = serde_json::to_value(&detail.summary.as_ref().unwrap().files).unwrap();
    v
}

fn run_and_kill(victim: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = demo_system(dir.path(), "stop");
    let mut op = operator_run(&system, &data, 60);
    wait_events(&mut op, 2000, &mut Vec::new());
    kill_component(&op, victim);
    let (code, out) = finish(op);
    assert_eq!(code, 1, "a failed run exits 1:\n{out}");
    assert!(!out.contains("null") && !out.contains("18446744073709551615"), "{out}");
    assert!(out.contains(&format!("died:       {victim} (signal: 9")), "{out}");

    // The files on disk are the truth.
    let files = files_on_disk(&data);
    let on_disk: u64 = files.iter().map(|(_, n)| n).sum();
    assert!(on_disk > 1000, "{files:?}\n{out}");
    let built = count(&out, "built:");
    let recorded = count(&out, "recorded:");
    assert_eq!(recorded, on_disk, "{out}");
    assert_eq!(count(&out, "files:"), files.len() as u64, "{out}");
    assert!(built >= 1000, "{out}");

    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let record = record_json(&db, 1);
    assert_eq!(record["state"], "failed", "{record}");
    assert!(record["error"].as_str().unwrap().contains(victim), "{record}");
    assert_eq!(record["events"].as_u64(), Some(built));
    assert_eq!(record["recorded"].as_u64(), Some(on_disk));
    let db_files: Vec<String> =
        record["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap().to_owned()).collect();
    let disk_files: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    assert_eq!(db_files, disk_files);
    let db_events: i64 = record["files"].as_array().unwrap().iter().map(|f| f["events"].as_i64().unwrap()).sum();
    assert_eq!(db_events as u64, on_disk);
    let (started, stopped) = (record["started_ms"].as_u64().unwrap(), record["stopped_ms"].as_u64().unwrap());
    assert!(stopped > started && stopped - started < 300_000, "duration {started} → {stopped}");
    let summary = &record["summary"];
    let seconds = summary["seconds"].as_f64().unwrap();
    assert!(seconds > 0.5 && seconds < 300.0, "{seconds}");

    // built = recorded − duplicates + losses counted; the lost line says what is not known.
    let lost = record["lost"].as_u64().unwrap();
    let n = |k: &str| summary[k].as_u64().unwrap_or_else(|| panic!("{k} in {summary}"));
    assert_eq!(built + n("duplicates"), recorded + n("not_recorded"), "{summary}");
    let reasons: u64 = summary["lost_reasons"].as_array().unwrap().iter().map(|r| r["events"].as_u64().unwrap()).sum();
    assert_eq!(reasons, lost, "{summary}");
    if victim == "evm" {
        assert!(out.contains(&format!("lost: at least {lost} (more cannot be known")), "{out}");
        assert!(out.lines().any(|l| l.starts_with("  unknown:") && l.contains("`evm` died")), "{out}");
        assert_eq!(summary["accounting_complete"], false);
    } else {
        assert!(out.lines().any(|l| l == format!("lost: {lost}")), "{out}");
        assert_eq!(summary["accounting_complete"], true, "{summary}");
        assert_eq!(n("triggered"), built + n("rejected") + n("lost_in_builder"), "{summary}");
        assert_eq!(lost, n("lost_in_builder") + n("not_recorded"), "{summary}");
    }
}

#[test]
fn a_source_killed_in_a_run_leaves_a_record_that_agrees_with_the_files() {
    run_and_kill("src-0");
}

#[test]
fn a_readout_unit_killed_in_a_run_leaves_a_record_that_agrees_with_the_files() {
    run_and_kill("ru-0");
}

#[test]
fn the_event_manager_killed_in_a_run_leaves_a_record_that_says_what_cannot_be_known() {
    run_and_kill("evm");
}

#[test]
fn the_et_system_killed_in_a_run_leaves_a_record_that_agrees_with_the_files() {
    run_and_kill("et");
}

#[test]
fn the_recorder_killed_in_a_run_leaves_a_record_that_agrees_with_the_files() {
    run_and_kill("recorder");
}

#[test]
fn restarted_components_rejoin_the_run_and_the_event_counter_never_goes_down() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = demo_system(dir.path(), "restart");
    let mut op = operator_run(&system, &data, 22);
    let mut seen = Vec::new();
    wait_events(&mut op, 2000, &mut seen);
    kill_component(&op, "recorder");
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    kill_component(&op, "monitor");
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    kill_component(&op, "bu-0");
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    let (code, out) = finish(op);
    // Every progress line of the run (those read above included).
    let seen: Vec<u64> = out.lines().filter(|l| l.contains(" s  ")).filter_map(progress_events).collect();
    assert!(seen.len() >= 15, "{out}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "the event counter went down: {seen:?}");
    assert!(!out.contains("ended by itself"), "{out}");
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let record = record_json(&db, 1);
    assert_eq!(record["state"], "stopped", "{record}");
    let summary: &Value = &record["summary"];
    for name in ["recorder", "monitor", "bu-0"] {
        assert_eq!(summary["components"][name]["earlier_lives"], 1, "{name} was not restarted in the run: {summary}");
    }
    // The restarted recorder went on in the same run, in a new stream.
    let files = files_on_disk(&data);
    assert!(files.iter().any(|(p, n)| p.to_string_lossy().contains("recorder.r1_") && *n > 0), "{files:?}");
    let on_disk: u64 = files.iter().map(|(_, n)| n).sum();
    assert_eq!(record["recorded"].as_u64(), Some(on_disk));
    assert!(on_disk >= record["events"].as_u64().unwrap(), "{record}");
}

#[test]
fn a_builder_unit_frozen_for_ten_seconds_never_ends_the_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The demo's own policies: the BUs restart, the rest stops the run.
    let system = dir.path().join("system.toml");
    std::fs::write(&system, include_str!("../src/demo.toml")).unwrap();
    let mut op = operator_run(&system, &data, 20);
    let mut seen = Vec::new();
    wait_events(&mut op, 2000, &mut seen);
    let pid = component_pid(op.child.id(), "bu-0").expect("bu-0");
    // SAFETY: kill(2) on a process the operator under test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    // Frozen: the EVM gives its events to bu-1, the operator's watchdog kills it and starts a
    // new bu-0. The run goes on all along.
    let frozen_at = *seen.last().unwrap();
    wait_events(&mut op, frozen_at + 5000, &mut seen);
    std::thread::sleep(Duration::from_secs(7)); // about 10 s frozen in all
    // SAFETY: as above (the process may be gone by now: then this does nothing).
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    let (code, out) = finish(op);
    assert!(!out.contains("ended by itself"), "{out}");
    assert!(!out.contains("stream cut"), "{out}");
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let record = record_json(&db, 1);
    assert_eq!(record["state"], "stopped", "{record}");
    let on_disk: u64 = files_on_disk(&data).iter().map(|(_, n)| n).sum();
    assert_eq!(record["recorded"].as_u64(), Some(on_disk));
}

/// The demo's system for degraded running: the monitor expendable, the builder units a group
/// of which the run needs one (each under the stop policy), the recorder restarted once.
fn degraded_system(dir: &Path) -> PathBuf {
    let text = include_str!("../src/demo.toml")
        .replace("policy = \"stop\" ", "policy = \"stop\"\nrestart_max = 1\nrestart_backoff_s = 0.5\n")
        .replace(
            "name = \"monitor\"\nkind = \"monitor\"\npolicy = \"restart\"",
            "name = \"monitor\"\nkind = \"monitor\"\npolicy = \"expendable\"",
        )
        .replace(
            "name = \"bu-0\"\nkind = \"bu\"\npolicy = \"restart\"",
            "name = \"bu-0\"\nkind = \"bu\"\npolicy = \"stop\"",
        )
        .replace(
            "name = \"bu-1\"\nkind = \"bu\"\npolicy = \"restart\"",
            "name = \"bu-1\"\nkind = \"bu\"\npolicy = \"stop\"",
        )
        + "\n[[group]]\nname = \"builders\"\nmembers = [\"bu-0\", \"bu-1\"]\nmin = 1\n";
    assert!(text.contains("restart_max = 1") && text.contains("policy = \"expendable\""), "the demo's file changed");
    assert_eq!(text.matches("kind = \"bu\"\npolicy = \"stop\"").count(), 2, "the demo's file changed");
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_degraded_run_goes_on_without_expendable_components_and_group_members_above_the_minimum() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = degraded_system(dir.path());
    let mut op = operator_run(&system, &data, 20);
    let mut seen = Vec::new();
    wait_events(&mut op, 2000, &mut seen);
    kill_component(&op, "monitor"); // expendable
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    kill_component(&op, "bu-0"); // its group keeps bu-1
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    kill_component(&op, "recorder"); // its one restart
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    let (code, out) = finish(op);
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    assert!(out.contains("went on without bu-0: signal: 9 (SIGKILL) (group `builders` keeps 1 of 2 members"), "{out}");
    assert!(out.contains("went on without monitor: signal: 9 (SIGKILL) (expendable)"), "{out}");
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let record = record_json(&db, 1);
    assert_eq!(record["state"], "stopped", "{record}");
    assert_eq!(record["lost"], 0, "{record}");
    let summary = &record["summary"];
    assert_eq!(summary["degraded"].as_array().map(Vec::len), Some(2), "{summary}");
    assert_eq!(summary["components"]["recorder"]["earlier_lives"], 1, "{summary}");
    let on_disk: u64 = files_on_disk(&data).iter().map(|(_, n)| n).sum();
    assert_eq!(record["recorded"].as_u64(), Some(on_disk));
}

#[test]
fn a_group_below_its_minimum_or_a_restart_past_its_cap_stops_the_run_and_says_why() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = degraded_system(dir.path());
    // Both builder units: the group is left with none.
    let mut op = operator_run(&system, &data, 60);
    let mut seen = Vec::new();
    wait_events(&mut op, 2000, &mut seen);
    kill_component(&op, "bu-0");
    wait_events(&mut op, seen.last().unwrap() + 2000, &mut seen);
    kill_component(&op, "bu-1");
    let (code, out) = finish(op);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("group `builders` has 0 of its 2 members left, fewer than its minimum 1"), "{out}");
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let record = record_json(&db, 1);
    assert_eq!(record["state"], "failed", "{record}");
    let on_disk: u64 = files_on_disk(&data).iter().map(|(_, n)| n).sum();
    assert_eq!(record["recorded"].as_u64(), Some(on_disk), "{record}");
    // Every event the trigger gave is built or counted lost, with a reason.
    let summary = &record["summary"];
    let reasons: u64 = summary["lost_reasons"].as_array().unwrap().iter().map(|r| r["events"].as_u64().unwrap()).sum();
    assert_eq!(record["lost"].as_u64(), Some(reasons), "{summary}");

    // The recorder killed twice in another run: its one restart, then the cap.
    let data = dir.path().join("data2");
    let mut op = operator_run(&system, &data, 60);
    let mut seen = Vec::new();
    wait_events(&mut op, 2000, &mut seen);
    kill_component(&op, "recorder");
    wait_events(&mut op, seen.last().unwrap() + 3000, &mut seen);
    kill_component(&op, "recorder");
    let (code, out) = finish(op);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("recorder failed: signal: 9 (SIGKILL); not restarted again: 1 restarts, the cap"), "{out}");
}
