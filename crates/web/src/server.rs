//! The server: accepting connections (and making room when full), reading requests with their
//! deadlines, checking who may do what (Host, Origin, sessions, control), routing to the
//! backend, event streams, and the status pump that feeds them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, broadcast, mpsc, watch};

use crate::access::{Hosts, origin_matches};
use crate::conns::{Conn, Phase, Registry};
use crate::control::{Control, Holder};
use crate::http::{HttpError, Limits, Progress, Request, Response, Version, parse_request};
use crate::metrics::{Refusal, WebMetrics};
use crate::session::{Sessions, constant_time_eq, label, new_session_id, session_cookies, set_cookie};
use crate::{Backend, BackendError, LogFilter, WebError, WebOptions, ui};

/// The header every POST must carry. Browsers send a custom header cross-origin only after a
/// CORS preflight, which this server never grants: so a page of another site cannot POST here.
/// Its value is not an identity (the session is).
pub(crate) const CLIENT_HEADER: &str = "X-Daqflow-Client";
/// The transitions `POST /api/transition/{verb}` accepts.
pub(crate) const VERBS: [&str; 6] = ["configure", "start", "stop", "pause", "resume", "reset"];
/// The severities `min_severity` accepts.
const SEVERITIES: [&str; 5] = ["trace", "debug", "info", "warn", "error"];
/// Default and maximum `limit` of `/api/logs`.
const LOGS_DEFAULT_LIMIT: usize = 200;
const LOGS_MAX_LIMIT: usize = 10_000;
/// Default and maximum `limit` of `/api/runs`.
const RUNS_DEFAULT_LIMIT: usize = 50;
const RUNS_MAX_LIMIT: usize = 10_000;
/// A client that does not take what is written to it within this time is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long requests in progress may finish after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Now, in Unix milliseconds.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// One server-sent event, formatted: `event: NAME` and one `data:` line per line of `data`.
pub(crate) fn sse_event(name: &str, data: &str) -> String {
    let mut out = format!("event: {name}\n");
    // SSE lines end at CR, LF or CRLF: each line of the data goes on a `data:` line of its own,
    // and the browser joins them back with LF.
    let normalized = data.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// Sessions and control, under one lock.
struct Clients {
    sessions: Sessions,
    control: Control,
}

/// What goes to every `/api/events` stream.
#[derive(Debug, Clone)]
enum Broadcast {
    /// The controller changed: each stream sends its client's view of it.
    Control,
    /// An event, formatted, the same for everyone.
    Event(Arc<str>),
}

/// What every connection shares.
struct Shared {
    backend: Arc<dyn Backend>,
    options: WebOptions,
    hosts: Hosts,
    clients: Mutex<Clients>,
    events: broadcast::Sender<Broadcast>,
    /// The latest status event, formatted.
    status: watch::Sender<Option<Arc<str>>>,
    /// Asks the status pump for a fresh status now.
    poke: Notify,
    metrics: WebMetrics,
    conns: Arc<Registry>,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    fn clients(&self) -> MutexGuard<'_, Clients> {
        // The lock is held for a few map operations that cannot panic half-way; a poisoned lock
        // still holds a consistent state.
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an access token is configured.
    fn token_required(&self) -> bool {
        self.options.access_token.is_some()
    }

    /// The session a request carries (its cookie), if it is a live one; notes it as seen.
    fn caller(&self, request: &Request) -> Option<String> {
        let now = Instant::now();
        let mut clients = self.clients();
        session_cookies(request).find(|id| clients.sessions.seen(id, now)).map(str::to_owned)
    }

    /// Whether `session` may act (take control and so on): with a token, a session logged in
    /// with it; without, any session.
    fn may_act(&self, session: Option<&str>) -> bool {
        let Some(id) = session else { return false };
        let clients = self.clients();
        clients.sessions.get(id, Instant::now()).is_some_and(|s| s.authenticated || !self.token_required())
    }

    /// The label number of `session`, if it lives.
    fn label_of(&self, session: &str) -> Option<u64> {
        self.clients().sessions.get(session, Instant::now()).map(|s| s.label)
    }

    /// A new session (logged in with the token when one is configured, else anonymous):
    /// its id and label number.
    fn new_session(&self) -> Result<(String, u64), Response> {
        let id = new_session_id().map_err(|e| {
            tracing::error!("web: cannot make a session id (reading /dev/urandom): {e}");
            Response::error(500, "the server cannot make a session id (no randomness); see its log")
        })?;
        let now = Instant::now();
        let mut clients = self.clients();
        let Clients { sessions, control } = &mut *clients;
        let spare = control.holder().map(|h| h.session.as_str());
        let n = sessions.insert(id.clone(), self.token_required(), now, spare);
        Ok((id, n))
    }

    /// What a client sees of control (`GET /api/control`, the `control` event): whether the
    /// run is controlled, by whom (a label), since when, whether by this client, this client's
    /// own label and whether it may take control. Never a session id.
    fn control_json(&self, session: Option<&str>) -> Value {
        let may_control = self.may_act(session);
        let clients = self.clients();
        let holder = clients.control.holder();
        let me = session.and_then(|id| clients.sessions.get(id, Instant::now()));
        json!({
            "controlled": holder.is_some(),
            "holder": holder.map(|h| label(h.label)),
            "since_ms": holder.map(|h| h.since_ms),
            "you": session.is_some_and(|id| clients.control.holds(id)),
            "me": me.map(|s| label(s.label)),
            "may_control": may_control,
        })
    }

    /// Tells every event stream that the controller changed.
    fn publish_control(&self) {
        // No receivers (no stream open) is not an error.
        let _ = self.events.send(Broadcast::Control);
    }

    /// Lets an unseen controller's control lapse, and tells the streams if it did.
    fn expire_control(&self) {
        let lapsed = {
            let mut clients = self.clients();
            let Clients { sessions, control } = &mut *clients;
            control.expire(sessions, Instant::now())
        };
        if lapsed {
            tracing::info!(
                "web: the controlling client was not seen for {:?} (or its session ended): control lapsed",
                self.options.control_lapse
            );
            self.publish_control();
        }
    }

    /// The `web` object added to the status.
    fn web_json(&self) -> Value {
        let clients = self.clients();
        let holder = clients.control.holder();
        json!({
            "requests_total": self.metrics.requests_total(),
            "sse_clients": self.metrics.sse_clients(),
            "controlled": holder.is_some(),
            "holder": holder.map(|h| label(h.label)),
            "control_since_ms": holder.map(|h| h.since_ms),
        })
    }

    /// The backend's status with the `web` object added.
    async fn status(self: &Arc<Self>) -> Result<Value, Response> {
        let mut status = backend_call(self, |b| b.status()).await?;
        let web = self.web_json();
        if let Value::Object(map) = &mut status {
            match map.get_mut("web") {
                Some(Value::Object(existing)) => {
                    if let Value::Object(ours) = web {
                        existing.extend(ours);
                    }
                }
                _ => {
                    map.insert("web".into(), web);
                }
            }
        }
        Ok(status)
    }
}

/// Runs a backend method on a blocking thread; a panic in it becomes a 500.
async fn backend_call<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&dyn Backend) -> T + Send + 'static,
) -> Result<T, Response> {
    let backend = shared.backend.clone();
    tokio::task::spawn_blocking(move || f(&*backend)).await.map_err(|e| {
        tracing::error!("web: a backend call failed: {e}");
        Response::error(500, "the operator's backend failed (panicked) handling this request; see its log")
    })
}

