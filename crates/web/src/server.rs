//! The server: accepting connections (and making room when full), reading requests with their
//! deadlines, the status pump, and the event streams. What each request may do and what
//! answers it is the route table's, in [`routes`].

mod failed_logins;
mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daqflow_api::{SystemState, Transition};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, broadcast, mpsc, watch};

use crate::access::Hosts;
use crate::conns::{Conn, Phase, Registry};
use crate::control::Control;
use crate::http::{HttpError, Limits, Progress, Request, Response, parse_request};
use crate::metrics::{Refusal, WebMetrics};
use crate::session::{Sessions, label, new_session_id, session_cookies};
use crate::{Backend, WebError, WebOptions};
use failed_logins::FailedLogins;

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
    /// When the answers to failed logins leave, and what the log said of them.
    failed_logins: Mutex<FailedLogins>,
}

impl Shared {
    /// A login with a wrong token from `peer`: counted, logged (the first of a burst at once,
    /// the rest summed up every ten seconds), and `response` held back (module
    /// [`failed_logins`]).
    fn login_failed(self: &Arc<Self>, peer: SocketAddr, response: Response) -> Reply {
        self.metrics.refused(Refusal::LoginFailure, 1);
        let now = Instant::now();
        let (at, log) = self.failed_logins.lock().unwrap_or_else(|p| p.into_inner()).fail(now, peer.ip());
        match log {
            failed_logins::Log::Now => {
                tracing::warn!(%peer, "web: a login with a wrong token was refused");
            }
            failed_logins::Log::SummaryAt(when) => {
                let shared = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(when)).await;
                    let summary =
                        shared.failed_logins.lock().unwrap_or_else(|p| p.into_inner()).summary(Instant::now());
                    if let Some(s) = summary {
                        let peers: Vec<String> = s.peers.iter().map(ToString::to_string).collect();
                        tracing::warn!(
                            "web: {} more login(s) with a wrong token refused in the last {:.0} s (from {})",
                            s.count,
                            s.over.as_secs_f64(),
                            peers.join(", ")
                        );
                    }
                });
            }
            failed_logins::Log::Counted => {}
        }
        Reply::HeldBack { until: at, response }
    }

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

    /// The backend's status with the `web` object added: the web server's counters, who
    /// controls, and the transitions the system's state allows.
    async fn status(self: &Arc<Self>) -> Result<Value, Response> {
        let status = backend_call(self, |b| b.status()).await?;
        let mut web = self.web_json();
        web["transitions"] = json!(allowed_transitions(status.state));
        let mut value = serde_json::to_value(&status).map_err(|e| {
            tracing::error!("web: the operator's status cannot be written as JSON: {e}");
            Response::error(500, format!("the operator's status cannot be written as JSON: {e}"))
        })?;
        if let Value::Object(map) = &mut value {
            map.insert("web".into(), web);
        }
        Ok(value)
    }
}

/// The names of the transitions a system in `state` may be asked for
/// ([`Transition::allowed_in`]), in the state machine's order.
pub(crate) fn allowed_transitions(state: SystemState) -> Vec<&'static str> {
    Transition::NAMES
        .iter()
        .filter_map(|name| Transition::parse(name, b"").ok())
        .filter(|t| t.allowed_in(state))
        .map(Transition::name)
        .collect()
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
        failed_logins: Mutex::new(FailedLogins::new(options.failed_login_delay)),
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
    /// The answer to a failed login, sent at `until` (unless the connection must make room
    /// first), then the connection closes.
    HeldBack {
        until: Instant,
        response: Response,
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
        match routes::dispatch(&shared, &request, peer).await {
            Reply::Response(response) => {
                if !write_response(&mut stream, &conn, &response.to_bytes(close)).await || close {
                    return;
                }
            }
            Reply::Events { session } => return events_stream(&shared, stream, session, &conn).await,
            Reply::Listen { service, session } => {
                return listen_stream(&shared, stream, service, session, &conn).await;
            }
            Reply::HeldBack { until, response } => {
                conn.set(Phase::HeldBack);
                let answer = tokio::select! {
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => true,
                    _ = conn.evicted() => false,
                    _ = stopping(&mut shutdown) => false,
                };
                if answer && write_response(&mut stream, &conn, &response.to_bytes(true)).await {
                    linger(stream).await;
                }
                return;
            }
        }
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
            let refusal = Response::error(e.status(), e.text());
            let _ = write_response(&mut stream, conn, &refusal.to_bytes(true)).await;
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

    #[test]
    fn the_transitions_offered_are_those_the_state_machine_allows() {
        assert_eq!(allowed_transitions(SystemState::Initial), ["configure", "reset"]);
        assert_eq!(allowed_transitions(SystemState::Running), ["pause", "stop"], "a run ends with a stop");
        assert_eq!(allowed_transitions(SystemState::Paused), ["resume", "stop"]);
        assert_eq!(allowed_transitions(SystemState::Configured), ["start", "reset"]);
        assert_eq!(allowed_transitions(SystemState::Error), ["stop", "reset"]);
        assert!(allowed_transitions(SystemState::Starting).is_empty(), "nothing while a transition is under way");
    }
}
