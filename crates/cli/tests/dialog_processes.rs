//! The control plane with real processes: `daqflow control-server` and `daqflow dialog …`
//! children, killed with SIGKILL, frozen with SIGSTOP, restarted.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Proc;

fn control_server(extra: &[&str]) -> (Proc, String) {
    let mut args =
        vec!["control-server", "--listen", "127.0.0.1:0", "--heartbeat-interval", "200ms", "--lost-after", "1s"];
    args.extend_from_slice(extra);
    let mut p = Proc::spawn(&args);
    let line = p.expect("listening on ");
    let addr = line.trim_start_matches("listening on ").to_owned();
    (p, addr)
}

fn dialog(control: &str, args: &[&str]) -> Proc {
    let mut a = vec!["dialog", "--control", control];
    a.extend_from_slice(args);
    Proc::spawn(&a)
}

#[test]
fn a_provider_killed_with_sigkill_is_reported_lost_and_a_spare_takes_over() {
    let (_cs, addr) = control_server(&[]);
    let mut provider = dialog(&addr, &["--name", "hv-1", "peer", "--provide", "hv/state"]);
    provider.expect("ready hv-1");
    let mut listener = dialog(&addr, &["listen", "hv/state", "--seq"]);
    provider.expect("subscribers hv/state 1");
    provider.send("hv/state ramping");
    listener.expect("ramping");
    provider.signal(libc::SIGKILL);
    let lost = listener.expect("lost: provider hv-1");
    assert!(lost.contains("connection closed") || lost.contains("no heartbeat"), "{lost}");
    let mut spare = dialog(&addr, &["--name", "hv-spare", "peer", "--provide", "hv/state"]);
    spare.expect("ready hv-spare");
    spare.expect("subscribers hv/state 1");
    spare.send("hv/state on");
    listener.expect("on");
}

#[test]
fn a_frozen_process_is_declared_lost_and_both_sides_are_told() {
    let (_cs, addr) = control_server(&[]);
    let mut upstream = dialog(&addr, &["--name", "upstream", "peer", "--provide", "b"]);
    upstream.expect("ready upstream");
    let mut middle = dialog(&addr, &["--name", "middle", "peer", "--provide", "a", "--subscribe", "b"]);
    middle.expect("ready middle");
    upstream.expect("subscribers b 1");
    let mut downstream = dialog(&addr, &["--name", "downstream", "peer", "--subscribe", "a"]);
    downstream.expect("ready downstream");
    middle.expect("subscribers a 1");
    middle.signal(libc::SIGSTOP);
    // Silent for the check interval: the subscriber of its service is told (lost sender) and
    // the provider it subscribed from is told (lost receiver).
    downstream.expect("lost a middle (no heartbeat)");
    upstream.expect("subscribers b 0");
    middle.signal(libc::SIGCONT);
    // Back from the dead, it reconnects, registers again, and its subscriber gets it back.
    middle.send("a alive-again");
    downstream.expect("alive-again");
    upstream.expect("subscribers b 1");
}

