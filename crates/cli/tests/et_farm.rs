//! A farm of recorders on one parallel ET station group, declared in the system file
//! (`group = "farm"` on each recorder), run by the operator with real processes: sources → RU →
//! BU → ET → three recorders, each event to one of them. One recorder is frozen in the middle of
//! the run (its station fills with its share) and killed with SIGKILL; the events it held and
//! those waiting in its station go to the other two, and its share from then on too. At the end every event id of the run is in the files,
//! the only events in two files are among those the dead recorder had written and not given back,
//! and the run's record counts exactly those as `duplicates`, with nothing lost.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Proc;
use daqflow_runcontrol::db::RunDb;
use daqflow_wire::file::{FileReader, ScanItem};

const MEMBERS: [&str; 3] = ["rec-0", "rec-1", "rec-2"];

/// The farm's system file: the recorders in one ET group (`policy`: the group's policy) and in
/// one operator group that needs two of them, so that the run goes on without a dead one.
fn farm_system(dir: &Path, policy: &str) -> PathBuf {
    let mut text = String::from(
        r#"[system]
name = "farm"
control = "127.0.0.1:0"
policy = "stop"
timeout_s = 20
stop_timeout_s = 60

[[component]]
name = "et"
kind = "et"
[component.params]
name = "${system.id}-et"
events = 256
event_size = 16384
"#,
    );
    for m in MEMBERS {
        text += &format!(
            r#"
[[component]]
name = "{m}"
kind = "recorder"
[component.params]
et = "${{et.et}}"
directory = "${{system.data}}/files"
group = "farm"
group_policy = "{policy}"
batch = 20
"#
        );
    }
    text += r#"
[[group]]
name = "recorders"
members = ["rec-0", "rec-1", "rec-2"]
min = 2

[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1

[[component]]
name = "bu-0"
kind = "bu"
[component.params]
id = 0
evm = "${evm.listen}"
output = "et"
et = "${et.et}"

[[component]]
name = "ru-0"
kind = "ru"
[component.params]
id = 0
evm = "${evm.listen}"
streams = 2
"#;
    for s in 0..2 {
        text += &format!(
            r#"
[[component]]
name = "src-{s}"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = {s}
ru = "${{ru-0.listen}}"
rate_hz = 1500.0
size = {{ kind = "lognormal", mean = 1024.0, rms = 256.0 }}
"#
        );
    }
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    path
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

/// The `events` of a progress line (`… events 1234 (…`).
fn progress_events(line: &str) -> Option<u64> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == "events")?;
    words.next()?.parse().ok()
}

/// Reads progress lines until the events built pass `n`.
fn wait_events(op: &mut Proc, n: u64) {
    loop {
        let line = op.next_line();
        if progress_events(&line).filter(|_| line.contains(" s  ")).is_some_and(|e| e > n) {
            return;
        }
    }
}

/// Collects the rest of the operator's output until it exits; (exit code, stdout).
fn finish(mut op: Proc) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if let Some(s) = op.child.try_wait().unwrap() {
            std::thread::sleep(Duration::from_millis(300));
            return (s.code().unwrap_or(-1), op.drain());
        }
        assert!(Instant::now() < deadline, "the operator did not end: {}", op.drain());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The event ids in each recorder's files of run 1 (closed, or `.part` left by the dead one),
/// every file checked: whole events only.
fn ids_by_recorder(files: &Path) -> BTreeMap<String, Vec<u64>> {
    let mut by: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for entry in std::fs::read_dir(files).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("run000001_") || !(name.ends_with(".daq") || name.ends_with(".daq.part")) {
            continue;
        }
        let member = MEMBERS
            .iter()
            .find(|m| name.starts_with(&format!("run000001_{m}_")) || name.starts_with(&format!("run000001_{m}.r")))
            .unwrap_or_else(|| panic!("{name}: a file of no farm member"));
        let reader = FileReader::open(&path).unwrap();
        let report = reader.verify(true).unwrap();
        assert!(report.problems.is_empty() && report.cut_short.is_none(), "{name}: {report:?}");
        let ids = by.entry((*member).to_owned()).or_default();
        for item in reader.scan() {
            if let Ok(ScanItem::Record(r)) = item {
                ids.push(r.event_id.0);
            }
        }
    }
    by
}

