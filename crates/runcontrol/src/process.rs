//! The run loop of a component process (`daqflow component KIND`): a [`Driver`] fed with
//! commands from standard input and, with a control address, from the control plane.
//!
//! **Standard input**, one command per line: `configure`, `start RUN`, `pause`, `resume`,
//! `stop [ARG]`, `stats`, `state`, `reset`, `quit`. Each gets exactly one JSON line on
//! standard output: `{"ok":true,"state":"Running","result":…}` or
//! `{"ok":false,"state":…,"error":"…"}`. A failure during the run prints
//! `{"event":"error","error":"…"}` by itself. End of input (without a control address),
//! `quit`, SIGTERM or SIGINT end a running component with its summary and exit.
//!
//! **Control plane** (`docs/operator-guide.md`, "component protocol"): the process joins
//! dialog under its name and registers the commands `NAME/configure|start|pause|resume|stop|reset`
//! and the same under `all/`. A command's payload is empty, a bare number (the run for
//! `start`, the last event for `stop`), or a JSON object with any of `id` (echoed in the
//! answer), `run`, `last_event` and `config` (configure: keys merged over the process's own
//! configuration). It provides
//! - `NAME/state`: `{"name","kind","pid","state","run","since_ms","error","last_command":
//!   {"id","command","ok","result"|"error"}}` on every change and once a second;
//! - `NAME/stats`: the component's counters once a second;
//! - `NAME/log`: a JSON array of the process's recent log records (`crate::log`).
//!
//! ```no_run
//! // The kinds the binary knows (`daqflow::registry::standard()` in the `daqflow` command).
//! let registry = daqflow_component::Registry::new();
//! let options = daqflow_runcontrol::process::Options {
//!     kind: "sink".into(),
//!     name: "sink-1".into(),
//!     config: toml::Table::new(),
//!     start: None,
//!     control: Some("127.0.0.1:7000".into()),
//! };
//! let failed = daqflow_runcontrol::process::run(registry, options)?;
//! # let _ = failed;
//! # Ok::<(), daqflow_runcontrol::process::ProcessError>(())
//! ```

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::log::now_ms;
use daqflow_component::{Driver, Registry, State};

/// How a component process runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The component kind.
    pub kind: String,
    /// The component's name, unique in the system.
    pub name: String,
    /// Its configuration (from `--config` and `--set`).
    pub config: toml::Table,
    /// Configure and start this run at once.
    pub start: Option<u32>,
    /// The control server's address, to join the control plane.
    pub control: Option<String>,
}

/// Why a component process could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Joining the control plane failed.
    #[error("joining the control plane at {addr}: {reason}")]
    Control {
        /// The control server's address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// `--start` failed.
    #[error("{name}: {reason}")]
    Start {
        /// The component.
        name: String,
        /// Why.
        reason: String,
    },
    /// A thread or signal handler could not be set up.
    #[error("setting up the process: {0}")]
    Setup(String),
}

/// The commands a component takes over the control plane.
pub const VERBS: [&str; 6] = ["configure", "start", "pause", "resume", "stop", "reset"];

/// One command for the driver.
#[derive(Debug)]
enum Input {
    /// A line from standard input.
    Line(String),
    /// A control-plane command: the verb and its payload.
    Control(&'static str, Value),
    /// Standard input ended.
    End,
}

/// A command's payload as JSON: empty → null, a bare number → `{"n": N}`, JSON as is.
pub fn parse_payload(data: &[u8]) -> Value {
    let text = String::from_utf8_lossy(data);
    let text = text.trim();
    if text.is_empty() {
        return Value::Null;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Number(n)) => json!({ "n": n }),
        Ok(v) => v,
        Err(_) => json!({ "text": text }),
    }
}

/// The answer line of one command.
fn answer(driver: &Driver, result: Result<Value, String>) -> Value {
    let state = driver.state().name();
    match result {
        Ok(r) => json!({ "ok": true, "state": state, "result": r }),
        Err(e) => json!({ "ok": false, "state": state, "error": e }),
    }
}

fn u64_of(payload: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| payload.get(*k).and_then(Value::as_u64))
}

/// Runs a control-plane command.
fn control_command(driver: &mut Driver, verb: &str, payload: &Value) -> Result<Value, String> {
    match verb {
        "configure" => {
            let overrides = match payload.get("config") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    serde_json::from_value::<toml::Table>(v.clone())
                        .map_err(|e| format!("configure: `config` is not a table of keys: {e}"))?,
                ),
            };
            driver.configure(overrides).map_err(|e| e.to_string())
        }
        "start" => match u64_of(payload, &["run", "n"]).and_then(|r| u32::try_from(r).ok()) {
            Some(run) => driver.start(run).map(|()| json!({ "run": run })).map_err(|e| e.to_string()),
            None => Err("start: the payload must name the run (a number or {\"run\": N})".into()),
        },
        "stop" => driver.stop(u64_of(payload, &["last_event", "n"])).map_err(|e| e.to_string()),
        "pause" => driver.pause().map(|()| Value::Null).map_err(|e| e.to_string()),
        "resume" => driver.resume().map(|()| Value::Null).map_err(|e| e.to_string()),
        "reset" => driver.reset().map(|()| Value::Null).map_err(|e| e.to_string()),
        other => Err(format!("unknown command `{other}`")),
    }
}

