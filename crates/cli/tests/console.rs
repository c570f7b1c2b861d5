//! The operator's console and run control with real processes (`daqflow run`): what the end of
//! standard input means, `quit` during a run, a run number used before (console and web API),
//! a control port in use, and a component that fails: its first error line in the summary, the
//! web UI's status and the run record.

#[path = "../../web/tests/support/client.rs"]
mod client;
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::Client;
use common::Proc;
use daqflow_api::RunState;
use daqflow_runcontrol::db::RunDb;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// A generator into a sink; `extra` components after them.
fn system(dir: &Path, extra: &str) -> PathBuf {
    let text = format!(
        r#"[system]
name = "console-test"
control = "127.0.0.1:0"
data = "{data}"
web = "none"
timeout_s = 20

[[component]]
name = "sink"
kind = "sink"

[[component]]
name = "gen"
kind = "generator"
[component.params]
downstream = "${{sink.listen}}"
chunk_bytes = 1024
rate_hz = 200.0
{extra}"#,
        data = dir.join("data").display()
    );
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `daqflow run SYSTEM ARGS…` with standard input at its end from the start (`< /dev/null`).
fn run_without_stdin(system: &Path, args: &[&str]) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("run").arg(system).args(args).env("DAQFLOW_LOG", "warn");
    let mut p = Proc::spawn_command(cmd);
    p.close_stdin();
    p
}

/// Whether the process is still running after `d`.
fn alive_after(p: &mut Proc, d: Duration) -> bool {
    std::thread::sleep(d);
    p.child.try_wait().unwrap().is_none()
}

#[test]
fn with_start_the_end_of_input_means_no_console_and_a_signal_ends_the_run_with_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("run").arg(system(dir.path(), "")).args(["--web", "none", "--start"]).stdin(Stdio::null());
    let mut op = Proc::spawn_command(cmd);
    op.close_stdin();
    op.expect("run 1 started");
    assert!(op.stderr_contains("standard input ended: no console from here on"), "no word about the console");
    // The run goes on: no summary, the process is there.
    assert!(alive_after(&mut op, Duration::from_secs(3)), "the run ended: {}", op.drain());
    assert!(!op.drain().contains("lost:"), "a summary before any stop");
    op.signal(libc::SIGTERM);
    op.expect("stopping run 1");
    op.expect("run 1 of system console-test");
    let last = op.expect("lost: ");
    assert_eq!(last, "lost: 0");
    assert_eq!(op.wait_exit(), 0);
    let db = RunDb::open(&dir.path().join("data").join("runs.sqlite")).unwrap();
    let run = db.run(1).unwrap().unwrap();
    assert_eq!(run.record.state, RunState::Stopped);
    // It ran past the end of input: the sink received what the generator sent meanwhile.
    let sink = &run.summary.unwrap().components["sink"];
    assert!(sink.summary.as_ref().is_some_and(|s| s.events > 0), "{sink:?}");
}

#[test]
fn without_start_the_end_of_input_is_quit_and_a_run_it_stops_prints_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let mut op = Proc::spawn(&["run", system(dir.path(), "").to_str().unwrap(), "--web", "none"]);
    op.send("configure");
    op.send("start");
    op.expect("run 1 started");
    std::thread::sleep(Duration::from_secs(1));
    op.close_stdin();
    op.expect("standard input ended: stopping run 1");
    op.expect("run 1 of system console-test");
    assert_eq!(op.expect("lost: "), "lost: 0");
    assert_eq!(op.wait_exit(), 0);
}

#[test]
fn quit_during_a_run_stops_it_and_prints_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let mut op = Proc::spawn(&["run", system(dir.path(), "").to_str().unwrap(), "--web", "none"]);
    op.send("configure");
    op.expect("configure: done; state Configured");
    op.send("start 7");
    op.expect("run 7 started");
    std::thread::sleep(Duration::from_secs(1));
    op.send("quit");
    op.expect("quit: stopping run 7");
    op.expect("run 7 of system console-test");
    assert_eq!(op.expect("lost: "), "lost: 0");
    assert_eq!(op.wait_exit(), 0);
}

