//! Ctrl-C typed in a real terminal: `daqflow demo` and `daqflow run` run in a pseudo-terminal
//! of their own (the test is the terminal: it opens a pty, makes it the operator's controlling
//! terminal and types `\x03`, which the line discipline turns into SIGINT for the foreground
//! process group), in every state: Initial, configuring, Configured, starting, Running, Paused
//! and stopping. One component is slow (`DAQFLOW_TRANSITION_DELAY`: it waits before it joins and
//! before each transition), so that the states in between last long enough to type in; the
//! test reads the state from the web UI's status API at the moment it types. Each ends in
//! order: exit status 0, `lost: 0`, every run recorded `stopped`, no process left. Also: a
//! second Ctrl-C says what the end waits for, a third ends at once; SIGTERM; a closed terminal
//! (SIGHUP, then EIO on every write) under `--on-hangup stop` (the demo) and `keep` (`run`).

#[path = "../../web/tests/support/client.rs"]
mod client;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::{Client, get};
use daqflow_api::{RunRecord, RunState};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// How long the slow component waits before joining and before each transition.
const DELAY_MS: u64 = 1000;

/// Every wait is bounded by this (a failure fails, it does not hang).
const PATIENCE: Duration = Duration::from_secs(90);

/// A pseudo-terminal whose slave side is a child's controlling terminal; the master side is
/// read all the time (the child never blocks on its output) and typed into.
struct Terminal {
    master: Option<Arc<OwnedFd>>,
    output: Arc<Mutex<Vec<u8>>>,
    closing: Arc<AtomicBool>,
    child: Child,
}

fn check(r: libc::c_int, what: &str) -> libc::c_int {
    assert!(r >= 0, "{what}: {}", std::io::Error::last_os_error());
    r
}

impl Terminal {
    /// Runs `daqflow ARGS` in `dir` with `env`, in a new session whose controlling terminal is
    /// a new pty's slave (its standard input, output and error).
    fn spawn(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Terminal {
        // SAFETY: plain libc calls on file descriptors this function owns; `name` is a buffer
        // of the length given, NUL-terminated by ptsname_r on success.
        let (master, slave) = unsafe {
            let m = check(libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC), "posix_openpt");
            let master = OwnedFd::from_raw_fd(m);
            check(libc::grantpt(m), "grantpt");
            check(libc::unlockpt(m), "unlockpt");
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0, "ptsname_r");
            let s = check(libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC), "open the pty");
            (master, std::fs::File::from_raw_fd(s))
        };
        let mut cmd = Command::new(BIN);
        cmd.args(args).current_dir(dir).envs(env.iter().copied()).env_remove("DAQFLOW_TOKEN");
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: between fork and exec only setsid(2), ioctl(2) and signal(2), all
        // async-signal-safe; the slave is the child's standard input by then.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // As a login shell at a terminal leaves them, whatever the test runner ignores
                // (a background job of a script ignores SIGINT).
                for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn daqflow in the pty");
        drop(cmd); // our copies of the slave: the child holds the only ones now
        let master = Arc::new(master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let closing = Arc::new(AtomicBool::new(false));
        let (fd, out, stop) = (master.clone(), output.clone(), closing.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while !stop.load(Ordering::SeqCst) {
                let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd that lives across the call.
                let ready = unsafe { libc::poll(&mut poll, 1, 100) };
                if ready <= 0 {
                    continue;
                }
                // SAFETY: reads into `buf`, of the length given, from a descriptor we hold.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    break; // EIO: every slave descriptor is closed
                }
                out.lock().unwrap().extend_from_slice(&buf[..n as usize]);
            }
        });
        Terminal { master: Some(master), output, closing, child }
    }

    /// Types `bytes` at the terminal.
    fn type_in(&self, bytes: &[u8]) {
        let fd = self.master.as_ref().expect("the terminal is closed");
        // SAFETY: writes `bytes`, of the length given, to a descriptor we hold.
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize, "typing: {}", std::io::Error::last_os_error());
    }

    /// Everything the terminal showed so far (without the line discipline's carriage returns).
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).replace('\r', "")
    }

    /// Waits until the terminal shows `what`; the text so far.
    fn wait_for(&mut self, what: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.text();
            if text.contains(what) {
                return text;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(300));
                panic!("daqflow ended ({status}) without showing {what:?}:\n{}", self.text());
            }
            assert!(Instant::now() < deadline, "no {what:?} within {PATIENCE:?}:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes the terminal (a window closed, an ssh session dropped): the kernel hangs it up.
    fn close(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        self.master = None;
    }

    /// Waits for the exit status.
    fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // What the reader still had in flight.
                std::thread::sleep(Duration::from_millis(300));
                return status.code().unwrap_or_else(|| panic!("daqflow ended by a signal: {status}\n{}", self.text()));
            }
            assert!(Instant::now() < deadline, "daqflow did not end within {PATIENCE:?}:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.closing.store(true, Ordering::SeqCst);
    }
}