/// Runs a line from standard input; the answer and whether to quit.
fn line_command(driver: &mut Driver, line: &str) -> (Value, bool) {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("");
    let arg = words.next();
    let result = match verb {
        "configure" => driver.configure(None).map_err(|e| e.to_string()),
        "start" => match arg.map(str::parse::<u32>) {
            Some(Ok(run)) => driver.start(run).map(|()| json!({ "run": run })).map_err(|e| e.to_string()),
            _ => Err("usage: start RUN".into()),
        },
        "stop" => match arg.map(str::parse::<u64>).transpose() {
            Ok(a) => driver.stop(a).map_err(|e| e.to_string()),
            Err(_) => Err("usage: stop [LAST_EVENT]".into()),
        },
        "pause" => driver.pause().map(|()| Value::Null).map_err(|e| e.to_string()),
        "resume" => driver.resume().map(|()| Value::Null).map_err(|e| e.to_string()),
        "stats" => Ok(driver.stats()),
        "state" => Ok(json!({ "failure": driver.failure() })),
        "reset" => driver.reset().map(|()| Value::Null).map_err(|e| e.to_string()),
        "quit" => return (json!({ "ok": true, "state": driver.state().name() }), true),
        "" => return (Value::Null, false),
        other => Err(format!(
            "unknown command `{other}` (configure, start RUN, pause, resume, stop [N], stats, state, reset, quit)"
        )),
    };
    (answer(driver, result), false)
}

/// A component's presence on the control plane.
struct ControlLink {
    dialog: daqflow_dialog::Dialog,
    state: daqflow_dialog::Service,
    stats: daqflow_dialog::Service,
    log: daqflow_dialog::Service,
    _commands: Vec<daqflow_dialog::CommandRegistration>,
    since_ms: u64,
    last_state: &'static str,
    last_command: Value,
    log_published: u64,
}

impl ControlLink {
    fn join(control: &str, name: &str, tx: Sender<Input>) -> Result<ControlLink, ProcessError> {
        let err =
            |e: daqflow_dialog::DialogError| ProcessError::Control { addr: control.to_owned(), reason: e.to_string() };
        let dialog = daqflow_dialog::Dialog::connect(control, name).map_err(err)?;
        let state = dialog.provide(&format!("{name}/state")).map_err(err)?;
        let stats = dialog.provide(&format!("{name}/stats")).map_err(err)?;
        let log = dialog.provide(&format!("{name}/log")).map_err(err)?;
        let mut commands = Vec::new();
        for verb in VERBS {
            for target in [name, "all"] {
                let tx = tx.clone();
                let reg = dialog
                    .register_command(&format!("{target}/{verb}"), move |m| {
                        let _ = tx.send(Input::Control(verb, parse_payload(&m.data)));
                    })
                    .map_err(err)?;
                commands.push(reg);
            }
        }
        Ok(ControlLink {
            dialog,
            state,
            stats,
            log,
            _commands: commands,
            since_ms: now_ms(),
            last_state: "",
            last_command: Value::Null,
            log_published: 0,
        })
    }

    /// Publishes the state (when it changed, or `force`), the statistics (with `force`) and
    /// new log records.
    fn publish(&mut self, driver: &Driver, force: bool) {
        let state = driver.state().name();
        let changed = state != self.last_state;
        if changed {
            self.since_ms = now_ms();
        }
        crate::log::muted(|| {
            if changed || force {
                self.last_state = state;
                let v = json!({
                    "name": driver.name(),
                    "kind": driver.kind(),
                    "pid": std::process::id(),
                    "state": state,
                    "run": driver.run(),
                    "since_ms": self.since_ms,
                    "error": driver.failure(),
                    "last_command": self.last_command,
                });
                let _ = self.state.update(v.to_string().as_bytes());
                let _ = self.stats.update(driver.stats().to_string().as_bytes());
            }
            let last = crate::log::last_seq();
            if last > self.log_published {
                let window = crate::log::window(driver.name());
                if let Ok(text) = serde_json::to_string(&window) {
                    let _ = self.log.update(text.as_bytes());
                }
                self.log_published = last;
            }
        });
    }
}