/// The server's main loop (see [`crate::serve_with_shutdown`]).
pub(crate) async fn run(
    listener: TcpListener,
    backend: Arc<dyn Backend>,
    options: WebOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WebError> {
    let local = listener.local_addr()?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        backend,
        hosts: Hosts::new(local, &options.allowed_hosts),
        clients: Mutex::new(Clients {
            sessions: Sessions::new(options.session_lapse, options.max_sessions),
            control: Control::new(options.control_lapse),
        }),
        events: broadcast::channel(256).0,
        status: watch::channel(None).0,
        poke: Notify::new(),
        metrics: WebMetrics::default(),
        conns: Arc::new(Registry::default()),
        shutdown: shutdown_rx,
        options,
    });
    tracing::info!(
        "web: serving on http://{local}/ ({})",
        if shared.token_required() { "acting needs the access token" } else { "no access token" }
    );
    let pump = tokio::spawn(status_pump(shared.clone()));
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let admission = shared.conns.admit(
                        peer.ip(),
                        shared.options.max_connections,
                        shared.options.max_idle_per_ip,
                        Instant::now(),
                    );
                    if admission.evicted > 0 {
                        shared.metrics.refused(Refusal::Evicted, admission.evicted);
                        tracing::debug!(evicted = admission.evicted, "web: closed waiting connections to make room");
                    }
                    match admission.conn {
                        Some(conn) => {
                            connections.spawn(connection(shared.clone(), stream, peer, conn));
                        }
                        None => {
                            shared.metrics.refused(Refusal::Busy, 1);
                            connections.spawn(refuse_busy(stream));
                        }
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, do not spin.
                    tracing::warn!("web: accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    tracing::info!("web: shutting down");
    shutdown_tx.send_replace(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} }).await;
    connections.abort_all();
    pump.abort();
    Ok(())
}

/// Answers 503 to a connection there is no room for.
async fn refuse_busy(mut stream: TcpStream) {
    let busy = Response::error(
        503,
        "the web server has too many connections busy with requests or logged-in event streams; try again later",
    );
    let _ = write_all(&mut stream, &busy.to_bytes(true)).await;
    linger(stream).await;
}

/// Calls the backend for the status every interval (or when poked) while event streams are
/// open, and checks whether control lapsed.
async fn status_pump(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.options.status_interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.poke.notified() => {}
            _ = stopping(&mut shutdown) => return,
        }
        shared.expire_control();
        if shared.metrics.sse_clients() == 0 {
            continue;
        }
        if let Ok(status) = shared.status().await {
            shared.status.send_replace(Some(sse_event("status", &status.to_string()).into()));
        }
    }
}

/// Completes when the server is stopping.
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    // The `Ref` it returns must not live across an await: drop it here.
    let _ = shutdown.wait_for(|stop| *stop).await.map(drop);
}

