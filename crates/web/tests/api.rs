//! The HTTP API over real TCP, against the fake operator.

mod support;

use std::io::{BufReader, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use daqflow_api::{LogQuery, Severity, SystemState};
use daqflow_web::{WebHandle, WebOptions};
use serde_json::json;
use support::client::{Client, Sse, connect, get, raw, read_reply, send, wait_until};
use support::fake::FakeBackend;

fn options() -> WebOptions {
    WebOptions { status_interval: Duration::from_millis(200), ..WebOptions::default() }
}

fn start(options: WebOptions) -> (WebHandle, Arc<FakeBackend>) {
    let backend = FakeBackend::new(Duration::from_millis(20));
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn");
    (web, backend)
}

#[test]
fn the_ui_and_its_files_are_served() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    for path in ["/", "/index.html"] {
        let r = get(addr, path);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
        assert!(r.header("content-security-policy").is_some_and(|c| c.contains("default-src 'self'")));
        let html = r.text();
        for id in ["system-state", "btn-take", "btn-release", "btn-configure", "btn-start", "btn-stop", "components"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "no #{id} in the page");
        }
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "the page must not load anything from elsewhere"
        );
    }
    let js = get(addr, "/app.js");
    assert_eq!((js.status, js.header("content-type")), (200, Some("text/javascript; charset=utf-8")));
    assert!(js.text().contains("EventSource"));
    let css = get(addr, "/style.css");
    assert_eq!((css.status, css.header("content-type")), (200, Some("text/css; charset=utf-8")));
    let missing = get(addr, "/nothing-here");
    assert_eq!(missing.status, 404);
    assert!(missing.error().contains("/nothing-here"));
    web.shutdown().unwrap();
}

#[test]
fn status_is_the_backends_with_the_web_servers_own_object() {
    let (web, _) = start(options());
    let r = get(web.local_addr(), "/api/status");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let s = r.json();
    assert_eq!(s["system"], "fake");
    assert_eq!(s["state"], "Initial");
    assert_eq!(s["run"], json!(null));
    assert_eq!(s["components"].as_array().map(Vec::len), Some(2));
    let component = &s["components"][0];
    assert_eq!(
        (&component["name"], &component["state"], &component["role"]),
        (&json!("source-1"), &json!("Initial"), &json!("readout"))
    );
    assert_eq!(component["stats"]["events"], 0);
    assert_eq!(component["stats"]["detail"]["queued"], 0);
    assert!(s["web"]["requests_total"].as_u64().is_some_and(|n| n >= 1));
    assert_eq!(s["web"]["transitions"], json!(["configure", "reset"]), "what the state allows");
    assert_eq!((s["web"]["controlled"].as_bool(), &s["web"]["holder"]), (Some(false), &json!(null)));
    web.shutdown().unwrap();
}

