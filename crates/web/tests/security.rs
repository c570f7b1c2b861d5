//! The web server against strangers on the same host: the access token and sessions, control
//! that cannot be hijacked, Host and Origin checks (DNS rebinding, cross-site requests),
//! connections that are half-sent or idle (slowloris), bad bodies, and the refusals' metrics.

mod support;

use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daqflow_api::SystemState;
use daqflow_web::{WebHandle, WebOptions};
use serde_json::json;
use support::client::{Client, SESSION_COOKIE, Sse, connect, get, raw, read_reply, send};
use support::fake::FakeBackend;

const TOKEN: &str = "3f9a2c0d4e5b6a7980c1d2e3f4a5b6c7";

fn options() -> WebOptions {
    WebOptions {
        status_interval: Duration::from_millis(200),
        failed_login_delay: Duration::from_millis(50),
        ..WebOptions::default()
    }
}

fn with_token() -> WebOptions {
    WebOptions { access_token: Some(TOKEN.into()), ..options() }
}

fn start(options: WebOptions) -> (WebHandle, Arc<FakeBackend>) {
    let backend = FakeBackend::new(Duration::from_millis(20));
    let web = daqflow_web::spawn("127.0.0.1:0", backend.clone(), options).expect("spawn");
    (web, backend)
}

/// A request with exactly this head (`{addr}` replaced by the server's address).
fn raw_head(addr: SocketAddr, head: &str) -> support::client::Reply {
    raw(addr, head.replace("{addr}", &addr.to_string()).as_bytes())
}

/// The value of a sample of `/metrics`.
fn metric(addr: SocketAddr, series: &str) -> u64 {
    let text = get(addr, "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

fn assert_secret_free(what: &str, text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!text.contains(s), "{what} discloses a credential ({s}): {text}");
    }
}

#[test]
fn the_control_state_never_discloses_a_clients_credentials() {
    for options in [options(), with_token()] {
        let token = options.access_token.is_some();
        let (web, _) = start(options);
        let addr = web.local_addr();
        let holder = if token { Client::login(addr, TOKEN) } else { Client::visit(addr) };
        let took = holder.post("/api/control/take", "{}");
        assert_eq!(took.status, 200, "{}", took.text());
        let mut secrets = vec![holder.header.as_str(), TOKEN];
        if let Some(s) = &holder.session {
            secrets.push(s);
        }

        let watcher = Client::visit(addr);
        let control = watcher.get("/api/control");
        assert_secret_free("GET /api/control", &control.text(), &secrets);
        assert_secret_free("GET /api/status", &watcher.get("/api/status").text(), &secrets);
        assert_secret_free("the holder's own take", &took.text(), &secrets);
        let mut stream = watcher.events("/api/events");
        let first = stream.next_named("control");
        assert_secret_free("the control event", &first.data, &secrets);
        assert_secret_free("the status event", &stream.next_named("status").data, &secrets);
        let refused = watcher.post("/api/control/take", "{}");
        assert_secret_free("a refusal", &refused.text(), &secrets);

        // What it says instead: controlled, by whom (a label), since when, and whether it is you.
        let c = control.json();
        assert_eq!(c["controlled"], true, "{c}");
        assert_eq!(c["you"], false, "{c}");
        let label = c["holder"].as_str().expect("a holder label").to_owned();
        assert!(label.starts_with("client "), "{label}");
        assert!(c["since_ms"].as_u64().is_some_and(|t| t > 1_600_000_000_000), "{c}");
        let mine = holder.get("/api/control").json();
        assert_eq!((mine["you"].as_bool(), mine["holder"].as_str()), (Some(true), Some(label.as_str())), "{mine}");
        assert_eq!(first.json()["holder"], label.as_str());
        assert_eq!(watcher.get("/api/status").json()["web"]["holder"], label.as_str());
        web.shutdown().unwrap();
    }
}