/// The processes whose command line names `dir` (every component and control server of a
/// system whose data directory is in it: `--token-file DIR/…/token`).
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

/// Whether process `pid` is gone (a zombie, not reaped yet, counts as gone).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// A system of ours under the test's terminal, with its web UI's address.
struct Session {
    term: Terminal,
    dir: tempfile::TempDir,
    data: PathBuf,
    web: SocketAddr,
    /// The pids of the components the status API listed when Ctrl-C was typed.
    pids: Vec<u32>,
}

/// `daqflow demo` with a slow monitor (it starts first and stops last: every transition's
/// time is then the monitor's delay).
fn demo() -> Session {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let delay = format!("monitor={DELAY_MS}");
    let args = ["demo", "--data", data.to_str().unwrap(), "--web", "127.0.0.1:0"];
    let term = Terminal::spawn(&args, dir.path(), &[("DAQFLOW_TRANSITION_DELAY", &delay)]);
    session(term, dir, data)
}

/// `daqflow run` of a small system (a generator into a slow sink), its console in the
/// terminal, with `extra` arguments.
fn run(extra: &[&str]) -> Session {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = dir.path().join("system.toml");
    std::fs::write(
        &system,
        format!(
            r#"[system]
name = "terminal-test"
control = "127.0.0.1:0"
data = "{}"
web = "127.0.0.1:0"

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
            data.display()
        ),
    )
    .unwrap();
    let delay = format!("sink={DELAY_MS}");
    let mut args = vec!["run", system.to_str().unwrap()];
    args.extend_from_slice(extra);
    let term = Terminal::spawn(&args, dir.path(), &[("DAQFLOW_TRANSITION_DELAY", &delay)]);
    session(term, dir, data)
}

fn session(mut term: Terminal, dir: tempfile::TempDir, data: PathBuf) -> Session {
    let text = term.wait_for("?token=");
    let url = text.split_whitespace().find(|w| w.starts_with("http://") && w.contains("?token=")).unwrap();
    let web = url.trim_start_matches("http://").split('/').next().unwrap().parse().unwrap();
    Session { term, dir, data, web, pids: Vec::new() }
}

impl Session {
    fn status(&self) -> Value {
        get(self.web, "/api/status").json()
    }

