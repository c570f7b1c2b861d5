//! Components written in Python, and the source protocol for a readout in Python.
//!
//! A Python component is a subclass of `daqflow.Component` (`python/daqflow/component.py`).
//! [`run_component`] runs it as a whole daqflow component process: the same run loop as
//! `daqflow component KIND` ([`daqflow_component::process::run`]), so it reads the same line
//! commands on standard input, joins the control plane with the system token, publishes
//! `NAME/state`, `NAME/stats` and `NAME/log`, keeps its lease and takes commands only from its
//! operator. Each transition calls the Python object's method with the GIL taken; the loop
//! itself runs without the GIL, so the component's own Python threads (a readout loop) run
//! meanwhile.
//!
//! The Python side calls the object's `_df_*` methods (defined by `daqflow.Component`), which
//! exchange JSON text with this module: the configuration in, what `configure` tells the others
//! and the [`Stats`] out. A Python exception in a hook fails that transition (the component is
//! then in Error, as a Rust component would be), with the exception's text.
//!
//! [`SourceStream`] wraps [`daqflow_evb::source::SourceStream`]: fragments from Python to an RU.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use daqflow_component::schema::{Key, Schema};
use daqflow_component::{Component, ComponentError, Info, Kind, Registry, Role, Stats};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::Error;

/// A Python exception as a component's error: its type and message (the traceback goes to the
/// process's log).
pub(crate) fn hook_error(py: Python<'_>, what: &str, e: PyErr) -> ComponentError {
    let text = e.value(py).str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into());
    let kind = e.get_type(py).name().map(|s| s.to_string()).unwrap_or_else(|_| "Exception".into());
    let traceback = e.traceback(py).and_then(|t| t.format().ok()).unwrap_or_default();
    tracing::error!("{what} raised {kind}: {text}\n{traceback}");
    ComponentError::Failed(if text.is_empty() { format!("{what}: {kind}") } else { format!("{what}: {text}") })
}

/// A component whose hooks are a Python object's methods.
struct PyComponent {
    object: Py<PyAny>,
    /// The last live counters and when they were read, for the rates when the object gives
    /// none: (when, events, bytes).
    rates: Mutex<Option<(Instant, u64, u64)>>,
}

impl PyComponent {
    /// Calls `self._df_NAME(*args)` and returns its result as a string (JSON), if any.
    fn call(
        &self,
        what: &str,
        method: &str,
        args: impl for<'py> pyo3::call::PyCallArgs<'py>,
    ) -> Result<Option<String>, ComponentError> {
        Python::attach(|py| {
            let out = self.object.bind(py).call_method1(method, args).map_err(|e| hook_error(py, what, e))?;
            if out.is_none() {
                return Ok(None);
            }
            out.extract::<String>().map(Some).map_err(|e| hook_error(py, what, e))
        })
    }

    fn stats_from(&self, json: Option<String>, what: &str) -> Result<Stats, ComponentError> {
        let Some(json) = json else { return Ok(Stats::default()) };
        serde_json::from_str(&json).map_err(|e| ComponentError::Failed(format!("{what}: its statistics: {e}")))
    }
}

impl Component for PyComponent {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let json = self.call("configure()", "_df_configure", ())?;
        match json {
            None => Ok(Info::new()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| ComponentError::Failed(format!("configure(): what it returned: {e}"))),
        }
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        *self.rates.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.call("start()", "_df_start", (run,)).map(drop)
    }

    fn stop(&mut self, last_event: Option<u64>) -> Result<Stats, ComponentError> {
        let json = self.call("stop()", "_df_stop", (last_event,))?;
        self.stats_from(json, "stop()")
    }

    fn pause(&mut self) -> Result<(), ComponentError> {
        self.call("pause()", "_df_pause", ()).map(drop)
    }

    fn resume(&mut self) -> Result<(), ComponentError> {
        self.call("resume()", "_df_resume", ()).map(drop)
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.call("reset()", "_df_reset", ()).map(drop)
    }

    fn stats(&self) -> Stats {
        let mut stats = match self.call("stats()", "_df_stats", ()).and_then(|j| self.stats_from(j, "stats()")) {
            Ok(s) => s,
            Err(_) => return Stats::default(),
        };
        // Rates over the interval since the last call, unless the object gives its own.
        let now = Instant::now();
        let mut last = self.rates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((then, events, bytes)) = *last {
            let dt = now.duration_since(then).as_secs_f64();
            if dt > 0.05 && stats.events_per_s == 0.0 && stats.mb_per_s == 0.0 {
                stats.events_per_s = stats.events.saturating_sub(events) as f64 / dt;
                stats.mb_per_s = stats.bytes.saturating_sub(bytes) as f64 / dt / 1e6;
            }
        }
        *last = Some((now, stats.events, stats.bytes));
        stats
    }

    fn failure(&self) -> Option<String> {
        self.call("failure()", "_df_failure", ()).ok().flatten()
    }

    // The driver calls it only for a parameter the class declares live, in one of its states,
    // with a value of its type and range.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        let json = serde_json::to_string(value)
            .map_err(|e| ComponentError::Refused(format!("`{key}` = {value}: as JSON: {e}")))?;
        Python::attach(|py| {
            self.object.bind(py).call_method1("_df_set", (key, json)).map(drop).map_err(|e| {
                let e = hook_error(py, "set()", e);
                ComponentError::Refused(e.to_string())
            })
        })
    }
}