/// What reading a request gave.
enum ReadOutcome {
    Request(Request),
    /// The peer closed or went idle, the server is stopping, or the connection was closed to
    /// make room.
    Closed,
    /// The bytes are not an acceptable request.
    Refused(HttpError),
    /// The request did not arrive whole within the request timeout.
    TimedOut,
}

async fn write_all(stream: &mut (impl AsyncWriteExt + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read")),
    }
}

/// Reads one request into `buf` (which keeps bytes of the next one, if pipelined). Waiting for
/// a request's first byte, the connection is idle (`idle_timeout`); from its first byte, the
/// whole request must arrive within `request_timeout`.
async fn read_request(
    shared: &Shared,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    shutdown: &mut watch::Receiver<bool>,
    conn: &Conn,
) -> ReadOutcome {
    let limits = Limits { max_head: shared.options.max_head_bytes, max_body: shared.options.max_body_bytes };
    let mut continue_sent = false;
    let now = tokio::time::Instant::now();
    let idle_deadline = now + shared.options.idle_timeout;
    // Blank lines before a request (some clients send one after a body) do not begin one.
    let begun = |buf: &[u8]| buf.iter().any(|&b| b != b'\r' && b != b'\n');
    let mut started = begun(buf).then_some(now);
    conn.set(if started.is_some() { Phase::Reading } else { Phase::Idle });
    loop {
        if !buf.is_empty() {
            match parse_request(buf, &limits) {
                Ok(Progress::Done(request, used)) => {
                    buf.drain(..used);
                    return ReadOutcome::Request(request);
                }
                Ok(Progress::NeedMore { expect_continue }) => {
                    if expect_continue && !continue_sent {
                        continue_sent = true;
                        if write_all(stream, b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                            return ReadOutcome::Closed;
                        }
                    }
                }
                Err(e) => return ReadOutcome::Refused(e),
            }
        }
        let deadline = started.map_or(idle_deadline, |t| t + shared.options.request_timeout);
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, stream.read(chunk)) => read,
            _ = stopping(shutdown) => return ReadOutcome::Closed,
            _ = conn.evicted() => return ReadOutcome::Closed,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {
                buf.extend_from_slice(&chunk[..n]);
                if started.is_none() && begun(buf) {
                    started = Some(tokio::time::Instant::now());
                    conn.set(Phase::Reading);
                }
            }
            Ok(_) => return ReadOutcome::Closed,
            Err(_) if started.is_some() => return ReadOutcome::TimedOut,
            Err(_) => return ReadOutcome::Closed,
        }
    }
}

/// Writes a response unless the connection is told to close (to make room) first.
async fn write_response(stream: &mut TcpStream, conn: &Conn, bytes: &[u8]) -> bool {
    conn.set(Phase::Writing);
    tokio::select! {
        written = write_all(stream, bytes) => written.is_ok(),
        _ = conn.evicted() => false,
    }
}

/// Closes a connection after an error response: stops writing, then reads and drops what the
/// client still sends (a refused body) for a moment, so that closing does not reset the
/// connection before the client has read the response.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 8192];
    let mut drained = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while drained < 4 * 1024 * 1024 {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}

/// What a route answers.
enum Reply {
    Response(Response),
    /// `GET /api/events`, for this session.
    Events {
        session: Option<String>,
    },
    /// `GET /api/listen`.
    Listen {
        service: String,
        session: Option<String>,
    },
}

impl From<Response> for Reply {
    fn from(r: Response) -> Reply {
        Reply::Response(r)
    }
}

/// Serves one connection: requests one after the other until either side closes.
async fn connection(shared: Arc<Shared>, mut stream: TcpStream, peer: SocketAddr, conn: Conn) {
    let _ = stream.set_nodelay(true);
    let mut shutdown = shared.shutdown.clone();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let request = match read_request(&shared, &mut stream, &mut buf, &mut chunk, &mut shutdown, &conn).await {
            ReadOutcome::Request(r) => r,
            ReadOutcome::Closed => return,
            ReadOutcome::Refused(e) => {
                shared.metrics.request();
                tracing::debug!("web: refused a request: {e}");
                let _ = write_response(&mut stream, &conn, &Response::error(e.status(), e.to_string()).to_bytes(true))
                    .await;
                linger(stream).await;
                return;
            }
            ReadOutcome::TimedOut => {
                shared.metrics.request();
                shared.metrics.refused(Refusal::Timeout, 1);
                tracing::debug!(%peer, "web: a request did not arrive whole in time");
                let timeout = Response::error(
                    408,
                    format!(
                        "the request did not arrive whole within {:?} of its first byte",
                        shared.options.request_timeout
                    ),
                );
                let _ = write_response(&mut stream, &conn, &timeout.to_bytes(true)).await;
                linger(stream).await;
                return;
            }
        };
        shared.metrics.request();
        conn.set(Phase::Busy);
        let close = request.wants_close() || *shutdown.borrow();
        match route(&shared, &request, peer).await {
            Reply::Response(response) => {
                if !write_response(&mut stream, &conn, &response.to_bytes(close)).await || close {
                    return;
                }
            }
            Reply::Events { session } => return events_stream(&shared, stream, session, &conn).await,
            Reply::Listen { service, session } => {
                return listen_stream(&shared, stream, service, session, &conn).await;
            }
        }
    }
}

