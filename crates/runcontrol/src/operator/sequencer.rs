//! The sequencer: what the operator does, as a pure state machine. It is fed the system file,
//! what the components publish (their [`ComponentStatus`] and [`Stats`]), their replies, the
//! ends of their processes, the transitions asked for and the time; it answers with what to
//! do ([`Output`]): requests to send, processes to start, runs to open and close, transitions
//! to answer. The operator's I/O layer ([`Operator`](super::Operator)) does those things and
//! feeds back what happened. Nothing here touches a socket, a process, a file or the clock, so
//! every sequence (a component dying during a stop, a reply that never comes, a restart in a
//! paused run) is tested deterministically on virtual time.
//!
//! The rules it follows:
//! - **configure** in dependency order, one component at a time (a component whose parameters
//!   refer to another's result, `${evm.listen}`, comes after it), each with its resolved
//!   parameters; when one refuses, fails or does not answer in time, the configure is undone:
//!   the components it configured are reset (stop order), the one that did not answer is told
//!   to reset without waiting for it, and the error names it: the system is Initial again, so
//!   that `configure` (or `reset`) works at once;
//! - **start** by start stage, the same stage together; if one fails, those started are
//!   stopped again (in stop order) and the run is closed as failed;
//! - **stop** by stop stage: components whose process is dead are skipped (and named in the
//!   run's errors), `stop_arg` is resolved with the summaries of the stages before;
//! - **pause** in stop order, **resume** in start order, **reset** in stop order after the
//!   processes that died were started again;
//! - every request waits for its reply at most the system's timeout (stop: `stop_timeout_s`);
//!   a request the control plane could not deliver (a process that just joined) is sent again
//!   while its process lives;
//! - when no transition is under way, a component that died or is in Error gets its policy:
//!   `stop` ends an open run, `restart` starts its process again and brings it back to the
//!   system's state (configure, start in the same run, pause). Transitions asked for during a
//!   restart wait for it.
//!
//! ```
//! use std::time::Duration;
//! use daqflow_api::Transition;
//! use daqflow_runcontrol::operator::sequencer::{Input, Now, Output, Sequencer, SequencerConfig};
//! # let registry = daqflow_component::Registry::new();
//! let text = "[system]\nname = 'demo'\n[[component]]\nname = 'a'\nkind = 'x'\ncommand = ['a.out']\n";
//! let file = daqflow_runcontrol::system::SystemFile::parse(text, &registry).unwrap();
//! let mut seq = Sequencer::new(file, SequencerConfig::new("operator"));
//! let now = Now::start();
//! let out = seq.handle(Input::Launch { ticket: 1 }, now);
//! assert_eq!(out, vec![Output::Spawn { name: "a".into() }]);
//! let out = seq.handle(Input::Request { ticket: 2, transition: Transition::Configure }, now.after(Duration::from_millis(5)));
//! assert!(matches!(&out[0], Output::Done { ticket: 2, result: Err(_) }), "{out:?}"); // busy launching
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use daqflow_api::{ComponentState, ParameterChange, Policy, RunSummary, SystemState, Transition, TransitionResult};
use daqflow_component::provenance::SYSTEM_DIGEST_KEY;
use daqflow_component::schema::DRAIN_INTO_RESERVE_KEY;
use daqflow_component::{Answer, Command, CommandReply, ComponentStatus, Info, Request, Stats, Verb};
use serde_json::{Value, json};

use super::OperatorError;
use crate::accounting::ComponentRun;
use crate::system::{ComponentSpec, SystemFile, resolve};

/// A point in time: monotonic for timeouts, wall-clock (Unix ms) for what is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic time.
    pub mono: Instant,
    /// Unix milliseconds.
    pub wall_ms: u64,
}

impl Now {
    /// The current time.
    pub fn current() -> Now {
        Now { mono: Instant::now(), wall_ms: daqflow_component::log::now_ms() }
    }

    /// A start for virtual time (tests): now, at wall-clock 1 000 000 ms.
    pub fn start() -> Now {
        Now { mono: Instant::now(), wall_ms: 1_000_000 }
    }

    /// This time plus `d`.
    pub fn after(self, d: Duration) -> Now {
        Now { mono: self.mono + d, wall_ms: self.wall_ms + d.as_millis() as u64 }
    }
}

/// Settings of the sequencer.
#[derive(Debug, Clone)]
pub struct SequencerConfig {
    /// The dialog name replies go to (`REPLY_TO/reply`).
    pub reply_to: String,
    /// How long a component may take for launch, configure, start, pause, resume and reset
    /// (`system.timeout_s`).
    pub timeout: Duration,
    /// How long a component may take to stop (`system.stop_timeout_s`).
    pub stop_timeout: Duration,
    /// How long reset may take at shutdown.
    pub shutdown_timeout: Duration,
    /// After this long, a request the control plane could not deliver is sent again.
    pub resend_after: Duration,
    /// Where the components' logs are (named in errors).
    pub logs: PathBuf,
}

impl SequencerConfig {
    /// Defaults (20 s, 60 s for stop, 10 s at shutdown), replies to `reply_to`.
    pub fn new(reply_to: &str) -> SequencerConfig {
        SequencerConfig {
            reply_to: reply_to.to_owned(),
            timeout: Duration::from_secs(20),
            stop_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
            resend_after: Duration::from_millis(50),
            logs: PathBuf::from("logs"),
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Start every component's process and wait until each joined the control plane.
    Launch {
        /// Answered with [`Output::Done`].
        ticket: u64,
    },
    /// A transition of the whole system was asked for.
    Request {
        /// Answered with [`Output::Done`].
        ticket: u64,
        /// The transition.
        transition: Transition,
    },
    /// Set (or, with `value` None, take back) parameter `key` of `component`: while the
    /// system is Initial, for the next configure; while Configured, Running or Paused (nothing
    /// under way), a live parameter the component changes at once (and keeps for the next
    /// configure).
    Set {
        /// Answered with [`Output::Done`].
        ticket: u64,
        /// The component.
        component: String,
        /// The parameter, dotted for a nested key (`size.mean`).
        key: String,
        /// Its value; `None` takes an earlier `Set` back.
        value: Option<toml::Value>,
    },
    /// Reset every component at once, briefly, before the processes are ended.
    Shutdown {
        /// Answered with [`Output::Done`].
        ticket: u64,
    },
    /// A component published its state (`NAME/state`).
    Status(ComponentStatus),
    /// A component of a kind this binary does not know published its schema (`NAME/schema`):
    /// what `set` is checked against.
    Schema {
        /// The component.
        name: String,
        /// Its kind's schema.
        schema: std::sync::Arc<daqflow_component::schema::Schema>,
    },
    /// A component published its counters (`NAME/stats`).
    Stats {
        /// The component.
        name: String,
        /// Its counters.
        stats: Stats,
    },
    /// A component replied (`REPLY_TO/reply`).
    Reply(CommandReply),
    /// The control plane had nobody to give request `id` to.
    Undelivered {
        /// The request's id.
        id: u64,
    },
    /// A component's process was started ([`Output::Spawn`]).
    Spawned {
        /// The component.
        name: String,
        /// Its process id.
        pid: u32,
        /// The incarnation it was launched as (`None`: it was given none, a program of the
        /// user's own on another host): only statuses of this incarnation are taken.
        incarnation: Option<u64>,
    },
    /// A component's process could not be started.
    SpawnFailed {
        /// The component.
        name: String,
        /// Why.
        error: String,
    },
    /// A component's process ended.
    Exited {
        /// The component.
        name: String,
        /// How (`signal: 9 (SIGKILL)`, `exit status: 1`).
        status: String,
    },
    /// The run database opened a run ([`Output::OpenRun`]), or why not: the start fails with
    /// this error ([`OperatorError::Invalid`] for a run number taken before).
    RunOpened(Result<u32, OperatorError>),
    /// The run was closed ([`Output::CloseRun`]) with this summary.
    RunClosed(Box<RunSummary>),
    /// The control servers to give processes started from now on changed (`${system.control}`).
    Control(String),
    /// Time passed.
    Tick,
    /// The operator itself did not run for this long (a stopped process, an overloaded host):
    /// what it waits for gets that much longer, so that nothing is late until a full timeout
    /// has passed with the operator running.
    Stalled(Duration),
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send `request` to component `to` (the dialog command `TO/VERB`).
    Send {
        /// The component.
        to: String,
        /// The request.
        request: Request,
    },
    /// Start the component's process (ending a process of it that still runs); answer with
    /// [`Input::Spawned`] or [`Input::SpawnFailed`].
    Spawn {
        /// The component.
        name: String,
    },
    /// Open a run in the run database (`requested`, or the next number); answer with
    /// [`Input::RunOpened`].
    OpenRun {
        /// The run number asked for.
        requested: Option<u32>,
    },
    /// Account and record the run; answer with [`Input::RunClosed`].
    CloseRun(Box<CloseRun>),
    /// Answer the transition (or launch, or shutdown) of `ticket`.
    Done {
        /// The ticket.
        ticket: u64,
        /// The result.
        result: Result<TransitionResult, OperatorError>,
    },
}

/// What the operator needs to account and record a run.
#[derive(Debug, Clone, PartialEq)]
pub struct CloseRun {
    /// The run.
    pub run: u32,
    /// When it started (Unix ms).
    pub started_ms: u64,
    /// Every component's counters and fate.
    pub components: Vec<ComponentRun>,
    /// The directories where components wrote data files.
    pub data: Vec<(String, PathBuf)>,
    /// The run's errors (none: it stopped well).
    pub errors: Vec<String>,
    /// The parameters set over the system file's for this run (`COMPONENT.KEY` → value).
    pub overrides: BTreeMap<String, Value>,
    /// The components the run went on without, each with why.
    pub degraded: Vec<String>,
    /// The live parameters changed during the run.
    pub changes: Vec<ParameterChange>,
}

/// What the sequencer knows of one component.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    /// Its state (Starting until its process joined, Dead after it ended).
    pub state: Option<ComponentState>,
    /// The run it takes or last took.
    pub run: Option<u32>,
    /// Since when it is in its state (Unix ms).
    pub since_ms: u64,
    /// Its error.
    pub error: Option<String>,
    /// Its process id.
    pub pid: Option<u32>,
    /// The CPUs its process may run on, as it last reported them.
    pub cpus: Option<String>,
    /// Whether its process runs.
    pub alive: bool,
    /// How its process ended.
    pub exit: Option<String>,
    /// How often it was started again.
    pub restarts: u32,
    /// How often it was started again in the open run (or since the last run, reset or
    /// configure): what `restart_max` caps.
    pub recent_restarts: u32,
    /// Its last counters.
    pub stats: Stats,
    /// The last counters of its earlier lives in the open run.
    pub earlier: Vec<Stats>,
    /// This life's last counters in the open run, oldest first, at most [`COUNTER_SAMPLES`]:
    /// those its statistics say count the run (`Stats::run`), with the time they were read.
    pub samples: VecDeque<CounterSample>,
    /// The pid of the life that ended: a late state carrying it is not the new life's.
    stale_pid: Option<u32>,
    /// The newest status of this life taken.
    seq: u64,
    /// The incarnation of this life: the one the operator launched last.
    incarnation: Option<u64>,
    /// The other incarnations whose statuses came and were ignored (each logged once; at most
    /// [`FOREIGN_LOGGED`]).
    foreign: Vec<Option<u64>>,
    /// Whether a status's number jumping far ahead was logged (once per launch).
    jump_logged: bool,
}

/// How many foreign incarnations of one component are logged (then no more, until its next
/// launch).
const FOREIGN_LOGGED: usize = 8;

/// How many of a component's last counters a [`View`] keeps (a few seconds' worth: they are
/// published about once a second).
pub const COUNTER_SAMPLES: usize = 8;

/// A component's counters in the open run, as of when it read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSample {
    /// When the component read them (Unix ms, its clock; `Stats::at_ms`, else when they came,
    /// on the operator's).
    pub at_ms: u64,
    /// The run they count.
    pub run: u32,
    /// Its events (in the sense of its role).
    pub events: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl View {
    /// Takes counters the component published at `now_ms` (while it joined the system): the
    /// last ones, and, those of a run, a sample of them (a new run's first forgets the others).
    pub(crate) fn take_stats(&mut self, stats: Stats, now_ms: u64) {
        if let Some(run) = stats.run {
            if self.samples.back().is_some_and(|s| s.run != run) {
                self.samples.clear();
            }
            let at_ms = stats.at_ms.unwrap_or(now_ms);
            if self.samples.back().is_none_or(|s| s.at_ms != at_ms || s.events != stats.events) {
                let (events, bytes) = (stats.events, stats.bytes);
                self.samples.push_back(CounterSample { at_ms, run, events, bytes });
                while self.samples.len() > COUNTER_SAMPLES {
                    self.samples.pop_front();
                }
            }
        }
        self.stats = stats;
    }

    /// Its state as shown (Starting before the first publication).
    pub fn shown(&self) -> ComponentState {
        if !self.alive && self.state.is_some() {
            ComponentState::Dead
        } else {
            self.state.unwrap_or(ComponentState::Starting)
        }
    }

    fn joined(&self) -> bool {
        self.alive && !matches!(self.state, None | Some(ComponentState::Starting) | Some(ComponentState::Dead))
    }
}

/// What the operator shows of the sequencer.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The system's state or the phase under way.
    pub state: SystemState,
    /// The run taken or last taken.
    pub run: Option<u32>,
    /// When the open run started.
    pub run_started_ms: Option<u64>,
    /// Every component, in the system file's order.
    pub views: Vec<(String, View)>,
    /// The last transition's error.
    pub last_error: Option<String>,
    /// The last run's summary.
    pub last_summary: Option<Box<RunSummary>>,
    /// The parameters set over the system file's (`COMPONENT.KEY` → value).
    pub overrides: BTreeMap<String, Value>,
    /// The components the open run goes on without, with why (policy `expendable`, a group
    /// above its minimum).
    pub degraded: BTreeMap<String, String>,
    /// The components the transition under way waits for (to answer, or to join), each with
    /// the command (`configure`, `join`).
    pub waiting_for: Vec<(String, String)>,
    /// What the transition under way (or a component being brought back) waits for; `None`
    /// when nothing is under way.
    pub waiting: Option<Waiting>,
}

