//! # daqflow-web: the operator's web UI and HTTP API
//!
//! The run-control and monitoring front end of daqflow, after the web UIs of DAQ-Middleware and
//! iFDAQ and the DIALOG GUI: the operator implements [`Backend`]; [`serve`] (or [`spawn`], on a
//! thread of its own) serves from it
//!
//! - the UI: one page of HTML, vanilla JavaScript and CSS embedded in the binary (run control,
//!   rates, histograms, ET stations, the DIALOG process view, the message browser, run history,
//!   the history of slow values);
//! - a JSON API (`/api/…`), with live updates as server-sent events (`/api/events`,
//!   `/api/listen`);
//! - Prometheus metrics (`/metrics`): the system's status ([`SystemStatus::to_prometheus`])
//!   and the web server's own counters;
//! - control ownership: one client (session) controls the run at a time, the others watch;
//! - access: with an access token ([`WebOptions::access_token`], which the operator always
//!   sets), only sessions logged in with it may act; sessions are server-issued HttpOnly
//!   cookies, never shown by the API; requests must name this server in `Host` (no DNS
//!   rebinding) and come from its own pages (`Origin`).
//!
//! `docs/web.md` documents every route, who may call it, the event formats and the ownership
//! rules. The HTTP/1.1 server is written here on tokio (no web framework): request heads up to
//! 16 KiB, bodies up to 1 MiB with `Content-Length`, each request whole within 5 s of its first
//! byte, keep-alive; whatever a client sends, it answers or closes that connection and keeps
//! serving the others, and when full it closes the connection idle or incomplete the longest
//! rather than refuse a newcomer. Every [`Backend`] method runs on a blocking thread.
//!
//! ## The contract
//!
//! What the backend returns is typed, in [`daqflow_api`]: the [`SystemStatus`], the
//! [`Transition`]s with their [`TransitionResult`], the [`ProcessEntry`]s of the control plane,
//! the [`LogQuery`] of the message browser and its [`LogRecord`]s, the run database's
//! [`RunRecord`]s and [`RunDetail`], the [`HistoryQuery`] of a slow value and its
//! [`HistorySeries`]; the server serves their serde form as JSON. Only the
//! monitors' histograms and the ET snapshots, details of those kinds, stay JSON values. Every
//! failure is a [`BackendError`], whose variant gives the HTTP status
//! ([`BackendError::status`]).
//!
//! Every route is declared once, in the server's route table (method, path, who may call it,
//! handler), which dispatches, answers 404 and 405 (with `Allow`), and is checked against the
//! route list of `docs/web.md` by a unit test.
//!
//! ## Example
//!
//! ```
//! use std::io::{Read, Write};
//! use std::sync::Arc;
//! use daqflow_api::{
//!     LogQuery, LogRecord, ProcessEntry, RunDetail, RunRecord, SystemState, SystemStatus, Transition,
//!     TransitionResult,
//! };
//! use daqflow_web::{Backend, BackendError, WebOptions};
//! use serde_json::{json, Value};
//!
//! /// A system without components that never leaves `Initial`.
//! struct Idle;
//!
//! impl Backend for Idle {
//!     fn status(&self) -> SystemStatus {
//!         SystemStatus {
//!             system: "demo".into(),
//!             state: SystemState::Initial,
//!             run: None,
//!             running: false,
//!             run_started_ms: None,
//!             duration_s: None,
//!             events: 0,
//!             bytes: 0,
//!             recorded: 0,
//!             events_per_s: 0.0,
//!             mb_per_s: 0.0,
//!             lost: None,
//!             last_error: None,
//!             last_summary: None,
//!             control: "127.0.0.1:7000".into(),
//!             data: "/tmp/demo".into(),
//!             components: Vec::new(),
//!             rates: Vec::new(),
//!             overrides: Default::default(),
//!             degraded: Default::default(),
//!         }
//!     }
//!     fn transition(&self, t: Transition) -> Result<TransitionResult, BackendError> {
//!         Err(BackendError::Conflict(format!("cannot {} the system in state Initial", t.name())))
//!     }
//!     fn processes(&self) -> Result<Vec<ProcessEntry>, BackendError> { Ok(Vec::new()) }
//!     fn send_command(&self, name: &str, _data: &str) -> Result<u32, BackendError> {
//!         Err(BackendError::NotFound(format!("no process registered the command `{name}`")))
//!     }
//!     fn listen(
//!         &self,
//!         service: &str,
//!         _tx: tokio::sync::mpsc::UnboundedSender<String>,
//!     ) -> Result<Box<dyn Send>, BackendError> {
//!         Err(BackendError::NotFound(format!("no service `{service}`")))
//!     }
//!     fn logs(&self, _query: &LogQuery) -> Result<Vec<LogRecord>, BackendError> { Ok(Vec::new()) }
//!     fn runs(&self, _limit: usize) -> Result<Vec<RunRecord>, BackendError> { Ok(Vec::new()) }
//!     fn run(&self, _run: u32) -> Result<Option<RunDetail>, BackendError> { Ok(None) }
//!     fn histograms(&self) -> Value { json!([]) }
//!     fn et(&self) -> Value { json!([]) }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Port 0: any free port; the handle tells which.
//! let web = daqflow_web::spawn("127.0.0.1:0", Arc::new(Idle), WebOptions::default())?;
//! println!("web UI on {}", web.url());
//!
//! // Watching needs no session; the Host must be this server (or another name allowed).
//! let mut http = std::net::TcpStream::connect(web.local_addr())?;
//! let request = format!("GET /api/status HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", web.local_addr());
//! http.write_all(request.as_bytes())?;
//! let mut response = String::new();
//! http.read_to_string(&mut response)?;
//! assert!(response.starts_with("HTTP/1.1 200 OK"));
//! assert!(response.contains(r#""state":"Initial""#));
//! // The web server adds what it knows: here, which transitions the state allows.
//! assert!(response.contains(r#""transitions":["configure","reset"]"#));
//!
//! web.shutdown()?;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod access;
mod conns;
mod control;
mod http;
/// The HTTP request parser's entry point for the fuzz target in `fuzz/`: not part of the API.
#[doc(hidden)]
#[cfg(any(test, feature = "fuzzing"))]
pub use http::fuzzing as http_fuzzing;
mod metrics;
mod server;
mod session;
mod ui;

