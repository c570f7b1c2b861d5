//! The server: accepting connections, reading requests, routing them to the backend, event
//! streams, and the status pump that feeds them.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast, mpsc, watch};

use crate::control::{Control, Holder, valid_client_id};
use crate::http::{HttpError, Limits, Progress, Request, Response, parse_request};
use crate::metrics::WebMetrics;
use crate::{Backend, LogFilter, WebError, WebOptions, ui};

/// The header that names the client.
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

/// What every connection shares.
struct Shared {
    backend: Arc<dyn Backend>,
    options: WebOptions,
    control: Mutex<Control>,
    /// Control and transition events, formatted, for every event stream.
    events: broadcast::Sender<Arc<str>>,
    /// The latest status event, formatted.
    status: watch::Sender<Option<Arc<str>>>,
    /// Asks the status pump for a fresh status now.
    poke: Notify,
    metrics: WebMetrics,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    fn control(&self) -> MutexGuard<'_, Control> {
        // The lock is held for a few map operations that cannot panic half-way; a poisoned lock
        // still holds a consistent state.
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `control` event's data (also the body of `GET /api/control`).
    fn control_json(&self, client: Option<&str>) -> Value {
        let control = self.control();
        let holder = control.holder();
        json!({
            "controller": holder.map(|h| h.client.clone()),
            "since_ms": holder.map(|h| h.since_ms),
            "you": client.is_some_and(|c| control.holds(c)),
        })
    }

    /// Tells every event stream who controls now.
    fn publish_control(&self) {
        let holder = self.control().holder().cloned();
        let data = json!({
            "controller": holder.as_ref().map(|h| h.client.clone()),
            "since_ms": holder.as_ref().map(|h| h.since_ms),
        });
        // No receivers (no stream open) is not an error.
        let _ = self.events.send(sse_event("control", &data.to_string()).into());
    }

    /// Lets an unseen controller's control lapse, and tells the streams if it did.
    fn expire_control(&self) {
        let lapsed = self.control().expire(Instant::now());
        if lapsed {
            tracing::info!(
                "web: the controlling client was not seen for {:?}: control lapsed",
                self.options.control_lapse
            );
            self.publish_control();
        }
    }

