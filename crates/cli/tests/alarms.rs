//! Alarms in a real system (`daqflow run` with a message logger, a generator and a sink, each a
//! process, the web UI on real TCP): an alarm on a component's rate raised after its `for`
//! time, shown by `/api/alarms`, in the message log and in `/metrics`, acknowledged through the
//! API and cleared when the run stops (its `while Running`); an alarm on a component killed
//! with SIGKILL raised, acknowledged in headless Chromium (the banner's button) and from the
//! operator's console; every event in the run database's `alarm_events`.

#[path = "../../web/tests/support/cdp.rs"]
mod cdp;
#[path = "../../web/tests/support/client.rs"]
mod client;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use client::{Client, get, wait_until};
use daqflow_api::alarms::AlarmEventKind;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// The operator's process, killed if the test ends early.
struct Operator(std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn system_file(data: &std::path::Path) -> String {
    format!(
        r#"[system]
name = "alarmed"
control = "127.0.0.1:0"
data = "{data}"

[[component]]
name = "msglogger"
kind = "msglogger"
[component.params]
control = "${{system.control}}"
database = "${{system.database}}"

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
rate_hz = 200.0

[[alarm]]
name = "slow"
when = "gen.events_per_s < 1e9 for 2 s while Running"
message = "the generator is slower than a GHz"

[[alarm]]
name = "sink-down"
when = "sink in Error, Dead"
severity = "error"
message = "the sink is down"

[[alarm]]
name = "disk"
when = "disk data free < 1 kB"
"#,
        data = data.display()
    )
}

/// An alarm of `GET /api/alarms`.
fn alarm(addr: SocketAddr, name: &str) -> Value {
    let all = get(addr, "/api/alarms").json();
    all["alarms"].as_array().unwrap().iter().find(|a| a["name"] == name).cloned().unwrap_or_else(|| panic!("{all}"))
}

/// Waits for a line of the operator's console that contains `text`.
fn console_line(lines: &Receiver<String>, text: &str) -> String {
    loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no line with {text:?}"));
        if line.contains(text) {
            return line;
        }
    }
}