/// The typed contract the backend fulfils ([`daqflow_api`]), for implementers.
pub use daqflow_api;

use std::fmt::Display;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use daqflow_api::{
    HistoryQuery, HistorySeries, LogQuery, LogRecord, ProcessEntry, RunDetail, RunRecord, SystemStatus, Transition,
    TransitionResult,
};
use serde_json::Value;

/// How the web server behaves. `WebOptions::default()` is the library's default (no access
/// token); the operator sets [`access_token`](WebOptions::access_token). Tests shorten the
/// times.
///
/// `Debug` shows whether a token is set, never the token.
#[derive(Clone)]
pub struct WebOptions {
    /// The web access token (a random secret, at least 16 characters). When set, every
    /// request that changes anything (taking, releasing or force-taking control, transitions,
    /// commands, any `POST`) needs a session logged in with it (`GET /?token=…` or
    /// `POST /api/login`); watching stays open unless [`token_to_watch`](WebOptions::token_to_watch).
    /// Without it (the default) every client gets an anonymous session and may take control.
    pub access_token: Option<String>,
    /// With an access token: require the logged-in session for every route except the login
    /// itself and the UI's static files (watching included). Default false.
    pub token_to_watch: bool,
    /// Host names (with or without `:port`) accepted in the `Host` header besides the bound
    /// address, `127.0.0.1:PORT`, `localhost:PORT` and `[::1]:PORT`. An entry without a port
    /// matches the name alone and the name with this server's port. Default empty.
    pub allowed_hosts: Vec<String>,
    /// A controlling client unseen this long (no request, no open event stream) loses control.
    /// Default 30 s.
    pub control_lapse: Duration,
    /// A session unused this long (no request, no open event stream) ends. Default 12 h.
    pub session_lapse: Duration,
    /// At most this many sessions; a new one ends the least recently used (never the
    /// controller's). Default 1024.
    pub max_sessions: usize,
    /// How often `/api/events` sends the status (it also sends it right after a transition
    /// made through the web). Default 1 s.
    pub status_interval: Duration,
    /// How often an idle event stream sends a comment line, so that proxies and the browser
    /// keep it open. Default 15 s.
    pub keepalive_interval: Duration,
    /// A kept-alive connection that sends nothing for this long between requests is closed.
    /// Default 60 s.
    pub idle_timeout: Duration,
    /// A request whose head and body have not all arrived this long after its first byte is
    /// answered 408 and its connection closed. Default 5 s.
    pub request_timeout: Duration,
    /// The largest request head (request line and header fields), in bytes; a larger one is
    /// refused with 431. Default 16 KiB.
    pub max_head_bytes: usize,
    /// The largest request body, in bytes; a larger one is refused with 413. Default 1 MiB.
    pub max_body_bytes: usize,
    /// At most this many connections at once. A newcomer beyond it closes the connection idle
    /// or incomplete the longest (else the oldest event stream of a client without a logged-in
    /// session); only when there is none is it answered 503. Default 256.
    pub max_connections: usize,
    /// At most this many idle or incomplete connections from one IP address; a newcomer beyond
    /// it closes that address's connection idle or incomplete the longest. Default 64.
    pub max_idle_per_ip: usize,
    /// A login with a wrong token (`POST /api/login`, `GET /?token=…`) is answered no sooner
    /// than this after it arrived; across all clients, such answers leave at most one per tenth
    /// of it, and none waits longer than ten times it (a connection held back that long is
    /// answered then). A right token is always answered at once, and a held-back connection
    /// is the first to make room when the server is full, so a flood of wrong logins never
    /// locks out the token holder. Default 1 s.
    pub failed_login_delay: Duration,
}