/// What the operator waits for: the step under way, and the components it waits on.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// The step: `the stop of run 3 (stage 2 of 4)`, `the configure`, …
    pub what: String,
    /// The components whose answer it waits for.
    pub answers: Vec<String>,
    /// The components it waits for to join the control plane (started, or started again).
    pub joining: Vec<String>,
    /// When the wait times out at the latest.
    pub until: Option<Instant>,
}

impl Waiting {
    /// In words, as of `now`: `the stop of run 3 (stage 2 of 4): the answer of ru-0, ru-1
    /// (at most 12 s more)`.
    pub fn text(&self, now: Instant) -> String {
        let mut parts = Vec::new();
        if !self.answers.is_empty() {
            parts.push(format!("the answer of {}", self.answers.join(", ")));
        }
        if !self.joining.is_empty() {
            parts.push(format!("{} to join the control plane", self.joining.join(", ")));
        }
        let mut text = self.what.clone();
        if !parts.is_empty() {
            text = format!("{text}: {}", parts.join(" and "));
        }
        if let Some(until) = self.until {
            let left = until.saturating_duration_since(now).as_secs_f64().ceil();
            text.push_str(&format!(" (at most {left:.0} s more)"));
        }
        text
    }
}

/// Who waits for a request's reply.
#[derive(Debug, Clone, PartialEq)]
enum Owner {
    Job,
    /// Nobody waits for it, but it must still reach the component, before anything sent to it
    /// later (the reset of a component that did not answer a configure in time, which it takes
    /// once it is done): it outlives the job that sent it.
    Late,
    Restart(String),
    /// A live parameter.
    Live(LiveSet),
}

/// A live parameter sent: answer `ticket`, then keep `key` = `value` of the component.
#[derive(Debug, Clone, PartialEq)]
struct LiveSet {
    ticket: u64,
    key: String,
    value: toml::Value,
}

#[derive(Debug, Clone)]
struct Pending {
    name: String,
    verb: Verb,
    request: Request,
    timeout: Duration,
    deadline: Instant,
    resend_at: Option<Instant>,
    owner: Owner,
}

/// Replies a step waits for.
#[derive(Debug, Default)]
struct Batch {
    waiting: BTreeMap<u64, String>,
    replies: Vec<(String, Result<Answer, OperatorError>)>,
}

/// What comes after the run is closed.
#[derive(Debug)]
enum AfterClose {
    /// A start failed: the system is Configured, the transition fails with this.
    StartFailed(OperatorError),
    /// The run was stopped.
    Stopped,
    /// Reset goes on.
    Reset,
}

#[derive(Debug)]
enum Step {
    /// Waiting for the processes in `joining` to join.
    Launching,
    /// Configuring `order[next - 1]`.
    Configuring { order: Vec<usize>, next: usize },
    /// A configure failed: the components it configured are reset, stage by stage, so that
    /// the system is Initial again; then the configure fails with `failure`.
    Undoing {
        failure: OperatorError,
        /// The components sent configure (each is reset).
        configured: Vec<usize>,
        /// The one that did not answer: sent its reset without waiting for it.
        silent: Option<String>,
        stage: usize,
        errors: Vec<String>,
    },
    /// Waiting for the run database.
    Opening { requested: Option<u32> },
    /// Starting stage `stage`.
    Starting { run: u32, stage: usize, started: Vec<usize> },
    /// A start failed: stopping what started, stage by stage.
    Unwinding {
        run: u32,
        stage: usize,
        started: Vec<usize>,
        failure: OperatorError,
        summaries: BTreeMap<String, Stats>,
    },
    /// Pause, resume or reset, stage by stage.
    Staged { verb: Verb, stages: Vec<Vec<usize>>, stage: usize, first_error: Option<OperatorError> },
    /// A stop from Paused: every component but the triggers resumes first, stage `stage` of
    /// the start order (consumers first), so that what was triggered before the pause is read
    /// out and built; then `Stopping`.
    ReadingOut { run: u32, stage: usize, errors: Vec<String> },
    /// Stopping stage `stage`.
    Stopping { run: u32, stage: usize, summaries: BTreeMap<String, Stats>, errors: Vec<String> },
    /// Waiting for the run to be closed.
    Closing { then: AfterClose },
    /// Reset: waiting for the processes that had died to join again.
    Respawning,
    /// Shutdown: every component resets.
    ShuttingDown,
}

#[derive(Debug)]
struct Job {
    ticket: Option<u64>,
    /// The transition (None: launch or shutdown).
    transition: Option<Transition>,
    step: Step,
    batch: Batch,
    joining: BTreeMap<String, Instant>,
}

#[derive(Debug)]
enum RestartStep {
    /// Backing off: spawn at `until`.
    Waiting {
        until: Instant,
    },
    Spawning,
    Joining {
        deadline: Instant,
    },
    Commanding(Verb),
}

#[derive(Debug)]
struct Restart {
    step: RestartStep,
    /// The system's state to bring the component back to.
    target: SystemState,
    /// Why it is restarted.
    why: String,
}

/// How a job goes on after a step.
enum Flow {
    /// Look again: wait for what the step sent, or take the next step at once.
    Continue,
    /// Wait for an input other than replies (the run database).
    Wait,
    /// The job ends with this result.
    Finished(Result<TransitionResult, OperatorError>),
}

/// The operator's state machine (see the module documentation).
#[derive(Debug)]
pub struct Sequencer {
    file: SystemFile,
    config: SequencerConfig,
    views: HashMap<String, View>,
    results: HashMap<String, Value>,
    system: serde_json::Map<String, Value>,
    run: Option<u32>,
    run_started_ms: Option<u64>,
    /// What the components were last told to be in (Initial, Configured, Running, Paused).
    target: SystemState,
    job: Option<Job>,
    queue: VecDeque<(u64, Transition)>,
    restarts: BTreeMap<String, Restart>,
    restart_failures: Vec<String>,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    handled: HashMap<String, u64>,
    last_error: Option<String>,
    last_summary: Option<Box<RunSummary>>,
    /// Parameters set over the system file's: component → dotted key → value.
    overrides: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// The schemas components of kinds this binary does not know published.
    published: HashMap<String, std::sync::Arc<daqflow_component::schema::Schema>>,
    /// The parameters each component was last configured with (what a run record keeps).
    configured: BTreeMap<String, toml::Table>,
    /// Components the open run goes on without → why.
    dropped: BTreeMap<String, String>,
    /// The live parameters changed in the open run.
    changes: Vec<ParameterChange>,
}

impl Sequencer {
    /// A sequencer for `file`, every component not started yet.
    pub fn new(file: SystemFile, config: SequencerConfig) -> Sequencer {
        let views = file.components.iter().map(|c| (c.name.clone(), View::default())).collect();
        let mut system = serde_json::Map::new();
        system.insert("name".into(), json!(file.system.name));
        Sequencer {
            file,
            config,
            views,
            results: HashMap::new(),
            system,
            run: None,
            run_started_ms: None,
            target: SystemState::Initial,
            job: None,
            queue: VecDeque::new(),
            restarts: BTreeMap::new(),
            restart_failures: Vec::new(),
            pending: BTreeMap::new(),
            next_id: 1,
            handled: HashMap::new(),
            last_error: None,
            last_summary: None,
            overrides: BTreeMap::new(),
            published: HashMap::new(),
            configured: BTreeMap::new(),
            dropped: BTreeMap::new(),
            changes: Vec::new(),
        }
    }

    /// Sets a value of `${system.KEY}` (`id`, `control`, `data`, `database`, `digest`; the
    /// last is also given to every component whose kind takes it, as `system_digest`).
    pub fn set_system_value(&mut self, key: &str, value: Value) {
        self.system.insert(key.to_owned(), value);
    }

    /// The open run and the live parameters changed in it so far, in order (none while no
    /// run is open).
    pub fn run_changes(&self) -> Option<(u32, &[ParameterChange])> {
        self.run.filter(|_| self.run_open()).map(|run| (run, self.changes.as_slice()))
    }