fn method_not_allowed(request: &Request, allow: &'static str) -> Response {
    Response::error(405, format!("{} is not allowed on {} (allowed: {allow})", request.method, request.path))
        .with_header("Allow", allow)
}

/// The JSON body of a request (`null` when empty).
fn json_body(request: &Request) -> Result<Value, Response> {
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&request.body)
        .map_err(|e| Response::error(400, format!("the request body is not valid JSON: {e}")))
}

/// The JSON body of a request that takes an object with the fields `known` (`shape` shows it
/// in error messages); an empty body or `null` is an empty object.
fn object_body(request: &Request, known: &[&str], shape: &str) -> Result<Map<String, Value>, Response> {
    let map = match json_body(request)? {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        other => {
            let kind = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            };
            return Err(Response::error(400, format!("the body must be a JSON object, {shape}, not {kind}")));
        }
    };
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        let fields = if known.is_empty() {
            "none".to_owned()
        } else {
            known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        };
        return Err(Response::error(400, format!("unknown field `{unknown}` in the body (known: {fields}): {shape}")));
    }
    Ok(map)
}

/// A backend error as a response: 404, 400 or 500.
fn backend_error(e: BackendError) -> Response {
    match e {
        BackendError::NotFound(text) => Response::error(404, text),
        BackendError::Invalid(text) => Response::error(400, text),
        BackendError::Failed(text) => Response::error(500, text),
    }
}

/// The error text of a backend method without error kinds: a 500.
fn backend_failed(text: String) -> Response {
    Response::error(500, text)
}

fn holder_refusal(status: u16, message: String, holder: &Holder) -> Response {
    Response::json(status, &json!({ "error": message, "holder": label(holder.label), "since_ms": holder.since_ms }))
}

/// The `Host` check: 400 without one (HTTP/1.1), 421 when it names another host.
fn check_host<'r>(shared: &Shared, request: &'r Request) -> Result<Option<&'r str>, Response> {
    let mut hosts = request.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v.as_str());
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Response::error(400, "more than one Host header field"));
    }
    match host {
        None if request.version == Version::Http10 => Ok(None),
        None => Err(Response::error(400, "an HTTP/1.1 request needs a Host header field")),
        Some(h) if shared.hosts.allows(h) => Ok(Some(h)),
        Some(h) => Err(Response::error(
            421,
            format!(
                "this server does not answer for the Host `{h}`: use the address it printed (or 127.0.0.1, \
                 localhost, [::1] with its port), or add the name to the web server's allowed hosts"
            ),
        )),
    }
}

/// The `Origin` check: a request sent by a page of another origin is refused.
fn check_origin(request: &Request, host: Option<&str>) -> Result<(), Response> {
    let mut origins = request.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("origin")).map(|(_, v)| v.as_str());
    let Some(origin) = origins.next() else { return Ok(()) };
    if origins.next().is_none() && host.is_some_and(|h| origin_matches(origin, h)) {
        return Ok(());
    }
    Err(Response::error(
        403,
        format!(
            "the request comes from a page of another origin (Origin `{origin}`); only this server's own pages \
             may act on it or open its event streams"
        ),
    ))
}

/// What a client without a (logged-in) session is told.
fn login_hint(shared: &Shared) -> String {
    if shared.token_required() {
        "open the URL the operator printed (http://HOST:PORT/?token=…), or POST /api/login with \
         {\"token\": \"…\"} and send the cookie daqflow_session it sets"
            .to_owned()
    } else {
        "load the UI (GET /) or POST /api/login to get a session, and send the cookie daqflow_session it sets"
            .to_owned()
    }
}

/// The caller's session if it may act; else a 403 that says how to get one.
fn need_session(shared: &Shared, session: Option<&str>) -> Result<String, Response> {
    match session {
        Some(id) if shared.may_act(Some(id)) => Ok(id.to_owned()),
        _ => {
            shared.metrics.refused(Refusal::NoSession, 1);
            let what = if shared.token_required() {
                "this needs a session logged in with the web token (without one you may only watch)"
            } else {
                "this needs a session"
            };
            Err(Response::error(403, format!("{what}: {}", login_hint(shared))))
        }
    }
}

