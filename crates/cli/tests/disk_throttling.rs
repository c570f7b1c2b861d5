//! Disk throttling with real processes through the operator, on a small tmpfs the test mounts
//! for the data files: a recorder (and a builder unit writing files) whose disk goes above its
//! high water mark stops taking events (counted and shown), the builder's rate falls to zero,
//! and it resumes once the disk is below its low mark, with nothing lost; a disk that never
//! frees up stops the run as `disk full`, producers first, losing nothing (behind a recorder,
//! what is in flight drains into the disk's reserve above the high mark); a disk that fills
//! with no throttling margin makes the writer fail with an error naming the disk, and the run's
//! accounting holds every event (built = recorded + counted lost), with no partial event in
//! the file. A recorder restarted on a full disk leaves only readable data files; a data
//! directory that fills during a run leaves a record the next operator finishes, saying why;
//! the run database's shared-memory file made immutable does not kill the operator (SIGBUS).
//!
//! Mounting needs root: as another user the test runs itself again in a user and mount
//! namespace (`unshare --user --map-root-user --mount`), and is skipped with the reason printed
//! when that is not possible either.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_api::{RunState, RunSummary, SystemState};
use daqflow_runcontrol::db::{Location, RunDb};
use daqflow_runcontrol::operator::{Operator, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use daqflow_wire::file::FileReader;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// One operator at a time: each is a dozen processes on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Set in the test's own run inside a user and mount namespace.
const IN_NAMESPACE: &str = "DAQFLOW_TEST_IN_MOUNT_NAMESPACE";

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted when dropped (on a panic too).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0755"), "daqflow-test"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Whether this process may mount: root, or the test's own run in a namespace. Otherwise the
/// test `name` is run again under `unshare` (its result is this run's), or skipped with the
/// reason printed; false then.
fn may_mount(name: &str) -> bool {
    // SAFETY: geteuid(2) has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } == 0 || std::env::var_os(IN_NAMESPACE).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(IN_NAMESPACE, "1")
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        // The test ran in the namespace and failed.
        Ok(o) if o.status.code() == Some(101) => panic!(
            "{name} in a user and mount namespace:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(o) => println!(
            "skipped {name}: not root, and no user and mount namespace to mount a tmpfs in ({})",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => println!("skipped {name}: not root, and `unshare` cannot run ({e})"),
    }
    false
}

/// A writer's keys for files in `dir`, throttled above 50 % and resuming below 40 %, the disk
/// read every 50 ms.
fn half_marks(dir: &Path) -> String {
    format!("directory = \"{}\"\nthrottle_high_pct = 50\nthrottle_low_pct = 40\nthrottle_check_ms = 50", dir.display())
}

/// Writes a ballast file of `mib` MiB into `dir`.
fn ballast(dir: &Path, mib: usize) -> PathBuf {
    let path = dir.join("ballast");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    path
}

/// Sources → RU → BU → ET → recorder (`recorder` params `recorder`), or, with `bu_files`, the
/// BU writing its own files (params `bu_files`) and no ET system.
fn system(data: &Path, writer: Writer<'_>) -> SystemFile {
    system_with(data, writer, "")
}

/// [`system`] with more `[system]` keys (TOML lines).
fn system_with(data: &Path, writer: Writer<'_>, more: &str) -> SystemFile {
    let text = system_text(data, writer, more);
    SystemFile::parse(&text, &daqflow::registry::standard()).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The text of [`system_with`]'s system file.
fn system_text(data: &Path, writer: Writer<'_>, more: &str) -> String {
    let (et, recorder, bu_output) = match writer {
        Writer::Recorder(params) | Writer::RestartingRecorder(params) => (
            r#"
[[component]]
name = "et"
kind = "et"
[component.params]
name = "${system.id}-et"
events = 64
event_size = 16384
"#,
            format!(
                r#"
[[component]]
name = "recorder"
kind = "recorder"
{policy}
[component.params]
et = "${{et.et}}"
{params}
"#,
                policy = if matches!(writer, Writer::RestartingRecorder(_)) { "policy = \"restart\"" } else { "" }
            ),
            "output = \"et\"\net = \"${et.et}\"".to_owned(),
        ),
        Writer::Bu(params) => ("", String::new(), format!("output = \"files\"\n{params}")),
    };
    format!(
        r#"[system]
name = "disk"
control = "127.0.0.1:0"
data = "{data}"
timeout_s = 20
stop_timeout_s = 60
policy = "stop"
restart_backoff_s = 0.2
{more}
{et}{recorder}
[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1
drain_timeout_ms = 3000

[[component]]
name = "bu-0"
kind = "bu"
[component.params]
id = 0
evm = "${{evm.listen}}"
credits = 64
request_batch = 8
end_timeout_ms = 10000
{bu_output}

[[component]]
name = "ru-0"
kind = "ru"
[component.params]
id = 0
evm = "${{evm.listen}}"
streams = 2

[[component]]
name = "src-0"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 0
ru = "${{ru-0.listen}}"
rate_hz = 400.0
size = {{ kind = "lognormal", mean = 2048.0, rms = 256.0 }}

[[component]]
name = "src-1"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 1
ru = "${{ru-0.listen}}"
rate_hz = 400.0
size = {{ kind = "lognormal", mean = 2048.0, rms = 256.0 }}
"#,
        data = data.display()
    )
}

/// Which component writes the files, with its parameters (TOML lines).
enum Writer<'a> {
    Recorder(&'a str),
    /// The recorder, with policy `restart`.
    RestartingRecorder(&'a str),
    Bu(&'a str),
}

fn status(op: &Operator) -> Value {
    serde_json::to_value(op.status()).unwrap()
}

/// Component `name`'s live statistics.
fn stats(op: &Operator, name: &str) -> Value {
    let st = status(op);
    st["components"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()["stats"].clone()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The run's events built (the EVM's count) and how they change over `over`.
fn built_over(op: &Operator, over: Duration) -> (u64, u64) {
    let before = op.status().events;
    std::thread::sleep(over);
    (before, op.status().events)
}

/// Throttles on a ballast above the high mark, resumes once it is deleted; nothing lost.
/// `writer` is the component that writes into the tmpfs, `count` its events counter.
fn throttles_and_resumes(writer: &str, data: &Path, files: &Tmpfs, make: impl Fn(&Path) -> SystemFile) {
    let op = Operator::launch(OperatorOptions::new(make(data), BIN.into())).unwrap_or_else(|e| panic!("launch: {e}"));
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events written", Duration::from_secs(30), || stats(&op, writer)["events"].as_u64() > Some(300));
    assert_eq!(stats(&op, writer)["detail"]["throttled"], false, "throttled before the disk filled");

    // 40 MiB of 64: above the high mark of 50 %.
    let ballast = ballast(files.path(), 40);
    wait_until("the writer to throttle", Duration::from_secs(10), || stats(&op, writer)["detail"]["throttled"] == true);
    let s = stats(&op, writer);
    assert_eq!(s["detail"]["throttle_count"], 1, "{s}");
    assert!(s["detail"]["disk_used_pct"].as_f64().unwrap() > 50.0, "{s}");
    assert!(s["detail"]["disk_free_bytes"].as_u64().unwrap() < 32 << 20, "{s}");
    // The writer takes nothing more, and back-pressure stops the builder: its rate goes to zero.
    wait_until("the builder to stop", Duration::from_secs(15), || {
        let (a, b) = built_over(&op, Duration::from_millis(700));
        a == b
    });
    let written = stats(&op, writer)["events"].as_u64().unwrap();
    let (a, b) = built_over(&op, Duration::from_millis(1500));
    assert_eq!(a, b, "events were built while the writer was throttled");
    assert_eq!(stats(&op, writer)["events"].as_u64().unwrap(), written, "written while throttled");
    assert_eq!(op.state(), SystemState::Running);

    // Below the low mark again: it resumes.
    std::fs::remove_file(&ballast).unwrap();
    wait_until("the writer to resume", Duration::from_secs(10), || stats(&op, writer)["detail"]["throttled"] == false);
    wait_until("events written again", Duration::from_secs(15), || {
        stats(&op, writer)["events"].as_u64().unwrap() > written + 300
    });
    let summary = op.stop().unwrap();
    op.shutdown();
    assert_eq!(summary.state, RunState::Stopped, "{summary:?}");
    assert_eq!(summary.lost, 0, "{:?}", summary.lost_reasons);
    let detail = &summary.components[writer].summary.as_ref().unwrap().detail;
    assert_eq!(detail["throttle_count"], 1, "{detail}");
    assert_eq!(detail["throttled"], false, "{detail}");
    assert!(detail["throttled_s"].as_f64().unwrap() > 2.0, "{detail}");
    // Each throttle and each resume is a warning in the component's log.
    let log = std::fs::read_to_string(data.join("logs").join(format!("{writer}.log"))).unwrap();
    let warned = |text: &str| log.lines().filter(|l| l.contains("WARN") && l.contains(text)).count();
    assert_eq!(warned("disk throttling: the filesystem of"), 1, "{log}");
    assert_eq!(warned("disk throttling ended"), 1, "{log}");
}

#[test]
fn a_recorder_whose_disk_fills_throttles_and_resumes_without_losing_events() {
    let name = "a_recorder_whose_disk_fills_throttles_and_resumes_without_losing_events";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(64).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let params = half_marks(files.path());
    throttles_and_resumes("recorder", dir.path(), &files, |data| system(data, Writer::Recorder(&params)));
    // Every event of the run is in the recorder's files.
    let on_disk = whole_events(files.path());
    assert!(on_disk > 600, "{on_disk}");
}

/// `daqflow run` in a terminal: the progress line's `recorded` stops while the recorder is
/// throttled, and a line says why when it begins and when it ends.
#[test]
fn the_terminal_says_when_a_recorder_is_throttled_by_its_disk_and_when_it_takes_events_again() {
    let name = "the_terminal_says_when_a_recorder_is_throttled_by_its_disk_and_when_it_takes_events_again";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(64).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let params = half_marks(files.path());
    let path = dir.path().join("system.toml");
    std::fs::write(&path, system_text(&dir.path().join("data"), Writer::Recorder(&params), "")).unwrap();
    // 40 MiB of 64 from the start: throttled at once.
    let ballast = ballast(files.path(), 40);
    let mut op = Command::new(BIN)
        .arg("run")
        .arg(&path)
        .args(["--start", "--seconds", "8", "--web", "none"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(op.stdout.take().unwrap()));
    let mut seen = Vec::new();
    let mut removed = false;
    for line in lines {
        let line = line.unwrap();
        if !removed && line.contains("recorder takes no events") {
            std::fs::remove_file(&ballast).unwrap();
            removed = true;
        }
        seen.push(line);
    }
    assert!(op.wait().unwrap().success(), "{seen:#?}");
    let text = seen.join("\n");
    let throttled = seen.iter().position(|l| {
        l.starts_with("  recorder takes no events: the disk of its files is above its throttle_high_pct (")
    });
    let again =
        seen.iter().position(|l| l.starts_with("  recorder takes events again: its disk is below throttle_low_pct ("));
    assert!(throttled.is_some() && again.is_some() && throttled < again, "{text}");
    assert_eq!(seen.iter().filter(|l| l.contains("takes no events")).count(), 1, "said once: {text}");
    assert!(seen.iter().any(|l| l == "lost: 0"), "{text}");
}

#[test]
fn a_builder_unit_whose_disk_fills_stops_asking_for_events_and_resumes() {
    let name = "a_builder_unit_whose_disk_fills_stops_asking_for_events_and_resumes";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(64).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let params = half_marks(files.path());
    throttles_and_resumes("bu-0", dir.path(), &files, |data| system(data, Writer::Bu(&params)));
}

/// Writes a ballast file `name` of `kib` KiB into `dir`.
fn ballast_kib(dir: &Path, name: &str, kib: usize) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5au8; 1024];
    for _ in 0..kib {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    path
}

/// Usage of the filesystem holding `dir` (percent), as the writers read it.
fn used_pct(dir: &Path) -> f64 {
    daqflow_wire::file::DiskSpace::of(dir).unwrap().used_pct()
}

/// A writer on a 24 MiB disk that frees up a little, while it has a backlog and reads the disk
/// only every 5 s: between two readings it could write far more than the disk has (about
/// 1.6 MB/s, the room to 100 % 4 MiB), so only the bytes it counts itself keep it at its high
/// mark. It resumes, writes up to the high mark, throttles at once, and resumes again when the
/// disk frees up for good: no ENOSPC, no restart, nothing lost.
fn holds_its_high_mark_on_a_small_disk(writer: &str, make: impl Fn(&Path, &str) -> SystemFile) {
    let files = Tmpfs::mount(24).unwrap_or_else(|e| panic!("{e}"));
    // 22.5 MiB of 24 (94 %): above the high mark of 90 % from the start.
    let first = ballast_kib(files.path(), "ballast-1", 20 * 1024);
    let second = ballast_kib(files.path(), "ballast-2", 2560);
    assert!(used_pct(files.path()) > 90.0, "{}", used_pct(files.path()));
    let dir = tempfile::tempdir().unwrap();
    let params = format!(
        "directory = \"{}\"\nthrottle_high_pct = 90\nthrottle_low_pct = 85\nthrottle_check_ms = 5000",
        files.path().display()
    );
    let op = Operator::launch(OperatorOptions::new(make(dir.path(), &params), BIN.into()))
        .unwrap_or_else(|e| panic!("launch: {e}"));
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("the writer to throttle from the start", Duration::from_secs(10), || {
        stats(&op, writer)["detail"]["throttled"] == true
    });
    // A backlog waits for it (the builder is held), then the disk frees up a little: 83 %,
    // below the low mark.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(stats(&op, writer)["events"], 0, "written while throttled");
    std::fs::remove_file(&second).unwrap();
    let component = |op: &Operator| {
        status(op)["components"].as_array().unwrap().iter().find(|c| c["name"] == writer).unwrap().clone()
    };
    let mut peak = 0f64;
    wait_until("the writer to resume and throttle again at its high mark", Duration::from_secs(30), || {
        peak = peak.max(used_pct(files.path()));
        let c = component(&op);
        assert!(c["error"].is_null() && c["state"] != "Error", "the writer failed: {c}");
        assert!(op.run_open(), "the run ended: {}", status(&op));
        c["stats"]["detail"]["throttle_count"].as_u64() >= Some(2) && c["stats"]["detail"]["throttled"] == true
    });
    let written = stats(&op, writer)["events"].as_u64().unwrap();
    assert!(written > 0, "nothing written between the two throttles");
    for _ in 0..20 {
        peak = peak.max(used_pct(files.path()));
        std::thread::sleep(Duration::from_millis(50));
    }
    // The high mark holds (the file's last page and the run's metadata aside).
    assert!(peak <= 90.5, "the disk went to {peak:.1} % used, above the high mark of 90 %");
    // The disk frees up for good: it resumes and writes its backlog.
    std::fs::remove_file(&first).unwrap();
    wait_until("the writer to resume", Duration::from_secs(15), || stats(&op, writer)["detail"]["throttled"] == false);
    wait_until("events written again", Duration::from_secs(15), || {
        stats(&op, writer)["events"].as_u64().unwrap() > written + 300
    });
    let summary = op.stop().unwrap();
    let c = component(&op);
    op.shutdown();
    assert_eq!(summary.state, RunState::Stopped, "{summary:?}");
    assert_eq!(summary.lost, 0, "{:?}", summary.lost_reasons);
    assert_eq!(c["restarts"], 0, "{c}");
    let log = std::fs::read_to_string(dir.path().join("logs").join(format!("{writer}.log"))).unwrap();
    assert!(!log.contains("No space left on device"), "{log}");
    let estimated = log.lines().filter(|l| l.contains("WARN") && l.contains("by its estimate")).count();
    assert!(estimated >= 1, "no throttle by the estimate in the log:\n{log}");
    let on_disk = whole_events(files.path());
    assert!(on_disk >= summary.events, "{on_disk} on disk, {} built: {summary:?}", summary.events);
}

#[test]
fn a_recorder_on_a_small_disk_that_frees_up_holds_its_high_mark_between_readings() {
    let name = "a_recorder_on_a_small_disk_that_frees_up_holds_its_high_mark_between_readings";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    holds_its_high_mark_on_a_small_disk("recorder", |data, params| system(data, Writer::Recorder(params)));
}

#[test]
fn a_builder_unit_on_a_small_disk_that_frees_up_holds_its_high_mark_between_readings() {
    let name = "a_builder_unit_on_a_small_disk_that_frees_up_holds_its_high_mark_between_readings";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    holds_its_high_mark_on_a_small_disk("bu-0", |data, params| system(data, Writer::Bu(params)));
}

/// A writer whose disk fills and never frees up: throttled for longer than
/// `disk_full_stop_s`, the operator stops the run (producers first), and the run's record says
/// `disk full`, naming the writer and its directory. The BU's own disk holds back only events
/// not yet asked for: nothing is lost. A recorder is told to drain into its disk's reserve
/// (the space above its high mark) before the producers stop: the events already built and
/// held back by ET's back-pressure go there, and nothing is lost either.
/// The run's summary and the whole events in the data files.
fn stops_the_run_when_the_disk_never_frees_up(
    writer: &str,
    make: impl Fn(&Path, &str) -> SystemFile,
) -> (RunSummary, u64) {
    let files = Tmpfs::mount(24).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let params = half_marks(files.path());
    let op = Operator::launch(OperatorOptions::new(make(dir.path(), &params), BIN.into()))
        .unwrap_or_else(|e| panic!("launch: {e}"));
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events written", Duration::from_secs(30), || stats(&op, writer)["events"].as_u64() > Some(300));
    // 12 MiB more of 24 (about 57 % used with the files): above the high mark of 50 % for
    // good, and half the reserve above it (up to 75 %, 4 MiB) holds what is in flight towards
    // a recorder (ET's 64 events and the builder unit's, about 4 KiB each).
    ballast(files.path(), 12);
    let deadline = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        if !op.run_open()
            && let Some(s) = op.last_summary()
        {
            break s;
        }
        assert!(Instant::now() < deadline, "the run did not stop: {}", status(&op));
        std::thread::sleep(Duration::from_millis(100));
    };
    let record = op.db().run(summary.run).unwrap().expect("the run's record");
    op.shutdown();
    println!("error: {:?}\nlost: {:?}", summary.error, summary.lost_reasons);
    assert_eq!(summary.state, RunState::Failed, "{summary:?}");
    let error = summary.errors.first().cloned().unwrap_or_default();
    let expected = format!("disk full: `{writer}` was throttled by the filesystem of {}", files.path().display());
    assert!(error.starts_with(&expected), "{:?}", summary.errors);
    assert!(error.contains("disk_full_stop_s = 3") && error.contains("producers first"), "{error}");
    assert_eq!(record.record.error, summary.error, "the run database keeps it");
    assert_eq!(record.record.state, RunState::Failed);
    assert!(summary.events > 300, "{summary:?}");
    assert_eq!(summary.lost, summary.lost_reasons.iter().map(|r| r.events).sum::<u64>(), "{summary:?}");
    assert!(summary.accounting_complete, "{summary:?}");
    let on_disk = whole_events(files.path());
    assert!(on_disk >= summary.recorded, "{on_disk} on disk: {summary:?}");
    (summary, on_disk)
}

#[test]
fn a_builder_unit_whose_disk_never_frees_up_stops_the_run_as_disk_full_losing_nothing() {
    let name = "a_builder_unit_whose_disk_never_frees_up_stops_the_run_as_disk_full_losing_nothing";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (summary, _) = stops_the_run_when_the_disk_never_frees_up("bu-0", |data, params| {
        system_with(data, Writer::Bu(params), "disk_full_stop_s = 3")
    });
    assert_eq!(summary.errors.len(), 1, "only the disk: {:?}", summary.errors);
    assert_eq!(summary.lost, 0, "{:?}", summary.lost_reasons);
    assert_eq!(summary.triggered, Some(summary.events + summary.rejected.unwrap_or(0)), "{summary:?}");
}

#[test]
fn a_recorder_whose_disk_never_frees_up_stops_the_run_as_disk_full_losing_nothing() {
    let name = "a_recorder_whose_disk_never_frees_up_stops_the_run_as_disk_full_losing_nothing";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // Its stop waits 3 s for room, not the default 30 s.
    let (summary, on_disk) = stops_the_run_when_the_disk_never_frees_up("recorder", |data, params| {
        system_with(data, Writer::Recorder(&format!("{params}\nstop_timeout_ms = 3000")), "disk_full_stop_s = 3")
    });
    assert_eq!(summary.errors.len(), 1, "only the disk: {:?}", summary.errors);
    assert!(summary.errors[0].contains("`recorder` was told to write what was in flight into its disk's reserve"));
    // What was in flight (in ET, in the builder unit) went into the reserve above the high
    // mark: every event built is recorded, and on the disk (checked by the helper).
    assert_eq!(summary.lost, 0, "{:?}", summary.lost_reasons);
    assert_eq!((summary.not_recorded, summary.duplicates), (0, 0), "{summary:?}");
    assert_eq!(summary.recorded, summary.events, "{summary:?}");
    assert_eq!(on_disk, summary.recorded, "{summary:?}");
    assert_eq!(summary.triggered, Some(summary.events + summary.rejected.unwrap_or(0)), "{summary:?}");
}

/// The whole events in the data files of `dir` (closed or left as `.part`), every one checked.
fn whole_events(dir: &Path) -> u64 {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.ends_with(".daq") || name.ends_with(".daq.part")) {
            continue;
        }
        let report = FileReader::open(&path).and_then(|r| r.verify(true)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            report.problems.is_empty() && report.cut_short.is_none(),
            "{name}: a partial or corrupt event: {report:?}"
        );
        n += report.records;
    }
    n
}

/// Runs until the writer fails; the run's summary, once the operator closed the run.
fn run_until_the_disk_is_full(op: &Operator) -> RunSummary {
    op.configure().unwrap();
    op.start(None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if !op.run_open()
            && let Some(s) = op.last_summary()
        {
            return s;
        }
        assert!(Instant::now() < deadline, "the run did not end: {}", status(op));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_recorder_on_a_full_disk_fails_naming_the_disk_and_every_event_is_accounted() {
    let name = "a_recorder_on_a_full_disk_fails_naming_the_disk_and_every_event_is_accounted";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(16).unwrap_or_else(|e| panic!("{e}"));
    // 13 MiB of 16: a few seconds of data fill the rest; throttling is off.
    ballast(files.path(), 13);
    let dir = tempfile::tempdir().unwrap();
    let params = format!("directory = \"{}\"\nthrottle_high_pct = 100", files.path().display());
    let op = Operator::launch(OperatorOptions::new(system(dir.path(), Writer::Recorder(&params)), BIN.into()))
        .unwrap_or_else(|e| panic!("launch: {e}"));
    let summary = run_until_the_disk_is_full(&op);
    println!("error: {:?}\nlost: {:?}", summary.error, summary.lost_reasons);
    let st = status(&op);
    op.shutdown();

    // The recorder failed, and says why: the disk, full.
    assert_eq!(summary.state, RunState::Failed, "{summary:?}");
    let error = summary.error.clone().unwrap_or_default();
    assert!(error.contains("recorder") && error.contains("disk full"), "{error}");
    assert!(error.contains(&files.path().display().to_string()), "the error names the directory: {error}");
    let recorder = st["components"].as_array().unwrap().iter().find(|c| c["name"] == "recorder").unwrap();
    assert!(recorder["error"].as_str().unwrap_or("").contains("No space left on device"), "{recorder}");

    // Every event is accounted: built = recorded + counted lost, the loss named.
    assert!(summary.events > 0 && summary.recorded > 0, "{summary:?}");
    assert_eq!(summary.events + summary.duplicates, summary.recorded + summary.not_recorded, "{summary:?}");
    assert_eq!(summary.lost, summary.lost_reasons.iter().map(|r| r.events).sum::<u64>(), "{summary:?}");
    assert!(summary.not_recorded > 0, "the disk was full and nothing was missing: {summary:?}");
    assert!(
        summary.lost_reasons.iter().any(|r| r.reason.contains("built but not recorded")),
        "{:?}",
        summary.lost_reasons
    );
    // Every loss names its cause: the recorder that failed on its full disk.
    for r in &summary.lost_reasons {
        assert!(r.reason.contains("`recorder` failed (disk full"), "{r:?}");
    }
    assert!(summary.accounting_complete, "{summary:?}");
    // The file holds whole events only, and as many as the run says were recorded.
    assert_eq!(whole_events(files.path()), summary.recorded, "{summary:?}");
}

#[test]
fn a_recorder_restarted_on_a_full_disk_leaves_only_readable_data_files() {
    let name = "a_recorder_restarted_on_a_full_disk_leaves_only_readable_data_files";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(16).unwrap_or_else(|e| panic!("{e}"));
    ballast(files.path(), 13);
    let dir = tempfile::tempdir().unwrap();
    // Throttling off, and the recorder restarted by its policy each time it fails.
    let params = format!("directory = \"{}\"\nthrottle_high_pct = 100", files.path().display());
    let op =
        Operator::launch(OperatorOptions::new(system(dir.path(), Writer::RestartingRecorder(&params)), BIN.into()))
            .unwrap_or_else(|e| panic!("launch: {e}"));
    let summary = run_until_the_disk_is_full(&op);
    println!("error: {:?}", summary.error);
    op.shutdown();
    assert_eq!(summary.state, RunState::Failed, "{summary:?}");
    let error = summary.error.clone().unwrap_or_default();
    assert!(error.contains("recorder") && error.contains("disk full"), "{error}");

    // Every file left is a data file `daqflow inspect --verify` reads: whole events, closed
    // or cut short by a writer that stopped (exit status 3), never one it cannot read (2).
    let mut data_files = Vec::new();
    for entry in std::fs::read_dir(files.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".daq") || name.ends_with(".daq.part") {
            let size = std::fs::metadata(&path).unwrap().len();
            FileReader::open(&path).unwrap_or_else(|e| panic!("{name} ({size} bytes) is no data file: {e}"));
            data_files.push(path);
        }
    }
    assert!(!data_files.is_empty());
    let out = Command::new(BIN).args(["inspect", "--verify"]).args(&data_files).output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "inspect --verify: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // No partial or corrupt event in them, and every recorded event is in them.
    assert!(whole_events(files.path()) >= summary.recorded, "{summary:?}");
}

#[test]
fn a_builder_unit_on_a_full_disk_fails_naming_the_disk_and_every_event_is_accounted() {
    let name = "a_builder_unit_on_a_full_disk_fails_naming_the_disk_and_every_event_is_accounted";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let files = Tmpfs::mount(16).unwrap_or_else(|e| panic!("{e}"));
    ballast(files.path(), 13);
    let dir = tempfile::tempdir().unwrap();
    let params = format!("directory = \"{}\"\nthrottle_high_pct = 100", files.path().display());
    let op = Operator::launch(OperatorOptions::new(system(dir.path(), Writer::Bu(&params)), BIN.into()))
        .unwrap_or_else(|e| panic!("launch: {e}"));
    let summary = run_until_the_disk_is_full(&op);
    println!("error: {:?}\nlost: {:?}", summary.error, summary.lost_reasons);
    op.shutdown();

    assert_eq!(summary.state, RunState::Failed, "{summary:?}");
    let error = summary.error.clone().unwrap_or_default();
    assert!(error.contains("bu-0") && error.contains("disk full"), "{error}");
    assert!(error.contains(&files.path().display().to_string()), "the error names the directory: {error}");
    // The EVM counts what the BU did not confirm as lost, the BU's failure named.
    let triggered = summary.triggered.expect("the EVM's accounting");
    assert_eq!(triggered, summary.events + summary.rejected.unwrap_or(0) + summary.lost_in_builder, "{summary:?}");
    assert!(summary.lost_in_builder > 0, "{summary:?}");
    assert!(
        summary.lost_reasons.iter().any(|r| r.reason.contains("`bu-0` failed (") && r.reason.contains("disk full")),
        "{:?}",
        summary.lost_reasons
    );
    // Its files hold whole events only: at least every event it confirmed.
    let on_disk = whole_events(files.path());
    assert!(on_disk >= summary.events, "{on_disk} on disk, {} built: {summary:?}", summary.events);
}

/// Keeps the filesystem of `dir` full until `stop` is set: whatever space comes free (a
/// writer cutting its file back, a file removed) is taken again at once.
fn keep_full(dir: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<PathBuf> {
    let path = dir.join("ballast");
    std::thread::spawn(move || {
        let mut f = std::fs::File::create(&path).unwrap();
        let page = vec![0x5au8; 4096];
        while !stop.load(Ordering::SeqCst) {
            if f.write_all(&page).is_err() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        path
    })
}

/// The data directory (run database, logs, files) on a small tmpfs that fills during a run:
/// the operator cannot finish the run's record; the next operator finishes it as `abandoned`,
/// saying why, on its terminal and in the record.
#[test]
fn a_run_record_the_full_disk_kept_open_is_finished_at_the_next_start_saying_why() {
    let name = "a_run_record_the_full_disk_kept_open_is_finished_at_the_next_start_saying_why";
    if !may_mount(name) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let disk = Tmpfs::mount(64).unwrap_or_else(|e| panic!("{e}"));
    let data = disk.path().display().to_string();
    let mut demo = Command::new(BIN)
        .args(["demo", "--seconds", "4", "--web", "none", "--data", &data])
        .env("DAQFLOW_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, seen) = std::sync::mpsc::channel::<String>();
    let stdout = demo.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = lines.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let stderr = demo.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    // Once the run is open, the disk fills and stays full.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = seen.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("run 1 to start");
        if line.contains("run 1 started") {
            break;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let filler = keep_full(disk.path(), stop.clone());
    let status = demo.wait().unwrap();
    let (out, err) = (reader.join().unwrap(), errors.join().unwrap());
    stop.store(true, Ordering::SeqCst);
    std::fs::remove_file(filler.join().unwrap()).unwrap();
    println!("first operator: {status}\n{out}{err}");
    assert!(!status.success(), "{out}{err}");
    assert!(out.contains("database or disk is full"), "{out}{err}");
    assert!(out.contains("the next operator on") && out.contains("finishes it as abandoned"), "{out}{err}");
    let db = || RunDb::connect(&Location::parse("runs.sqlite").unwrap().under(disk.path())).unwrap();
    assert_eq!(db().run(1).unwrap().unwrap().record.state, RunState::Running, "the record was finished");

    // The next operator on the directory finishes it, saying why.
    let o = Command::new(BIN)
        .args(["demo", "--seconds", "1", "--web", "none", "--data", &data])
        .env("DAQFLOW_LOG", "warn")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    println!("second operator: {}\n{out}{err}", o.status);
    assert!(
        err.contains("run 1 (system `demo`) could not be recorded when it ended; its record is finished now as abandoned: the operator could not finish the record: run database"),
        "{err}"
    );
    assert!(err.contains("database or disk is full"), "{err}");
    let record = db().run(1).unwrap().unwrap().record;
    assert_eq!(record.state, RunState::Abandoned, "{record:?}");
    let error = record.error.unwrap_or_default();
    assert!(error.starts_with("the operator could not finish the record: run database"), "{error}");
    assert!(error.contains("database or disk is full"), "{error}");
    assert!(record.stopped_ms.is_some());
    assert!(out.contains("run 2 started"), "{out}{err}");
    assert_eq!(db().run(2).unwrap().unwrap().record.state, RunState::Stopped);
}

/// `chattr +i` (or `-i`) on `path`; why not, when it fails.
fn chattr(flag: &str, path: &Path) -> Result<(), String> {
    let out = Command::new("chattr").arg(flag).arg(path).output().map_err(|e| format!("chattr: {e}"))?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()) }
}

/// The run database's shared-memory file made immutable while the operator runs (which killed
/// it with SIGBUS when the database used SQLite's write-ahead log, whose index every process
/// maps from that file): the operator is not affected, and records its runs.
#[test]
fn an_immutable_shared_memory_file_beside_the_run_database_does_not_kill_the_operator() {
    let name = "an_immutable_shared_memory_file_beside_the_run_database_does_not_kill_the_operator";
    // SAFETY: geteuid(2) has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "{name} needs root (chattr +i) in CI");
        println!("skipped {name}: not root, so no file can be made immutable");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let mut demo = Command::new(BIN)
        .args(["demo", "--seconds", "4", "--web", "none", "--data", &data])
        .env("DAQFLOW_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(demo.stdout.take().unwrap());
    let stderr = demo.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut out = String::new();
    let mut lines = std::io::BufRead::lines(stdout).map_while(Result::ok);
    for line in lines.by_ref() {
        out.push_str(&line);
        out.push('\n');
        if line.contains("run 1 started") {
            break;
        }
    }
    assert!(out.contains("run 1 started"), "{out}");
    // The `-shm` file made immutable while the run goes on (made first where there is none).
    let shm = dir.path().join("runs.sqlite-shm");
    let existed = shm.exists();
    if !existed {
        std::fs::write(&shm, vec![0u8; 32768]).unwrap();
    }
    if let Err(e) = chattr("+i", &shm) {
        let _ = demo.kill();
        let _ = demo.wait();
        assert!(std::env::var_os("CI").is_none(), "{name}: chattr +i {}: {e}", shm.display());
        println!("skipped {name}: the filesystem of {} cannot make a file immutable ({e})", shm.display());
        return;
    }
    struct Mutable<'a>(&'a Path);
    impl Drop for Mutable<'_> {
        fn drop(&mut self) {
            let _ = chattr("-i", self.0);
        }
    }
    let _mutable = Mutable(&shm);
    out.extend(lines.map(|l| l + "\n"));
    let status = demo.wait().unwrap();
    let err = errors.join().unwrap();
    println!("the -shm file existed: {existed}\n{status}\n{out}{err}");
    assert_eq!(status.code(), Some(0), "the operator: {status}\n{out}{err}");
    assert!(out.contains("\nlost: 0"), "{out}{err}");
    let db = RunDb::connect(&Location::parse("runs.sqlite").unwrap().under(dir.path())).unwrap();
    assert_eq!(db.run(1).unwrap().unwrap().record.state, RunState::Stopped);
}
