//! # daqflow-web: the operator's web UI and HTTP API
//!
//! (Being written.) The operator implements [`Backend`]; [`serve`] serves the UI, the JSON API,
//! live updates as server-sent events and Prometheus metrics from it.
#![warn(missing_docs)]

use serde_json::Value;

/// What the web server asks the operator. Every method is called from a blocking thread
/// (`spawn_blocking`), so an implementation may block for as long as the operation takes (a
/// `start` waits for every component).
pub trait Backend: Send + Sync + 'static {
    /// The whole system's live status, as documented in `docs/operator-guide.md`:
    /// `{"system": NAME, "state": "Running", "run": 12, "run_started_ms": …, "duration_s": …,
    ///   "events": …, "events_per_s": …, "mb_per_s": …, "lost": 0,
    ///   "components": [{"name","kind","host","pid","state","run","since_ms","error","stats":{…}}],
    ///   "rates": [{"t_ms", "events_per_s", "mb_per_s"}…] (the last minutes, for the rate plot),
    ///   "web": {…}}`.
    fn status(&self) -> Value;
    /// A run-control transition of the whole system: `configure`, `start`, `stop`, `pause`,
    /// `resume`, `reset`; `arg` is optional (e.g. `{"run": 12}` for start). Returns the
    /// transition's result or an error text (e.g. "`start` is not allowed in state Initial").
    fn transition(&self, verb: &str, arg: Value) -> Result<Value, String>;
    /// The control plane's directory (DIALOG GUI view): `[{"name","host","port","pid",
    /// "provides":[…],"subscribes":[…],"commands":[…], …}]`.
    fn processes(&self) -> Result<Value, String>;
    /// Sends a control-plane command; returns how many processes received it.
    fn send_command(&self, name: &str, data: &str) -> Result<u32, String>;
    /// Subscribes to a control-plane service: every value (as text) goes to `tx` until the
    /// returned guard is dropped.
    fn listen(&self, service: &str, tx: tokio::sync::mpsc::UnboundedSender<String>) -> Result<Box<dyn Send>, String>;
    /// Log records, newest first, filtered: `since_ms`/`until_ms` (Unix ms), `process`,
    /// `min_severity` (`debug`, `info`, `warn`, `error`), `text` (substring), `limit`.
    fn logs(&self, filter: &LogFilter) -> Result<Value, String>;
    /// The run history, newest first: `[{"run","started_ms","stopped_ms","state","events",…}]`.
    fn runs(&self, limit: usize) -> Result<Value, String>;
    /// One run's record (config snapshot, per-component counters, files), or None.
    fn run(&self, run: u32) -> Result<Option<Value>, String>;
    /// The monitor components' histograms: `[{"component","name","title","x_label","low",
    /// "high","bins":[…],"underflow","overflow","entries"}]`.
    fn histograms(&self) -> Value;
    /// The ET systems' stations: `[{"component", "snapshot": {…}}]` (the `et monitor --json`
    /// snapshot).
    fn et(&self) -> Value;
    /// Prometheus text exposition (names prefixed `daqflow_`).
    fn metrics(&self) -> String;
}

/// The message browser's filter (query parameters of `GET /api/logs`).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct LogFilter {
    /// Only records at or after this time (Unix ms).
    pub since_ms: Option<u64>,
    /// Only records at or before this time (Unix ms).
    pub until_ms: Option<u64>,
    /// Only records of this process (component name).
    pub process: Option<String>,
    /// Only records at least this severe: `debug`, `info`, `warn`, `error`.
    pub min_severity: Option<String>,
    /// Only records whose message contains this text.
    pub text: Option<String>,
    /// At most this many (default 200).
    pub limit: Option<usize>,
}