/// Routes one request.
async fn route(shared: &Arc<Shared>, request: &Request, peer: SocketAddr) -> Reply {
    let host = match check_host(shared, request) {
        Ok(h) => h,
        Err(response) => {
            shared.metrics.refused(Refusal::BadHost, 1);
            tracing::debug!(%peer, "web: refused a request for another Host");
            return response.into();
        }
    };
    let path = request.path.as_str();
    let get = request.method == "GET";
    let post = request.method == "POST";
    let asset = ui::asset(path);
    let is_page = asset.is_some_and(|a| a.content_type.starts_with("text/html"));
    // The UI's files are open to any page (they hold nothing); everything else is not.
    if asset.is_none()
        && let Err(response) = check_origin(request, host)
    {
        shared.metrics.refused(Refusal::BadOrigin, 1);
        tracing::debug!(%peer, "web: refused a request from another origin");
        return response.into();
    }
    if post && request.header(CLIENT_HEADER).is_none() {
        return Response::error(
            400,
            format!("a POST needs the header {CLIENT_HEADER} (any value, e.g. `{CLIENT_HEADER}: 1`); see docs/web.md"),
        )
        .into();
    }
    let session = shared.caller(request);
    shared.expire_control();
    let login = (path == "/api/login") || (is_page && request.query("token").is_some());
    if shared.options.token_to_watch && asset.is_none() && !login && !shared.may_act(session.as_deref()) {
        shared.metrics.refused(Refusal::NoSession, 1);
        return Response::error(
            403,
            format!("this server lets only sessions logged in with the web token watch: {}", login_hint(shared)),
        )
        .into();
    }

    let reply: Reply = match path {
        "/api/status" if get => match shared.status().await {
            Ok(status) => Response::json(200, &status).into(),
            Err(r) => r.into(),
        },
        "/api/events" if get => Reply::Events { session },
        "/api/control" if get => Response::json(200, &shared.control_json(session.as_deref())).into(),
        "/api/login" if post => api_login(shared, request, session.as_deref(), peer).into(),
        "/api/control/take" if post => take_control(shared, request, session.as_deref()).into(),
        "/api/control/release" if post => release_control(shared, session.as_deref()).into(),
        "/api/command" if post => send_command(shared, request, session.as_deref()).await.into(),
        "/api/processes" if get => match backend_call(shared, |b| b.processes()).await {
            Ok(Ok(v)) => Response::json(200, &v).into(),
            Ok(Err(text)) => backend_failed(text).into(),
            Err(r) => r.into(),
        },
        "/api/listen" if get => match request.query("service") {
            Some(service) if !service.is_empty() => Reply::Listen { service: service.to_owned(), session },
            _ => Response::error(400, "the query parameter `service` (the service's name) is missing").into(),
        },
        "/api/logs" if get => logs(shared, request).await.into(),
        "/api/runs" if get => runs(shared, request).await.into(),
        "/api/histograms" if get => match backend_call(shared, |b| b.histograms()).await {
            Ok(v) => Response::json(200, &v).into(),
            Err(r) => r.into(),
        },
        "/api/et" if get => match backend_call(shared, |b| b.et()).await {
            Ok(v) => Response::json(200, &v).into(),
            Err(r) => r.into(),
        },
        "/metrics" if get => match backend_call(shared, |b| b.metrics()).await {
            Ok(mut text) => {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&shared.metrics.prometheus());
                Response::new(200, "text/plain; version=0.0.4; charset=utf-8", text).into()
            }
            Err(r) => r.into(),
        },
        "/api/status" | "/api/events" | "/api/control" | "/api/processes" | "/api/listen" | "/api/logs"
        | "/api/runs" | "/api/histograms" | "/api/et" | "/metrics" => method_not_allowed(request, "GET").into(),
        "/api/login" | "/api/control/take" | "/api/control/release" | "/api/command" => {
            method_not_allowed(request, "POST").into()
        }
        _ => {
            if let Some(verb) = path.strip_prefix("/api/transition/") {
                if !post {
                    method_not_allowed(request, "POST").into()
                } else {
                    transition(shared, request, verb, session.as_deref()).await.into()
                }
            } else if let Some(run) = path.strip_prefix("/api/runs/") {
                if !get { method_not_allowed(request, "GET").into() } else { one_run(shared, run).await.into() }
            } else if let Some(asset) = asset {
                if !get {
                    method_not_allowed(request, "GET").into()
                } else if let (true, Some(token)) = (is_page, request.query("token")) {
                    token_login(shared, token, session.as_deref(), peer).into()
                } else {
                    let mut r =
                        Response::new(200, asset.content_type, asset.body).with_header("Cache-Control", "no-cache");
                    if is_page {
                        r = r
                            .with_header("Content-Security-Policy", ui::CONTENT_SECURITY_POLICY)
                            .with_header("X-Frame-Options", "DENY")
                            .with_header("Referrer-Policy", "no-referrer");
                        // Without a token, the page's first visit gets an anonymous session.
                        if !shared.token_required() && session.is_none() {
                            match shared.new_session() {
                                Ok((id, _)) => r = r.with_header("Set-Cookie", set_cookie(&id)),
                                Err(e) => return e.into(),
                            }
                        }
                    }
                    r.into()
                }
            } else {
                Response::error(404, format!("no such resource: {path} (the API is described in docs/web.md)")).into()
            }
        }
    };
    reply
}

/// Whether `given` is the access token (always true without one).
fn token_is_right(shared: &Shared, given: &str) -> bool {
    shared.options.access_token.as_ref().is_none_or(|t| constant_time_eq(t.as_bytes(), given.as_bytes()))
}

/// A login with a wrong token: counted, logged, refused.
fn login_refused(shared: &Shared, peer: SocketAddr) -> Response {
    shared.metrics.refused(Refusal::LoginFailure, 1);
    tracing::warn!(%peer, "web: a login with a wrong token was refused");
    Response::error(
        403,
        "wrong token: use the one the operator printed in its web UI URL (also in <data dir>/web-token)",
    )
}

/// The session a successful login gives: the caller's own if it already may act, else a new one.
fn login_session(shared: &Shared, session: Option<&str>) -> Result<(String, u64), Response> {
    if let Some(id) = session
        && shared.may_act(Some(id))
        && let Some(n) = shared.label_of(id)
    {
        return Ok((id.to_owned(), n));
    }
    let (id, n) = shared.new_session()?;
    tracing::info!(client = label(n), "web: a client logged in");
    Ok((id, n))
}

