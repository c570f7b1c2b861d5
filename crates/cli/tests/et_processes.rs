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

/// `RssShmem` and `RssAnon` of process `pid`, in bytes (`/proc/PID/status`).
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {status}"));
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    (field("RssShmem:"), field("RssAnon:"))
}

/// Bytes of memory the large-event buffers of process `pid` occupy: the blocks allocated to its
/// memory files named for large events (a memfd's blocks are the pages written into it).
fn large_event_blocks(pid: u32) -> u64 {
    let mut bytes = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().filter_map(|e| e.ok()) {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if target.to_string_lossy().starts_with("/memfd:daqflow-et-large")
            && let Ok(meta) = std::fs::metadata(entry.path())
        {
            bytes += std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        }
    }
    bytes
}

const MIB: u64 = 1 << 20;

#[test]
fn hostile_large_event_requests_are_refused_and_commit_no_memory() {
    let name = unique("hostile-large");
    let (system, addr) = et_start(&name, &[]);
    let pid = system.child.id();
    let (shm0, anon0) = rss(pid);

    // A remote client: attach to GrandCentral, ask for 2 events of 1 GiB, write nothing.
    let remote = daqflow_et::RemoteClient::connect(addr.parse().unwrap()).unwrap();
    let producer = remote.attach(daqflow_et::GRAND_CENTRAL).unwrap();
    let asked = daqflow_et::Attachment::new_events(&producer, 2, 1 << 30, daqflow_et::Wait::NoWait);
    match &asked {
        Err(daqflow_et::EtError::OverLimit { limit, .. }) => {
            assert_eq!(limit.key(), "max_event_bytes");
        }
        other => panic!("expected a refusal naming max_event_bytes, got {other:?}"),
    }
    let message = asked.unwrap_err().to_string();
    assert!(message.contains("max_event_bytes") && message.contains("--max-event-bytes"), "{message}");
    // The same from a local process.
    let local = daqflow_et::EtClient::connect(&name).unwrap();
    let local_producer = local.attach(daqflow_et::GRAND_CENTRAL).unwrap();
    let asked = daqflow_et::Attachment::new_events(&local_producer, 2, 1 << 30, daqflow_et::Wait::NoWait);
    assert!(matches!(asked, Err(daqflow_et::EtError::OverLimit { .. })), "{asked:?}");

    let (shm1, anon1) = rss(pid);
    let grown = shm1.saturating_sub(shm0) + anon1.saturating_sub(anon0);
    eprintln!(
        "ET process: RssShmem {} -> {} MiB, RssAnon {} -> {} MiB",
        shm0 / MIB,
        shm1 / MIB,
        anon0 / MIB,
        anon1 / MIB
    );
    assert!(grown < 16 * MIB, "the ET process grew by {} MiB", grown / MIB);
    assert_eq!(large_event_blocks(pid), 0);
    let snap = snapshot(&name);
    assert_eq!(snap["temp_events"], 0, "{snap:#}");
    assert_eq!(snap["free_events"], 200, "nothing was taken: {snap:#}");
}

#[test]
fn large_events_commit_memory_only_as_they_are_written() {
    let name = unique("lazy-large");
    let (system, _) = et_start(&name, &[]);
    let pid = system.child.id();
    let (shm0, _) = rss(pid);
    let client = daqflow_et::EtClient::connect(&name).unwrap();
    let producer = client.attach(daqflow_et::GRAND_CENTRAL).unwrap();
    // Two events of 48 MiB (within the default limits), nothing written yet.
    let mut events = daqflow_et::Attachment::new_events(&producer, 2, 48 << 20, daqflow_et::Wait::NoWait).unwrap();
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e.is_large()));
    let (shm1, _) = rss(pid);
    eprintln!("ET process RssShmem with 2 unwritten 48 MiB events: {} -> {} MiB", shm0 / MIB, shm1 / MIB);
    assert!(shm1.saturating_sub(shm0) < 8 * MIB, "the ET process mapped {} MiB", (shm1 - shm0) / MIB);
    assert_eq!(large_event_blocks(pid), 0, "no page of the buffers exists before data is written");
    // 4 MiB written into one of them: that much memory, no more.
    events[0].write(&vec![7u8; 4 << 20]).unwrap();
    let written = large_event_blocks(pid);
    eprintln!("large-event memory after writing 4 MiB: {} KiB", written / 1024);
    assert!((4 * MIB..5 * MIB).contains(&written), "{written} bytes");
    daqflow_et::Attachment::put_events(&producer, &mut events).unwrap();
    wait_for(&name, "the large events freed", |s| s["temp_events"] == 0 && s["free_events"] == 200);
}

/// The uid and gid of `nobody`, the stranger of the credential tests.
const NOBODY: u32 = 65534;