/// The schema of a Python component's class: its `parameters` (and `outputs`), as
/// `daqflow.Component._df_schema` gives them in JSON (a list of keys in the form of
/// `daqflow_component::schema::Key`).
pub(crate) fn schema_of(kind: &str, json: &str) -> PyResult<Schema> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Declared {
        parameters: Vec<Key>,
        #[serde(default)]
        outputs: Vec<Key>,
    }
    let declared: Declared =
        serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("{kind}: its parameters: {e}")))?;
    let mut schema = Schema::new(kind);
    for key in declared.parameters {
        if key.name.is_empty() || schema.key_named(&key.name).is_some() {
            return Err(PyValueError::new_err(format!("{kind}: parameter `{}` is empty or declared twice", key.name)));
        }
        if let (Some(default), false) = (&key.default, key.required) {
            key.check(default).map_err(|e| PyValueError::new_err(format!("{kind}: the default of {e}")))?;
        }
        if key.live.iter().any(|s| !daqflow_component::schema::ANY_STATE.contains(s)) {
            return Err(PyValueError::new_err(format!(
                "{kind}: parameter `{}` may be live only while Configured, Running or Paused",
                key.name
            )));
        }
        schema = schema.key(key);
    }
    for key in declared.outputs {
        schema = schema.output(key);
    }
    Ok(schema)
}

fn role(name: &str) -> PyResult<Role> {
    Ok(match name {
        "trigger" => Role::Trigger,
        "readout" => Role::Readout,
        "builder" => Role::Builder,
        "buffer" => Role::Buffer,
        "recorder" => Role::Recorder,
        "other" => Role::Other,
        _ => {
            return Err(PyValueError::new_err(format!(
                "role `{name}`: one of trigger, readout, builder, buffer, recorder, other"
            )));
        }
    })
}

/// Sets the system token of this process, as the `daqflow` binary does: `token_stdin` reads
/// it from the first line of standard input (byte by byte, so that the rest of the input stays
/// for the run loop's commands), else `token_file`, else the file in `DAQFLOW_TOKEN_FILE`,
/// else the token in `DAQFLOW_TOKEN`, else none. Returns whether the process has a token.
#[pyfunction]
#[pyo3(signature = (token_file=None, token_stdin=false))]
pub fn _use_token(py: Python<'_>, token_file: Option<std::path::PathBuf>, token_stdin: bool) -> PyResult<bool> {
    let token = py.detach(|| -> Result<Option<daqflow_transport::auth::Token>, String> {
        if token_stdin {
            return read_token_line().map(Some).map_err(|e| format!("--token-stdin: {e}"));
        }
        let file = token_file.or_else(|| std::env::var_os("DAQFLOW_TOKEN_FILE").map(Into::into));
        if let Some(path) = file {
            return daqflow_transport::auth::Token::from_file(&path)
                .map(Some)
                .map_err(|e| format!("token file {}: {e}", path.display()));
        }
        match std::env::var("DAQFLOW_TOKEN") {
            Ok(text) => daqflow_transport::auth::Token::new(&text).map(Some).map_err(|e| format!("DAQFLOW_TOKEN: {e}")),
            Err(_) => Ok(None),
        }
    });
    let token = token.map_err(Error::new_err)?;
    let has = token.is_some();
    daqflow_transport::auth::set_process_token(token);
    Ok(has)
}