#[test]
fn transitions_need_control_and_follow_the_state_machine() {
    let (web, backend) = start(options());
    let addr = web.local_addr();

    let anonymous = Client::new(addr).post("/api/transition/configure", "");
    assert_eq!(anonymous.status, 403);
    assert!(anonymous.error().contains("session"), "{}", anonymous.error());
    let alice = Client::visit(addr);
    let not_taken = alice.post("/api/transition/configure", "");
    assert_eq!(not_taken.status, 403);
    assert!(not_taken.error().contains("nobody"), "{}", not_taken.error());

    let took = alice.post("/api/control/take", r#"{"force":false}"#);
    assert_eq!(took.status, 200, "{}", took.text());
    let alice_label = took.json()["holder"].as_str().unwrap().to_owned();
    assert_eq!(took.json()["me"], alice_label.as_str());
    assert_eq!(took.json()["you"], true);

    let r = alice.post("/api/transition/configure", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"transition": "configure", "result": {"configured": {}}}));
    assert_eq!(backend.state(), SystemState::Configured);

    let bob = Client::visit(addr);
    let refused = bob.post("/api/transition/start", "{}");
    assert_eq!(refused.status, 403);
    assert_eq!(refused.json()["holder"], alice_label.as_str());
    assert!(refused.error().contains(&alice_label), "{}", refused.error());
    assert_eq!(backend.state(), SystemState::Configured);

    let start = alice.post("/api/transition/start", r#"{"run": 42}"#);
    assert_eq!(start.status, 200, "{}", start.text());
    assert_eq!(start.json(), json!({"transition": "start", "result": {"started": 42}}));
    let status = get(addr, "/api/status").json();
    assert_eq!((&status["state"], &status["run"], &status["running"]), (&json!("Running"), &json!(42), &json!(true)));
    assert_eq!(status["web"]["transitions"], json!(["pause", "stop"]));

    // Not allowed in the state: 409, the backend's text.
    let refused = alice.post("/api/transition/configure", "");
    assert_eq!(refused.status, 409);
    assert_eq!(
        refused.json(),
        json!({"transition": "configure", "error": "cannot configure the system in state Running"})
    );

    // An unknown name is a 400 with Transition::parse's text: the verb list is api.rs's.
    let unknown = alice.post("/api/transition/explode", "");
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.error(), "unknown transition `explode` (configure, start, pause, resume, stop, reset)");
    assert_eq!(alice.post("/api/transition/", "").status, 404, "no name, no route");
    let bad_json = alice.post("/api/transition/stop", "{not json");
    assert_eq!(bad_json.status, 400);
    assert!(bad_json.error().contains("no argument"), "{}", bad_json.error());
    let argument = alice.post("/api/transition/stop", r#"{"now": true}"#);
    assert_eq!(argument.status, 400);
    assert!(argument.error().contains("no argument"), "{}", argument.error());
    let wrong_method = get(addr, "/api/transition/stop");
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("allow"), Some("POST"));

    for (name, state) in [
        ("pause", SystemState::Paused),
        ("resume", SystemState::Running),
        ("stop", SystemState::Configured),
        ("reset", SystemState::Initial),
    ] {
        let r = alice.post(&format!("/api/transition/{name}"), if name == "stop" { "{}" } else { "" });
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(backend.state(), state);
        if name == "stop" {
            let summary = &r.json()["result"]["stopped"];
            assert_eq!((&summary["run"], &summary["state"]), (&json!(42), &json!("stopped")), "{summary}");
            assert_eq!(get(addr, "/api/runs").json()[0]["run"], 42, "the run is in the history");
        } else {
            assert_eq!(r.json()["result"], "done");
        }
    }
    // A start the backend refuses for its argument is a 400 (BackendError::Invalid).
    assert_eq!(alice.post("/api/transition/configure", "").status, 200);
    let taken = alice.post("/api/transition/start", r#"{"run": 42}"#);
    assert_eq!((taken.status, taken.error().as_str()), (400, "run 42 was taken already"));
    web.shutdown().unwrap();
}