    /// Every component's parameters as it was last configured (references resolved,
    /// overrides applied, the operator's reserved keys in), with the live changes it took
    /// since: component → table, in JSON.
    pub fn configured_params(&self) -> BTreeMap<String, Value> {
        self.configured.iter().map(|(name, t)| (name.clone(), serde_json::to_value(t).unwrap_or(Value::Null))).collect()
    }

    /// The system file.
    pub fn file(&self) -> &SystemFile {
        &self.file
    }

    /// The system's state: the phase under way, else every component's when they agree
    /// (Error when one is in Error or dead, Mixed when they differ). Components being
    /// restarted do not count; one told to reset once it is done with a configure it did not
    /// answer in time counts as Initial until it answers that reset (what it becomes).
    pub fn state(&self) -> SystemState {
        if let Some(job) = &self.job {
            if let Some(t) = job.transition {
                return t.phase();
            }
            // The components being started come up Initial.
            if matches!(job.step, Step::Launching) {
                return SystemState::Initial;
            }
        }
        let mut states = self
            .file
            .components
            .iter()
            .filter(|c| !self.restarts.contains_key(&c.name) && !self.dropped.contains_key(&c.name))
            .map(|c| match self.views[&c.name].shown() {
                ComponentState::Error | ComponentState::Dead => self.views[&c.name].shown(),
                _ if self.resetting_late(&c.name) => ComponentState::Initial,
                shown => shown,
            });
        let Some(first) = states.next() else { return SystemState::Initial };
        let all: Vec<ComponentState> = std::iter::once(first).chain(states).collect();
        if all.iter().any(|s| matches!(s, ComponentState::Error | ComponentState::Dead)) {
            SystemState::Error
        } else if all.iter().all(|s| *s == first) {
            first.state().map_or(SystemState::Mixed, SystemState::from)
        } else {
            SystemState::Mixed
        }
    }

    /// Whether `name` was told to reset once it is done with a configure it did not answer in
    /// time, and has not answered that reset yet.
    fn resetting_late(&self, name: &str) -> bool {
        self.pending.values().any(|p| p.name == name && p.owner == Owner::Late && p.verb == Verb::Reset)
    }

    /// Whether a run is open (started, not yet stopped and recorded).
    pub fn run_open(&self) -> bool {
        self.run_started_ms.is_some()
    }

    /// One component's view.
    pub fn view(&self, name: &str) -> Option<&View> {
        self.views.get(name)
    }

    /// What the operator shows.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            state: self.state(),
            run: self.run,
            run_started_ms: self.run_started_ms,
            views: self.file.components.iter().map(|c| (c.name.clone(), self.views[&c.name].clone())).collect(),
            last_error: self.last_error.clone(),
            last_summary: self.last_summary.clone(),
            overrides: self.overrides_flat(),
            degraded: self.dropped.clone(),
            waiting_for: self.waiting_for(),
            waiting: self.waiting(),
        }
    }

    /// The components the job waits for, with what for.
    fn waiting_for(&self) -> Vec<(String, String)> {
        let Some(job) = &self.job else { return Vec::new() };
        let replies = job.batch.waiting.iter().map(|(id, name)| {
            let verb = self.pending.get(id).map_or("reply", |p| p.verb.name());
            (name.clone(), verb.to_owned())
        });
        replies.chain(job.joining.keys().map(|n| (n.clone(), "join".to_owned()))).collect()
    }

    /// What the job under way waits for (else a component being brought back).
    fn waiting(&self) -> Option<Waiting> {
        let Some(job) = &self.job else {
            let (name, restart) = self.restarts.iter().next()?;
            return Some(Waiting {
                what: format!("bringing {name} back ({})", restart.why),
                answers: Vec::new(),
                joining: Vec::new(),
                until: None,
            });
        };
        let what = match &job.step {
            Step::Launching => "the start of the system".to_owned(),
            Step::Configuring { .. } => "the configure".to_owned(),
            Step::Undoing { .. } => {
                "undoing the configure, which failed (every configured component resets)".to_owned()
            }
            Step::Opening { .. } => "the run database, to open the run".to_owned(),
            Step::Starting { run, stage, .. } => {
                format!("the start of run {run} (stage {stage} of {})", self.file.stages(true).len())
            }
            Step::Unwinding { run, .. } => format!("undoing the start of run {run}, which failed"),
            Step::Staged { verb, stages, stage, .. } => format!("the {verb} (stage {stage} of {})", stages.len()),
            Step::ReadingOut { run, stage, .. } => format!(
                "the stop of run {run}: resuming all but the trigger to read out what it triggered before the pause \
                 (stage {stage} of {})",
                self.file.stages(true).len()
            ),
            Step::Stopping { run, stage, .. } => {
                format!("the stop of run {run} (stage {stage} of {})", self.file.stages(false).len())
            }
            Step::Closing { .. } => "the run database, to record the run".to_owned(),
            Step::Respawning => "the reset".to_owned(),
            Step::ShuttingDown => "every component to reset".to_owned(),
        };
        let deadlines = job.batch.waiting.keys().filter_map(|id| self.pending.get(id)).map(|p| p.deadline);
        Some(Waiting {
            what,
            answers: job.batch.waiting.values().cloned().collect(),
            joining: job.joining.keys().cloned().collect(),
            until: deadlines.chain(job.joining.values().copied()).max(),
        })
    }

    /// The earliest time something times out or must be sent again (the I/O layer ticks then
    /// at the latest).
    pub fn next_deadline(&self) -> Option<Instant> {
        let pending = self.pending.values().map(|p| p.resend_at.unwrap_or(p.deadline).min(p.deadline));
        let joining = self.job.iter().flat_map(|j| j.joining.values().copied());
        let restarts = self.restarts.values().filter_map(|r| match r.step {
            RestartStep::Joining { deadline } => Some(deadline),
            RestartStep::Waiting { until } => Some(until),
            _ => None,
        });
        pending.chain(joining).chain(restarts).min()
    }

    /// Handles one input; what to do.
    pub fn handle(&mut self, input: Input, now: Now) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::Launch { ticket } => self.launch(ticket, now, &mut out),
            Input::Request { ticket, transition } => self.request(ticket, transition, now, &mut out),
            Input::Shutdown { ticket } => self.shutdown(ticket, now, &mut out),
            Input::Set { ticket, component, key, value } => {
                if self.job.is_none() && self.state() == SystemState::Initial {
                    let result = self.set(&component, &key, value).map(|()| TransitionResult::Done);
                    out.push(Output::Done { ticket, result });
                } else if let Err(e) = self.set_live(ticket, &component, &key, value, now, &mut out) {
                    out.push(Output::Done { ticket, result: Err(e) });
                }
            }
            Input::Status(s) => self.on_status(s, now, &mut out),
            Input::Schema { name, schema } => {
                if self.spec_index(&name).is_some() {
                    self.published.insert(name, schema);
                }
            }
            Input::Stats { name, stats } => {
                if let Some(v) = self.views.get_mut(&name) {
                    // Until the new life has published its state, statistics are the old life's.
                    if v.joined() {
                        v.take_stats(stats, now.wall_ms);
                    }
                }
            }
            Input::Reply(r) => self.on_reply(r, now, &mut out),
            Input::Undelivered { id } => {
                if let Some(p) = self.pending.get_mut(&id) {
                    p.resend_at = Some(now.mono + self.config.resend_after);
                }
            }
            Input::Spawned { name, pid, incarnation } => self.on_spawned(&name, pid, incarnation, now),
            Input::SpawnFailed { name, error } => self.on_spawn_failed(&name, error, now, &mut out),
            Input::Exited { name, status } => self.on_exited(&name, status, now, &mut out),
            Input::RunOpened(r) => self.on_run_opened(r, now, &mut out),
            Input::RunClosed(summary) => self.on_run_closed(summary, now, &mut out),
            Input::Control(list) => {
                self.system.insert("control".into(), json!(list));
            }
            Input::Tick => self.on_tick(now, &mut out),
            Input::Stalled(gap) => self.forgive(gap),
        }
        if self.job.is_none() {
            self.after_job(now, &mut out);
        }
        out
    }
}

impl Sequencer {
    fn spec_index(&self, name: &str) -> Option<usize> {
        self.file.components.iter().position(|c| c.name == name)
    }

