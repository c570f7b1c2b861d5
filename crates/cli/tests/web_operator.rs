//! The web UI and its HTTP API served by a real operator (`daqflow run`) over a real system:
//! the web token it prints and writes, what a client without it may do (watch) and may not
//! (take control, stop the run), control ownership, transitions, bad commands and services, the
//! DIALOG view, metrics, the run history and the message log; then headless Chromium opens the
//! printed URL, takes control, starts and stops a run, and sees the state change.

#[path = "../../web/tests/support/cdp.rs"]
mod cdp;
#[path = "../../web/tests/support/client.rs"]
mod client;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use client::{Client, SESSION_COOKIE, get, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// The operator's process, killed if the test ends early (it would keep its components and the
/// test's output pipe alive).
struct Operator(std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_operator_serves_the_api_and_the_ui_drives_a_run_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let config = Command::new(BIN).args(["demo", "--print-config"]).output().unwrap();
    let system = dir.path().join("system.toml");
    std::fs::write(&system, &config.stdout).unwrap();
    // The login URL: http://127.0.0.1:PORT/?token=TOKEN.
    let (mut op, url) = run_with_web(&system, &dir.path().join("data"), "127.0.0.1:0");
    let (base, token) = url.split_once("?token=").unwrap_or_else(|| panic!("no token in {url}"));
    let token = token.to_owned();
    assert!(token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    let addr: SocketAddr = base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();

    // The token is also in <data>/web-token, for scripts, readable by the owner only.
    let token_file = dir.path().join("data").join("web-token");
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
    }

    // Watching is open to all; acting needs the token, then control.
    let stranger = Client::new(addr);
    let st = stranger.get("/api/status").json();
    assert_eq!(st["state"], "Initial", "{st}");
    assert_eq!(st["components"].as_array().unwrap().len(), 14);
    assert_eq!(stranger.post("/api/control/take", "{}").status, 403);
    assert_eq!(stranger.post("/api/transition/configure", "{}").status, 403);
    let wrong = Client::new(addr).post("/api/login", r#"{"token": "0123456789abcdef0123456789abcdef"}"#);
    assert_eq!(wrong.status, 403);
    let tester = Client::login(addr, &token);
    let other = Client::login(addr, &token);
    assert_eq!(tester.post("/api/transition/configure", "{}").status, 403);
    assert_eq!(tester.post("/api/control/take", "{}").status, 200);
    assert_eq!(other.post("/api/control/take", "{}").status, 409);
    assert_eq!(stranger.post("/api/control/take", r#"{"force": true}"#).status, 403);
    let r = tester.post("/api/transition/start", "{}");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.error().contains("cannot start the system in state Initial"), "{}", r.text());
    let r = tester.post("/api/transition/configure", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(addr, "/api/status").json()["state"], "Configured");
    let control = stranger.get("/api/control");
    for secret in [tester.session.as_deref().unwrap(), token.as_str()] {
        assert!(!control.text().contains(secret), "GET /api/control discloses a credential: {}", control.text());
    }

    // Commands and services the control plane does not know are the client's error, not the server's.
    let r = tester.post("/api/command", r#"{"name": "no such command!"}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("not a valid name"), "{}", r.text());
    let r = tester.post("/api/command", r#"{"name": "nobody/nothing"}"#);
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.error().contains("no process registered"), "{}", r.text());
    let r = tester.post("/api/command", "{\"name\": ");
    assert_eq!(r.status, 400, "{}", r.text());
    // Listening needs the login; a bare request is refused.
    assert_eq!(get(addr, "/api/listen?service=nobody/nothing").status, 403);
    let r = tester.get("/api/listen?service=nobody/nothing");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.error().contains("no service `nobody/nothing`"), "{}", r.text());
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
    assert_eq!(tester.post("/api/control/release", "{}").status, 200);

    // The browser opens the printed URL (which logs it in), takes control, starts and stops a run.
    if let Some(chromium) = cdp::chromium_or_skip("the_operator_serves_the_api_and_the_ui_drives_a_run_in_chromium") {
        let mut b = cdp::Browser::launch(&chromium).unwrap_or_else(|e| panic!("launching chromium: {e}"));
        let fail = |what: &str, e: String, b: &cdp::Browser| -> ! {
            panic!("{what}: {e}\npage errors: {:?}\n{}", b.page_errors, b.stderr_tail())
        };
        b.navigate(&url).unwrap_or_else(|e| fail("load", e, &b));
        let page = b.eval("location.href").unwrap_or_else(|e| fail("location", e, &b));
        let page = page.as_str().unwrap_or_default();
        assert!(page.starts_with(base) && !page.contains(&token), "the token stays in the address bar: {page}");
        b.wait_text("#system-state", "Configured").unwrap_or_else(|e| fail("state", e, &b));
        let cookies = b.cookies(base).unwrap_or_else(|e| fail("cookies", e, &b));
        let session = cookies
            .iter()
            .find(|c| c["name"] == SESSION_COOKIE)
            .and_then(|c| c["value"].as_str())
            .unwrap_or_else(|| panic!("no session cookie: {cookies:?}"))
            .to_owned();
        b.click("#btn-take").unwrap_or_else(|e| fail("take control", e, &b));
        b.wait_for("control", "document.querySelector('#controller').textContent.startsWith('You control')")
            .unwrap_or_else(|e| fail("control", e, &b));
        b.click("#btn-start").unwrap_or_else(|e| fail("start", e, &b));
        b.wait_text("#system-state", "Running").unwrap_or_else(|e| fail("Running", e, &b));
        // A client without the token watches the run but can neither take it over nor stop it,
        // and never sees the browser's session.
        assert_eq!(stranger.get("/api/status").json()["state"], "Running");
        assert_eq!(stranger.post("/api/control/take", r#"{"force": true}"#).status, 403);
        assert_eq!(stranger.post("/api/transition/stop", "{}").status, 403);
        let control = stranger.get("/api/control");
        assert_eq!(control.json()["controlled"], true);
        assert!(!control.text().contains(&session), "GET /api/control shows the session: {}", control.text());
        assert!(!stranger.get("/api/status").text().contains(&session));
        b.wait_for("events", "Number(document.querySelector('#stat-events').textContent.replace(/,/g, '')) > 1000")
            .unwrap_or_else(|e| fail("events", e, &b));
        numbers_during_the_run(&mut b, addr);
        b.click("#btn-stop").unwrap_or_else(|e| fail("stop", e, &b));
        b.wait_text("#system-state", "Configured").unwrap_or_else(|e| fail("Configured", e, &b));
        views_after_the_run(&mut b, base);
        assert!(b.page_errors.is_empty(), "{:?}", b.page_errors);
    } else {
        // No browser (and not CI): take the run through the API instead.
        assert_eq!(tester.post("/api/control/take", "{}").status, 200);
        assert_eq!(tester.post("/api/transition/start", "{}").status, 200);
        assert_eq!(stranger.post("/api/transition/stop", "{}").status, 403);
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(tester.post("/api/transition/stop", "{}").status, 200);
    }

    // The run is in the history, with nothing lost; the monitor filled its histograms; the
    // message log has the operator's records; ET shows the stations.
    let runs = wait_until("the run record", || {
        let r = get(addr, "/api/runs").json();
        (r.as_array().is_some_and(|a| a.first().is_some_and(|x| x["state"] == "stopped"))).then_some(r)
    });
    assert_eq!(runs[0]["lost"], 0, "{runs}");
    let run = get(addr, "/api/runs/1").json();
    assert!(run["summary"]["files"].as_array().is_some_and(|f| !f.is_empty()), "{run}");
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

    op.0.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());
}

/// Waits for `expression` in the page, or fails saying what the page reported.
fn check(b: &mut cdp::Browser, what: &str, expression: &str) -> serde_json::Value {
    b.wait_for(what, expression)
        .unwrap_or_else(|e| panic!("{what}: {e}\npage errors: {:?}\n{}", b.page_errors, b.stderr_tail()))
}

/// Evaluates `expression` in the page.
fn eval(b: &mut cdp::Browser, expression: &str) -> serde_json::Value {
    b.eval(expression).unwrap_or_else(|e| panic!("{expression}: {e}\npage errors: {:?}", b.page_errors))
}

/// The transition buttons enabled, in order.
const ENABLED: &str = "['configure', 'start', 'pause', 'resume', 'stop', 'reset']\
     .filter((n) => !document.querySelector('#btn-' + n).disabled).join(' ')";

/// Two counts as the page shows them at one moment (one evaluation), as numbers.
fn shown_pair(b: &mut cdp::Browser, first: &str, second: &str) -> (f64, f64) {
    let texts = eval(
        b,
        &format!("[document.querySelector('{first}').textContent, document.querySelector('{second}').textContent]"),
    );
    let number = |selector: &str, t: &serde_json::Value| -> f64 {
        let text = t.as_str().unwrap_or_default();
        assert!(text.split(',').skip(1).all(|g| g.len() == 3), "{selector}: {text:?} is not thousands-separated");
        text.replace(',', "").parse().unwrap_or_else(|_| panic!("{selector}: {text:?} is not a number"))
    };
    (number(first, &texts[0]), number(second, &texts[1]))
}

/// What the run view shows of a real run as it goes (issue 26, "the web UI shows true
/// numbers"): never more recorded than built, whenever it is read; lost so far a number; the
/// system's rate the builders'; no reset while Running; one number format.
fn numbers_during_the_run(b: &mut cdp::Browser, addr: SocketAddr) {
    for _ in 0..20 {
        // Both read at one moment (one evaluation): two would straddle a status update.
        let (events, recorded) = shown_pair(b, "#stat-events", "#stat-recorded");
        assert!(recorded <= events, "recorded {recorded} above events {events}");
        let st = get(addr, "/api/status").json();
        let (events, recorded) = (st["events"].as_u64().unwrap(), st["recorded"].as_u64().unwrap());
        assert!(recorded <= events, "the status: recorded {recorded} above events {events}");
        // The system's rate is the builders' (what the components' table shows), summed.
        let builders: f64 =
            ["bu-0", "bu-1"].iter().map(|n| component(&st, n)["stats"]["events_per_s"].as_f64().unwrap()).sum();
        let system = st["events_per_s"].as_f64().unwrap();
        assert!((system - builders).abs() <= 1e-6 * builders.max(1.0), "{system} is not {builders}: {st}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(eval(b, ENABLED), "pause stop", "only pause and stop while Running");
    check(
        b,
        "lost so far",
        "document.querySelector('#stat-lost').textContent === '0' \
           && document.querySelector('#stat-lost-note').textContent === 'so far (trigger)'",
    );
    // Every count of the components' table thousands-separated (no "1000" beside "1,000").
    let counts = eval(
        b,
        "[...document.querySelectorAll('#components tr')].flatMap((r) => [6, 7, 8].map((i) => r.children[i].textContent))",
    );
    for t in counts.as_array().unwrap().iter().filter_map(|t| t.as_str()) {
        let whole = t.split('.').next().unwrap();
        assert!(whole.split(',').skip(1).all(|g| g.len() == 3) && whole.split(',').next().unwrap().len() <= 3, "{t:?}");
    }
}

/// After the run: the builders and readout units at rest, the histograms' axes and means, the
/// history opened on the event rate, the alarms' values in units, the messages' binary path,
/// and a stale token URL answered with the login form.
fn views_after_the_run(b: &mut cdp::Browser, base: &str) {
    assert_eq!(eval(b, ENABLED), "start reset");
    check(
        b,
        "the builders and readout units at rest",
        "['bu-0', 'bu-1', 'ru-0', 'ru-1', 'evm'].every((n) => { \
           const r = [...document.querySelectorAll('#components tr')].find((r) => r.children[0].textContent === n); \
           return r && r.children[7].textContent === '0' && r.children[8].textContent === '0'; })",
    );
    check(b, "lost of the run", "document.querySelector('#stat-lost-note').textContent === 'in run 1'");

    // Histograms: the event sizes (3 to 7 kB, in a histogram up to 16 kB) on an axis that
    // ends near them; means of the values themselves; a rate that cannot be negative.
    b.click("#tab-histograms").unwrap();
    let card = |name: &str| format!("document.querySelector('#histograms .histogram[data-name=\"monitor/{name}\"]')");
    check(
        b,
        "the histograms",
        &format!(
            "{} !== null && {}.querySelector('canvas').dataset.xTicks !== undefined",
            card("event_size"),
            card("event_size")
        ),
    );
    let ticks = eval(b, &format!("{}.querySelector('canvas').dataset.xTicks", card("event_size")));
    let last: f64 = ticks.as_str().unwrap().rsplit(' ').next().unwrap().replace(',', "").parse().unwrap_or(f64::MAX);
    assert!(last <= 10_000.0, "the event-size axis goes to {ticks}: far beyond the events");
    let facts = eval(b, &format!("{}.querySelector('.facts').textContent", card("event_size")));
    let facts = facts.as_str().unwrap();
    let mean: f64 =
        facts.split("mean ").nth(1).and_then(|m| m.split(' ').next()).unwrap().replace(',', "").parse().unwrap();
    assert!((3000.0..6000.0).contains(&mean) && facts.contains(" bytes (lowest "), "{facts}");
    let rate = eval(b, &format!("{}.querySelector('.facts').textContent", card("rate")));
    let rate = rate.as_str().unwrap();
    assert!(rate.contains(" events/s") && !rate.contains("mean -"), "{rate}");
    // The detector monitor's (a monitor of a user's own, from the sources' `adc` payloads): a
    // channel × time map over the 32 channels, the first channels' spectra, the hit counter.
    let det = |name: &str| format!("document.querySelector('#histograms .histogram[data-name=\"detector/{name}\"]')");
    check(
        b,
        "the detector's histograms",
        &format!(
            "{map} !== null && Number({map}.querySelector('canvas').dataset.max) > 0 && {spectrum} !== null \
             && {spectrum}.querySelector('canvas').dataset.xTicks !== undefined",
            map = det("time_vs_channel"),
            spectrum = det("adc_ch0")
        ),
    );
    assert_eq!(eval(b, &format!("{}.querySelector('canvas').dataset.xTicks", det("time_vs_channel"))), "0 10 20 30");
    let hits = eval(b, &format!("{}.querySelector('.counter-value').textContent", det("hits")));
    let hits: u64 = hits.as_str().unwrap().replace(',', "").parse().unwrap();
    assert!(hits > 1000, "{hits} hits");

    // History: the event rate, at once, over the run (not an empty plot of an hour).
    b.click("#tab-history").unwrap();
    check(
        b,
        "the event rate's history",
        "document.querySelector('#history-name').value === 'system.events_per_s' \
         && Number(document.querySelector('#history-canvas').dataset.points) >= 2",
    );
    let span = eval(
        b,
        "(() => { const d = document.querySelector('#history-canvas').dataset; return (Number(d.to) - Number(d.from)) / 1000; })()",
    );
    assert!(span.as_f64().unwrap() < 600.0, "the last hour's axis for a run of seconds: {span} s");

    // Alarms: the disk's free space in GB, not bytes.
    b.click("#tab-alarms").unwrap();
    check(
        b,
        "the disk alarm's value",
        "(() => { const r = document.querySelector('#alarms tr[data-name=\"disk\"]'); \
           return !!r && / (GB|TB) free$/.test(r.children[6].textContent); })()",
    );

    // Messages: the components' command lines name the binary, not /proc/self/exe.
    b.click("#tab-messages").unwrap();
    b.fill("#log-text", "started ").unwrap();
    check(
        b,
        "the components' start messages",
        "[...document.querySelectorAll('#logs tr')].some((r) => r.textContent.includes(' component bu '))",
    );
    let messages = eval(b, "document.querySelector('#logs').textContent");
    assert!(!messages.as_str().unwrap().contains("/proc/self/exe"), "{messages}");
    let binary = std::fs::canonicalize(BIN).unwrap();
    assert!(messages.as_str().unwrap().contains(&binary.display().to_string()), "{binary:?} is not in {messages}");

    // A stale login URL (an earlier start's token): the page, with the reason, not JSON.
    b.navigate(&format!("{base}?token=0123456789abcdef0123456789abcdef")).unwrap();
    check(
        b,
        "the reason",
        "document.querySelector('#error-banner').textContent.startsWith('The token in the address was refused') \
           || document.querySelector('#login-result').textContent.startsWith('The token in the address was refused')",
    );
}

/// `daqflow run SYSTEM --web WEB --data DATA`, and the login URL it prints first (its console
/// is read to the end, so that it never blocks).
fn run_with_web(system: &std::path::Path, data: &std::path::Path, web: &str) -> (Operator, String) {
    let mut op = Operator(
        Command::new(BIN)
            .args(["run", "--web", web, "--data"])
            .arg(data)
            .arg(system)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(op.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first.split("web UI: ").nth(1).unwrap_or_else(|| panic!("no web address in {first:?}")).trim().to_owned();
    (op, url)
}

#[test]
fn a_web_token_file_is_refused_unless_private_and_then_its_token_logs_in() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let token = "teststand-0123456789abcdef";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let system = dir.path().join("system.toml");
    std::fs::write(
        &system,
        format!(
            "[system]\nname = 't'\ncontrol = '127.0.0.1:0'\nweb_token_file = '{}'\n\n[[component]]\nname = 'a'\nkind = 'sink'\n",
            token_file.display()
        ),
    )
    .unwrap();

    let check = Command::new(BIN).args(["run", "--check"]).arg(&system).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(!check.status.success(), "a world-readable token file was accepted: {said}");
    assert!(said.contains("web_token_file") && said.contains("chmod 600"), "{said}");

    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (mut op, url) = run_with_web(&system, &dir.path().join("data"), "127.0.0.1:0");
    let url = url.as_str();
    assert!(url.ends_with(&format!("/?token={token}")), "{url}");
    let addr: SocketAddr = url.trim_start_matches("http://").split('/').next().unwrap().parse().unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("data").join("web-token")).unwrap().trim(), token);
    let crew = Client::login(addr, token);
    assert_eq!(crew.post("/api/control/take", "{}").status, 200);
    assert_eq!(Client::new(addr).post("/api/control/take", r#"{"force": true}"#).status, 403);

    op.0.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());
}

#[test]
fn bound_off_loopback_the_web_ui_needs_the_token_even_to_watch() {
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("system.toml");
    std::fs::write(
        &system,
        "[system]\nname = 't'\ncontrol = '127.0.0.1:0'\n\n[[component]]\nname = 'a'\nkind = 'sink'\n",
    )
    .unwrap();
    let (mut op, url) = run_with_web(&system, &dir.path().join("data"), "0.0.0.0:0");
    let url = url.as_str();
    let (base, token) = url.split_once("/?token=").unwrap_or_else(|| panic!("no token in {url}"));
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stranger = Client::new(addr);
    for path in ["/api/status", "/api/runs", "/api/logs", "/metrics"] {
        assert_eq!(stranger.get(path).status, 403, "{path} is open to strangers off loopback");
    }
    let crew = Client::login(addr, token);
    assert_eq!(crew.get("/api/status").json()["components"].as_array().unwrap().len(), 1);
    op.0.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let status = wait_until("the operator to exit", || op.0.try_wait().unwrap());
    assert!(status.success());
}

/// A component's entry in a status.
fn component<'a>(st: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    st["components"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn the_demo_stays_up_after_a_web_stop_and_follows_the_runs_the_web_starts_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Operator(
        Command::new(BIN)
            .args(["demo", "--web", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = demo.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let url = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the demo prints its web UI's URL");
        if let Some(u) = line.strip_prefix("web UI: ") {
            break u.to_owned();
        }
    };
    let (base, token) = url.split_once("?token=").unwrap_or_else(|| panic!("no token in {url}"));
    let addr: SocketAddr = base.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    let tester = Client::login(addr, token);
    assert_eq!(tester.post("/api/control/take", "{}").status, 200);
    let status = || get(addr, "/api/status").json();

    // Run 1, started by the demo, builds: every builder unit and the event manager report a
    // live rate (the components' table shows `stats.events_per_s`); nothing lost so far.
    let st = wait_until("run 1 building on both builder units with live rates", || {
        let st = status();
        let rate = |n: &str| component(&st, n)["stats"]["events_per_s"].as_f64().unwrap_or(0.0);
        (st["run"] == 1 && st["running"] == true && ["evm", "bu-0", "bu-1"].iter().all(|n| rate(n) > 0.0)).then_some(st)
    });
    assert_eq!(st["lost"], 0, "lost so far, by the trigger's accounting: {st}");

    // Stopped from the web, and a new run started at once: the demo follows it and does not stop it.
    let r = tester.post("/api/transition/stop", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["stopped"]["lost"], 0, "{}", r.text());
    let r = tester.post("/api/transition/start", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["result"]["started"], 2, "{}", r.text());
    wait_until("run 2 building", || {
        let st = status();
        (st["run"] == 2 && st["running"] == true && st["events"].as_u64().unwrap_or(0) > 2000).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(demo.0.try_wait().unwrap().is_none(), "the demo ended after a run stopped from the web UI");
    let st = status();
    assert_eq!((&st["run"], &st["running"]), (&serde_json::json!(2), &serde_json::json!(true)), "{st}");
    // Its `lost` is run 2's so far.
    assert_eq!(st["lost"], 0, "{st}");

    // Stopped from the web again: the demo still waits (for a run, or Ctrl-C).
    let r = tester.post("/api/transition/stop", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    let st = status();
    assert_eq!((&st["running"], &st["lost"]), (&serde_json::json!(false), &serde_json::json!(0)), "{st}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(demo.0.try_wait().unwrap().is_none(), "the demo ended after its second run was stopped from the web UI");

    // Ctrl-C ends it, cleanly: each run summarised once, nothing lost.
    // SAFETY: kill(2) on the child this test started; no memory is involved.
    assert_eq!(unsafe { libc::kill(demo.0.id() as i32, libc::SIGINT) }, 0);
    let code = wait_until("the demo to end after Ctrl-C", || demo.0.try_wait().unwrap());
    let out = reader.join().unwrap();
    assert!(code.success(), "{out}");
    for run in [1, 2] {
        assert!(out.contains(&format!("run {run} was stopped from outside the demo")), "{out}");
        assert_eq!(out.matches(&format!("\nrun {run} of system demo:")).count(), 1, "{out}");
    }
    assert!(out.contains("run 2 started from outside the demo"), "{out}");
    assert!(!out.contains("stopping run"), "the demo stopped a run itself: {out}");
    assert_eq!(out.lines().filter(|l| *l == "lost: 0").count(), 2, "{out}");
    // The progress lines (`  4.0 s  Running     run 1    events      5722  (…)  recorded      5722`)
    // never show more recorded than built.
    let mut progress = 0;
    for line in out.lines().filter(|l| l.contains(" events ") && l.contains(" recorded ")) {
        let number = |after: &str| -> u64 {
            let rest = line.split(after).nth(1).unwrap_or_else(|| panic!("{line:?}"));
            rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line:?}"))
        };
        assert!(number(" recorded ") <= number(" events "), "recorded above events: {line:?}");
        progress += 1;
    }
    assert!(progress > 0, "no progress line in {out}");
    assert!(!out.contains("null") && !out.contains(&u64::MAX.to_string()), "{out}");
}
