//! The operator with real component processes: `daqflow demo` end to end, transitions in
//! order, illegal transitions refused, a component killed during a run handled per its policy
//! (restart or stop), and a component that never joins caught by the timeout.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daqflow_api::{RunState, SystemState};
use daqflow_runcontrol::db::{LogQuery, RunDb};
use daqflow_runcontrol::operator::{Operator, OperatorError, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// A small builder into ET with a recorder: 1 RU × 2 sources, 2 BUs.
fn system(data: &Path, extra: &str) -> SystemFile {
    let text = format!(
        r#"[system]
name = "t"
control = "127.0.0.1:0"
data = "{data}"
timeout_s = 20
{extra}

[[component]]
name = "msglogger"
kind = "msglogger"
[component.params]
control = "${{system.control}}"
database = "${{system.database}}"

[[component]]
name = "et"
kind = "et"
[component.params]
name = "${{system.id}}-et"
events = 512
event_size = 16384

[[component]]
name = "recorder"
kind = "recorder"
policy = "restart"
[component.params]
et = "${{et.et}}"
directory = "${{system.data}}/files"

[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1

[[component]]
name = "bu-0"
kind = "bu"
policy = "restart"
[component.params]
id = 0
evm = "${{evm.listen}}"
output = "et"
et = "${{et.et}}"

[[component]]
name = "bu-1"
kind = "bu"
policy = "restart"
[component.params]
id = 1
evm = "${{evm.listen}}"
output = "et"
et = "${{et.et}}"

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
rate_hz = 1000.0

[[component]]
name = "src-1"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 1
ru = "${{ru-0.listen}}"
rate_hz = 1000.0
"#,
        data = data.display()
    );
    SystemFile::parse(&text, &daqflow::registry::standard()).unwrap_or_else(|e| panic!("{e}"))
}

fn launch(data: &Path, extra: &str) -> Operator {
    Operator::launch(OperatorOptions::new(system(data, extra), BIN.into())).unwrap_or_else(|e| panic!("launch: {e}"))
}

fn component<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["components"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn events_built(op: &Operator) -> u64 {
    op.status().events
}

/// The status as its JSON (what the web UI gets).
fn status(op: &Operator) -> Value {
    serde_json::to_value(op.status()).unwrap()
}

#[test]
fn the_demo_takes_a_run_with_nothing_lost_and_files_that_inspect_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    // Files of two earlier runs (numbered above the demo's, as after `start 900`), 40 kB each:
    // with --keep 50KiB the older one goes when the run starts, the newer stays.
    std::fs::create_dir_all(data.join("files")).unwrap();
    let earlier = [(900, 600), (901, 300)].map(|(run, age_s)| {
        let path = data.join("files").join(format!("run{run:06}_recorder_0001.daq"));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(40_000).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        path
    });
    let out = Command::new(BIN)
        .args(["demo", "--seconds", "5", "--web", "127.0.0.1:0", "--keep", "50KiB", "--data"])
        .arg(&data)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l == "lost: 0"), "{stdout}");
    assert!(stdout.contains("web UI: http://127.0.0.1:"), "{stdout}");
    // The web UI's login URL carries the token it also wrote, privately, for scripts.
    let url = stdout.lines().find_map(|l| l.strip_prefix("web UI: ")).unwrap();
    let token = url.split_once("/?token=").map(|(_, t)| t).unwrap_or_else(|| panic!("no token in {url}"));
    assert!(token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()), "{url}");
    let token_file = data.join("web-token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let deleted = stdout.lines().find(|l| l.starts_with("deleted the files of earlier run 900 (1 file, 39.1 KiB)"));
    assert!(deleted.is_some_and(|l| l.contains("at most 50 KiB") && l.ends_with("39.1 KiB kept")), "{stdout}");
    assert!(!earlier[0].exists() && earlier[1].exists(), "the older run's file goes, the newer one's stays");
    let files: Vec<_> = std::fs::read_dir(data.join("files"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "daq"))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("run000001_")))
        .collect();
    assert!(!files.is_empty(), "no data files: {stdout}");
    let inspect = Command::new(BIN).args(["inspect", "--verify"]).args(&files).output().unwrap();
    assert!(inspect.status.success(), "inspect --verify: {}", String::from_utf8_lossy(&inspect.stdout));
    // The run and every process's log records are in the run database.
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let runs = db.runs(10).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Stopped);
    assert!(runs[0].events.unwrap() > 0);
    assert_eq!(runs[0].lost, Some(0));
    let record = db.run(1).unwrap().unwrap();
    assert!(record.config.contains("[[component]]"));
    assert_eq!(record.summary.unwrap().files.len(), files.len());
    let logs = db.logs(&LogQuery { limit: Some(10_000), ..Default::default() }).unwrap();
    for p in ["operator", "bu-0", "ru-1", "src-3", "recorder", "evm"] {
        assert!(logs.iter().any(|r| r.process == p), "no log record of {p}");
    }
}