/// The first line of standard input, read from the file descriptor a byte at a time.
fn read_token_line() -> Result<daqflow_transport::auth::Token, String> {
    use std::io::Read;
    let limit = daqflow_transport::auth::MAX_TOKEN_LEN + 2;
    let mut line = Vec::new();
    let mut stdin = std::io::stdin().lock();
    let mut byte = [0u8; 1];
    loop {
        match stdin.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading standard input: {e}")),
        }
        if line.len() >= limit {
            return Err(format!("the first line is longer than a token ({} bytes at most)", limit - 2));
        }
    }
    if line.is_empty() {
        return Err("standard input ended before the token's line".into());
    }
    let text = std::str::from_utf8(&line).map_err(|_| "the token's line is not UTF-8".to_owned())?;
    daqflow_transport::auth::Token::new(text.trim_end_matches('\r')).map_err(|e| e.to_string())
}

/// The command line of a component process, as `daqflow.Component.run` passes it (a dict with
/// every key): the name, the configuration (the TOML file `config_file` with `sets`
/// (`KEY=VALUE`) over it, as `daqflow component --config --set` reads them), and the process
/// loop's options.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct ProcessArgs {
    name: String,
    config_file: Option<std::path::PathBuf>,
    sets: Vec<String>,
    start: Option<u32>,
    control: Option<String>,
    /// Seconds without a control server before the process ends (0: never; None: 15).
    lease_s: Option<f64>,
    end_with_stdin: bool,
    operator: Option<String>,
    incarnation: Option<u64>,
}

impl ProcessArgs {
    /// The process loop's options for a component of kind `kind`.
    pub(crate) fn options(self, kind: String) -> PyResult<daqflow_component::process::Options> {
        let config = daqflow_component::process::config_table(self.config_file.as_deref(), &self.sets)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let lease = match self.lease_s {
            Some(s) if !(s.is_finite() && (0.0..=86_400.0).contains(&s)) => {
                return Err(PyValueError::new_err(format!("lease {s}: seconds from 0 (never) to 86400")));
            }
            Some(s) if s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(_) => None,
            None => Some(Duration::from_secs(15)),
        };
        Ok(daqflow_component::process::Options {
            kind,
            name: self.name,
            config,
            start: self.start,
            control: self.control,
            lease,
            end_with_stdin: self.end_with_stdin,
            operator: self.operator,
            incarnation: self.incarnation,
            // A component of Python is never slowed down (DAQFLOW_TRANSITION_DELAY is `daqflow
            // component`'s).
            transition_delay: Duration::ZERO,
        })
    }
}

