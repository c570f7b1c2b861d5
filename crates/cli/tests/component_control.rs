//! A whole event builder driven only over the control plane: every component a `daqflow
//! component … --control` process, commanded with dialog commands, observed through its
//! `NAME/state` service, each request answered with a reply.

mod common;

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::Proc;
use daqflow_component::{Answer, Command, CommandReply, ComponentError, Outcome, Request, State, Verb};
use daqflow_dialog::{Dialog, ServiceEvent, Subscription};
use serde_json::Value;

struct Watch {
    rx: Receiver<(String, Value)>,
    latest: HashMap<String, Value>,
    _subs: Vec<Subscription>,
}

impl Watch {
    /// Waits until component `name`'s state satisfies `ok`; returns it.
    fn until(&mut self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(v) = self.latest.get(name)
                && ok(v)
            {
                return v.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((n, v)) => {
                    self.latest.insert(n, v);
                }
                Err(_) => panic!("{name}: never {what}; last state {:?}", self.latest.get(name)),
            }
        }
    }
}

fn component(control: &str, kind: &str, name: &str, sets: &[String]) -> Proc {
    let mut args: Vec<String> =
        ["component", kind, "--name", name, "--control", control].iter().map(|s| s.to_string()).collect();
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::spawn(&refs)
}

#[test]
fn a_builder_driven_only_by_dialog_commands_takes_a_run_and_accounts_for_every_event() {
    let mut cs = Proc::spawn(&["control-server", "--listen", "127.0.0.1:0"]);
    let addr = cs.expect("listening on ").trim_start_matches("listening on ").to_owned();
    let op = Dialog::connect(&addr, "test-operator").unwrap();
    let (tx, rx) = channel();
    let mut subs = Vec::new();
    for name in ["evm", "ru-0", "bu-0", "src-0", "src-1"] {
        let tx = tx.clone();
        let n = name.to_owned();
        subs.push(
            op.subscribe(&format!("{name}/state"), move |e| {
                if let ServiceEvent::Update { data, .. } = e
                    && let Ok(v) = serde_json::from_slice::<Value>(&data)
                {
                    let _ = tx.send((n.clone(), v));
                }
            })
            .unwrap(),
        );
    }
    let mut w = Watch { rx, latest: HashMap::new(), _subs: subs };
    // Replies come back as the command `test-operator/reply`.
    let (reply_tx, replies) = channel::<CommandReply>();
    let _replies = op
        .register_command("test-operator/reply", move |m| {
            let _ = reply_tx.send(serde_json::from_slice(&m.data).expect("a reply is a CommandReply"));
        })
        .unwrap();
    // A component registers its commands right after it starts; until the control server has
    // them, a command reaches nobody: retry for a while.
    let send = |cmd: &str, payload: &[u8]| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while op.send_command(cmd, payload).unwrap() == 0 {
            assert!(Instant::now() < deadline, "{cmd} reached nobody");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut next_id = 0u64;
    // Sends a request to `name` and waits for the reply to it.
    let mut ask = |name: &str, command: Command| -> CommandReply {
        next_id += 1;
        let request = Request { id: next_id, reply_to: Some("test-operator".into()), command };
        let (verb, payload) = request.encode();
        send(&format!("{name}/{verb}"), &payload);
        loop {
            let r = replies.recv_timeout(Duration::from_secs(60)).expect("a reply");
            if r.id == next_id {
                assert_eq!((r.status.name.as_str(), r.command), (name, verb));
                return r;
            }
        }
    };
    let state_is = |s: &'static str| move |v: &Value| v["state"] == s;
    let listen = |r: CommandReply| match r.result() {
        Ok(Answer::Info(i)) => i["listen"].as_str().unwrap().to_owned(),
        other => panic!("{other:?}"),
    };

    let _evm = component(&addr, "evm", "evm", &["rus=1".into()]);
    w.until("evm", "Initial", state_is("Initial"));
    let evm_addr = listen(ask("evm", Command::Configure { config: None }));
    let _ru = component(&addr, "ru", "ru-0", &[format!("evm=\"{evm_addr}\""), "streams=2".into()]);
    w.until("ru-0", "Initial", state_is("Initial"));
    let ru_addr = listen(ask("ru-0", Command::Configure { config: None }));
    let _bu = component(&addr, "bu", "bu-0", &[format!("evm=\"{evm_addr}\"")]);
    let _s0 = component(
        &addr,
        "source",
        "src-0",
        &["source_id=0".into(), format!("ru=\"{ru_addr}\""), "rate_hz=3000".into()],
    );
    let _s1 = component(
        &addr,
        "source",
        "src-1",
        &["source_id=1".into(), format!("ru=\"{ru_addr}\""), "rate_hz=3000".into()],
    );
    for n in ["bu-0", "src-0", "src-1"] {
        w.until(n, "Initial", state_is("Initial"));
        let r = ask(n, Command::Configure { config: None });
        assert_eq!(r.status.state, State::Configured, "{r:?}");
    }
    // An illegal transition is refused, with the reason, in the reply.
    let refused = ask("evm", Command::Resume);
    // Typed on the wire: the kind, the command and the state, not only the words.
    assert_eq!(
        refused.outcome,
        Outcome::Error(ComponentError::IllegalTransition { command: Verb::Resume, state: State::Configured })
    );
    assert_eq!(refused.status.state, State::Configured);
    // A payload that is not a request is refused too, and nothing changes.
    send("evm/start", b"{\"id\": 99, \"reply_to\": \"test-operator\", \"run\": \"twelve\"}");
    let bad = replies.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(bad.id, 99);
    assert!(
        matches!(&bad.outcome, Outcome::Error(ComponentError::BadCommand(e)) if e.starts_with("start: ")),
        "{bad:?}"
    );

    // One command from a person (a bare payload, no reply wanted) starts everybody (in any
    // order: peers connect with retries).
    send("all/start", b"12");
    for n in ["evm", "ru-0", "bu-0", "src-0", "src-1"] {
        let v = w.until(n, "Running", state_is("Running"));
        assert_eq!(v["run"], 12, "{n}: {v}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    let summary = |r: CommandReply| match r.result() {
        Ok(Answer::Summary(s)) => s,
        other => panic!("{other:?}"),
    };
    let evm = summary(ask("evm", Command::Stop { last_event: None }));
    let trigger = evm.trigger.clone().expect("the EVM's accounting");
    let last = evm.detail["last_event"].as_u64().unwrap();
    assert!(last > 1000, "{evm:?}");
    assert_eq!(trigger.lost, 0, "{evm:?}");
    for s in ["src-0", "src-1"] {
        ask(s, Command::Stop { last_event: Some(last) });
    }
    let ru = summary(ask("ru-0", Command::Stop { last_event: None }));
    assert!(ru.detail["counters"].is_object(), "{ru:?}");
    let bu = summary(ask("bu-0", Command::Stop { last_event: None }));
    assert_eq!(bu.events, last, "{bu:?}");
    assert_eq!(w.until("bu-0", "Configured", state_is("Configured"))["state"], "Configured");
}

/// A control server of its own (`daqflow [PRE…] control-server --listen 127.0.0.1:0`), and its
/// address.
fn control_server(pre: &[&str]) -> (Proc, String) {
    let mut cs = Proc::spawn(&[pre, &["control-server", "--listen", "127.0.0.1:0"]].concat());
    let addr = cs.expect("listening on ").trim_start_matches("listening on ").to_owned();
    (cs, addr)
}

/// A sink on the control plane at `control`, with `--lease LEASE` and any other arguments.
fn sink(control: &str, name: &str, extra: &[&str]) -> Proc {
    let base = ["component", "sink", "--name", name, "--control", control, "--set", "listen=127.0.0.1:0"];
    Proc::spawn(&[&base[..], &["--set", "stop_timeout_ms=500"], extra].concat())
}

#[test]
fn a_component_without_a_control_server_for_longer_than_its_lease_stops_its_run_and_ends() {
    let (cs, addr) = control_server(&[]);
    let mut leased = sink(&addr, "sink-leased", &["--lease", "2"]);
    let mut forever = sink(&addr, "sink-forever", &["--lease", "0"]);
    for c in [&mut leased, &mut forever] {
        c.send("configure");
        c.expect("\"state\":\"Configured\"");
        c.send("start 1");
        c.expect("\"state\":\"Running\"");
    }
    cs.signal(libc::SIGKILL);
    let killed = Instant::now();
    // The run is stopped: its summary is the answer to the stop the lease made.
    let stopped = leased.expect("\"events\"");
    assert!(stopped.starts_with("{\"ok\":true"), "{stopped}");
    assert_eq!(leased.wait_exit(), 1, "an ended lease is a failure");
    assert!(killed.elapsed() >= Duration::from_secs(2), "ended {:?} after the server died", killed.elapsed());
    let stderr = leased.stderr_lines().join("\n");
    let said =
        stderr.lines().find(|l| l.contains("control server unreachable for ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(said.contains(", longer than the lease of 2 s: ending"), "{said}");
    // Without a lease, a component waits for its control server as long as it takes.
    std::thread::sleep(Duration::from_millis(500));
    assert!(forever.child.try_wait().unwrap().is_none(), "the component without a lease ended");
    forever.send("state");
    forever.expect("\"state\":\"Running\"");
}

#[test]
fn a_component_takes_the_token_from_its_first_input_line_and_ends_with_its_input() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let token = "7f3c9a1e5b2d4c6e8a0b1c2d3e4f5a6b";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = token_file.to_str().unwrap();
    let (_cs, addr) = control_server(&["--token-file", file]);
    let mut c = sink(&addr, "sink-stdin", &["--token-stdin"]);
    c.send(token);
    // The rest of the input is the usual protocol.
    c.send("configure");
    c.expect("\"state\":\"Configured\"");
    // It proved the token: it is on the control plane, which takes nobody without it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(["--token-file", file, "dialog", "--control", &addr, "ls"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("sink-stdin") {
            break;
        }
        assert!(Instant::now() < deadline, "sink-stdin never joined: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(100));
    }
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.child.id())).unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", c.child.id())).unwrap();
    for shown in [cmdline, environ] {
        assert!(!String::from_utf8_lossy(&shown).contains(token));
    }
    // Its input is its launcher's line to it: its end ends the component, even on the control
    // plane.
    c.close_stdin();
    assert_eq!(c.wait_exit(), 0);
    assert!(c.stderr_lines().iter().any(|l| l.contains("standard input ended")));

    // No line at all: it says so and does not start.
    let mut none = sink(&addr, "sink-none", &["--token-stdin"]);
    none.close_stdin();
    assert_eq!(none.wait_exit(), 2);
    let said = none.stderr_lines().join("\n");
    assert!(said.contains("--token-stdin: standard input ended before the token's line"), "{said}");
}