fn reply(out: &Mutex<std::io::Stdout>, v: &Value) {
    let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

/// Runs a component process until `quit`, the end of input (without a control address) or a
/// signal. Returns whether the component failed during its life.
pub fn run(registry: Registry, options: Options) -> Result<bool, ProcessError> {
    set_process_name(&options.name);
    let stop_signal = signal_flag()?;
    let mut driver = Driver::new(registry, &options.kind, &options.name, options.config.clone());
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut failed = false;
    if let Some(run) = options.start {
        let start = |e: daqflow_component::ComponentError| ProcessError::Start {
            name: options.name.clone(),
            reason: e.to_string(),
        };
        let info = driver.configure(None).map_err(start)?;
        driver.start(run).map_err(start)?;
        reply(&out, &json!({ "ok": true, "state": driver.state().name(), "result": info }));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Input>();
    let mut link = match &options.control {
        Some(addr) => Some(ControlLink::join(addr, &options.name, tx.clone())?),
        None => None,
    };
    tracing::info!(kind = %options.kind, pid = std::process::id(), "component started");
    let stdin_ends = link.is_none();
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Input::Line(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            if stdin_ends {
                let _ = tx.send(Input::End);
            }
        })
        .map_err(|e| ProcessError::Setup(e.to_string()))?;
    if let Some(l) = link.as_mut() {
        l.publish(&driver, true);
    }
    event_loop(&mut driver, &rx, &mut link, &out, stop_signal, &mut failed);
    // End of input, quit or a signal: end a run in progress with its summary.
    failed |= driver.failure().is_some();
    if matches!(driver.state(), State::Running | State::Paused)
        || driver.run().is_some() && driver.state() == State::Error
    {
        let r = driver.stop(None).map_err(|e| e.to_string());
        reply(&out, &answer(&driver, r));
    }
    let _ = driver.reset();
    tracing::info!("component ends");
    if let Some(l) = link.as_mut() {
        l.publish(&driver, true);
        l.dialog.shutdown();
    }
    Ok(failed)
}

fn event_loop(
    driver: &mut Driver,
    rx: &Receiver<Input>,
    link: &mut Option<ControlLink>,
    out: &Mutex<std::io::Stdout>,
    stop_signal: &AtomicBool,
    failed: &mut bool,
) {
    let mut next_publish = Instant::now();
    let mut reported: Option<String> = None;
    loop {
        let input = rx.recv_timeout(Duration::from_millis(100));
        // A failure during the run is reported as soon as it is seen.
        let f = driver.failure();
        if f.is_some() && f != reported {
            tracing::error!(error = f.as_deref().unwrap_or(""), "component failed");
            reply(out, &json!({ "event": "error", "error": f }));
            reported = f;
            *failed = true;
        }
        match input {
            Ok(Input::End) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                if stop_signal.load(Ordering::Relaxed) {
                    return;
                }
                if let Some(l) = link.as_mut() {
                    let force = Instant::now() >= next_publish;
                    l.publish(driver, force);
                    if force {
                        next_publish = Instant::now() + Duration::from_secs(1);
                    }
                }
            }
            Ok(Input::Line(line)) => {
                let (v, quit) = line_command(driver, line.trim());
                if let Some(l) = link.as_mut() {
                    l.last_command = json!({ "id": null, "command": line.trim(), "ok": v["ok"], "result": v.get("result"), "error": v.get("error") });
                    l.publish(driver, true);
                }
                if !v.is_null() {
                    reply(out, &v);
                }
                if quit {
                    return;
                }
            }
            Ok(Input::Control(verb, payload)) => {
                let result = control_command(driver, verb, &payload);
                match &result {
                    Ok(_) => tracing::info!(command = verb, state = driver.state().name(), "command done"),
                    Err(e) => tracing::warn!(command = verb, error = %e, "command refused or failed"),
                }
                let v = answer(driver, result);
                if let Some(l) = link.as_mut() {
                    l.last_command = json!({
                        "id": payload.get("id"),
                        "command": verb,
                        "ok": v["ok"],
                        "result": v.get("result"),
                        "error": v.get("error"),
                    });
                    l.publish(driver, true);
                }
            }
        }
    }
}

/// Names the process after the component (what `ps` and `top` show; at most 15 bytes).
pub fn set_process_name(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from `buf`, which
    // lives across the call and ends with a NUL.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// A flag set by SIGTERM or SIGINT (installed on first call).
pub fn signal_flag() -> Result<&'static AtomicBool, ProcessError> {
    static FLAG: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        FLAG.store(true, Ordering::SeqCst);
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_signal` is async-signal-safe (one atomic store) and lives for the whole
        // program; `signal` only replaces the disposition of these two signals.
        let r = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        if r == libc::SIG_ERR {
            return Err(ProcessError::Setup("installing the signal handler failed".into()));
        }
    }
    Ok(&FLAG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_numbers_json_or_text() {
        assert_eq!(parse_payload(b""), Value::Null);
        assert_eq!(parse_payload(b" 12 "), json!({"n": 12}));
        assert_eq!(parse_payload(br#"{"run":3,"id":9}"#), json!({"run": 3, "id": 9}));
        assert_eq!(parse_payload(b"\xff garbage"), json!({"text": "\u{fffd} garbage"}));
    }
}
