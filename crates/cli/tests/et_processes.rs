//! The ET system across real processes: `daqflow et start` and its producers and consumers,
//! killed with SIGKILL while holding events, frozen with SIGSTOP, and the ET process itself
//! killed and restarted.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Proc;

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// Starts an ET system; returns it and its remote address.
fn et_start(name: &str, extra: &[&str]) -> (Proc, String) {
    let mut args =
        vec!["et", "start", "--name", name, "--events", "200", "--event-size", "1024", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut p = Proc::spawn(&args);
    let line = p.expect(&format!("ready {name}"));
    let addr = line.rsplit(' ').next().unwrap().to_owned();
    (p, addr)
}

fn et(args: &[&str]) -> Proc {
    let mut a = vec!["et"];
    a.extend_from_slice(args);
    Proc::spawn(&a)
}

/// A consumer that creates the blocking station `hold` with `restore`, takes `count` events and
/// holds them (until killed).
fn holder(name: &str, restore: &str, count: u32) -> Proc {
    let count = count.to_string();
    et(&[
        "consume",
        "--name",
        name,
        "--station",
        "hold",
        "--create",
        "blocking",
        "--restore",
        restore,
        "--count",
        &count,
        "--hold",
    ])
}

/// `daqflow et monitor NAME --once --json`, parsed.
fn snapshot(name: &str) -> serde_json::Value {
    let out =
        Command::new(env!("CARGO_BIN_EXE_daqflow")).args(["et", "monitor", name, "--once", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("monitor --json prints one JSON snapshot")
}

fn station<'a>(snap: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    snap["stations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no station {name}: {snap}"))
}

/// Waits until `f(snapshot)` holds.
fn wait_for(name: &str, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = snapshot(name);
        if f(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every event of the pool is somewhere: free, queued, held or in transit.
fn assert_accounted(s: &serde_json::Value) {
    let queued: u64 = s["stations"].as_array().unwrap().iter().map(|x| x["queued"].as_u64().unwrap()).sum();
    let held: u64 = s["attachments"].as_array().unwrap().iter().map(|x| x["held"].as_u64().unwrap()).sum();
    let in_transit = s["in_transit"].as_u64().unwrap();
    assert_eq!(queued + held + in_transit, s["events"].as_u64().unwrap(), "{s:#}");
}

fn shm_entries() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn summary(p: &mut Proc, what: &str) -> serde_json::Value {
    let line = p.expect(&format!("\"{what}\""));
    serde_json::from_str(&line).unwrap()
}

#[test]
fn a_consumer_killed_holding_events_gives_them_back_per_restore_mode() {
    let before = shm_entries();
    let name = unique("crash");
    let (mut system, _) = et_start(&name, &[]);
    // "hold" keeps what it gets; "spare" shares its station (restore: input); "after" counts
    // what comes out of "hold2" (restore: output).
    let mut holder = holder(&name, "input", 30);
    holder.expect("attached to hold");
    let mut holder2 =
        et(&["consume", "--name", &name, "--station", "hold2", "--create", "blocking", "--count", "40", "--hold"]);
    holder2.expect("attached to hold2");
    let mut after =
        et(&["consume", "--name", &name, "--station", "after", "--create", "blocking", "--count", "100", "--json"]);
    after.expect("attached to after");
    let mut producer = et(&["produce", "--name", &name, "--count", "100", "--size", "200", "--batch", "10", "--json"]);
    assert_eq!(summary(&mut producer, "produced")["produced"], 100);
    holder.expect("holding 30 events");
    // `hold` got 30; the 70 others wait in its queue; nothing reaches hold2 yet.
    let snap = wait_for(&name, "30 held, 70 queued", |s| station(s, "hold")["queued"] == 70);
    assert_accounted(&snap);

    // A second consumer shares "hold"'s flow; the holder dies; its 30 come back to the input.
    let mut spare = et(&["consume", "--name", &name, "--station", "hold", "--count", "100", "--json"]);
    spare.expect("attached to hold");
    holder.signal(libc::SIGKILL);
    let s = summary(&mut spare, "consumed");
    assert_eq!(s["consumed"], 100, "the spare got the 70 queued and the 30 restored");
    assert_eq!(s["possibly_corrupt"], 30, "restored events are marked possibly corrupt");
    assert!(system.stderr_contains("attachment lost"));
    // The 30 entered hold's input twice and were taken twice: in and out agree.
    let snap = snapshot(&name);
    let hold = station(&snap, "hold");
    assert_eq!((hold["events_in"].as_u64(), hold["events_out"].as_u64()), (Some(130), Some(130)), "{hold:#}");

    // hold2 took 40 of those and holds them; the other 60 wait in its queue.
    holder2.expect("holding 40 events");
    wait_for(&name, "60 queued at hold2", |s| station(s, "hold2")["queued"] == 60);
    // Killed, hold2's 40 go on to its output (the default), and as it has no attachment left,
    // its queue flows on too: "after" gets all 100.
    holder2.signal(libc::SIGKILL);
    let s = summary(&mut after, "consumed");
    assert_eq!(s["consumed"], 100);
    assert_eq!(s["possibly_corrupt"], 30 + 40, "the mark stays with an event until it is recycled");

    let snap = wait_for(&name, "every event back in GrandCentral", |s| {
        s["free_events"] == 200 && s["attachments"].as_array().unwrap().is_empty()
    });
    assert_accounted(&snap);
    system.signal(libc::SIGTERM);
    assert_eq!(system.wait_exit(), 0);
    assert_eq!(shm_entries().difference(&before).count(), 0, "nothing left in /dev/shm");
}

#[test]
fn a_consumer_killed_holding_large_events_leaves_nothing_behind() {
    let before = shm_entries();
    let name = unique("crash-large");
    let (mut system, _) = et_start(&name, &["--max-temp", "8"]);
    let mut holder = holder(&name, "grand-central", 8);
    holder.expect("attached to hold");
    let mut producer = et(&["produce", "--name", &name, "--count", "8", "--size", "1000000", "--batch", "4", "--json"]);
    assert_eq!(summary(&mut producer, "produced")["produced"], 8);
    holder.expect("holding 8 events");
    let snap = snapshot(&name);
    assert_eq!(snap["temp_events"], 8);
    holder.signal(libc::SIGKILL);
    // Restore mode grand-central: straight back, and the temporary buffers freed.
    let snap = wait_for(&name, "temporary buffers freed", |s| s["temp_events"] == 0 && s["free_events"] == 200);
    assert_accounted(&snap);
    // The limit is free again: 8 more large events fit.
    let mut producer = et(&["produce", "--name", &name, "--count", "8", "--size", "1000000", "--batch", "8", "--json"]);
    assert_eq!(summary(&mut producer, "produced")["produced"], 8);
    system.signal(libc::SIGKILL);
    system.wait_exit();
    assert_eq!(shm_entries().difference(&before).count(), 0, "nothing left in /dev/shm, even after SIGKILL");
}

#[test]
fn a_frozen_consumer_is_killed_after_the_heartbeat_timeout_and_its_events_restored() {
    let name = unique("frozen");
    let (_system, _) = et_start(&name, &["--heartbeat-timeout", "1s"]);
    let mut holder = holder(&name, "grand-central", 20);
    holder.expect("attached to hold");
    let mut producer = et(&["produce", "--name", &name, "--count", "20", "--size", "64", "--json"]);
    summary(&mut producer, "produced");
    holder.expect("holding 20 events");
    let stopped = Instant::now();
    holder.signal(libc::SIGSTOP);
    let code = holder.wait_exit();
    assert_eq!(code, -1, "killed by a signal");
    assert!(stopped.elapsed() < Duration::from_secs(10), "killed after {:?}", stopped.elapsed());
    let snap = wait_for(&name, "events back", |s| s["free_events"] == 200);
    assert_accounted(&snap);
}

#[test]
fn users_of_a_killed_et_system_get_an_error_promptly_and_reattach_after_a_restart() {
    let name = unique("death");
    let (system, addr) = et_start(&name, &[]);
    let mut local = et(&["consume", "--name", &name, "--station", "mon", "--create", "nonblocking"]);
    local.expect("attached to mon");
    let mut remote = et(&["consume", "--name", &name, "--remote", &addr, "--station", "mon"]);
    remote.expect("attached to mon");
    let mut producer = et(&["produce", "--name", &name, "--size", "64", "--rate", "1000"]);
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    system.signal(libc::SIGKILL);
    for p in [&mut local, &mut remote, &mut producer] {
        assert_eq!(p.wait_exit(), 2, "exits with an error");
        assert!(p.stderr_contains("is gone"), "says why");
    }
    assert!(killed.elapsed() < Duration::from_secs(5), "all noticed within {:?}", killed.elapsed());

    // Restarted under the same name, it takes new users at once.
    let (_system, _) = et_start(&name, &[]);
    let mut consumer =
        et(&["consume", "--name", &name, "--station", "mon", "--create", "blocking", "--count", "50", "--json"]);
    consumer.expect("attached to mon");
    let mut producer = et(&["produce", "--name", &name, "--count", "50", "--size", "64", "--json"]);
    summary(&mut producer, "produced");
    assert_eq!(summary(&mut consumer, "consumed")["consumed"], 50);
}

#[test]
fn two_systems_on_one_machine_with_a_bridge_and_discovery() {
    let a = unique("builder");
    let b = unique("monitoring");
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let (_sa, _) = et_start(&a, &[]);
    let (_sb, _) = et_start(&b, &["--discovery-port", &port]);
    // Found by name over UDP, a remote consumer on the monitoring system with a selection.
    let mut physics = et(&[
        "consume",
        "--name",
        &b,
        "--discover",
        &port,
        "--station",
        "physics",
        "--create",
        "blocking",
        "--select",
        "match:1,*,*,*",
        "--json",
        "--count",
        "300",
    ]);
    physics.expect("attached to physics");
    let mut bridge =
        et(&["bridge", "--from", &a, "--station", "export", "--to", &b, "--batch", "50", "--count", "500"]);
    wait_for(&a, "the bridge attached", |s| s["attachments"].as_array().unwrap().len() == 1);
    let mut p1 = et(&["produce", "--name", &a, "--count", "300", "--size", "100", "--control", "1,0,0,0", "--json"]);
    let mut p2 = et(&["produce", "--name", &a, "--count", "200", "--size", "100", "--control", "2", "--json"]);
    summary(&mut p1, "produced");
    summary(&mut p2, "produced");
    bridge.expect("bridged 500 events");
    let s = summary(&mut physics, "consumed");
    assert_eq!(s["consumed"], 300);
    assert_eq!(s["bytes"], 300 * 100);
    let snap = wait_for(&b, "all free", |s| s["free_events"] == 200);
    assert_eq!(station(&snap, "physics")["events_in"], 300);
    let text = Command::new(env!("CARGO_BIN_EXE_daqflow")).args(["et", "monitor", &b, "--once"]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("physics") && text.contains("match:1,*,*,*") && text.contains("events accounted for: 200 of 200"),
        "{text}"
    );
}

#[test]
fn a_producer_waiting_for_free_events_stops_on_ctrl_c() {
    let name = unique("full");
    let (_system, _) = et_start(&name, &[]);
    // A holder keeps the whole pool: the producer then waits for free events.
    let mut h = holder(&name, "output", 200);
    h.expect("attached to hold");
    let mut producer = et(&["produce", "--name", &name, "--size", "100", "--batch", "10", "--json"]);
    h.expect("holding 200 events");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    producer.signal(libc::SIGINT);
    assert_eq!(summary(&mut producer, "produced")["produced"], 200, "it produced the pool, then waited");
    assert!(t.elapsed() < Duration::from_secs(3), "stopped {:?} after Ctrl-C", t.elapsed());
}