#[test]
fn a_farm_member_killed_mid_run_leaves_its_events_to_the_others_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = farm_system(dir.path(), "round_robin");
    let check = common::Proc::spawn(&["run", system.to_str().unwrap(), "--check"]).wait_exit();
    assert_eq!(check, 0, "the farm's system file passes --check");
    let args = ["run", system.to_str().unwrap(), "--start", "--seconds", "12", "--web", "none", "--data"];
    let mut op = Proc::spawn(&[&args[..], &[data.to_str().unwrap()]].concat());
    op.expect("run 1 started");
    wait_events(&mut op, 3000);
    let pid = component_pid(op.child.id(), "rec-1").expect("rec-1 runs") as i32;
    // Frozen first, so that its station fills with its share (the builder then waits on ET's
    // back-pressure), then killed: its backlog, and whatever it held, must reach the others.
    // SAFETY: kill(2) on a process the operator under test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let (code, out) = finish(op);
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    assert!(out.contains("went on without rec-1: signal: 9 (SIGKILL) (group `recorders` keeps 2 of 3"), "{out}");

    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let summary = db.run(1).unwrap().unwrap().summary.expect("run 1 has a summary");
    assert_eq!((summary.lost, summary.not_recorded), (0, 0), "{:?}", summary.lost_reasons);
    assert_eq!(summary.triggered, Some(summary.events), "{summary:?}");
    assert!(summary.events > 6000, "the run went on after the kill: {summary:?}");

    let by = ids_by_recorder(&data.join("files"));
    let count = |m: &str| by.get(m).map_or(0, Vec::len);
    // Every member recorded, the dead one until it died, the others all along.
    assert!(MEMBERS.iter().all(|m| count(m) > 0), "{:?}", by.iter().map(|(m, v)| (m, v.len())).collect::<Vec<_>>());
    // Every event of the run is in the files at least once.
    let mut times: BTreeMap<u64, u32> = BTreeMap::new();
    for ids in by.values() {
        for id in ids {
            *times.entry(*id).or_default() += 1;
        }
    }
    let missing: Vec<u64> = (1..=summary.events).filter(|i| !times.contains_key(i)).take(10).collect();
    assert!(missing.is_empty(), "events in no file: {missing:?} … of {}", summary.events);
    assert_eq!(times.keys().next_back().copied(), Some(summary.events), "no event beyond the run's");
    // The events in two files: each once in the dead member's files and once in another's,
    // at most what it held (one batch of 20), and exactly the run record's duplicates.
    let twice: Vec<u64> = times.iter().filter(|(_, n)| **n > 1).map(|(i, _)| *i).collect();
    assert!(times.values().all(|n| *n <= 2), "an event in three files");
    let dead: std::collections::BTreeSet<u64> = by["rec-1"].iter().copied().collect();
    assert!(twice.iter().all(|i| dead.contains(i)), "a duplicate the dead member did not write: {twice:?}");
    assert!(twice.len() <= 20, "more duplicates than the dead member held: {twice:?}");
    assert_eq!(summary.duplicates, twice.len() as u64, "{summary:?}");
    // The events the dead member held reached the survivors flagged possibly corrupt, and the
    // record counts them in their summaries: every duplicate among them.
    let corrupt: u64 = ["rec-0", "rec-2"]
        .iter()
        .map(|m| {
            let s = summary.components[*m].summary.as_ref().unwrap_or_else(|| panic!("{m} gave no summary"));
            s.detail["possibly_corrupt"].as_u64().unwrap_or_else(|| panic!("{m}: {:?}", s.detail))
        })
        .sum();
    assert!(twice.len() as u64 <= corrupt && corrupt <= 20, "{} duplicates, {corrupt} flagged", twice.len());
    assert_eq!(summary.recorded, summary.events + summary.duplicates, "{summary:?}");
    // After the kill the survivors took rec-1's share: together they recorded more than two
    // thirds of the run.
    assert!(
        count("rec-0") + count("rec-2") > (summary.events as usize) * 2 / 3 + 500,
        "{} + {} of {}",
        count("rec-0"),
        count("rec-2"),
        summary.events
    );
    eprintln!(
        "farm: {} events, rec-0 {}, rec-1 {} (killed), rec-2 {}, {} in two files, {corrupt} flagged",
        summary.events,
        count("rec-0"),
        count("rec-1"),
        count("rec-2"),
        twice.len()
    );
}