/// `daqflow [PRE…] dialog --control ADDR send ARGS…`: exit status, stdout, stderr.
fn dialog_send(addr: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["dialog", "--control", addr, "send"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn dialog_send_prints_each_components_reply_and_fails_when_one_refuses_or_stays_silent() {
    let (_cs, addr) = control_server(&[]);
    let mut sinks = [sink(&addr, "sink-a", &[]), sink(&addr, "sink-b", &[])];
    // Both on the control plane (their commands registered) before anything is sent.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ls = std::process::Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(["dialog", "--control", &addr, "ls", "--filter", "all/configure"])
            .output()
            .unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout);
        if ls.contains("sink-a") && ls.contains("sink-b") {
            break;
        }
        assert!(Instant::now() < deadline, "the sinks never registered their commands: {ls}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, out, err) = dialog_send(&addr, &["all/configure"]);
    assert_eq!(code, Some(0), "{out}{err}");
    for name in ["sink-a", "sink-b"] {
        assert!(out.lines().any(|l| l.starts_with(&format!("{name}: done, now Configured ("))), "{out}");
    }
    assert!(out.contains("`all/configure` reached 2 process(es): 2 did it, 0 refused or failed"), "{out}");
    let (code, out, err) = dialog_send(&addr, &["all/start", "5"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("sink-a: done, now Running (run 5)") && out.contains("sink-b: done, now Running (run 5)"),
        "{out}"
    );
    // Refused by both: each refusal printed, exit status 1; the components stay Running.
    let (code, out, err) = dialog_send(&addr, &["all/configure"]);
    assert_eq!(code, Some(1), "{out}{err}");
    for name in ["sink-a", "sink-b"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}: refused (Running): ")))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(line.contains("configure"), "{line}");
    }
    assert!(err.contains("`all/configure` reached 2 process(es): 0 did it, 2 refused or failed"), "{err}");
    // A payload a component cannot read is refused before anything is sent.
    let (code, _, err) = dialog_send(&addr, &["sink-a/start", "run=8"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--raw sends it as it is"), "{err}");
    // A process that registered a component command but does not answer it is named.
    let mut impostor =
        Proc::spawn(&["dialog", "--control", &addr, "--name", "impostor", "peer", "--command", "all/stop"]);
    impostor.expect("ready impostor");
    let (code, out, err) = dialog_send(&addr, &["all/stop", "--timeout", "3s"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("sink-a: done, now Configured (0 events)") && out.contains("sink-b: done, now Configured"),
        "{out}"
    );
    assert!(
        err.contains("reached 3 process(es): 2 did it, 0 refused or failed, 1 did not answer within 3s (impostor)"),
        "{err}"
    );
    impostor.expect("command all/stop from");
    for s in &mut sinks {
        s.send("state");
        s.expect("\"state\":\"Configured\"");
    }
}
