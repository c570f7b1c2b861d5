//! The web UI in a real browser: headless Chromium driven over the DevTools Protocol logs in
//! with the web token, drives a run of the fake operator, then visits every view; a client
//! without the token watches but cannot act, and never sees the browser's session.
//!
//! Needs Chromium (`chromium`, `chromium-browser` or `google-chrome` on PATH, or
//! `$DAQFLOW_CHROMIUM`): without it the test is skipped, or fails when `CI` is set.

mod support;

use std::time::Duration;

use daqflow_api::SystemState;
use daqflow_web::WebOptions;
use support::cdp::{self, Browser};
use support::client::{Client, SESSION_COOKIE, get};
use support::fake::FakeBackend;

const TOKEN: &str = "5e1f0c2b9d8a7f6e5d4c3b2a19081726";

/// Counts the elements matching a selector.
fn count(selector: &str) -> String {
    format!("document.querySelectorAll({}).length", serde_json::to_string(selector).unwrap())
}

/// The transition buttons enabled, in order (`configure reset`).
const ENABLED: &str = "['configure', 'start', 'pause', 'resume', 'stop', 'reset']\
     .filter((n) => !document.querySelector('#btn-' + n).disabled).join(' ')";

/// Waits until exactly the transition buttons `expected` are enabled, and says so if not.
fn enabled_buttons(browser: &mut Browser, state: &str, expected: &str) {
    let r = browser.wait_for(&format!("{expected:?} enabled while {state}"), &format!("{ENABLED} === {expected:?}"));
    if let Err(e) = r {
        let now = browser.eval(ENABLED);
        panic!("{e}: while {state} the enabled buttons are {now:?}, not {expected:?}");
    }
}

/// The text of every number a run view shows as a count or a rate (the cards but the run
/// number and duration; the components' events, events/s and MB/s): one format, thousands
/// separated.
const COUNTS: &str = "[...['#stat-events', '#stat-recorded', '#stat-eps', '#stat-mbps', '#stat-lost']\
     .map((id) => document.querySelector(id).textContent), ...[...document.querySelectorAll('#components tr')]\
     .flatMap((r) => [6, 7, 8].map((i) => r.children[i] ? r.children[i].textContent : ''))]";

