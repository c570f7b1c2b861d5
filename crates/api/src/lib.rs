//! # daqflow-api: the operator's contract with its clients
//!
//! The operator's contract with its clients (the web server, the command line, scripts): the
//! [`Transition`]s of a whole system, its live [`SystemStatus`], the [`RunSummary`] of a run and
//! the [`RunRecord`]s of the run database, and the [`LogQuery`] of the message log with its
//! [`LogRecord`]s. The operator produces these, the web server serves them as JSON (their serde
//! form is the HTTP API's, `docs/web.md`), and nothing in between reads them by string key.
//! Also the [`alarms`] as the operator shows them, and the history's queries and series.
//!
//! ```
//! use daqflow_api::{SystemState, Transition};
//! let t = Transition::parse("start", br#"{"run": 12}"#).unwrap();
//! assert_eq!(t, Transition::Start { run: Some(12) });
//! assert_eq!(t.allowed_from(), [SystemState::Configured]);
//! assert!(Transition::parse("launch", b"").is_err());
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use daqflow_metrics::{Exposition, MetricType, Value};
use serde::{Deserialize, Serialize};

pub use daqflow_component::log::{LogRecord, Severity};
/// The typed schema of a kind's configuration (`GET /api/schema`).
pub use daqflow_component::schema;
/// The contract's types the API's carry (a client needs no other crate).
pub use daqflow_component::{Info, Role, SlowValue, State, Stats, TriggerCounts, Verb};

pub mod alarms;

/// A time for people, `2026-11-22 03:15:09 UTC`, from nanoseconds since the Unix epoch: how the
/// operator's lock file, `daqflow inspect` and the console write a time (one function, so that
/// they all read alike).
///
/// ```
/// assert_eq!(daqflow_api::utc(1_795_317_309_000_000_000), "2026-11-22 03:15:09 UTC");
/// ```
pub fn utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem / 60 % 60, rem % 60)
}
mod history;
pub use history::{HistoryPoint, HistoryQuery, HistorySeries};

/// A transition of the whole system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transition", rename_all = "lowercase")]
pub enum Transition {
    /// Initial → Configured.
    Configure,
    /// Configured → Running: run `run`, or the next number.
    Start {
        /// The run number; the next one when absent.
        #[serde(default)]
        run: Option<u32>,
    },
    /// Running → Paused.
    Pause,
    /// Paused → Running.
    Resume,
    /// Running, Paused, Error or Mixed → Configured: the run ends and is recorded.
    Stop,
    /// Initial, Configured, Error or Mixed → Initial (dead components started again). Not
    /// while a run goes on (Running, Paused): a run ends with a stop, which records it (an
    /// Error or Mixed system with a run open is reset with the run closed as failed).
    Reset,
}

/// Why a transition request could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransitionError(pub String);

impl Transition {
    /// Every transition's name, in the order of the state machine: the components' commands
    /// ([`Verb::ALL`]), which a system's transition sends to every component.
    pub const NAMES: [&'static str; 6] = [
        Verb::ALL[0].name(),
        Verb::ALL[1].name(),
        Verb::ALL[2].name(),
        Verb::ALL[3].name(),
        Verb::ALL[4].name(),
        Verb::ALL[5].name(),
    ];

    /// The command each component gets.
    pub fn verb(self) -> Verb {
        match self {
            Transition::Configure => Verb::Configure,
            Transition::Start { .. } => Verb::Start,
            Transition::Pause => Verb::Pause,
            Transition::Resume => Verb::Resume,
            Transition::Stop => Verb::Stop,
            Transition::Reset => Verb::Reset,
        }
    }

