//! Core pinning (CMS DAQ2) with real processes: a component's `cpus = [..]` pins its whole
//! process from its start (read back from `/proc/PID/status` and from every thread's), a thread
//! role's `*_cpus` pins that role's threads, the status shows each component's CPUs, and
//! `daqflow run --check` refuses CPUs outside the operator's set, empty lists and duplicates.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daqflow_runcontrol::operator::{Operator, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use daqflow_wire::affinity::{self, CpuSet};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// The `Cpus_allowed_list` of `/proc/…/status` (a process's or a thread's).
fn cpus_allowed(status: &Path) -> String {
    let text = std::fs::read_to_string(status).unwrap_or_else(|e| panic!("{}: {e}", status.display()));
    let line = text.lines().find(|l| l.starts_with("Cpus_allowed_list:")).expect("Cpus_allowed_list");
    line.split_whitespace().nth(1).unwrap_or_default().to_owned()
}

/// Every thread of process `pid`: (its name, its `Cpus_allowed_list`).
fn threads(pid: u64) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let (Ok(comm), true) = (std::fs::read_to_string(dir.join("comm")), dir.join("status").exists()) else {
            continue;
        };
        out.push((comm.trim().to_owned(), cpus_allowed(&dir.join("status"))));
    }
    out
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn component<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["components"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

#[test]
fn a_component_pinned_with_cpus_runs_there_with_every_thread_and_says_so() {
    let allowed = affinity::allowed().unwrap();
    let first = allowed.cpus()[0];
    let last = *allowed.cpus().last().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // ru-0: the whole process on the first CPU. bu-0: the process unpinned, its builder thread
    // on the last CPU, its I/O thread on the first. The EVM and the source: not pinned.
    let text = format!(
        r#"[system]
name = "pin"
control = "127.0.0.1:0"
data = "{data}"
timeout_s = 20

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
evm = "${{evm.listen}}"
io_cpus = [{first}]
build_cpus = [{last}]

[[component]]
name = "ru-0"
kind = "ru"
cpus = [{first}]
[component.params]
id = 0
evm = "${{evm.listen}}"
streams = 1
io_cpus = [{first}]

[[component]]
name = "src-0"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 0
ru = "${{ru-0.listen}}"
rate_hz = 500.0
"#,
        data = dir.path().join("data").display()
    );
    let file = SystemFile::parse(&text, &daqflow::registry::standard()).unwrap_or_else(|e| panic!("{e}"));
    let op = Operator::launch(OperatorOptions::new(file, BIN.into())).unwrap_or_else(|e| panic!("launch: {e}"));
    op.configure().unwrap();
    op.start(None).unwrap();
    wait_until("events", Duration::from_secs(30), || op.status().events > 50);
    let status = serde_json::to_value(op.status()).unwrap();

    // ru-0: pinned as a whole, every thread of it (the control plane's, the RU's) on `first`.
    let ru = component(&status, "ru-0");
    assert_eq!(ru["cpus"], first.to_string(), "{ru}");
    let ru_pid = ru["pid"].as_u64().unwrap();
    assert_eq!(cpus_allowed(Path::new(&format!("/proc/{ru_pid}/status"))), first.to_string());
    let ru_threads = threads(ru_pid);
    assert!(ru_threads.len() > 1, "{ru_threads:?}");
    for (name, cpus) in &ru_threads {
        assert_eq!(cpus, &first.to_string(), "ru-0's thread {name}");
    }
    // bu-0: the process may use every CPU (its status says so); its roles' threads are pinned.
    let bu = component(&status, "bu-0");
    assert_eq!(bu["cpus"], allowed.to_string(), "{bu}");
    let bu_threads = threads(bu["pid"].as_u64().unwrap());
    let role = |thread: &str| {
        bu_threads.iter().find(|(n, _)| n == thread).map(|(_, c)| c.clone()).unwrap_or_else(|| panic!("{bu_threads:?}"))
    };
    assert_eq!(role("bu-0-build0"), last.to_string());
    assert_eq!(role("bu-0-bu"), first.to_string());
    // Unpinned: the operator's own set.
    assert_eq!(component(&status, "evm")["cpus"], allowed.to_string());
    let summary = op.stop().unwrap();
    assert_eq!(summary.lost, 0, "{summary:?}");
    op.shutdown();
}

/// `daqflow run FILE --check` on `text`: (exit code, output).
fn check(dir: &Path, text: &str) -> (Option<i32>, String) {
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    let o = Command::new(BIN).args(["run", path.to_str().unwrap(), "--check"]).output().unwrap();
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn run_check_refuses_cpus_outside_the_operators_set_empty_lists_and_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = affinity::allowed().unwrap();
    let file = |cpus: &str, params: &str| {
        format!(
            "[system]\nname = \"t\"\n\n[[component]]\nname = \"ru-0\"\nkind = \"ru\"\n{cpus}\n[component.params]\n{params}\n"
        )
    };
    let cases: Vec<(String, String)> = vec![
        (
            file("cpus = [999]", ""),
            format!("line 7: `ru-0`: `cpus` = [999] names CPU 999, outside the CPUs the operator may use ({allowed})"),
        ),
        (file("cpus = []", ""), "line 7: `ru-0`: `cpus` = [] names no CPU".into()),
        (file("cpus = [0, 0]", ""), "line 7: `ru-0`: `cpus` = [0, 0] names CPU 0 twice".into()),
        (file("cpus = \"0\"", ""), "`cpus` = \"0\" is not a list of CPU numbers".into()),
        (
            file("", "io_cpus = [999]"),
            format!("`io_cpus` = [999] names CPU 999, outside the CPUs the process checking it may use ({allowed})"),
        ),
        (file("", "io_cpus = [1, 1]"), "`io_cpus` = [1, 1] names CPU 1 twice".into()),
    ];
    for (text, expected) in &cases {
        let (code, out) = check(dir.path(), text);
        assert_eq!(code, Some(2), "{text}\n{out}");
        assert!(out.contains(expected.as_str()), "expected {expected:?} in:\n{out}\nfor:\n{text}");
    }
    // A role's CPUs outside the component's own.
    if allowed.len() >= 2 {
        let [a, b] = [allowed.cpus()[0], allowed.cpus()[1]];
        let (code, out) = check(dir.path(), &file(&format!("cpus = [{a}]"), &format!("io_cpus = [{b}]")));
        assert_eq!(code, Some(2), "{out}");
        assert!(
            out.contains(&format!("`io_cpus` names CPU {b}, outside the CPUs `ru-0`'s `cpus` may use ({a})")),
            "{out}"
        );
    }
    // What the operator may use is fine.
    let every: Vec<String> = allowed.cpus().iter().map(usize::to_string).collect();
    let list = every.join(", ");
    let (code, out) = check(dir.path(), &file(&format!("cpus = [{list}]"), &format!("io_cpus = [{list}]")));
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn a_component_process_refuses_cpus_it_may_not_use() {
    let o = Command::new(BIN).args(["component", "sink", "--name", "s", "--cpus", "999"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cpus 999") && err.contains("outside the CPUs this process may use"), "{err}");
    let o = Command::new(BIN).args(["component", "sink", "--name", "s", "--cpus", "1-0"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a list of CPUs"), "{o:?}");
    // Pinned within the allowed set, it answers with its CPUs (and, pinned, the rest of its
    // life runs there).
    let first = CpuSet::single(affinity::allowed().unwrap().cpus()[0]).unwrap();
    let mut child = Command::new(BIN)
        .args(["component", "sink", "--name", "s", "--cpus", &first.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "state").unwrap();
        // The process is pinned from its start: read it while it runs.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(cpus_allowed(Path::new(&format!("/proc/{pid}/status"))), first.to_string());
        for (name, cpus) in threads(u64::from(pid)) {
            assert_eq!(cpus, first.to_string(), "thread {name}");
        }
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
}