/// Asserts that every count and rate shown has its thousands separated ("23,353", never "23353").
fn one_number_format(browser: &mut Browser) {
    let r = browser.eval(COUNTS);
    let texts = step("the numbers shown", browser, r);
    let texts: Vec<&str> = texts.as_array().unwrap().iter().filter_map(|t| t.as_str()).collect();
    for t in &texts {
        let digits = t.split(|c: char| !c.is_ascii_digit()).map(str::len).max().unwrap_or(0);
        let grouped = t.split('.').next().unwrap().split(',').skip(1).all(|g| g.len() == 3);
        assert!(digits <= 3 && grouped, "{t:?} is not in the page's number format (all: {texts:?})");
    }
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

    // Exactly the transitions the state machine allows are offered, in every state.
    enabled_buttons(&mut browser, "Initial", "configure reset");
    let r = browser.click("#btn-configure");
    step("configure", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("Configured", &browser, r);
    enabled_buttons(&mut browser, "Configured", "start reset");

    let r = browser.click("#btn-start");
    step("start", &browser, r);
    let r = browser.wait_text("#system-state", "Running");
    step("Running", &browser, r);
    assert_eq!(backend.state(), SystemState::Running);
    // No reset while a run goes on: it ends with a stop.
    enabled_buttons(&mut browser, "Running", "pause stop");
    let r = browser.wait_for(
        "more than 1,000 events",
        "Number(document.querySelector('#stat-events').textContent.replace(/,/g, '')) > 1000",
    );
    step("events", &browser, r);
    one_number_format(&mut browser);
    // Recorded is never above Events; Lost is a number during the run, and says what it is.
    let r = browser.eval(
        "[Number(document.querySelector('#stat-recorded').textContent.replace(/,/g, '')), \
          Number(document.querySelector('#stat-events').textContent.replace(/,/g, ''))]",
    );
    let counts = step("events and recorded", &browser, r);
    assert!(counts[0].as_f64() <= counts[1].as_f64(), "recorded above events: {counts}");
    let r = browser.text("#stat-lost");
    assert_eq!(step("lost", &browser, r).as_deref(), Some("0"), "lost during the run");
    let r = browser.text("#stat-lost-note");
    assert_eq!(step("lost's note", &browser, r).as_deref(), Some("so far (trigger)"));
    // The components' table reads the typed counters: stats.events, stats.events_per_s, stats.mb_per_s.
    let r = browser.wait_for(
        "a component's counters",
        "(() => { const c = document.querySelectorAll('#components tr:first-child td'); \
         return Number(c[6].textContent.replace(/,/g, '')) > 0 && c[7].textContent === '1,000' && c[8].textContent === '4.10'; })()",
    );
    step("component counters", &browser, r);
    let r = browser.wait_text("#run-number", "2");
    step("run number", &browser, r);
    let r = browser.click("#btn-pause");
    step("pause", &browser, r);
    let r = browser.wait_text("#system-state", "Paused");
    step("Paused", &browser, r);
    enabled_buttons(&mut browser, "Paused", "resume stop");
    let r = browser.click("#btn-resume");
    step("resume", &browser, r);
    let r = browser.wait_text("#system-state", "Running");
    step("Running again", &browser, r);

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
    enabled_buttons(&mut browser, "Configured after the run", "start reset");
    // Stopped: the components move nothing (rates 0, not the run's last second); Lost is the
    // run's accounting.
    let r = browser.wait_for(
        "the components at rest",
        "[...document.querySelectorAll('#components tr')].every((r) => r.children[7].textContent === '0' \
         && r.children[8].textContent === '0')",
    );
    step("rates 0 after the stop", &browser, r);
    let r = browser.wait_text("#stat-lost-note", "in run 2");
    step("lost of run 2", &browser, r);
    one_number_format(&mut browser);

    // Every other view shows its data.
    let r = browser.click("#tab-rates");
    step("rates tab", &browser, r);
    let r = browser.wait_for("the rate plot", "document.querySelector('#rates-canvas').width > 0");
    step("rate plot", &browser, r);

    let r = browser.click("#tab-histograms");
    step("histograms tab", &browser, r);
    let r = browser.wait_for("four plots and a counter", &format!("{} === 4", count("#histograms canvas")));
    step("histograms", &browser, r);
    let facts = |browser: &mut Browser, name: &str| {
        let r = browser.eval(&format!(
            "document.querySelector('#histograms .histogram[data-name=\"monitor-1/{name}\"] .facts').textContent"
        ));
        step("a histogram's facts", browser, r).as_str().unwrap_or_default().to_owned()
    };
    // The means are the monitor's, of the values filled: fixed 512-byte fragments have the
    // mean 512 (their bin's centre is 544); the rate series' mean is events per second.
    let sizes = facts(&mut browser, "event_size");
    assert!(sizes.contains("mean 4,609 bytes (lowest 3,100, highest 6,050)"), "{sizes}");
    let fragments = facts(&mut browser, "fragment_size_src0");
    assert!(fragments.contains("mean 512 bytes (lowest 512, highest 512)"), "{fragments}");
    let rate = facts(&mut browser, "rate");
    assert_eq!(rate, "240,000 events in the last 120 s · mean 2,000 events/s (lowest 2,000, highest 2,000)");
    // Event sizes of 3 to 6 kB in a histogram up to 16 kB: the axis ends at the data.
    let r = browser.eval(
        "document.querySelector('#histograms .histogram[data-name=\"monitor-1/event_size\"] canvas').dataset.xTicks",
    );
    assert_eq!(step("the size axis", &browser, r), "0 2,000 4,000 6,000 8,000");
    // A user's group of monitors, summed by the operator: the map's axes and scale, the counter.
    let map = "#histograms .histogram.h2[data-name=\"adc-mons/hitmap\"]";
    let r = browser.eval(&format!(
        "(() => {{ const c = document.querySelector('{map} canvas'); \
         return [c.dataset.max, c.dataset.xTicks, c.dataset.yTicks, document.querySelector('{map} .facts').textContent].join('|'); }})()"
    ));
    assert_eq!(
        step("the 2D map", &browser, r),
        "120|0 1 2 3 4|0 100 200 300 400|entries 200 · outside 4 · largest bin 120 · sum of adc-1, adc-2"
    );
    let r = browser.eval(
        "[...document.querySelectorAll('#histograms .histogram.counter[data-name=\"adc-mons/hits\"] > *')]\
         .map((e) => e.textContent).join('|')",
    );
    assert_eq!(step("the counter", &browser, r), "adc-mons / Hits above threshold|23,353|hits · sum of adc-1, adc-2");
    // Run 1 as the reference: its event sizes (438 entries) drawn over the live ones (876),
    // scaled ×2; its fragment sizes have other bins; its counter's value beside the live one.
    let r = browser.eval(
        "document.querySelector('#hist-ref-run').value = '1'; document.querySelector('#hist-ref-go').click(); true",
    );
    step("overlay run 1", &browser, r);
    let sizes_plot = "#histograms .histogram[data-name=\"monitor-1/event_size\"] canvas";
    let r = browser.wait_for(
        "the reference drawn",
        &format!("document.querySelector('{sizes_plot}').dataset.reference === 'run 1 ×2.00'"),
    );
    step("reference", &browser, r);
    let fragments = facts(&mut browser, "fragment_size_src0");
    assert!(fragments.ends_with(" · run 1 has other bins: not drawn"), "{fragments}");
    let r = browser
        .eval("document.querySelector('#histograms .histogram[data-name=\"adc-mons/hits\"] .facts').textContent");
    assert_eq!(step("the counter's reference", &browser, r), "hits · sum of adc-1, adc-2 · run 1: 1,000");
    let r = browser.eval("document.querySelector('#hist-ref-info').textContent");
    assert_eq!(
        step("the reference's line", &browser, r),
        "overlaid: run 1's 3 histograms at its end, scaled to the live entries"
    );
    let r = browser.eval("document.querySelector('#hist-ref-clear').click(); true");
    step("clear the reference", &browser, r);
    let r = browser.wait_for(
        "the reference gone",
        &format!("document.querySelector('{sizes_plot}').dataset.reference === undefined"),
    );
    step("no reference", &browser, r);
    // Log y: the event sizes' largest bin (100) on a scale of two decades.
    let r = browser.click("#hist-log");
    step("log y", &browser, r);
    let r = browser.wait_for(
        "the log scale",
        &format!(
            "document.querySelector('{sizes_plot}').dataset.scale === 'log' \
             && document.querySelector('{sizes_plot}').dataset.yTicks === '1 10 100'"
        ),
    );
    step("log scale", &browser, r);
    let r = browser.click("#hist-log");
    step("linear y", &browser, r);
    let r = browser.wait_for(
        "the linear scale",
        &format!(
            "document.querySelector('{sizes_plot}').dataset.scale === 'linear' \
             && document.querySelector('{sizes_plot}').dataset.yTicks === '0 50 100'"
        ),
    );
    step("linear scale", &browser, r);

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
    let r = browser.eval("document.querySelector('#run-histograms-empty').hidden");
    assert_eq!(step("run 2 saved no histogram", &browser, r), false);
    // Run 1 ended with three: drawn when their box opens.
    let r = browser.click("#runs tr[data-run='1']");
    step("open run 1", &browser, r);
    let r = browser.eval("document.querySelector('#run-histograms-box').open = true; true");
    step("open its histograms", &browser, r);
    let r = browser.wait_for(
        "run 1's histograms drawn",
        &format!(
            "{} === 3 && document.querySelector('#run-histograms .histogram[data-name=\"monitor-1/event_size\"] canvas').dataset.xTicks !== undefined",
            count("#run-histograms .histogram")
        ),
    );
    step("saved histograms", &browser, r);

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

#[test]
fn the_runs_view_shows_a_runs_configuration_and_its_diff_against_another_run() {
    use daqflow_api::{ParameterChange, RunProvenance};
    let Some(binary) =
        cdp::chromium_or_skip("the_runs_view_shows_a_runs_configuration_and_its_diff_against_another_run")
    else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(50));
    let file = |credits: u32| {
        format!("[system]\nname = \"fake\"\n\n[[component]]\nname = \"bu-1\"\nkind = \"bu\"\ncredits = {credits}\n")
    };
    let params = |credits: u32, batch: u32| {
        [("bu-1".to_owned(), serde_json::json!({"credits": credits, "request_batch": batch, "output": "files"}))]
            .into_iter()
            .collect()
    };
    let first = RunProvenance {
        system_digest: "11".repeat(32),
        effective_digest: "11".repeat(32),
        overrides: Default::default(),
        params: params(64, 32),
        repeat_of: None,
    };
    let second = RunProvenance {
        system_digest: "22".repeat(32),
        effective_digest: "33".repeat(32),
        overrides: [("bu-1.request_batch".to_owned(), serde_json::json!(8))].into_iter().collect(),
        params: params(128, 8),
        repeat_of: Some(41),
    };
    let change = ParameterChange {
        t_ms: 1_700_004_300_000,
        component: "bu-1".into(),
        key: "flush_interval_ms".into(),
        value: serde_json::json!(50),
    };
    backend.add_run(41, &file(64), first, Vec::new());
    backend.add_run(42, &file(128), second, vec![change]);
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), WebOptions::default()).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&format!("{}#runs", web.url()));
    step("load the runs view", &browser, r);
    let r = browser.wait_for("runs 41 and 42", "document.querySelector(\"#runs tr[data-run='42']\") !== null");
    step("runs", &browser, r);
    let r = browser.click("#runs tr[data-run='42']");
    step("open run 42", &browser, r);
    let digest = "22".repeat(32);
    let r = browser.wait_for(
        "run 42's configuration",
        &format!(
            "document.querySelector('#prov-facts').textContent.includes('{digest}') \
             && document.querySelector('#prov-facts').textContent.includes('repeats run 41')"
        ),
    );
    step("provenance facts", &browser, r);
    let r = browser.eval("document.querySelector('#prov-overrides').textContent");
    let overrides = step("overrides", &browser, r);
    assert!(overrides.as_str().is_some_and(|t| t.contains("bu-1.request_batch") && t.contains('8')), "{overrides}");
    let r = browser.eval("document.querySelector('#run-changes').textContent");
    let changes = step("changes", &browser, r);
    assert!(changes.as_str().is_some_and(|t| t.contains("flush_interval_ms") && t.contains("50")), "{changes}");
    let r = browser.eval("document.querySelector('#prov-params').textContent");
    let shown = step("params", &browser, r);
    assert!(shown.as_str().is_some_and(|t| t.contains("bu-1.credits = 128")), "{shown}");

    let r = browser.fill("#prov-diff-run", "41");
    step("type the other run", &browser, r);
    let r = browser.click("#prov-diff-go");
    step("diff", &browser, r);
    let r = browser.wait_for(
        "the diff against run 41",
        "document.querySelector('#prov-diff-summary').textContent.startsWith('run 41 → run 42')",
    );
    step("diff summary", &browser, r);
    let lines = |class: &str| {
        format!("Array.from(document.querySelectorAll('#prov-diff .{class}')).map((e) => e.textContent).join('\\n')")
    };
    let r = browser.eval(&lines("diff-del"));
    let removed = step("removed lines", &browser, r);
    let r = browser.eval(&lines("diff-add"));
    let added = step("added lines", &browser, r);
    let (removed, added) = (removed.as_str().unwrap_or_default(), added.as_str().unwrap_or_default());
    for line in ["- credits = 64", "- bu-1.credits = 64", "- bu-1.request_batch = 32"] {
        assert!(removed.lines().any(|l| l == line), "{line:?} not among the removed lines:\n{removed}");
    }
    for line in
        ["+ credits = 128", "+ # set bu-1.request_batch = 8", "+ bu-1.credits = 128", "+ # changed during the run:"]
    {
        assert!(added.lines().any(|l| l == line), "{line:?} not among the added lines:\n{added}");
    }
    assert!(!removed.contains("name = \"bu-1\""), "a line both have is not a difference:\n{removed}");
    let r = browser.eval(&count("#prov-diff .diff-same"));
    let same = step("common lines", &browser, r);
    assert!(same.as_u64().is_some_and(|n| n >= 5), "{same}");

    // A run that is not there: the diff says so, and shows nothing.
    let r = browser.fill("#prov-diff-run", "77");
    step("type a missing run", &browser, r);
    let r = browser.click("#prov-diff-go");
    step("diff again", &browser, r);
    let r = browser.wait_for(
        "no run 77",
        "document.querySelector('#prov-diff-summary').textContent.startsWith('run 77:') \
         && document.querySelector('#prov-diff').hidden",
    );
    step("missing run", &browser, r);
    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}