    /// The transition's name (its components' command's).
    pub fn name(self) -> &'static str {
        self.verb().name()
    }

    /// The transition `name` with its argument `body`: for start, nothing or a JSON object
    /// `{"run": N}` (N from 1); for the others, nothing (an empty body, `null` or `{}`).
    pub fn parse(name: &str, body: &[u8]) -> Result<Transition, TransitionError> {
        const START: &str =
            "start takes no body (the next run) or a JSON object {\"run\": N} with N from 1 to 4294967295";
        let body = std::str::from_utf8(body).map_err(|_| TransitionError("the body is not UTF-8".into()))?.trim();
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct StartArg {
            #[serde(default)]
            run: Option<u32>,
        }
        let no_body = |t: Transition| {
            let nothing = body.is_empty()
                || match serde_json::from_str::<serde_json::Value>(body) {
                    Ok(serde_json::Value::Null) => true,
                    Ok(serde_json::Value::Object(o)) => o.is_empty(),
                    _ => false,
                };
            if nothing {
                Ok(t)
            } else {
                Err(TransitionError(format!("{name} takes no argument (send no body, null or {{}})")))
            }
        };
        let Some(verb) = Verb::parse(name) else {
            return Err(TransitionError(format!("unknown transition `{name}` ({})", Transition::NAMES.join(", "))));
        };
        match verb {
            Verb::Configure => no_body(Transition::Configure),
            Verb::Start => {
                let arg: StartArg = if body.is_empty() || body == "null" {
                    StartArg { run: None }
                } else {
                    // Through a Value: serde would read a struct from an array too (`[3]`).
                    let value: serde_json::Value = serde_json::from_str(body)
                        .map_err(|e| TransitionError(format!("start: the body is not valid JSON ({e}); {START}")))?;
                    if !value.is_object() {
                        return Err(TransitionError(format!("start: the body is not a JSON object; {START}")));
                    }
                    serde_json::from_value(value).map_err(|e| TransitionError(format!("start: {e}; {START}")))?
                };
                if arg.run == Some(0) {
                    return Err(TransitionError(format!("start: run numbers start at 1; {START}")));
                }
                Ok(Transition::Start { run: arg.run })
            }
            Verb::Pause => no_body(Transition::Pause),
            Verb::Resume => no_body(Transition::Resume),
            Verb::Stop => no_body(Transition::Stop),
            Verb::Reset => no_body(Transition::Reset),
            Verb::Set => Err(TransitionError(format!(
                "unknown transition `set` ({}); parameters are set with POST /api/set",
                Transition::NAMES.join(", ")
            ))),
        }
    }

    /// Whether it may be requested while the system is in `state`. Where the components agree
    /// (Initial, Configured, Running, Paused), the components' own table
    /// ([`Verb::transition`], the one table of the state machine), with one rule of the
    /// operator's: an open run (Running, Paused) is stopped, and so recorded, before the
    /// system is reset. A system in Error or Mixed may be stopped (what runs ends, what failed
    /// is collected) or reset, nothing else; nothing while a transition is under way.
    pub fn allowed_in(self, state: SystemState) -> bool {
        use SystemState::*;
        let verb = self.verb();
        let component = match state {
            Error | Mixed => return matches!(verb, Verb::Stop | Verb::Reset),
            Running | Paused if verb == Verb::Reset => return false,
            Initial => State::Initial,
            Configured => State::Configured,
            Running => State::Running,
            Paused => State::Paused,
            Configuring | Starting | Pausing | Resuming | Stopping | Resetting => return false,
        };
        verb.allowed_in(component)
    }

    /// The system states it may be requested in ([`Transition::allowed_in`]), in
    /// [`SystemState::ALL`]'s order.
    pub fn allowed_from(self) -> Vec<SystemState> {
        SystemState::ALL.into_iter().filter(|s| self.allowed_in(*s)).collect()
    }

    /// The phase the system is in while the transition is under way.
    pub fn phase(self) -> SystemState {
        match self {
            Transition::Configure => SystemState::Configuring,
            Transition::Start { .. } => SystemState::Starting,
            Transition::Pause => SystemState::Pausing,
            Transition::Resume => SystemState::Resuming,
            Transition::Stop => SystemState::Stopping,
            Transition::Reset => SystemState::Resetting,
        }
    }
}

/// What a transition that succeeded returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransitionResult {
    /// Configure: what each component told the others.
    Configured(BTreeMap<String, Info>),
    /// Start: the run number.
    Started(u32),
    /// Stop: the run's summary (also in the run database).
    Stopped(Box<RunSummary>),
    /// Pause, resume, reset.
    Done,
}

/// The state of a whole system: every component's when they agree, or a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SystemState {
    /// Every component is Initial.
    Initial,
    /// Every component is Configured.
    Configured,
    /// Every component is Running.
    Running,
    /// Every component is Paused.
    Paused,
    /// A component is in Error or its process is dead.
    Error,
    /// The components are in different states.
    Mixed,
    /// Configure is under way.
    Configuring,
    /// Start is under way.
    Starting,
    /// Pause is under way.
    Pausing,
    /// Resume is under way.
    Resuming,
    /// Stop is under way.
    Stopping,
    /// Reset is under way.
    Resetting,
}

impl SystemState {
    /// Every state: the settled ones, then the phases.
    pub const ALL: [SystemState; 12] = [
        SystemState::Initial,
        SystemState::Configured,
        SystemState::Running,
        SystemState::Paused,
        SystemState::Error,
        SystemState::Mixed,
        SystemState::Configuring,
        SystemState::Starting,
        SystemState::Pausing,
        SystemState::Resuming,
        SystemState::Stopping,
        SystemState::Resetting,
    ];

