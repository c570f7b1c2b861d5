//! Several hosts on one machine (`daqflow::hosts`: network namespaces joined by a switch), and
//! the operator starting components on them over ssh: the hosts reach each other and vanish
//! without a trace, also when a test panics; a system whose components run on other hosts
//! takes a run, its components proving the system token they got over ssh; and whether the
//! operator ends normally, is killed, or its host drops off the network, every remote
//! component ends within its lease and no daqflow process is left anywhere.
//!
//! Needs root and iproute2 (and OpenSSH for the ssh tests): without root, or without a tool
//! outside CI, each test says why and passes without running; in CI (`CI` set) as root, a
//! missing tool fails the test (`.ci/run` installs them).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Proc;
use daqflow::hosts::{Host, Hosts};
use daqflow_runcontrol::db::RunDb;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// The system file's lease in these tests: the shortest allowed (more than 6 s).
const LEASE_S: f64 = 7.0;

/// One set of hosts at a time: each test runs a dozen processes on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Whether test hosts (with sshd, if `ssh`) can run here: [`common::hosts_available`].
fn available(ssh: bool) -> bool {
    common::hosts_available(ssh)
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `ip` program (in `/usr/sbin` or `/sbin` also when `PATH` lacks them).
fn ip() -> std::process::Command {
    let path = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].into_iter().find(|p| Path::new(p).is_file());
    std::process::Command::new(path.unwrap_or("ip"))
}

/// `daqflow control-server --listen ADDR` in `host`, once it listens.
fn control_server(host: &Host, addr: &str) -> Proc {
    let mut cmd = host.command(BIN);
    cmd.args(["control-server", "--listen", addr]);
    let mut cs = Proc::spawn_command(cmd);
    cs.expect(&format!("listening on {addr}"));
    cs
}

/// The names of the processes `daqflow dialog ls` run in `host` finds at the control server
/// `addr`.
fn dialog_ls(host: &Host, addr: &str) -> String {
    host.run(BIN, ["dialog", "--control", addr, "ls"]).unwrap()
}

#[test]
fn hosts_reach_each_other_and_a_second_set_with_the_same_addresses_is_apart() {
    if !available(false) {
        return;
    }
    let _one = lock();
    let a = Hosts::create(2).unwrap();
    let b = Hosts::create(2).unwrap();
    assert_eq!(
        (a.len(), a.host(0).addr().to_string(), a.host(1).addr().to_string()),
        (2, "10.77.0.1".into(), "10.77.0.2".into())
    );
    assert_ne!(a.host(1).namespace(), b.host(1).namespace());
    // A control server on host 2 of each set, on the same address and port.
    let _cs_a = control_server(a.host(1), "10.77.0.2:7000");
    let _cs_b = control_server(b.host(1), "10.77.0.2:7000");
    // TCP from host 1 to host 2, through the switch: a process joins set A's server and shows.
    let mut cmd = a.host(0).command(BIN);
    cmd.args(["dialog", "--control", "10.77.0.2:7000", "--name", "from-host-1", "publish", "greeting"]);
    let mut publisher = Proc::spawn_command(cmd);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dialog_ls(a.host(1), "10.77.0.2:7000").contains("from-host-1") {
        assert!(Instant::now() < deadline, "the process on host 1 never reached host 2");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Set B's server, at the same address in its own namespaces, never heard of it.
    assert!(!dialog_ls(b.host(0), "10.77.0.2:7000").contains("from-host-1"));
    publisher.close_stdin();
    // Nothing of either set is in this process's namespace.
    let here = ip().args(["-o", "addr"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&here.stdout).contains("10.77.0."),
        "an address of a set is in the root namespace"
    );
}

/// The namespaces of this process's sets that exist now.
fn namespaces_of_this_process() -> Vec<String> {
    let out = ip().args(["netns", "list"]).output().unwrap();
    let prefix = format!("dqf-{}-", std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn dropping_hosts_removes_their_namespaces_and_processes_also_when_a_test_panics() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let namespaces_before = namespaces_of_this_process();
    // Inside a test body that panics, with a process started in a host and one sshd per host.
    let seen: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
    let sleeper: Mutex<Option<std::process::Child>> = Mutex::new(None);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut hosts = Hosts::create(2).unwrap();
        hosts.start_sshd().unwrap();
        *sleeper.lock().unwrap() = Some(hosts.host(1).command("sleep").arg("600").spawn().unwrap());
        let mut seen = seen.lock().unwrap();
        for h in hosts.hosts() {
            for pid in h.pids().unwrap() {
                seen.push((h.namespace().to_owned(), pid));
            }
        }
        assert_eq!(seen.len(), 3, "an sshd on each host and the sleeper: {seen:?}");
        panic!("a test body fails");
    }));
    let leftovers = seen.into_inner().unwrap_or_else(|p| p.into_inner());
    // The process started in a host was killed.
    let mut sleeper = sleeper.into_inner().unwrap().expect("the sleeper started");
    let status = daqflow::hosts::wait_timeout(&mut sleeper, Duration::from_secs(5)).unwrap();
    assert_eq!(status.map(|s| std::os::unix::process::ExitStatusExt::signal(&s)), Some(Some(libc::SIGKILL)));
    assert!(result.is_err());
    for (ns, pid) in &leftovers {
        assert!(gone(*pid), "process {pid} of {ns} is still there");
    }
    assert_eq!(namespaces_of_this_process(), namespaces_before, "namespaces left behind");
}