#[test]
fn alarms_are_raised_logged_exported_acknowledged_cleared_and_stored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let system = dir.path().join("system.toml");
    std::fs::write(&system, system_file(&data)).unwrap();
    let mut op = Operator(
        Command::new(BIN)
            .args(["run", "--web", "127.0.0.1:0"])
            .arg(&system)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = op.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = console_line(&lines, "web UI: ");
    let url = first.split("web UI: ").nth(1).unwrap().trim().to_owned();
    let (base, token) = url.split_once("?token=").unwrap_or_else(|| panic!("no token in {url}"));
    let addr: SocketAddr = base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    let watcher = Client::new(addr);
    let crew = Client::login(addr, token);
    assert_eq!(crew.post("/api/control/take", "{}").status, 200);

    // Every alarm is there, Ok, before anything happens (the disk has more than 1 kB free).
    let all = get(addr, "/api/alarms").json();
    assert_eq!(all["system"], "alarmed");
    let states: Vec<(&str, &str)> = all["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, vec![("slow", "ok"), ("sink-down", "ok"), ("disk", "ok")], "{all}");
    let free = wait_until("the first check", || alarm(addr, "disk")["value"].as_f64());
    assert!(free > 1e3 && alarm(addr, "disk")["state"] == "ok", "{free}");

    // The rate alarm: raised 2 s into the run, not before.
    assert_eq!(crew.post("/api/transition/configure", "{}").status, 200);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(alarm(addr, "slow")["state"], "ok", "raised outside Running");
    assert_eq!(crew.post("/api/transition/start", "{}").status, 200);
    let slow = wait_until("the rate alarm raised", || {
        let a = alarm(addr, "slow");
        (a["state"] == "raised").then_some(a)
    });
    assert_eq!(slow["severity"], "warning");
    assert!(slow["value"].as_f64().is_some_and(|v| v < 1e9), "{slow}");
    let metrics = get(addr, "/metrics").text();
    assert!(
        metrics.contains("daqflow_alarm_active{system=\"alarmed\",name=\"slow\",severity=\"warning\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("daqflow_alarm_unacknowledged{system=\"alarmed\",name=\"slow\",severity=\"warning\"} 1"));
    assert!(metrics.contains("daqflow_alarm_active{system=\"alarmed\",name=\"sink-down\",severity=\"error\"} 0"));
    // In the message browser, at warn, from the operator.
    let logged = wait_until("the raised alarm in the message log", || {
        let l = get(addr, "/api/logs?process=operator&text=alarm%20%60slow%60%20raised&limit=10").json();
        l.as_array().and_then(|a| a.first().cloned())
    });
    assert_eq!(logged["severity"], "warn", "{logged}");
    let message = logged["message"].as_str().unwrap();
    assert!(message.contains("the generator is slower than a GHz (gen.events_per_s = "), "{message}");
    // The value as people read it: a whole number, or 4 significant digits (not 199.08728815659686).
    let value = message.split("gen.events_per_s = ").nth(1).and_then(|v| v.split(')').next()).unwrap();
    let digits = value.chars().filter(char::is_ascii_digit).count();
    assert!(value.parse::<f64>().is_ok() && (digits <= 4 || !value.contains('.')), "{message}");

    // Only the controller acknowledges; an unknown alarm is the client's error.
    assert_eq!(watcher.post("/api/alarms/ack", r#"{"name": "slow"}"#).status, 403);
    let r = crew.post("/api/alarms/ack", r#"{"name": "nothing"}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("there is no alarm `nothing`"), "{}", r.text());
    let r = crew.post("/api/alarms/ack", r#"{"name": "slow", "who": "alice"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["alarm"]["state"], "acknowledged", "{}", r.text());
    assert!(r.json()["alarm"]["acknowledged_by"].as_str().unwrap().starts_with("alice (client "), "{}", r.text());
    let metrics = get(addr, "/metrics").text();
    assert!(metrics.contains("daqflow_alarm_unacknowledged{system=\"alarmed\",name=\"slow\",severity=\"warning\"} 0"));

    // Stopping the run ends its `while Running`: cleared.
    assert_eq!(crew.post("/api/transition/stop", "{}").status, 200);
    wait_until("the rate alarm cleared", || (alarm(addr, "slow")["state"] == "ok").then_some(()));
    let metrics = get(addr, "/metrics").text();
    assert!(metrics.contains("daqflow_alarm_active{system=\"alarmed\",name=\"slow\",severity=\"warning\"} 0"));

    // A component killed: the error alarm.
    let st = get(addr, "/api/status").json();
    let sink = st["components"].as_array().unwrap().iter().find(|c| c["name"] == "sink").unwrap();
    let pid = sink["pid"].as_i64().unwrap() as i32;
    // SAFETY: kill(2) on a process of the system this test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_until("the sink alarm raised", || (alarm(addr, "sink-down")["state"] == "raised").then_some(()));
    let metrics = get(addr, "/metrics").text();
    assert!(metrics.contains("daqflow_alarm_active{system=\"alarmed\",name=\"sink-down\",severity=\"error\"} 1"));
    assert!(metrics.contains("daqflow_alarms_active{system=\"alarmed\"} 1"), "{metrics}");
    let logged = wait_until("the sink alarm in the message log", || {
        let l = get(addr, "/api/logs?text=alarm%20%60sink-down%60%20raised&limit=10").json();
        l.as_array().and_then(|a| a.first().cloned())
    });
    assert_eq!(logged["severity"], "error", "{logged}");
    assert!(logged["message"].as_str().unwrap().contains("the sink is down (sink is Dead)"), "{logged}");

    // The banner shows it in the browser, whose controller acknowledges it with its button.
    if let Some(chromium) = cdp::chromium_or_skip("alarms_are_raised_logged_exported_acknowledged_cleared_and_stored") {
        assert_eq!(crew.post("/api/control/release", "{}").status, 200);
        let mut b = cdp::Browser::launch(&chromium).unwrap_or_else(|e| panic!("launching chromium: {e}"));
        let fail = |what: &str, e: String, b: &cdp::Browser| -> ! {
            panic!("{what}: {e}\npage errors: {:?}\n{}", b.page_errors, b.stderr_tail())
        };
        b.navigate(&url).unwrap_or_else(|e| fail("load", e, &b));
        b.wait_for(
            "the banner",
            "(() => { const a = document.querySelector('#alarm-banner .alarm[data-name=\"sink-down\"]'); \
             return !!a && !document.querySelector('#alarm-banner').hidden && a.dataset.severity === 'error' \
             && a.textContent.includes('the sink is down'); })()",
        )
        .unwrap_or_else(|e| fail("banner", e, &b));
        assert_eq!(b.is_disabled("#alarm-banner .alarm[data-name=\"sink-down\"] .alarm-ack").unwrap(), Some(true));
        b.click("#btn-take").unwrap_or_else(|e| fail("take control", e, &b));
        b.wait_for("control", "document.querySelector('#controller').textContent.startsWith('You control')")
            .unwrap_or_else(|e| fail("control", e, &b));
        b.wait_for(
            "the button enabled",
            "!document.querySelector('#alarm-banner .alarm[data-name=\"sink-down\"] .alarm-ack').disabled",
        )
        .unwrap_or_else(|e| fail("enabled", e, &b));
        b.click("#alarm-banner .alarm[data-name=\"sink-down\"] .alarm-ack").unwrap_or_else(|e| fail("ack", e, &b));
        b.wait_for(
            "acknowledged in the banner",
            "document.querySelector('#alarm-banner .alarm[data-name=\"sink-down\"]')?.dataset.state === 'acknowledged'",
        )
        .unwrap_or_else(|e| fail("acknowledged", e, &b));
        // The Alarms view lists the events.
        b.click("#tab-alarms").unwrap_or_else(|e| fail("tab", e, &b));
        b.wait_for(
            "the events table",
            "document.querySelectorAll('#alarm-events tr[data-kind=\"acknowledged\"]').length >= 2",
        )
        .unwrap_or_else(|e| fail("events", e, &b));
        assert!(b.page_errors.is_empty(), "{:?}", b.page_errors);
        assert_eq!(alarm(addr, "sink-down")["state"], "acknowledged");
    } else {
        let r = crew.post("/api/alarms/ack", r#"{"name": "sink-down"}"#);
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // The console: `alarms` lists them, `ack` of one acknowledged already changes nothing, of
    // one that is Ok says so.
    let stdin = op.0.stdin.as_mut().unwrap();
    stdin.write_all(b"alarms\n").unwrap();
    let line = console_line(&lines, "sink-down");
    assert!(line.starts_with("acknowledged") && line.contains("the sink is down"), "{line}");
    // The disk's free space in decimal units, not bytes.
    let line = console_line(&lines, "[disk data free < 1 kB; now ");
    assert!(line.ends_with(" GB free]") || line.ends_with(" TB free]"), "{line}");
    stdin.write_all(b"ack slow\n").unwrap();
    let line = console_line(&lines, "ack:");
    assert!(line.contains("alarm `slow` is not raised"), "{line}");
    stdin.write_all(b"ack sink-down\n").unwrap();
    assert_eq!(console_line(&lines, "alarm sink-down:"), "alarm sink-down: acknowledged");

    let all = get(addr, "/api/alarms").json();
    let events: Vec<(&str, &str)> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        events,
        vec![
            ("sink-down", "acknowledged"),
            ("sink-down", "raised"),
            ("slow", "cleared"),
            ("slow", "acknowledged"),
            ("slow", "raised")
        ],
        "{all}"
    );

    op.0.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());

    // Stored: the run database has every event, with who acknowledged.
    let db = daqflow_runcontrol::db::RunDb::open(&data.join("runs.sqlite")).unwrap();
    let stored = db.alarm_events(Some("alarmed"), 100).unwrap();
    let kinds: Vec<(&str, AlarmEventKind)> = stored.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("sink-down", AlarmEventKind::Acknowledged),
            ("sink-down", AlarmEventKind::Raised),
            ("slow", AlarmEventKind::Cleared),
            ("slow", AlarmEventKind::Acknowledged),
            ("slow", AlarmEventKind::Raised),
        ]
    );
    assert!(stored[0].who.as_deref().is_some_and(|w| w.starts_with("client ")), "{stored:?}");
    assert!(stored[3].who.as_deref().is_some_and(|w| w.starts_with("alice (client ")), "{stored:?}");
}
