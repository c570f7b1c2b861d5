//! The sequencer: what the operator does, as a pure state machine. It is fed the system file,
//! what the components publish (their [`ComponentStatus`] and [`Stats`]), their replies, the
//! ends of their processes, the transitions asked for and the time; it answers with what to
//! do ([`Output`]): requests to send, processes to start, runs to open and close, transitions
//! to answer. The operator's I/O layer ([`Operator`](super::Operator)) does those things and
//! feeds back what happened. Nothing here touches a socket, a process, a file or the clock, so
//! every sequence (a component dying during a stop, a reply that never comes, a restart in a
//! paused run) is tested deterministically on virtual time.
//!
//! The code by job: this file holds the inputs and outputs, the views of the components and
//! the public face ([`Sequencer::handle`]); `params` the parameters (references between
//! components, live values, the checks of keys), `replies` the requests to the components and
//! what comes back (replies, statuses, spawns, exits), `jobs` the transitions (a request, its
//! steps by stage, its end), `runs` the run's record (opened, closed with its accounting), and
//! `watch` what is watched during a run (full disks, failed components, restarts).
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
use daqflow_component::{Answer, Command, CommandReply, ComponentStatus, Info, Request, State, Stats, Verb};
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

mod jobs;
mod params;
mod replies;
mod runs;
mod watch;