#[test]
fn a_run_number_used_before_is_refused_with_the_reason_on_the_console_and_with_400_on_the_web_api() {
    let dir = tempfile::tempdir().unwrap();
    let system = system(dir.path(), "");
    let mut op = Proc::spawn(&["run", system.to_str().unwrap(), "--web", "127.0.0.1:0"]);
    let first = op.expect("web UI: ");
    let url = first.split("web UI: ").nth(1).unwrap().trim().to_owned();
    let (base, token) = url.split_once("?token=").unwrap();
    let addr: SocketAddr = base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    op.send("configure");
    op.expect("configure: done");
    op.send("start 3");
    op.expect("run 3 started");
    op.send("stop");
    op.expect("run 3 of system console-test");
    op.send("start 3");
    let refused = op.expect("start: run 3");
    assert_eq!(
        refused,
        "start: run 3 was taken before (by system `console-test`, its record is stopped); a run number is used once: \
         leave it out for the next one (4), or give one never used"
    );
    op.send("start 0");
    op.expect("start: run numbers start at 1");
    // The web API: 400 with the reason, no ERROR logged, and the system still Configured.
    let crew = Client::login(addr, token);
    assert_eq!(crew.post("/api/control/take", "{}").status, 200);
    let r = crew.post("/api/transition/start", r#"{"run": 3}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().starts_with("run 3 was taken before (by system `console-test`"), "{}", r.text());
    assert_eq!(crew.get("/api/status").json()["state"], "Configured");
    let r = crew.post("/api/transition/start", r#"{"run": 5}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    op.send("quit");
    op.expect("run 5 of system console-test");
    assert_eq!(op.wait_exit(), 0);
    let db = RunDb::open(&dir.path().join("data").join("runs.sqlite")).unwrap();
    let runs: Vec<u32> = db.runs(10).unwrap().iter().map(|r| r.run).collect();
    assert_eq!(runs, vec![5, 3]);
    // The caller's mistake is no error of the operator's (its log on standard error).
    let errors: Vec<String> = op.stderr_lines().into_iter().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn a_control_port_in_use_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let system = system(dir.path(), "");
    let text = std::fs::read_to_string(&system).unwrap().replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(&system, text).unwrap();
    let out = Command::new(BIN).arg("run").arg(&system).args(["--start", "--seconds", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("the control server cannot listen on 127.0.0.1:{port}: the address is in use")),
        "{stderr}"
    );
    assert!(!stderr.contains("did not start (exit status"), "{stderr}");
}

/// A component that joins as a sink and, once the file `trigger` exists, writes an error line and
/// ends with exit status 3 (a front end that lost power).
fn failing_component(trigger: &Path) -> String {
    let script = format!(
        "\"{BIN}\" component sink \"$@\" & p=$!; while [ ! -e '{}' ]; do sleep 0.1; done; \
         echo '2026-01-01T00:00:00.000000Z  INFO still fine' >&2; \
         echo '2026-01-01T00:00:00.000001Z ERROR the front-end crate lost power' >&2; \
         echo '2026-01-01T00:00:00.000002Z ERROR a later error' >&2; kill -9 $p; exit 3",
        trigger.display()
    );
    format!("\n[[component]]\nname = \"crate-7\"\nkind = \"sink\"\ncommand = [\"sh\", \"-c\", {script:?}, \"sh\"]\n")
}

#[test]
fn a_component_that_fails_in_a_run_is_quoted_by_its_first_error_line_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("power-off");
    let system = system(dir.path(), &failing_component(&trigger));
    // No console and no web UI: the run goes on until it ends, here by the policy `stop`.
    let mut op = run_without_stdin(&system, &["--web", "none", "--start"]);
    op.expect("run 1 started");
    assert!(op.stderr_contains("no console from here on"));
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(&trigger, "").unwrap();
    let ended = op.expect("run 1 ended: ");
    let first = "exit status: 3; first error: the front-end crate lost power";
    assert!(ended.contains(&format!("crate-7 failed: {first}")), "{ended}");
    op.expect("run 1 of system console-test: ");
    let died = op.expect("  died:       crate-7");
    assert_eq!(died, format!("  died:       crate-7 ({first})"));
    assert!(op.stderr_contains("the run ended and nothing can start another"));
    assert_eq!(op.wait_exit(), 1, "a failed run: exit status 1");
    let db = RunDb::open(&dir.path().join("data").join("runs.sqlite")).unwrap();
    let run = db.run(1).unwrap().unwrap();
    assert_eq!(run.record.state, RunState::Failed);
    assert!(run.record.error.as_deref().unwrap_or("").contains(first), "{:?}", run.record.error);
    let summary = run.summary.unwrap();
    assert_eq!(summary.died[0].why, first);
    assert_eq!(summary.components["crate-7"].died.as_deref(), Some(first));
}

#[test]
fn the_web_status_quotes_a_dead_components_first_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("power-off");
    let system = system(dir.path(), &failing_component(&trigger));
    let mut op = Proc::spawn(&["run", system.to_str().unwrap(), "--web", "127.0.0.1:0"]);
    let first = op.expect("web UI: ");
    let url = first.split("web UI: ").nth(1).unwrap().trim().to_owned();
    let addr: SocketAddr =
        url.split_once("?token=").unwrap().0.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    std::fs::write(&trigger, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = client::get(addr, "/api/status").json();
        let c = st["components"].as_array().unwrap().iter().find(|c| c["name"] == "crate-7").unwrap().clone();
        if c["state"] == "Dead" {
            assert_eq!(c["error"], "process ended: exit status: 3; first error: the front-end crate lost power", "{c}");
            break;
        }
        assert!(Instant::now() < deadline, "crate-7 never died: {c}");
        std::thread::sleep(Duration::from_millis(100));
    }
    op.send("quit");
    op.wait_exit();
}