/// A system of three hosts: the operator on the first (the control server on its address),
/// a chain generator on the second sending to a sink on the third (its address given in full),
/// and the message logger on the second, every remote component started over ssh.
fn remote_system(dir: &Path, remote_command: &str) -> PathBuf {
    remote_system_with(dir, remote_command, "10.77.0.1:0")
}

/// [`remote_system`] with the control servers `control`.
fn remote_system_with(dir: &Path, remote_command: &str, control: &str) -> PathBuf {
    let text = format!(
        r#"[system]
name = "hosts"
control = "{control}"
web = "none"
lease_s = {LEASE_S}
remote_command = "{remote_command}"

[[component]]
name = "msglogger"
kind = "msglogger"
host = "10.77.0.2"
[component.params]
control = "${{system.control}}"
database = "${{system.database}}"

[[component]]
name = "sink"
kind = "sink"
host = "10.77.0.3"
[component.params]
listen = "10.77.0.3:0"
stop_timeout_ms = 3000

[[component]]
name = "generator"
kind = "generator"
host = "10.77.0.2"
[component.params]
downstream = "${{sink.listen}}"
chunk_bytes = 4096
rate_hz = 2000
"#
    );
    let path = dir.join("system.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A system of [`remote_system`] in run 1 (fields in the order they are dropped).
struct InRun {
    /// `daqflow run SYSTEM --data DATA ARGS` in host 1.
    op: Proc,
    /// Three hosts with an sshd each.
    hosts: Hosts,
    /// The operator's data directory.
    data: PathBuf,
    /// The processes of the three remote components: pid and command line.
    components: Vec<(u32, String)>,
    _dir: tempfile::TempDir,
}

/// Starts [`remote_system`] with `daqflow run … ARGS` (`--start`, maybe `--seconds`) and waits
/// until its run started.
fn in_run(args: &[&str]) -> InRun {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut hosts = Hosts::create(3).unwrap();
    hosts.start_sshd().unwrap();
    let system = remote_system(dir.path(), &hosts.remote_command(Path::new(BIN)).unwrap());
    let mut op = operator(&hosts, &system, &data, args);
    op.expect("run 1 started");
    let components = remote_components(&hosts);
    assert_eq!(components.len(), 3, "{components:?}");
    InRun { op, hosts, data, components, _dir: dir }
}

/// `daqflow run SYSTEM --data DATA ARGS` in host 1.
fn operator(hosts: &Hosts, system: &Path, data: &Path, args: &[&str]) -> Proc {
    let mut cmd = hosts.host(0).command(BIN);
    cmd.arg("run").arg(system).arg("--data").arg(data).args(args);
    Proc::spawn_command(cmd)
}

/// The daqflow processes in `host` now: pid and command line.
fn daqflow_processes(host: &Host) -> Vec<(u32, String)> {
    let bin = std::fs::canonicalize(BIN).unwrap();
    host.pids()
        .unwrap()
        .into_iter()
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == bin))
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

/// The components running on the remote hosts (2 and 3), by pid.
fn remote_components(hosts: &Hosts) -> Vec<(u32, String)> {
    hosts.hosts()[1..].iter().flat_map(daqflow_processes).filter(|(_, cmd)| cmd.contains(" component ")).collect()
}

/// Waits until every process of `pids` is gone; how long that took, or `None` after `limit`.
fn wait_gone(pids: &[(u32, String)], limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if pids.iter().all(|(p, _)| gone(*p)) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Asserts that no daqflow process is left in any host.
fn assert_no_daqflow_left(hosts: &Hosts) {
    for h in hosts.hosts() {
        let left = daqflow_processes(h);
        assert!(left.is_empty(), "daqflow processes left in {}: {left:?}", h.namespace());
    }
}

#[test]
fn an_operator_starts_components_on_other_hosts_over_ssh_and_they_end_with_it() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let InRun { op, hosts, data, components, _dir } = in_run(&["--start", "--seconds", "3"]);
    // Each remote component runs on its host, and got the token on its input: not on its
    // command line, not in its environment.
    let token = std::fs::read_to_string(data.join("token")).unwrap().trim().to_owned();
    let names: Vec<&str> = components.iter().map(|(_, c)| c.split(" --name ").nth(1).unwrap_or("")).collect();
    for want in ["msglogger", "generator", "sink"] {
        assert!(names.iter().any(|n| n.starts_with(want)), "{want} runs on no remote host: {components:?}");
    }
    let on_host_3: Vec<String> = daqflow_processes(hosts.host(2)).into_iter().map(|(_, c)| c).collect();
    assert!(on_host_3.iter().any(|c| c.contains("--name sink")), "{on_host_3:?}");
    for (pid, cmd) in &components {
        assert!(cmd.contains("--token-stdin") && cmd.contains(&format!("--lease {LEASE_S}")), "{cmd}");
        assert!(!cmd.contains(&token), "the token is on a command line");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains(&token) && !environ.contains("DAQFLOW_TOKEN"), "{cmd}: {environ}");
    }
    let (code, out) = finish(op);
    assert_eq!(code, 0, "{out}");
    // The operator ended: every remote component ends at once (its input, held by the
    // operator through ssh, ended), and nothing of the system is left on any host.
    let took = wait_gone(&components, Duration::from_secs(15));
    assert!(took.is_some(), "remote components still run after the operator ended: {:?}", remote_components(&hosts));
    eprintln!("the remote components ended {took:?} after the operator");
    assert_no_daqflow_left(&hosts);

    // The chain ran across the hosts: the sink counted the generator's chunks, none missing.
    let db = chain_counted_every_chunk(&data);
    // Their output landed in the operator's logs directory, their records in the database
    // (the message logger on host 2 subscribed to the logs of host 3).
    let sink_log = std::fs::read_to_string(data.join("logs/sink.log")).unwrap();
    assert!(sink_log.contains("component started"), "{sink_log}");
    let logs = db.logs(&daqflow_runcontrol::db::LogQuery { limit: Some(10_000), ..Default::default() }).unwrap();
    for p in ["operator", "sink", "generator"] {
        assert!(logs.iter().any(|r| r.process == p), "no log record of {p}");
    }
}