/// Runs a Python component as a daqflow component process until it ends; returns whether it
/// failed. `process` is its command line ([`ProcessArgs`]); `factory(name, config_json)` makes
/// the component object (a `daqflow.Component`) at every configure, from its configuration
/// merged with the operator's.
#[pyfunction]
#[pyo3(signature = (factory, *, kind, role, process, schema=None))]
pub fn _run_component(
    py: Python<'_>,
    factory: Py<PyAny>,
    kind: String,
    role: &str,
    process: ProcessArgs,
    schema: Option<String>,
) -> PyResult<bool> {
    let role = self::role(role)?;
    let schema = schema.map(|json| schema_of(&kind, &json)).transpose()?;
    let options = process.options(kind.clone())?;
    init_logging();
    // A kind's name lives as long as the process (the registry keeps `&'static str`s); one
    // per component process.
    let kind_name: &'static str = Box::leak(kind.into_boxed_str());
    let mut registry = Registry::new();
    let mut python_kind = Kind::new(kind_name, "a component written in Python", role, move |name, table| {
        let json = serde_json::to_string(&table)
            .map_err(|e| ComponentError::Config(format!("{name}: the configuration as JSON: {e}")))?;
        let object = Python::attach(|py| {
            factory.bind(py).call1((name, json)).map(Bound::unbind).map_err(|e| {
                let e = hook_error(py, "making the component", e);
                ComponentError::Config(e.to_string())
            })
        })?;
        Ok(Box::new(PyComponent { object, rates: Mutex::new(None) }) as Box<dyn Component>)
    });
    if let Some(schema) = schema {
        python_kind = python_kind.schema(schema);
    }
    registry.add(python_kind);
    let result = py.detach(|| daqflow_component::process::run(registry, options));
    result.map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Logs `message` at `level` (`error`, `warning`, `info`, `debug`) in the process's log: on
/// standard error, and (info and above) in its `NAME/log` service, which the message logger
/// stores.
#[pyfunction]
pub fn _log(level: &str, message: &str) {
    match level {
        "error" | "critical" => tracing::error!("{message}"),
        "warning" | "warn" => tracing::warn!("{message}"),
        "info" => tracing::info!("{message}"),
        _ => tracing::debug!("{message}"),
    }
}

/// The process's log: standard error (filtered by `DAQFLOW_LOG`, info by default) and the
/// records kept for its `NAME/log` service, as the `daqflow` binary sets it up.
pub(crate) fn init_logging() {
    daqflow_component::log::init("info");
}

/// One source's stream of fragments to a readout unit: the source protocol (`docs/evb.md`,
/// "Writing a source"). Event ids are 1, 2, 3, … in the order of `send`.
#[pyclass(module = "daqflow._native")]
pub struct SourceStream {
    inner: Option<daqflow_evb::source::SourceStream>,
    /// After the end (or an error): the last event id and the bytes sent.
    ended: (u64, u64),
}

impl SourceStream {
    fn stream(&mut self) -> PyResult<&mut daqflow_evb::source::SourceStream> {
        self.inner.as_mut().ok_or_else(|| Error::new_err("the source stream has ended"))
    }

    /// Ends the stream's life here (after its end frame or an error), keeping its counters.
    fn close(&mut self) -> Option<daqflow_evb::source::SourceStream> {
        let s = self.inner.take()?;
        self.ended = (s.last_event(), s.bytes());
        Some(s)
    }
}

#[pymethods]
impl SourceStream {
    /// Connects to the RU at `ru` (`host:port`), retrying for `timeout` seconds, and says hello
    /// as source `source_id` of run `run`.
    #[new]
    #[pyo3(signature = (ru, source_id, run, name="python-source", timeout=10.0))]
    fn new(py: Python<'_>, ru: &str, source_id: u32, run: u32, name: &str, timeout: f64) -> PyResult<SourceStream> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(PyValueError::new_err(format!("timeout {timeout}: seconds, 0 or more")));
        }
        let inner = py
            .detach(|| {
                daqflow_evb::source::SourceStream::connect(ru, source_id, run, name, Duration::from_secs_f64(timeout))
            })
            .map_err(|e| Error::new_err(e.to_string()))?;
        Ok(SourceStream { inner: Some(inner), ended: (0, 0) })
    }

    /// Sends the next event's fragment (`payload`: any bytes-like object) with trigger type
    /// `trigger_type`; returns its event id. Fragments are queued and written as the
    /// connection's chunks fill; call `flush()` before waiting.
    #[pyo3(signature = (payload, trigger_type=1, timestamp=None))]
    fn send(
        &mut self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        trigger_type: u32,
        timestamp: Option<u64>,
    ) -> PyResult<u64> {
        // `bytes` are sent from their own memory; any other bytes-like object is copied once.
        let copied: Vec<u8>;
        let slice: &[u8] = match payload.cast::<PyBytes>() {
            Ok(b) => b.as_bytes(),
            Err(_) => {
                copied = pyo3::buffer::PyBuffer::<u8>::get(payload)?.to_vec(py)?;
                &copied
            }
        };
        let stream = self.inner.as_mut().ok_or_else(|| Error::new_err("the source stream has ended"))?;
        // Without the GIL: the RU may hold the stream back (TCP flow control).
        let sent = py.detach(|| match timestamp {
            Some(t) => stream.send_stamped(trigger_type, t, slice),
            None => stream.send(trigger_type, slice),
        });
        sent.map_err(|e| {
            self.close();
            Error::new_err(e.to_string())
        })
    }

    /// Writes what is queued.
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        let stream = self.stream()?;
        let r = py.detach(|| stream.flush());
        r.map_err(|e| {
            self.close();
            Error::new_err(e.to_string())
        })
    }

    /// Sends the end frame with the last event id, writes everything and closes; returns the
    /// last event id.
    fn end(&mut self, py: Python<'_>) -> PyResult<u64> {
        let mut stream = self.close().ok_or_else(|| Error::new_err("the source stream has ended"))?;
        py.detach(|| stream.end()).map_err(|e| Error::new_err(e.to_string()))
    }

    /// The id the next fragment gets.
    #[getter]
    fn next_event(&self) -> u64 {
        self.inner.as_ref().map_or(self.ended.0 + 1, |s| s.next_event())
    }

    /// The last event id sent (0 before the first).
    #[getter]
    fn last_event(&self) -> u64 {
        self.inner.as_ref().map_or(self.ended.0, |s| s.last_event())
    }

    /// Bytes sent in fragments (48-byte headers, payloads, padding to 8 bytes).
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.as_ref().map_or(self.ended.1, |s| s.bytes())
    }

    /// Whether the stream is open (not ended, no error).
    #[getter]
    fn is_open(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.is_open())
    }

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(s) => format!("<SourceStream next event {}, {} bytes sent>", s.next_event(), s.bytes()),
            None => format!("<SourceStream ended at event {}, {} bytes sent>", self.ended.0, self.ended.1),
        }
    }
}