/// The pid of component `name`, a child of the operator `parent`.
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

#[test]
fn a_configure_that_times_out_names_the_component_keeps_the_console_and_configure_works_again() {
    let dir = tempfile::tempdir().unwrap();
    let system = system(dir.path(), "");
    let text = std::fs::read_to_string(&system).unwrap().replace("timeout_s = 20", "timeout_s = 5");
    std::fs::write(&system, text).unwrap();
    let mut op = Proc::spawn(&["run", system.to_str().unwrap(), "--web", "none"]);
    op.expect("commands: ");
    // The sink stops answering (a host under load), then configure.
    let sink = component_pid(op.child.id(), "sink").expect("the sink's process");
    // SAFETY: kill(2) on a process the operator under test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(sink as i32, libc::SIGSTOP) }, 0);
    op.send("configure");
    assert!(op.stderr_contains("configure of the system begins"));
    // (The status shows it once the operator's loop is done with that step.)
    std::thread::sleep(Duration::from_millis(500));
    // The console reads on: `status` at once, with what the configure waits for; another
    // command says what it waits for.
    op.send("status");
    op.expect("\"waiting_for\": [");
    op.expect("\"component\": \"sink\"");
    op.send("alarms");
    op.expect("`alarms` waits: `configure` is under way (Configuring, waiting for sink (configure), ");
    let failed = op.expect("configure: sink: configure: no answer within 5 s; see ");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(sink as i32, libc::SIGCONT) }, 0);
    assert!(failed.ends_with("(configure undone: sink told to reset once it is done; configure again)"), "{failed}");
    op.expect("the system file has no [[alarm]]");
    // Not Mixed: configure works at once, and a run with it.
    op.send("configure");
    op.expect("configure: done; state Configured");
    op.send("start");
    op.expect("run 1 started");
    op.send("quit");
    assert_eq!(op.expect("lost: "), "lost: 0");
    assert_eq!(op.wait_exit(), 0);
}

