//! One operator per data directory (`DATA/operator.lock`, docs/operator-guide.md "One operator
//! per data directory"): a second `daqflow demo` or `daqflow run` on a directory in use refuses
//! at once, naming the first, and touches nothing there; a lock left by a killed operator is
//! taken over, saying so; the tools find the running operator's control server through the
//! directory. Real processes, the real demo, the real run database.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::Proc;
use daqflow_api::RunState;
use daqflow_runcontrol::db::{Location, RunDb};

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// One test at a time: each runs two demos of 13 processes, and a machine starved of CPU makes
/// a demo's run fail for reasons that are not this file's subject.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for `p` to end (a demo's ordered stop takes seconds, more on a loaded machine); its
/// exit status.
fn exit_status(p: &mut Proc) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "the demo did not end within 300 s: {}", p.drain());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `daqflow demo` on `data`, with a web UI on a free port, until told otherwise.
fn demo(data: &Path) -> Proc {
    Proc::spawn(&["demo", "--web", "127.0.0.1:0", "--data", data.to_str().unwrap()])
}

/// A directory for the demos' data: on the RAM disk where there is one, so that a full disk of
/// the machine (which makes recorders throttle: docs/operator-guide.md, "Disk throttling") does
/// not decide the runs.
fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() { tempfile::tempdir_in("/dev/shm") } else { tempfile::tempdir() }.unwrap()
}

fn daqflow(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("DAQFLOW_LOG", "warn").output().expect("run daqflow")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn run_state(data: &Path, run: u32) -> RunState {
    let location = Location::parse("runs.sqlite").unwrap().under(data);
    let db = RunDb::connect(&location).unwrap();
    db.run(run).unwrap().unwrap_or_else(|| panic!("no run {run} in {location}")).record.state
}

/// The processes `pid` started (every thread's children).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

/// Whether `pid` runs (a zombie nobody reaped yet does not).
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (name) S …`: the state follows the name's closing parenthesis.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

#[test]
fn a_second_operator_on_a_data_directory_in_use_refuses_at_once_naming_the_first() {
    let _one = one_at_a_time();
    let dir = scratch();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    let mut first = demo(&data);
    let login = first.expect("web UI: ");
    let web = login.trim_start_matches("web UI: ").split("/?token=").next().unwrap().to_owned();
    // The ready-to-paste line, and the control plane it names.
    let paste = first.expect(" dialog ls");
    assert!(paste.trim_start().ends_with(&format!("--data {data_arg} dialog ls")), "{paste}");
    first.expect("run 1 started");
    let token = std::fs::read(data.join("token")).unwrap();
    let web_token = std::fs::read(data.join("web-token")).unwrap();
    let lock: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("operator.lock")).unwrap()).unwrap();
    assert_eq!(lock["pid"], first.child.id());
    assert_eq!(lock["web"], web.as_str());
    assert_eq!(lock["system"], "demo");

    // A second demo, and `daqflow run` on the same directory, with and without --repeat: each
    // refused at once, naming the first: its pid, since when, its web UI.
    let system = dir.path().join("demo.toml");
    std::fs::write(&system, daqflow(&["demo", "--print-config"]).stdout).unwrap();
    let system = system.to_str().unwrap();
    let attempts: [&[&str]; 4] = [
        &["demo", "--seconds", "2", "--web", "127.0.0.1:0", "--data", data_arg],
        &["--data", data_arg, "demo", "--seconds", "2", "--web", "none"],
        &["run", system, "--data", data_arg, "--web", "none", "--start", "--seconds", "2"],
        &["run", system, "--data", data_arg, "--web", "none", "--repeat", "1", "--start", "--seconds", "2"],
    ];
    for args in attempts {
        let t0 = Instant::now();
        let o = daqflow(args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}{err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{args:?} took {:?}", t0.elapsed());
        for part in [
            &format!("the data directory {data_arg} is in use by another operator"),
            &format!("pid {} on ", first.child.id()),
            &format!("since {}", lock["started"].as_str().unwrap()),
            &format!("web UI {web}"),
        ] {
            assert!(err.contains(part.as_str()), "{args:?}: {part:?} not in {err}");
        }
        assert!(!out.contains("daqflow demo:") && !out.contains("system `demo` up"), "{args:?} started: {out}");
    }
    // Nothing of the first's was touched: its tokens, its open run.
    assert_eq!(std::fs::read(data.join("token")).unwrap(), token, "the system token was overwritten");
    assert_eq!(std::fs::read(data.join("web-token")).unwrap(), web_token, "the web token was overwritten");
    assert_eq!(run_state(&data, 1), RunState::Running, "the first's open run was finished by another operator");

    // The tools find the first through its directory: `--data`, or its token file's directory.
    for args in
        [vec!["--data", data_arg, "dialog", "ls"], vec!["--token-file", &*format!("{data_arg}/token"), "dialog", "ls"]]
    {
        let o = daqflow(&args);
        let (out, err) = text(&o);
        assert!(o.status.success() && out.contains("evm/state") && out.contains("src-3"), "{args:?}: {out}{err}");
    }

    // The first goes on and ends as it should.
    first.signal(libc::SIGINT);
    assert_eq!(exit_status(&mut first), 0, "{}", first.drain());
    assert!(first.drain().contains("\nlost: 0"));
    assert_eq!(run_state(&data, 1), RunState::Stopped);
    // A clean end frees the directory: the tools say nobody runs there.
    assert_eq!(std::fs::read_to_string(data.join("operator.lock")).unwrap(), "");
    let o = daqflow(&["--data", data_arg, "dialog", "ls"]);
    let (out, err) = text(&o);
    assert!(!o.status.success() && err.contains("no operator is running there"), "{out}{err}");
}

#[test]
fn a_lock_left_by_a_killed_operator_is_taken_over_saying_so() {
    let _one = one_at_a_time();
    let dir = scratch();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    let mut first = demo(&data);
    first.expect("run 1 started");
    let pid = first.child.id();
    let left: Vec<u32> = children_of(pid);
    assert!(!left.is_empty(), "the demo started no processes");
    first.signal(libc::SIGKILL);
    exit_status(&mut first);

    // The tools say it is gone, and whose it was.
    let o = daqflow(&["--data", data_arg, "dialog", "ls"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}{err}");
    assert!(err.contains(&format!("its operator (pid {pid} on ")) && err.contains("is no longer running"), "{err}");

    // What the killed operator started ends with it (SIGTERM at its death); ended here if not.
    let gone = |limit: Duration| {
        let deadline = Instant::now() + limit;
        while left.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        !left.iter().any(|p| alive(*p))
    };
    if !gone(Duration::from_secs(10)) {
        for p in left.iter().filter(|p| alive(**p)) {
            // SAFETY: kill(2) on a process the killed demo started (alive just before); no
            // memory is involved.
            unsafe { libc::kill(*p as i32, libc::SIGTERM) };
        }
        assert!(gone(Duration::from_secs(60)), "processes of the killed demo still alive: {left:?}");
    }

    // The next demo takes the directory over, says so, and only it finishes run 1 as abandoned.
    assert_eq!(run_state(&data, 1), RunState::Running);
    let o = daqflow(&["demo", "--seconds", "2", "--web", "none", "--data", data_arg]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(err.contains(&format!("taking over the data directory {data_arg}: its operator (pid {pid} on ")), "{err}");
    assert!(err.contains("ended without releasing it"), "{err}");
    assert!(out.contains("run 2 started") && out.contains("\nlost: 0"), "{out}");
    assert_eq!(run_state(&data, 1), RunState::Abandoned);
    assert_eq!(run_state(&data, 2), RunState::Stopped);
}
