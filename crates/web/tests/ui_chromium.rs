//! The web UI in a real browser: headless Chromium driven over the DevTools Protocol drives a
//! run of the fake operator, then visits every view.
//!
//! Needs Chromium (`chromium`, `chromium-browser` or `google-chrome` on PATH, or
//! `$DAQFLOW_CHROMIUM`): without it the test is skipped, or fails when `CI` is set.

mod support;

use std::time::Duration;

use daqflow_web::WebOptions;
use support::cdp::{self, Browser};
use support::client::{get, post};
use support::fake::FakeBackend;

/// Counts the elements matching a selector.
fn count(selector: &str) -> String {
    format!("document.querySelectorAll({}).length", serde_json::to_string(selector).unwrap())
}

fn step<T>(what: &str, browser: &Browser, result: Result<T, String>) -> T {
    result.unwrap_or_else(|e| {
        panic!("{what}: {e}\npage errors: {:?}\nChromium stderr:\n{}", browser.page_errors, browser.stderr_tail())
    })
}

#[test]
fn the_ui_drives_a_run_in_headless_chromium() {
    let Some(binary) = cdp::chromium_or_skip("the_ui_drives_a_run_in_headless_chromium") else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(200));
    let options = WebOptions { status_interval: Duration::from_millis(300), ..WebOptions::default() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let addr = web.local_addr();
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));

    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);
    let r = browser.wait_text("#system-state", "Initial");
    step("the state arrives", &browser, r);

    // Watching: the transition buttons are disabled.
    for button in ["#btn-configure", "#btn-start", "#btn-stop", "#btn-release"] {
        let r = browser.is_disabled(button);
        assert_eq!(step("read a button", &browser, r), Some(true), "{button} enabled before taking control");
    }

    let r = browser.click("#btn-take");
    step("take control", &browser, r);
    let r = browser.wait_for("control", "document.querySelector('#controller').textContent.startsWith('You control')");
    step("control is ours", &browser, r);
    let r = browser.eval("window.daqflow.clientId");
    let client = step("the client id", &browser, r);
    assert_eq!(get(addr, "/api/control").json()["controller"], client);

    let r = browser.click("#btn-configure");
    step("configure", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("Configured", &browser, r);

    let r = browser.click("#btn-start");
    step("start", &browser, r);
    let r = browser.wait_text("#system-state", "Running");
    step("Running", &browser, r);
    assert_eq!(backend.state(), "Running");
    let r = browser.wait_for(
        "events to count",
        "Number(document.querySelector('#stat-events').textContent.replace(/,/g, '')) > 0",
    );
    step("events", &browser, r);
    let r = browser.wait_text("#run-number", "2");
    step("run number", &browser, r);

    // Another client is refused while this page controls.
    assert_eq!(post(addr, "/api/transition/stop", "intruder", "").status, 403);
    assert_eq!(backend.state(), "Running");

    let r = browser.click("#btn-stop");
    step("stop", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("back to Configured", &browser, r);
    assert_eq!(backend.state(), "Configured");

    // Every other view shows its data.
    let r = browser.click("#tab-rates");
    step("rates tab", &browser, r);
    let r = browser.wait_for("the rate plot", "document.querySelector('#rates-canvas').width > 0");
    step("rate plot", &browser, r);

    let r = browser.click("#tab-histograms");
    step("histograms tab", &browser, r);
    let r = browser.wait_for("two histograms", &format!("{} === 2", count("#histograms canvas")));
    step("histograms", &browser, r);

    let r = browser.click("#tab-et");
    step("ET tab", &browser, r);
    let r = browser.wait_for("two ET stations", &format!("{} === 2", count("#et-systems .et-stations tbody tr")));
    step("ET stations", &browser, r);

    let r = browser.click("#tab-processes");
    step("processes tab", &browser, r);
    let r = browser.wait_for("two processes", &format!("{} === 2", count("#processes tr")));
    step("processes", &browser, r);
    let r = browser.click("#processes button.service");
    step("listen to a service", &browser, r);
    let r = browser.wait_for("values of the service", &format!("{} >= 2", count("#listen-values li")));
    step("listened values", &browser, r);
    let r = browser.click("#listen-stop");
    step("stop listening", &browser, r);

    let r = browser.click("#tab-messages");
    step("messages tab", &browser, r);
    let r = browser.wait_for("the messages", &format!("{} === 20", count("#logs tr")));
    step("messages", &browser, r);

    let r = browser.click("#tab-runs");
    step("runs tab", &browser, r);
    let r = browser.wait_for("two runs", &format!("{} === 2", count("#runs tr")));
    step("runs", &browser, r);
    let r = browser.click("#runs tr[data-run='2']");
    step("open run 2", &browser, r);
    let r =
        browser.wait_for("run 2's record", "document.querySelector('#run-record').textContent.includes('\"config\"')");
    step("run record", &browser, r);

    let r = browser.click("#tab-run");
    step("run tab", &browser, r);
    let r = browser.click("#btn-release");
    step("release control", &browser, r);
    let r = browser.wait_text("#controller", "Nobody controls");
    step("released", &browser, r);
    let r = browser.is_disabled("#btn-start");
    assert_eq!(step("read a button", &browser, r), Some(true));
    assert_eq!(get(addr, "/api/control").json()["controller"], serde_json::Value::Null);

    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}