/// A token holder's connection to the operator's peer port under the name `as_name`, sending
/// `value` as an update on every subscription channel from 1 to 200 (the operator's
/// subscription to `as_name/state` is one of them), each after a guessed proof of the
/// subscription's key.
fn forge(operator: SocketAddr, token: &daqflow_transport::auth::Token, as_name: &str, value: &[u8]) {
    use daqflow_dialog::protocol::{Message, PROTOCOL_VERSION};
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(operator).unwrap();
    daqflow_transport::auth::handshake_std(&mut s, "dialog-peer", Some(token), Duration::from_secs(10)).unwrap();
    let mut bytes = bytes::BytesMut::new();
    let codec = daqflow_wire::frame::FrameCodec::default();
    let hello =
        Message::PeerHello { version: PROTOCOL_VERSION, name: as_name.into(), host: "127.0.0.1".into(), port: 9 };
    codec.encode(&hello.to_frame(), &mut bytes);
    for sub in 1..=200 {
        codec.encode(&Message::SubscriptionProof { sub, key: [sub as u8; 16] }.to_frame(), &mut bytes);
        let m = Message::ServiceMessage { sub, initial: false, seq: 1_000_000_000, data: value.to_vec().into() };
        codec.encode(&m.to_frame(), &mut bytes);
    }
    s.write_all(&bytes).unwrap();
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_state_forged_under_a_components_name_never_reaches_the_operator_nor_wedges_the_system() {
    use daqflow_component::{ComponentStatus, State};
    use daqflow_dialog::{Dialog, DialogConfig, ServiceEvent};
    use daqflow_runcontrol::operator::lock::{Holder, holder};
    let dir = tempfile::tempdir().unwrap();
    let mut op = Proc::spawn(&["run", system(dir.path(), "").to_str().unwrap(), "--web", "none"]);
    op.expect("commands: ");
    // A token holder joins the control plane and reads the sink's real status.
    let data = dir.path().join("data");
    let Holder::Running(info) = holder(&data).unwrap() else { panic!("no operator holds {}", data.display()) };
    let token = daqflow_transport::auth::Token::from_file(&data.join("token")).unwrap();
    let control = info.control.iter().map(|a| a.parse().unwrap()).collect();
    let mut config = DialogConfig::new("mallory", control);
    config.token = Some(token.clone());
    let dialog = Dialog::start(config).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _sub = dialog
        .subscribe("sink/state", move |e| {
            if let ServiceEvent::Update { data, .. } = e {
                let _ = tx.send(data);
            }
        })
        .unwrap();
    let real: ComponentStatus = serde_json::from_slice(&rx.recv_timeout(Duration::from_secs(20)).unwrap()).unwrap();
    let incarnation = real.incarnation.expect("the operator gave the sink an incarnation");
    let operator = dialog
        .processes(Duration::from_secs(10))
        .unwrap()
        .into_iter()
        .find(|p| p.name == "operator")
        .expect("the operator on the control plane");
    let operator: SocketAddr = format!("{}:{}", operator.host, operator.port).parse().unwrap();
    let forged = |incarnation: u64| {
        let mut s = real.clone();
        s.incarnation = Some(incarnation);
        s.seq = 1_000_000_000;
        s.state = State::Error;
        s.error = Some("forged".into());
        s.since_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        serde_json::to_vec(&s).unwrap()
    };
    // Neither another incarnation's Error nor the launched one's numbered 10^9 reaches the
    // operator: the forger's connection never proved the subscription's key (a status that
    // did arrive so, from a component's own earlier life, is handled by the sequencer: its
    // tests in crates/runcontrol/tests/sequencer.rs).
    forge(operator, &token, "sink", &forged(incarnation + 1000));
    forge(operator, &token, "sink", &forged(incarnation));
    std::thread::sleep(Duration::from_millis(500));
    let said = op.stderr_lines();
    for forged in ["ignoring the statuses of sink", "a status of sink jumps from number"] {
        assert!(!said.iter().any(|l| l.contains(forged)), "a forged status reached the operator: {said:#?}");
    }
    let refused = said.iter().filter(|l| l.contains("this connection has not proven")).count();
    assert_eq!(refused, 2, "the operator says once per forger's connection what it refused: {said:#?}");
    std::thread::sleep(Duration::from_millis(1500));
    // Every transition works, and the run is clean.
    op.send("configure");
    op.expect("configure: done; state Configured");
    op.send("start");
    op.expect("run 1 started");
    std::thread::sleep(Duration::from_secs(1));
    op.send("stop");
    op.expect("run 1 of system console-test");
    assert_eq!(op.expect("lost: "), "lost: 0");
    op.send("reset");
    op.expect("reset: done; state Initial");
    forge(operator, &token, "sink", &forged(incarnation));
    std::thread::sleep(Duration::from_millis(1500));
    op.send("configure");
    op.expect("configure: done; state Configured");
    op.send("start");
    op.expect("run 2 started");
    std::thread::sleep(Duration::from_secs(1));
    op.send("quit");
    op.expect("run 2 of system console-test");
    assert_eq!(op.expect("lost: "), "lost: 0");
    assert_eq!(op.wait_exit(), 0);
}