    /// Waits until the status API says `state` (and `also` holds); that status.
    fn wait_state(&mut self, state: &str, also: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        loop {
            if let Ok(Some(status)) = self.term.child.try_wait() {
                panic!("daqflow ended ({status}) before {state}:\n{}", self.term.text());
            }
            let st = self.status();
            if st["state"] == state && also(&st) {
                return st;
            }
            if st["state"] != last["state"] {
                last = st;
            }
            assert!(
                Instant::now() < deadline,
                "the system was not {state} within {PATIENCE:?} (last: {}):\n{}",
                last["state"],
                self.term.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types Ctrl-C as soon as the status API says `state` (and `also` holds).
    fn ctrl_c_when(&mut self, state: &str, also: impl Fn(&Value) -> bool) {
        let st = self.wait_state(state, also);
        self.term.type_in(b"\x03");
        self.note_pids(&st);
    }

    fn note_pids(&mut self, st: &Value) {
        for c in st["components"].as_array().unwrap() {
            if let Some(pid) = c["pid"].as_u64() {
                self.pids.push(pid as u32);
            }
        }
    }

    /// A client of the web UI that holds the control lock (with the web token the operator
    /// wrote).
    fn controller(&self) -> Client {
        let token = std::fs::read_to_string(self.data.join("web-token")).unwrap();
        let c = Client::login(self.web, token.trim());
        assert_eq!(c.post("/api/control/take", "{}").status, 200);
        c
    }

    /// Every run in the run database, newest first.
    fn runs(&self) -> Vec<RunRecord> {
        let location = daqflow_runcontrol::db::Location::Sqlite(self.data.join("runs.sqlite"));
        daqflow_runcontrol::db::RunDb::connect(&location).unwrap().runs(100).unwrap()
    }

    /// Waits for the end: its exit status and everything it showed. Checks that no process of
    /// the system is left.
    fn end(mut self) -> (i32, String, Vec<RunRecord>) {
        let code = self.term.exit_code();
        let text = self.term.text();
        let left: Vec<u32> = self.pids.iter().copied().filter(|&p| !gone(p)).collect();
        assert!(left.is_empty(), "processes left: {left:?} ({:?})\n{text}", processes_under(self.dir.path()));
        let left = processes_under(self.dir.path());
        assert!(left.is_empty(), "processes left:\n{}\n{text}", left.join("\n"));
        assert!(!text.contains("panicked"), "{text}");
        let runs = self.runs();
        (code, text, runs)
    }
}

/// The end in order of a session that took `runs` runs: exit status 0, each run stopped with
/// nothing lost, the last `lost:` line 0, no component died.
fn ended_in_order(s: Session, runs: usize) -> String {
    let (code, text, records) = s.end();
    println!("{text}");
    assert_eq!(code, 0, "exit status {code}:\n{text}");
    assert_eq!(records.len(), runs, "{records:?}\n{text}");
    for r in &records {
        assert_eq!((r.state, r.lost), (RunState::Stopped, Some(0)), "{r:?}\n{text}");
    }
    if runs > 0 {
        assert!(text.contains("\nlost: 0\n"), "{text}");
        assert!(!text.contains("(failed)") && !text.contains("died:"), "{text}");
    }
    assert!(!text.contains("ERROR") && !text.contains("restarting"), "{text}");
    assert!(text.contains("Ctrl-C: ending in order"), "{text}");
    text
}

fn anything(_: &Value) -> bool {
    true
}

/// A run in progress for a second (the demo's events flowing by then).
fn with_events(st: &Value) -> bool {
    st["duration_s"].as_f64().unwrap_or(0.0) >= 1.0
}

// ---- daqflow demo ----------------------------------------------------------------------

#[test]
fn demo_ctrl_c_while_the_components_start_ends_it_in_order() {
    let mut s = demo();
    // The web UI is served first; the slow monitor has not joined yet.
    s.ctrl_c_when("Initial", |st| st["components"].as_array().unwrap().iter().any(|c| c["state"] == "Starting"));
    let text = ended_in_order(s, 0);
    assert!(text.contains("the components being started join first"), "{text}");
    assert!(text.contains("no run was taken"), "{text}");
}

#[test]
fn demo_ctrl_c_while_configuring_ends_it_without_a_run() {
    let mut s = demo();
    s.ctrl_c_when("Configuring", anything);
    let text = ended_in_order(s, 0);
    assert!(text.contains("the configure under way finishes first"), "{text}");
    assert!(text.contains("no run was taken"), "{text}");
}

#[test]
fn demo_ctrl_c_while_configured_ends_it_in_order() {
    let mut s = demo();
    s.wait_state("Running", with_events);
    let web = s.controller();
    let r = web.post("/api/transition/stop", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    s.term.wait_for("the demo goes on");
    s.ctrl_c_when("Configured", anything);
    let text = ended_in_order(s, 1);
    assert!(text.contains("no run is open; every component resets and ends"), "{text}");
}

#[test]
fn demo_ctrl_c_while_starting_stops_the_run_it_starts() {
    let mut s = demo();
    s.ctrl_c_when("Starting", anything);
    let text = ended_in_order(s, 1);
    assert!(text.contains("the start under way finishes first"), "{text}");
}

#[test]
fn demo_ctrl_c_while_running_stops_the_run_in_order() {
    let mut s = demo();
    s.ctrl_c_when("Running", with_events);
    let text = ended_in_order(s, 1);
    assert!(text.contains("run 1 is stopped (producers first"), "{text}");
    assert!(text.contains("every component ended"), "{text}");
}

#[test]
fn demo_ctrl_c_while_paused_stops_the_run_in_order() {
    let mut s = demo();
    s.wait_state("Running", with_events);
    let web = s.controller();
    let r = web.post("/api/transition/pause", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    s.ctrl_c_when("Paused", anything);
    ended_in_order(s, 1);
}

#[test]
fn demo_ctrl_c_twice_while_stopping_says_what_the_stop_waits_for() {
    let mut s = demo();
    s.wait_state("Running", with_events);
    let web = s.controller();
    let stopper = std::thread::spawn(move || web.post("/api/transition/stop", "{}").status);
    s.ctrl_c_when("Stopping", anything);
    s.term.wait_for("Ctrl-C: ending in order");
    s.term.type_in(b"\x03");
    let text = s.term.wait_for("Ctrl-C again: still ending in order, waiting for");
    assert!(text.contains("A third Ctrl-C ends at once"), "{text}");
    assert_eq!(stopper.join().unwrap(), 200);
    let text = ended_in_order(s, 1);
    assert!(text.contains("the stop of run 1 under way finishes"), "{text}");
}

#[test]
fn demo_ctrl_c_three_times_ends_at_once_and_says_what_that_costs() {
    let mut s = demo();
    s.ctrl_c_when("Running", with_events);
    s.term.wait_for("Ctrl-C: ending in order");
    s.term.type_in(b"\x03");
    // (Two SIGINTs before the first is handled are one: wait for the answer to each.)
    s.term.wait_for("Ctrl-C again: still ending");
    s.term.type_in(b"\x03");
    let code = s.term.exit_code();
    let text = s.term.text();
    assert_eq!(code, 130, "{text}");
    assert!(text.contains("Ctrl-C a third time: ending at once. run 1 is not stopped in order"), "{text}");
    assert!(text.contains("stays open in the run database"), "{text}");
    // The components end by themselves (their parent-death signal): none is left.
    let deadline = Instant::now() + PATIENCE;
    while !processes_under(s.dir.path()).is_empty() || !s.pids.iter().all(|&p| gone(p)) {
        assert!(Instant::now() < deadline, "left: {:?}", processes_under(s.dir.path()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let runs = s.runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].state, RunState::Running, "{runs:?}");
}

#[test]
fn demo_closed_terminal_ends_it_in_order_and_writes_to_it_do_no_harm() {
    let mut s = demo();
    let st = s.wait_state("Running", with_events);
    s.note_pids(&st);
    // SIGHUP, then EIO on every write (the progress lines, the summary).
    s.term.close();
    let (code, _, runs) = s.end();
    assert_eq!(code, 0);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!((runs[0].state, runs[0].lost), (RunState::Stopped, Some(0)), "{runs:?}");
}

// ---- daqflow run -----------------------------------------------------------------------

/// `daqflow run`, the console waiting in Initial.
fn run_console() -> Session {
    let mut s = run(&[]);
    s.term.wait_for("commands: ");
    s
}

/// Types a console command.
fn type_line(s: &Session, line: &str) {
    s.term.type_in(format!("{line}\n").as_bytes());
}

#[test]
fn run_ctrl_c_in_initial_ends_it_in_order() {
    let mut s = run_console();
    s.ctrl_c_when("Initial", anything);
    let text = ended_in_order(s, 0);
    assert!(text.contains("no run is open; every component resets and ends"), "{text}");
}

#[test]
fn run_ctrl_c_while_configuring_ends_it_in_order() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.ctrl_c_when("Configuring", anything);
    let text = ended_in_order(s, 0);
    assert!(text.contains("configure: done; state Configured"), "{text}");
}

#[test]
fn run_ctrl_c_in_configured_ends_it_in_order() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.ctrl_c_when("Configured", anything);
    ended_in_order(s, 0);
}

#[test]
fn run_ctrl_c_while_starting_stops_the_run_it_starts() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.wait_state("Configured", anything);
    type_line(&s, "start");
    s.ctrl_c_when("Starting", anything);
    let text = ended_in_order(s, 1);
    assert!(text.contains("run 1 started"), "{text}");
}

#[test]
fn run_ctrl_c_while_running_stops_the_run_in_order() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.wait_state("Configured", anything);
    type_line(&s, "start");
    s.ctrl_c_when("Running", with_events);
    ended_in_order(s, 1);
}

#[test]
fn run_ctrl_c_while_paused_stops_the_run_in_order() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.wait_state("Configured", anything);
    type_line(&s, "start");
    s.wait_state("Running", with_events);
    type_line(&s, "pause");
    s.ctrl_c_when("Paused", anything);
    ended_in_order(s, 1);
}

#[test]
fn run_ctrl_c_while_stopping_lets_the_stop_finish() {
    let mut s = run_console();
    type_line(&s, "configure");
    s.wait_state("Configured", anything);
    type_line(&s, "start");
    s.wait_state("Running", with_events);
    type_line(&s, "stop");
    s.ctrl_c_when("Stopping", anything);
    ended_in_order(s, 1);
}

#[test]
fn run_sigterm_while_running_stops_the_run_in_order() {
    let mut s = run(&["--start"]);
    let st = s.wait_state("Running", with_events);
    s.note_pids(&st);
    // SAFETY: kill(2) with the pid of our own child.
    assert_eq!(unsafe { libc::kill(s.term.child.id() as i32, libc::SIGTERM) }, 0);
    let (code, text, runs) = s.end();
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("SIGTERM: ending in order: run 1 is stopped"), "{text}");
    assert!(text.contains("\nlost: 0\n"), "{text}");
    assert_eq!((runs[0].state, runs[0].lost), (RunState::Stopped, Some(0)), "{runs:?}");
}

#[test]
fn run_goes_on_when_its_terminal_closes_and_ends_in_order_on_sigterm() {
    let mut s = run(&["--start"]);
    let st = s.wait_state("Running", with_events);
    s.note_pids(&st);
    s.term.close();
    // The run goes on without the terminal (--on-hangup keep, the default for `run`).
    let before = st["duration_s"].as_f64().unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    let st = s.wait_state("Running", |st| st["duration_s"].as_f64().unwrap_or(0.0) > before + 1.5);
    assert_eq!(st["run"], 1);
    // SAFETY: kill(2) with the pid of our own child.
    assert_eq!(unsafe { libc::kill(s.term.child.id() as i32, libc::SIGTERM) }, 0);
    let (code, _, runs) = s.end();
    assert_eq!(code, 0);
    assert_eq!((runs[0].state, runs[0].lost), (RunState::Stopped, Some(0)), "{runs:?}");
}