/// `GET /?token=T`: the session cookie, and a redirect to `/` that takes the token out of the
/// address bar.
fn token_login(shared: &Shared, token: &str, session: Option<&str>, peer: SocketAddr) -> Response {
    if !token_is_right(shared, token) {
        return login_refused(shared, peer);
    }
    match login_session(shared, session) {
        Ok((id, _)) => Response::new(303, "text/plain; charset=utf-8", "logged in; go to /\n")
            .with_header("Location", "/")
            .with_header("Set-Cookie", set_cookie(&id))
            .with_header("Referrer-Policy", "no-referrer"),
        Err(r) => r,
    }
}

/// `POST /api/login` `{"token": "…"}`.
fn api_login(shared: &Shared, request: &Request, session: Option<&str>, peer: SocketAddr) -> Response {
    const SHAPE: &str = "{\"token\": \"…\"}";
    let body = match object_body(request, &["token"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let given = match body.get("token") {
        Some(Value::String(t)) => Some(t.as_str()),
        None | Some(Value::Null) => None,
        Some(_) => return Response::error(400, format!("`token` must be a string: {SHAPE}")),
    };
    if shared.token_required() {
        let Some(given) = given else {
            return Response::error(400, format!("the body must give the web token: {SHAPE}"));
        };
        if !token_is_right(shared, given) {
            return login_refused(shared, peer);
        }
    }
    match login_session(shared, session) {
        Ok((id, n)) => Response::json(200, &json!({ "me": label(n), "may_control": true }))
            .with_header("Set-Cookie", set_cookie(&id)),
        Err(r) => r,
    }
}

fn take_control(shared: &Arc<Shared>, request: &Request, session: Option<&str>) -> Response {
    let session = match need_session(shared, session) {
        Ok(s) => s,
        Err(r) => return r,
    };
    const SHAPE: &str = "{\"force\": false}";
    let force = match object_body(request, &["force"], SHAPE) {
        Ok(body) => match body.get("force") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(f)) => *f,
            Some(_) => return Response::error(400, format!("`force` must be true or false: {SHAPE}")),
        },
        Err(r) => return r,
    };
    let result = {
        let mut clients = shared.clients();
        let Some(n) = clients.sessions.get(&session, Instant::now()).map(|s| s.label) else {
            return Response::error(403, format!("your session just ended: {}", login_hint(shared)));
        };
        clients.control.take(&session, n, force, now_ms()).map(|changed| (changed, n))
    };
    match result {
        Ok((changed, n)) => {
            if changed {
                tracing::info!(client = label(n), force, "web: a client took control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(&session)))
        }
        Err(holder) => holder_refusal(
            409,
            format!(
                "{} controls since {} (Unix ms); take over with \"force\": true",
                label(holder.label),
                holder.since_ms
            ),
            &holder,
        ),
    }
}

fn release_control(shared: &Arc<Shared>, session: Option<&str>) -> Response {
    let session = match need_session(shared, session) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let result = shared.clients().control.release(&session);
    match result {
        Ok(changed) => {
            if changed {
                tracing::info!(client = shared.label_of(&session).map(label), "web: a client released control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(&session)))
        }
        Err(holder) => {
            holder_refusal(403, format!("you do not control: {} does; it may release", label(holder.label)), &holder)
        }
    }
}

/// Refuses a request of a session that does not control.
fn require_control(shared: &Shared, session: &str) -> Result<(), Response> {
    let clients = shared.clients();
    match clients.control.holder() {
        Some(h) if h.session == session => Ok(()),
        Some(h) => Err(holder_refusal(
            403,
            format!(
                "you do not control the run: {} does; take control first (POST /api/control/take, \
                 with \"force\": true to take it over)",
                label(h.label)
            ),
            h,
        )),
        None => Err(Response::error(
            403,
            "you do not control the run: nobody does; take control first (POST /api/control/take)",
        )),
    }
}

/// The argument of a transition, checked: `start` takes `{"run": N}` (N from 1 to
/// 4294967295, optional); the others take nothing (an empty body, `null` or `{}`).
fn transition_arg(request: &Request, verb: &str) -> Result<Value, Response> {
    if verb == "start" {
        const SHAPE: &str = "{\"run\": N} with N from 1 to 4294967295, or nothing for the next run";
        let body = object_body(request, &["run"], SHAPE)?;
        match body.get("run") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|r| (1..=u64::from(u32::MAX)).contains(&r)) => {}
            Some(other) => {
                return Err(Response::error(400, format!("`run` must be a run number, not {other}: {SHAPE}")));
            }
        }
        Ok(if body.is_empty() { Value::Null } else { Value::Object(body) })
    } else {
        object_body(request, &[], &format!("`{verb}` takes no argument (send no body, or {{}})"))?;
        Ok(Value::Null)
    }
}

async fn transition(shared: &Arc<Shared>, request: &Request, verb: &str, session: Option<&str>) -> Response {
    let session = match need_session(shared, session) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if !VERBS.contains(&verb) {
        return Response::error(404, format!("unknown transition `{verb}` (known: {})", VERBS.join(", ")));
    }
    if let Err(r) = require_control(shared, &session) {
        return r;
    }
    let arg = match transition_arg(request, verb) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let client = shared.label_of(&session).map(label).unwrap_or_default();
    tracing::info!(client, verb, %arg, "web: transition");
    shared.poke.notify_one();
    let owned_verb = verb.to_owned();
    let result = backend_call(shared, move |b| b.transition(&owned_verb, arg)).await;
    shared.poke.notify_one();
    let (response, event) = match result {
        Err(r) => (r, json!({"verb": verb, "client": client, "ok": false, "error": "the backend failed"})),
        Ok(Ok(result)) => (
            Response::json(200, &json!({"verb": verb, "result": result})),
            json!({"verb": verb, "client": client, "ok": true, "result": result}),
        ),
        Ok(Err(text)) => (
            Response::json(409, &json!({"verb": verb, "error": text})),
            json!({"verb": verb, "client": client, "ok": false, "error": text}),
        ),
    };
    let _ = shared.events.send(Broadcast::Event(sse_event("transition", &event.to_string()).into()));
    response
}

async fn send_command(shared: &Arc<Shared>, request: &Request, session: Option<&str>) -> Response {
    let session = match need_session(shared, session) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Err(r) = require_control(shared, &session) {
        return r;
    }
    const SHAPE: &str = "{\"name\": COMMAND, \"data\": TEXT}";
    let body = match object_body(request, &["name", "data"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let name = match body.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        None | Some(Value::Null) => return Response::error(400, format!("`name` (the command) is missing: {SHAPE}")),
        Some(_) => return Response::error(400, format!("`name` must be a non-empty string: {SHAPE}")),
    };
    let data = match body.get("data") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    tracing::info!(client = shared.label_of(&session).map(label), name, "web: command");
    let command = name.clone();
    match backend_call(shared, move |b| b.send_command(&command, &data)).await {
        Ok(Ok(received)) => Response::json(200, &json!({"name": name, "received": received})),
        Ok(Err(e)) => backend_error(e),
        Err(r) => r,
    }
}

/// A non-empty query parameter.
fn param<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.query(name).filter(|v| !v.is_empty())
}

fn number_param<T: std::str::FromStr>(request: &Request, name: &str) -> Result<Option<T>, Response> {
    match param(request, name) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| Response::error(400, format!("`{name}` must be a non-negative integer, not `{v}`"))),
    }
}