/// Connects to ET system `name`'s control socket as user `uid` (a forked child that drops to
/// that user), sends the hello a client sends, and reads one answer, until the ET process closes
/// the connection or a whole message came: the bytes answered, and whether a file descriptor
/// came with them.
fn hello_as(uid: u32, name: &str) -> (Vec<u8>, bool) {
    // Everything the child uses is made before the fork: after it, the child only makes system
    // calls (this process has other threads, whose locks the child must not need).
    // SAFETY: sockaddr_un is a plain C struct; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = format!("daqflow-et/{name}");
    for (i, b) in path.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char; // sun_path[0] = 0: the abstract namespace
    }
    let addr_len = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + path.len()) as libc::socklen_t;
    let body = br#"{"Hello":{"pid":0}}"#;
    let mut hello = (body.len() as u32).to_le_bytes().to_vec();
    hello.extend_from_slice(body);
    let mut pipe = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child only makes async-signal-safe system calls on memory prepared above
    // and on its own stack, then _exits; it never returns into Rust code.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: raw system calls on valid pointers (the address, the buffers on this stack).
        unsafe {
            let id = uid as libc::c_long;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, id, id, id) != 0
                || libc::syscall(libc::SYS_setresuid, id, id, id) != 0
            {
                libc::_exit(10);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if s < 0 || libc::connect(s, (&raw const addr).cast(), addr_len) != 0 {
                libc::_exit(11);
            }
            // It may already be refused and closed: the answer is read all the same.
            libc::send(s, hello.as_ptr().cast(), hello.len(), libc::MSG_NOSIGNAL);
            let mut buf = [0u8; 4096];
            let mut total = 0usize;
            let mut got_fd = 0u8;
            loop {
                let mut cbuf = [0u64; 8];
                let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().add(total).cast(), iov_len: buf.len() - total };
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &raw mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&cbuf);
                let n = libc::recvmsg(s, &raw mut msg, 0);
                if n <= 0 {
                    break;
                }
                total += n as usize;
                if msg.msg_controllen > 0 {
                    got_fd = 1;
                }
                let len = if total >= 4 { u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize } else { 0 };
                if total == buf.len() || (total >= 4 && total >= 4 + len) {
                    break;
                }
            }
            libc::write(pipe[1], (&raw const got_fd).cast(), 1);
            libc::write(pipe[1], buf.as_ptr().cast(), total);
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end, which we own.
    unsafe { libc::close(pipe[1]) };
    // SAFETY: the read end is ours; the File closes it.
    let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut out).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child failed: status {status:#x}");
    assert!(!out.is_empty(), "the child reported nothing");
    (out[1..].to_vec(), out[0] == 1)
}

#[test]
fn a_local_process_of_another_user_is_refused_and_gets_no_descriptor() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running a client as another user (uid {NOBODY}) needs root");
        return;
    }
    let name = unique("strangers");
    let (mut system, _) = et_start(&name, &[]);
    let (answer, got_fd) = hello_as(NOBODY, &name);
    assert!(!got_fd, "a refused process must not get the memory's descriptor");
    assert!(answer.len() > 4, "the reason comes before the connection closes: {answer:?}");
    let reason: serde_json::Value = serde_json::from_slice(&answer[4..]).unwrap();
    assert_eq!(reason["Error"]["AccessDenied"]["uid"], NOBODY, "{reason}");
    assert_eq!(reason["Error"]["AccessDenied"]["owner"], 0, "{reason}");
    assert!(system.stderr_contains("refused a local connection"), "the ET process logs it");
    let snap = snapshot(&name);
    assert!(snap["attachments"].as_array().unwrap().is_empty(), "{snap:#}");

    // The daqflow client says why, in words.
    let daqflow = env!("CARGO_BIN_EXE_daqflow");
    let out = std::os::unix::process::CommandExt::gid(
        std::os::unix::process::CommandExt::uid(Command::new(daqflow).args(["et", "monitor", &name, "--once"]), NOBODY),
        NOBODY,
    )
    .output();
    match out {
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(
                stderr.contains("does not accept local connections from uid 65534")
                    && stderr.contains("--allow-uid 65534"),
                "{stderr}"
            );
        }
        // The binary lies where uid 65534 cannot reach it (a private home directory).
        Err(e) => eprintln!("the daqflow client was not run as uid {NOBODY}: {e}"),
    }

    // Allowed by its owner, the same process gets the memory.
    let allowed = unique("strangers-allowed");
    let (_system, _) = et_start(&allowed, &["--allow-uid", "65534"]);
    let (answer, got_fd) = hello_as(NOBODY, &allowed);
    let hello: serde_json::Value = serde_json::from_slice(&answer[4..]).unwrap();
    assert!(hello["Hello"]["pool_len"].as_u64().unwrap() > 0, "{hello}");
    assert!(got_fd, "an allowed user gets the descriptor");
}