impl std::fmt::Debug for WebOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebOptions")
            .field("access_token", &self.access_token.as_ref().map(|_| "<set>"))
            .field("token_to_watch", &self.token_to_watch)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("control_lapse", &self.control_lapse)
            .field("session_lapse", &self.session_lapse)
            .field("max_sessions", &self.max_sessions)
            .field("status_interval", &self.status_interval)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_head_bytes", &self.max_head_bytes)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_connections", &self.max_connections)
            .field("max_idle_per_ip", &self.max_idle_per_ip)
            .field("failed_login_delay", &self.failed_login_delay)
            .finish()
    }
}

impl Default for WebOptions {
    fn default() -> Self {
        WebOptions {
            access_token: None,
            token_to_watch: false,
            allowed_hosts: Vec::new(),
            control_lapse: Duration::from_secs(30),
            session_lapse: Duration::from_secs(12 * 3600),
            max_sessions: 1024,
            status_interval: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(5),
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_connections: 256,
            max_idle_per_ip: 64,
            failed_login_delay: Duration::from_secs(1),
        }
    }
}

/// Why the web server could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// The listening socket could not be bound: the port is taken, or the address is not one
    /// of this host's. Pick another `web` address (port 0 picks a free port).
    #[error("the web server cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// An I/O error setting up the listening socket.
    #[error("the web server's listening socket failed: {0}")]
    Io(#[from] std::io::Error),
    /// The web server's thread or its tokio runtime could not be created (out of threads or
    /// memory).
    #[error("cannot start the web server's thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The web server's thread panicked (a bug: please report it).
    #[error("the web server's thread panicked")]
    Panicked,
    /// A [`WebOptions`] value is unusable (e.g. an access token too short to be a secret).
    #[error("invalid web server options: {0}")]
    Options(String),
}

