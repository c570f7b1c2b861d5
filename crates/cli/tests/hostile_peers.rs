//! Strangers on the same host against every listening port, as real processes: frame headers
//! announcing large frames followed by megabytes, held open, must not grow the target's memory;
//! without the system token nothing gets past the handshake. The target's resident memory is
//! read from /proc while the strangers' connections are still open.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::Proc;
use daqflow_transport::auth::{Token, handshake_std};
use daqflow_wire::frame::FrameHeader;

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process lives");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb / 1024.0
}

/// How a stranger starts its connection.
#[derive(Clone, Copy)]
enum Start {
    /// Straight to the frame header (no handshake).
    Raw,
    /// The handshake of `protocol` without a token, then the frame (a system without a token
    /// lets it through).
    Handshake(&'static str),
    /// The handshake, then the protocol's hello frame, then the large frame.
    Hello(&'static str, fn() -> Vec<u8>),
}

/// `n` connections to `addr`, each announcing a frame of `kind` with `len` bytes and sending
/// `send` bytes of it (or as much as the target takes within 2 s). The sockets stay open.
fn flood(addr: SocketAddr, n: usize, start: Start, kind: u16, len: u32, send: usize) -> Vec<TcpStream> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).ok()?;
                s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
                match start {
                    Start::Raw => {}
                    Start::Handshake(p) => handshake_std(&mut s, p, None, Duration::from_secs(10)).ok()?,
                    Start::Hello(p, hello) => {
                        handshake_std(&mut s, p, None, Duration::from_secs(10)).ok()?;
                        s.write_all(&hello()).ok()?;
                    }
                }
                let _ = s.write_all(&FrameHeader { kind, flags: 0, channel: 0, len }.encode());
                let piece = vec![0u8; 1 << 20];
                let mut sent = 0;
                while sent < send {
                    match s.write(&piece[..piece.len().min(send - sent)]) {
                        Ok(k) if k > 0 => sent += k,
                        _ => break,
                    }
                }
                Some(s)
            })
        })
        .collect();
    threads.into_iter().filter_map(|t| t.join().ok().flatten()).collect()
}

/// Checks that `target` grew by less than `bound_mib` while `strangers` hold their connections.
fn assert_bounded(what: &str, pid: u32, before: f64, bound_mib: f64) {
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_mib(pid);
    eprintln!("{what}: RSS {before:.1} MiB -> {after:.1} MiB");
    assert!(after - before < bound_mib, "{what}: RSS grew from {before:.1} to {after:.1} MiB");
}

fn token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("token");
    Token::generate().write_file(&path).unwrap();
    path
}