    /// The state's name (`Running`, …).
    pub fn name(self) -> &'static str {
        match self {
            SystemState::Initial => "Initial",
            SystemState::Configured => "Configured",
            SystemState::Running => "Running",
            SystemState::Paused => "Paused",
            SystemState::Error => "Error",
            SystemState::Mixed => "Mixed",
            SystemState::Configuring => "Configuring",
            SystemState::Starting => "Starting",
            SystemState::Pausing => "Pausing",
            SystemState::Resuming => "Resuming",
            SystemState::Stopping => "Stopping",
            SystemState::Resetting => "Resetting",
        }
    }

    /// Whether a transition is under way.
    pub fn is_phase(self) -> bool {
        matches!(
            self,
            SystemState::Configuring
                | SystemState::Starting
                | SystemState::Pausing
                | SystemState::Resuming
                | SystemState::Stopping
                | SystemState::Resetting
        )
    }
}

impl From<State> for SystemState {
    fn from(s: State) -> SystemState {
        match s {
            State::Initial => SystemState::Initial,
            State::Configured => SystemState::Configured,
            State::Running => SystemState::Running,
            State::Paused => SystemState::Paused,
            State::Error => SystemState::Error,
        }
    }
}

impl std::fmt::Display for SystemState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A component as the operator sees it: its process and its state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ComponentState {
    /// Its process was started and has not joined the control plane yet.
    Starting,
    /// Initial.
    Initial,
    /// Configured.
    Configured,
    /// Running.
    Running,
    /// Paused.
    Paused,
    /// Error.
    Error,
    /// Its process ended.
    Dead,
}

impl From<State> for ComponentState {
    fn from(s: State) -> ComponentState {
        match s {
            State::Initial => ComponentState::Initial,
            State::Configured => ComponentState::Configured,
            State::Running => ComponentState::Running,
            State::Paused => ComponentState::Paused,
            State::Error => ComponentState::Error,
        }
    }
}

impl ComponentState {
    /// The state machine's state, for a component whose process is up and joined.
    pub fn state(self) -> Option<State> {
        match self {
            ComponentState::Initial => Some(State::Initial),
            ComponentState::Configured => Some(State::Configured),
            ComponentState::Running => Some(State::Running),
            ComponentState::Paused => Some(State::Paused),
            ComponentState::Error => Some(State::Error),
            ComponentState::Starting | ComponentState::Dead => None,
        }
    }

    /// The name (`Running`, `Dead`, …).
    pub fn name(self) -> &'static str {
        match self {
            ComponentState::Starting => "Starting",
            ComponentState::Dead => "Dead",
            other => other.state().map_or("?", State::name),
        }
    }
}

impl std::fmt::Display for ComponentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the operator does when a component dies or fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Stop the run (the default).
    #[default]
    Stop,
    /// Start the process again and bring it back into the run (at most the system's
    /// `restart_max` times in a run, each further restart after a longer back-off); past the
    /// cap it counts as lost to the run.
    Restart,
    /// Its death or failure is logged and the run goes on without it.
    Expendable,
}

/// One component in the [`SystemStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentView {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its role in the accounting.
    pub role: Role,
    /// Its host (`localhost` for a local one).
    pub host: String,
    /// Its process id (the last one).
    pub pid: Option<u32>,
    /// The CPUs its process may run on, as it last reported them (the kernel's list form
    /// `0-3,8`: what its `cpus` pinned it to, or all the operator's); absent before it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Whether its process runs.
    pub alive: bool,
    /// Its state.
    pub state: ComponentState,
    /// The run it takes or last took.
    pub run: Option<u32>,
    /// Since when (Unix ms) it is in its state.
    pub since_ms: u64,
    /// Why it is in Error or dead.
    pub error: Option<String>,
    /// How often the operator started it again.
    pub restarts: u32,
    /// Its policy.
    pub policy: Policy,
    /// Its live counters (the kind's detail without bulky parts such as histograms).
    pub stats: Stats,
}

/// One point of the rate plot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    /// When (Unix ms).
    pub t_ms: u64,
    /// Events built per second.
    pub events_per_s: f64,
    /// MB built per second.
    pub mb_per_s: f64,
}