#[test]
fn live_parameters_and_degraded_running_in_headless_chromium() {
    let Some(binary) = cdp::chromium_or_skip("live_parameters_and_degraded_running_in_headless_chromium") else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(50));
    let options = WebOptions {
        status_interval: Duration::from_millis(300),
        access_token: Some(TOKEN.into()),
        ..WebOptions::default()
    };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&format!("{}?token={TOKEN}", web.url()));
    step("load the UI with the token", &browser, r);
    let r = browser.wait_for("the login", "window.daqflow.control().may_control === true");
    step("logged in", &browser, r);
    let r = browser.click("#btn-take");
    step("take control", &browser, r);
    let r = browser.wait_for("control", "window.daqflow.control().you === true");
    step("control is ours", &browser, r);
    for (button, state) in [("#btn-configure", "Configured"), ("#btn-start", "Running")] {
        let r = browser.wait_for("the button", &format!("!document.querySelector('{button}').disabled"));
        step("enabled", &browser, r);
        let r = browser.click(button);
        step(button, &browser, r);
        let r = browser.wait_text("#system-state", state);
        step(state, &browser, r);
    }

    // A live parameter from the form reaches the backend; one that is not live is refused with
    // the component's reason, shown beside the form.
    let set = |browser: &mut Browser, key: &str, value: &str| {
        let r = browser.eval("document.querySelector('#param-component').value = 'source-1'");
        step("choose the component", browser, r);
        let r = browser.fill("#param-key", key);
        step("type the key", browser, r);
        let r = browser.fill("#param-value", value);
        step("type the value", browser, r);
        let r = browser.click("#param-set");
        step("set", browser, r);
    };
    // The form offers the keys the component's schema lets change now (Running: the live
    // ones), and says what the key typed takes.
    let r = browser.eval("document.querySelector('#param-component').value = 'source-1'; document.querySelector('#param-component').dispatchEvent(new Event('change'))");
    step("choose the component", &browser, r);
    let r = browser.wait_for(
        "the live keys offered",
        "Array.from(document.querySelectorAll('#param-keys option')).map((o) => o.value).join(',') === 'rate_hz'",
    );
    step("live keys offered", &browser, r);
    let r = browser.fill("#param-key", "rate_hz");
    step("type the key", &browser, r);
    let r = browser.wait_for(
        "what the key takes",
        "document.querySelector('#param-about').textContent === 'rate_hz: 0 … 1,000,000,000 Hz; default 0; live while Configured, Running, Paused. Fragments per second; 0: free-running.'",
    );
    step("what rate_hz takes", &browser, r);
    let r = browser.fill("#param-key", "source_id");
    step("type another key", &browser, r);
    let r = browser.wait_for(
        "a key that is not live",
        "document.querySelector('#param-about').textContent.includes('source_id: 0 … 4,294,967,295; default 0; not live')",
    );
    step("source_id is not live", &browser, r);
    set(&mut browser, "rate_hz", "500");
    let r = browser.wait_text("#param-result", "source-1.rate_hz = 500");
    step("the live parameter is set", &browser, r);
    assert_eq!(backend.sets.lock().unwrap().get("source-1.rate_hz"), Some(&serde_json::json!(500)));
    let r = browser.wait_for(
        "the override listed",
        "document.querySelector('#param-overrides').textContent.includes('source-1.rate_hz = 500')",
    );
    step("override listed", &browser, r);
    set(&mut browser, "source_id", "3");
    let r = browser.wait_for(
        "the refusal",
        "document.querySelector('#param-result').textContent.includes('`source_id` cannot change after configure')",
    );
    step("refused", &browser, r);

    // Degraded running: a banner and a badge on the component the run goes on without.
    backend.degraded.lock().unwrap().insert("bu-1".into(), "signal: 9 (SIGKILL) (expendable)".into());
    let r = browser.wait_for(
        "the degraded banner",
        "!document.querySelector('#degraded').hidden && document.querySelector('#degraded').textContent.includes('bu-1 (signal: 9 (SIGKILL) (expendable))')",
    );
    step("degraded banner", &browser, r);
    let r = browser.wait_for("the badge", &format!("{} === 1", count("#components .out-of-run")));
    step("badge", &browser, r);

    // The run's record lists the live change and whom it went without.
    let r = browser.click("#btn-stop");
    step("stop", &browser, r);
    let r = browser.wait_text("#system-state", "Configured");
    step("stopped", &browser, r);
    let r = browser.click("#tab-runs");
    step("runs tab", &browser, r);
    let r = browser.wait_for("run 2", &format!("{} === 1", count("#runs tr[data-run='2']")));
    step("run 2 listed", &browser, r);
    let r = browser.click("#runs tr[data-run='2']");
    step("open run 2", &browser, r);
    let r = browser.wait_for(
        "the live change and the degraded component",
        "document.querySelector('#run-changes').textContent.includes('rate_hz') \
         && document.querySelector('#run-changes').textContent.includes('500') \
         && document.querySelector('#run-degraded').textContent.includes('went on without bu-1: signal: 9')",
    );
    step("run record", &browser, r);
    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}

