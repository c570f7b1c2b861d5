//! The operator: starts a described system and drives it (`daqflow run SYSTEM.toml`,
//! `daqflow demo`). It is built of parts that can each be read and tested alone:
//!
//! - [`sequencer`]: what to do, as a pure state machine (transitions in stages, timeouts,
//!   restart policies), tested on virtual time;
//! - `supervisor`: the component processes (starting them, noticing their end);
//! - [`crate::accounting`]: what a run triggered, built, recorded and lost, by the components'
//!   roles;
//! - `status`: the typed [`SystemStatus`] (and from it Prometheus) the web UI shows;
//! - [`alarms`]: the system file's alarms, a pure state machine evaluated once a second.
//!
//! This module is the I/O around them: it starts the control servers, joins the control plane,
//! follows every component's `NAME/state` and `NAME/stats`, takes the replies to its requests
//! (`operator/reply`), and runs one event loop that feeds all of it to the sequencer and does
//! what the sequencer says: send requests, start processes, open and close runs in the run
//! database.
//!
//! ```no_run
//! use daqflow_runcontrol::operator::{Operator, OperatorOptions};
//! use daqflow_runcontrol::system::SystemFile;
//! # let registry = daqflow_component::Registry::new();
//! // The kinds the binary knows: `daqflow::registry::standard()` in the `daqflow` command.
//! let text = std::fs::read_to_string("system.toml").unwrap();
//! let file = SystemFile::parse(&text, &registry).unwrap();
//! let op = Operator::launch(OperatorOptions::new(file, "/usr/bin/daqflow".into())).unwrap();
//! op.configure().unwrap();
//! let run = op.start(None).unwrap();
//! std::thread::sleep(std::time::Duration::from_secs(10));
//! let summary = op.stop().unwrap();
//! println!("run {run}: lost {}", summary.lost);
//! op.shutdown();
//! ```

pub mod alarms;
mod history;
pub mod lock;
pub mod sequencer;
mod status;
mod supervisor;
pub mod unfinished;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use daqflow_api::{RunSummary, SystemState, SystemStatus, Transition, TransitionResult};
use daqflow_component::{CommandReply, ComponentStatus, Info, Stats};
use serde_json::{Value, json};

use self::sequencer::{Input, Now, Output, Sequencer, SequencerConfig, Snapshot};
use self::status::{Place, Rates};
use self::supervisor::{Launch, Supervisor};
use crate::db::RunDb;
use crate::system::SystemFile;
use daqflow_component::log::now_ms;

pub use self::history::state_number;
pub use self::status::{BULKY_DETAIL, in_run, light};

/// Why the operator could not do something.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OperatorError {
    /// The transition is not allowed in the system's state.
    #[error("cannot {command} the system in state {state}")]
    IllegalTransition {
        /// The transition.
        command: String,
        /// The system's state.
        state: String,
    },
    /// Another transition is under way.
    #[error("the system is busy: {0} is under way")]
    Busy(String),
    /// A component refused or failed a command, or did not answer in time.
    #[error("{component}: {command}: {reason}")]
    Component {
        /// The component.
        component: String,
        /// The command.
        command: String,
        /// What it said, or why there was no answer.
        reason: String,
    },
    /// An argument the operator cannot take (a parameter of a component it does not have).
    #[error("{0}")]
    Invalid(String),
    /// Starting the control server, a process or the database failed.
    #[error("{0}")]
    Setup(String),
}

/// How the operator starts.
#[derive(Debug, Clone)]
pub struct OperatorOptions {
    /// The validated system file.
    pub file: SystemFile,
    /// The `daqflow` binary the components run as.
    pub binary: PathBuf,
    /// Overrides `system.data`.
    pub data: Option<PathBuf>,
    /// Overrides `system.control`.
    pub control: Option<String>,
}

impl OperatorOptions {
    /// Options for `file`, running components with `binary`.
    pub fn new(file: SystemFile, binary: PathBuf) -> OperatorOptions {
        OperatorOptions { file, binary, data: None, control: None }
    }

    /// The data directory these options give (`data`, else the file's `system.data`), made
    /// absolute against the current directory.
    pub fn data_dir(&self) -> Result<PathBuf, OperatorError> {
        let data = self.data.clone().unwrap_or_else(|| self.file.system.data.clone());
        if data.is_absolute() {
            return Ok(data);
        }
        Ok(std::env::current_dir().map_err(|e| OperatorError::Setup(e.to_string()))?.join(data))
    }

    /// Creates the data directory and takes its lock ([`lock::OperatorLock`]): refused while
    /// another operator holds it, taken over from one that died
    /// ([`lock::OperatorLock::left_behind`] says whose it was).
    pub fn lock_data_dir(&self) -> Result<lock::OperatorLock, OperatorError> {
        let data = self.data_dir()?;
        std::fs::create_dir_all(&data)
            .map_err(|e| OperatorError::Setup(format!("data directory {}: {e}", data.display())))?;
        lock::OperatorLock::acquire(&data, &self.file.system.name).map_err(|e| OperatorError::Setup(e.to_string()))
    }
}

/// The dialog name of the operator (and of its replies, `operator/reply`).
pub const DIALOG_NAME: &str = "operator";

/// What the event loop is asked to do.
enum Call {
    Launch,
    Transition(Transition),
    Set { component: String, key: String, value: Option<toml::Value> },
    Shutdown,
}

enum Event {
    /// An input for the sequencer.
    Input(Box<Input>),
    /// A call from the API, answered on `reply`.
    Call(Call, Sender<Result<TransitionResult, OperatorError>>),
}

/// What the API reads without going through the event loop.
struct Shown {
    snapshot: Snapshot,
    rates: Rates,
    /// The event loop ended.
    closed: bool,
}