/// Parses the message browser's filter from the query.
fn log_filter(request: &Request) -> Result<LogFilter, Response> {
    let min_severity = param(request, "min_severity").map(str::to_ascii_lowercase);
    if let Some(s) = &min_severity
        && !SEVERITIES.contains(&s.as_str())
    {
        return Err(Response::error(
            400,
            format!("`min_severity` must be one of {}, not `{s}`", SEVERITIES.join(", ")),
        ));
    }
    Ok(LogFilter {
        since_ms: number_param(request, "since_ms")?,
        until_ms: number_param(request, "until_ms")?,
        process: param(request, "process").map(str::to_owned),
        min_severity,
        text: param(request, "text").map(str::to_owned),
        limit: Some(number_param(request, "limit")?.unwrap_or(LOGS_DEFAULT_LIMIT).min(LOGS_MAX_LIMIT)),
    })
}

async fn logs(shared: &Arc<Shared>, request: &Request) -> Response {
    let filter = match log_filter(request) {
        Ok(f) => f,
        Err(r) => return r,
    };
    match backend_call(shared, move |b| b.logs(&filter)).await {
        Ok(Ok(v)) => Response::json(200, &v),
        Ok(Err(text)) => backend_failed(text),
        Err(r) => r,
    }
}

async fn runs(shared: &Arc<Shared>, request: &Request) -> Response {
    let limit = match number_param::<usize>(request, "limit") {
        Ok(l) => l.unwrap_or(RUNS_DEFAULT_LIMIT).min(RUNS_MAX_LIMIT),
        Err(r) => return r,
    };
    match backend_call(shared, move |b| b.runs(limit)).await {
        Ok(Ok(v)) => Response::json(200, &v),
        Ok(Err(text)) => backend_failed(text),
        Err(r) => r,
    }
}

async fn one_run(shared: &Arc<Shared>, run: &str) -> Response {
    let Ok(number) = run.parse::<u32>() else {
        return Response::error(400, format!("`{run}` is not a run number"));
    };
    match backend_call(shared, move |b| b.run(number)).await {
        Ok(Ok(Some(v))) => Response::json(200, &v),
        Ok(Ok(None)) => Response::error(404, format!("no run {number} in the run database")),
        Ok(Err(text)) => backend_failed(text),
        Err(r) => r,
    }
}

/// The head of an event-stream response, and the reconnection delay the browser should use.
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
X-Content-Type-Options: nosniff\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n";

/// Counts an open event stream (metrics, and its session as used) until dropped.
struct StreamGuard {
    shared: Arc<Shared>,
    session: Option<String>,
}