/// How many opaque pixels of the history plot are of the value line's blue (`--eps`,
/// #2563a8; the axes and labels are grey).
const LINE_PIXELS: &str = "(() => { const c = document.querySelector('#history-canvas'); \
     const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; \
     for (let i = 0; i < d.length; i += 4) { if (d[i + 3] > 200 && d[i + 2] - d[i] > 60) n++; } \
     return n; })()";

#[test]
fn the_history_panel_lists_the_names_and_plots_a_value_in_headless_chromium() {
    use support::history::{HistoryBackend, INTERVAL_MS, RUN_SAMPLES, SAMPLES};
    let Some(binary) =
        cdp::chromium_or_skip("the_history_panel_lists_the_names_and_plots_a_value_in_headless_chromium")
    else {
        return;
    };
    let created = std::time::Instant::now();
    let backend = HistoryBackend::new(FakeBackend::new(Duration::from_millis(20)));
    let options = WebOptions { status_interval: Duration::from_millis(300), ..WebOptions::default() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend, options).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);
    let r = browser.wait_text("#system-state", "Initial");
    step("the state arrives", &browser, r);

    let r = browser.click("#tab-history");
    step("history tab", &browser, r);
    let r = browser.wait_for("the names to choose from", &format!("{} === 5", count("#history-names option")));
    step("names", &browser, r);
    let r = browser.eval("[...document.querySelectorAll('#history-names option')].map((o) => o.value).join(' ')");
    assert_eq!(
        step("the names", &browser, r),
        serde_json::json!("bu-0.detail.throttled evm.events evm.events_per_s hv/state.voltage system.events_per_s")
    );
    // It opens on the system's event rate, plotted at once (no empty 0 … 1 plot, no value to
    // choose first), over the last hour, of which the run had only the last 3 minutes: the
    // time axis starts at its first sample, not an hour ago.
    let r = browser.wait_for(
        "the event rate plotted",
        &format!(
            "document.querySelector('#history-canvas').dataset.name === 'system.events_per_s' \
             && Number(document.querySelector('#history-canvas').dataset.points) >= {}",
            RUN_SAMPLES - 2
        ),
    );
    step("the default value", &browser, r);
    let r = browser.text("#history-range option:checked");
    assert_eq!(step("the range", &browser, r).as_deref(), Some("last hour"));
    let r = browser.eval(
        "(() => { const d = document.querySelector('#history-canvas').dataset; \
          return (Number(d.to) - Number(d.from)) / 1000; })()",
    );
    let span = step("the time axis", &browser, r).as_f64().unwrap();
    // From the run's first sample (3 minutes before the samples were made, and as long ago
    // as they were made) to now: not the hour.
    let run = (RUN_SAMPLES * INTERVAL_MS) as f64 / 1000.0 + created.elapsed().as_secs_f64();
    assert!(span >= run - 15.0 && span <= run * 1.05 + 5.0, "the axis spans {span} s for a run of {run} s");
    // Every time label whole (HH:MM:SS), none cut at the canvas's right edge.
    let r = browser.eval("document.querySelector('#history-canvas').dataset.xTicks");
    let ticks = step("the time labels", &browser, r);
    let ticks: Vec<&str> = ticks.as_str().unwrap().split(' ').collect();
    assert!(ticks.len() >= 2, "{ticks:?}");
    for t in &ticks {
        assert!(t.len() == 8 && t.as_bytes()[2] == b':' && t.as_bytes()[5] == b':', "{t:?} in {ticks:?}");
    }
    let r = browser.eval(
        "(() => { const c = document.querySelector('#history-canvas'); \
          return [Number(c.dataset.labelsRight), c.clientWidth]; })()",
    );
    let edges = step("the labels' right edge", &browser, r);
    assert!(edges[0].as_f64() <= edges[1].as_f64(), "the last time label is cut: {edges}");

    // The last hour (the default): every sample, a line across the plot.
    let r = browser.fill("#history-name", "evm.events");
    step("choose a value", &browser, r);
    let r = browser.click("#history-plot");
    step("plot it", &browser, r);
    // The hour's samples were stored when the backend was made: those older than an hour by
    // now (one every 5 s; a slow machine, and 30 s more of waiting) have left the range.
    let left = created.elapsed().as_secs() / (INTERVAL_MS / 1000) + 6;
    let r = browser.wait_for(
        "the hour's samples",
        &format!("Number(document.querySelector('#history-canvas').dataset.points) >= {}", SAMPLES - 2 - left),
    );
    step("samples plotted", &browser, r);
    let r = browser.wait_for("the line drawn", &format!("{LINE_PIXELS} > 300"));
    step("line", &browser, r);
    let r = browser.text("#history-info");
    let info = step("the info", &browser, r).unwrap_or_default();
    assert!(info.ends_with(" samples") && !info.contains("buckets"), "{info}");

    // The last 10 minutes: 120 samples.
    let r = browser.eval(
        "(() => { const s = document.querySelector('#history-range'); s.value = '600000'; \
         s.dispatchEvent(new Event('change')); return s.value; })()",
    );
    step("choose the last 10 minutes", &browser, r);
    let r = browser.wait_for(
        "ten minutes of samples",
        "(() => { const n = Number(document.querySelector('#history-canvas').dataset.points); return n >= 118 && n <= 121; })()",
    );
    step("ten minutes", &browser, r);

    // A custom range of the whole hour, down-sampled to the plot's width at most.
    let r = browser.eval(
        "(() => { const s = document.querySelector('#history-range'); s.value = 'custom'; \
         s.dispatchEvent(new Event('change')); return document.querySelector('#history-custom').hidden; })()",
    );
    assert_eq!(step("custom range", &browser, r), serde_json::json!(false), "the custom range's fields show");
    let r = browser.wait_for("the custom range's plot", &format!("{LINE_PIXELS} > 300"));
    step("custom range plotted", &browser, r);
    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}