#[test]
fn control_is_taken_refused_forced_and_released() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    let none = get(addr, "/api/control").json();
    assert_eq!(
        none,
        json!({"controlled": false, "holder": null, "since_ms": null, "you": false, "me": null, "may_control": false})
    );

    let alice = Client::visit(addr);
    let bob = Client::visit(addr);
    assert_eq!(alice.post("/api/control/take", "").status, 200);
    let control = alice.get("/api/control").json();
    assert_eq!(control["controlled"], true);
    assert_eq!(control["holder"], control["me"]);
    assert!(control["since_ms"].as_u64().is_some_and(|t| t > 1_600_000_000_000));
    assert_eq!((control["you"].as_bool(), control["may_control"].as_bool()), (Some(true), Some(true)));
    let alice_label = control["holder"].clone();
    assert_ne!(bob.get("/api/control").json()["me"], alice_label, "labels are per session");

    let refused = bob.post("/api/control/take", r#"{"force": false}"#);
    assert_eq!(refused.status, 409);
    assert_eq!(refused.json()["holder"], alice_label);
    assert!(refused.error().contains("force"), "{}", refused.error());
    let not_yours = bob.post("/api/control/release", "");
    assert_eq!(not_yours.status, 403);

    let forced = bob.post("/api/control/take", r#"{"force": true}"#);
    assert_eq!(forced.status, 200);
    assert_eq!(forced.json()["you"], true);
    assert_eq!(forced.json()["holder"], bob.get("/api/control").json()["me"]);
    assert_eq!(alice.post("/api/transition/configure", "").status, 403);
    assert_eq!(bob.post("/api/transition/configure", "").status, 200);

    let released = bob.post("/api/control/release", "");
    assert_eq!(released.status, 200);
    assert_eq!(released.json()["controlled"], false);
    assert_eq!(released.json()["holder"], json!(null));
    assert_eq!(bob.post("/api/control/release", "").status, 200, "releasing twice is harmless");
    assert_eq!(bob.post("/api/transition/start", "").status, 403);

    // Bad bodies and a missing header are refused.
    assert_eq!(bob.post("/api/control/take", r#"{"force": "yes"}"#).status, 400);
    assert_eq!(bob.post("/api/control/take", "[1]").status, 400);
    let cookie = [("Cookie".to_owned(), format!("daqflow_session={}", bob.session.as_deref().unwrap()))];
    assert_eq!(send(addr, "POST", "/api/control/take", &cookie, Some("{}")).status, 400);
    assert_eq!(get(addr, "/api/control/take").status, 405);
    web.shutdown().unwrap();
}

#[test]
fn control_lapses_when_its_client_is_not_seen_but_not_while_its_stream_is_open() {
    let lapse = Duration::from_secs(2);
    let (web, _) = start(WebOptions { control_lapse: lapse, ..options() });
    let addr = web.local_addr();

    // With an event stream open, the controller stays.
    let alice = Client::visit(addr);
    let mut stream = alice.events("/api/events");
    assert_eq!(alice.post("/api/control/take", "").status, 200);
    stream.wait_for("control", |c| c["you"] == true);
    std::thread::sleep(lapse * 2);
    assert_eq!(get(addr, "/api/control").json()["controlled"], true);

    // Stream closed and no request: control lapses, and watchers are told.
    let mut watcher = Sse::open(addr, "/api/events");
    drop(stream);
    watcher.wait_for("control", |c| c["controlled"] == false);
    assert_eq!(get(addr, "/api/control").json()["holder"], json!(null));
    let bob = Client::visit(addr);
    assert_eq!(bob.post("/api/control/take", "").status, 200);

    // Requests keep it too (one every fifth of the lapse, for longer than the lapse).
    for _ in 0..6 {
        std::thread::sleep(lapse / 5);
        assert_eq!(bob.get("/api/control").json()["you"], true);
    }
    web.shutdown().unwrap();
}

#[test]
fn the_event_stream_delivers_control_status_and_transitions() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    let watcher = Client::visit(addr);
    let mut sse = watcher.events("/api/events");
    assert_eq!(sse.status, 200);
    assert!(sse.headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("content-type") && v == "text/event-stream"));
    let first = sse.next().expect("an event");
    assert_eq!(first.name, "control");
    let me = watcher.get("/api/control").json()["me"].clone();
    assert_eq!(
        first.json(),
        json!({"controlled": false, "holder": null, "since_ms": null, "you": false, "me": me, "may_control": true})
    );
    let status = sse.next_named("status").json();
    assert_eq!(status["state"], "Initial");
    assert_eq!(status["web"]["sse_clients"], 1);

    // Statuses keep coming, once per interval.
    for _ in 0..3 {
        sse.next_named("status");
    }

    let alice = Client::visit(addr);
    assert_eq!(alice.post("/api/control/take", "").status, 200);
    let alice_label = alice.get("/api/control").json()["me"].clone();
    let control = sse.wait_for("control", |_| true);
    assert_eq!(control["holder"], alice_label);
    assert_eq!(control["you"], false, "every stream is told whether it is its client");
    assert!(control["since_ms"].is_u64());

    assert_eq!(alice.post("/api/transition/configure", "").status, 200);
    let t = sse.wait_for("transition", |_| true);
    assert_eq!(t["transition"], "configure");
    assert_eq!(t["client"], alice_label);
    assert_eq!(t["ok"], true);
    sse.wait_for("status", |s| s["state"] == "Configured");

    assert_eq!(alice.post("/api/transition/pause", "").status, 409);
    let t = sse.wait_for("transition", |_| true);
    assert_eq!((t["transition"].as_str(), t["ok"].as_bool()), (Some("pause"), Some(false)));
    assert_eq!(t["error"], "cannot pause the system in state Configured");

    let metrics = get(addr, "/metrics").text();
    assert!(metrics.contains("daqflow_web_sse_clients 1\n"), "{metrics}");
    drop(sse);
    wait_until("the stream to be counted as closed", || {
        get(addr, "/metrics").text().contains("daqflow_web_sse_clients 0\n").then_some(())
    });
    web.shutdown().unwrap();
}

#[test]
fn listening_streams_a_services_values_and_unsubscribes_when_the_client_goes() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let client = Client::visit(addr);
    let mut sse = client.events("/api/listen?service=source-1%2Fstats");
    assert_eq!(sse.status, 200);
    assert_eq!(sse.next_named("subscribed").json(), json!({"service": "source-1/stats"}));
    let first = sse.next_named("value");
    assert_eq!(first.data, "{\"service\": \"source-1/stats\",\n \"n\": 1}", "multi-line values arrive whole");
    let second = sse.next_named("value").json();
    assert_eq!(second["n"], 2);
    assert_eq!(backend.listeners.load(Ordering::SeqCst), 1);
    drop(sse);
    wait_until("the subscription to be dropped", || (backend.listeners.load(Ordering::SeqCst) == 0).then_some(()));

    let unknown = client.get("/api/listen?service=nope");
    assert_eq!(unknown.status, 404);
    assert!(unknown.error().contains("no service `nope`"));
    assert_eq!(client.get("/api/listen").status, 400);
    assert_eq!(client.get("/api/listen?service=").status, 400);
    web.shutdown().unwrap();
}