impl StreamGuard {
    /// Also tells the connection registry what the connection is now: a stream, spared when it
    /// is a logged-in session's.
    fn new(shared: &Arc<Shared>, session: Option<String>, conn: &Conn) -> StreamGuard {
        shared.metrics.sse_opened();
        if let Some(id) = &session {
            shared.clients().sessions.stream_opened(id, Instant::now());
        }
        let spared = shared.token_required() && shared.may_act(session.as_deref());
        conn.set(Phase::Stream { spared });
        StreamGuard { shared: shared.clone(), session }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.shared.metrics.sse_closed();
        if let Some(id) = &self.session {
            self.shared.clients().sessions.stream_closed(id, Instant::now());
        }
    }
}

/// `GET /api/events`: control, status and transition events until the client goes.
async fn events_stream(shared: &Arc<Shared>, mut stream: TcpStream, session: Option<String>, conn: &Conn) {
    let _guard = StreamGuard::new(shared, session.clone(), conn);
    let mut events = shared.events.subscribe();
    let mut status = shared.status.subscribe();
    status.mark_unchanged();
    let mut shutdown = shared.shutdown.clone();
    let (mut reader, mut writer) = stream.split();
    let control = || sse_event("control", &shared.control_json(session.as_deref()).to_string());
    let mut first = String::from_utf8_lossy(SSE_HEAD).into_owned();
    first.push_str(&control());
    if write_all(&mut writer, first.as_bytes()).await.is_err() {
        return;
    }
    // A fresh status at once, not the last one the pump fetched.
    if let Ok(now) = shared.status().await
        && write_all(&mut writer, sse_event("status", &now.to_string()).as_bytes()).await.is_err()
    {
        return;
    }
    let mut keepalive = tokio::time::interval(shared.options.keepalive_interval.max(Duration::from_millis(10)));
    keepalive.tick().await;
    let mut scratch = [0u8; 512];
    loop {
        let message: Arc<str> = tokio::select! {
            changed = status.changed() => match changed {
                Ok(()) => match status.borrow_and_update().clone() {
                    Some(m) => m,
                    None => continue,
                },
                Err(_) => return,
            },
            event = events.recv() => match event {
                Ok(Broadcast::Event(m)) => m,
                // Missed some: what matters is who controls now.
                Ok(Broadcast::Control) | Err(broadcast::error::RecvError::Lagged(_)) => control().into(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = keepalive.tick() => ": keep-alive\n\n".into(),
            read = reader.read(&mut scratch) => match read {
                Ok(n) if n > 0 => continue,
                _ => return,
            },
            _ = stopping(&mut shutdown) => return,
            _ = conn.evicted() => return,
        };
        if write_all(&mut writer, message.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// `GET /api/listen?service=NAME`: the service's values until the client goes; then the
/// subscription is dropped.
async fn listen_stream(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    service: String,
    session: Option<String>,
    conn: &Conn,
) {
    let (tx, mut values) = mpsc::unbounded_channel();
    let name = service.clone();
    let subscription = match backend_call(shared, move |b| b.listen(&name, tx)).await {
        Ok(Ok(guard)) => guard,
        Ok(Err(e)) => {
            let _ = write_response(&mut stream, conn, &backend_error(e).to_bytes(true)).await;
            return;
        }
        Err(r) => {
            let _ = write_response(&mut stream, conn, &r.to_bytes(true)).await;
            return;
        }
    };
    tracing::debug!(service, "web: listening");
    let guard = StreamGuard::new(shared, session, conn);
    let mut shutdown = shared.shutdown.clone();
    let (mut reader, mut writer) = stream.split();
    let mut head = String::from_utf8_lossy(SSE_HEAD).into_owned();
    head.push_str(&sse_event("subscribed", &json!({ "service": service }).to_string()));
    let mut alive = write_all(&mut writer, head.as_bytes()).await.is_ok();
    let mut keepalive = tokio::time::interval(shared.options.keepalive_interval.max(Duration::from_millis(10)));
    keepalive.tick().await;
    let mut scratch = [0u8; 512];
    while alive {
        let message = tokio::select! {
            value = values.recv() => match value {
                Some(v) => sse_event("value", &v),
                None => {
                    // The backend ended the subscription (the provider went away for good).
                    let _ = write_all(&mut writer, sse_event("end", &json!({ "service": service }).to_string()).as_bytes()).await;
                    break;
                }
            },
            _ = keepalive.tick() => ": keep-alive\n\n".to_owned(),
            read = reader.read(&mut scratch) => match read {
                Ok(n) if n > 0 => continue,
                _ => break,
            },
            _ = stopping(&mut shutdown) => break,
            _ = conn.evicted() => break,
        };
        alive = write_all(&mut writer, message.as_bytes()).await.is_ok();
    }
    drop(guard);
    tracing::debug!(service, "web: stopped listening");
    // Unsubscribing may talk to the control plane: not on this thread.
    let _ = tokio::task::spawn_blocking(move || drop(subscription)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_put_each_line_on_a_data_line() {
        assert_eq!(sse_event("status", "{\"a\":1}"), "event: status\ndata: {\"a\":1}\n\n");
        assert_eq!(sse_event("value", "a\r\nb\rc\nd"), "event: value\ndata: a\ndata: b\ndata: c\ndata: d\n\n");
        assert_eq!(sse_event("value", ""), "event: value\ndata: \n\n");
    }
}