#[test]
fn the_alarm_banner_shows_raised_alarms_and_the_controller_acknowledges_them() {
    use daqflow_api::alarms::{AlarmSeverity, AlarmState, AlarmView, AlarmsStatus};
    let Some(binary) =
        cdp::chromium_or_skip("the_alarm_banner_shows_raised_alarms_and_the_controller_acknowledges_them")
    else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(20));
    let view = |name: &str, severity, state| AlarmView {
        name: name.into(),
        severity,
        condition: "any in Error".into(),
        message: format!("{name} went wrong"),
        state,
        since_ms: Some(1_700_000_000_000),
        acknowledged_by: None,
        value: None,
        unit: None,
    };
    // The rate alarm compared a rate, the disk alarm the free bytes of a disk.
    let slow =
        AlarmView { value: Some(499.08728815659686), ..view("slow", AlarmSeverity::Warning, AlarmState::Raised) };
    let disk = AlarmView {
        value: Some(82_702_245_888.0),
        unit: Some("bytes".into()),
        ..view("disk", AlarmSeverity::Warning, AlarmState::Ok)
    };
    *backend.alarms.lock().unwrap() = AlarmsStatus {
        system: "fake".into(),
        alarms: vec![view("hot", AlarmSeverity::Error, AlarmState::Raised), slow, disk],
        events: Vec::new(),
    };
    let options = WebOptions { status_interval: Duration::from_millis(300), ..WebOptions::default() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);

    // The banner: the two raised alarms, by severity, not the Ok one; the tab counts them.
    let r = browser.wait_for("the banner", &format!("{} === 2", count("#alarm-banner .alarm")));
    step("banner", &browser, r);
    // No event yet: the events table says so rather than staying empty.
    let r = browser.eval("document.querySelector('#alarm-events').textContent");
    let none = step("no events", &browser, r);
    assert!(none.as_str().unwrap().starts_with("No alarm has been raised yet"), "{none}");
    let r = browser.eval(
        "[...document.querySelectorAll('#alarm-banner .alarm')].map(a => a.dataset.name + ':' + a.dataset.severity + ':' + a.dataset.state).join(' ')",
    );
    assert_eq!(step("banner entries", &browser, r), "hot:error:raised slow:warning:raised");
    let r = browser
        .eval("getComputedStyle(document.querySelector('#alarm-banner .alarm[data-name=\"hot\"]')).backgroundColor");
    assert_eq!(step("red", &browser, r), "rgb(192, 57, 43)", "a raised error is red");
    let r = browser.text("#alarm-count");
    assert_eq!(step("count", &browser, r), Some("2".to_owned()));
    // A watcher cannot acknowledge: the button is disabled until the page controls.
    let hot = "#alarm-banner .alarm[data-name=\"hot\"] .alarm-ack";
    let r = browser.is_disabled(hot);
    assert_eq!(step("disabled", &browser, r), Some(true));
    let r = browser.click("#btn-take");
    step("take control", &browser, r);
    let r = browser.wait_for("enabled", &format!("!document.querySelector('{hot}').disabled"));
    step("enabled", &browser, r);
    let r = browser.click(hot);
    step("acknowledge", &browser, r);
    let r = browser.wait_for(
        "acknowledged",
        "document.querySelector('#alarm-banner .alarm[data-name=\"hot\"]').dataset.state === 'acknowledged'",
    );
    step("acknowledged", &browser, r);
    let r = browser.text("#alarm-count");
    assert_eq!(step("count", &browser, r), Some("1".to_owned()));
    let who = backend.alarms.lock().unwrap().alarms[0].acknowledged_by.clone().unwrap();
    assert!(who.starts_with("client ") && who.ends_with("(127.0.0.1)"), "{who}");

    // The Alarms view: every alarm with its value as people read it, and the acknowledgement
    // in the events.
    let r = browser.click("#tab-alarms");
    step("the Alarms view", &browser, r);
    let r = browser.wait_for(
        "the table",
        &format!("{} === 3 && {} === 1", count("#alarms tr"), count("#alarm-events tr[data-kind]")),
    );
    step("tables", &browser, r);
    let r =
        browser.eval("[...document.querySelectorAll('#alarms tr')].map((r) => r.children[6].textContent).join(' | ')");
    assert_eq!(step("the values", &browser, r), "– | 499.1 | 82.7 GB free");
    let r = browser.eval("document.querySelector('#alarm-events tr').textContent");
    let row = step("event row", &browser, r);
    assert!(row.as_str().unwrap().contains("hotacknowledged"), "{row}");
    assert!(browser.page_errors.is_empty(), "{:?}", browser.page_errors);
    drop(browser);
    web.shutdown().unwrap();
}