#[test]
fn without_the_token_a_client_can_watch_but_cannot_take_force_or_stop() {
    let (web, backend) = start(with_token());
    let addr = web.local_addr();
    let stranger = Client::visit(addr);
    assert_eq!(stranger.session, None, "a session without the token");
    let r = stranger.post("/api/control/take", "{}");
    assert_eq!(r.status, 403, "a stranger took control: {}", r.text());
    assert!(r.error().contains("token"), "{}", r.error());

    let operator = Client::login(addr, TOKEN);
    assert_eq!(operator.post("/api/control/take", "{}").status, 200);
    assert_eq!(operator.post("/api/transition/configure", "").status, 200);
    assert_eq!(operator.post("/api/transition/start", "").status, 200);
    assert_eq!(backend.state(), SystemState::Running);

    let forged = Client { session: Some("0123456789abcdef0123456789abcdef".into()), ..Client::new(addr) };
    for who in [&stranger, &forged] {
        for (path, body) in [
            ("/api/control/take", r#"{"force": true}"#),
            ("/api/control/release", ""),
            ("/api/transition/stop", ""),
            ("/api/transition/reset", ""),
            ("/api/command", r#"{"name": "all/stop"}"#),
        ] {
            let r = who.post(path, body);
            assert_eq!(r.status, 403, "{path} by a client without the token: {}", r.text());
        }
    }
    assert_eq!(backend.state(), SystemState::Running);
    assert!(backend.commands.lock().unwrap().is_empty());
    assert_eq!(operator.get("/api/control").json()["you"], true);

    // Watching stays open.
    assert_eq!(stranger.get("/api/status").json()["state"], "Running");
    let c = stranger.get("/api/control").json();
    assert_eq!(
        (c["controlled"].as_bool(), c["you"].as_bool(), c["may_control"].as_bool()),
        (Some(true), Some(false), Some(false))
    );
    let mut stream = stranger.events("/api/events");
    assert_eq!(stream.status, 200);
    stream.wait_for("status", |s| s["state"] == "Running");
    for path in ["/api/processes", "/api/logs", "/api/runs", "/api/histograms", "/api/et", "/metrics"] {
        assert_eq!(stranger.get(path).status, 200, "{path}");
    }

    // A second crew member with the token may take control over.
    let crew = Client::login(addr, TOKEN);
    assert_eq!(crew.post("/api/control/take", "{}").status, 409);
    assert_eq!(crew.post("/api/control/take", r#"{"force": true}"#).status, 200);
    assert_eq!(operator.post("/api/transition/stop", "").status, 403);
    assert_eq!(crew.post("/api/transition/stop", "").status, 200);
    assert_eq!(backend.state(), SystemState::Configured);
    web.shutdown().unwrap();
}

#[test]
fn the_login_gives_a_secret_session_cookie_and_refuses_a_wrong_token() {
    let (web, _) = start(with_token());
    let addr = web.local_addr();

    // The URL the operator prints: a cookie, and a redirect that takes the token out of the address bar.
    let r = Client::new(addr).get(&format!("/?token={TOKEN}"));
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("/"));
    let cookie = r.set_cookie(SESSION_COOKIE).expect("a session cookie");
    let attributes: Vec<&str> = cookie.split(';').skip(1).map(str::trim).collect();
    for a in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(attributes.contains(&a), "no {a} in {cookie}");
    }
    let session = r.cookie(SESSION_COOKIE).unwrap();
    assert!(session.len() == 32 && session.bytes().all(|b| b.is_ascii_hexdigit()), "{session}");
    assert_ne!(session, TOKEN);
    let browser = Client { session: Some(session.clone()), ..Client::new(addr) };
    assert_eq!(browser.get("/api/control").json()["may_control"], true);
    assert_eq!(browser.post("/api/control/take", "{}").status, 200);

    // Every login is a session of its own.
    let script = Client::login(addr, TOKEN);
    assert_ne!(script.session.as_deref(), Some(session.as_str()));
    assert_eq!(script.get("/api/control").json()["you"], false);

    // A wrong (or stale) token in the URL: refused (403, no session), with the page itself,
    // which tells a browser why and offers the login form.
    let wrong = Client::new(addr).get("/?token=guess");
    assert_eq!(wrong.status, 403);
    assert_eq!(wrong.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(wrong.text().contains("id=\"login-form\""), "{}", wrong.text());
    assert!(wrong.header("content-security-policy").is_some());
    assert_eq!(wrong.set_cookie(SESSION_COOKIE), None);
    let wrong = Client::new(addr).post("/api/login", r#"{"token": "guess"}"#);
    assert_eq!(wrong.status, 403);
    assert!(wrong.error().contains("wrong"), "{}", wrong.error());
    assert_eq!(wrong.set_cookie(SESSION_COOKIE), None);
    // One byte off, or a prefix, is as wrong.
    for guess in [&TOKEN[..31], &format!("{TOKEN}0"), &format!("{}x", &TOKEN[..31])] {
        assert_eq!(Client::new(addr).post("/api/login", &json!({ "token": guess }).to_string()).status, 403);
    }
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"login_failure\"}"), 5);

    for (body, names) in [("", "token"), ("{}", "token"), (r#"{"token": 5}"#, "token"), ("{not json", "JSON")] {
        let r = Client::new(addr).post("/api/login", body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.error().contains(names), "{body}: {}", r.error());
    }
    web.shutdown().unwrap();
}

#[test]
fn sessions_end_when_unused_and_are_capped_in_number_sparing_the_controller() {
    let lapse = Duration::from_millis(600);
    let (web, _) = start(WebOptions { session_lapse: lapse, max_sessions: 3, ..with_token() });
    let addr = web.local_addr();
    let unused = Client::login(addr, TOKEN);
    std::thread::sleep(lapse * 3);
    let c = unused.get("/api/control").json();
    assert_eq!(c["may_control"], false, "a session unused for 3 lapses is still valid: {c}");
    assert_eq!(unused.post("/api/control/take", "{}").status, 403);

    let (web, _) = start(WebOptions { max_sessions: 3, ..with_token() });
    let addr = web.local_addr();
    let controller = Client::login(addr, TOKEN);
    assert_eq!(controller.post("/api/control/take", "{}").status, 200);
    let others: Vec<Client> = (0..5).map(|_| Client::login(addr, TOKEN)).collect();
    assert_eq!(controller.get("/api/control").json()["you"], true, "the controller's session was ended");
    assert_eq!(others[0].get("/api/control").json()["may_control"], false, "more than 3 sessions");
    assert_eq!(others[4].get("/api/control").json()["may_control"], true);
    web.shutdown().unwrap();
}

#[test]
fn without_a_token_every_visitor_gets_an_anonymous_session_that_may_control() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let visitor = Client::visit(addr);
    assert!(visitor.session.is_some(), "no session cookie on the page");
    let c = visitor.get("/api/control").json();
    assert_eq!((c["may_control"].as_bool(), c["you"].as_bool()), (Some(true), Some(false)), "{c}");
    let script = Client::login(addr, "");
    assert_eq!(script.post("/api/control/take", "{}").status, 200);
    assert_eq!(script.post("/api/transition/configure", "").status, 200);
    assert_eq!(backend.state(), SystemState::Configured);
    // Without a session there is nobody to give control to.
    let r = Client::new(addr).post("/api/control/take", "{}");
    assert_eq!(r.status, 403);
    assert!(r.error().contains("session"), "{}", r.error());
    web.shutdown().unwrap();
}

#[test]
fn with_token_to_watch_only_the_login_and_the_ui_files_are_open() {
    let (web, _) = start(WebOptions { token_to_watch: true, ..with_token() });
    let addr = web.local_addr();
    let stranger = Client::new(addr);
    for path in ["/api/status", "/api/control", "/api/processes", "/api/logs", "/api/runs", "/api/runs/1", "/metrics"] {
        let r = stranger.get(path);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.error().contains("token"), "{path}: {}", r.error());
    }
    let events = Sse::open(addr, "/api/events");
    assert_eq!(events.status, 403);
    assert_eq!(Sse::open(addr, "/api/listen?service=bu-1/state").status, 403);
    assert_eq!(crew_listens(addr), 200);
    for path in ["/", "/index.html", "/app.js", "/style.css"] {
        assert_eq!(stranger.get(path).status, 200, "{path}");
    }
    let crew = Client::login(addr, TOKEN);
    assert_eq!(crew.get("/api/status").status, 200);
    assert_eq!(crew.get("/metrics").status, 200);
    assert_eq!(crew.events("/api/events").status, 200);
    web.shutdown().unwrap();
}

#[test]
fn a_short_access_token_is_refused() {
    for token in ["", "short"] {
        let options = WebOptions { access_token: Some(token.into()), ..options() };
        let err = daqflow_web::spawn("127.0.0.1:0", FakeBackend::new(Duration::ZERO), options).unwrap_err();
        assert!(err.to_string().contains("token"), "{err}");
    }
}

#[test]
fn requests_naming_another_host_are_refused() {
    let (web, _) = start(WebOptions { allowed_hosts: vec!["daq.example.org".into(), "proxy:9".into()], ..options() });
    let addr = web.local_addr();
    let port = addr.port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".into(),
        format!("localhost.evil.example:{port}"),
        format!("127.0.0.1:{}", port + 1),
        "localhost".into(),
        "proxy".into(),
        format!("proxy:{port}"),
    ] {
        for path in ["/", "/api/status", "/api/events"] {
            let r = raw_head(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
            assert_eq!(r.status, 421, "Host: {host} on {path}");
            assert!(r.error().contains("Host"), "{}", r.error());
        }
    }
    let missing = raw_head(addr, "GET /api/status HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(missing.status, 400);
    assert!(missing.error().contains("Host"), "{}", missing.error());
    for host in [
        addr.to_string(),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        "daq.example.org".into(),
        format!("daq.example.org:{port}"),
        "proxy:9".into(),
    ] {
        let r = raw_head(addr, &format!("GET /api/status HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"));
        assert_eq!(r.status, 200, "Host: {host}: {}", r.text());
    }
    assert_eq!(raw_head(addr, "GET /api/status HTTP/1.0\r\n\r\n").status, 200, "HTTP/1.0 needs no Host");
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"bad_host\"}"), 22);
    web.shutdown().unwrap();
}