/// The whole system's live status (`GET /api/status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemStatus {
    /// The system's name.
    pub system: String,
    /// Its state, or the phase under way.
    pub state: SystemState,
    /// The run taken or last taken.
    pub run: Option<u32>,
    /// Whether a run is open.
    pub running: bool,
    /// When the open run started (Unix ms).
    pub run_started_ms: Option<u64>,
    /// How long the open run has been going (s).
    pub duration_s: Option<f64>,
    /// Events built: in the open run, else in the last run.
    pub events: u64,
    /// Bytes built in the open run.
    pub bytes: u64,
    /// Events recorded: in the open run, else in the last run.
    pub recorded: u64,
    /// Events built per second (last second).
    pub events_per_s: f64,
    /// MB built per second (last second).
    pub mb_per_s: f64,
    /// Events lost in the last run stopped, while no run is open (its `RunSummary::lost`); `None`
    /// while a run is open (its losses are known only from its accounting, at its stop) and
    /// before the first run was stopped.
    pub lost: Option<u64>,
    /// The last transition's error.
    pub last_error: Option<String>,
    /// The summary of the last run stopped, while no run is open (`None` while one is).
    pub last_summary: Option<Box<RunSummary>>,
    /// The control servers (`A,B,…`).
    pub control: String,
    /// The data directory.
    pub data: PathBuf,
    /// Every component, in the system file's order.
    pub components: Vec<ComponentView>,
    /// Rates of the last minutes, once a second.
    pub rates: Vec<RatePoint>,
    /// The parameters set over the system file's for the next configure and the runs after it
    /// (`COMPONENT.KEY` → value).
    #[serde(default)]
    pub overrides: BTreeMap<String, serde_json::Value>,
    /// The components the open run goes on without, with why (a component under the
    /// `expendable` policy, or a group member while its group keeps its minimum).
    #[serde(default)]
    pub degraded: BTreeMap<String, String>,
}

/// A process on the control plane (`GET /api/processes`): the control server's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// Its dialog name.
    pub name: String,
    /// Host of its listening socket.
    pub host: String,
    /// Port of its listening socket.
    pub port: u16,
    /// Operating-system process id.
    pub pid: u32,
    /// When the process started (ns since the Unix epoch).
    pub start_time_ns: u64,
    /// Its last heartbeat (ns since the Unix epoch).
    pub last_heartbeat_ns: u64,
    /// Services it provides.
    pub provides: Vec<String>,
    /// Services it subscribes to.
    pub subscribes: Vec<String>,
    /// Commands it accepts.
    pub commands: Vec<String>,
}

impl SystemStatus {
    /// The status in Prometheus' text exposition format (names prefixed `daqflow_`,
    /// `docs/web.md`, "Metrics"): the system's figures labelled `system`, then every
    /// component's ([`component_metrics`]) and how often the operator restarted it.
    pub fn to_prometheus(&self) -> String {
        let mut e = Exposition::new();
        let sys = [("system", self.system.as_str())];
        e.family("daqflow_run_number", "The run taken or last taken.", MetricType::Gauge)
            .sample(&sys, self.run.unwrap_or(0));
        e.family("daqflow_running", "1 while a run is on.", MetricType::Gauge).sample(&sys, self.running);
        e.family("daqflow_events_built_total", "Events built in the current run.", MetricType::Counter)
            .sample(&sys, self.events);
        e.family("daqflow_bytes_built_total", "Bytes built in the current run.", MetricType::Counter)
            .sample(&sys, self.bytes);
        e.family("daqflow_events_recorded_total", "Events recorded in the current run.", MetricType::Counter)
            .sample(&sys, self.recorded);
        e.family("daqflow_events_per_second", "Events built per second (last second).", MetricType::Gauge)
            .sample(&sys, self.events_per_s);
        e.family("daqflow_megabytes_per_second", "MB built per second (last second).", MetricType::Gauge)
            .sample(&sys, self.mb_per_s);
        let views: Vec<ComponentMetrics<'_>> = self
            .components
            .iter()
            .map(|c| ComponentMetrics {
                name: &c.name,
                kind: &c.kind,
                state: c.state.name(),
                up: c.alive,
                run: c.run,
                stats: &c.stats,
            })
            .collect();
        component_metrics(&mut e, &views);
        let mut restarts = e.family(
            "daqflow_component_restarts_total",
            "Times the operator restarted the component.",
            MetricType::Counter,
        );
        for c in &self.components {
            restarts.sample(&[("component", &c.name), ("kind", &c.kind)], c.restarts);
        }
        e.into_string()
    }
}

/// A component as its metrics show it: its labels and what it counts ([`component_metrics`]).
#[derive(Debug, Clone, Copy)]
pub struct ComponentMetrics<'a> {
    /// Its name (label `component`).
    pub name: &'a str,
    /// Its kind (label `kind`).
    pub kind: &'a str,
    /// Its state's name (label `state` of `daqflow_component_state`).
    pub state: &'a str,
    /// Whether its process runs.
    pub up: bool,
    /// The run it takes or last took.
    pub run: Option<u32>,
    /// Its counters.
    pub stats: &'a Stats,
}