    /// The `web` object added to the status.
    fn web_json(&self) -> Value {
        let control = self.control();
        let holder = control.holder();
        json!({
            "requests_total": self.metrics.requests_total(),
            "sse_clients": self.metrics.sse_clients(),
            "controller": holder.map(|h| h.client.clone()),
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
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        backend,
        control: Mutex::new(Control::new(options.control_lapse)),
        events: broadcast::channel(256).0,
        status: watch::channel(None).0,
        poke: Notify::new(),
        metrics: WebMetrics::default(),
        shutdown: shutdown_rx,
        options,
    });
    if let Ok(addr) = listener.local_addr() {
        tracing::info!("web: serving on http://{addr}/");
    }
    let pump = tokio::spawn(status_pump(shared.clone()));
    let slots = Arc::new(Semaphore::new(shared.options.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let permit = slots.clone().try_acquire_owned().ok();
                    connections.spawn(connection(shared.clone(), stream, permit));
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
    /// The peer closed, went idle, or the server is stopping.
    Closed,
    /// The bytes are not an acceptable request.
    Refused(HttpError),
}

async fn write_all(stream: &mut (impl AsyncWriteExt + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read")),
    }
}

/// Reads one request into `buf` (which keeps bytes of the next one, if pipelined).
async fn read_request(
    shared: &Shared,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    chunk: &mut [u8],
    shutdown: &mut watch::Receiver<bool>,
) -> ReadOutcome {
    let limits = Limits { max_head: shared.options.max_head_bytes, max_body: shared.options.max_body_bytes };
    let mut continue_sent = false;
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
        let read = tokio::select! {
            read = tokio::time::timeout(shared.options.idle_timeout, stream.read(chunk)) => read,
            _ = stopping(shutdown) => return ReadOutcome::Closed,
        };
        match read {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return ReadOutcome::Closed,
        }
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
    /// `GET /api/events`.
    Events {
        client: Option<String>,
    },
    /// `GET /api/listen`.
    Listen {
        service: String,
        client: Option<String>,
    },
}

impl From<Response> for Reply {
    fn from(r: Response) -> Reply {
        Reply::Response(r)
    }
}

/// Serves one connection: requests one after the other until either side closes.
async fn connection(shared: Arc<Shared>, mut stream: TcpStream, permit: Option<OwnedSemaphorePermit>) {
    let _ = stream.set_nodelay(true);
    if permit.is_none() {
        let busy = Response::error(503, "the web server has too many connections; try again later");
        let _ = write_all(&mut stream, &busy.to_bytes(true)).await;
        linger(stream).await;
        return;
    }
    let mut shutdown = shared.shutdown.clone();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let request = match read_request(&shared, &mut stream, &mut buf, &mut chunk, &mut shutdown).await {
            ReadOutcome::Request(r) => r,
            ReadOutcome::Closed => return,
            ReadOutcome::Refused(e) => {
                shared.metrics.request();
                tracing::debug!("web: refused a request: {e}");
                let _ = write_all(&mut stream, &Response::error(e.status(), e.to_string()).to_bytes(true)).await;
                linger(stream).await;
                return;
            }
        };
        shared.metrics.request();
        let close = request.wants_close() || *shutdown.borrow();
        match route(&shared, &request).await {
            Reply::Response(response) => {
                if write_all(&mut stream, &response.to_bytes(close)).await.is_err() || close {
                    return;
                }
            }
            Reply::Events { client } => return events_stream(&shared, stream, client).await,
            Reply::Listen { service, client } => return listen_stream(&shared, stream, service, client).await,
        }
    }
}

/// The client id of a request: header `X-Daqflow-Client`, else query parameter `client`.
fn client_of(request: &Request) -> Result<Option<String>, Response> {
    let id = request.header(CLIENT_HEADER).or_else(|| request.query("client"));
    match id {
        None => Ok(None),
        Some(id) if valid_client_id(id) => Ok(Some(id.to_owned())),
        Some(_) => Err(Response::error(
            400,
            format!("invalid client id: use 1 to 64 characters out of A-Z a-z 0-9 - _ . (header {CLIENT_HEADER})"),
        )),
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

/// A backend error text as a response.
fn backend_error(text: String) -> Response {
    Response::error(500, text)
}

fn holder_refusal(status: u16, message: String, holder: &Holder) -> Response {
    Response::json(status, &json!({ "error": message, "controller": holder.client, "since_ms": holder.since_ms }))
}

/// Routes one request.
async fn route(shared: &Arc<Shared>, request: &Request) -> Reply {
    let client = match client_of(request) {
        Ok(c) => c,
        Err(response) => return response.into(),
    };
    if let Some(c) = &client {
        shared.control().seen(c, Instant::now());
    }
    shared.expire_control();

    let path = request.path.as_str();
    let get = request.method == "GET";
    let post = request.method == "POST";
    let reply: Reply = match path {
        "/api/status" if get => match shared.status().await {
            Ok(status) => Response::json(200, &status).into(),
            Err(r) => r.into(),
        },
        "/api/events" if get => Reply::Events { client },
        "/api/control" if get => Response::json(200, &shared.control_json(client.as_deref())).into(),
        "/api/control/take" if post => take_control(shared, request).into(),
        "/api/control/release" if post => release_control(shared, request).into(),
        "/api/command" if post => send_command(shared, request, client).await.into(),
        "/api/processes" if get => match backend_call(shared, |b| b.processes()).await {
            Ok(Ok(v)) => Response::json(200, &v).into(),
            Ok(Err(text)) => backend_error(text).into(),
            Err(r) => r.into(),
        },
        "/api/listen" if get => match request.query("service") {
            Some(service) if !service.is_empty() => Reply::Listen { service: service.to_owned(), client },
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
        "/api/control/take" | "/api/control/release" | "/api/command" => method_not_allowed(request, "POST").into(),
        _ => {
            if let Some(verb) = path.strip_prefix("/api/transition/") {
                if !post {
                    method_not_allowed(request, "POST").into()
                } else {
                    transition(shared, request, verb, client).await.into()
                }
            } else if let Some(run) = path.strip_prefix("/api/runs/") {
                if !get { method_not_allowed(request, "GET").into() } else { one_run(shared, run).await.into() }
            } else if let Some(asset) = ui::asset(path) {
                if !get {
                    method_not_allowed(request, "GET").into()
                } else {
                    let mut r =
                        Response::new(200, asset.content_type, asset.body).with_header("Cache-Control", "no-cache");
                    if asset.content_type.starts_with("text/html") {
                        r = r
                            .with_header("Content-Security-Policy", ui::CONTENT_SECURITY_POLICY)
                            .with_header("X-Frame-Options", "DENY")
                            .with_header("Referrer-Policy", "no-referrer");
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

/// The client id a POST must carry in its header (a custom header also keeps other web sites
/// from posting to the API: browsers send it cross-origin only after a CORS preflight, which
/// this server does not grant).
fn post_client(request: &Request) -> Result<String, Response> {
    match request.header(CLIENT_HEADER) {
        Some(id) if valid_client_id(id) => Ok(id.to_owned()),
        Some(_) => Err(Response::error(
            400,
            format!("invalid {CLIENT_HEADER}: use 1 to 64 characters out of A-Z a-z 0-9 - _ ."),
        )),
        None => Err(Response::error(400, format!("this request needs the header {CLIENT_HEADER}: <client id>"))),
    }
}

fn take_control(shared: &Arc<Shared>, request: &Request) -> Response {
    let client = match post_client(request) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let body = match json_body(request) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let force = match &body {
        Value::Null => false,
        Value::Object(map) => {
            match map.get("client") {
                None | Some(Value::Null) => {}
                Some(Value::String(c)) if *c == client => {}
                Some(_) => {
                    return Response::error(
                        400,
                        format!("`client` in the body differs from the header {CLIENT_HEADER}"),
                    );
                }
            }
            match map.get("force") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(f)) => *f,
                Some(_) => return Response::error(400, "`force` must be true or false"),
            }
        }
        _ => return Response::error(400, "the body must be a JSON object: {\"client\": ID, \"force\": false}"),
    };
    let result = shared.control().take(&client, force, Instant::now(), now_ms());
    match result {
        Ok(changed) => {
            if changed {
                tracing::info!(client, force, "web: a client took control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(&client)))
        }
        Err(holder) => holder_refusal(
            409,
            format!(
                "client `{}` controls since {} (Unix ms); take over with \"force\": true",
                holder.client, holder.since_ms
            ),
            &holder,
        ),
    }
}

fn release_control(shared: &Arc<Shared>, request: &Request) -> Response {
    let client = match post_client(request) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let result = shared.control().release(&client, Instant::now());
    match result {
        Ok(changed) => {
            if changed {
                tracing::info!(client, "web: a client released control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(&client)))
        }
        Err(holder) => {
            holder_refusal(403, format!("you do not control: client `{}` does; it may release", holder.client), &holder)
        }
    }
}

/// Refuses a request of a client that does not control.
fn require_control(shared: &Shared, client: Option<&str>) -> Result<(), Response> {
    let control = shared.control();
    match (client, control.holder()) {
        (Some(c), Some(h)) if h.client == c => Ok(()),
        (_, Some(h)) => Err(holder_refusal(
            403,
            format!(
                "you do not control the run: client `{}` does; take control first (POST /api/control/take, \
                 with \"force\": true to take it over)",
                h.client
            ),
            h,
        )),
        (None, None) => Err(Response::error(
            403,
            format!(
                "you do not control the run: send the header {CLIENT_HEADER} and take control first (POST /api/control/take)"
            ),
        )),
        (Some(_), None) => Err(Response::error(
            403,
            "you do not control the run: nobody does; take control first (POST /api/control/take)",
        )),
    }
}

async fn transition(shared: &Arc<Shared>, request: &Request, verb: &str, client: Option<String>) -> Response {
    if !VERBS.contains(&verb) {
        return Response::error(404, format!("unknown transition `{verb}` (known: {})", VERBS.join(", ")));
    }
    if let Err(r) = require_control(shared, client.as_deref()) {
        return r;
    }
    let arg = match json_body(request) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let client = client.unwrap_or_default();
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
    let _ = shared.events.send(sse_event("transition", &event.to_string()).into());
    response
}

async fn send_command(shared: &Arc<Shared>, request: &Request, client: Option<String>) -> Response {
    if let Err(r) = require_control(shared, client.as_deref()) {
        return r;
    }
    let body = match json_body(request) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let name = match body.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Response::error(400, "the body must be {\"name\": COMMAND, \"data\": TEXT} with a non-empty name"),
    };
    let data = match body.get("data") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    tracing::info!(client = client.as_deref().unwrap_or(""), name, "web: command");
    let command = name.clone();
    match backend_call(shared, move |b| b.send_command(&command, &data)).await {
        Ok(Ok(received)) => Response::json(200, &json!({"name": name, "received": received})),
        Ok(Err(text)) => backend_error(text),
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
        Ok(Err(text)) => backend_error(text),
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
        Ok(Err(text)) => backend_error(text),
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
        Ok(Err(text)) => backend_error(text),
        Err(r) => r,
    }
}

/// The head of an event-stream response, and the reconnection delay the browser should use.
const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
X-Content-Type-Options: nosniff\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n";

/// Counts an open event stream (metrics, and its client as seen) until dropped.
struct StreamGuard {
    shared: Arc<Shared>,
    client: Option<String>,
}

impl StreamGuard {
    fn new(shared: &Arc<Shared>, client: Option<String>) -> StreamGuard {
        shared.metrics.sse_opened();
        if let Some(c) = &client {
            shared.control().stream_opened(c, Instant::now());
        }
        StreamGuard { shared: shared.clone(), client }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.shared.metrics.sse_closed();
        if let Some(c) = &self.client {
            self.shared.control().stream_closed(c, Instant::now());
        }
    }
}

/// `GET /api/events`: control, status and transition events until the client goes.
async fn events_stream(shared: &Arc<Shared>, mut stream: TcpStream, client: Option<String>) {
    let _guard = StreamGuard::new(shared, client.clone());
    let mut events = shared.events.subscribe();
    let mut status = shared.status.subscribe();
    status.mark_unchanged();
    let mut shutdown = shared.shutdown.clone();
    let (mut reader, mut writer) = stream.split();
    let mut first = String::from_utf8_lossy(SSE_HEAD).into_owned();
    let control = shared.control_json(client.as_deref());
    first.push_str(&sse_event("control", &control.to_string()));
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
                Ok(m) => m,
                // Missed some: what matters is who controls now.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    sse_event("control", &shared.control_json(client.as_deref()).to_string()).into()
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = keepalive.tick() => ": keep-alive\n\n".into(),
            read = reader.read(&mut scratch) => match read {
                Ok(n) if n > 0 => continue,
                _ => return,
            },
            _ = stopping(&mut shutdown) => return,
        };
        if write_all(&mut writer, message.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// `GET /api/listen?service=NAME`: the service's values until the client goes; then the
/// subscription is dropped.
async fn listen_stream(shared: &Arc<Shared>, mut stream: TcpStream, service: String, client: Option<String>) {
    let (tx, mut values) = mpsc::unbounded_channel();
    let name = service.clone();
    let subscription = match backend_call(shared, move |b| b.listen(&name, tx)).await {
        Ok(Ok(guard)) => guard,
        Ok(Err(text)) => {
            let _ = write_all(&mut stream, &backend_error(text).to_bytes(true)).await;
            return;
        }
        Err(r) => {
            let _ = write_all(&mut stream, &r.to_bytes(true)).await;
            return;
        }
    };
    tracing::debug!(service, "web: listening");
    let guard = StreamGuard::new(shared, client);
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