#[test]
fn cross_origin_requests_that_act_or_stream_are_refused() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let client = Client::visit(addr);
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1", "file://"] {
        let r = client.request("POST", "/api/control/take", &[("Origin", origin)], Some("{}"));
        assert_eq!(r.status, 403, "Origin: {origin}: {}", r.text());
        assert!(r.error().contains("Origin"), "{}", r.error());
        let headers = [("Origin".to_owned(), origin.to_owned())];
        assert_eq!(send(addr, "POST", "/api/login", &headers, Some("{}")).status, 403);
        let stream = Sse::open_with(addr, "/api/events", &[("Origin", origin)]);
        assert_eq!(stream.status, 403, "event stream with Origin: {origin}");
        let stream = Sse::open_with(addr, "/api/listen?service=bu-1/state", &[("Origin", origin)]);
        assert_eq!(stream.status, 403, "listening with Origin: {origin}");
    }
    assert_eq!(client.get("/api/control").json()["controlled"], false);
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"bad_origin\"}"), 16);

    // Its own origin is fine.
    let own = format!("http://{addr}");
    let r = client.request("POST", "/api/control/take", &[("Origin", &own)], Some("{}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = client.request("POST", "/api/transition/configure", &[("Origin", &own)], Some(""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(backend.state(), SystemState::Configured);
    let stream = Sse::open_with(addr, "/api/events", &[("Origin", &own)]);
    assert_eq!(stream.status, 200);
    web.shutdown().unwrap();
}

/// Opens `n` connections, each served one request (so the server surely holds it), then sends
/// `then` on each (a half-sent request, or nothing: idle).
fn held_connections(addr: SocketAddr, n: usize, then: &str) -> Vec<std::net::TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = connect(addr);
            write!(s, "GET /api/control HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            assert_eq!(read_reply(&mut BufReader::new(s.try_clone().unwrap())).status, 200);
            s.write_all(then.replace("{addr}", &addr.to_string()).as_bytes()).unwrap();
            s
        })
        .collect()
}