/// Writes the families every component has, one sample per component labelled `component` and
/// `kind`: `daqflow_component_up`, `daqflow_component_state` (1, with `state`),
/// `daqflow_component_run`, `daqflow_component_events_total`, `daqflow_component_bytes_total`,
/// `daqflow_component_events_per_second`, `daqflow_component_megabytes_per_second` and
/// `daqflow_component_stat` (with `stat`: each number of the kind's `detail`), and for the slow
/// values a component reads from elsewhere (`Stats::slow`) `daqflow_slow_value` (with `name` and
/// `unit`) and `daqflow_slow_severity` (with `name`). The operator's
/// `/metrics` writes them for every component of its system, `daqflow component --metrics`
/// for itself: the same names either way.
pub fn component_metrics(e: &mut Exposition, components: &[ComponentMetrics<'_>]) {
    fn labels<'a>(c: &ComponentMetrics<'a>) -> [(&'static str, &'a str); 2] {
        [("component", c.name), ("kind", c.kind)]
    }
    let mut per = |name: &'static str, help: &str, kind: MetricType, f: &dyn Fn(&ComponentMetrics<'_>) -> Value| {
        let mut family = e.family(name, help, kind);
        for c in components {
            family.sample(&labels(c), f(c));
        }
    };
    per("daqflow_component_up", "1 while the component's process runs.", MetricType::Gauge, &|c| c.up.into());
    per("daqflow_component_run", "The run the component takes or last took (0: none yet).", MetricType::Gauge, &|c| {
        c.run.unwrap_or(0).into()
    });
    per(
        "daqflow_component_events_total",
        "Events the component handled in the run, in the sense of its role.",
        MetricType::Counter,
        &|c| c.stats.events.into(),
    );
    per("daqflow_component_bytes_total", "Bytes of those events.", MetricType::Counter, &|c| c.stats.bytes.into());
    per("daqflow_component_events_per_second", "The component's event rate (last second).", MetricType::Gauge, &|c| {
        c.stats.events_per_s.into()
    });
    per(
        "daqflow_component_megabytes_per_second",
        "The component's data rate (last second).",
        MetricType::Gauge,
        &|c| c.stats.mb_per_s.into(),
    );
    let mut state = e.family("daqflow_component_state", "1 for the state each component is in.", MetricType::Gauge);
    for c in components {
        state.sample(&[("component", c.name), ("kind", c.kind), ("state", c.state)], 1u32);
    }
    let mut stat = e.family(
        "daqflow_component_stat",
        "Each numeric figure of the kind's own statistics (`detail` in NAME/stats).",
        MetricType::Gauge,
    );
    for c in components {
        if let Some(o) = c.stats.detail.as_object() {
            for (k, v) in o {
                let value = match (v.as_u64(), v.as_f64()) {
                    (Some(n), _) => Value::Unsigned(n),
                    (None, Some(x)) => Value::Float(x),
                    _ => continue,
                };
                stat.sample(&[("component", c.name), ("kind", c.kind), ("stat", k)], value);
            }
        }
    }
    if components.iter().all(|c| c.stats.slow.is_empty()) {
        return;
    }
    let mut slow = e.family(
        "daqflow_slow_value",
        "Each slow value a component reads from elsewhere (`slow` in NAME/stats: an EPICS PV), in its source's unit.",
        MetricType::Gauge,
    );
    for c in components {
        for (name, v) in &c.stats.slow {
            if let Some(x) = v.value.filter(|x| x.is_finite()) {
                let unit = v.unit.as_deref().unwrap_or("");
                slow.sample(
                    &[("component", c.name), ("kind", c.kind), ("name", name), ("unit", unit)],
                    Value::Float(x),
                );
            }
        }
    }
    let mut severity = e.family(
        "daqflow_slow_severity",
        "Each slow value's severity at its source: 0 none, 1 minor, 2 major, 3 invalid (disconnected).",
        MetricType::Gauge,
    );
    for c in components {
        for (name, v) in &c.stats.slow {
            if let Some(s) = v.severity {
                severity.sample(&[("component", c.name), ("kind", c.kind), ("name", name)], u32::from(s));
            }
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Under way.
    Running,
    /// Stopped without an error.
    Stopped,
    /// Stopped with errors (a component failed or died, a command failed).
    Failed,
    /// Left open by an operator that ended without stopping it.
    Abandoned,
}

impl RunState {
    /// The name (`stopped`, …), as stored in the run database.
    pub fn name(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Stopped => "stopped",
            RunState::Failed => "failed",
            RunState::Abandoned => "abandoned",
        }
    }

    /// The state of a name.
    pub fn parse(s: &str) -> Option<RunState> {
        [RunState::Running, RunState::Stopped, RunState::Failed, RunState::Abandoned]
            .into_iter()
            .find(|r| r.name() == s)
    }
}

/// Events lost for one cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostReason {
    /// How many.
    pub events: u64,
    /// Why, and where they were.
    pub reason: String,
}

/// A component that ended the run dead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Died {
    /// Its name.
    pub component: String,
    /// Its kind.
    pub kind: String,
    /// How its process ended.
    pub why: String,
}