/// The shortest access token accepted, in characters.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest access token accepted, in characters.
pub const MAX_TOKEN_LEN: usize = 256;

impl WebOptions {
    /// Checks what the server cannot run with.
    fn validate(&self) -> Result<(), WebError> {
        if let Some(token) = &self.access_token {
            if token.len() < MIN_TOKEN_LEN || token.len() > MAX_TOKEN_LEN {
                return Err(WebError::Options(format!(
                    "the access token must have {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters (it has {}): \
                     use daqflow_web::random_token()",
                    token.len()
                )));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(WebError::Options(
                    "the access token may only have printable ASCII characters, no spaces".into(),
                ));
            }
        } else if self.token_to_watch {
            return Err(WebError::Options("token_to_watch needs an access token".into()));
        }
        Ok(())
    }
}

/// A new access token: 128 random bits from the kernel (`/dev/urandom`), as 32 hex digits.
pub fn random_token() -> Result<String, WebError> {
    session::random_hex(16).map_err(WebError::Io)
}

/// Why the backend did not do what a request asked; the HTTP status follows from the variant
/// ([`BackendError::status`]), the text is the `error` of the JSON answer. A plain `String`
/// converts into [`BackendError::Failed`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The request's argument is invalid (not a valid command or service name, a run number
    /// the operator cannot use): 400.
    #[error("{0}")]
    Invalid(String),
    /// The request names something that does not exist (no such service, no process took the
    /// command): 404.
    #[error("{0}")]
    NotFound(String),
    /// The request is not possible in the system's state: a transition not allowed in it, or
    /// asked while another is under way: 409.
    #[error("{0}")]
    Conflict(String),
    /// The operator failed (a component failed or did not answer, the control server or the
    /// run database cannot be reached): 500.
    #[error("{0}")]
    Failed(String),
}

impl BackendError {
    /// The HTTP status of the answer: 400, 404, 409 or 500.
    pub fn status(&self) -> u16 {
        match self {
            BackendError::Invalid(_) => 400,
            BackendError::NotFound(_) => 404,
            BackendError::Conflict(_) => 409,
            BackendError::Failed(_) => 500,
        }
    }

    /// The text.
    pub fn text(&self) -> &str {
        match self {
            BackendError::Invalid(t)
            | BackendError::NotFound(t)
            | BackendError::Conflict(t)
            | BackendError::Failed(t) => t,
        }
    }
}

impl From<String> for BackendError {
    fn from(text: String) -> BackendError {
        BackendError::Failed(text)
    }
}

/// Serves the UI and the API from `backend` on `listener` until the process ends.
///
/// Errors accepting a connection (out of file descriptors, …) are logged and retried; this
/// returns only if the server cannot run at all.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: Arc<dyn Backend>,
    options: WebOptions,
) -> Result<(), WebError> {
    serve_with_shutdown(listener, backend, options, std::future::pending()).await
}

/// Like [`serve`], until `shutdown` completes: then it stops accepting, ends the event streams,
/// lets requests in progress finish (for up to 5 s) and returns.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    backend: Arc<dyn Backend>,
    options: WebOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WebError> {
    options.validate()?;
    server::run(listener, backend, options, shutdown).await
}