#[test]
fn the_read_only_views_are_served() {
    let (web, backend) = start(options());
    let addr = web.local_addr();

    let processes = get(addr, "/api/processes").json();
    assert_eq!(processes[0]["name"], "source-1");
    assert_eq!(processes[1]["subscribes"][0], "source-1/state");

    let logs = get(addr, "/api/logs").json();
    assert_eq!(logs.as_array().map(Vec::len), Some(20));
    assert_eq!(
        logs[0].as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()),
        Some(["message", "process", "seq", "severity", "t_ms", "target"].map(String::from).to_vec())
    );
    let q = backend.last_query.lock().unwrap().clone().unwrap();
    assert_eq!(q, LogQuery { limit: Some(200), ..LogQuery::default() });

    let logs =
        get(addr, "/api/logs?process=bu-1&min_severity=WARN&text=message+1&limit=3&since_ms=&until_ms=99999999999999")
            .json();
    let q = backend.last_query.lock().unwrap().clone().unwrap();
    assert_eq!(
        q,
        LogQuery {
            since_ms: None,
            until_ms: Some(99_999_999_999_999),
            process: Some("bu-1".into()),
            min_severity: Some(Severity::Warn),
            text: Some("message 1".into()),
            limit: Some(3),
        }
    );
    for r in logs.as_array().unwrap() {
        assert_eq!(r["process"], "bu-1");
        assert!(r["severity"] == "warn" || r["severity"] == "error", "{r}");
    }
    get(addr, "/api/logs?limit=99999999");
    assert_eq!(backend.last_query.lock().unwrap().as_ref().unwrap().limit, Some(10_000));
    let bad = get(addr, "/api/logs?min_severity=loud");
    assert_eq!(bad.status, 400);
    assert!(bad.error().contains("min_severity"));
    assert_eq!(get(addr, "/api/logs?since_ms=yesterday").status, 400);
    assert_eq!(get(addr, "/api/logs?limit=-1").status, 400);
    let unknown = get(addr, "/api/logs?severity=warn&proces=bu-1");
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.error().starts_with("unknown query parameters `severity`, `proces` (known: "),
        "{}",
        unknown.error()
    );
    let broken = get(addr, "/api/logs?text=unreadable");
    assert_eq!((broken.status, broken.error().as_str()), (500, "the message log is unreadable"));

    let runs = get(addr, "/api/runs").json();
    assert_eq!(
        (&runs[0]["run"], &runs[0]["state"], &runs[0]["events"]),
        (&json!(1), &json!("stopped"), &json!(60_000))
    );
    assert_eq!(get(addr, "/api/runs?limit=0").json(), json!([]));
    assert_eq!(get(addr, "/api/runs?limit=x").status, 400);
    assert_eq!(get(addr, "/api/runs?limt=2").status, 400);
    let run = get(addr, "/api/runs/1");
    assert_eq!(run.status, 200);
    let run = run.json();
    assert_eq!((&run["run"], &run["state"]), (&json!(1), &json!("stopped")), "the record's fields, flattened");
    assert!(run["config"].as_str().is_some_and(|c| c.contains("[system]")), "{run}");
    assert_eq!(run["summary"]["files"][0]["path"], "/data/run000001_0001.dat");
    let missing = get(addr, "/api/runs/7");
    assert_eq!(missing.status, 404);
    assert!(missing.error().contains("no run 7"));
    assert_eq!(get(addr, "/api/runs/seven").status, 400);
    let broken = get(addr, "/api/runs/999");
    assert_eq!(broken.status, 500);
    assert_eq!(broken.error(), "the run database is unreadable");

    let histograms = get(addr, "/api/histograms").json();
    assert_eq!(histograms[0]["bins"].as_array().map(Vec::len), Some(64));
    assert_eq!((histograms[1]["mean"].as_f64(), histograms[1]["unit"].as_str()), (Some(512.0), Some("bytes")));
    let et = get(addr, "/api/et").json();
    assert_eq!(et[0]["snapshot"]["stations"][1]["name"], "recorder");
    let alice = Client::visit(addr);
    for path in ["/api/processes", "/api/logs", "/api/runs", "/api/histograms", "/api/et", "/metrics", "/api/status"] {
        let r = alice.post(path, "{}");
        assert_eq!(r.status, 405, "{path}");
        assert_eq!(r.header("allow"), Some("GET"));
    }
    web.shutdown().unwrap();
}