/// One data file of a run, as found on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The component that wrote it.
    pub component: String,
    /// Its path.
    pub path: PathBuf,
    /// Whole event records in it.
    pub events: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The first event id in it.
    pub first_event: Option<u64>,
    /// The last event id in it.
    pub last_event: Option<u64>,
    /// Closed properly (a trailer); false for a `.part` file whose writer died.
    pub complete: bool,
}

/// What a run's summary keeps of one component.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentRecord {
    /// Its kind.
    pub kind: String,
    /// Its stop summary, when it gave one.
    pub summary: Option<Stats>,
    /// Its last live counters, when it gave no summary (it died).
    pub last_stats: Option<Stats>,
    /// Why it ended the run dead, if it did.
    pub died: Option<String>,
    /// How many earlier lives (restarts) it had in the run.
    pub earlier_lives: usize,
}

/// The accounting of a run, as the operator finds it from its components and the files on
/// disk (`daqflow_runcontrol::accounting::account`; `docs/operator-guide.md`, "The accounting
/// of a run"): the one type of it, in every run's summary.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunAccounting {
    /// Events triggered (the event manager's count; unknown when it died).
    pub triggered: Option<u64>,
    /// Events rejected by the high-level trigger (likewise).
    pub rejected: Option<u64>,
    /// Events built.
    pub events: u64,
    /// Events in the recorders' files.
    pub recorded: u64,
    /// Bytes recorded (built, without recorders).
    pub bytes: u64,
    /// Events lost: the sum of `lost_reasons`.
    pub lost: u64,
    /// Each cause of loss with its count.
    pub lost_reasons: Vec<LostReason>,
    /// What cannot be known, plainly.
    pub unknown: Vec<String>,
    /// False when something cannot be known (`unknown` says what).
    pub accounting_complete: bool,
    /// Triggered but not built (the event manager's accounting).
    pub lost_in_builder: u64,
    /// Built but not recorded.
    pub not_recorded: u64,
    /// Recorded more than once.
    pub duplicates: u64,
    /// The components that ended the run dead.
    pub died: Vec<Died>,
}

/// The summary of a run: what was triggered, built, recorded and written, what was lost and
/// why (`docs/operator-guide.md`, "The accounting of a run").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run number.
    pub run: u32,
    /// The system's name.
    pub system: String,
    /// How the run ended.
    pub state: RunState,
    /// Its errors, joined (`None` for a run stopped without error).
    pub error: Option<String>,
    /// Started (Unix ms).
    pub started_ms: u64,
    /// Stopped (Unix ms).
    pub stopped_ms: u64,
    /// Its length (s).
    pub seconds: f64,
    /// Its accounting: what was triggered, built, recorded, lost and why (its fields are the
    /// summary's own in JSON; `summary.events` reads them, through `Deref`).
    #[serde(flatten)]
    pub accounting: RunAccounting,
    /// The data files of the run.
    pub files: Vec<FileRecord>,
    /// Files of the run that could not be read, with the reason.
    pub file_problems: Vec<String>,
    /// Every component's counters.
    pub components: BTreeMap<String, ComponentRecord>,
    /// The errors of the run (the same as `error`, one by one).
    pub errors: Vec<String>,
    /// The parameters set over the system file's for this run (`COMPONENT.KEY` → value; the
    /// operator's `set`, `POST /api/set`); empty when the run took the system file as it is.
    #[serde(default)]
    pub overrides: BTreeMap<String, serde_json::Value>,
    /// The components the run went on without, each `NAME: why` (degraded running).
    #[serde(default)]
    pub degraded: Vec<String>,
    /// The live parameters changed during the run, in order.
    #[serde(default)]
    pub changes: Vec<ParameterChange>,
    /// The histograms and counters the components ended the run with, as `GET /api/histograms`
    /// gives them (a parallel group's summed): what the web UI's Runs view draws, a reference
    /// run's overlay, and `daqflow export RUN --histograms` writes for ROOT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub histograms: Vec<serde_json::Value>,
}

impl std::ops::Deref for RunSummary {
    type Target = RunAccounting;
    fn deref(&self) -> &RunAccounting {
        &self.accounting
    }
}

impl std::ops::DerefMut for RunSummary {
    fn deref_mut(&mut self) -> &mut RunAccounting {
        &mut self.accounting
    }
}

/// A live parameter changed during a run (`set NAME.KEY=VALUE` while Configured, Running or
/// Paused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterChange {
    /// When the component took it (Unix ms).
    pub t_ms: u64,
    /// The component.
    pub component: String,
    /// The parameter.
    pub key: String,
    /// Its new value.
    pub value: serde_json::Value,
}