/// Binds `addr` and serves on a thread of its own (with its own tokio runtime), for callers
/// that are not async or do not want to share their runtime. The port may be 0: the handle
/// tells the one bound.
pub fn spawn(
    addr: impl ToSocketAddrs + Display,
    backend: Arc<dyn Backend>,
    options: WebOptions,
) -> Result<WebHandle, WebError> {
    options.validate()?;
    let listener =
        std::net::TcpListener::bind(&addr).map_err(|source| WebError::Bind { addr: addr.to_string(), source })?;
    listener.set_nonblocking(true)?;
    let local_addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // The runtime is built (and dropped) on the server's thread: dropping one on the caller's
    // thread would panic if the caller is itself inside a runtime.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), std::io::Error>>();
    let thread = std::thread::Builder::new()
        .name("daqflow-web".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => {
                    let _ = ready_tx.send(Ok(()));
                    r
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            let result = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                // The handle's sender fires or is dropped: either way, stop.
                serve_with_shutdown(listener, backend, options, async move {
                    let _ = stop_rx.await;
                })
                .await
            });
            // Backend calls still running on blocking threads are not waited for long.
            runtime.shutdown_timeout(Duration::from_secs(5));
            result
        })
        .map_err(WebError::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(WebError::Thread(e));
        }
        Err(_) => {
            let _ = thread.join();
            return Err(WebError::Panicked);
        }
    }
    Ok(WebHandle { local_addr, stop: Some(stop_tx), thread: Some(thread) })
}

/// A web server started by [`spawn`]. Dropping it stops the server too, without waiting.
#[derive(Debug)]
pub struct WebHandle {
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), WebError>>>,
}

impl WebHandle {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The UI's URL, `http://ADDRESS:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.local_addr)
    }

    /// Stops the server and waits for its thread (at most about 10 s: event streams end at once,
    /// requests in progress get 5 s, backend calls still running 5 s more).
    pub fn shutdown(mut self) -> Result<(), WebError> {
        self.stop.take().map(|s| s.send(()));
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(WebError::Panicked),
            None => Ok(()),
        }
    }
}

impl Drop for WebHandle {
    fn drop(&mut self) {
        self.stop.take().map(|s| s.send(()));
    }
}