struct Inner {
    file: SystemFile,
    binary: PathBuf,
    data: PathBuf,
    control: SocketAddr,
    db: Arc<RunDb>,
    dialog: daqflow_dialog::Dialog,
    tx: Mutex<Sender<Event>>,
    shown: Mutex<Shown>,
    changed: Condvar,
    servers: Arc<Mutex<crate::control_servers::ControlServers>>,
    subscriptions: Mutex<Vec<daqflow_dialog::Subscription>>,
    replies: Mutex<Option<daqflow_dialog::CommandRegistration>>,
    event_loop: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The run whose configuration is being repeated ([`Operator::repeat`]), with its
    /// overrides: the runs opened while the overrides are these say they repeat it.
    repeat: Mutex<Option<(u32, BTreeMap<String, Value>)>>,
    /// The history of slow values' sampler and writer (`[history]`), while they run.
    history: Mutex<Option<history::History>>,
    /// A connection of its own for reading the history, so that a long query never holds the
    /// one the event loop records runs with.
    history_reader: RunDb,
    alarms: Mutex<alarms::Alarms>,
    /// The schemas the components of kinds this binary does not know published
    /// (`NAME/schema`: a program of the user's own, a Python component).
    published: Mutex<BTreeMap<String, Arc<daqflow_component::schema::Schema>>>,
    /// Where the run database is (for the history's writer, started with the components).
    location: Mutex<Option<crate::db::Location>>,
    /// The data directory's lock, held until [`Operator::shutdown`] (or the end of the process).
    data_lock: Mutex<Option<lock::OperatorLock>>,
    /// `DATA/unfinished-runs`, its space taken: where a run whose record the database refused
    /// to finish is noted for the next operator (none when the file could not be made).
    unfinished: Mutex<Option<unfinished::UnfinishedRuns>>,
}

/// A running system.
#[derive(Clone)]
pub struct Operator {
    inner: Arc<Inner>,
}

use daqflow_component::sync::lock;

/// The control servers for a process started now: the one the operator uses first (the spare,
/// after the primary died), so that a restarted component joins the processes already there
/// and not a primary started again meanwhile.
fn control_for_newcomers(
    servers: &Mutex<crate::control_servers::ControlServers>,
    dialog: &daqflow_dialog::Dialog,
) -> String {
    let all = lock(servers).addrs().to_vec();
    let current = dialog.client().control_server();
    let mut ordered: Vec<SocketAddr> = current.into_iter().filter(|c| all.contains(c)).collect();
    ordered.extend(all.iter().filter(|a| Some(**a) != current));
    ordered.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
}