#[test]
fn half_sent_requests_do_not_lock_out_the_operator() {
    // A long request timeout, and no cap per address: only making room can let the operator in.
    let options =
        WebOptions { request_timeout: Duration::from_secs(120), max_idle_per_ip: usize::MAX, ..WebOptions::default() };
    let max = options.max_connections;
    let (web, _) = start(options);
    let addr = web.local_addr();
    let slow = held_connections(addr, max, "GET /api/status HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
    let r = get(addr, "/api/status");
    assert_eq!(r.status, 200, "the operator was refused: {}", r.text());
    assert!(metric(addr, "daqflow_web_refused_total{reason=\"evicted\"}") >= 1);
    drop(slow);

    // Idle kept-alive connections make room too.
    let idle = held_connections(addr, max, "");
    let r = get(addr, "/api/status");
    assert_eq!(r.status, 200, "the operator was refused: {}", r.text());
    drop(idle);
    web.shutdown().unwrap();
}

#[test]
fn one_address_cannot_hold_more_than_its_share_of_waiting_connections() {
    let options = WebOptions { request_timeout: Duration::from_secs(120), max_idle_per_ip: 8, ..options() };
    let (web, _) = start(options);
    let addr = web.local_addr();
    let mut slow = held_connections(addr, 9, "GET /api/status HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
    // The first was closed when the ninth came (EOF, no answer: it had sent only half a request).
    let mut rest = Vec::new();
    slow[0].set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(std::io::Read::read_to_end(&mut slow[0], &mut rest).unwrap(), 0);
    // And the second when the request for the metrics came.
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"evicted\"}"), 2);
    web.shutdown().unwrap();
}