    /// The values `${NAME.KEY}` refers to: configure results, `system`, and `extra`.
    fn references(&self, extra: &BTreeMap<String, Stats>) -> HashMap<String, Value> {
        let mut r = self.results.clone();
        r.insert("system".into(), Value::Object(self.system.clone()));
        for (name, stats) in extra {
            // A stop summary: its counters and its kind's figures, side by side.
            let mut m = match serde_json::to_value(stats) {
                Ok(Value::Object(m)) => m,
                _ => serde_json::Map::new(),
            };
            if let Value::Object(d) = &stats.detail {
                for (k, v) in d {
                    m.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            r.insert(name.clone(), Value::Object(m));
        }
        r
    }

    /// Sets (or takes back) a parameter for the next configure.
    fn set(&mut self, component: &str, key: &str, value: Option<toml::Value>) -> Result<(), OperatorError> {
        let state = self.state();
        if self.job.is_some() || state != SystemState::Initial {
            return Err(OperatorError::Invalid(format!(
                "parameters are set while the system is Initial (they apply at the next configure); it is {}: reset it first",
                state.name()
            )));
        }
        let value = self.check_key(component, key, value, false)?;
        let entry = self.overrides.entry(component.to_owned()).or_default();
        match value {
            Some(v) => {
                tracing::info!(component, key, value = %v, "parameter set for the next configure");
                entry.insert(key.to_owned(), v);
            }
            None => {
                entry.remove(key);
                tracing::info!(component, key, "parameter set back to the system file's");
            }
        }
        self.overrides.retain(|_, m| !m.is_empty());
        Ok(())
    }

    /// Sends a live parameter to its component (answered when it replies).
    fn set_live(
        &mut self,
        ticket: u64,
        component: &str,
        key: &str,
        value: Option<toml::Value>,
        now: Now,
        out: &mut Vec<Output>,
    ) -> Result<(), OperatorError> {
        let state = self.state();
        if self.job.is_some() || !matches!(state, SystemState::Configured | SystemState::Running | SystemState::Paused)
        {
            return Err(OperatorError::Invalid(format!(
                "parameters change while the system is Initial (for the next configure) or, the live ones, while \
                 Configured, Running or Paused; it is {}",
                state.name()
            )));
        }
        let value = self.check_key(component, key, value, true)?;
        let Some(value) = value else {
            return Err(OperatorError::Invalid(format!(
                "`{component}.{key}` can be taken back only while Initial; set it to a value instead"
            )));
        };
        let v = &self.views[component];
        if self.restarts.contains_key(component) || self.dropped.contains_key(component) || !v.joined() {
            return Err(OperatorError::Invalid(format!(
                "{component} is {}: it takes no parameter now",
                if self.dropped.contains_key(component) {
                    "out of the run".into()
                } else {
                    v.shown().name().to_owned()
                }
            )));
        }
        let json = serde_json::to_value(&value).unwrap_or(Value::Null);
        let owner = Owner::Live(LiveSet { ticket, key: key.to_owned(), value });
        self.send(component, Command::Set { key: key.to_owned(), value: json }, owner, self.config.timeout, now, out);
        Ok(())
    }

    /// A live parameter's reply: the ticket's answer; the value kept and the change recorded.
    fn live_done(
        &mut self,
        component: &str,
        LiveSet { ticket, key, value }: LiveSet,
        result: Result<Answer, OperatorError>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let result = match result {
            Ok(_) => {
                let run = self.run.filter(|_| self.run_open());
                tracing::info!(
                    component,
                    key = %key,
                    value = %value,
                    run = run.unwrap_or(0),
                    "live parameter {component}.{key} = {value}{}",
                    run.map(|r| format!(" in run {r}")).unwrap_or_default()
                );
                let json = serde_json::to_value(&value).unwrap_or(Value::Null);
                if run.is_some() {
                    self.changes.push(ParameterChange {
                        t_ms: now.wall_ms,
                        component: component.to_owned(),
                        key: key.clone(),
                        value: json,
                    });
                }
                // What the component now runs with, for the record of the runs to come.
                if let Some(params) = self.configured.get_mut(component) {
                    set_dotted(params, &key, value.clone());
                }
                self.overrides.entry(component.to_owned()).or_default().insert(key, value);
                Ok(TransitionResult::Done)
            }
            // The component's refusal is the caller's mistake (400), with the component's reason.
            Err(OperatorError::Component { component, reason, .. })
                if !reason.starts_with("no answer")
                    && !reason.starts_with("the process")
                    && reason != "not on the control plane" =>
            {
                Err(OperatorError::Invalid(format!("{component}: {reason}")))
            }
            Err(e) => Err(e),
        };
        out.push(Output::Done { ticket, result });
    }

    /// Checks that `component` is one and `key` a parameter name it could have.
    fn check_key(
        &self,
        component: &str,
        key: &str,
        value: Option<toml::Value>,
        live: bool,
    ) -> Result<Option<toml::Value>, OperatorError> {
        let Some(i) = self.spec_index(component) else {
            let names: Vec<&str> = self.file.components.iter().map(|c| c.name.as_str()).collect();
            return Err(OperatorError::Invalid(format!(
                "no component `{component}` (the system's: {})",
                names.join(", ")
            )));
        };
        if key.is_empty() || key.split('.').any(str::is_empty) || key.len() > 200 {
            return Err(OperatorError::Invalid(format!(
                "`{key}` is not a parameter name (dotted for nested keys: size.mean)"
            )));
        }
        if key.split('.').next() == Some(SYSTEM_DIGEST_KEY) {
            return Err(OperatorError::Invalid(format!(
                "`{SYSTEM_DIGEST_KEY}` is set by the operator (the system file's digest), not by `set`"
            )));
        }
        if key == DRAIN_INTO_RESERVE_KEY {
            return Err(OperatorError::Invalid(format!(
                "`{DRAIN_INTO_RESERVE_KEY}` is set by the operator, not by `set`: a stop while a writer is throttled \
                 by its disk tells it to drain into its disk's reserve"
            )));
        }
        // The key must not cross a value that is not a table in the system file's parameters.
        let mut table = &self.file.components[i].params;
        let parts: Vec<&str> = key.split('.').collect();
        for (n, p) in parts[..parts.len() - 1].iter().enumerate() {
            match table.get(*p) {
                Some(toml::Value::Table(t)) => table = t,
                Some(_) => {
                    return Err(OperatorError::Invalid(format!(
                        "`{component}.{}` is not a table: `{key}` cannot be set",
                        parts[..=n].join(".")
                    )));
                }
                None => break,
            }
        }
        // The kind's schema, where this binary knows it: the key must exist (and be live for a
        // live change), the value be of its type and range: the rule configure applies.
        let published = self.published.get(component);
        let Some(schema) = self.file.components[i].schema.as_deref().or(published.map(|s| &**s)) else {
            return Ok(value);
        };
        let live_key = schema.key_named(key).filter(|k| !k.live.is_empty());
        if live && live_key.is_none() {
            let keys: Vec<String> = schema
                .live_keys()
                // The operator's own (refused above), not one to offer.
                .filter(|k| k.name != DRAIN_INTO_RESERVE_KEY)
                .map(|k| format!("{} ({})", k.name, k.live.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")))
                .collect();
            let list = if keys.is_empty() {
                format!("{component} ({}) has no live parameters", schema.kind)
            } else {
                format!("the live parameters of {component} are: {}", keys.join(", "))
            };
            let why = match schema.key_named(key) {
                Some(_) => format!("`{key}` cannot change after configure"),
                None => schema.unknown(key),
            };
            return Err(OperatorError::Invalid(format!("{component}: {why}; {list}")));
        }
        match value {
            None if schema.key_named(key).is_some() => Ok(None),
            None => schema
                .check_value(key, toml::Value::Table(Default::default()))
                .map(|_| None)
                .map_err(|e| OperatorError::Invalid(format!("{component}: {e}"))),
            Some(v) => {
                schema.check_value(key, v).map(Some).map_err(|e| OperatorError::Invalid(format!("{component}: {e}")))
            }
        }
    }

    /// Every override as `COMPONENT.KEY` → its value in JSON.
    fn overrides_flat(&self) -> BTreeMap<String, Value> {
        let mut flat = BTreeMap::new();
        for (component, keys) in &self.overrides {
            for (key, value) in keys {
                flat.insert(format!("{component}.{key}"), serde_json::to_value(value).unwrap_or(Value::Null));
            }
        }
        flat
    }

    /// A component's parameters with the overrides set over them and their references
    /// resolved.
    fn resolved_params(&self, spec: &ComponentSpec) -> Result<toml::Table, OperatorError> {
        let refs = self.references(&BTreeMap::new());
        let mut params = spec.params.clone();
        for (key, value) in self.overrides.get(&spec.name).into_iter().flatten() {
            let mut parts: Vec<&str> = key.split('.').collect();
            let last = parts.pop().unwrap_or_default();
            let mut t = &mut params;
            for p in parts {
                let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                match entry {
                    toml::Value::Table(inner) => t = inner,
                    _ => {
                        return Err(OperatorError::Invalid(format!(
                            "{}: `{key}` crosses a value that is not a table",
                            spec.name
                        )));
                    }
                }
            }
            t.insert(last.to_owned(), value.clone());
        }
        match resolve(&toml::Value::Table(params), &refs) {
            Ok(toml::Value::Table(mut t)) => {
                // The system file's digest, for the headers of the component's data files.
                if spec.system_digest
                    && let Some(Value::String(digest)) = self.system.get("digest")
                {
                    t.insert(SYSTEM_DIGEST_KEY.to_owned(), toml::Value::String(digest.clone()));
                }
                Ok(t)
            }
            Ok(_) => Ok(toml::Table::new()),
            Err(reason) => {
                Err(OperatorError::Component { component: spec.name.clone(), command: "configure".into(), reason })
            }
        }
    }

    fn send(
        &mut self,
        name: &str,
        command: Command,
        owner: Owner,
        timeout: Duration,
        now: Now,
        out: &mut Vec<Output>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let request = Request { id, reply_to: Some(self.config.reply_to.clone()), command };
        let verb = request.command.verb();
        self.pending.insert(
            id,
            Pending {
                name: name.to_owned(),
                verb,
                request: request.clone(),
                timeout,
                deadline: now.mono + timeout,
                resend_at: None,
                owner,
            },
        );
        if self.pending.values().any(|p| p.name == name && p.resend_at.is_some()) {
            // An earlier request to it waits to be delivered again (it was off the control
            // plane): this one goes after it, so that it takes them in order.
            if let Some(p) = self.pending.get_mut(&id) {
                p.resend_at = Some(now.mono);
            }
        } else {
            out.push(Output::Send { to: name.to_owned(), request });
        }
        id
    }

    fn send_for(
        &mut self,
        batch: &mut Batch,
        name: &str,
        command: Command,
        timeout: Duration,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let id = self.send(name, command, Owner::Job, timeout, now, out);
        batch.waiting.insert(id, name.to_owned());
    }

    /// Ends request `id` with `result` and lets its owner go on.
    fn finish_request(&mut self, id: u64, result: Result<Answer, OperatorError>, now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.pending.remove(&id) else { return };
        match p.owner {
            Owner::Job => {
                let Some(job) = self.job.as_mut() else { return };
                if job.batch.waiting.remove(&id).is_some() {
                    job.batch.replies.push((p.name, result));
                    if job.batch.waiting.is_empty() {
                        self.advance(now, out);
                    }
                }
            }
            Owner::Late => {
                if let Err(e) = result {
                    tracing::warn!("{e}");
                }
            }
            Owner::Restart(name) => self.restart_step_done(&name, result, now, out),
            Owner::Live(set) => self.live_done(&p.name, set, result, now, out),
        }
    }

    fn fail_request(&mut self, id: u64, reason: String, now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.pending.get(&id) else { return };
        let e = OperatorError::Component { component: p.name.clone(), command: p.verb.name().into(), reason };
        self.finish_request(id, Err(e), now, out);
    }

    /// Takes a status; whether the component joined the control plane with it. Only a status
    /// of the incarnation launched last is taken (others are logged once each), and of those
    /// one newer than the last taken ([`ComponentStatus::is_newer_than`]: a number far ahead
    /// of the real ones, forged or corrupted, does not hide them).
    fn take_status(&mut self, s: &ComponentStatus) -> bool {
        let Some(v) = self.views.get_mut(&s.name) else { return false };
        if !v.alive || Some(s.pid) == v.stale_pid {
            return false;
        }
        if s.incarnation != v.incarnation {
            if !v.foreign.contains(&s.incarnation) && v.foreign.len() < FOREIGN_LOGGED {
                v.foreign.push(s.incarnation);
                let shown = |i: Option<u64>| i.map_or_else(|| "none".to_owned(), |i| i.to_string());
                tracing::warn!(
                    component = %s.name,
                    "ignoring the statuses of {} that name incarnation {} (pid {}): the operator launched incarnation {}",
                    s.name,
                    shown(s.incarnation),
                    s.pid,
                    shown(v.incarnation)
                );
            }
            return false;
        }
        if v.state.is_some() && !s.is_newer_than(v.seq) {
            return false; // older than what we have
        }
        if v.state.is_some() && s.seq > v.seq.saturating_add(daqflow_component::SEQ_WINDOW) && !v.jump_logged {
            v.jump_logged = true;
            tracing::warn!(
                component = %s.name,
                "a status of {} jumps from number {} to {}: taken, but it does not hide the next real ones (logged once)",
                s.name,
                v.seq,
                s.seq
            );
        }
        let was = v.joined();
        v.state = Some(s.state.into());
        v.run = s.run;
        v.since_ms = s.since_ms;
        v.error = s.error.clone();
        v.pid = Some(s.pid);
        v.cpus = s.cpus.clone();
        v.seq = s.seq;
        !was && v.joined()
    }

    fn on_status(&mut self, s: ComponentStatus, now: Now, out: &mut Vec<Output>) {
        if self.take_status(&s) {
            self.joined(&s.name, now, out);
        }
    }

    fn joined(&mut self, name: &str, now: Now, out: &mut Vec<Output>) {
        if let Some(job) = self.job.as_mut()
            && job.joining.remove(name).is_some()
            && job.joining.is_empty()
        {
            self.advance(now, out);
        }
        if let Some(r) = self.restarts.get(name)
            && matches!(r.step, RestartStep::Joining { .. })
        {
            self.restart_step_done(name, Ok(Answer::Nothing), now, out);
        }
    }

    fn on_reply(&mut self, r: CommandReply, now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.pending.get(&r.id) else {
            tracing::debug!(id = r.id, component = %r.status.name, "a reply nobody waits for (late, or not ours)");
            return;
        };
        if p.name != r.status.name || p.verb != r.command {
            tracing::warn!(
                id = r.id,
                "a reply from {} to {} does not match request {} ({} to {})",
                r.status.name,
                r.command,
                r.id,
                p.verb,
                p.name
            );
            return;
        }
        let (id, name, verb) = (r.id, p.name.clone(), p.verb);
        // The reply's status is the component's right after the command, maybe newer than
        // what `NAME/state` brought so far.
        if self.take_status(&r.status) {
            self.joined(&name, now, out);
        }
        let result = r.result().map_err(|reason| OperatorError::Component {
            component: name,
            command: verb.name().into(),
            reason,
        });
        self.finish_request(id, result, now, out);
    }

    fn on_spawned(&mut self, name: &str, pid: u32, incarnation: Option<u64>, now: Now) {
        if let Some(v) = self.views.get_mut(name) {
            v.alive = true;
            v.exit = None;
            v.pid = Some(pid);
            v.state = None;
            v.seq = 0;
            v.incarnation = incarnation;
            v.foreign.clear();
            v.jump_logged = false;
            v.since_ms = now.wall_ms;
        }
        if let Some(r) = self.restarts.get_mut(name)
            && matches!(r.step, RestartStep::Spawning)
        {
            r.step = RestartStep::Joining { deadline: now.mono + self.config.timeout };
        }
    }

    fn on_spawn_failed(&mut self, name: &str, error: String, now: Now, out: &mut Vec<Output>) {
        tracing::error!(component = %name, "starting {name} failed: {error}");
        if self.job.as_ref().is_some_and(|j| j.joining.contains_key(name)) {
            self.fail_join(name, error.clone(), out);
        }
        if self.restarts.contains_key(name) {
            self.restart_failed(name, error, now, out);
        }
    }

    fn on_exited(&mut self, name: &str, status: String, now: Now, out: &mut Vec<Output>) {
        let Some(v) = self.views.get_mut(name) else { return };
        v.stale_pid = v.pid;
        v.alive = false;
        v.exit = Some(status.clone());
        v.state = Some(ComponentState::Dead);
        v.since_ms = now.wall_ms;
        tracing::error!(component = %name, "the process of {name} ended: {status}");
        let ids: Vec<u64> = self.pending.iter().filter(|(_, p)| p.name == name).map(|(&id, _)| id).collect();
        for id in ids {
            self.fail_request(id, format!("the process ended ({status})"), now, out);
        }
        let see =
            format!("the process ended ({status}); see {}", self.config.logs.join(format!("{name}.log")).display());
        if self.job.as_ref().is_some_and(|j| j.joining.contains_key(name)) {
            self.fail_join(name, see.clone(), out);
        }
        if self.restarts.get(name).is_some_and(|r| !matches!(r.step, RestartStep::Commanding(_))) {
            self.restart_failed(name, see, now, out);
        }
    }

    /// A process the job waits for did not join: the job fails.
    fn fail_join(&mut self, name: &str, reason: String, out: &mut Vec<Output>) {
        let Some(job) = self.job.take() else { return };
        let command = if job.transition.is_some() { "reset" } else { "launch" };
        let e = OperatorError::Component { component: name.to_owned(), command: command.into(), reason };
        self.end_job(job, Err(e), out);
    }

    /// After a stall of the operator's own: every deadline it waits for moves by `gap`.
    fn forgive(&mut self, gap: Duration) {
        for p in self.pending.values_mut() {
            p.deadline += gap;
            if let Some(t) = p.resend_at.as_mut() {
                *t += gap;
            }
        }
        if let Some(job) = self.job.as_mut() {
            for d in job.joining.values_mut() {
                *d += gap;
            }
        }
        for r in self.restarts.values_mut() {
            if let RestartStep::Joining { deadline } = &mut r.step {
                *deadline += gap;
            }
        }
    }

    fn on_tick(&mut self, now: Now, out: &mut Vec<Output>) {
        let due: Vec<(u64, bool)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now.mono || p.resend_at.is_some_and(|t| t <= now.mono))
            .map(|(&id, p)| (id, p.deadline <= now.mono))
            .collect();
        // Of the requests to one component that wait to be delivered again, only the oldest
        // goes in one round: the next ones once it was delivered (a component that joins again
        // registers its commands one by one, and must take them in the order they were sent).
        let mut oldest_waiting: BTreeMap<&str, u64> = BTreeMap::new();
        for (&id, p) in self.pending.iter().filter(|(_, p)| p.resend_at.is_some()) {
            oldest_waiting.entry(p.name.as_str()).or_insert(id);
        }
        let oldest_waiting: BTreeMap<String, u64> =
            oldest_waiting.into_iter().map(|(n, id)| (n.to_owned(), id)).collect();
        for (id, expired) in due {
            let Some(p) = self.pending.get(&id) else { continue };
            let alive = self.views.get(&p.name).is_some_and(|v| v.alive);
            if !expired && p.resend_at.is_some() && alive && oldest_waiting.get(&p.name).is_some_and(|&o| o != id) {
                continue;
            }
            if p.resend_at.is_some() && (expired || !alive) {
                self.fail_request(id, "not on the control plane".into(), now, out);
            } else if expired {
                let reason = format!("no answer within {:.0} s", p.timeout.as_secs_f64());
                self.fail_request(id, reason, now, out);
            } else if let Some(p) = self.pending.get_mut(&id) {
                p.resend_at = None;
                out.push(Output::Send { to: p.name.clone(), request: p.request.clone() });
            }
        }
        let late_join =
            self.job.as_ref().and_then(|j| j.joining.iter().find(|(_, d)| **d <= now.mono).map(|(n, _)| n.clone()));
        if let Some(name) = late_join {
            let reason = format!("did not join the control plane within {:.0} s", self.config.timeout.as_secs_f64());
            self.fail_join(&name, reason, out);
        }
        let late_restarts: Vec<String> = self
            .restarts
            .iter()
            .filter(|(_, r)| matches!(r.step, RestartStep::Joining { deadline } if deadline <= now.mono))
            .map(|(n, _)| n.clone())
            .collect();
        for name in late_restarts {
            let reason = format!("did not join the control plane within {:.0} s", self.config.timeout.as_secs_f64());
            self.restart_failed(&name, reason, now, out);
        }
        for (name, r) in self.restarts.iter_mut() {
            if matches!(r.step, RestartStep::Waiting { until } if until <= now.mono) {
                r.step = RestartStep::Spawning;
                out.push(Output::Spawn { name: name.clone() });
            }
        }
    }

    fn launch(&mut self, ticket: u64, now: Now, out: &mut Vec<Output>) {
        if self.job.is_some() {
            out.push(Output::Done { ticket, result: Err(OperatorError::Busy(self.state().name().into())) });
            return;
        }
        let mut job = Job {
            ticket: Some(ticket),
            transition: None,
            step: Step::Launching,
            batch: Batch::default(),
            joining: BTreeMap::new(),
        };
        for c in &self.file.components {
            job.joining.insert(c.name.clone(), now.mono + self.config.timeout);
            out.push(Output::Spawn { name: c.name.clone() });
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    fn shutdown(&mut self, ticket: u64, now: Now, out: &mut Vec<Output>) {
        let closing = || OperatorError::Setup("the operator is shutting down".into());
        if let Some(job) = self.job.take() {
            self.end_job(job, Err(closing()), out);
        }
        for (t, _) in std::mem::take(&mut self.queue) {
            out.push(Output::Done { ticket: t, result: Err(closing()) });
        }
        self.restarts.clear();
        for p in std::mem::take(&mut self.pending).into_values() {
            if let Owner::Live(LiveSet { ticket, .. }) = p.owner {
                out.push(Output::Done { ticket, result: Err(closing()) });
            }
        }
        let mut job = Job {
            ticket: Some(ticket),
            transition: None,
            step: Step::ShuttingDown,
            batch: Batch::default(),
            joining: BTreeMap::new(),
        };
        let names: Vec<String> = self.file.components.iter().rev().map(|c| c.name.clone()).collect();
        for name in names {
            if self.views[&name].alive {
                self.send_for(&mut job.batch, &name, Command::Reset, self.config.shutdown_timeout, now, out);
            }
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    fn request(&mut self, ticket: u64, transition: Transition, now: Now, out: &mut Vec<Output>) {
        if let Some(job) = &self.job {
            let under_way = job
                .transition
                .map_or(if matches!(job.step, Step::ShuttingDown) { "shutdown" } else { "launch" }, |t| {
                    t.phase().name()
                });
            out.push(Output::Done { ticket, result: Err(OperatorError::Busy(under_way.into())) });
            return;
        }
        if !self.restarts.is_empty() {
            // A component is being brought back: the transition waits for it.
            self.queue.push_back((ticket, transition));
            return;
        }
        self.begin(Some(ticket), transition, Vec::new(), now, out);
    }

    /// Begins a transition (`errors`: why a stop was asked for by a policy).
    fn begin(&mut self, ticket: Option<u64>, t: Transition, errors: Vec<String>, now: Now, out: &mut Vec<Output>) {
        let state = self.state();
        if !t.allowed_from().contains(&state) {
            let e = OperatorError::IllegalTransition { command: t.name().into(), state: state.name().into() };
            if let Some(ticket) = ticket {
                out.push(Output::Done { ticket, result: Err(e) });
            }
            return;
        }
        if matches!(t, Transition::Reset) {
            // A reset gives every component its restarts back.
            for v in self.views.values_mut() {
                v.recent_restarts = 0;
            }
        }
        let step = match t {
            Transition::Configure => {
                self.results.clear();
                match self.file.configure_order() {
                    Ok(order) => Step::Configuring { order, next: 0 },
                    Err(e) => {
                        if let Some(ticket) = ticket {
                            out.push(Output::Done { ticket, result: Err(OperatorError::Setup(e)) });
                        }
                        return;
                    }
                }
            }
            Transition::Start { run } => Step::Opening { requested: run },
            Transition::Pause => {
                Step::Staged { verb: Verb::Pause, stages: self.file.stages(false), stage: 0, first_error: None }
            }
            Transition::Resume => {
                Step::Staged { verb: Verb::Resume, stages: self.file.stages(true), stage: 0, first_error: None }
            }
            Transition::Stop => match self.run.filter(|_| self.run_open()) {
                // A paused source holds the fragments of events triggered before the pause, which
                // the builders wait for: it resumes first (the trigger stays paused).
                Some(run)
                    if state == SystemState::Paused
                        && self.file.components.iter().any(|c| c.role == daqflow_component::Role::Trigger) =>
                {
                    self.drain_throttled_writers(now, out);
                    Step::ReadingOut { run, stage: 0, errors }
                }
                Some(run) => {
                    self.drain_throttled_writers(now, out);
                    Step::Stopping { run, stage: 0, summaries: BTreeMap::new(), errors }
                }
                None => {
                    self.target = SystemState::Configured;
                    if let Some(ticket) = ticket {
                        let e = OperatorError::IllegalTransition {
                            command: "stop".into(),
                            state: "Configured (no run)".into(),
                        };
                        out.push(Output::Done { ticket, result: Err(e) });
                    }
                    return;
                }
            },
            Transition::Reset => match self.run.filter(|_| self.run_open()) {
                Some(run) => {
                    out.push(self.close_run(run, BTreeMap::new(), vec!["reset during the run".into()]));
                    Step::Closing { then: AfterClose::Reset }
                }
                None => Step::Respawning,
            },
        };
        tracing::info!("{} of the system begins", t.name());
        let mut job = Job { ticket, transition: Some(t), step, batch: Batch::default(), joining: BTreeMap::new() };
        if let Step::Opening { requested } = job.step {
            out.push(Output::OpenRun { requested });
        }
        if matches!(job.step, Step::Respawning) {
            self.respawn_dead(&mut job, now, out);
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    /// Reset: the processes that died are started again first.
    fn respawn_dead(&mut self, job: &mut Job, now: Now, out: &mut Vec<Output>) {
        for c in &self.file.components {
            if !self.views[&c.name].alive {
                job.joining.insert(c.name.clone(), now.mono + self.config.timeout);
                out.push(Output::Spawn { name: c.name.clone() });
            }
        }
    }

    /// Takes the job's next steps while nothing is awaited.
    fn advance(&mut self, now: Now, out: &mut Vec<Output>) {
        let Some(mut job) = self.job.take() else { return };
        loop {
            if !job.batch.waiting.is_empty() || !job.joining.is_empty() {
                self.job = Some(job);
                return;
            }
            match self.step(&mut job, now, out) {
                Flow::Continue => {}
                Flow::Wait => {
                    self.job = Some(job);
                    return;
                }
                Flow::Finished(result) => {
                    self.end_job(job, result, out);
                    return;
                }
            }
        }
    }

    /// One step of the job: takes the replies of the last batch, sends the next one.
    fn step(&mut self, job: &mut Job, now: Now, out: &mut Vec<Output>) -> Flow {
        let replies = std::mem::take(&mut job.batch.replies);
        let timeout = self.config.timeout;
        let stop_timeout = self.config.stop_timeout;
        match &mut job.step {
            Step::Launching | Step::ShuttingDown => Flow::Finished(Ok(TransitionResult::Done)),
            Step::Configuring { order, next } => {
                for (name, r) in replies {
                    match r {
                        Ok(Answer::Info(info)) => {
                            self.results.insert(name, Value::Object(info));
                        }
                        Ok(_) => {
                            self.results.insert(name, json!({}));
                        }
                        Err(e) => {
                            self.target = SystemState::Initial;
                            // One that did not answer is told to reset without waiting for
                            // it; one the request never reached has nothing to undo.
                            let (silent, unreached) = match &e {
                                OperatorError::Component { component, reason, .. }
                                    if reason.starts_with("no answer") =>
                                {
                                    (Some(component.clone()), None)
                                }
                                OperatorError::Component { component, reason, .. }
                                    if reason == "not on the control plane" =>
                                {
                                    (None, self.spec_index(component))
                                }
                                _ => (None, None),
                            };
                            let configured = order[..*next].iter().copied().filter(|i| Some(*i) != unreached).collect();
                            job.step = Step::Undoing { failure: e, configured, silent, stage: 0, errors: Vec::new() };
                            return Flow::Continue;
                        }
                    }
                }
                let Some(&i) = order.get(*next) else {
                    self.target = SystemState::Configured;
                    let infos: BTreeMap<String, Info> = self
                        .results
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_object().cloned().unwrap_or_default()))
                        .collect();
                    return Flow::Finished(Ok(TransitionResult::Configured(infos)));
                };
                *next += 1;
                let spec = self.file.components[i].clone();
                match self.resolved_params(&spec) {
                    Ok(config) => {
                        self.configured.insert(spec.name.clone(), config.clone());
                        self.send_for(
                            &mut job.batch,
                            &spec.name,
                            Command::Configure { config: Some(config) },
                            timeout,
                            now,
                            out,
                        );
                        Flow::Continue
                    }
                    Err(e) => {
                        self.target = SystemState::Initial;
                        let configured = order[..*next - 1].to_vec();
                        job.step = Step::Undoing { failure: e, configured, silent: None, stage: 0, errors: Vec::new() };
                        Flow::Continue
                    }
                }
            }
            Step::Undoing { failure, configured, silent, stage, errors } => {
                for (name, r) in replies {
                    if let Err(e) = r {
                        errors.push(format!("{name}: {e}"));
                    }
                }
                let stages = self.file.stages(false);
                let Some(idx) = stages.get(*stage) else {
                    let failure = std::mem::replace(failure, OperatorError::Setup(String::new()));
                    let names: Vec<String> =
                        self.names(configured).into_iter().filter(|n| Some(n) != silent.as_ref()).collect();
                    let silent = silent.as_ref().map(|n| (n.as_str(), self.config.logs.join(format!("{n}.log"))));
                    let silent = silent.as_ref().map(|(n, log)| (*n, log.as_path()));
                    return Flow::Finished(Err(undone(failure, &names, errors, silent)));
                };
                *stage += 1;
                for &i in idx.iter().filter(|i| configured.contains(i)) {
                    let name = self.file.components[i].name.clone();
                    if !self.views[&name].alive {
                        continue;
                    }
                    if silent.as_deref() == Some(name.as_str()) {
                        // It takes the reset once it is done with the configure it did not
                        // answer in time: nobody waits for that.
                        self.send(&name, Command::Reset, Owner::Late, timeout, now, out);
                    } else {
                        self.send_for(&mut job.batch, &name, Command::Reset, timeout, now, out);
                    }
                }
                Flow::Continue
            }
            Step::Opening { .. } | Step::Closing { .. } => Flow::Wait,
            Step::Starting { run, stage, started } => {
                let run = *run;
                let mut failure = None;
                for (name, r) in replies {
                    match r {
                        Ok(_) => started.extend(self.spec_index(&name)),
                        Err(e) => {
                            tracing::error!("start of {name} failed: {e}");
                            failure.get_or_insert(e);
                        }
                    }
                }
                if let Some(failure) = failure {
                    let started = std::mem::take(started);
                    job.step = Step::Unwinding { run, stage: 0, started, failure, summaries: BTreeMap::new() };
                    return Flow::Continue;
                }
                let stages = self.file.stages(true);
                let Some(names) = stages.get(*stage).map(|s| self.names(s)) else {
                    self.target = SystemState::Running;
                    tracing::info!(run, "run started");
                    return Flow::Finished(Ok(TransitionResult::Started(run)));
                };
                *stage += 1;
                for name in names {
                    self.send_for(&mut job.batch, &name, Command::Start { run }, timeout, now, out);
                }
                Flow::Continue
            }
            Step::Unwinding { run, stage, started, failure, summaries } => {
                for (name, r) in replies {
                    if let Ok(Answer::Summary(s)) = r {
                        summaries.insert(name, s);
                    }
                }
                let stages = self.file.stages(false);
                let Some(stage_idx) = stages.get(*stage) else {
                    let (run, summaries) = (*run, std::mem::take(summaries));
                    let failure = std::mem::replace(failure, OperatorError::Setup(String::new()));
                    out.push(self.close_run(run, summaries, vec![failure.to_string()]));
                    job.step = Step::Closing { then: AfterClose::StartFailed(failure) };
                    return Flow::Wait;
                };
                *stage += 1;
                let names = self.names(&stage_idx.iter().copied().filter(|i| started.contains(i)).collect::<Vec<_>>());
                for name in names {
                    self.send_for(&mut job.batch, &name, Command::Stop { last_event: None }, stop_timeout, now, out);
                }
                Flow::Continue
            }
            Step::Staged { verb, stages, stage, first_error } => {
                for (_, r) in replies {
                    if let Err(e) = r {
                        first_error.get_or_insert(e);
                    }
                }
                let verb = *verb;
                let Some(mut names) = stages.get(*stage).map(|s| self.names(s)) else {
                    let failed = first_error.take();
                    self.target = match (verb, failed.is_some()) {
                        (Verb::Pause, false) | (Verb::Resume, true) => SystemState::Paused,
                        (Verb::Pause, true) | (Verb::Resume, false) => SystemState::Running,
                        _ => SystemState::Initial,
                    };
                    return Flow::Finished(failed.map_or(Ok(TransitionResult::Done), Err));
                };
                *stage += 1;
                names.retain(|n| !self.dropped.contains_key(n));
                let command = match verb {
                    Verb::Pause => Command::Pause,
                    Verb::Resume => Command::Resume,
                    _ => Command::Reset,
                };
                for name in names {
                    self.send_for(&mut job.batch, &name, command.clone(), timeout, now, out);
                }
                Flow::Continue
            }
            Step::ReadingOut { run, stage, errors } => {
                for (name, r) in replies {
                    if let Err(e) = r {
                        errors.push(format!("{name}: resuming to read out what was triggered: {e}"));
                    }
                }
                let stages = self.file.stages(true);
                let Some(idx) = stages.get(*stage) else {
                    let (run, errors) = (*run, std::mem::take(errors));
                    job.step = Step::Stopping { run, stage: 0, summaries: BTreeMap::new(), errors };
                    return Flow::Continue;
                };
                *stage += 1;
                for &i in idx {
                    let spec = &self.file.components[i];
                    let v = &self.views[&spec.name];
                    if spec.role == daqflow_component::Role::Trigger
                        || self.dropped.contains_key(&spec.name)
                        || !v.alive
                        || v.state != Some(ComponentState::Paused)
                    {
                        continue;
                    }
                    let name = spec.name.clone();
                    self.send_for(&mut job.batch, &name, Command::Resume, timeout, now, out);
                }
                Flow::Continue
            }
            Step::Stopping { run, stage, summaries, errors } => {
                for (name, r) in replies {
                    match r {
                        Ok(Answer::Summary(s)) => {
                            summaries.insert(name, s);
                        }
                        Ok(_) => {}
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                let stages = self.file.stages(false);
                let Some(idx) = stages.get(*stage) else {
                    let (run, summaries, errors) = (*run, std::mem::take(summaries), std::mem::take(errors));
                    out.push(self.close_run(run, summaries, errors));
                    job.step = Step::Closing { then: AfterClose::Stopped };
                    return Flow::Wait;
                };
                *stage += 1;
                let refs = self.references(summaries);
                for &i in idx {
                    let spec = &self.file.components[i];
                    let v = &self.views[&spec.name];
                    let in_run = matches!(
                        v.state,
                        Some(ComponentState::Running | ComponentState::Paused | ComponentState::Error)
                    );
                    if self.dropped.contains_key(&spec.name) {
                        continue; // the run went on without it: its death is not the stop's
                    }
                    if !v.alive || !in_run {
                        if !v.alive && v.state.is_some() {
                            errors.push(format!("{}: not running ({})", spec.name, v.exit.clone().unwrap_or_default()));
                        }
                        continue;
                    }
                    let last_event = match &spec.stop_arg {
                        None => None,
                        Some(a) => match resolve(&toml::Value::String(a.clone()), &refs) {
                            Ok(toml::Value::Integer(n)) => u64::try_from(n).ok(),
                            Ok(toml::Value::String(s)) => s.trim().parse::<u64>().ok(),
                            Ok(_) => None,
                            Err(e) => {
                                errors.push(format!("{}: stop_arg: {e}", spec.name));
                                None
                            }
                        },
                    };
                    let name = spec.name.clone();
                    self.send_for(&mut job.batch, &name, Command::Stop { last_event }, stop_timeout, now, out);
                }
                Flow::Continue
            }
            Step::Respawning => {
                job.step =
                    Step::Staged { verb: Verb::Reset, stages: self.file.stages(false), stage: 0, first_error: None };
                Flow::Continue
            }
        }
    }

    fn names(&self, idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| self.file.components[i].name.clone()).collect()
    }

    /// Ends a job: its answer, the last error.
    fn end_job(&mut self, job: Job, result: Result<TransitionResult, OperatorError>, out: &mut Vec<Output>) {
        // Requests still awaited by the job are forgotten (their replies will find nothing).
        self.pending.retain(|_, p| p.owner != Owner::Job);
        if let Some(t) = job.transition {
            match &result {
                Ok(_) => tracing::info!("{} of the system done: {}", t.name(), self.state()),
                // The caller's mistake (a run number used before): no error of the system's.
                Err(e @ OperatorError::Invalid(_)) => tracing::warn!("{} of the system refused: {e}", t.name()),
                Err(e) => tracing::error!("{} of the system failed: {e}", t.name()),
            }
            if let Err(e) = &result {
                if !matches!(e, OperatorError::Invalid(_)) {
                    self.last_error = Some(e.to_string());
                }
            } else if let Ok(TransitionResult::Stopped(s)) = &result {
                if s.error.is_some() {
                    self.last_error = s.error.clone();
                }
            } else if matches!(t, Transition::Start { .. }) {
                self.last_error = None;
            }
        }
        if let Some(ticket) = job.ticket {
            out.push(Output::Done { ticket, result });
        }
    }

    fn on_run_opened(&mut self, r: Result<u32, OperatorError>, now: Now, out: &mut Vec<Output>) {
        let Some(job) = self.job.as_mut() else { return };
        if !matches!(job.step, Step::Opening { .. }) {
            return;
        }
        match r {
            Ok(run) => {
                self.run = Some(run);
                self.run_started_ms = Some(now.wall_ms);
                self.last_summary = None;
                self.changes.clear();
                for v in self.views.values_mut() {
                    v.earlier.clear();
                    v.samples.clear();
                    v.recent_restarts = 0;
                }
                job.step = Step::Starting { run, stage: 0, started: Vec::new() };
                self.advance(now, out);
            }
            Err(e) => {
                let job = self.job.take().expect("a job");
                self.end_job(job, Err(e), out);
            }
        }
    }

    /// What the operator needs to close run `run`.
    fn close_run(&self, run: u32, summaries: BTreeMap<String, Stats>, errors: Vec<String>) -> Output {
        let mut components = Vec::new();
        let mut data = Vec::new();
        for spec in &self.file.components {
            let v = &self.views[&spec.name];
            let died =
                (!v.alive && v.state.is_some()).then(|| v.exit.clone().unwrap_or_else(|| "its process ended".into()));
            components.push(ComponentRun {
                name: spec.name.clone(),
                kind: spec.kind.clone(),
                role: spec.role,
                summary: summaries.get(&spec.name).cloned(),
                last_stats: v.stats.clone(),
                earlier: v.earlier.clone(),
                died,
                failed: (v.alive && v.state == Some(ComponentState::Error)).then(|| v.error.clone()).flatten(),
                data: None,
            });
            if let Some(files) = spec.data_files
                && let Ok(params) = self.resolved_params(spec)
                && let Some(dir) = files(&params)
            {
                if let Some(c) = components.last_mut() {
                    c.data = Some(dir.clone());
                }
                data.push((spec.name.clone(), dir));
            }
        }
        let started_ms = self.run_started_ms.unwrap_or(0);
        let overrides = self.overrides_flat();
        let degraded = self.dropped.iter().map(|(name, why)| format!("{name}: {why}")).collect();
        let changes = self.changes.clone();
        Output::CloseRun(Box::new(CloseRun { run, started_ms, components, data, errors, overrides, degraded, changes }))
    }

    fn on_run_closed(&mut self, summary: Box<RunSummary>, now: Now, out: &mut Vec<Output>) {
        self.run_started_ms = None;
        self.last_summary = Some(summary.clone());
        let dropped = std::mem::take(&mut self.dropped);
        let Some(mut job) = self.job.take() else { return };
        let Step::Closing { then } = std::mem::replace(&mut job.step, Step::Respawning) else {
            self.job = Some(job);
            return;
        };
        match then {
            AfterClose::StartFailed(e) => {
                self.target = SystemState::Configured;
                self.end_job(job, Err(e), out);
            }
            AfterClose::Stopped => {
                self.target = SystemState::Configured;
                tracing::info!(
                    run = summary.run,
                    events = summary.events,
                    lost = summary.lost,
                    "run {}",
                    summary.state.name()
                );
                self.end_job(job, Ok(TransitionResult::Stopped(summary)), out);
                // The components the run went without come back for the next run.
                for name in dropped.into_keys() {
                    if !self.views[&name].joined() || self.views[&name].state == Some(ComponentState::Error) {
                        tracing::info!(component = %name, "starting {name} again after the run it was lost to");
                        if let Some(v) = self.views.get_mut(&name) {
                            v.restarts += 1;
                            v.stats = Stats::default();
                            v.samples.clear();
                        }
                        let why = "lost to the run before".to_owned();
                        self.restarts
                            .insert(name.clone(), Restart { step: RestartStep::Spawning, target: self.target, why });
                        out.push(Output::Spawn { name });
                    }
                }
            }
            AfterClose::Reset => {
                self.respawn_dead(&mut job, now, out);
                self.job = Some(job);
                self.advance(now, out);
            }
        }
    }

    /// With no transition under way: a transition that waited, else the policies of the
    /// components that died or failed.
    fn after_job(&mut self, now: Now, out: &mut Vec<Output>) {
        if self.restarts.is_empty() {
            if !self.restart_failures.is_empty() && self.run_open() {
                let reasons = std::mem::take(&mut self.restart_failures);
                self.begin(None, Transition::Stop, reasons, now, out);
                return;
            }
            self.restart_failures.clear();
            // The transitions that waited, in order, until one is under way (one refused at
            // once lets the next go).
            while let Some((ticket, t)) = self.queue.pop_front() {
                self.begin(Some(ticket), t, Vec::new(), now, out);
                if self.job.is_some() {
                    return;
                }
            }
        }
        if self.job.is_some() {
            return;
        }
        self.check_failures(now, out);
        if self.job.is_none() {
            self.check_disks(now, out);
        }
    }

    /// A data writer throttled by its disk for longer than `disk_full_stop_s` in a running
    /// run: its disk is full for good, and the run stops (the normal stop, producers first)
    /// with the error `disk full: …`, which the run's record keeps. A writer whose kind
    /// declares the live key [`DRAIN_INTO_RESERVE_KEY`] (the recorder) is first told to drain
    /// into its disk's reserve, so that what is in flight towards it (in ET, in the builder
    /// units) drains while the producers stop.
    fn check_disks(&mut self, now: Now, out: &mut Vec<Output>) {
        let limit = self.file.system.disk_full_stop_s;
        if limit <= 0.0 || !self.run_open() || self.state() != SystemState::Running {
            return;
        }
        let mut full = Vec::new();
        for spec in &self.file.components {
            if !matches!(spec.role, daqflow_component::Role::Recorder | daqflow_component::Role::Builder) {
                continue;
            }
            let v = &self.views[&spec.name];
            let detail = &v.stats.detail;
            let throttled_for = detail["throttled_for_s"].as_f64().unwrap_or(0.0);
            // Counters of this run only (a writer's last counters of the run before may say it
            // ended throttled).
            if !v.alive || v.stats.run != self.run || detail["throttled"] != true || throttled_for < limit {
                continue;
            }
            let directory = spec
                .data_files
                .and_then(|files| self.resolved_params(spec).ok().and_then(|p| files(&p)))
                .map(|d| format!(" of {}", d.display()))
                .unwrap_or_default();
            let space = match (detail["disk_free_bytes"].as_u64(), detail["disk_used_pct"].as_f64()) {
                (Some(free), Some(used)) => format!(" ({:.1} MiB free, {used:.1} % used)", free as f64 / 1048576.0),
                _ => String::new(),
            };
            let drains = if self.has_reserve(spec) {
                format!(
                    "; `{}` was told to write what was in flight into its disk's reserve above throttle_high_pct",
                    spec.name
                )
            } else {
                String::new()
            };
            full.push(format!(
                "disk full: `{}` was throttled by the filesystem{directory}{space} for {throttled_for:.0} s, longer \
                 than disk_full_stop_s = {limit}; the run was stopped, producers first{drains}",
                spec.name
            ));
        }
        if full.is_empty() {
            return;
        }
        for why in &full {
            tracing::error!("{why}");
        }
        self.begin(None, Transition::Stop, full, now, out);
    }

    /// Whether `spec` is a data writer whose kind declares the live key
    /// [`DRAIN_INTO_RESERVE_KEY`] while Running: its disk has a reserve above its high mark.
    fn has_reserve(&self, spec: &ComponentSpec) -> bool {
        let published = self.published.get(&spec.name);
        spec.schema
            .as_deref()
            .or(published.map(|s| &**s))
            .and_then(|s| s.key_named(DRAIN_INTO_RESERVE_KEY))
            .is_some_and(|k| k.live.contains(&daqflow_component::State::Running))
    }

    /// At the start of a run's stop: every data writer throttled by its disk now (its
    /// counters of this run say so) whose disk has a reserve ([`Self::has_reserve`]) is told
    /// to write into it (`DRAIN_INTO_RESERVE_KEY = true`), before the producers' stop, so that
    /// what is in flight towards it (in ET, in the builder units) drains while they stop.
    /// Nobody waits for the answer (a refusal is logged); it reaches the writer before its stop.
    fn drain_throttled_writers(&mut self, now: Now, out: &mut Vec<Output>) {
        let mut drain = Vec::new();
        for spec in &self.file.components {
            let v = &self.views[&spec.name];
            if v.alive && v.stats.run == self.run && v.stats.detail["throttled"] == true && self.has_reserve(spec) {
                drain.push(spec.name.clone());
            }
        }
        for name in drain {
            tracing::warn!(
                component = %name,
                "{name}.{DRAIN_INTO_RESERVE_KEY} = true: the run stops while {name} is throttled by its disk; what is \
                 in flight goes into its disk's reserve above throttle_high_pct"
            );
            let command = Command::Set { key: DRAIN_INTO_RESERVE_KEY.to_owned(), value: Value::Bool(true) };
            self.send(&name, command, Owner::Late, self.config.timeout, now, out);
        }
    }

    fn check_failures(&mut self, now: Now, out: &mut Vec<Output>) {
        let mut fresh: Vec<(String, Policy, String)> = Vec::new();
        for c in &self.file.components {
            if self.restarts.contains_key(&c.name) || self.dropped.contains_key(&c.name) {
                continue;
            }
            let v = &self.views[&c.name];
            let failing = (!v.alive && v.state.is_some()) || v.state == Some(ComponentState::Error);
            if !failing {
                continue;
            }
            let key = v.since_ms ^ (u64::from(v.restarts) << 48) ^ u64::from(v.alive);
            if self.handled.get(&c.name) == Some(&key) {
                continue;
            }
            let why = v.exit.clone().or(v.error.clone()).unwrap_or_else(|| "failed".into());
            fresh.push((c.name.clone(), c.policy, why));
        }
        if fresh.is_empty() {
            return;
        }
        let in_run = matches!(self.target, SystemState::Running | SystemState::Paused);
        let cap = self.file.system.restart_max;
        // What each failure leads to: a restart, or the component is lost to the run (then the
        // run goes on without it, or stops).
        let mut restart = Vec::new();
        let mut lost = Vec::new();
        for (name, policy, why) in &fresh {
            match policy {
                Policy::Restart if self.views[name].recent_restarts < cap => restart.push((name.clone(), why.clone())),
                Policy::Restart => {
                    lost.push((name.clone(), format!("{why}; not restarted again: {cap} restarts, the cap")))
                }
                Policy::Expendable | Policy::Stop => lost.push((name.clone(), why.clone())),
            }
        }
        let (dropped, stop_reasons) = if in_run { self.lose(&lost) } else { (Vec::new(), Vec::new()) };
        // The run is going to stop — a component it cannot go on without failed, or a restart
        // failed — once the restarts under way end: nothing more is restarted into it (a
        // restart that fails again and again would otherwise keep the stop waiting for ever).
        let stopping = !stop_reasons.is_empty() || (!self.restart_failures.is_empty() && self.run_open());
        if stopping && !self.restarts.is_empty() {
            return;
        }
        for (name, ..) in &fresh {
            let v = &self.views[name];
            let key = v.since_ms ^ (u64::from(v.restarts) << 48) ^ u64::from(v.alive);
            self.handled.insert(name.clone(), key);
        }
        if !stop_reasons.is_empty() {
            for why in &stop_reasons {
                tracing::error!("{why}; stopping the run");
            }
            self.begin(None, Transition::Stop, stop_reasons, now, out);
            return;
        }
        for (name, why) in dropped {
            tracing::warn!(component = %name, "{name} failed ({why}); the run goes on without it");
            self.dropped.insert(name, why);
        }
        for (name, why) in restart {
            self.restart_later(name, why, now, out);
        }
    }

    /// Components lost to the run (`name`, why): those the run goes on without (policy
    /// `expendable`, or a group that keeps its minimum), and the reasons to stop the run.
    fn lose(&self, lost: &[(String, String)]) -> (Vec<(String, String)>, Vec<String>) {
        let mut dropped = Vec::new();
        let mut stop = Vec::new();
        let gone: Vec<&str> = lost.iter().map(|(n, _)| n.as_str()).collect();
        for (name, why) in lost {
            let spec = &self.file.components[self.spec_index(name).unwrap_or(0)];
            if let Some(g) = self.file.group_of(name) {
                let left =
                    g.members.iter().filter(|m| !self.dropped.contains_key(*m) && !gone.contains(&m.as_str())).count();
                if left >= g.min {
                    dropped.push((
                        name.clone(),
                        format!(
                            "{why} (group `{}` keeps {left} of {} members, its minimum is {})",
                            g.name,
                            g.members.len(),
                            g.min
                        ),
                    ));
                } else {
                    stop.push(format!(
                        "{name} failed: {why}; group `{}` has {left} of its {} members left, fewer than its minimum {}",
                        g.name,
                        g.members.len(),
                        g.min
                    ));
                }
            } else if spec.policy == Policy::Expendable {
                dropped.push((name.clone(), format!("{why} (expendable)")));
            } else {
                stop.push(format!("{name} failed: {why}"));
            }
        }
        (dropped, stop)
    }

    /// Restarts `name`: at once the first time since the last run began, then after a back-off
    /// that doubles each time.
    fn restart_later(&mut self, name: String, why: String, now: Now, out: &mut Vec<Output>) {
        let in_run_now = self.run_open();
        let system = &self.file.system;
        let Some(v) = self.views.get_mut(&name) else { return };
        let delay = match v.recent_restarts {
            0 => 0.0,
            n => (system.restart_backoff_s * 2f64.powi(n.min(30) as i32 - 1)).min(system.restart_backoff_max_s),
        };
        v.restarts += 1;
        v.recent_restarts += 1;
        // The counters of the life that ended still count for the run; the new life publishes
        // its own from 0.
        let last = std::mem::take(&mut v.stats);
        v.samples.clear();
        if in_run_now {
            v.earlier.push(last);
        }
        let step = if delay > 0.0 {
            tracing::warn!(component = %name, "{name} failed ({why}); restarting it in {delay:.1} s (policy restart, restart {} of at most {})", v.recent_restarts, system.restart_max);
            RestartStep::Waiting { until: now.mono + Duration::from_secs_f64(delay) }
        } else {
            tracing::warn!(component = %name, "{name} failed ({why}); restarting it (policy restart, restart {} of at most {})", v.recent_restarts, system.restart_max);
            out.push(Output::Spawn { name: name.clone() });
            RestartStep::Spawning
        };
        self.restarts.insert(name, Restart { step, target: self.target, why });
    }

    /// The next step of a restart after `result`.
    fn restart_step_done(
        &mut self,
        name: &str,
        result: Result<Answer, OperatorError>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let Some(r) = self.restarts.get(name) else { return };
        let target = r.target;
        let done_verb = match (&r.step, result) {
            (_, Err(e)) => {
                self.restart_failed(name, e.to_string(), now, out);
                return;
            }
            (RestartStep::Joining { .. }, Ok(_)) => None,
            (RestartStep::Commanding(v), Ok(a)) => {
                if let (Verb::Configure, Answer::Info(info)) = (v, a) {
                    self.results.insert(name.to_owned(), Value::Object(info));
                }
                Some(*v)
            }
            (RestartStep::Spawning | RestartStep::Waiting { .. }, Ok(_)) => return,
        };
        let configured = matches!(target, SystemState::Configured | SystemState::Running | SystemState::Paused);
        let in_run = matches!(target, SystemState::Running | SystemState::Paused);
        let next = match done_verb {
            None if configured => Some(Verb::Configure),
            Some(Verb::Configure) if in_run => Some(Verb::Start),
            Some(Verb::Start) if target == SystemState::Paused => Some(Verb::Pause),
            _ => None,
        };
        let command = match next {
            None => {
                self.restarts.remove(name);
                tracing::info!(component = %name, "{name} restarted and back in state {target}");
                return;
            }
            Some(Verb::Configure) => {
                let Some(i) = self.spec_index(name) else { return };
                match self.resolved_params(&self.file.components[i].clone()) {
                    Ok(config) => {
                        self.configured.insert(name.to_owned(), config.clone());
                        Command::Configure { config: Some(config) }
                    }
                    Err(e) => {
                        self.restart_failed(name, e.to_string(), now, out);
                        return;
                    }
                }
            }
            Some(Verb::Start) => Command::Start { run: self.run.unwrap_or(0) },
            Some(_) => Command::Pause,
        };
        if let Some(r) = self.restarts.get_mut(name) {
            r.step = RestartStep::Commanding(command.verb());
        }
        self.send(name, command, Owner::Restart(name.to_owned()), self.config.timeout, now, out);
    }

    fn restart_failed(&mut self, name: &str, error: String, _now: Now, _out: &mut Vec<Output>) {
        let Some(r) = self.restarts.remove(name) else { return };
        self.pending.retain(|_, p| p.owner != Owner::Restart(name.to_owned()));
        tracing::error!(component = %name, "restarting {name} failed: {error}");
        if matches!(r.target, SystemState::Running | SystemState::Paused) {
            let why = format!("{} and could not be restarted: {error}", r.why);
            if self.file.group_of(name).is_none() {
                self.restart_failures.push(format!("{name} failed ({}) and could not be restarted: {error}", r.why));
            } else {
                let (dropped, stop) = self.lose(&[(name.to_owned(), why)]);
                for (_, why) in dropped {
                    tracing::warn!(component = %name, "the run goes on without {name}: {why}");
                    self.dropped.insert(name.to_owned(), why);
                }
                self.restart_failures.extend(stop);
            }
        }
    }
}

/// The error of a configure that failed with `failure` and was undone: the components it had
/// configured (`reset`) were reset, so that the system is Initial again (`errors`: the resets
/// that failed too); `silent`: the component that did not answer, told to reset too, and its
/// log.
fn undone(
    failure: OperatorError,
    reset: &[String],
    errors: &[String],
    silent: Option<(&str, &std::path::Path)>,
) -> OperatorError {
    let told = silent.map(|(n, _)| format!("{n} told to reset once it is done")).unwrap_or_default();
    let and = if told.is_empty() { String::new() } else { format!(", {told}") };
    let undo = match (reset.is_empty(), errors.is_empty()) {
        (true, _) if told.is_empty() => "nothing was configured yet: configure again".to_owned(),
        (true, _) => format!("configure undone: {told}; configure again"),
        (false, true) => format!("configure undone: {} reset to Initial{and}; configure again", reset.join(", ")),
        (false, false) => format!(
            "configure undone: {} reset{and}, but {}; reset the system before configuring again",
            reset.join(", "),
            errors.join("; ")
        ),
    };
    let see = silent.map(|(_, log)| format!("; see {}", log.display())).unwrap_or_default();
    match failure {
        OperatorError::Component { component, command, reason } => {
            OperatorError::Component { component, command, reason: format!("{reason}{see} ({undo})") }
        }
        OperatorError::Invalid(e) => OperatorError::Invalid(format!("{e} ({undo})")),
        OperatorError::Setup(e) => OperatorError::Setup(format!("{e} ({undo})")),
        other => other,
    }
}

/// Sets the dotted `key` (`size.mean`) of `table` to `value`, making the tables on the way (a
/// value that is not a table on the way is replaced by one).
fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let Some(inner) = entry.as_table_mut() else { return };
        t = inner;
    }
    t.insert(last.to_owned(), value);
}