/// A run in the run database's history (`GET /api/runs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run number.
    pub run: u32,
    /// The system's name.
    pub system: String,
    /// Started (Unix ms).
    pub started_ms: u64,
    /// Stopped (Unix ms), once it is.
    pub stopped_ms: Option<u64>,
    /// Its state.
    pub state: RunState,
    /// Events built.
    pub events: Option<u64>,
    /// Events recorded.
    pub recorded: Option<u64>,
    /// Events lost.
    pub lost: Option<u64>,
    /// Bytes.
    pub bytes: Option<u64>,
    /// Its error.
    pub error: Option<String>,
}

/// One run's whole record (`GET /api/runs/N`): the row, the configuration it ran with, its
/// summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunDetail {
    /// The row.
    #[serde(flatten)]
    pub record: RunRecord,
    /// The system file it ran with.
    pub config: String,
    /// Its summary, once it was stopped (none for a run abandoned).
    pub summary: Option<RunSummary>,
    /// What it ran with beyond the system file: digests, overrides, every component's
    /// parameters, the run it repeats (none for a run recorded before provenance was kept).
    #[serde(default)]
    pub provenance: Option<RunProvenance>,
    /// The parameters changed while it ran, in order.
    #[serde(default)]
    pub changes: Vec<ParameterChange>,
}

/// Where a run's configuration came from and what it was (`docs/operator-guide.md`,
/// "Provenance"), kept in the run database beside the system file's text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunProvenance {
    /// SHA-256 of the system file's bytes as read (64 hex digits): what every data file of the
    /// run holds in its header's `config_digest`.
    pub system_digest: String,
    /// SHA-256 of the effective configuration (64 hex digits): the system file followed by one
    /// line per override (`# set COMPONENT.KEY = VALUE`); the system digest when there is none.
    pub effective_digest: String,
    /// The parameters set over the system file's (`COMPONENT.KEY` → value).
    #[serde(default)]
    pub overrides: BTreeMap<String, serde_json::Value>,
    /// Every component's parameters as it runs with them when the run opens (as configured:
    /// references resolved, overrides applied; with the live changes made since): component →
    /// table.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    /// The run whose configuration this one repeats (`daqflow run --repeat N`).
    #[serde(default)]
    pub repeat_of: Option<u32>,
}

/// A filter of the message log (`GET /api/logs` query parameters, `daqflow logs` options).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogQuery {
    /// Records at or after (Unix ms).
    pub since_ms: Option<u64>,
    /// Records at or before (Unix ms).
    pub until_ms: Option<u64>,
    /// One process (component name).
    pub process: Option<String>,
    /// At least this severe.
    pub min_severity: Option<Severity>,
    /// Message contains this text, literally, case-insensitively for ASCII letters.
    pub text: Option<String>,
    /// At most this many (default 200, at most [`LogQuery::MAX_LIMIT`]).
    pub limit: Option<usize>,
}

impl LogQuery {
    /// The most records one query returns.
    pub const MAX_LIMIT: usize = 10_000;
    /// Records returned when `limit` is not given.
    pub const DEFAULT_LIMIT: usize = 200;