/// Disk throttling: a component whose statistics say `detail.throttled` gets a
/// "throttled (disk)" badge in the components' table, with the free space in its title; the
/// badge goes when the component resumes, and no other component has one.
/// The fake operator's UI in Chromium, watched (no login), once its two components show.
fn watch_the_fake(binary: &std::path::Path) -> (std::sync::Arc<FakeBackend>, daqflow_web::WebHandle, Browser) {
    let backend = FakeBackend::new(Duration::from_millis(10));
    let options = WebOptions { status_interval: Duration::from_millis(200), ..WebOptions::default() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn the web server");
    let mut browser = Browser::launch(binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let r = browser.navigate(&web.url());
    step("load the UI", &browser, r);
    let r = browser.wait_for("two components", &format!("{} === 2", count("#components tr")));
    step("the components", &browser, r);
    (backend, web, browser)
}

#[test]
fn a_component_throttled_by_its_disk_shows_a_badge() {
    let Some(binary) = cdp::chromium_or_skip("a_component_throttled_by_its_disk_shows_a_badge") else {
        return;
    };
    let (backend, _web, mut browser) = watch_the_fake(&binary);
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

/// Slow values from elsewhere (an EPICS PV): the table appears with the first, shows each
/// value with its unit and severity, and a disconnected one without a number.
#[test]
fn slow_values_show_their_unit_severity_and_a_disconnected_one_shows_none() {
    let Some(binary) = cdp::chromium_or_skip("slow_values_show_their_unit_severity_and_a_disconnected_one_shows_none")
    else {
        return;
    };
    let (backend, _web, mut browser) = watch_the_fake(&binary);
    let r = browser.eval("document.getElementById('slow-box').hidden");
    assert_eq!(step("hidden", &browser, r), serde_json::json!(true), "no slow values, no table");

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let pv = |value: Option<f64>, severity: u8, status: &str| daqflow_api::SlowValue {
        value,
        unit: Some("V".into()),
        severity: Some(severity),
        status: Some(status.into()),
        at_ms: Some(now - 3000),
    };
    backend.slow.lock().unwrap().insert("HV:CH1:VMON".into(), pv(Some(1512.5), 1, "HIGH"));
    backend.slow.lock().unwrap().insert("HV:CH2:VMON".into(), pv(None, 3, "disconnected"));
    let r = browser.wait_for("the slow values", &format!("{} === 2", count("#slow-values tr")));
    step("the rows", &browser, r);
    let cells = |name: &str| {
        format!(
            "Array.from(document.querySelector('#slow-values tr[data-slow=\"source-1.{name}\"]').cells).map(c => c.textContent)"
        )
    };
    let texts = |v: serde_json::Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|c| c.as_str().unwrap_or_default().to_owned()).collect()
    };
    let r = browser.eval(&cells("HV:CH1:VMON"));
    let row = texts(step("the first row", &browser, r));
    assert_eq!(row[..5], ["source-1", "HV:CH1:VMON", "1512.5 V", "MINOR", "HIGH"], "{row:?}");
    assert!(row[5].contains("s ago"), "{row:?}");
    let r = browser.eval(&cells("HV:CH2:VMON"));
    let row = texts(step("the disconnected row", &browser, r));
    assert_eq!(row[2..5], ["–", "INVALID", "disconnected"], "{row:?}");
    let r = browser.eval("document.getElementById('slow-box').hidden");
    assert_eq!(step("shown", &browser, r), serde_json::json!(false));
    assert!(browser.page_errors.is_empty(), "page errors: {:?}", browser.page_errors);
}

/// A wrong or stale token in the login URL (an earlier start's: the operator makes a new token
/// at every start): the page, not a JSON error, with the login form and the reason, and the
/// token out of the address bar; the right token then logs in.
#[test]
fn a_stale_token_url_shows_the_login_form_with_the_reason() {
    let Some(binary) = cdp::chromium_or_skip("a_stale_token_url_shows_the_login_form_with_the_reason") else {
        return;
    };
    let backend = FakeBackend::new(Duration::from_millis(10));
    let options = WebOptions {
        status_interval: Duration::from_millis(200),
        access_token: Some(TOKEN.into()),
        ..WebOptions::default()
    };
    let web = daqflow_web::spawn("127.0.0.1:0", backend, options).expect("spawn the web server");
    let mut browser = Browser::launch(&binary).unwrap_or_else(|e| panic!("launching {}: {e}", binary.display()));
    let stale = "0123456789abcdef0123456789abcdef";
    let r = browser.navigate(&format!("{}?token={stale}#runs", web.url()));
    step("load the stale URL", &browser, r);
    let r = browser.wait_for(
        "the login form with the reason",
        "!document.querySelector('#login-form').hidden \
         && document.querySelector('#login-result').textContent.startsWith('The token in the address was refused')",
    );
    step("the reason", &browser, r);
    let r = browser.text("#login-result");
    let reason = step("the reason's text", &browser, r).unwrap_or_default();
    assert!(reason.contains("new one at every start") && reason.contains("web-token"), "{reason}");
    let r = browser.eval("location.search + location.hash");
    assert_eq!(step("the address", &browser, r), "#runs", "the token stays in the address bar");
    // The page works (it watches): the state arrives, the view asked for shows.
    let r = browser.wait_text("#system-state", "Initial");
    step("watching", &browser, r);
    let r = browser.fill("#login-token", TOKEN);
    step("type the token", &browser, r);
    let r = browser.click("#login-submit");
    step("log in", &browser, r);
    let r = browser.wait_for("logged in", "window.daqflow.control().may_control === true");
    step("logged in", &browser, r);
    assert!(browser.page_errors.is_empty(), "page errors: {:?}", browser.page_errors);
}
