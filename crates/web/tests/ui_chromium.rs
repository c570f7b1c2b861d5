//! The web UI in a real browser: headless Chromium driven over the DevTools Protocol logs in
//! with the web token, drives a run of the fake operator, then visits every view; a client
//! without the token watches but cannot act, and never sees the browser's session.
//!
//! Needs Chromium (`chromium`, `chromium-browser` or `google-chrome` on PATH, or
//! `$DAQFLOW_CHROMIUM`): without it the test is skipped, or fails when `CI` is set.

mod support;

use std::time::Duration;

use daqflow_component::api::SystemState;
use daqflow_web::WebOptions;
use support::cdp::{self, Browser};
use support::client::{Client, SESSION_COOKIE, get};
use support::fake::FakeBackend;

const TOKEN: &str = "5e1f0c2b9d8a7f6e5d4c3b2a19081726";

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
    let options = WebOptions {
        status_interval: Duration::from_millis(300),
        access_token: Some(TOKEN.into()),
        ..WebOptions::default()
    };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let addr = web.local_addr();
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));

    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);
    let r = browser.wait_text("#system-state", "Initial");
    step("the state arrives", &browser, r);

    // Without the token the page watches: it offers to log in, and cannot take control.
    let r = browser.wait_for("the login form", "!document.querySelector('#login-form').hidden");
    step("login form", &browser, r);
    for button in ["#btn-take", "#btn-configure", "#btn-start", "#btn-stop", "#btn-release"] {
        let r = browser.is_disabled(button);
        assert_eq!(step("read a button", &browser, r), Some(true), "{button} enabled before logging in");
    }
    let r = browser.fill("#login-token", "not the token");
    step("type a wrong token", &browser, r);
    let r = browser.click("#login-submit");
    step("log in with it", &browser, r);
    let r =
        browser.wait_for("the refusal", "document.querySelector('#login-result').textContent.includes('wrong token')");
    step("wrong token refused", &browser, r);

    let r = browser.fill("#login-token", TOKEN);
    step("type the token", &browser, r);
    let r = browser.click("#login-submit");
    step("log in", &browser, r);
    let r = browser
        .wait_for("the login", "document.querySelector('#login-form').hidden && window.daqflow.control().may_control");
    step("logged in", &browser, r);

    // The session is an HttpOnly cookie: the page's scripts cannot read it.
    let r = browser.cookies(&web.url());
    let cookies = step("the cookies", &browser, r);
    let cookie =
        cookies.iter().find(|c| c["name"] == SESSION_COOKIE).unwrap_or_else(|| panic!("no session: {cookies:?}"));
    assert_eq!((cookie["httpOnly"].as_bool(), cookie["sameSite"].as_str()), (Some(true), Some("Strict")), "{cookie}");
    let session = cookie["value"].as_str().unwrap().to_owned();
    let r = browser.eval("document.cookie");
    let visible = step("document.cookie", &browser, r);
    assert!(!visible.to_string().contains(&session), "the page's scripts see the session: {visible}");

    // Watching: the transition buttons are disabled.
    for button in ["#btn-configure", "#btn-start", "#btn-stop", "#btn-release"] {
        let r = browser.is_disabled(button);
        assert_eq!(step("read a button", &browser, r), Some(true), "{button} enabled before taking control");
    }

    let r = browser.click("#btn-take");
    step("take control", &browser, r);
    let r = browser.wait_for("control", "document.querySelector('#controller').textContent.startsWith('You control')");
    step("control is ours", &browser, r);
    let r = browser.eval("window.daqflow.control().me");
    let me = step("the page's label", &browser, r);
    let stranger = Client::new(addr);
    let control = stranger.get("/api/control");
    assert_eq!(control.json()["holder"], me);
    assert!(!control.text().contains(&session), "GET /api/control shows the session: {}", control.text());
    assert!(!get(addr, "/api/status").text().contains(&session));

    let r = browser.click("#btn-configure");
    step("configure", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("Configured", &browser, r);

    let r = browser.click("#btn-start");
    step("start", &browser, r);
    let r = browser.wait_text("#system-state", "Running");
    step("Running", &browser, r);
    assert_eq!(backend.state(), SystemState::Running);
    let r = browser.wait_for(
        "events to count",
        "Number(document.querySelector('#stat-events').textContent.replace(/,/g, '')) > 0",
    );
    step("events", &browser, r);
    // The components' table reads the typed counters: stats.events, stats.events_per_s, stats.mb_per_s.
    let r = browser.wait_for(
        "a component's counters",
        "(() => { const c = document.querySelectorAll('#components tr:first-child td'); \
         return Number(c[6].textContent.replace(/,/g, '')) > 0 && c[7].textContent === '1,000' && c[8].textContent === '4.10'; })()",
    );
    step("component counters", &browser, r);
    let r = browser.wait_text("#run-number", "2");
    step("run number", &browser, r);

    // A client without the token watches but can neither take control nor stop the run.
    assert_eq!(stranger.get("/api/status").json()["state"], "Running");
    assert_eq!(stranger.post("/api/control/take", r#"{"force": true}"#).status, 403);
    assert_eq!(stranger.post("/api/transition/stop", "").status, 403);
    assert_eq!(backend.state(), SystemState::Running);
    let r = browser.eval("window.daqflow.control().you");
    assert_eq!(step("still ours", &browser, r), serde_json::Value::Bool(true));

    let r = browser.click("#btn-stop");
    step("stop", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("back to Configured", &browser, r);
    assert_eq!(backend.state(), SystemState::Configured);
    let r = browser.wait_for(
        "the stop's summary",
        "document.querySelector('#transition-result').textContent.startsWith('stop: run 2 stopped:')",
    );
    step("stop summary", &browser, r);

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
    let r = browser.wait_for("their severities", &format!("{} === 5", count("#logs .sev-warn")));
    step("severities", &browser, r);

    let r = browser.click("#tab-runs");
    step("runs tab", &browser, r);
    let r = browser.wait_for("two runs", &format!("{} === 2", count("#runs tr")));
    step("runs", &browser, r);
    let r = browser.click("#runs tr[data-run='2']");
    step("open run 2", &browser, r);
    let r = browser.wait_for(
        "run 2's record",
        "document.querySelector('#run-config').textContent.includes('[system]') \
         && document.querySelector('#run-facts').textContent.includes('built') \
         && document.querySelector('#run-files td.mono').textContent === '/data/run000002_0001.dat'",
    );
    step("run record", &browser, r);

    let r = browser.click("#tab-run");
    step("run tab", &browser, r);
    let r = browser.click("#btn-release");
    step("release control", &browser, r);
    let r = browser.wait_text("#controller", "Nobody controls");
    step("released", &browser, r);
    let r = browser.is_disabled("#btn-start");
    assert_eq!(step("read a button", &browser, r), Some(true));
    assert_eq!(get(addr, "/api/control").json()["controlled"], false);

    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}

/// Disk throttling: a component whose statistics say `detail.throttled` gets a
/// "throttled (disk)" badge in the components' table, with the free space in its title; the
/// badge goes when the component resumes, and no other component has one.
#[test]
fn a_component_throttled_by_its_disk_shows_a_badge() {
    let Some(binary) = cdp::chromium_or_skip("a_component_throttled_by_its_disk_shows_a_badge") else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(10));
    let options = WebOptions { status_interval: Duration::from_millis(200), ..WebOptions::default() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);
    let r = browser.wait_for("two components", &format!("{} === 2", count("#components tr")));
    step("the components", &browser, r);
    let r = browser.eval(&count("#components .throttled"));
    assert_eq!(step("badges before", &browser, r), serde_json::json!(0), "a badge without throttling");

    backend.disk_throttled.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = browser.wait_for("the badge", &format!("{} === 1", count("#components .throttled")));
    step("the throttled badge", &browser, r);
    let row = "Array.from(document.querySelectorAll('#components tr')).find(r => r.querySelector('.throttled'))";
    let r = browser.eval(&format!("{row}.querySelector('td').textContent"));
    assert_eq!(step("the row", &browser, r), serde_json::json!("bu-1"), "the badge is on the throttled component");
    let r = browser.eval(&format!("{row}.querySelector('.throttled').textContent"));
    assert_eq!(step("the text", &browser, r), serde_json::json!("throttled (disk)"));
    let r = browser.eval(&format!("{row}.querySelector('.throttled').title"));
    let title = step("the title", &browser, r).to_string();
    assert!(title.contains("3.0 MiB free") && title.contains("96.5 % used") && title.contains("1×"), "{title}");

    backend.disk_throttled.store(false, std::sync::atomic::Ordering::SeqCst);
    let r = browser.wait_for("the badge to go", &format!("{} === 0", count("#components .throttled")));
    step("resumed", &browser, r);
    assert!(browser.page_errors.is_empty(), "page errors: {:?}", browser.page_errors);
}
