//! What every event-builder component offers to whoever drives it: the state machine of
//! `DESIGN.md` reduced to the commands a process receives (configure, start, stop, reset), live
//! statistics, and a summary at the end of a run.
//!
//! `daqflow component KIND` drives a component from its standard input (one command per line,
//! one JSON answer per line; see `docs/evb.md`); the run-control layer drives the same trait
//! over the control plane.
//!
//! ```no_run
//! use daqflow_evb::component::{Component, State};
//! use daqflow_evb::evm::{Evm, EvmConfig};
//! let mut evm = Evm::new("evm", EvmConfig { rus: 1, ..Default::default() });
//! let info = evm.configure()?;          // binds the listening socket: {"listen": "127.0.0.1:…"}
//! evm.start(1)?;                        // run 1
//! assert_eq!(evm.state(), State::Running);
//! let summary = evm.stop(None)?;        // stops triggering, drains, accounts for every event
//! # let _ = (info, summary);
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

use serde_json::Value;

use crate::EvbError;

/// The states of a component (`DESIGN.md`, process model): the component contract's.
pub use daqflow_component::State;

/// An event-builder component.
pub trait Component: Send {
    /// The kind: `source`, `evm`, `ru` or `bu`.
    fn kind(&self) -> &'static str;
    /// The current state.
    fn state(&self) -> State;
    /// Initial → Configured: checks the configuration and binds listening sockets; returns what
    /// others need to know (e.g. `{"listen": ADDR}`).
    fn configure(&mut self) -> Result<Value, EvbError>;
    /// Configured → Running: connects to the peers and starts the threads.
    fn start(&mut self, run: u32) -> Result<(), EvbError>;
    /// Running → Configured: ends the run and returns its summary. `arg` is kind-specific: a
    /// source produces up to event `arg` before it ends its stream.
    fn stop(&mut self, arg: Option<u64>) -> Result<Value, EvbError>;
    /// Running → Paused: the EVM stops triggering, a source stops sending; RUs and BUs carry on
    /// with what is in flight.
    fn pause(&mut self) -> Result<(), EvbError>;
    /// Paused → Running.
    fn resume(&mut self) -> Result<(), EvbError>;
    /// Any → Initial: stops whatever runs, forgets the run, closes sockets.
    fn reset(&mut self) -> Result<(), EvbError>;
    /// Live counters and rates (JSON object).
    fn stats(&self) -> Value;
    /// Why the component failed during the run, if it did (the driver then reports Error).
    fn failure(&self) -> Option<String>;
}

/// The `stats` answer of a component whose run loop publishes its counters into `live`: those
/// counters (an empty object before the first publication) with the state and the run number.
pub(crate) fn live_stats(live: &std::sync::Mutex<Value>, state: State, run: u32) -> Value {
    let mut v = live.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if !v.is_object() {
        v = serde_json::json!({});
    }
    if let Value::Object(m) = &mut v {
        m.insert("state".into(), serde_json::json!(state.name()));
        m.insert("run".into(), serde_json::json!(run));
    }
    v
}

/// A copy of what a mutex holds, even if a thread panicked while holding it.
pub(crate) fn read<T: Clone>(m: &std::sync::Mutex<T>) -> T {
    m.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Running → Paused, or Paused → Running (`pause` true or false): checks the state, then sets
/// `flag` (what the component's threads watch; `None` for components that follow the data).
pub(crate) fn set_paused(
    state: &mut State,
    pause: bool,
    flag: Option<&std::sync::atomic::AtomicBool>,
) -> Result<(), EvbError> {
    let (command, from, to) =
        if pause { ("pause", State::Running, State::Paused) } else { ("resume", State::Paused, State::Running) };
    expect_state(command, *state, from)?;
    if let Some(f) = flag {
        f.store(pause, std::sync::atomic::Ordering::SeqCst);
    }
    *state = to;
    Ok(())
}

/// Refuses `command` unless the component takes a run (Running or Paused).
pub(crate) fn expect_run(command: &'static str, have: State) -> Result<(), EvbError> {
    if matches!(have, State::Running | State::Paused) {
        Ok(())
    } else {
        Err(EvbError::IllegalTransition { command, state: have.name() })
    }
}

/// The state a component reports: Error once it failed during a run.
pub(crate) fn reported(state: State, failed: bool) -> State {
    if failed && matches!(state, State::Running | State::Paused) { State::Error } else { state }
}

/// Refuses `command` unless the component is in `want`.
pub(crate) fn expect_state(command: &'static str, have: State, want: State) -> Result<(), EvbError> {
    if have == want { Ok(()) } else { Err(EvbError::IllegalTransition { command, state: have.name() }) }
}

/// Range checks of a component's configuration: every problem at once, each naming its key
/// in backquotes (`` `streams` = 0 is out of range: 1 … 4096 ``), as one [`EvbError::Config`].
pub(crate) struct Checks {
    kind: &'static str,
    problems: Vec<String>,
}

impl Checks {
    pub(crate) fn new(kind: &'static str) -> Checks {
        Checks { kind, problems: Vec::new() }
    }

    pub(crate) fn problem(&mut self, key: &str, what: impl std::fmt::Display) {
        self.problems.push(format!("`{key}` {what}"));
    }

    pub(crate) fn int(&mut self, key: &str, value: u64, min: u64, max: u64) {
        if !(min..=max).contains(&value) {
            self.problem(key, format!("= {value} is out of range: {min} … {max}"));
        }
    }

    pub(crate) fn float(&mut self, key: &str, value: f64, min: f64, max: f64) {
        if !(value.is_finite() && (min..=max).contains(&value)) {
            self.problem(key, format!("= {value} is out of range: {min} … {max}"));
        }
    }

    /// A `HOST:PORT` address: a host (IP address or name) and a port 0 … 65535.
    pub(crate) fn address(&mut self, key: &str, value: &str) {
        if value.parse::<std::net::SocketAddr>().is_ok() {
            return;
        }
        let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
            let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
            port.parse::<u16>().is_ok()
                && !host.is_empty()
                && (host.parse::<std::net::IpAddr>().is_ok()
                    || host.split('.').all(|l| {
                        !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    }))
        });
        if !ok {
            self.problem(key, format!("= {value:?} is not an address (HOST:PORT, port 0 … 65535)"));
        }
    }

    pub(crate) fn finish(self) -> Result<(), EvbError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(EvbError::Config(format!("{}: {}", self.kind, self.problems.join("; "))))
        }
    }
}