/// What the web server asks the operator. Every method is called from a blocking thread
/// (`spawn_blocking`), so an implementation may block for as long as the operation takes (a
/// `start` waits for every component). The HTTP status of each [`BackendError`] is
/// [`BackendError::status`]; a method that panics gives a 500 and the server goes on.
pub trait Backend: Send + Sync + 'static {
    /// The whole system's live status (`GET /api/status`, the `status` event, `/metrics`).
    fn status(&self) -> SystemStatus;
    /// A transition of the whole system, when it is done (a `start` waits for every
    /// component). [`BackendError::Conflict`] when the system's state does not allow it or
    /// another transition is under way (409), [`BackendError::Invalid`] for an argument it
    /// cannot take (400), [`BackendError::Failed`] when a component or the operator failed
    /// (500).
    fn transition(&self, transition: Transition) -> Result<TransitionResult, BackendError>;
    /// The control plane's directory (DIALOG GUI view). [`BackendError::Failed`] when the
    /// control server cannot be reached.
    fn processes(&self) -> Result<Vec<ProcessEntry>, BackendError>;
    /// Sends a control-plane command; returns how many processes received it.
    /// [`BackendError::Invalid`] for a name that cannot be a command (400),
    /// [`BackendError::NotFound`] when no process registered it (404).
    fn send_command(&self, name: &str, data: &str) -> Result<u32, BackendError>;
    /// Sets parameter `key` (dotted for a nested key) of component `component` to `value` for
    /// the next configure (`None`: back to the system file's); returns every override in force
    /// (`COMPONENT.KEY` → value). [`BackendError::Invalid`] for an unknown component or key,
    /// a value that cannot be a parameter, or a system not Initial (400). A backend without
    /// parameters refuses it (the default).
    fn set(
        &self,
        component: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        let _ = (component, key, value);
        Err(BackendError::Invalid("this system takes no parameter changes".into()))
    }
    /// Takes run `run`'s configuration for the next configure: its parameters set over the
    /// system file replace those in force, and the runs taken with them record that they
    /// repeat it; returns every override in force. [`BackendError::Invalid`] for a run that is
    /// not there, of another system, recorded with another system file, or a system not
    /// Initial (400). A backend without a run database refuses it (the default).
    fn repeat(&self, run: u32) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        let _ = run;
        Err(BackendError::Invalid("this system cannot take a run's configuration".into()))
    }
    /// Subscribes to a control-plane service: every value (as text) goes to `tx` until the
    /// returned guard is dropped. [`BackendError::NotFound`] when no process provides it (404),
    /// [`BackendError::Invalid`] for a name that cannot be a service (400).
    fn listen(
        &self,
        service: &str,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn Send>, BackendError>;
    /// The message log's records matching `query`, newest first, at most `query.limit()` (the
    /// server always gives `limit`, at most [`LogQuery::MAX_LIMIT`]).
    fn logs(&self, query: &LogQuery) -> Result<Vec<LogRecord>, BackendError>;
    /// The run history, newest first, at most `limit` runs.
    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, BackendError>;
    /// One run's whole record, or `None` when the run database has no such run (404).
    fn run(&self, run: u32) -> Result<Option<RunDetail>, BackendError>;
    /// The components' histograms and counters, each with its `component` (a parallel group's
    /// summed, with `members`): one-dimensional `{"component","name","title","x_label","low",
    /// "high","bins":[…],"underflow","overflow","entries",…}`, `"kind": "h2"` and `"kind":
    /// "counter"` (docs/web.md, `GET /api/histograms`).
    fn histograms(&self) -> Value;
    /// The ET systems' stations: `[{"component", "snapshot": {…}}]` (the `et monitor --json`
    /// snapshot, the ET kind's detail).
    fn et(&self) -> Value;
    /// Every component's typed schema, by name (`GET /api/schema`): its keys' types, ranges,
    /// units, defaults and live states, for the Parameters form. A component whose kind
    /// declares none is left out; the default has none.
    fn schemas(&self) -> std::collections::BTreeMap<String, daqflow_api::schema::Schema> {
        std::collections::BTreeMap::new()
    }
    /// The names of the slow values the history holds, sorted (`GET /api/history/names`).
    /// A backend without a history answers [`BackendError::NotFound`] (the default).
    fn history_names(&self) -> Result<Vec<String>, BackendError> {
        Err(BackendError::NotFound(NO_HISTORY.into()))
    }
    /// One slow value over a time range, at most `query.points` points (down-sampled when
    /// there are more samples), `GET /api/history`; `None` when the history has no value of
    /// that name (404). The server checks the query first (`from_ms <= to_ms`, 1 ≤ `points` ≤
    /// [`HistoryQuery::MAX_POINTS`]). A backend without a history answers
    /// [`BackendError::NotFound`] (the default).
    fn history(&self, query: &HistoryQuery) -> Result<Option<HistorySeries>, BackendError> {
        let _ = query;
        Err(BackendError::NotFound(NO_HISTORY.into()))
    }
    /// Every alarm of the system with its state, and the recent alarm events (`GET
    /// /api/alarms`; also exported in `/metrics`). A backend without alarms has none (the
    /// default).
    fn alarms(&self) -> Result<daqflow_api::alarms::AlarmsStatus, BackendError> {
        Ok(daqflow_api::alarms::AlarmsStatus::default())
    }
    /// A person acknowledges alarm `name`; `who` says who (recorded with the event). Returns
    /// the alarm as it is then. [`BackendError::Invalid`] for an alarm the system does not
    /// have or one that is not raised (400). A backend without alarms refuses it (the
    /// default).
    fn acknowledge_alarm(&self, name: &str, who: &str) -> Result<daqflow_api::alarms::AlarmView, BackendError> {
        let _ = who;
        Err(BackendError::Invalid(format!("there is no alarm `{name}`: this system has no alarms")))
    }
}

/// What a backend without a history of slow values answers to its routes.
pub const NO_HISTORY: &str = "this system keeps no history of slow values";
