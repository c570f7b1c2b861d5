//! A whole event builder driven only over the control plane: every component a `daqflow
//! component … --control` process, commanded with dialog commands, observed through its
//! `NAME/state` service.

mod common;

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::Proc;
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
    // A component registers its commands right after it starts; until the control server has
    // them, a command reaches nobody: retry for a while.
    let send = |cmd: &str, payload: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while op.send_command(cmd, payload.as_bytes()).unwrap() == 0 {
            assert!(Instant::now() < deadline, "{cmd} reached nobody");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let state_is = |s: &'static str| move |v: &Value| v["state"] == s;
    let listen = |v: &Value| v["last_command"]["result"]["listen"].as_str().map(str::to_owned);

    let _evm = component(&addr, "evm", "evm", &["rus=1".into()]);
    w.until("evm", "Initial", state_is("Initial"));
    send("evm/configure", "");
    let evm_addr = listen(&w.until("evm", "configured", |v| listen(v).is_some())).unwrap();
    let _ru = component(&addr, "ru", "ru-0", &[format!("evm=\"{evm_addr}\""), "streams=2".into()]);
    w.until("ru-0", "Initial", state_is("Initial"));
    send("ru-0/configure", "");
    let ru_addr = listen(&w.until("ru-0", "configured", |v| listen(v).is_some())).unwrap();
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
        send(&format!("{n}/configure"), "");
        w.until(n, "Configured", state_is("Configured"));
    }
    // An illegal transition is refused, and the refusal is visible.
    send("evm/resume", "");
    let refused = w.until("evm", "refusing resume", |v| v["last_command"]["ok"] == false);
    assert!(refused["last_command"]["error"].as_str().unwrap().contains("cannot resume in state Configured"));

    // One command starts everybody (in any order: peers connect with retries).
    send("all/start", "{\"run\": 12}");
    for n in ["evm", "ru-0", "bu-0", "src-0", "src-1"] {
        let v = w.until(n, "Running", state_is("Running"));
        assert_eq!(v["run"], 12, "{n}: {v}");
    }
    std::thread::sleep(Duration::from_millis(1500));
    send("evm/stop", "");
    let evm =
        w.until("evm", "stopped", |v| v["state"] == "Configured" && v["last_command"]["result"]["lost"].is_number());
    let summary = &evm["last_command"]["result"];
    let last = summary["last_event"].as_u64().unwrap();
    assert!(last > 1000, "{summary}");
    assert_eq!(summary["lost"], 0, "{summary}");
    for s in ["src-0", "src-1"] {
        send(&format!("{s}/stop"), &last.to_string());
        w.until(s, "stopped", state_is("Configured"));
    }
    send("ru-0/stop", "");
    w.until("ru-0", "stopped", |v| v["state"] != "Running" && v["last_command"]["result"]["counters"].is_object());
    send("bu-0/stop", "");
    let bu = w.until("bu-0", "stopped", |v| {
        v["state"] == "Configured" && v["last_command"]["result"]["events_built"].is_number()
    });
    assert_eq!(bu["last_command"]["result"]["events_built"].as_u64(), Some(last), "{bu}");
}