#[test]
fn transitions_go_in_order_and_illegal_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let op = launch(dir.path(), "");
    let e = op.start(None).unwrap_err();
    assert!(matches!(e, OperatorError::IllegalTransition { .. }), "{e}");
    assert_eq!(e.to_string(), "cannot start the system in state Initial");
    assert!(op.stop().is_err());
    op.configure().unwrap();
    assert!(op.configure().unwrap_err().to_string().contains("state Configured"));
    let run = op.start(None).unwrap();
    assert_eq!(run, 1);
    // Consumers started before producers: each stage after the one before.
    let st = status(&op);
    let since = |n: &str| component(&st, n)["since_ms"].as_u64().unwrap();
    assert!(since("recorder") <= since("evm") && since("evm") <= since("bu-0") && since("bu-0") <= since("ru-0"));
    assert!(since("ru-0") <= since("src-0"));
    wait_until("events", Duration::from_secs(30), || events_built(&op) > 500);
    op.pause().unwrap();
    assert_eq!(op.state(), SystemState::Paused);
    assert!(op.pause().is_err());
    op.resume().unwrap();
    let summary = op.stop().unwrap();
    assert_eq!(summary.lost, 0, "{summary:?}");
    assert!(summary.events > 500);
    assert_eq!(summary.events, summary.recorded);
    // Producers stopped before consumers.
    let st = status(&op);
    let since = |n: &str| component(&st, n)["since_ms"].as_u64().unwrap();
    assert!(since("evm") <= since("src-0") && since("src-1") <= since("ru-0") && since("ru-0") <= since("bu-1"));
    assert!(since("bu-1") <= since("recorder") && since("recorder") <= since("et"));
    // A second run gets the next number; reset brings everything back to Initial.
    assert_eq!(op.start(None).unwrap(), 2);
    op.stop().unwrap();
    op.reset().unwrap();
    assert_eq!(op.state(), SystemState::Initial);
    assert_eq!(op.db().runs(10).unwrap().len(), 2);
    op.shutdown();
}

#[test]
fn components_take_commands_from_their_operator_only_not_from_other_token_holders() {
    let dir = tempfile::tempdir().unwrap();
    let op = launch(dir.path(), "");
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events", Duration::from_secs(30), || events_built(&op) > 100);
    // Someone with the system token, but not the operator, tries to stop the run behind the
    // control lock's back: the components refuse, and the run goes on.
    let token = op.data_dir().join("token");
    let out = std::process::Command::new(BIN)
        .arg("--token-file")
        .arg(&token)
        .args(["dialog", "--control", &op.control_addr().to_string(), "send", "all/stop"])
        .output()
        .unwrap();
    // `dialog send` prints every component's refusal and fails.
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let refused =
        stdout.lines().find(|l| l.starts_with("evm: refused (Running): ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(refused.contains("takes commands from its operator `operator` only"), "{refused}");
    let n = op.file().components.len();
    assert!(
        stderr.contains(&format!("`all/stop` reached {n} process(es): 0 did it, {n} refused or failed")),
        "{stderr}"
    );
    let before = events_built(&op);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(op.state(), SystemState::Running);
    assert!(component(&status(&op), "evm")["state"] == "Running", "{}", status(&op));
    assert!(events_built(&op) > before, "the run stopped");
    let log = std::fs::read_to_string(op.data_dir().join("logs").join("evm.log")).unwrap();
    assert!(log.contains("takes commands from its operator `operator` only"), "{log}");
    let summary = op.stop().unwrap();
    assert_eq!(summary.lost, 0, "{summary:?}");
    op.shutdown();
}

fn kill(op: &Operator, name: &str) {
    let pid = component(&status(op), name)["pid"].as_u64().unwrap();
    // SAFETY: kill(2) on a child of this test's operator.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn a_builder_unit_killed_in_a_run_is_restarted_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let op = launch(dir.path(), "");
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events", Duration::from_secs(30), || events_built(&op) > 300);
    kill(&op, "bu-0");
    wait_until("bu-0 restarted and running", Duration::from_secs(60), || {
        let st = status(&op);
        let c = component(&st, "bu-0");
        c["restarts"] == 1 && c["state"] == "Running"
    });
    assert_eq!(op.state(), SystemState::Running);
    std::thread::sleep(Duration::from_secs(1));
    let summary = op.stop().unwrap();
    assert_eq!(summary.lost, 0, "{summary:?}");
    assert!(summary.recorded >= summary.events);
    op.shutdown();
}

#[test]
fn a_readout_unit_killed_in_a_run_stops_the_run_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let op = launch(dir.path(), "");
    op.configure().unwrap();
    let run = op.start(None).unwrap();
    wait_until("events", Duration::from_secs(30), || events_built(&op) > 300);
    kill(&op, "ru-0");
    wait_until("the run to be stopped", Duration::from_secs(90), || {
        op.db().runs(1).unwrap().first().is_some_and(|r| r.state != RunState::Running)
    });
    let record = op.db().run(run).unwrap().unwrap().record;
    assert_eq!(record.state, RunState::Failed);
    let error = record.error.unwrap();
    assert!(error.contains("ru-0"), "{error}");
    op.shutdown();
}

#[test]
fn a_component_that_never_joins_is_caught_by_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[system]\nname = 't'\ncontrol = '127.0.0.1:0'\ndata = '{}'\ntimeout_s = 2\n\n[[component]]\nname = 'mute'\nkind = 'mine'\ncommand = ['sh', '-c', 'sleep 600']\n",
        dir.path().display()
    );
    let file = SystemFile::parse(&text, &daqflow::registry::standard()).unwrap();
    let t = Instant::now();
    let e = Operator::launch(OperatorOptions::new(file, BIN.into())).err().expect("launch must fail");
    assert!(e.to_string().contains("mute: launch: did not join the control plane within 2 s"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(60));
    // A program that ends at once is named with how it ended and where its output is.
    let text = text.replace("['sh', '-c', 'sleep 600']", "['false']");
    let file = SystemFile::parse(&text, &daqflow::registry::standard()).unwrap();
    let e = Operator::launch(OperatorOptions::new(file, BIN.into())).err().expect("launch must fail").to_string();
    assert!(e.contains("mute: launch: the process ended (exit status: 1); see ") && e.contains("logs/mute.log"), "{e}");
}