#[test]
fn the_control_server_killed_and_restarted_gets_everything_registered_again() {
    let (mut cs, addr) = control_server(&[]);
    let mut provider =
        dialog(&addr, &["--name", "ru-1", "peer", "--provide", "ru-1/stats", "--command", "ru-1/configure"]);
    provider.expect("ready ru-1");
    let mut listener = dialog(&addr, &["--name", "monitor", "peer", "--subscribe", "ru-1/stats"]);
    listener.expect("ready monitor");
    provider.expect("subscribers ru-1/stats 1");
    provider.send("ru-1/stats before");
    listener.expect("before");
    cs.signal(libc::SIGKILL);
    cs.wait_exit();
    // Updates keep flowing on the established connection while the server is down.
    provider.send("ru-1/stats during");
    listener.expect("during");
    let (_cs2, addr2) = {
        let mut p =
            Proc::spawn(&["control-server", "--listen", &addr, "--heartbeat-interval", "200ms", "--lost-after", "1s"]);
        p.expect("listening on ");
        (p, addr.clone())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(["dialog", "--control", &addr2, "ls", "--json", "--timeout", "2s"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            let procs: serde_json::Value = serde_json::from_str(&text).unwrap();
            let find = |n: &str| procs.as_array().unwrap().iter().find(|p| p["name"] == n).cloned();
            if let (Some(ru), Some(mon)) = (find("ru-1"), find("monitor"))
                && ru["provides"][0] == "ru-1/stats"
                && ru["commands"][0] == "ru-1/configure"
                && mon["subscribes"][0] == "ru-1/stats"
            {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not everything registered again: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr2, "send", "--raw", "ru-1/configure", "run=8"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    provider.expect("command ru-1/configure from");
    provider.send("ru-1/stats after");
    listener.expect("after");
}

#[test]
fn a_publisher_at_the_end_of_its_input_leaves_as_a_process_and_subscribers_are_told_disconnected() {
    let (_cs, addr) = control_server(&[]);
    let mut publisher = dialog(&addr, &["--name", "pub-1", "publish", "pub/state"]);
    let mut listener = dialog(&addr, &["listen", "pub/state"]);
    // Its first value may reach the listener as the current one or as an update.
    publisher.send("first");
    listener.expect("first");
    publisher.close_stdin();
    // LOST_SENDER reason 3, not INFO_SERVICE withdrawn (which `service withdrawn` would show).
    let lost = listener.expect("lost: provider pub-1");
    assert!(lost.contains("(disconnected)"), "{lost}");
    assert_eq!(publisher.wait_exit(), 0);
}

#[test]
fn publishing_a_service_another_process_provides_is_refused_and_exits_non_zero() {
    let (_cs, addr) = control_server(&[]);
    let mut owner = dialog(&addr, &["--name", "owner", "peer", "--provide", "x/y"]);
    owner.expect("ready owner");
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr, "publish", "x/y"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("service `x/y` is already provided by `owner`"), "{err}");
}

#[test]
fn a_wrong_token_is_refused_and_logged() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("token");
    let bad = dir.path().join("bad");
    let public = dir.path().join("public");
    for (path, text) in [(&good, "correct-horse\n"), (&bad, "battery-staple\n"), (&public, "correct-horse\n")] {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (mut cs, addr) = control_server(&["--token-file", good.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr, "--token-file", bad.to_str().unwrap(), "ls", "--timeout", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong token"), "the client says why: {err}");
    assert!(cs.stderr_contains("wrong token"), "the control server logs the refusal");
    // A token file others may read is refused before anything is sent.
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr, "--token-file", public.to_str().unwrap(), "ls"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"), "{out:?}");
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr, "--token-file", good.to_str().unwrap(), "ls"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn ls_prints_processes_with_long_names_without_panicking() {
    let (_cs, addr) = control_server(&[]);
    // Names of the longest kind dialog allows (200 characters), and so many services that
    // their column is wider than any format width (65535).
    let long = format!("component-{}", "x".repeat(190));
    assert_eq!(long.len(), 200);
    let services: Vec<String> = (0..340).map(|i| format!("s{i:03}/{}", "v".repeat(195))).collect();
    let mut args = vec!["--name", long.as_str(), "peer"];
    for s in &services {
        args.extend(["--provide", s.as_str()]);
    }
    let mut peer = dialog(&addr, &args);
    peer.expect(&format!("ready {long}"));
    let mut short = dialog(&addr, &["--name", "hv", "peer", "--provide", "hv/state"]);
    short.expect("ready hv");
    for extra in [&[][..], &["--filter", "component-"][..]] {
        let mut args = vec!["dialog", "--control", addr.as_str(), "ls"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_daqflow")).args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let row = stdout.lines().find(|l| l.starts_with(&long)).unwrap_or_else(|| panic!("{stdout}"));
        assert!(services.iter().all(|s| row.contains(s.as_str())), "a service is missing from the row");
        // Columns line up: the address column starts at the same character in every row.
        let header = stdout.lines().next().unwrap();
        let column = header.find("ADDRESS").unwrap();
        assert_eq!(column, long.len() + 2, "{header}");
        for l in stdout.lines().skip(1) {
            let at: String = l.chars().skip(column).take(3).collect();
            assert!(at.starts_with("127") || at.starts_with("loc"), "{at:?} in a row of {} characters", l.len());
        }
    }
}

#[test]
fn a_control_server_stopped_longer_than_its_timeout_declares_nobody_lost_when_it_resumes() {
    // Heartbeats every 200 ms, lost after 1 s.
    let (mut cs, addr) = control_server(&[]);
    let mut hv = dialog(&addr, &["--name", "hv-1", "peer", "--provide", "hv/state", "--subscribe", "mon/state"]);
    hv.expect("ready hv-1");
    let mut mon = dialog(&addr, &["--name", "mon", "peer", "--provide", "mon/state", "--subscribe", "hv/state"]);
    mon.expect("ready mon");
    hv.expect("subscribers hv/state 1");
    mon.expect("subscribers mon/state 1");
    // The server does not run for three times its timeout while the processes heartbeat.
    cs.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    cs.signal(libc::SIGCONT);
    // More than a full timeout with the server running: nobody is lost, nobody left.
    std::thread::sleep(Duration::from_secs(2));
    hv.send("hv/state on");
    mon.expect("on");
    mon.send("mon/state watching");
    hv.expect("watching");
    for (name, p) in [("hv-1", &mut hv), ("mon", &mut mon)] {
        let out = p.drain();
        assert!(!out.contains("lost"), "{name} was told of a loss: {out}");
        let counts: Vec<&str> = out.lines().filter(|l| l.starts_with("subscribers")).collect();
        let first = counts.iter().position(|l| l.ends_with(" 1")).expect("subscribed");
        assert!(counts[first..].iter().all(|l| l.ends_with(" 1")), "{name} lost its subscriber: {out}");
        let err = p.stderr_lines().join("\n");
        assert!(!err.contains("lost the control server"), "{name} left the server: {err}");
    }
    let err = cs.stderr_lines().join("\n");
    assert!(!err.contains("declaring the process lost"), "{err}");
    assert!(err.contains("the control server did not run for"), "the server did not notice its own stall: {err}");
}

/// The names of the processes `dialog ls` lists at the control server `addr` (none if it does
/// not answer).
fn listed(addr: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", addr, "ls", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let names = v.as_array().into_iter().flatten().filter_map(|p| p["name"].as_str());
    names.filter(|n| !n.starts_with("dialog-")).map(str::to_owned).collect()
}

#[test]
fn with_a_spare_a_stopped_primary_loses_its_processes_to_it_and_ends_when_it_resumes() {
    let (mut primary, a) = control_server(&["--end-after-stall"]);
    let (_spare, b) = control_server(&["--end-after-stall"]);
    let both = format!("{a},{b}");
    let mut hv = dialog(&both, &["--name", "hv-1", "peer", "--provide", "hv/state"]);
    hv.expect("ready hv-1");
    let mut mon = dialog(&both, &["--name", "mon", "peer", "--subscribe", "hv/state"]);
    mon.expect("ready mon");
    hv.expect("subscribers hv/state 1");
    // The primary does not run: the processes move to the spare meanwhile.
    primary.signal(libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut on_spare = listed(&b);
    while !(on_spare.contains(&"hv-1".to_owned()) && on_spare.contains(&"mon".to_owned())) {
        assert!(Instant::now() < deadline, "the processes did not move to the spare: it lists {on_spare:?}");
        std::thread::sleep(Duration::from_millis(200));
        on_spare = listed(&b);
    }
    // Resumed, the primary finds that it did not run for longer than its processes wait, and
    // ends rather than serve a second directory beside the spare's.
    primary.signal(libc::SIGCONT);
    assert!(primary.stderr_contains("this one ends rather than serve a second directory"), "the primary went on");
    assert_eq!(primary.wait_exit(), 1);
    // A process that starts now joins the others, and values flow.
    let mut late = dialog(&both, &["--name", "late", "peer", "--subscribe", "hv/state"]);
    late.expect("ready late");
    hv.expect("subscribers hv/state 2");
    hv.send("hv/state on");
    mon.expect("on");
    late.expect("on");
    let on_spare = listed(&b);
    for name in ["hv-1", "mon", "late"] {
        assert!(on_spare.contains(&name.to_owned()), "{name} is not with the others: {on_spare:?}");
    }
}