#[test]
fn commands_need_control_and_reach_the_backend() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let alice = Client::visit(addr);
    let body = r#"{"name": "all/stop", "data": "now"}"#;
    assert_eq!(alice.post("/api/command", body).status, 403);
    assert_eq!(alice.post("/api/control/take", "").status, 200);
    let r = alice.post("/api/command", body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"name": "all/stop", "received": 2}));
    let r = alice.post("/api/command", r#"{"name": "ru-1/set", "data": {"rate": 5}}"#);
    assert_eq!(r.status, 200);
    assert_eq!(
        *backend.commands.lock().unwrap(),
        vec![("all/stop".to_owned(), "now".to_owned()), ("ru-1/set".to_owned(), r#"{"rate":5}"#.to_owned())]
    );
    assert_eq!(alice.post("/api/command", r#"{"data": "x"}"#).status, 400);
    assert_eq!(alice.post("/api/command", r#"{"name": ""}"#).status, 400);
    let nobody = alice.post("/api/command", r#"{"name": "nobody"}"#);
    assert_eq!(nobody.status, 404);
    assert!(nobody.error().contains("no process registered"));
    web.shutdown().unwrap();
}

#[test]
fn parameters_are_set_by_the_controller_and_reach_the_backend() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let alice = Client::visit(addr);
    let body = r#"{"component": "source-1", "key": "rate_hz", "value": 500}"#;
    assert_eq!(alice.post("/api/set", body).status, 403, "the controller only");
    assert_eq!(alice.post("/api/control/take", "").status, 200);
    let r = alice.post("/api/set", body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"overrides": {"source-1.rate_hz": 500}}));
    let r = alice.post("/api/set", r#"{"component": "bu-1", "key": "size.kind", "value": "fixed"}"#);
    assert_eq!(r.json()["overrides"]["bu-1.size.kind"], json!("fixed"));
    // null takes a setting back.
    let r = alice.post("/api/set", r#"{"component": "source-1", "key": "rate_hz", "value": null}"#);
    assert_eq!(r.json(), json!({"overrides": {"bu-1.size.kind": "fixed"}}));
    assert_eq!(backend.sets.lock().unwrap().len(), 1);
    for (bad, says) in [
        (r#"{"component": "source-1", "key": "rate_hz"}"#, "`value` is missing"),
        (r#"{"key": "rate_hz", "value": 1}"#, "`component` is missing"),
        (r#"{"component": "source-1", "key": 7, "value": 1}"#, "`key` must be a non-empty string"),
        (r#"{"component": "source-1", "key": "a", "value": 1, "why": 2}"#, "why"),
        (r#"{"component": "ru-9", "key": "a", "value": 1}"#, "no component `ru-9`"),
    ] {
        let r = alice.post("/api/set", bad);
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.error().contains(says), "{bad}: {}", r.error());
    }
    web.shutdown().unwrap();
}

#[test]
fn metrics_are_prometheus_text_with_the_web_servers_own() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    get(addr, "/api/status");
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let text = r.text();
    assert!(text.ends_with('\n'));
    assert!(text.starts_with("# HELP daqflow_run_number "), "the status comes first: {text}");
    assert!(text.contains("daqflow_run_number{system=\"fake\"} 0\n"), "{text}");
    assert!(text.contains("daqflow_component_up{component=\"bu-1\",kind=\"bu\"} 1\n"), "{text}");
    assert!(text.contains("daqflow_component_stat{component=\"bu-1\",kind=\"bu\",stat=\"queued\"} 0\n"), "{text}");
    assert!(text.contains("# TYPE daqflow_web_requests_total counter\n"));
    assert!(text.contains("# TYPE daqflow_web_sse_clients gauge\n"));
    let requests: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("daqflow_web_requests_total "))
        .and_then(|v| v.parse().ok())
        .expect("daqflow_web_requests_total");
    assert!(requests >= 2);
    // Every sample line is `name{labels} value` with a valid name and a number.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(name.starts_with("daqflow_"), "{line}");
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{line}");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    web.shutdown().unwrap();
}

#[test]
fn bad_requests_are_refused_and_the_server_keeps_serving() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    let alive = || assert_eq!(get(addr, "/api/status").status, 200);

    let garbage = raw(addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n");
    assert_eq!(garbage.status, 400);
    assert!(garbage.error().contains("request line"));
    assert_eq!(garbage.header("connection"), Some("close"));
    alive();

    let mut big = b"GET /api/status HTTP/1.1\r\nX-Filler: ".to_vec();
    big.resize(20 * 1024, b'x');
    big.extend_from_slice(b"\r\n\r\n");
    let r = raw(addr, &big);
    assert_eq!(r.status, 431);
    assert!(r.error().contains("16384"), "{}", r.error());
    alive();

    // A body over 1 MiB is refused from its Content-Length, even while the client sends it.
    let mut stream = connect(addr);
    let body = vec![b'a'; 2 * 1024 * 1024];
    let head = format!(
        "POST /api/command HTTP/1.1\r\nHost: {addr}\r\nX-Daqflow-Client: a\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(&body); // the server may close before taking it all
    let r = read_reply(&mut BufReader::new(stream));
    assert_eq!(r.status, 413);
    assert!(r.error().contains("larger than the limit"));
    alive();

    // Exactly 1 MiB is accepted (and then refused for what it says).
    let a = Client::visit(addr);
    let body = format!("\"{}\"", "x".repeat(1024 * 1024 - 2));
    let r = a.post("/api/control/take", &body);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("JSON object"));
    alive();

    for (bytes, status) in [
        (&b"POST /api/command HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..], 501),
        (b"GET /api/status HTTP/3.0\r\n\r\n", 505),
        (b"GET /api/status\r\n\r\n", 400),
        (b"GET /api/logs?text=%G1 HTTP/1.1\r\n\r\n", 400),
        (b"GET /api/status HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"POST /api/command HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
        (b"GET /api/status HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ] {
        let r = raw(addr, bytes);
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(bytes));
        assert!(!r.error().is_empty());
        alive();
    }

    // A client that connects and leaves, or sends half a request and leaves, harms nobody.
    drop(connect(addr));
    let mut half = connect(addr);
    half.write_all(b"GET /api/sta").unwrap();
    drop(half);
    alive();

    // A panicking backend is a 500, and the server goes on.
    assert_eq!(a.post("/api/control/take", "").status, 200);
    let r = a.post("/api/command", r#"{"name": "panic"}"#);
    assert_eq!(r.status, 500);
    assert!(r.error().contains("panicked"));
    alive();
    web.shutdown().unwrap();
}

#[test]
fn a_connection_serves_several_requests_and_100_continue() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    let session = Client::visit(addr).session.unwrap();
    let stream = connect(addr);
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    for _ in 0..3 {
        write!(writer, "GET /api/control HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let r = read_reply(&mut reader);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), None);
    }
    // Pipelined: two requests in one write.
    write!(writer, "GET /api/control HTTP/1.1\r\nHost: {addr}\r\n\r\nGET /api/et HTTP/1.1\r\nHost: {addr}\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader).json()["controlled"], false);
    assert_eq!(read_reply(&mut reader).json()[0]["component"], "et-1");

    write!(
        writer,
        "POST /api/control/take HTTP/1.1\r\nHost: {addr}\r\nCookie: daqflow_session={session}\r\n\
         X-Daqflow-Client: 1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    )
    .unwrap();
    let interim = read_reply(&mut reader);
    assert_eq!(interim.status, 100);
    writer.write_all(b"{}").unwrap();
    assert_eq!(read_reply(&mut reader).json()["you"], true);

    writer.write_all(b"GET /api/control HTTP/1.0\r\n\r\n").unwrap();
    let last = read_reply(&mut reader);
    assert_eq!(last.header("connection"), Some("close"));
    web.shutdown().unwrap();
}

#[test]
fn shutdown_ends_the_streams_and_stops_listening() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let mut events = Sse::open(addr, "/api/events");
    events.next_named("status");
    let mut values = Client::visit(addr).events("/api/listen?service=bu-1/state");
    values.next_named("value");
    web.shutdown().unwrap();
    while events.next().is_some() {}
    while values.next().is_some() {}
    wait_until("the subscription to be dropped", || (backend.listeners.load(Ordering::SeqCst) == 0).then_some(()));
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).is_err(), "still listening");
}

#[test]
fn serve_runs_on_the_callers_runtime_until_its_shutdown_signal() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let backend = FakeBackend::new(Duration::ZERO);
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(daqflow_web::serve_with_shutdown(listener, backend, options(), async move {
        let _ = stopped.await;
    }));
    assert_eq!(get(addr, "/api/status").json()["state"], "Initial");
    stop.send(()).unwrap();
    runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), server).await }).unwrap().unwrap().unwrap();
}

#[test]
fn binding_a_taken_address_is_a_clear_error() {
    let (web, _) = start(options());
    let err = daqflow_web::spawn(web.local_addr(), FakeBackend::new(Duration::ZERO), options()).unwrap_err();
    assert!(matches!(err, daqflow_web::WebError::Bind { .. }));
    assert!(err.to_string().contains(&web.local_addr().to_string()), "{err}");
    web.shutdown().unwrap();
}

#[test]
fn the_history_lists_its_names_and_serves_a_values_samples_down_sampled_on_request() {
    use support::history::{HistoryBackend, INTERVAL_MS, SAMPLES};
    let backend = HistoryBackend::new(FakeBackend::new(Duration::from_millis(20)));
    // With a web token: a watcher without a session reads the history.
    let options = WebOptions { access_token: Some("0123456789abcdef0123".into()), ..options() };
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn");
    let addr = web.local_addr();

    let names = get(addr, "/api/history/names");
    assert_eq!(names.status, 200, "{}", names.text());
    assert_eq!(
        names.json(),
        json!(["bu-0.detail.throttled", "evm.events", "evm.events_per_s", "hv/state.voltage", "system.events_per_s"])
    );

    // The last hour by default: every sample, oldest first, as it was stored.
    let r = get(addr, "/api/history?name=evm.events");
    assert_eq!(r.status, 200, "{}", r.text());
    let s = r.json();
    assert_eq!((&s["name"], &s["bucket_ms"]), (&json!("evm.events"), &json!(0)));
    assert_eq!(s["to_ms"].as_u64().unwrap() - s["from_ms"].as_u64().unwrap(), 3_600_000);
    let points = s["points"].as_array().unwrap();
    assert!(points.len() as u64 >= SAMPLES - 2, "{} points", points.len());
    let values: Vec<f64> = points.iter().map(|p| p["value"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[1] == w[0] + 1000.0), "increasing by 1000 a sample");
    assert_eq!(points[0]["count"], 1);
    assert_eq!(points[0]["min"], points[0]["value"]);

    // At most 10 points: buckets with their mean, minimum and maximum.
    let (from, to) = (s["from_ms"].as_u64().unwrap(), s["to_ms"].as_u64().unwrap());
    let r = get(addr, &format!("/api/history?name=evm.events_per_s&from={from}&to={to}&points=10"));
    assert_eq!(r.status, 200, "{}", r.text());
    let s = r.json();
    let points = s["points"].as_array().unwrap();
    assert!(!points.is_empty() && points.len() <= 10, "{} points", points.len());
    assert!(s["bucket_ms"].as_u64().unwrap() >= (to - from) / 10);
    let counted: u64 = points.iter().map(|p| p["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, values.len() as u64);
    assert!(
        points.iter().all(|p| p["min"].as_f64() <= p["value"].as_f64() && p["value"].as_f64() <= p["max"].as_f64())
    );
    let lowest = points.iter().map(|p| p["min"].as_f64().unwrap()).fold(f64::MAX, f64::min);
    let highest = points.iter().map(|p| p["max"].as_f64().unwrap()).fold(f64::MIN, f64::max);
    assert_eq!((lowest, highest), (0.0, 99.0), "the saw tooth's extremes survive the down-sampling");

    // A range of one's own: a service's value, a range before any sample.
    let slash = get(addr, &format!("/api/history?name=hv%2Fstate.voltage&from={}&to={to}", to - 60_000));
    assert_eq!(slash.status, 200, "{}", slash.text());
    let n = slash.json()["points"].as_array().unwrap().len() as u64;
    assert!((60_000 / INTERVAL_MS - 1..=60_000 / INTERVAL_MS + 1).contains(&n), "{n} points in a minute");
    let before = get(addr, "/api/history?name=evm.events&from=0&to=1000");
    assert_eq!((before.status, before.json()["points"].clone()), (200, json!([])));

    // What cannot be answered, with why.
    let unknown = get(addr, "/api/history?name=nobody.events");
    assert_eq!(unknown.status, 404);
    assert!(unknown.error().contains("no value `nobody.events`"), "{}", unknown.error());
    for (query, why) in [
        ("", "`name`"),
        ("?name=evm.events&from=10&to=5", "is after `to`"),
        ("?name=evm.events&points=0", "`points` must be 1 … 10000"),
        ("?name=evm.events&to=now", "`to` must be a non-negative integer"),
        ("?name=evm.events&colour=red", "unknown query parameter `colour`"),
    ] {
        let r = get(addr, &format!("/api/history{query}"));
        assert_eq!(r.status, 400, "{query}");
        assert!(r.error().contains(why), "{query}: {}", r.error());
    }
    assert_eq!(get(addr, "/api/history/names?x=1").status, 400);
    let post = Client::visit(addr).post("/api/history", "");
    assert_eq!((post.status, post.header("allow")), (405, Some("GET")));
    web.shutdown().unwrap();
}

#[test]
fn a_backend_without_a_history_says_so() {
    let (web, _) = start(options());
    for path in ["/api/history/names", "/api/history?name=evm.events"] {
        let r = get(web.local_addr(), path);
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.error(), daqflow_web::NO_HISTORY);
    }
    web.shutdown().unwrap();
}

#[test]
fn alarms_are_listed_to_watchers_and_acknowledged_by_the_controller_only() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    // A system without alarms: none, and nothing to acknowledge.
    let r = get(addr, "/api/alarms");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"system": "", "alarms": [], "events": []}));
    let watcher = Client::visit(addr);
    let r = watcher.post("/api/alarms/ack", r#"{"name": "slow"}"#);
    assert_eq!(r.status, 403, "{}", r.text());
    let alice = Client::visit(addr);
    assert_eq!(alice.post("/api/control/take", "{}").status, 200);
    for (body, says) in [
        ("{}", "`name` is missing"),
        (r#"{"name": 3}"#, "`name` must be a non-empty string"),
        (r#"{"name": "slow", "colour": 1}"#, "unknown field `colour`"),
        (r#"{"name": "slow", "who": 7}"#, "`who` must be a name"),
        (r#"{"name": "slow", "who": "a\nb"}"#, "`who` must be a name"),
        ("[1]", "must be a JSON object"),
        (r#"{"name": "slow", "who": "alice"}"#, "there is no alarm `slow`"),
    ] {
        let r = alice.post("/api/alarms/ack", body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error().contains(says), "{body}: {}", r.text());
    }
    assert_eq!(get(addr, "/api/alarms/ack").status, 405);
    // No alarm, no alarm metric.
    assert!(!get(addr, "/metrics").text().contains("daqflow_alarm"));
    web.shutdown().unwrap();
}