/// The control servers' list as a component on `host` reaches it: a wildcard address
/// (`control = "0.0.0.0:7000"`) becomes this host's address on the route to `host` (loopback
/// when `host` is none: a system on this host alone). A local component of a system on several
/// hosts is given the host of another component, so that it too is told an address the
/// others reach.
fn control_as_seen_from(list: &str, host: Option<&str>) -> String {
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
    let toward = |h: &str| -> Option<IpAddr> {
        let target = (h, 0).to_socket_addrs().ok()?.next()?.ip();
        daqflow_transport::advertise::local_ip_toward(target).ok()
    };
    list.split(',')
        .map(str::trim)
        .map(|a| match a.parse::<SocketAddr>() {
            Ok(sa) if sa.ip().is_unspecified() => {
                let ip = match host {
                    None => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    Some(h) => toward(h).unwrap_or_else(daqflow_transport::advertise::host_ip),
                };
                SocketAddr::new(ip, sa.port()).to_string()
            }
            _ => a.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A timeout of the system file as a duration, held within the range the file is checked
/// against (a file that was not checked cannot make the operator panic).
fn seconds(s: f64) -> Duration {
    use crate::system::{MAX_TIMEOUT_S, MIN_TIMEOUT_S};
    Duration::try_from_secs_f64(if s.is_nan() { MIN_TIMEOUT_S } else { s.clamp(MIN_TIMEOUT_S, MAX_TIMEOUT_S) })
        .unwrap_or(Duration::from_secs(20))
}

impl Operator {
    /// Takes the data directory's lock ([`OperatorOptions::lock_data_dir`]: refused while
    /// another operator holds it), then starts the control server, the run database and every
    /// component process, and waits until each has joined the control plane.
    pub fn launch(options: OperatorOptions) -> Result<Operator, OperatorError> {
        let data_lock = options.lock_data_dir()?;
        if let Some(left) = data_lock.left_behind() {
            tracing::warn!("taking over the data directory {}: {left}", data_lock.info().data.display());
        }
        Operator::launch_locked(options, data_lock)
    }

    /// [`Operator::launch`] with the data directory's lock taken already (by
    /// [`OperatorOptions::lock_data_dir`] on the same options).
    pub fn launch_locked(options: OperatorOptions, data_lock: lock::OperatorLock) -> Result<Operator, OperatorError> {
        let op = Operator::prepare_locked(options, data_lock)?;
        op.launch_components()?;
        Ok(op)
    }

    /// Takes the data directory's lock, then starts the control servers and the run database,
    /// and joins the control plane, without any component yet:
    /// [`launch_components`](Self::launch_components) starts them (what [`launch`](Self::launch)
    /// does in one call). Meanwhile the operator answers (its state is Initial), so that a web
    /// UI can be served while the components start.
    pub fn prepare(options: OperatorOptions) -> Result<Operator, OperatorError> {
        let data_lock = options.lock_data_dir()?;
        if let Some(left) = data_lock.left_behind() {
            tracing::warn!("taking over the data directory {}: {left}", data_lock.info().data.display());
        }
        Operator::prepare_locked(options, data_lock)
    }

    /// [`Operator::prepare`] with the data directory's lock taken already (by
    /// [`OperatorOptions::lock_data_dir`] on the same options): nothing is written in the data
    /// directory, and no run is finished as abandoned, by an operator that does not hold it.
    pub fn prepare_locked(
        options: OperatorOptions,
        mut data_lock: lock::OperatorLock,
    ) -> Result<Operator, OperatorError> {
        let data = options.data_dir()?;
        if data_lock.info().data != data {
            return Err(OperatorError::Setup(format!(
                "the lock given is of {}, not of the data directory {}",
                data_lock.info().data.display(),
                data.display()
            )));
        }
        let file = options.file;
        std::fs::create_dir_all(data.join("logs"))
            .map_err(|e| OperatorError::Setup(format!("data directory {}: {e}", data.display())))?;
        let location = crate::db::Location::parse(&file.system.database)
            .map_err(|e| OperatorError::Setup(format!("system.database: {e}")))?
            .under(&data);
        let db = RunDb::connect(&location).map_err(|e| OperatorError::Setup(e.to_string()))?;
        let history_reader = RunDb::connect(&location).map_err(|e| OperatorError::Setup(e.to_string()))?;
        // The records an earlier operator could not finish are finished first, with its reason.
        let unfinished = finish_unfinished(&db, &data);
        if let Ok(n) = db.abandon_open_runs(&file.system.name)
            && n > 0
        {
            tracing::warn!("{n} run(s) left open by an operator that ended without stopping them are marked abandoned");
        }
        // The system token: every connection of the system proves it (docs/security.md).
        let token = match &file.system.token_file {
            Some(path) => daqflow_transport::auth::Token::from_file(path)
                .map_err(|e| OperatorError::Setup(format!("system.token_file: {e}")))?,
            None => match daqflow_transport::auth::process_token() {
                Some(t) => t,
                None => daqflow_transport::auth::Token::try_generate()
                    .map_err(|e| OperatorError::Setup(format!("making the system token: {e}")))?,
            },
        };
        let token_path = data.join("token");
        token.write_file(&token_path).map_err(|e| OperatorError::Setup(format!("writing the system token: {e}")))?;
        // The control servers: the primary and any spares, each a process of its own.
        let control_text = options.control.unwrap_or_else(|| file.system.control.clone());
        let listen = crate::control_servers::parse_list(&control_text)
            .map_err(|e| OperatorError::Setup(format!("control = {control_text:?}: {e}")))?;
        let servers = crate::control_servers::ControlServers::start(
            listen,
            crate::control_servers::ServerLaunch {
                binary: options.binary.clone(),
                token_file: token_path.clone(),
                logs: data.join("logs"),
                remote: file.system.remote_command.clone(),
                token: token.clone(),
                lease_s: file.system.lease_s,
            },
        )
        .map_err(|e| OperatorError::Setup(format!("starting the control server: {e}")))?;
        let control = servers.addrs()[0];
        // The tools find the control servers in the lock file (`daqflow --data DIR dialog ls`).
        let seen_here = servers.addrs().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",");
        data_lock
            .set_control(control_as_seen_from(&seen_here, None).split(',').map(str::to_owned).collect())
            .map_err(|e| OperatorError::Setup(e.to_string()))?;
        let mut dialog_config = daqflow_dialog::DialogConfig::new(DIALOG_NAME, servers.addrs().to_vec());
        dialog_config.token = Some(token.clone());
        // With a wildcard control server and components on other hosts, the operator publishes
        // the address they reach it at (its peer port listens on every interface).
        if let Some(far) = file.components.iter().find_map(|c| c.host.as_deref())
            && servers.addrs().iter().any(|a| a.ip().is_unspecified())
            && let Ok(seen) = control_as_seen_from(&control.to_string(), Some(far)).parse::<SocketAddr>()
        {
            dialog_config.advertise_host = Some(seen.ip().to_string());
        }
        let dialog = daqflow_dialog::Dialog::start(dialog_config)
            .map_err(|e| OperatorError::Setup(format!("joining the control plane: {e}")))?;
        let (tx, rx) = channel::<Event>();
        let mut config = SequencerConfig::new(DIALOG_NAME);
        config.timeout = seconds(file.system.timeout_s);
        config.stop_timeout = seconds(file.system.stop_timeout_s);
        config.logs = data.join("logs");
        let mut seq = Sequencer::new(file.clone(), config);
        seq.set_system_value("id", json!(format!("{}-{}-{}", file.system.name, std::process::id(), control.port())));
        seq.set_system_value("data", json!(data));
        // As written (a URL with its password, if it has one): for the message logger.
        seq.set_system_value("database", json!(location.to_config_value()));
        // The system file's digest, for every data file's header (docs/operator-guide.md,
        // "Provenance").
        seq.set_system_value("digest", json!(crate::provenance::sha256_hex(file.text.as_bytes())));
        let shown = Shown { snapshot: seq.snapshot(), rates: Rates::default(), closed: false };
        let mut alarms = alarms::Alarms::new(&file.system.name, &data, &file.alarms);
        if !alarms.is_empty() {
            match db.alarm_events(Some(&file.system.name), alarms::RECENT_EVENTS) {
                Ok(events) => alarms.remember(events),
                Err(e) => tracing::warn!("reading the earlier alarm events: {e}"),
            }
        }
        let inner = Arc::new(Inner {
            file: file.clone(),
            binary: options.binary.clone(),
            data: data.clone(),
            control,
            db: Arc::new(db),
            dialog,
            tx: Mutex::new(tx.clone()),
            shown: Mutex::new(shown),
            changed: Condvar::new(),
            servers: Arc::new(Mutex::new(servers)),
            subscriptions: Mutex::new(Vec::new()),
            replies: Mutex::new(None),
            event_loop: Mutex::new(None),
            repeat: Mutex::new(None),
            history: Mutex::new(None),
            history_reader,
            alarms: Mutex::new(alarms),
            published: Mutex::new(BTreeMap::new()),
            location: Mutex::new(None),
            data_lock: Mutex::new(Some(data_lock)),
            unfinished: Mutex::new(unfinished),
        });
        let op = Operator { inner };
        op.follow(&tx)?;
        let launch = Launch {
            binary: options.binary,
            remote: file.system.remote_command.clone(),
            logs: data.join("logs"),
            token_file: token_path,
            token,
            lease_s: file.system.lease_s,
        };
        // The operator's own log records reach the message logger like every component's.
        let log = op.inner.dialog.provide("operator/log").ok();
        let weak = Arc::downgrade(&op.inner);
        let handle = std::thread::Builder::new()
            .name("operator".into())
            .spawn(move || event_loop(weak, rx, seq, Supervisor::new(launch), log))
            .map_err(|e| OperatorError::Setup(e.to_string()))?;
        *lock(&op.inner.event_loop) = Some(handle);
        *lock(&op.inner.location) = Some(location);
        Ok(op)
    }

    /// Starts every component process of an operator [`prepare`](Self::prepare)d and waits
    /// until each has joined the control plane; on failure, shuts the operator down.
    pub fn launch_components(&self) -> Result<(), OperatorError> {
        if let Err(e) = self.call(Call::Launch) {
            self.shutdown();
            return Err(e);
        }
        let file = &self.inner.file;
        let location = lock(&self.inner.location).clone();
        if file.history.enabled
            && let Some(location) = location
        {
            let history =
                history::History::start(Arc::downgrade(&self.inner), &location, &file.history, &self.inner.dialog);
            match history {
                Ok(h) => *lock(&self.inner.history) = Some(h),
                Err(e) => {
                    self.shutdown();
                    return Err(e);
                }
            }
        }
        tracing::info!(system = %file.system.name, control = %self.inner.control, "system launched");
        Ok(())
    }

    /// Subscribes to every component's state and statistics, and takes the replies.
    fn follow(&self, tx: &Sender<Event>) -> Result<(), OperatorError> {
        let dialog = &self.inner.dialog;
        let mut subs = Vec::new();
        for c in &self.inner.file.components {
            let err = |e: daqflow_dialog::DialogError| OperatorError::Setup(format!("following {}: {e}", c.name));
            let (tx1, tx2, name) = (tx.clone(), tx.clone(), c.name.clone());
            subs.push(
                dialog
                    .subscribe(&format!("{}/state", c.name), move |ev| {
                        if let daqflow_dialog::ServiceEvent::Update { data, .. } = ev {
                            match serde_json::from_slice::<ComponentStatus>(&data) {
                                Ok(s) if s.name == name => {
                                    let _ = tx1.send(Event::Input(Box::new(Input::Status(s))));
                                }
                                Ok(s) => tracing::warn!("{name}/state names another component ({})", s.name),
                                Err(e) => tracing::warn!("{name}/state is not a component status: {e}"),
                            }
                        }
                    })
                    .map_err(err)?,
            );
            if c.schema.is_none() {
                // A kind this binary does not know tells its schema itself.
                let (tx3, name, inner) = (tx.clone(), c.name.clone(), Arc::downgrade(&self.inner));
                subs.push(
                    dialog
                        .subscribe(&format!("{}/schema", c.name), move |ev| {
                            let daqflow_dialog::ServiceEvent::Update { data, .. } = ev else { return };
                            match serde_json::from_slice::<Option<daqflow_component::schema::Schema>>(&data) {
                                Ok(Some(schema)) => {
                                    let schema = Arc::new(schema);
                                    if let Some(inner) = inner.upgrade() {
                                        lock(&inner.published).insert(name.clone(), schema.clone());
                                    }
                                    let input = Input::Schema { name: name.clone(), schema };
                                    let _ = tx3.send(Event::Input(Box::new(input)));
                                }
                                Ok(None) => {}
                                Err(e) => tracing::warn!("{name}/schema is not a schema: {e}"),
                            }
                        })
                        .map_err(err)?,
                );
            }
            let name = c.name.clone();
            subs.push(
                dialog
                    .subscribe(&format!("{}/stats", c.name), move |ev| {
                        if let daqflow_dialog::ServiceEvent::Update { data, .. } = ev {
                            match serde_json::from_slice::<Stats>(&data) {
                                Ok(stats) => {
                                    let _ =
                                        tx2.send(Event::Input(Box::new(Input::Stats { name: name.clone(), stats })));
                                }
                                Err(e) => tracing::debug!("{name}/stats is not statistics: {e}"),
                            }
                        }
                    })
                    .map_err(err)?,
            );
        }
        *lock(&self.inner.subscriptions) = subs;
        let tx = tx.clone();
        let reg = dialog
            .register_command(&format!("{DIALOG_NAME}/reply"), move |m| {
                match serde_json::from_slice::<CommandReply>(&m.data) {
                    Ok(r) => {
                        let _ = tx.send(Event::Input(Box::new(Input::Reply(r))));
                    }
                    Err(e) => tracing::warn!("a reply from {} that is not one: {e}", m.from),
                }
            })
            .map_err(|e| OperatorError::Setup(format!("registering {DIALOG_NAME}/reply: {e}")))?;
        *lock(&self.inner.replies) = Some(reg);
        Ok(())
    }

    /// Asks the event loop and waits for the answer.
    fn call(&self, call: Call) -> Result<TransitionResult, OperatorError> {
        let (reply, rx) = channel();
        let sent = lock(&self.inner.tx).send(Event::Call(call, reply));
        if sent.is_err() {
            return Err(OperatorError::Setup("the operator has shut down".into()));
        }
        rx.recv().unwrap_or_else(|_| Err(OperatorError::Setup("the operator has shut down".into())))
    }

    /// A transition of the whole system.
    pub fn transition(&self, t: Transition) -> Result<TransitionResult, OperatorError> {
        self.call(Call::Transition(t))
    }

    /// Configures every component (Initial → Configured): what each told the others.
    pub fn configure(&self) -> Result<BTreeMap<String, Info>, OperatorError> {
        match self.transition(Transition::Configure)? {
            TransitionResult::Configured(m) => Ok(m),
            _ => Ok(BTreeMap::new()),
        }
    }

    /// Starts a run (Configured → Running): `run` or the next number. Returns the run number.
    pub fn start(&self, run: Option<u32>) -> Result<u32, OperatorError> {
        match self.transition(Transition::Start { run })? {
            TransitionResult::Started(run) => Ok(run),
            other => Err(OperatorError::Setup(format!("start answered {other:?}"))),
        }
    }

    /// Pauses the run (producers first).
    pub fn pause(&self) -> Result<(), OperatorError> {
        self.transition(Transition::Pause).map(|_| ())
    }

    /// Resumes a paused run (consumers first).
    pub fn resume(&self) -> Result<(), OperatorError> {
        self.transition(Transition::Resume).map(|_| ())
    }

    /// Stops the run (producers first, draining in between) and returns its summary, which
    /// is also stored in the run database.
    pub fn stop(&self) -> Result<RunSummary, OperatorError> {
        match self.transition(Transition::Stop)? {
            TransitionResult::Stopped(s) => Ok(*s),
            other => Err(OperatorError::Setup(format!("stop answered {other:?}"))),
        }
    }

    /// Resets every component (any state → Initial).
    pub fn reset(&self) -> Result<(), OperatorError> {
        self.transition(Transition::Reset).map(|_| ())
    }

    /// Sets parameter `key` (dotted for a nested key) of `component` to `value`, over the
    /// system file's. While the system is Initial, for the next configure (`None`: back to the
    /// system file's); while Configured, Running or Paused, a live parameter: the component
    /// takes it at once (refused, with its reason, for a key it does not declare live in its
    /// state), the change is logged, kept for the next configure, and recorded in the open
    /// run's summary (`changes`). The overrides in force are in [`status`](Self::status) and in
    /// each run's summary. Returns every override in force (`COMPONENT.KEY` → value).
    pub fn set(
        &self,
        component: &str,
        key: &str,
        value: Option<toml::Value>,
    ) -> Result<BTreeMap<String, Value>, OperatorError> {
        self.call(Call::Set { component: component.to_owned(), key: key.to_owned(), value })?;
        Ok(self.shown().snapshot.overrides.clone())
    }

    /// Takes run `run`'s configuration for the next configure and the runs after it: its
    /// overrides replace those in force, and the runs opened with them record that they repeat
    /// it. Allowed while the system is Initial, for a run of this system recorded with this
    /// very system file (the text it stored); `daqflow run SYSTEM.toml --repeat N` runs the
    /// stored text of any run. Returns every override in force.
    pub fn repeat(&self, run: u32) -> Result<BTreeMap<String, Value>, OperatorError> {
        let db = &self.inner.db;
        let detail = db
            .run(run)
            .map_err(|e| OperatorError::Setup(e.to_string()))?
            .ok_or_else(|| OperatorError::Invalid(format!("no run {run} in the run database {}", db.location())))?;
        let file = &self.inner.file;
        if detail.record.system != file.system.name {
            return Err(OperatorError::Invalid(format!(
                "run {run} is of system `{}`, not of this one (`{}`)",
                detail.record.system, file.system.name
            )));
        }
        if detail.config != crate::db::redact_text(&file.text) {
            return Err(OperatorError::Invalid(format!(
                "run {run} ran with another system file than this one; `daqflow run SYSTEM.toml --repeat {run}` runs with the file it stored"
            )));
        }
        let overrides = repeated_overrides(&detail);
        let state = self.state();
        if state != SystemState::Initial {
            return Err(OperatorError::Invalid(format!(
                "a run's configuration is taken while the system is Initial (it applies at the next configure); it is {}: reset it first",
                state.name()
            )));
        }
        for key in self.shown().snapshot.overrides.clone().into_keys() {
            let (component, key) = key.split_once('.').unwrap_or((key.as_str(), ""));
            self.set(component, key, None)?;
        }
        for (target, value) in &overrides {
            let Some((component, key)) = target.split_once('.') else {
                return Err(OperatorError::Invalid(format!("run {run}: the override `{target}` names no parameter")));
            };
            let value: toml::Value = serde_json::from_value(value.clone())
                .map_err(|e| OperatorError::Invalid(format!("run {run}: the override `{target}`: {e}")))?;
            self.set(component, key, Some(value))?;
        }
        *lock(&self.inner.repeat) = Some((run, overrides));
        tracing::info!("the configuration of run {run} is taken for the next configure");
        Ok(self.shown().snapshot.overrides.clone())
    }

    fn shown(&self) -> MutexGuard<'_, Shown> {
        lock(&self.inner.shown)
    }

    /// The system's state: the phase under way, or what every component reports.
    pub fn state(&self) -> SystemState {
        self.shown().snapshot.state
    }

    /// Whether a run is open: started and not yet stopped and recorded. A component that dies
    /// and is restarted does not close it; only a stop (by the operator or by a policy) or a
    /// reset does.
    pub fn run_open(&self) -> bool {
        self.shown().snapshot.run_started_ms.is_some()
    }

    /// Waits at most `timeout` until no run is open; whether none is.
    pub fn wait_run_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.shown();
        while s.snapshot.run_started_ms.is_some() && !s.closed {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self.inner.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// Waits until no transition is under way (each of its steps is bounded by the system
    /// file's timeouts), or the operator has shut down.
    pub fn wait_idle(&self) {
        let mut s = self.shown();
        while s.snapshot.state.is_phase() && !s.closed {
            s = self.inner.changed.wait_timeout(s, Duration::from_millis(200)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// What the transition under way (or a component being brought back) waits for, in words:
    /// `the stop of run 3 (stage 2 of 4): the answer of ru-0, ru-1 (at most 12 s more)`; `None`
    /// when nothing is under way.
    pub fn waiting_text(&self) -> Option<String> {
        self.shown().snapshot.waiting.as_ref().map(|w| w.text(Instant::now()))
    }

    /// The run number (running or last).
    pub fn run_number(&self) -> Option<u32> {
        self.shown().snapshot.run
    }

    /// The components the transition under way waits for, each with the command it waits on
    /// (`configure`, …, or `join` for a process that has not joined the control plane yet);
    /// empty when none is under way.
    pub fn waiting_for(&self) -> Vec<(String, String)> {
        self.shown().snapshot.waiting_for.clone()
    }

    /// The summary of the last run stopped.
    pub fn last_summary(&self) -> Option<RunSummary> {
        self.shown().snapshot.last_summary.as_deref().cloned()
    }

    /// The live status (the web UI's `/api/status`).
    pub fn status(&self) -> SystemStatus {
        let place = Place { file: &self.inner.file, control: self.control_list(), data: &self.inner.data };
        let s = self.shown();
        status::system_status(&place, &s.snapshot, &s.rates, now_ms())
    }

    /// Every component's typed schema, by name: its kind's, or the one a program of the
    /// user's own published (`NAME/schema`); a component without one is left out.
    pub fn schemas(&self) -> BTreeMap<String, daqflow_component::schema::Schema> {
        let published = lock(&self.inner.published);
        self.inner
            .file
            .components
            .iter()
            .filter_map(|c| {
                let schema = c.schema.as_ref().or_else(|| published.get(&c.name))?;
                Some((c.name.clone(), (**schema).clone()))
            })
            .collect()
    }

    /// The monitors' histograms: `[{"component", …histogram}]`.
    pub fn histograms(&self) -> Value {
        status::histograms(&self.inner.file, &self.shown().snapshot)
    }

    /// The ET systems' snapshots: `[{"component", "snapshot"}]`.
    pub fn et(&self) -> Value {
        status::et(&self.inner.file, &self.shown().snapshot)
    }

    /// Prometheus text exposition of the system (names prefixed `daqflow_`), its alarms'
    /// included.
    pub fn metrics(&self) -> String {
        let mut text = self.status().to_prometheus();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&self.alarms().to_prometheus());
        text
    }

    /// Every alarm of the system file with its state, and the recent alarm events (newest
    /// first).
    pub fn alarms(&self) -> daqflow_api::alarms::AlarmsStatus {
        lock(&self.inner.alarms).status()
    }

    /// A person (`who`) acknowledges alarm `name` (`docs/operator-guide.md`, "Alarms"): the
    /// event is logged and stored in the run database. Returns the alarm as it is now.
    pub fn acknowledge_alarm(&self, name: &str, who: &str) -> Result<daqflow_api::alarms::AlarmView, OperatorError> {
        let (event, view) = {
            let mut alarms = lock(&self.inner.alarms);
            let event =
                alarms.acknowledge(name, who, Now::current()).map_err(|e| OperatorError::Invalid(e.to_string()))?;
            let view = alarms.status().alarms.into_iter().find(|a| a.name == name);
            (event, view)
        };
        if let Some(event) = event {
            alarms::log_event(&event);
            if let Err(e) = self.inner.db.add_alarm_events(std::slice::from_ref(&event)) {
                tracing::error!("storing an alarm event: {e}");
            }
        }
        view.ok_or_else(|| OperatorError::Invalid(format!("there is no alarm `{name}`")))
    }

    /// The (primary) control server's address.
    pub fn control_addr(&self) -> SocketAddr {
        self.inner.control
    }

    /// Every control server's address, the primary first, as processes are given them
    /// (`A,B,…`).
    pub fn control_list(&self) -> String {
        lock(&self.inner.servers).list()
    }

    /// The process ids of the control servers (the primary first).
    pub fn control_server_pids(&self) -> Vec<u32> {
        lock(&self.inner.servers).pids()
    }

    /// How many times a control server that died was started again.
    pub fn control_server_restarts(&self) -> u64 {
        lock(&self.inner.servers).restarts()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.inner.data
    }

    /// The run database.
    pub fn db(&self) -> &RunDb {
        &self.inner.db
    }

    /// The run database's history of slow values, on a connection of its own (a long query
    /// never holds the one that records runs): `history_names`, `history`.
    pub fn history_db(&self) -> &RunDb {
        &self.inner.history_reader
    }

    /// The operator's own control-plane client.
    pub fn dialog(&self) -> &daqflow_dialog::Dialog {
        &self.inner.dialog
    }

    /// The system file.
    pub fn file(&self) -> &SystemFile {
        &self.inner.file
    }

    /// The binary components run as.
    pub fn binary(&self) -> &Path {
        &self.inner.binary
    }

    /// Ends the system in order: a transition under way finishes first (a start cut short
    /// would leave a run half started), a run in progress is stopped and recorded, every
    /// component resets, then every component process ends (SIGTERM, then SIGKILL after 5 s)
    /// and the control servers.
    pub fn shutdown(&self) {
        self.wait_idle();
        if self.run_open()
            && let Err(e) = self.stop()
        {
            tracing::error!("stopping the run at shutdown: {e}");
        }
        let _ = self.call(Call::Shutdown);
        let history = lock(&self.inner.history).take();
        if let Some(h) = history {
            h.stop();
        }
        if let Some(h) = lock(&self.inner.event_loop).take() {
            let _ = h.join();
        }
        lock(&self.inner.subscriptions).clear();
        lock(&self.inner.replies).take();
        self.inner.dialog.shutdown();
        lock(&self.inner.servers).shutdown();
        // Everything of the system has ended: the data directory is free for the next operator.
        lock(&self.inner.data_lock).take();
    }

    /// Writes the web UI's address (`http://HOST:PORT`, without its token) into the data
    /// directory's lock file, for the tools; none: no web UI.
    pub fn set_web_address(&self, web: Option<String>) -> Result<(), OperatorError> {
        match lock(&self.inner.data_lock).as_mut() {
            Some(l) => l.set_web(web).map_err(|e| OperatorError::Setup(e.to_string())),
            None => Ok(()),
        }
    }
}

/// The overrides a run was configured with: from its provenance, else (a run recorded
/// before provenance was kept) from its summary.
pub fn repeated_overrides(detail: &daqflow_api::RunDetail) -> BTreeMap<String, Value> {
    match (&detail.provenance, &detail.summary) {
        (Some(p), _) => p.overrides.clone(),
        (None, Some(s)) => s.overrides.clone(),
        (None, None) => BTreeMap::new(),
    }
}

/// Stores the live changes of the open run not stored yet (`run_changes`), as they happen, so
/// that the record has them even if the operator ends before the run is closed.
fn record_changes(inner: &Inner, seq: &Sequencer, recorded: &mut (u32, usize)) {
    let Some((run, changes)) = seq.run_changes() else { return };
    if recorded.0 != run {
        *recorded = (run, 0);
    }
    for change in changes.iter().skip(recorded.1) {
        if let Err(e) = inner.db.add_change(run, change) {
            tracing::error!("run {run}: the change of {}.{} could not be stored: {e}", change.component, change.key);
        }
        recorded.1 += 1;
    }
}

/// Stores the provenance of the run just opened: the digests, the overrides, what every
/// component was configured with, and the run it repeats.
fn record_provenance(inner: &Inner, seq: &Sequencer, run: u32) {
    let overrides = seq.snapshot().overrides;
    let repeat_of = lock(&inner.repeat).as_ref().filter(|(_, o)| *o == overrides).map(|(n, _)| *n);
    let provenance = crate::provenance::run_provenance(&inner.file.text, overrides, seq.configured_params(), repeat_of);
    if let Err(e) = inner.db.set_provenance(run, &provenance) {
        tracing::error!("run {run}: its provenance could not be stored: {e}");
    }
}

/// Evaluates the alarms on `snapshot` (once a second); every event is logged (the message
/// browser shows it) and stored in the run database.
fn check_alarms(inner: &Inner, snapshot: &Snapshot) {
    let directories = {
        let alarms = lock(&inner.alarms);
        if alarms.is_empty() {
            return;
        }
        alarms.directories()
    };
    let free = directories.into_iter().filter_map(|d| alarms::free_bytes(&d).map(|f| (d, f))).collect();
    let seen = alarms::Observation::from_snapshot(snapshot, free);
    let events = lock(&inner.alarms).evaluate(&seen, Now::current());
    for e in &events {
        alarms::log_event(e);
    }
    if !events.is_empty()
        && let Err(e) = inner.db.add_alarm_events(&events)
    {
        tracing::error!("storing alarm events: {e}");
    }
}

/// A gap this long between two rounds of the event loop (which goes round at least every
/// 100 ms) means that the operator did not run.
const OWN_STALL: Duration = Duration::from_secs(1);

/// The operator's event loop: feeds the sequencer and does what it says, until shutdown.
fn event_loop(
    inner: std::sync::Weak<Inner>,
    rx: Receiver<Event>,
    mut seq: Sequencer,
    mut sup: Supervisor,
    log: Option<daqflow_dialog::Service>,
) {
    let mut tickets: HashMap<u64, Sender<Result<TransitionResult, OperatorError>>> = HashMap::new();
    let mut next_ticket = 1u64;
    let mut shutdown_ticket = None;
    let mut next_sample = Instant::now() + Duration::from_secs(1);
    let mut next_exit_check = Instant::now();
    let mut log_published = 0;
    let mut control = String::new();
    // The open run's live changes already in the run database (`run_changes`).
    let mut changes_recorded: (u32, usize) = (0, 0);
    let mut alarm_check: Option<Snapshot> = None;
    // When the loop last went round (at least every 100 ms while it runs): a longer gap means
    // the operator itself did not run, and its deadlines move by that much.
    let mut last_round = Instant::now();
    loop {
        let wait =
            seq.next_deadline().map_or(Duration::from_millis(100), |d| d.saturating_duration_since(Instant::now()));
        let event = rx.recv_timeout(wait.clamp(Duration::from_millis(1), Duration::from_millis(100)));
        let Some(inner) = inner.upgrade() else { return };
        let mut inputs = VecDeque::new();
        let round = Instant::now();
        let gap = round.saturating_duration_since(last_round);
        last_round = round;
        if gap > OWN_STALL {
            tracing::warn!(
                "the operator did not go round its loop for {:.1} s (a stopped process, an overloaded host, or a slow call): what it waits for gets that much longer",
                gap.as_secs_f64()
            );
            inputs.push_back(Input::Stalled(gap));
        }
        match event {
            Ok(Event::Input(i)) => inputs.push_back(*i),
            Ok(Event::Call(call, reply)) => {
                let ticket = next_ticket;
                next_ticket += 1;
                tickets.insert(ticket, reply);
                inputs.push_back(match call {
                    Call::Launch => Input::Launch { ticket },
                    Call::Transition(transition) => Input::Request { ticket, transition },
                    Call::Set { component, key, value } => Input::Set { ticket, component, key, value },
                    Call::Shutdown => {
                        shutdown_ticket = Some(ticket);
                        Input::Shutdown { ticket }
                    }
                });
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        inputs.push_back(Input::Tick);
        let now = Instant::now();
        if now >= next_exit_check {
            next_exit_check = now + Duration::from_millis(100);
            for (name, status) in sup.exits() {
                inputs.push_back(Input::Exited { name, status });
            }
            let list = control_for_newcomers(&inner.servers, &inner.dialog);
            if list != control {
                control = list.clone();
                // `${system.control}`: as the other hosts reach it.
                let far = inner.file.components.iter().find_map(|c| c.host.as_deref());
                inputs.push_back(Input::Control(control_as_seen_from(&list, far)));
            }
        }
        let mut shut_down = false;
        // Answers go out once the snapshot shows what they did (a caller reads the state next).
        let mut answers = Vec::new();
        while let Some(input) = inputs.pop_front() {
            let t = Now::current();
            for output in seq.handle(input, t) {
                match output {
                    Output::Send { to, request } => {
                        let (verb, payload) = request.encode();
                        match inner.dialog.send_command(&format!("{to}/{verb}"), &payload) {
                            Ok(n) if n > 0 => {}
                            Ok(_) => inputs.push_back(Input::Undelivered { id: request.id }),
                            Err(e) => {
                                tracing::warn!("sending {verb} to {to}: {e}");
                                inputs.push_back(Input::Undelivered { id: request.id });
                            }
                        }
                    }
                    Output::Spawn { name } => {
                        let Some(spec) = inner.file.components.iter().find(|c| c.name == name) else { continue };
                        // A local component of a system on several hosts is told the address
                        // the others reach too: it may listen for them (its wildcard listener
                        // advertises its address towards the control server).
                        let far = inner.file.components.iter().find_map(|c| c.host.as_deref());
                        let reachable = control_as_seen_from(&control, spec.host.as_deref().or(far));
                        inputs.push_back(match sup.spawn(spec, &reachable) {
                            Ok(started) => Input::Spawned { name, pid: started.pid, incarnation: started.incarnation },
                            Err(error) => Input::SpawnFailed { name, error },
                        });
                    }
                    Output::OpenRun { requested } => {
                        let r = inner.db.begin_run(&inner.file.system.name, &inner.file.text, requested);
                        if let Ok(run) = r {
                            lock(&inner.shown).rates.clear();
                            record_provenance(&inner, &seq, run);
                        }
                        // A number taken before is the caller's mistake (400 on the web API).
                        inputs.push_back(Input::RunOpened(r.map_err(|e| match e {
                            crate::db::DbError::RunTaken { .. } => OperatorError::Invalid(e.to_string()),
                            e => OperatorError::Setup(e.to_string()),
                        })));
                    }
                    Output::CloseRun(close) => {
                        let mut summary = status::run_summary(&inner.file.system.name, &close, now_ms());
                        summary.histograms = status::final_histograms(&inner.file, &close);
                        if let Err(e) = inner.db.end_run(&summary) {
                            summary.errors.push(e.to_string());
                            if !matches!(e, crate::db::DbError::Closed(_)) {
                                note_unfinished(&inner, &mut summary, &e);
                            }
                        }
                        inputs.push_back(Input::RunClosed(Box::new(summary)));
                    }
                    Output::Done { ticket, result } => {
                        if let Some(reply) = tickets.remove(&ticket) {
                            answers.push((reply, result));
                        }
                        if Some(ticket) == shutdown_ticket {
                            shut_down = true;
                        }
                    }
                }
            }
        }
        record_changes(&inner, &seq, &mut changes_recorded);
        {
            let mut shown = lock(&inner.shown);
            shown.snapshot = seq.snapshot();
            if Instant::now() >= next_sample {
                next_sample += Duration::from_secs(1);
                let Shown { snapshot, rates, .. } = &mut *shown;
                rates.sample(&inner.file, snapshot, now_ms());
                alarm_check = (!inner.file.alarms.is_empty()).then(|| snapshot.clone());
            }
        }
        if let Some(snapshot) = alarm_check.take() {
            check_alarms(&inner, &snapshot);
        }
        inner.changed.notify_all();
        for (reply, result) in answers {
            let _ = reply.send(result);
        }
        if daqflow_component::log::last_seq() > log_published
            && let Some(service) = &log
        {
            log_published = daqflow_component::log::last_seq();
            let window = daqflow_component::log::window(DIALOG_NAME);
            daqflow_component::log::muted(|| {
                let _ = service.update(serde_json::to_string(&window).unwrap_or_default().as_bytes());
            });
        }
        if shut_down {
            sup.terminate_all(Duration::from_secs(5));
            for (_, reply) in tickets.drain() {
                let _ = reply.send(Err(OperatorError::Setup("the operator has shut down".into())));
            }
            lock(&inner.shown).closed = true;
            inner.changed.notify_all();
            return;
        }
    }
}

/// At the start, by the operator holding the data directory's lock: finishes as `abandoned`
/// the records noted in `DATA/unfinished-runs` by an operator that could not finish them, each
/// with its reason, saying so; the notes of records still not finished stay for the next
/// start. The file, its space taken, for this operator's own notes.
fn finish_unfinished(db: &RunDb, data: &Path) -> Option<unfinished::UnfinishedRuns> {
    let (mut notes, left) = match unfinished::UnfinishedRuns::open(data) {
        Ok(opened) => opened,
        Err(e) => {
            tracing::warn!(
                "{e}: a run whose record cannot be finished is not noted, and is marked abandoned without its reason"
            );
            return None;
        }
    };
    let mut done = Vec::new();
    for n in &left {
        match db.abandon_run(n.run, &n.system, n.stopped_ms, &n.reason) {
            Ok(finished) => {
                if finished {
                    tracing::warn!(
                        "run {} (system `{}`) could not be recorded when it ended; its record is finished now as \
                         abandoned: {}",
                        n.run,
                        n.system,
                        n.reason
                    );
                }
                done.push((n.run, n.system.clone()));
            }
            Err(e) => tracing::warn!(
                "run {}: its record is still not finished ({e}); the next start tries again ({})",
                n.run,
                notes.path().display()
            ),
        }
    }
    if let Err(e) = notes.retain(|n| !done.contains(&(n.run, n.system.clone()))) {
        tracing::warn!("{}: {e}", notes.path().display());
    }
    Some(notes)
}

/// The run database refused to finish the record of `summary`'s run (`e`): notes it in
/// `DATA/unfinished-runs` for the next operator, which finishes it as `abandoned` with the
/// reason; the summary says so (or why not even that worked).
fn note_unfinished(inner: &Inner, summary: &mut RunSummary, e: &crate::db::DbError) {
    let note = unfinished::Unfinished {
        run: summary.run,
        system: inner.file.system.name.clone(),
        stopped_ms: summary.stopped_ms,
        reason: format!("the operator could not finish the record: {e}"),
    };
    let path = inner.data.join(unfinished::UNFINISHED_FILE);
    let written = match lock(&inner.unfinished).as_mut() {
        Some(notes) => notes.note(note).map_err(|e| e.to_string()),
        None => Err("the file could not be made at the start".into()),
    };
    let said = match written {
        Ok(()) => format!(
            "run {}'s record is left running: the next operator on {} finishes it as abandoned, saying why (noted in \
             {})",
            summary.run,
            inner.data.display(),
            path.display()
        ),
        Err(w) => format!(
            "run {}'s record is left running, and could not be noted in {} ({w}): the next operator on {} marks it \
             abandoned without the reason",
            summary.run,
            path.display(),
            inner.data.display()
        ),
    };
    tracing::error!("{said}");
    summary.errors.push(said);
}

#[cfg(test)]
mod tests {
    use super::control_as_seen_from;

    #[test]
    fn a_wildcard_control_address_is_told_as_the_host_the_component_reaches() {
        assert_eq!(control_as_seen_from("10.1.2.3:7000,10.1.2.4:7001", Some("h")), "10.1.2.3:7000,10.1.2.4:7001");
        assert_eq!(control_as_seen_from("0.0.0.0:7000", None), "127.0.0.1:7000");
        assert_eq!(
            control_as_seen_from("0.0.0.0:7000, 127.0.0.1:7001", Some("127.0.0.1")),
            "127.0.0.1:7000,127.0.0.1:7001"
        );
        let far = control_as_seen_from("0.0.0.0:7000", Some("localhost"));
        assert!(!far.starts_with("0.0.0.0"), "{far}");
    }
}
