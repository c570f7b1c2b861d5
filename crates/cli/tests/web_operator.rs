//! The web UI and its HTTP API served by a real operator (`daqflow run`) over a real system:
//! control ownership, transitions, the DIALOG view, metrics, the run history and the message
//! log; then headless Chromium takes control, starts and stops a run, and sees the state
//! change.

#[path = "../../web/tests/support/cdp.rs"]
mod cdp;
#[path = "../../web/tests/support/client.rs"]
mod client;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use client::{get, post, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

#[test]
fn the_operator_serves_the_api_and_the_ui_drives_a_run_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let config = Command::new(BIN).args(["demo", "--print-config"]).output().unwrap();
    let system = dir.path().join("system.toml");
    std::fs::write(&system, &config.stdout).unwrap();
    let mut op = Command::new(BIN)
        .args(["run", "--web", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .arg(&system)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(op.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    let url = first.split("web UI ").nth(1).unwrap_or_else(|| panic!("no web address in {first:?}")).trim().to_owned();
    let addr: SocketAddr = url.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    // Keep reading the console so that it never blocks.
    std::thread::spawn(move || for _ in lines {});

    // Watching is open to all; acting needs control.
    let st = get(addr, "/api/status").json();
    assert_eq!(st["state"], "Initial", "{st}");
    assert_eq!(st["components"].as_array().unwrap().len(), 13);
    assert_eq!(post(addr, "/api/transition/configure", "tester", "{}").status, 403);
    assert_eq!(post(addr, "/api/control/take", "tester", r#"{"client":"tester"}"#).status, 200);
    assert_eq!(post(addr, "/api/control/take", "other", r#"{"client":"other"}"#).status, 409);
    let r = post(addr, "/api/transition/start", "tester", "{}");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error().contains("cannot start the system in state Initial"), "{}", r.text());
    let r = post(addr, "/api/transition/configure", "tester", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(addr, "/api/status").json()["state"], "Configured");
    // The DIALOG view and the metrics.
    let procs = get(addr, "/api/processes").json();
    let names: Vec<&str> = procs.as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    for n in ["operator", "evm", "bu-1", "msglogger"] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    let evm = procs.as_array().unwrap().iter().find(|p| p["name"] == "evm").unwrap();
    assert!(evm["provides"].as_array().unwrap().iter().any(|s| s == "evm/state"), "{evm}");
    assert!(evm["commands"].as_array().unwrap().iter().any(|s| s == "evm/start"), "{evm}");
    let metrics = get(addr, "/metrics").text();
    assert!(metrics.contains("daqflow_component_up{component=\"bu-0\",kind=\"bu\"} 1"), "{metrics}");
    assert!(metrics.contains("daqflow_component_state{component=\"evm\",kind=\"evm\",state=\"Configured\"} 1"));
    assert_eq!(post(addr, "/api/control/release", "tester", r#"{"client":"tester"}"#).status, 200);

    // The browser takes control, starts and stops a run.
    if let Some(chromium) = cdp::chromium_or_skip("the_operator_serves_the_api_and_the_ui_drives_a_run_in_chromium") {
        let mut b = cdp::Browser::launch(&chromium).unwrap_or_else(|e| panic!("launching chromium: {e}"));
        let fail = |what: &str, e: String, b: &cdp::Browser| -> ! {
            panic!("{what}: {e}\npage errors: {:?}\n{}", b.page_errors, b.stderr_tail())
        };
        b.navigate(&url).unwrap_or_else(|e| fail("load", e, &b));
        b.wait_text("#system-state", "Configured").unwrap_or_else(|e| fail("state", e, &b));
        b.click("#btn-take").unwrap_or_else(|e| fail("take control", e, &b));
        b.wait_for("control", "document.querySelector('#controller').textContent.startsWith('You control')")
            .unwrap_or_else(|e| fail("control", e, &b));
        b.click("#btn-start").unwrap_or_else(|e| fail("start", e, &b));
        b.wait_text("#system-state", "Running").unwrap_or_else(|e| fail("Running", e, &b));
        b.wait_for("events", "Number(document.querySelector('#stat-events').textContent.replace(/,/g, '')) > 1000")
            .unwrap_or_else(|e| fail("events", e, &b));
        b.click("#btn-stop").unwrap_or_else(|e| fail("stop", e, &b));
        b.wait_text("#system-state", "Configured").unwrap_or_else(|e| fail("Configured", e, &b));
        assert!(b.page_errors.is_empty(), "{:?}", b.page_errors);
    } else {
        // No browser (and not CI): take the run through the API instead.
        assert_eq!(post(addr, "/api/control/take", "tester", r#"{"client":"tester"}"#).status, 200);
        assert_eq!(post(addr, "/api/transition/start", "tester", "{}").status, 200);
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(post(addr, "/api/transition/stop", "tester", "{}").status, 200);
    }

    // The run is in the history, with nothing lost; the monitor filled its histograms; the
    // message log has the operator's records; ET shows the stations.
    let runs = wait_until("the run record", || {
        let r = get(addr, "/api/runs").json();
        (r.as_array().is_some_and(|a| a.first().is_some_and(|x| x["state"] == "stopped"))).then_some(r)
    });
    assert_eq!(runs[0]["lost"], 0, "{runs}");
    let run = get(addr, "/api/runs/1").json();
    assert!(run["files"].as_array().is_some_and(|f| !f.is_empty()), "{run}");
    let hists = get(addr, "/api/histograms").json();
    let size = hists.as_array().unwrap().iter().find(|h| h["name"] == "event_size").expect("event_size histogram");
    assert!(size["entries"].as_u64().unwrap() > 0, "{size}");
    let et = get(addr, "/api/et").json();
    let stations: Vec<&str> =
        et[0]["snapshot"]["stations"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(stations.contains(&"recorder") && stations.contains(&"monitor"), "{stations:?}");
    let logs = wait_until("operator log records", || {
        let l = get(addr, "/api/logs?process=operator&limit=50").json();
        l.as_array().is_some_and(|a| !a.is_empty()).then_some(l)
    });
    assert!(logs.as_array().unwrap().iter().all(|r| r["process"] == "operator"));

    op.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let status = wait_until("the operator to exit", || op.try_wait().unwrap());
    assert!(status.success());
}