    /// The number of records to return.
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(LogQuery::DEFAULT_LIMIT).min(LogQuery::MAX_LIMIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's table, as docs/operator-guide.md gives it: derived from the components'
    /// table, it must say exactly this.
    #[test]
    fn the_systems_transitions_are_the_components_table_with_the_operators_rules() {
        use SystemState::*;
        for (t, from) in [
            (Transition::Configure, &[Initial][..]),
            (Transition::Start { run: None }, &[Configured]),
            (Transition::Pause, &[Running]),
            (Transition::Resume, &[Paused]),
            (Transition::Stop, &[Running, Paused, Error, Mixed]),
            (Transition::Reset, &[Initial, Configured, Error, Mixed]),
        ] {
            assert_eq!(t.allowed_from(), from, "{}", t.name());
        }
    }

    #[test]
    fn transitions_parse_from_their_name_and_body() {
        assert_eq!(Transition::parse("start", b"").unwrap(), Transition::Start { run: None });
        assert_eq!(Transition::parse("stop", b"{}").unwrap(), Transition::Stop);
        assert_eq!(Transition::parse("reset", b" { } ").unwrap(), Transition::Reset);
        assert_eq!(Transition::parse("start", br#"{"run": null}"#).unwrap(), Transition::Start { run: None });
        for (name, body, why) in [
            ("start", &br#"{"run": -1}"#[..], "start:"),
            ("start", br#"{"run": 1, "x": 2}"#, "unknown field"),
            ("start", br#"{"run": 0}"#, "start at 1"),
            ("start", b"[3]", "JSON object"),
            ("pause", br#"{"run": 1}"#, "pause takes no argument"),
            ("stop", b"{not json", "stop takes no argument"),
            ("boot", b"", "unknown transition `boot` (configure, start, pause, resume, stop, reset)"),
        ] {
            let e = Transition::parse(name, body).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        for name in Transition::NAMES {
            assert_eq!(Transition::parse(name, b"").unwrap().name(), name);
        }
    }

    #[test]
    fn prometheus_has_the_system_and_every_component_typed() {
        let view = ComponentView {
            name: "bu-\"0".into(),
            kind: "bu".into(),
            role: Role::Builder,
            host: "localhost".into(),
            pid: Some(7),
            cpus: None,
            alive: true,
            state: ComponentState::Running,
            run: Some(3),
            since_ms: 0,
            error: None,
            restarts: 2,
            policy: Policy::Restart,
            stats: Stats::counted(100, 1000)
                .with_rates(10.0, 0.01)
                .with_detail(&serde_json::json!({"flagged": 1, "name": "x"})),
        };
        let status = SystemStatus {
            system: "demo".into(),
            state: SystemState::Running,
            run: Some(3),
            running: true,
            run_started_ms: Some(1),
            duration_s: Some(2.0),
            events: 100,
            bytes: 1000,
            recorded: 90,
            events_per_s: 10.0,
            mb_per_s: 0.01,
            lost: None,
            last_error: None,
            last_summary: None,
            control: "127.0.0.1:1".into(),
            data: "/d".into(),
            components: vec![view],
            rates: vec![],
            overrides: Default::default(),
            degraded: Default::default(),
        };
        let m = status.to_prometheus();
        for line in [
            "daqflow_run_number{system=\"demo\"} 3",
            "daqflow_events_recorded_total{system=\"demo\"} 90",
            "daqflow_component_state{component=\"bu-\\\"0\",kind=\"bu\",state=\"Running\"} 1",
            "daqflow_component_restarts_total{component=\"bu-\\\"0\",kind=\"bu\"} 2",
            "daqflow_component_events_total{component=\"bu-\\\"0\",kind=\"bu\"} 100",
            "daqflow_component_stat{component=\"bu-\\\"0\",kind=\"bu\",stat=\"flagged\"} 1",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing from\n{m}");
        }
        assert!(!m.contains("stat=\"name\""), "only numbers are samples");
        assert!(!m.contains("daqflow_slow_value"), "no family without a slow value");
        let back: SystemStatus = serde_json::from_str(&serde_json::to_string(&status).unwrap()).unwrap();
        assert_eq!(back, status);

        // A component with slow values from elsewhere (an EPICS PV, one disconnected).
        let mut status = status;
        let slow = &mut status.components[0].stats.slow;
        let pv = |value, severity| daqflow_component::SlowValue {
            value,
            unit: Some("V".into()),
            severity: Some(severity),
            ..Default::default()
        };
        slow.insert("HV:CH1:VMON".into(), pv(Some(1512.5), 1));
        slow.insert("HV:CH2:VMON".into(), pv(None, 3));
        let m = status.to_prometheus();
        for line in [
            "daqflow_slow_value{component=\"bu-\\\"0\",kind=\"bu\",name=\"HV:CH1:VMON\",unit=\"V\"} 1512.5",
            "daqflow_slow_severity{component=\"bu-\\\"0\",kind=\"bu\",name=\"HV:CH1:VMON\"} 1",
            "daqflow_slow_severity{component=\"bu-\\\"0\",kind=\"bu\",name=\"HV:CH2:VMON\"} 3",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} missing from\n{m}");
        }
        assert!(!m.contains("name=\"HV:CH2:VMON\",unit"), "a disconnected PV has no value: {m}");
    }

    proptest::proptest! {
        #[test]
        fn any_transition_request_is_a_transition_or_an_error(
            name in proptest::sample::select(vec!["configure", "start", "pause", "resume", "stop", "reset", "x", ""]),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            if let Ok(t) = Transition::parse(name, &body) {
                proptest::prop_assert_eq!(t.name(), name);
            }
        }

        #[test]
        fn any_log_query_text_is_a_query_or_an_error(text in ".{0,60}") {
            let _ = serde_json::from_str::<LogQuery>(&text);
        }
    }

    #[test]
    fn severities_are_ordered_and_parse_loosely() {
        assert!(Severity::Error > Severity::Warn && Severity::Debug < Severity::Info);
        assert_eq!(Severity::parse("WARNING"), Some(Severity::Warn));
        assert_eq!(Severity::parse("loud"), None);
        assert_eq!(serde_json::to_string(&Severity::Warn).unwrap(), "\"warn\"");
    }

    #[test]
    fn log_queries_refuse_unknown_keys_and_bound_the_limit() {
        let q: LogQuery = serde_json::from_str(r#"{"min_severity": "warn", "limit": 99999}"#).unwrap();
        assert_eq!((q.min_severity, q.limit()), (Some(Severity::Warn), LogQuery::MAX_LIMIT));
        assert!(serde_json::from_str::<LogQuery>(r#"{"colour": 1}"#).is_err());
    }
}