/// Starts a `daqflow component KIND` process (with `token`, if any), configures it and starts
/// run 1: the process and the address it listens on.
fn component(kind: &str, sets: &[&str], token: Option<&std::path::Path>) -> (Proc, SocketAddr) {
    let mut args = Vec::new();
    if let Some(t) = token {
        args.extend(["--token-file", t.to_str().unwrap()]);
    }
    args.extend(["component", kind, "--name", kind]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let mut p = Proc::spawn(&args);
    p.send("configure");
    let line = p.expect("\"listen\"");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = v["result"]["listen"].as_str().unwrap().parse().unwrap();
    p.send("start 1");
    p.expect("\"run\":1");
    (p, addr)
}

/// An EVM and an RU with one stream, as processes, in run 1.
fn event_builder(token: Option<&std::path::Path>) -> (Proc, SocketAddr, Proc, SocketAddr) {
    let (evm, evm_addr) = component("evm", &["rus=1"], token);
    let (ru, ru_addr) = component("ru", &[&format!("evm={evm_addr}")], token);
    (evm, evm_addr, ru, ru_addr)
}

fn control_server(token: Option<&std::path::Path>) -> (Proc, SocketAddr) {
    let mut args = Vec::new();
    if let Some(t) = token {
        args.extend(["--token-file", t.to_str().unwrap()]);
    }
    args.extend(["control-server", "--listen", "127.0.0.1:0"]);
    let mut p = Proc::spawn(&args);
    let line = p.expect("listening on");
    let addr = line.trim_start_matches("listening on ").trim().parse().unwrap();
    (p, addr)
}

#[test]
fn large_frames_from_strangers_before_any_hello_do_not_grow_the_control_server() {
    let (server, addr) = control_server(None);
    let pid = server.child.id();
    let before = rss_mib(pid);
    // The review's attack: 40 connections, each a header announcing 16 MiB, then 15 MiB.
    let raw = flood(addr, 40, Start::Raw, 1, 16 << 20, 15 << 20);
    let shaken = flood(addr, 40, Start::Handshake("dialog-control"), 1, 16 << 20, 15 << 20);
    assert_bounded("control server, no token", pid, before, 32.0);
    drop((raw, shaken));
}

#[test]
fn with_a_token_strangers_get_nothing_past_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let (server, addr) = control_server(Some(&token));
    let pid = server.child.id();
    let before = rss_mib(pid);
    let mut s = TcpStream::connect(addr).unwrap();
    let e = handshake_std(&mut s, "dialog-control", None, Duration::from_secs(10)).unwrap_err();
    assert!(e.to_string().contains("requires the system token"), "{e}");
    let strangers = flood(addr, 40, Start::Raw, 16, 16 << 20, 15 << 20);
    assert_bounded("control server with a token", pid, before, 32.0);
    drop(strangers);
    // A stranger cannot stop the run: `dialog send all/stop` without the token is refused and
    // says why; with it, the command goes through (to nobody here).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", &addr.to_string(), "send", "all/stop"])
        .env_remove("DAQFLOW_TOKEN_FILE")
        .env_remove("DAQFLOW_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("requires the system token"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["--token-file", token.to_str().unwrap(), "dialog", "--control", &addr.to_string(), "send", "all/stop"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("delivered to no process"), "{out:?}");
}

#[test]
fn a_provider_holds_no_more_than_its_budget_of_a_strangers_large_values() {
    let (_server, addr) = control_server(None);
    let control = addr.to_string();
    let mut provider = Proc::spawn_with_env(
        &["dialog", "--control", &control, "--name", "prov", "publish", "test/svc"],
        &[("DAQFLOW_RECV_BUDGET_BYTES", "33554432")],
    );
    provider.send("v1");
    // Where the provider listens for its peers.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let peer: SocketAddr = loop {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(["dialog", "--control", &control, "ls", "--json"])
            .output()
            .unwrap();
        let procs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(p) = procs.as_array().into_iter().flatten().find(|p| p["name"] == "prov") {
            break format!("{}:{}", p["host"].as_str().unwrap(), p["port"]).parse().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the provider never joined");
        std::thread::sleep(Duration::from_millis(100));
    };
    let pid = provider.child.id();
    let before = rss_mib(pid);
    // Before a hello: cut at the header. After a hello (no token here): service values may be
    // large, and the process's budget (32 MiB) bounds what they hold.
    let raw = flood(peer, 20, Start::Handshake("dialog-peer"), 22, 60 << 20, 60 << 20);
    fn peer_hello() -> Vec<u8> {
        let hello = daqflow_dialog::protocol::Message::PeerHello {
            version: daqflow_dialog::protocol::PROTOCOL_VERSION,
            name: "mallory".into(),
            host: "127.0.0.1".into(),
            port: 9,
        };
        let mut b = bytes::BytesMut::new();
        daqflow_wire::frame::FrameCodec::default().encode(&hello.to_frame(), &mut b);
        b.to_vec()
    }
    let hello = flood(peer, 20, Start::Hello("dialog-peer", peer_hello), 22, 15 << 20, 15 << 20);
    // The budget (32 MiB) plus what 40 connections and the runtime's threads cost besides it
    // (buffers, the allocator's per-thread arenas; up to about 17 MiB seen), far below the
    // 300 MiB the strangers sent.
    assert_bounded("provider", pid, before, 32.0 + 32.0);
    drop((raw, hello));
    provider.send("v2");
}

#[test]
fn large_frames_before_a_hello_do_not_grow_an_ru_or_the_et_system() {
    // An EVM and an RU (one stream), as processes.
    let (_evm, _, mut ru, ru_addr) = event_builder(None);
    let pid = ru.child.id();
    let before = rss_mib(pid);
    let strangers = flood(ru_addr, 20, Start::Handshake("evb"), 0x0E02, 60 << 20, 60 << 20);
    let raw = flood(ru_addr, 20, Start::Raw, 0x0E01, 60 << 20, 60 << 20);
    assert_bounded("RU", pid, before, 32.0);
    drop((strangers, raw));
    ru.send("state");
    ru.expect("Running");

    let name = format!("hostile-{}", std::process::id());
    let mut et = Proc::spawn(&[
        "et",
        "start",
        "--name",
        &name,
        "--events",
        "100",
        "--event-size",
        "1024",
        "--listen",
        "127.0.0.1:0",
    ]);
    let line = et.expect(" remote ");
    let et_addr: SocketAddr =
        line.split(" remote ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let pid = et.child.id();
    let before = rss_mib(pid);
    let strangers = flood(et_addr, 2, Start::Handshake("et"), 9, 700 << 20, 700 << 20);
    let raw = flood(et_addr, 2, Start::Raw, 9, 700 << 20, 64 << 20);
    assert_bounded("ET system", pid, before, 32.0);
    drop((strangers, raw));
}

#[test]
fn a_stranger_cannot_join_an_event_builder_that_has_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path());
    let (mut evm, evm_addr, _ru, ru_addr) = event_builder(Some(&token));
    // A stranger saying hello as a BU (asking for credits, or taking bu-0's super-fragments)
    // or as a second RU never gets past the handshake, with no token or a guessed one.
    for addr in [evm_addr, ru_addr] {
        let mut s = TcpStream::connect(addr).unwrap();
        let e = handshake_std(&mut s, "evb", None, Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("requires the system token"), "{e}");
        let mut s = TcpStream::connect(addr).unwrap();
        let guess = Token::generate();
        let e = handshake_std(&mut s, "evb", Some(&guess), Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("wrong token"), "{e}");
    }
    // The run goes on: the EVM knows its RU and no BU.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let v = loop {
        evm.send("stats");
        let v: serde_json::Value = serde_json::from_str(&evm.next_line()).unwrap();
        if !v["result"]["detail"]["rus_connected"].is_null() || std::time::Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["result"]["detail"]["rus_connected"], 1, "{v}");
    assert_eq!(v["result"]["detail"]["bus"].as_array().map(Vec::len), Some(0), "{v}");
    assert!(v["result"]["trigger"]["error"].is_null() && v["state"] == "Running", "{v}");
}