#[test]
fn a_component_on_another_host_is_started_with_the_remote_command() {
    // `remote_command` is normally `ssh {host} daqflow`; here `env` stands in for ssh, so that
    // the test sees the host put into the command line without needing an ssh server.
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[system]\nname = 't'\ncontrol = '127.0.0.1:0'\ndata = '{}'\nremote_command = 'env DAQFLOW_TEST_HOST={{host}} {BIN}'\n\n\
         [[component]]\nname = 'far-sink'\nkind = 'sink'\nhost = 'node7'\n",
        dir.path().display()
    );
    let file = SystemFile::parse(&text, &daqflow::registry::standard()).unwrap();
    let op = Operator::launch(OperatorOptions::new(file, BIN.into())).unwrap_or_else(|e| panic!("{e}"));
    let st = status(&op);
    let c = component(&st, "far-sink");
    assert_eq!(c["host"], "node7");
    let pid = c["pid"].as_u64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(environ.split(|&b| b == 0).any(|v| v == b"DAQFLOW_TEST_HOST=node7"));
    op.configure().unwrap();
    assert_eq!(op.state(), SystemState::Configured);
    op.shutdown();
}

#[test]
fn the_control_server_is_a_process_of_its_own_and_a_spare_takes_over_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let options = OperatorOptions {
        control: Some("127.0.0.1:0,127.0.0.1:0".into()),
        ..OperatorOptions::new(system(dir.path(), ""), BIN.into())
    };
    let op = Operator::launch(options).unwrap_or_else(|e| panic!("launch: {e}"));
    let pids = op.control_server_pids();
    assert_eq!(pids.len(), 2, "a primary and a spare");
    assert!(!pids.contains(&std::process::id()), "not in the operator's process");
    assert_eq!(op.control_list().split(',').count(), 2);
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events", Duration::from_secs(30), || events_built(&op) > 300);
    // The primary dies: every process moves to the spare and the run goes on.
    // SAFETY: kill(2) of the control server process this operator started; no memory is involved.
    unsafe { libc::kill(pids[0] as libc::pid_t, libc::SIGKILL) };
    let before = events_built(&op);
    wait_until("the run goes on", Duration::from_secs(30), || events_built(&op) > before + 1000);
    assert_eq!(op.state(), SystemState::Running);
    // The dead primary is started again once the processes have moved.
    wait_until("the primary is back", Duration::from_secs(30), || op.control_server_restarts() >= 1);
    assert_ne!(op.control_server_pids()[0], pids[0]);
    // A component restarted now joins the others on the spare (not the new primary), so the
    // operator's commands reach it: the recorder (policy restart) dies and comes back in the run.
    let recorder = component(&status(&op), "recorder")["pid"].as_u64().unwrap() as libc::pid_t;
    // SAFETY: kill(2) of a component process this operator started; no memory is involved.
    unsafe { libc::kill(recorder, libc::SIGKILL) };
    wait_until("the recorder is back", Duration::from_secs(60), || {
        let st = status(&op);
        let r = component(&st, "recorder");
        r["pid"].as_u64().is_some_and(|p| p as libc::pid_t != recorder) && r["state"] == "Running"
    });
    let before = op.status().recorded;
    wait_until("recording goes on", Duration::from_secs(30), || op.status().recorded > before + 500);
    // Commands still reach every component (through the spare): pause, resume, stop.
    op.pause().unwrap();
    op.resume().unwrap();
    let summary = op.stop().unwrap();
    // Nothing lost: the recorder's station kept the events that came while it restarted.
    assert_eq!(summary.lost, 0, "{summary:?}");
    assert_eq!(summary.events, summary.recorded, "{summary:?}");
    op.shutdown();
}