#[test]
fn event_streams_of_strangers_do_not_lock_out_the_operator() {
    let options = WebOptions { max_connections: 32, ..with_token() };
    let (web, _) = start(options);
    let addr = web.local_addr();
    let operator = Client::login(addr, TOKEN);
    let mut own = operator.events("/api/events");
    assert_eq!(own.status, 200);
    let strangers: Vec<Sse> = (0..40).map(|_| Sse::open(addr, "/api/events")).collect();
    assert!(strangers.iter().all(|s| s.status == 200));
    assert_eq!(operator.post("/api/control/take", "{}").status, 200);
    // The operator's stream was spared: it still delivers.
    own.wait_for("control", |c| c["you"] == true);
    drop(strangers);
    web.shutdown().unwrap();
}

#[test]
fn a_request_that_trickles_in_is_cut_off_after_the_request_timeout() {
    let (web, _) = start(WebOptions { request_timeout: Duration::from_secs(1), ..options() });
    let addr = web.local_addr();
    let stream = connect(addr);
    let mut writer = stream.try_clone().unwrap();
    writer.write_all(format!("GET /api/status HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").as_bytes()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read_reply(&mut BufReader::new(stream)));
    });
    // One byte every 100 ms would keep the connection forever with only an idle timeout.
    let until = Instant::now() + Duration::from_secs(20);
    let reply = loop {
        if let Ok(reply) = rx.try_recv() {
            break reply;
        }
        assert!(Instant::now() < until, "a trickling request was still open after 20 s");
        let _ = writer.write_all(b"x");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(reply.status, 408);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(reply.error().contains("did not arrive"), "{}", reply.error());
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"timeout\"}"), 1);
    web.shutdown().unwrap();
}