#[test]
fn a_remote_user_of_a_system_with_a_token_must_prove_it() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    daqflow_dialog::Token::generate().write_file(&token).unwrap();
    let token = token.to_str().unwrap();
    let name = unique("token");
    let mut system = Proc::spawn(&[
        "--token-file",
        token,
        "et",
        "start",
        "--name",
        &name,
        "--events",
        "200",
        "--event-size",
        "1024",
        "--listen",
        "127.0.0.1:0",
    ]);
    let addr = system.expect(&format!("ready {name}")).rsplit(' ').next().unwrap().to_owned();
    // Without the token: refused in the handshake, saying why.
    let mut stranger = et(&["consume", "--name", &name, "--remote", &addr, "--station", "mon"]);
    assert_ne!(stranger.wait_exit(), 0, "a remote consumer without the token attached");
    assert!(stranger.stderr_contains("requires the system token"), "does not say why");
    // The library client without a token: refused too.
    let e = daqflow_et::RemoteClient::connect(addr.parse().unwrap()).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("requires the system token"), "{e}");
    // With it: attached.
    let mut crew = Proc::spawn(&[
        "--token-file",
        token,
        "et",
        "consume",
        "--name",
        &name,
        "--remote",
        &addr,
        "--station",
        "mon",
        "--create",
        "nonblocking",
    ]);
    crew.expect("attached to mon");
    system.signal(libc::SIGTERM);
}

/// `daqflow et station add …`: one line of output.
fn station_add(name: &str, args: &[&str]) -> String {
    let mut a = vec!["et", "station", "add", "--name", name];
    a.extend_from_slice(args);
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow")).args(&a).output().unwrap();
    assert!(out.status.success(), "{a:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_farm_member_killed_holding_events_leaves_them_to_the_other_members() {
    let name = unique("farm");
    let (mut system, _) = et_start(&name, &[]);
    // The farm from the command line: three members of one group, by shortest queue.
    assert_eq!(
        station_add(&name, &["ana-1", "--keep-when-idle", "--restore", "redistribute"]),
        "created station ana-1"
    );
    assert_eq!(
        station_add(&name, &["ana-2", "--parallel-with", "ana-1", "--policy", "shortest-queue", "--keep-when-idle"]),
        "created station ana-2 in parallel group g1 (ana-1, ana-2; shortest-queue)"
    );
    assert_eq!(
        station_add(&name, &["ana-3", "--parallel-with", "ana-1", "--keep-when-idle"]),
        "created station ana-3 in parallel group g1 (ana-1, ana-2, ana-3; shortest-queue)"
    );
    let snap = snapshot(&name);
    for m in ["ana-1", "ana-2", "ana-3"] {
        let s = station(&snap, m);
        assert_eq!(
            (s["group"].as_u64(), s["config"]["group_policy"].as_str()),
            (Some(1), Some("ShortestQueue")),
            "{s}"
        );
        assert_eq!(s["config"]["restore"], "Redistribute", "{s}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow")).args(["et", "monitor", &name, "--once"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.lines().any(|l| l.contains("ana-3") && l.contains("blocking g1")), "{listing}");
    // ana-1 holds what it gets; ana-2 and ana-3 consume until stopped. The holder starts
    // alone, so that it has its 20 whatever the pace of the others (by shortest queue, members
    // that take faster get more of the flow): idle members of a group take only what no
    // attached member takes, so the whole pool goes to ana-1, which holds 20 and queues 180,
    // and the producer waits for free events.
    let mut holder = et(&["consume", "--name", &name, "--station", "ana-1", "--count", "20", "--hold"]);
    holder.expect("attached to ana-1");
    let mut producer = et(&["produce", "--name", &name, "--count", "300", "--size", "200", "--batch", "10", "--json"]);
    holder.expect("holding 20 events");
    wait_for(&name, "180 queued at ana-1", |s| station(s, "ana-1")["queued"] == 180);
    let mut others: Vec<Proc> = ["ana-2", "ana-3"]
        .iter()
        .map(|m| {
            let mut p = et(&["consume", "--name", &name, "--station", m, "--json"]);
            p.expect(&format!("attached to {m}"));
            p
        })
        .collect();
    holder.signal(libc::SIGKILL);
    assert_eq!(summary(&mut producer, "produced")["produced"], 300);
    // Its 20 and whatever waited in its station go to the other two; nothing stays in ana-1.
    let snap = wait_for(&name, "every event back in GrandCentral", |s| {
        s["free_events"] == 200 && s["attachments"].as_array().unwrap().len() == 2
    });
    assert_accounted(&snap);
    assert_eq!(station(&snap, "ana-1")["queued"], 0);
    let (mut consumed, mut corrupt) = (0, 0);
    for p in &mut others {
        p.signal(libc::SIGTERM);
        let s = summary(p, "consumed");
        consumed += s["consumed"].as_u64().unwrap();
        corrupt += s["possibly_corrupt"].as_u64().unwrap();
    }
    assert_eq!(consumed, 300, "every event reached a living member once");
    assert_eq!(corrupt, 20, "the dead member's events, marked possibly corrupt");
    // ana-1, with no attachment left, can be removed.
    let rm = |s: &str| {
        Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(["et", "station", "remove", "--name", &name, s])
            .output()
            .unwrap()
    };
    let out = rm("ana-1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "removed station ana-1");
    system.signal(libc::SIGTERM);
    assert_eq!(system.wait_exit(), 0);
}