#[test]
fn live_parameters_change_a_run_in_progress_and_are_recorded_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let op = launch(&dir.path().join("data"), "");
    op.configure().unwrap();
    // Configured: the recorder's file size changes for the next run.
    op.set("recorder", "max_file_bytes", Some(toml::Value::Integer(8 << 20))).unwrap();
    let run = op.start(None).unwrap();
    let rate = |op: &Operator| {
        let (e0, t0) = (events_built(op), Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        (events_built(op) - e0) as f64 / t0.elapsed().as_secs_f64()
    };
    wait_until("events", Duration::from_secs(20), || events_built(&op) > 500);
    let before = rate(&op);
    for src in ["src-0", "src-1"] {
        op.set(src, "rate_hz", Some(toml::Value::Float(200.0))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rate(&op);
    assert!(before > 600.0 && after < 300.0 && after > 100.0, "events/s before {before:.0}, after {after:.0}");
    // Refused with the component's reason: a key that is not live, one not live while Running,
    // a bad value; nothing changes.
    let e = op.set("src-0", "source_id", Some(toml::Value::Integer(9))).unwrap_err();
    assert!(matches!(e, OperatorError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("src-0: `source_id` cannot change after configure; the live parameters of src-0 are: rate_hz (Configured, Running, Paused)"), "{e}");
    let e = op.set("recorder", "max_file_bytes", Some(toml::Value::Integer(1 << 20))).unwrap_err().to_string();
    assert!(e.contains("`max_file_bytes` can change only while Configured, not while Running"), "{e}");
    let e = op.set("src-0", "rate_hz", Some(toml::Value::Float(-1.0))).unwrap_err().to_string();
    assert!(e.contains("src-0: `rate_hz` = -1 is out of range: 0 … 1000000000 Hz"), "{e}");
    // Checked by the configuration's own rule: a value configure would refuse is refused now.
    for v in [toml::Value::Float(1e300), toml::Value::Integer(1_000_000_001)] {
        let e = op.set("src-0", "rate_hz", Some(v)).unwrap_err().to_string();
        assert!(e.contains("is out of range: 0 … 1000000000 Hz"), "{e}");
    }
    // And back to the first pace (the stop then drains the events the trigger ran ahead in
    // a couple of seconds rather than ten).
    for src in ["src-0", "src-1"] {
        op.set(src, "rate_hz", Some(toml::Value::Float(1000.0))).unwrap();
    }
    std::thread::sleep(Duration::from_secs(1));
    let summary = op.stop().unwrap();
    assert_eq!(summary.run, run);
    assert_eq!(summary.lost, 0, "{:?} {:?} {:?}", summary.lost_reasons, summary.errors, summary.unknown);
    let changes: Vec<(String, String, Value)> =
        summary.changes.iter().map(|c| (c.component.clone(), c.key.clone(), c.value.clone())).collect();
    assert_eq!(
        changes,
        vec![
            ("src-0".into(), "rate_hz".into(), serde_json::json!(200.0)),
            ("src-1".into(), "rate_hz".into(), serde_json::json!(200.0)),
            ("src-0".into(), "rate_hz".into(), serde_json::json!(1000.0)),
            ("src-1".into(), "rate_hz".into(), serde_json::json!(1000.0)),
        ]
    );
    assert_eq!(summary.overrides["recorder.max_file_bytes"], serde_json::json!(8 << 20));
    assert_eq!(summary.overrides["src-0.rate_hz"], serde_json::json!(1000.0));
    // Stored with the run.
    let stored = op.db().run(run).unwrap().unwrap().summary.unwrap();
    assert_eq!(stored.changes, summary.changes);
    op.shutdown();
}