#[test]
fn a_body_that_is_not_what_the_route_takes_is_a_400_naming_the_problem() {
    let (web, backend) = start(options());
    let addr = web.local_addr();
    let client = Client::visit(addr);
    assert_eq!(client.post("/api/control/take", "{}").status, 200);
    assert_eq!(client.post("/api/transition/configure", "").status, 200);
    for (path, body, names) in [
        ("/api/command", "{not json", "JSON"),
        ("/api/command", r#"{"name": "all/stop", "data": "#, "JSON"),
        ("/api/command", "[1]", "object"),
        ("/api/command", r#"{"data": "x"}"#, "name"),
        ("/api/command", r#"{"name": 5}"#, "name"),
        ("/api/command", r#"{"name": ""}"#, "name"),
        ("/api/command", r#"{"name": "has spaces!"}"#, "has spaces!"),
        ("/api/command", r#"{"name": "all/stop", "colour": 1}"#, "colour"),
        ("/api/control/take", r#"{"force": "yes"}"#, "force"),
        ("/api/control/take", "{bad", "JSON"),
        ("/api/control/take", r#"{"force": true, "client": "x"}"#, "client"),
        ("/api/transition/start", r#"{"run": "twelve"}"#, "run"),
        ("/api/transition/start", r#"{"run": 0}"#, "run"),
        ("/api/transition/start", r#"{"run": 4294967296}"#, "run"),
        ("/api/transition/start", r#"{"run": 1.5}"#, "run"),
        ("/api/transition/start", r#"{"runn": 3}"#, "runn"),
        ("/api/transition/start", "[3]", "object"),
        ("/api/transition/start", "{\"run\": 3", "JSON"),
    ] {
        let r = client.post(path, body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        assert!(r.error().contains(names), "{path} {body}: {}", r.error());
    }
    assert_eq!(backend.state(), SystemState::Configured, "a refused start started");
    assert!(backend.commands.lock().unwrap().is_empty());
    let r = client.post("/api/transition/start", r#"{"run": 12}"#);
    assert_eq!((r.status, r.json()["result"]["started"].as_u64()), (200, Some(12)));
    web.shutdown().unwrap();
}

#[test]
fn an_unknown_service_or_command_is_a_404_and_a_post_without_the_header_a_400() {
    let (web, _) = start(options());
    let addr = web.local_addr();
    let unknown = Client::visit(addr).get("/api/listen?service=nope");
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert_eq!(unknown.header("content-type"), Some("application/json"));
    assert!(unknown.error().contains("no service `nope`"), "{}", unknown.error());

    let client = Client::visit(addr);
    assert_eq!(client.post("/api/control/take", "{}").status, 200);
    let nobody = client.post("/api/command", r#"{"name": "nobody"}"#);
    assert_eq!(nobody.status, 404, "{}", nobody.text());
    assert!(nobody.error().contains("no process registered"), "{}", nobody.error());

    // The same client, without the header every POST needs.
    let cookie = [("Cookie".to_owned(), format!("{SESSION_COOKIE}={}", client.session.as_deref().unwrap()))];
    for (path, body) in [
        ("/api/transition/configure", ""),
        ("/api/command", r#"{"name": "all/stop"}"#),
        ("/api/control/release", ""),
        ("/api/control/take", "{}"),
        ("/api/login", "{}"),
    ] {
        let r = send(addr, "POST", path, &cookie, Some(body));
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.error().contains("X-Daqflow-Client"), "{path}: {}", r.error());
    }
    assert_eq!(client.get("/api/control").json()["you"], true);
    web.shutdown().unwrap();
}

#[test]
fn the_header_that_named_a_client_no_longer_identifies_one() {
    // Replaying another client's X-Daqflow-Client gives nothing: identity is the session.
    let (web, _) = start(options());
    let addr = web.local_addr();
    let holder = Client::visit(addr);
    assert_eq!(holder.post("/api/control/take", "{}").status, 200);
    let impostor = Client { header: holder.header.clone(), ..Client::visit(addr) };
    assert_eq!(impostor.post("/api/transition/configure", "").status, 403);
    let replay = [("X-Daqflow-Client".to_owned(), holder.header.clone())];
    assert_eq!(send(addr, "POST", "/api/transition/configure", &replay, Some("")).status, 403);
    assert_eq!(send(addr, "GET", &format!("/api/control?client={}", holder.header), &[], None).json()["you"], false);
    web.shutdown().unwrap();
}

#[test]
fn the_options_debug_output_hides_the_token() {
    let text = format!("{:?}", with_token());
    assert!(!text.contains(TOKEN), "{text}");
    assert!(text.contains("access_token"), "{text}");
}

/// The status of `GET /api/listen` for a client logged in with [`TOKEN`].
fn crew_listens(addr: SocketAddr) -> u16 {
    Client::login(addr, TOKEN).events("/api/listen?service=bu-1/state").status
}

#[test]
fn listening_to_a_service_needs_a_session_although_watching_does_not() {
    // With a token: watching the run is open, reading a service's values needs the login.
    let (web, _) = start(with_token());
    let addr = web.local_addr();
    assert_eq!(get(addr, "/api/status").status, 200);
    assert_eq!(Sse::open(addr, "/api/events").status, 200);
    let stranger = Sse::open(addr, "/api/listen?service=bu-1/state");
    assert_eq!(stranger.status, 403);
    let refused = get(addr, "/api/listen?service=bu-1/state");
    assert!(refused.error().contains("logged in with the web token"), "{}", refused.error());
    // A visitor of the page is no better off: it has no session that may act.
    assert_eq!(Client::visit(addr).events("/api/listen?service=bu-1/state").status, 403);
    assert_eq!(crew_listens(addr), 200);
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"no_session\"}"), 3);
    web.shutdown().unwrap();

    // Without a token: a session (every visitor of the page gets one), not a bare request.
    let (web, _) = start(options());
    let addr = web.local_addr();
    let bare = get(addr, "/api/listen?service=bu-1/state");
    assert_eq!(bare.status, 403);
    assert!(bare.error().contains("needs a session"), "{}", bare.error());
    let mut visitor = Client::visit(addr).events("/api/listen?service=bu-1/state");
    assert_eq!(visitor.status, 200);
    visitor.next_named("value");
    web.shutdown().unwrap();
}

/// Sends a login with `token` on a new connection and reads to the end: the status line, or
/// None when the connection closed without an answer.
fn login_attempt(addr: SocketAddr, token: &str) -> Option<String> {
    use std::io::Read;
    let body = json!({ "token": token }).to_string();
    let mut stream = connect(addr);
    let head = format!(
        "POST /api/login HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nX-Daqflow-Client: 1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().filter(|l| !l.is_empty()).map(str::to_owned)
}

#[test]
fn wrong_logins_are_held_back_and_spaced_but_the_right_token_gets_in_at_once() {
    let delay = Duration::from_millis(2000);
    let (web, _) = start(WebOptions { failed_login_delay: delay, ..with_token() });
    let addr = web.local_addr();

    // Ten guesses at once: each answered 403 no sooner than the delay, the answers a tenth of
    // the delay apart.
    let started = Instant::now();
    let guesses: Vec<_> = (0..10)
        .map(|i| {
            std::thread::spawn(move || {
                let status = login_attempt(addr, &format!("guess-{i:026}"));
                (status, started.elapsed())
            })
        })
        .collect();
    // Meanwhile the token holder logs in, at once: before any guess is answered.
    std::thread::sleep(Duration::from_millis(200));
    let crew = Client::login(addr, TOKEN);
    let crew_in = started.elapsed();
    let mut answered: Vec<Duration> = Vec::new();
    for g in guesses {
        let (status, at) = g.join().unwrap();
        assert_eq!(status.as_deref(), Some("HTTP/1.1 403 Forbidden"));
        answered.push(at);
    }
    answered.sort();
    assert!(answered[0] >= delay, "a wrong login answered after {:?}", answered[0]);
    assert!(
        crew_in < answered[0],
        "the token holder got in after {crew_in:?}, a guess was answered after {:?}",
        answered[0]
    );
    assert!(answered[9] - answered[0] >= delay / 10 * 9 - Duration::from_millis(20), "{answered:?}");
    assert_eq!(crew.get("/api/control").json()["may_control"], true);
    assert_eq!(metric(addr, "daqflow_web_refused_total{reason=\"login_failure\"}"), 10);
    web.shutdown().unwrap();
}

#[test]
fn a_flood_of_wrong_logins_never_locks_the_token_holder_out() {
    // Every connection is a held-back guess: the token holder's login makes room.
    let options = WebOptions { failed_login_delay: Duration::from_secs(5), max_connections: 6, ..with_token() };
    let (web, _) = start(options);
    let addr = web.local_addr();
    let guess = move |i: usize| std::thread::spawn(move || login_attempt(addr, &format!("flood-{i:026}")));
    let mut guesses: Vec<_> = (0..5).map(guess).collect();
    let until = Instant::now() + Duration::from_secs(60);
    while metric(addr, "daqflow_web_refused_total{reason=\"login_failure\"}") < 5 {
        assert!(Instant::now() < until, "the guesses were not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    guesses.push(guess(5));
    std::thread::sleep(Duration::from_millis(1000));
    let crew = Client::login(addr, TOKEN);
    assert_eq!(crew.get("/api/control").json()["may_control"], true);
    // The guesses that made room were closed unanswered; the others were refused.
    let answers: Vec<Option<String>> = guesses.into_iter().map(|g| g.join().unwrap()).collect();
    assert!(answers.iter().any(Option::is_none), "no guess made room: {answers:?}");
    for a in answers.iter().flatten() {
        assert_eq!(a, "HTTP/1.1 403 Forbidden");
    }
    web.shutdown().unwrap();
}