/// A spare control server on another host, started over ssh like a component: when the
/// primary's host (the operator's) drops off the network mid-run, the remote components move
/// to the spare and the run goes on; when the link is back, the primary finds them there and
/// ends rather than serve a second directory, the operator moves to the spare too, and the run
/// ends with nothing lost.
#[test]
fn a_spare_control_server_on_another_host_carries_the_run_while_the_primarys_host_is_cut_off() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut hosts = Hosts::create(3).unwrap();
    hosts.start_sshd().unwrap();
    let (primary, spare) = ("10.77.0.1:7100", "10.77.0.2:7100");
    let system =
        remote_system_with(dir.path(), &hosts.remote_command(Path::new(BIN)).unwrap(), &format!("{primary},{spare}"));
    let mut op = operator(&hosts, &system, &data, &["--start", "--seconds", "20"]);
    op.expect("run 1 started");
    // The spare runs on host 2, started over ssh, the token on its input, knowing the primary.
    let servers: Vec<(u32, String)> =
        daqflow_processes(hosts.host(1)).into_iter().filter(|(_, c)| c.contains(" control-server ")).collect();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let cmd = &servers[0].1;
    assert!(cmd.contains(&format!("--listen {spare}")) && cmd.contains(&format!("--siblings {primary}")), "{cmd}");
    assert!(cmd.contains("--token-stdin") && cmd.contains(&format!("--lease {LEASE_S}")), "{cmd}");
    // The operator's host is cut off for 5 s (shorter than the lease): the components find
    // their control server silent after 3 s and move to the spare.
    let link = |state: &str| {
        let done = ip().args(["-n", hosts.host(0).namespace(), "link", "set", "eth0", state]).status().unwrap();
        assert!(done.success(), "ip link set eth0 {state}: {done}");
    };
    link("down");
    std::thread::sleep(Duration::from_secs(5));
    link("up");
    // Back: the primary, left with the operator alone, ends; the operator joins the others.
    let log = data.join("logs/control-server-0.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("split between this control server") {
        assert!(
            Instant::now() < deadline,
            "the primary never ended:
{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let token = data.join("token");
        let ls = hosts
            .host(1)
            .run(BIN, ["--token-file", token.to_str().unwrap(), "dialog", "--control", spare, "ls"])
            .unwrap();
        if ["operator", "sink", "generator", "msglogger"].iter().all(|n| ls.contains(n)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spare's directory lacks processes:
{ls}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The run ends by itself (--seconds) through the spare: nothing lost, every chunk counted.
    let (code, out) = finish(op);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lost: 0"), "{out}");
    chain_counted_every_chunk(&data);
    let spare_gone = wait_gone(&servers, Duration::from_secs(15));
    assert!(spare_gone.is_some(), "the spare still runs after the operator ended");
    assert_no_daqflow_left(&hosts);
}

/// Run 1 of [`remote_system`] in the run database of `data`: the sink counted every chunk the
/// generator sent, none missing, out of order or corrupt. The database, for more checks.
fn chain_counted_every_chunk(data: &Path) -> RunDb {
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let summary = db.run(1).unwrap().unwrap().summary.expect("run 1 has a summary");
    let sink = summary.components["sink"].summary.clone().expect("the sink's stop summary");
    assert!(sink.events > 1000, "{sink:?}");
    for key in ["sequence_errors", "crc_errors", "missing"] {
        assert_eq!(sink.detail[key].as_u64(), Some(0), "{key}: {sink:?}");
    }
    assert_eq!(summary.components["generator"].summary.as_ref().map(|s| s.events), Some(sink.events));
    db
}

/// Collects the operator's output until it exits; (exit code, stdout).
fn finish(mut op: Proc) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = op.child.try_wait().unwrap() {
            let out = op.drain();
            return (s.code().unwrap_or(-1), out);
        }
        assert!(Instant::now() < deadline, "the operator did not end: {}", op.drain());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn remote_components_end_when_the_operator_is_killed_in_a_run() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let InRun { op, hosts, components, _dir, .. } = in_run(&["--start"]);
    op.signal(libc::SIGKILL);
    let limit = Duration::from_secs_f64(LEASE_S + 10.0);
    let took = wait_gone(&components, limit);
    assert!(
        took.is_some(),
        "remote components still run {limit:?} after the operator was killed: {:?}",
        remote_components(&hosts)
    );
    eprintln!("the remote components ended {took:?} after the operator was killed");
    assert_no_daqflow_left(&hosts);
}

#[test]
fn remote_components_end_by_their_lease_when_the_operators_host_drops_off_the_network() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let InRun { mut op, hosts, data, components, _dir } = in_run(&["--start"]);
    // The operator's host is cut off: no connection closes, nothing ends on either side, the
    // remote components only stop hearing from their control server.
    let link = |state: &str| {
        let done = ip().args(["-n", hosts.host(0).namespace(), "link", "set", "eth0", state]).status().unwrap();
        assert!(done.success(), "ip link set eth0 {state}: {done}");
    };
    link("down");
    let cut = Instant::now();
    // A control server is declared lost after 3 s of silence; then the lease runs; then the
    // run in progress is stopped (the sink waits at most 3 s for the generator's end).
    let limit = Duration::from_secs_f64(3.0 + LEASE_S + 15.0);
    let took = wait_gone(&components, limit);
    assert!(took.is_some(), "remote components still run {limit:?} after their operator was cut off");
    assert!(cut.elapsed() >= Duration::from_secs_f64(LEASE_S), "they ended before their lease: {:?}", cut.elapsed());
    eprintln!("the remote components ended {took:?} after their operator's host was cut off");
    // Back on the network, what they wrote while cut off reaches the operator's logs: why each
    // ended.
    link("up");
    let deadline = Instant::now() + Duration::from_secs(60);
    let wanted = format!("longer than the lease of {LEASE_S} s: ending");
    for name in ["sink", "generator", "msglogger"] {
        let log = data.join(format!("logs/{name}.log"));
        while !std::fs::read_to_string(&log).unwrap_or_default().contains(&wanted) {
            assert!(
                Instant::now() < deadline,
                "{name}.log never said why it ended:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    op.signal(libc::SIGKILL);
    let _ = op.wait_exit();
    let operator_side: Vec<(u32, String)> = daqflow_processes(hosts.host(0));
    assert!(wait_gone(&operator_side, Duration::from_secs(10)).is_some(), "{operator_side:?}");
    assert_no_daqflow_left(&hosts);
}

/// The event ids in the files the recorders of [`builder_system`] wrote under `dir`, each file
/// checked: clean, or (`all_closed` false) cut short by a writer that died but whole up to its
/// last event.
fn recorded_ids(dir: &Path, all_closed: bool) -> std::collections::BTreeSet<u64> {
    let mut ids = std::collections::BTreeSet::new();
    for b in 0..2 {
        let files = dir.join(format!("files-{b}"));
        let daq: Vec<PathBuf> = std::fs::read_dir(&files)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "daq" || x == "part"))
            .collect();
        assert!(!daq.is_empty(), "recorder-{b} wrote nothing in {}", files.display());
        for f in daq {
            let reader = daqflow_wire::file::FileReader::open(&f).unwrap();
            let report = reader.verify(true).unwrap();
            if all_closed {
                assert!(report.is_clean(), "{}: {report:?}", f.display());
            } else {
                assert!(report.problems.is_empty(), "{}: {report:?}", f.display());
            }
            for item in reader.scan() {
                if let Ok(daqflow_wire::file::ScanItem::Record(r)) = item {
                    ids.insert(daqflow_wire::Event::parse(r.payload.clone()).unwrap().header().event_id.0);
                }
            }
        }
    }
    ids
}

/// An event builder on five hosts: the operator, its control server (bound to a wildcard) and
/// the EVM on host 1; an RU with two sources on each of hosts 2 and 3; on each of hosts 4 and 5
/// a BU putting events into an ET system there, and a recorder writing them to files. Every
/// listener binds a wildcard: what each component tells the others is its host's address.
fn builder_system(dir: &Path, remote_command: &str, bu_extra: &str) -> PathBuf {
    let tag = std::process::id();
    let mut text = format!(
        r#"[system]
name = "hosts-evb"
control = "0.0.0.0:0"
web = "none"
lease_s = {LEASE_S}
remote_command = "{remote_command}"

[[component]]
name = "evm"
kind = "evm"
[component.params]
listen = "0.0.0.0:0"
rus = 2
"#
    );
    for r in 0..2 {
        let host = format!("10.77.0.{}", 2 + r);
        text.push_str(&format!(
            r#"
[[component]]
name = "ru-{r}"
kind = "ru"
host = "{host}"
[component.params]
id = {r}
evm = "${{evm.listen}}"
listen = "0.0.0.0:0"
streams = 2
"#
        ));
        for k in 0..2 {
            let id = r * 2 + k;
            text.push_str(&format!(
                r#"
[[component]]
name = "src-{id}"
kind = "source"
host = "{host}"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = {id}
ru = "${{ru-{r}.listen}}"
rate_hz = 1000.0
size = {{ kind = "lognormal", mean = 1024.0, rms = 256.0 }}
"#
            ));
        }
    }
    for b in 0..2 {
        let host = format!("10.77.0.{}", 4 + b);
        let files = dir.join(format!("files-{b}"));
        text.push_str(&format!(
            r#"
[[component]]
name = "et-{b}"
kind = "et"
host = "{host}"
[component.params]
name = "hosts-{tag}-et-{b}"
events = 512
event_size = 16384

[[component]]
name = "recorder-{b}"
kind = "recorder"
host = "{host}"
policy = "restart"
[component.params]
et = "${{et-{b}.et}}"
directory = "{files}"

[[component]]
name = "bu-{b}"
kind = "bu"
host = "{host}"
policy = "restart"
[component.params]
id = {b}
evm = "${{evm.listen}}"
output = "et"
et = "${{et-{b}.et}}"
{bu_extra}
"#,
            files = files.display()
        ));
    }
    let path = dir.join("builder.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// [`builder_system`] on five hosts, in run 1 (fields in the order they are dropped).
struct BuilderRun {
    /// `daqflow run SYSTEM --start --seconds SECS` in host 1.
    op: Proc,
    hosts: Hosts,
    /// The operator's data directory.
    data: PathBuf,
    dir: tempfile::TempDir,
}

/// Starts [`builder_system`] (each BU with `bu_extra` parameters) for a run of `seconds` and
/// waits until the run started.
fn builder_run(seconds: &str, bu_extra: &str) -> BuilderRun {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut hosts = Hosts::create(5).unwrap();
    hosts.start_sshd().unwrap();
    let system = builder_system(dir.path(), &hosts.remote_command(Path::new(BIN)).unwrap(), bu_extra);
    let mut op = operator(&hosts, &system, &data, &["--start", "--seconds", seconds]);
    op.expect("run 1 started");
    BuilderRun { op, hosts, data, dir }
}

#[test]
fn an_event_builder_across_five_hosts_builds_and_records_every_event_also_when_a_bu_is_killed() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let BuilderRun { op, hosts, data, dir } = builder_run("8", "");
    // Each component runs where the system file puts it.
    let names = |i: usize| -> Vec<String> {
        daqflow_processes(hosts.host(i))
            .into_iter()
            .filter_map(|(_, c)| c.split(" --name ").nth(1).map(|n| n.split(' ').next().unwrap_or("").to_owned()))
            .collect()
    };
    for (i, want) in
        [(1, ["ru-0", "src-0", "src-1"]), (2, ["ru-1", "src-2", "src-3"]), (3, ["et-0", "recorder-0", "bu-0"])]
    {
        let on = names(i);
        for w in want {
            assert!(on.iter().any(|n| n == w), "{w} does not run on host {}: {on:?}", i + 1);
        }
    }
    // Mid-run, the BU of host 5 is killed: the EVM re-assigns its events, the operator starts
    // it again on its host over ssh, and it joins the run.
    std::thread::sleep(Duration::from_secs(3));
    let bu = daqflow_processes(hosts.host(4))
        .into_iter()
        .find(|(_, c)| c.contains("--name bu-1"))
        .unwrap_or_else(|| panic!("no bu-1 on host 5: {:?}", daqflow_processes(hosts.host(4))));
    // SAFETY: kill(2) of a process of this test's own namespace, found alive just now.
    unsafe { libc::kill(bu.0 as libc::pid_t, libc::SIGKILL) };
    let (code, out) = finish(op);
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    assert_no_daqflow_left(&hosts);

    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let summary = db.run(1).unwrap().unwrap().summary.expect("run 1 has a summary");
    assert!(summary.events > 2000, "{summary:?}");
    assert_eq!(summary.lost, 0, "{:?}", summary.lost_reasons);
    assert_eq!(summary.triggered, Some(summary.events), "{summary:?}");
    // Every event built is in a file; one the killed BU had put into its ET system before the
    // EVM re-assigned it may be there twice (counted as a duplicate, not as an event).
    assert_eq!(summary.not_recorded, 0, "{summary:?}");
    assert_eq!(summary.recorded - summary.duplicates, summary.events, "{summary:?}");
    // bu-1 was started again on its host and ended the run alive, its earlier life counted.
    assert_eq!(summary.components["bu-1"].earlier_lives, 1, "{:?}", summary.components["bu-1"]);
    assert!(summary.died.is_empty(), "{:?}", summary.died);
    assert!(
        summary.components["bu-1"].summary.as_ref().is_some_and(|s| s.events > 0),
        "the restarted bu-1 built nothing"
    );
    // Both BU hosts recorded events, every file checks clean, and the files hold every event id
    // of the run.
    let ids = recorded_ids(dir.path(), true);
    assert_eq!(ids.len() as u64, summary.events);
    assert_eq!((ids.first().copied(), ids.last().copied()), (Some(1), Some(summary.events)));
}

#[test]
fn when_a_bu_host_dies_with_its_et_system_and_recorder_nothing_is_lost() {
    if !available(true) {
        return;
    }
    let _one = lock();
    let BuilderRun { op, hosts, data, dir } = builder_run("20", "et_confirm = \"consumed\"");
    std::thread::sleep(Duration::from_secs(3));
    // Host 5's recorder falls behind (stopped for 1.5 s): events pile up in its ET system.
    let recorder = daqflow_processes(hosts.host(4))
        .into_iter()
        .find(|(_, c)| c.contains("--name recorder-1"))
        .unwrap_or_else(|| panic!("no recorder-1 on host 5"));
    // SAFETY: kill(2) of a process of this test's own namespace, found alive just now.
    unsafe { libc::kill(recorder.0 as libc::pid_t, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(1500));
    // Then host 5 dies: every daqflow process on it at once. Its ET system (policy stop) ends
    // the run.
    let victims = daqflow_processes(hosts.host(4));
    assert!(victims.len() >= 3, "{victims:?}");
    for (pid, _) in &victims {
        // SAFETY: kill(2) of processes of this test's own namespace, found alive just now.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    let (_code, out) = finish(op);
    assert_no_daqflow_left(&hosts);
    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let summary = db.run(1).unwrap().unwrap().summary.expect("run 1 has a summary");
    assert!(summary.died.iter().any(|d| d.component == "et-1"), "{:?}", summary.died);
    // Nothing is lost: the BUs confirm an event to the EVM only once the recorder behind their
    // ET system wrote it (`et_confirm = "consumed"`), so the EVM built again, on host 4, every
    // event the dead host had not recorded. Some are in both hosts' files: duplicates.
    assert_eq!(summary.triggered, Some(summary.events), "{summary:?}");
    assert_eq!((summary.lost, summary.not_recorded), (0, 0), "{:?}", summary.lost_reasons);
    assert_eq!(summary.recorded - summary.duplicates, summary.events, "{summary:?}");
    assert!(out.lines().any(|l| l == "lost: 0"), "{out}");
    // Every event id is in the files on disk (a file of the dead host's recorder is whole up to
    // its last event, just not closed).
    let ids = recorded_ids(dir.path(), false);
    assert_eq!(ids.len() as u64, summary.events, "{summary:?}");
    assert_eq!((ids.first().copied(), ids.last().copied()), (Some(1), Some(summary.events)));
    // The run stopped soon after the host died: nothing was restarted into it meanwhile.
    assert!(summary.seconds < 15.0, "the run went on for {} s after its ET system died", summary.seconds);
    eprintln!(
        "host 5 died: {} events built, {} recorded ({} twice), {} lost with the host: {:?}",
        summary.events, summary.recorded, summary.duplicates, summary.lost, summary.lost_reasons
    );
}
