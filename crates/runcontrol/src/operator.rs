//! The operator: starts a described system and drives it (`daqflow run SYSTEM.toml`,
//! `daqflow demo`).
//!
//! It starts the dialog control server in its own process, every component as a child
//! process (`daqflow component KIND --name NAME --control ADDR`, or `remote_command` for a
//! component with a `host`), and follows each one's `NAME/state` and `NAME/stats`. The
//! transitions of the whole system go to the components in order:
//!
//! - **configure** in dependency order (a component whose parameters refer to another's
//!   result, `${evm.listen}`, comes after it), each with its resolved parameters;
//! - **start** by start stage, consumers first (message logger, ET, recorder and monitor,
//!   then the EVM, BUs, RUs and sources); the same stage starts together;
//! - **stop** by stop stage, producers first: the EVM (which drains), the sources up to the
//!   EVM's last event, RUs, BUs, then the consumers, which drain ET;
//! - **pause** and **resume** to every component, producers first and last respectively;
//! - **reset** to every component.
//!
//! Every command waits for the component's answer (its `last_command` in `NAME/state`) at most
//! the configured timeout. A component that dies (its process exits) or fails (state Error)
//! gets its policy: `stop` ends the run, `restart` starts the process again, configures it
//! and, during a run, starts it in the same run. Runs are numbered and recorded in the run
//! database with their configuration, counters and files.
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
//! println!("run {run}: lost {}", summary["lost"]);
//! op.shutdown();
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::db::RunDb;
use crate::log::now_ms;
use crate::system::{ComponentSpec, Policy, SystemFile, resolve};

/// Why the operator could not do something.
#[derive(Debug, thiserror::Error)]
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
}

/// What the operator knows of one component.
#[derive(Debug, Clone, Default)]
struct View {
    state: String,
    run: Option<u64>,
    since_ms: u64,
    error: Option<String>,
    pid: Option<u32>,
    last_command: Value,
    stats: Value,
    /// The process is running (false after it exited, until it is started again).
    alive: bool,
    exit: Option<String>,
    restarts: u32,
    /// The last statistics of the component's earlier lives in the current run (it was
    /// restarted): their counters still count for the run.
    earlier: Vec<Value>,
    /// The pid the component's last life published: a state that still carries it after the
    /// process ended (delivered late, or again) is not the new life's.
    stale_pid: Option<u32>,
}

struct RatePoint {
    t_ms: u64,
    events_per_s: f64,
    mb_per_s: f64,
}

struct Shared {
    views: HashMap<String, View>,
    /// configure results and stop summaries (for `${name.key}` references).
    results: HashMap<String, Value>,
    run: Option<u32>,
    run_started_ms: Option<u64>,
    /// A transition under way.
    phase: Option<String>,
    /// The system was told to be in this state (what the components should be in).
    target: &'static str,
    last_error: Option<String>,
    last_summary: Value,
    rates: VecDeque<RatePoint>,
    totals: (u64, u64),
    /// Components being started again by their policy `restart`: the system's state does not
    /// count them meanwhile.
    restarting: Vec<String>,
}

/// A component to start, the control servers to give it (`A,B,…`), and where the launcher
/// thread answers.
type LaunchRequest = (ComponentSpec, String, Sender<Result<Child, String>>);

struct Inner {
    file: SystemFile,
    binary: PathBuf,
    data: PathBuf,
    control: SocketAddr,
    db: RunDb,
    dialog: daqflow_dialog::Dialog,
    shared: Mutex<Shared>,
    changed: Condvar,
    children: Mutex<HashMap<String, Child>>,
    launcher: Mutex<Sender<LaunchRequest>>,
    transition: Mutex<()>,
    next_id: AtomicU64,
    closing: AtomicBool,
    subscriptions: Mutex<Vec<daqflow_dialog::Subscription>>,
    log: Option<daqflow_dialog::Service>,
    servers: Mutex<crate::control_servers::ControlServers>,
}

/// A running system.
#[derive(Clone)]
pub struct Operator {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Operator {
    /// Starts the control server, the run database and every component process, and waits
    /// until each has joined the control plane.
    pub fn launch(options: OperatorOptions) -> Result<Operator, OperatorError> {
        let file = options.file;
        let data = options.data.unwrap_or_else(|| file.system.data.clone());
        let data = if data.is_absolute() {
            data
        } else {
            std::env::current_dir().map_err(|e| OperatorError::Setup(e.to_string()))?.join(data)
        };
        std::fs::create_dir_all(data.join("logs"))
            .map_err(|e| OperatorError::Setup(format!("data directory {}: {e}", data.display())))?;
        let db_path = if file.system.database.is_absolute() {
            file.system.database.clone()
        } else {
            data.join(&file.system.database)
        };
        let db = RunDb::open(&db_path).map_err(|e| OperatorError::Setup(e.to_string()))?;
        if let Ok(n) = db.abandon_open_runs()
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
            },
        )
        .map_err(|e| OperatorError::Setup(format!("starting the control server: {e}")))?;
        let control = servers.addrs()[0];
        let mut dialog_config = daqflow_dialog::DialogConfig::new("operator", servers.addrs().to_vec());
        dialog_config.token = Some(token.clone());
        let dialog = daqflow_dialog::Dialog::start(dialog_config)
            .map_err(|e| OperatorError::Setup(format!("joining the control plane: {e}")))?;
        // The operator's own log records reach the message logger like every component's.
        let log = dialog.provide("operator/log").ok();
        // Children are started by one long-lived thread: a child's parent-death signal fires
        // when the thread that started it ends.
        let (ltx, lrx) = channel::<LaunchRequest>();
        let launch = Launch {
            binary: options.binary.clone(),
            remote: file.system.remote_command.clone(),
            logs: data.join("logs"),
            token_file: token_path.clone(),
        };
        std::thread::Builder::new()
            .name("launcher".into())
            .spawn(move || {
                for (spec, control, reply) in lrx {
                    let _ = reply.send(spawn_component(&launch, &spec, &control));
                }
            })
            .map_err(|e| OperatorError::Setup(e.to_string()))?;
        let shared = Shared {
            views: file
                .components
                .iter()
                .map(|c| (c.name.clone(), View { state: "Starting".into(), ..View::default() }))
                .collect(),
            results: HashMap::new(),
            run: None,
            run_started_ms: None,
            phase: None,
            target: "Initial",
            last_error: None,
            last_summary: Value::Null,
            rates: VecDeque::new(),
            totals: (0, 0),
            restarting: Vec::new(),
        };
        let inner = Arc::new(Inner {
            file,
            binary: options.binary,
            data,
            control,
            db,
            dialog,
            shared: Mutex::new(shared),
            changed: Condvar::new(),
            children: Mutex::new(HashMap::new()),
            launcher: Mutex::new(ltx),
            transition: Mutex::new(()),
            next_id: AtomicU64::new(1),
            closing: AtomicBool::new(false),
            subscriptions: Mutex::new(Vec::new()),
            log,
            servers: Mutex::new(servers),
        });
        let op = Operator { inner };
        for c in &op.inner.file.components {
            op.follow(&c.name)?;
        }
        for c in op.inner.file.components.clone() {
            op.start_process(&c)?;
        }
        for c in &op.inner.file.components {
            op.wait_joined(&c.name, op.timeout())?;
        }
        op.spawn_watchers();
        tracing::info!(system = %op.inner.file.system.name, control = %op.inner.control, "system launched");
        Ok(op)
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

    /// The control servers for a process started now: the one the operator uses first (the
    /// spare, after the primary died), so that a restarted component joins the processes
    /// already there and not a primary started again meanwhile.
    fn control_for_newcomers(&self) -> String {
        let all = lock(&self.inner.servers).addrs().to_vec();
        let current = self.inner.dialog.client().control_server();
        let mut ordered: Vec<SocketAddr> = current.into_iter().filter(|c| all.contains(c)).collect();
        ordered.extend(all.iter().filter(|a| Some(**a) != current));
        ordered.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
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

    /// The operator's own control-plane client.
    pub fn dialog(&self) -> &daqflow_dialog::Dialog {
        &self.inner.dialog
    }

    /// The system file.
    pub fn file(&self) -> &SystemFile {
        &self.inner.file
    }

    fn follow(&self, name: &str) -> Result<(), OperatorError> {
        let err = |e: daqflow_dialog::DialogError| OperatorError::Setup(format!("following {name}: {e}"));
        let weak = Arc::downgrade(&self.inner);
        let n = name.to_owned();
        let state = self
            .inner
            .dialog
            .subscribe(&format!("{name}/state"), move |ev| {
                let Some(inner) = weak.upgrade() else { return };
                if let daqflow_dialog::ServiceEvent::Update { data, .. } = ev
                    && let Ok(v) = serde_json::from_slice::<Value>(&data)
                {
                    let mut s = lock(&inner.shared);
                    let view = s.views.entry(n.clone()).or_default();
                    let pid = v["pid"].as_u64().map(|p| p as u32);
                    if pid.is_some() && pid == view.stale_pid {
                        return;
                    }
                    view.state = v["state"].as_str().unwrap_or("?").to_owned();
                    view.run = v["run"].as_u64();
                    view.since_ms = v["since_ms"].as_u64().unwrap_or(0);
                    view.error = v["error"].as_str().map(str::to_owned);
                    view.pid = v["pid"].as_u64().map(|p| p as u32);
                    view.last_command = v["last_command"].clone();
                    drop(s);
                    inner.changed.notify_all();
                }
            })
            .map_err(err)?;
        let weak = Arc::downgrade(&self.inner);
        let n = name.to_owned();
        let stats = self
            .inner
            .dialog
            .subscribe(&format!("{name}/stats"), move |ev| {
                let Some(inner) = weak.upgrade() else { return };
                if let daqflow_dialog::ServiceEvent::Update { data, .. } = ev
                    && let Ok(v) = serde_json::from_slice::<Value>(&data)
                {
                    let mut s = lock(&inner.shared);
                    let view = s.views.entry(n.clone()).or_default();
                    // Until the new life has published its state, statistics are the old life's.
                    if view.alive && view.state != "Starting" {
                        view.stats = v;
                    }
                }
            })
            .map_err(err)?;
        lock(&self.inner.subscriptions).extend([state, stats]);
        Ok(())
    }

    fn start_process(&self, spec: &ComponentSpec) -> Result<(), OperatorError> {
        let (tx, rx) = channel();
        lock(&self.inner.launcher)
            .send((spec.clone(), self.control_for_newcomers(), tx))
            .map_err(|_| OperatorError::Setup("the launcher thread ended".into()))?;
        let child = rx
            .recv()
            .map_err(|_| OperatorError::Setup("the launcher thread ended".into()))?
            .map_err(OperatorError::Setup)?;
        {
            let mut s = lock(&self.inner.shared);
            let v = s.views.entry(spec.name.clone()).or_default();
            v.alive = true;
            v.exit = None;
            v.pid = Some(child.id());
            v.state = "Starting".into();
            v.last_command = Value::Null;
        }
        lock(&self.inner.children).insert(spec.name.clone(), child);
        Ok(())
    }

    /// Waits until the component published its state (it joined and registered its commands).
    fn wait_joined(&self, name: &str, timeout: Duration) -> Result<(), OperatorError> {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.inner.shared);
        loop {
            let v = &s.views[name];
            if v.state != "Starting" && v.state != "Dead" && v.alive {
                return Ok(());
            }
            if !v.alive {
                return Err(OperatorError::Component {
                    component: name.into(),
                    command: "launch".into(),
                    reason: format!(
                        "the process ended ({}); see {}",
                        v.exit.clone().unwrap_or_default(),
                        self.inner.data.join("logs").join(format!("{name}.log")).display()
                    ),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(OperatorError::Component {
                    component: name.into(),
                    command: "launch".into(),
                    reason: format!("did not join the control plane within {:.0} s", timeout.as_secs_f64()),
                });
            }
            s = self.inner.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Sends `verb` to a component and waits for its answer.
    fn command(&self, name: &str, verb: &str, mut payload: Value, timeout: Duration) -> Result<Value, OperatorError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        if !payload.is_object() {
            payload = json!({});
        }
        payload["id"] = json!(id);
        let fail = |reason: String| OperatorError::Component { component: name.into(), command: verb.into(), reason };
        let deadline = Instant::now() + timeout;
        // A process that just joined (a restarted one) may have published its state before the
        // control plane routes its commands: it is tried again while it lives, within the timeout.
        loop {
            let n = self
                .inner
                .dialog
                .send_command(&format!("{name}/{verb}"), payload.to_string().as_bytes())
                .map_err(|e| fail(e.to_string()))?;
            if n > 0 {
                break;
            }
            let alive = lock(&self.inner.shared).views.get(name).is_some_and(|v| v.alive);
            if !alive || Instant::now() >= deadline {
                return Err(fail("not on the control plane".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut s = lock(&self.inner.shared);
        loop {
            let v = &s.views[name];
            if v.last_command["id"].as_u64() == Some(id) {
                return if v.last_command["ok"].as_bool() == Some(true) {
                    Ok(v.last_command["result"].clone())
                } else {
                    Err(fail(v.last_command["error"].as_str().unwrap_or("failed").to_owned()))
                };
            }
            if !v.alive {
                return Err(fail(format!("the process ended ({})", v.exit.clone().unwrap_or_default())));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(fail(format!("no answer within {:.0} s", timeout.as_secs_f64())));
            }
            s = self.inner.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Sends `verb` to several components at once and waits for every answer.
    fn command_all(
        &self,
        names: &[String],
        verb: &str,
        payloads: Vec<Value>,
        timeout: Duration,
    ) -> Vec<(String, Result<Value, OperatorError>)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = names
                .iter()
                .zip(payloads)
                .map(|(n, p)| {
                    let n = n.clone();
                    scope.spawn(move || {
                        let r = self.command(&n, verb, p, timeout);
                        (n, r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| (String::new(), Err(OperatorError::Setup("a thread panicked".into()))))
                })
                .collect()
        })
    }

    fn timeout(&self) -> Duration {
        seconds(self.inner.file.system.timeout_s)
    }

    fn stop_timeout(&self) -> Duration {
        seconds(self.inner.file.system.stop_timeout_s)
    }

    /// The system's state: the phase under way, else what every component reports (Error if
    /// one is in Error or dead, `Mixed` if they differ).
    pub fn state(&self) -> String {
        let s = lock(&self.inner.shared);
        Self::state_of(&s)
    }

    /// Whether a run is open: started and not yet stopped and recorded. A component that dies
    /// and is restarted does not close it; only a stop (by the operator or by a policy) or a
    /// reset does.
    pub fn run_open(&self) -> bool {
        lock(&self.inner.shared).run_started_ms.is_some()
    }

    /// Waits at most `timeout` until no run is open; whether none is.
    pub fn wait_run_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.inner.shared);
        while s.run_started_ms.is_some() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self.inner.changed.wait_timeout(s, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    fn state_of(s: &Shared) -> String {
        if let Some(p) = &s.phase {
            return p.clone();
        }
        let mut states = s
            .views
            .iter()
            .filter(|(n, _)| !s.restarting.contains(n))
            .map(|(_, v)| if v.alive { v.state.as_str() } else { "Dead" });
        let first = states.next().unwrap_or("Initial");
        let all: Vec<&str> = std::iter::once(first).chain(states).collect();
        if all.iter().any(|&x| x == "Error" || x == "Dead") {
            "Error".into()
        } else if all.iter().all(|&x| x == first) {
            first.into()
        } else {
            "Mixed".into()
        }
    }

    fn begin(&self, phase: &str, allowed: &[&str]) -> Result<MutexGuard<'_, ()>, OperatorError> {
        let guard = match self.inner.transition.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => match lock(&self.inner.shared).phase.clone() {
                Some(p) => return Err(OperatorError::Busy(p)),
                // No phase: a component is being restarted (bounded by the timeouts); the
                // transition waits for it rather than failing.
                None => lock(&self.inner.transition),
            },
        };
        let mut s = lock(&self.inner.shared);
        let state = Self::state_of(&s);
        if !allowed.contains(&state.as_str()) {
            let command = match phase {
                "Configuring" => "configure",
                "Starting" => "start",
                "Pausing" => "pause",
                "Resuming" => "resume",
                "Stopping" => "stop",
                _ => "reset",
            };
            return Err(OperatorError::IllegalTransition { command: command.into(), state });
        }
        s.phase = Some(phase.into());
        drop(s);
        self.inner.changed.notify_all();
        Ok(guard)
    }

    fn end(&self, target: &'static str, error: Option<String>) {
        let mut s = lock(&self.inner.shared);
        s.phase = None;
        s.target = target;
        if error.is_some() {
            s.last_error = error;
        }
        drop(s);
        self.inner.changed.notify_all();
    }

    fn system_results(&self) -> Value {
        json!({
            "name": self.inner.file.system.name,
            "id": format!("{}-{}-{}", self.inner.file.system.name, std::process::id(), self.inner.control.port()),
            "control": self.control_for_newcomers(),
            "data": self.inner.data,
            "database": self.inner.db.path(),
        })
    }

    /// The resolved parameters of a component (references replaced by results).
    fn resolved_params(&self, spec: &ComponentSpec) -> Result<Value, OperatorError> {
        let mut results = lock(&self.inner.shared).results.clone();
        results.insert("system".into(), self.system_results());
        let t = resolve(&toml::Value::Table(spec.params.clone()), &results).map_err(|reason| {
            OperatorError::Component { component: spec.name.clone(), command: "configure".into(), reason }
        })?;
        serde_json::to_value(&t).map_err(|e| OperatorError::Setup(e.to_string()))
    }

    fn configure_one(&self, spec: &ComponentSpec) -> Result<(), OperatorError> {
        let params = self.resolved_params(spec)?;
        let info = self.command(&spec.name, "configure", json!({ "config": params }), self.timeout())?;
        lock(&self.inner.shared).results.insert(spec.name.clone(), info);
        Ok(())
    }

    /// Configures every component (Initial → Configured).
    pub fn configure(&self) -> Result<Value, OperatorError> {
        let _g = self.begin("Configuring", &["Initial"])?;
        let order = self.inner.file.configure_order().map_err(OperatorError::Setup)?;
        lock(&self.inner.shared).results.clear();
        for i in order {
            let spec = self.inner.file.components[i].clone();
            if let Err(e) = self.configure_one(&spec) {
                tracing::error!("configure failed: {e}");
                self.end("Initial", Some(e.to_string()));
                return Err(e);
            }
        }
        tracing::info!("system configured");
        self.end("Configured", None);
        Ok(json!(lock(&self.inner.shared).results.clone()))
    }

    fn names(&self, idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| self.inner.file.components[i].name.clone()).collect()
    }

    /// Starts a run (Configured → Running): `run` or the next number. Returns the run number.
    pub fn start(&self, run: Option<u32>) -> Result<u32, OperatorError> {
        let _g = self.begin("Starting", &["Configured"])?;
        let run = match self.inner.db.begin_run(&self.inner.file.system.name, &self.inner.file.text, run) {
            Ok(r) => r,
            Err(e) => {
                self.end("Configured", Some(e.to_string()));
                return Err(OperatorError::Setup(e.to_string()));
            }
        };
        {
            let mut s = lock(&self.inner.shared);
            s.run = Some(run);
            s.run_started_ms = Some(now_ms());
            s.rates.clear();
            s.totals = (0, 0);
            s.last_summary = Value::Null;
            s.last_error = None;
            for v in s.views.values_mut() {
                v.earlier.clear();
            }
        }
        let mut started: Vec<usize> = Vec::new();
        for stage in self.inner.file.stages(true) {
            let names = self.names(&stage);
            let payloads = names.iter().map(|_| json!({ "run": run })).collect();
            let answers = self.command_all(&names, "start", payloads, self.timeout());
            let mut failure = None;
            for ((name, r), &i) in answers.into_iter().zip(&stage) {
                match r {
                    Ok(_) => started.push(i),
                    Err(e) => {
                        tracing::error!("start of {name} failed: {e}");
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                // Take back what started, in stop order.
                let mut stopped = Vec::new();
                for stage in self.inner.file.stages(false) {
                    let names: Vec<String> =
                        self.names(&stage.iter().copied().filter(|i| started.contains(i)).collect::<Vec<_>>());
                    let payloads = names.iter().map(|_| json!({})).collect();
                    stopped.extend(self.command_all(&names, "stop", payloads, self.stop_timeout()));
                }
                let summaries = stopped.into_iter().filter_map(|(n, r)| r.ok().map(|v| (n, v))).collect();
                self.close_run(run, &summaries, vec![e.to_string()]);
                self.end("Configured", Some(e.to_string()));
                return Err(e);
            }
        }
        tracing::info!(run, "run started");
        self.end("Running", None);
        Ok(run)
    }

    /// Pauses the run (producers first).
    pub fn pause(&self) -> Result<(), OperatorError> {
        let _g = self.begin("Pausing", &["Running"])?;
        let r = self.in_stages(false, "pause");
        self.end(if r.is_ok() { "Paused" } else { "Running" }, r.as_ref().err().map(|e| e.to_string()));
        r
    }

    /// Resumes a paused run (consumers first).
    pub fn resume(&self) -> Result<(), OperatorError> {
        let _g = self.begin("Resuming", &["Paused"])?;
        let r = self.in_stages(true, "resume");
        self.end(if r.is_ok() { "Running" } else { "Paused" }, r.as_ref().err().map(|e| e.to_string()));
        r
    }

    fn in_stages(&self, start_order: bool, verb: &str) -> Result<(), OperatorError> {
        let mut first_error = None;
        for stage in self.inner.file.stages(start_order) {
            let names = self.names(&stage);
            let payloads = names.iter().map(|_| json!({})).collect();
            for (_, r) in self.command_all(&names, verb, payloads, self.timeout()) {
                if let Err(e) = r {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stops the run (producers first, draining in between) and returns its summary, which
    /// is also stored in the run database.
    pub fn stop(&self) -> Result<Value, OperatorError> {
        self.stop_because(None)
    }

    fn stop_because(&self, reason: Option<String>) -> Result<Value, OperatorError> {
        let _g = self.begin("Stopping", &["Running", "Paused", "Error", "Mixed"])?;
        // Only an open run is stopped and recorded, once: a second failure after the stop (a
        // component that reports its failure late) finds the run closed.
        let run = {
            let s = lock(&self.inner.shared);
            s.run_started_ms.and(s.run)
        };
        let Some(run) = run else {
            self.end("Configured", None);
            return Err(OperatorError::IllegalTransition {
                command: "stop".into(),
                state: "Configured (no run)".into(),
            });
        };
        let mut summaries: HashMap<String, Value> = HashMap::new();
        let mut errors: Vec<String> = reason.into_iter().collect();
        for stage in self.inner.file.stages(false) {
            let mut names = Vec::new();
            let mut payloads = Vec::new();
            for &i in &stage {
                let spec = &self.inner.file.components[i];
                let view = lock(&self.inner.shared).views[&spec.name].clone();
                if !view.alive || !matches!(view.state.as_str(), "Running" | "Paused" | "Error") {
                    if !view.alive {
                        errors.push(format!("{}: not running ({})", spec.name, view.exit.clone().unwrap_or_default()));
                    }
                    continue;
                }
                let arg = match &spec.stop_arg {
                    Some(a) => {
                        let mut results = lock(&self.inner.shared).results.clone();
                        for (k, v) in &summaries {
                            results.insert(k.clone(), v.clone());
                        }
                        match resolve(&toml::Value::String(a.clone()), &results) {
                            Ok(toml::Value::Integer(n)) => json!({ "last_event": n }),
                            Ok(toml::Value::String(s)) => {
                                s.trim().parse::<u64>().map_or(json!({}), |n| json!({ "last_event": n }))
                            }
                            Ok(_) => json!({}),
                            Err(e) => {
                                errors.push(format!("{}: stop_arg: {e}", spec.name));
                                json!({})
                            }
                        }
                    }
                    None => json!({}),
                };
                names.push(spec.name.clone());
                payloads.push(arg);
            }
            for (name, r) in self.command_all(&names, "stop", payloads, self.stop_timeout()) {
                match r {
                    Ok(v) => {
                        summaries.insert(name, v);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
        }
        let summary = self.close_run(run, &summaries, errors);
        let error = summary["error"].as_str().map(str::to_owned);
        self.end("Configured", error);
        Ok(summary)
    }

    /// Makes the run's summary and record (`stopped`, or `failed` with the errors) and closes
    /// the run.
    fn close_run(&self, run: u32, summaries: &HashMap<String, Value>, mut errors: Vec<String>) -> Value {
        let mut summary = self.run_summary(run, summaries, &errors);
        let state = if errors.is_empty() { "stopped" } else { "failed" };
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        if let Err(e) = self.inner.db.end_run(run, state, &summary, error.as_deref()) {
            errors.push(e.to_string());
            summary["errors"] = json!(errors);
        }
        summary["state"] = json!(state);
        summary["error"] = json!(error);
        tracing::info!(run, events = %summary["events"], lost = %summary["lost"], "run {state}");
        {
            let mut s = lock(&self.inner.shared);
            s.last_summary = summary.clone();
            s.run_started_ms = None;
        }
        self.inner.changed.notify_all();
        summary
    }

    /// The directory component `spec` writes its data files into, when it writes any: a
    /// recorder's (as its configure answered), a builder unit's with `output = "files"`.
    fn data_directory(&self, spec: &ComponentSpec, results: &HashMap<String, Value>) -> Option<PathBuf> {
        let params = self.resolved_params(spec).ok()?;
        let dir = match spec.kind.as_str() {
            "recorder" => {
                results.get(&spec.name).and_then(|r| r["directory"].as_str()).or(params["directory"].as_str())
            }
            "bu" if params["output"] == "files" => Some(params["directory"].as_str().unwrap_or("data")),
            _ => None,
        }?;
        Some(PathBuf::from(dir))
    }

    fn run_summary(&self, run: u32, summaries: &HashMap<String, Value>, errors: &[String]) -> Value {
        let (views, results, started) = {
            let s = lock(&self.inner.shared);
            (s.views.clone(), s.results.clone(), s.run_started_ms.unwrap_or_else(now_ms))
        };
        let mut runs = Vec::new();
        let mut files = Vec::new();
        let mut file_problems = Vec::new();
        for spec in &self.inner.file.components {
            let view = views.get(&spec.name).cloned().unwrap_or_default();
            runs.push(crate::accounting::ComponentRun {
                name: spec.name.clone(),
                kind: spec.kind.clone(),
                summary: summaries.get(&spec.name).cloned(),
                last_stats: view.stats.clone(),
                earlier: view.earlier.clone(),
                died: (!view.alive).then(|| view.exit.clone().unwrap_or_else(|| "its process ended".into())),
            });
            // The files on disk, whatever the writer's fate; a writer without a directory the
            // operator knows gives its summary's list.
            match self.data_directory(spec, &results) {
                Some(dir) => {
                    let (found, problems) = crate::accounting::files_on_disk(&dir, run, &spec.name);
                    files.extend(found);
                    file_problems.extend(problems);
                }
                None => {
                    for f in summaries.get(&spec.name).and_then(|v| v["files"].as_array()).into_iter().flatten() {
                        files.push(crate::accounting::FileRecord {
                            component: spec.name.clone(),
                            path: PathBuf::from(f["path"].as_str().unwrap_or("")),
                            events: f["events"].as_u64().unwrap_or(0),
                            bytes: f["bytes"].as_u64().unwrap_or(0),
                            first_event: f["first_event"].as_u64(),
                            last_event: f["last_event"].as_u64(),
                            complete: true,
                        });
                    }
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut summary = crate::accounting::account(&runs, &files);
        let components: serde_json::Map<String, Value> = runs
            .iter()
            .map(|c| {
                let counters =
                    c.summary.clone().unwrap_or_else(|| json!({ "last_stats": strip_histograms(&c.last_stats) }));
                (
                    c.name.clone(),
                    json!({ "kind": c.kind, "counters": counters, "died": c.died, "earlier_lives": c.earlier.len() }),
                )
            })
            .collect();
        let stopped = now_ms().max(started);
        let extra = json!({
            "run": run,
            "system": self.inner.file.system.name,
            "started_ms": started,
            "stopped_ms": stopped,
            "seconds": (stopped - started) as f64 / 1e3,
            "components": components,
            "file_problems": file_problems,
            "errors": errors,
        });
        if let (Value::Object(m), Value::Object(e)) = (&mut summary, extra) {
            m.extend(e);
        }
        summary
    }

    /// Resets every component (any state → Initial).
    pub fn reset(&self) -> Result<(), OperatorError> {
        let _g = self.begin("Resetting", &["Initial", "Configured", "Running", "Paused", "Error", "Mixed"])?;
        // A run still open is closed as failed.
        let open_run = {
            let s = lock(&self.inner.shared);
            s.run_started_ms.and(s.run)
        };
        if let Some(run) = open_run {
            self.close_run(run, &HashMap::new(), vec!["reset during the run".into()]);
        }
        // Dead components are started again first.
        for spec in self.inner.file.components.clone() {
            let alive = lock(&self.inner.shared).views[&spec.name].alive;
            if !alive {
                self.start_process(&spec)?;
                self.wait_joined(&spec.name, self.timeout())?;
            }
        }
        let r = self.in_stages(false, "reset");
        self.end("Initial", r.as_ref().err().map(|e| e.to_string()));
        r
    }

    /// The run number (running or last).
    pub fn run_number(&self) -> Option<u32> {
        lock(&self.inner.shared).run
    }

    /// The summary of the last run stopped.
    pub fn last_summary(&self) -> Value {
        lock(&self.inner.shared).last_summary.clone()
    }

    fn spawn_watchers(&self) {
        // Process exits and component failures, with their policy.
        let weak = Arc::downgrade(&self.inner);
        let _ = std::thread::Builder::new().name("watch".into()).spawn(move || {
            let mut handled: HashMap<String, u64> = HashMap::new();
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let Some(inner) = weak.upgrade() else { return };
                if inner.closing.load(Ordering::SeqCst) {
                    return;
                }
                let op = Operator { inner };
                op.check_children(&mut handled);
            }
        });
        // Rates, once a second; the operator's log records.
        let weak = Arc::downgrade(&self.inner);
        let _ = std::thread::Builder::new().name("rates".into()).spawn(move || {
            let mut log_published = 0;
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(inner) = weak.upgrade() else { return };
                if inner.closing.load(Ordering::SeqCst) {
                    return;
                }
                let last = crate::log::last_seq();
                if last > log_published
                    && let Some(service) = &inner.log
                {
                    let window = crate::log::window("operator");
                    crate::log::muted(|| {
                        let _ = service.update(serde_json::to_string(&window).unwrap_or_default().as_bytes());
                    });
                    log_published = last;
                }
                let mut s = lock(&inner.shared);
                let (events, bytes, _) = live_totals(&inner.file, &s);
                let running = s.run_started_ms.is_some();
                let (e0, b0) = s.totals;
                let point = RatePoint {
                    t_ms: now_ms(),
                    events_per_s: if running { events.saturating_sub(e0) as f64 } else { 0.0 },
                    mb_per_s: if running { bytes.saturating_sub(b0) as f64 / 1e6 } else { 0.0 },
                };
                s.totals = (events, bytes);
                s.rates.push_back(point);
                while s.rates.len() > 600 {
                    s.rates.pop_front();
                }
            }
        });
    }

    fn check_children(&self, handled: &mut HashMap<String, u64>) {
        let mut exited = Vec::new();
        {
            let mut children = lock(&self.inner.children);
            for (name, child) in children.iter_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    exited.push((name.clone(), status.to_string()));
                }
            }
            for (name, _) in &exited {
                children.remove(name);
            }
        }
        for (name, status) in &exited {
            let mut s = lock(&self.inner.shared);
            if let Some(v) = s.views.get_mut(name) {
                v.stale_pid = v.pid;
                v.alive = false;
                v.exit = Some(status.clone());
                v.state = "Dead".into();
            }
            drop(s);
            self.inner.changed.notify_all();
            tracing::error!(component = %name, "the process of {name} ended: {status}");
        }
        // Components that died or failed, each handled once per failure.
        let (phase, target, failing): (Option<String>, &'static str, Vec<(String, String)>) = {
            let s = lock(&self.inner.shared);
            let failing = s
                .views
                .iter()
                .filter(|(_, v)| !v.alive || v.state == "Error")
                .map(|(n, v)| (n.clone(), v.exit.clone().or(v.error.clone()).unwrap_or_else(|| "failed".into())))
                .collect();
            (s.phase.clone(), s.target, failing)
        };
        if phase.is_some() || self.inner.closing.load(Ordering::SeqCst) {
            return;
        }
        // Components whose policy is `stop` come first: when one of them failed in a run, the
        // run stops and nothing is restarted into it (e.g. an RU death makes the EVM abort and
        // every BU fail; restarting the BUs would not save that run).
        let mut fresh: Vec<(ComponentSpec, String)> = Vec::new();
        for (name, why) in failing {
            let key = {
                let s = lock(&self.inner.shared);
                let v = &s.views[&name];
                v.since_ms ^ (u64::from(v.restarts) << 48) ^ u64::from(v.alive)
            };
            if handled.get(&name) == Some(&key) {
                continue;
            }
            handled.insert(name.clone(), key);
            if let Some(spec) = self.inner.file.components.iter().find(|c| c.name == name) {
                fresh.push((spec.clone(), why));
            }
        }
        fresh.sort_by_key(|(spec, _)| spec.policy == Policy::Restart);
        let in_run = matches!(target, "Running" | "Paused");
        if let Some((spec, why)) = fresh.iter().find(|(spec, _)| spec.policy == Policy::Stop) {
            if in_run {
                tracing::error!(component = %spec.name, "{} failed ({why}); stopping the run (policy stop)", spec.name);
                let op = self.clone();
                let reason = format!("{} failed: {why}", spec.name);
                let _ = std::thread::Builder::new().name("policy-stop".into()).spawn(move || {
                    if let Err(e) = op.stop_because(Some(reason)) {
                        tracing::error!("stopping the run after a failure: {e}");
                    }
                });
            }
            return;
        }
        for (spec, why) in fresh {
            tracing::warn!(component = %spec.name, "{} failed ({why}); restarting it (policy restart)", spec.name);
            if let Err(e) = self.restart(&spec) {
                tracing::error!(component = %spec.name, "restarting {} failed: {e}", spec.name);
                if in_run {
                    let _ = self
                        .stop_because(Some(format!("{} failed ({why}) and could not be restarted: {e}", spec.name)));
                }
                return;
            }
        }
    }

    /// Starts a component again and brings it to the system's state.
    fn restart(&self, spec: &ComponentSpec) -> Result<(), OperatorError> {
        {
            let mut s = lock(&self.inner.shared);
            if !s.restarting.contains(&spec.name) {
                s.restarting.push(spec.name.clone());
            }
        }
        let r = self.restart_inner(spec);
        lock(&self.inner.shared).restarting.retain(|n| n != &spec.name);
        self.inner.changed.notify_all();
        r
    }

    fn restart_inner(&self, spec: &ComponentSpec) -> Result<(), OperatorError> {
        // No transition of the whole system meanwhile; the state to return to is read after.
        let _g = lock(&self.inner.transition);
        let target = lock(&self.inner.shared).target;
        if let Some(mut c) = lock(&self.inner.children).remove(&spec.name) {
            let _ = c.kill();
            let _ = c.wait();
        }
        {
            let mut s = lock(&self.inner.shared);
            let in_run = s.run_started_ms.is_some();
            let v = s.views.entry(spec.name.clone()).or_default();
            v.restarts += 1;
            // The counters of the life that ended still count for the run; the new life
            // publishes its own from 0.
            let last = std::mem::take(&mut v.stats);
            if in_run {
                v.earlier.push(last);
            }
        }
        self.start_process(spec)?;
        self.wait_joined(&spec.name, self.timeout())?;
        if matches!(target, "Configured" | "Running" | "Paused") {
            self.configure_one(spec)?;
        }
        if matches!(target, "Running" | "Paused") {
            let run = lock(&self.inner.shared).run.unwrap_or(0);
            self.command(&spec.name, "start", json!({ "run": run }), self.timeout())?;
            if target == "Paused" {
                self.command(&spec.name, "pause", json!({}), self.timeout())?;
            }
        }
        tracing::info!(component = %spec.name, "{} restarted and back in state {target}", spec.name);
        Ok(())
    }

    /// The live status (the web UI's `/api/status`).
    pub fn status(&self) -> Value {
        let s = lock(&self.inner.shared);
        let components: Vec<Value> = self
            .inner
            .file
            .components
            .iter()
            .map(|c| {
                let v = s.views.get(&c.name).cloned().unwrap_or_default();
                json!({
                    "name": c.name,
                    "kind": c.kind,
                    "host": c.host.clone().unwrap_or_else(|| "localhost".into()),
                    "pid": v.pid,
                    "alive": v.alive,
                    "state": if v.alive { v.state.clone() } else { "Dead".into() },
                    "run": v.run,
                    "since_ms": v.since_ms,
                    "error": v.exit.clone().map(|e| format!("process ended: {e}")).or(v.error.clone()),
                    "restarts": v.restarts,
                    "policy": c.policy,
                    "stats": strip_histograms(&v.stats),
                })
            })
            .collect();
        let (events, bytes, recorded) = live_totals(&self.inner.file, &s);
        let last = s.rates.back();
        let running = s.run_started_ms.is_some();
        json!({
            "system": self.inner.file.system.name,
            "state": Self::state_of(&s),
            "phase": s.phase,
            "run": s.run,
            "running": running,
            "run_started_ms": s.run_started_ms,
            "duration_s": s.run_started_ms.map(|t| now_ms().saturating_sub(t) as f64 / 1e3),
            "events": if running { events } else { s.last_summary["events"].as_u64().unwrap_or(events) },
            "bytes": bytes,
            "recorded": if running { recorded } else { s.last_summary["recorded"].as_u64().unwrap_or(recorded) },
            "events_per_s": last.map_or(0.0, |r| r.events_per_s),
            "mb_per_s": last.map_or(0.0, |r| r.mb_per_s),
            "lost": s.last_summary.get("lost").cloned(),
            "last_error": s.last_error,
            "last_summary": s.last_summary,
            "control": self.inner.control.to_string(),
            "data": self.inner.data,
            "components": components,
            "rates": s.rates.iter().map(|r| json!({"t_ms": r.t_ms, "events_per_s": r.events_per_s, "mb_per_s": r.mb_per_s})).collect::<Vec<_>>(),
        })
    }

    /// The monitors' histograms: `[{"component", …histogram}]`.
    pub fn histograms(&self) -> Value {
        let s = lock(&self.inner.shared);
        let mut out = Vec::new();
        for c in &self.inner.file.components {
            if let Some(hs) = s.views.get(&c.name).and_then(|v| v.stats["histograms"].as_array().cloned()) {
                for mut h in hs {
                    h["component"] = json!(c.name);
                    out.push(h);
                }
            }
        }
        Value::Array(out)
    }

    /// The ET systems' snapshots: `[{"component", "snapshot"}]`.
    pub fn et(&self) -> Value {
        let s = lock(&self.inner.shared);
        Value::Array(
            self.inner
                .file
                .components
                .iter()
                .filter(|c| c.kind == "et")
                .map(|c| json!({ "component": c.name, "snapshot": s.views.get(&c.name).map(|v| v.stats["snapshot"].clone()) }))
                .collect(),
        )
    }

    /// Prometheus text exposition of the system (names prefixed `daqflow_`).
    pub fn metrics(&self) -> String {
        use std::fmt::Write as _;
        let st = self.status();
        let mut m = String::new();
        let mut metric = |name: &str, help: &str, kind: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(m, "{name}{labels} {v}");
            }
        };
        let sys = format!("{{system=\"{}\"}}", esc(&self.inner.file.system.name));
        metric(
            "daqflow_run_number",
            "The run taken or last taken.",
            "gauge",
            vec![(sys.clone(), st["run"].as_f64().unwrap_or(0.0))],
        );
        metric(
            "daqflow_running",
            "1 while a run is on.",
            "gauge",
            vec![(sys.clone(), if st["running"] == true { 1.0 } else { 0.0 })],
        );
        metric(
            "daqflow_events_built_total",
            "Events built in the current run.",
            "counter",
            vec![(sys.clone(), st["events"].as_f64().unwrap_or(0.0))],
        );
        metric(
            "daqflow_bytes_built_total",
            "Bytes built in the current run.",
            "counter",
            vec![(sys.clone(), st["bytes"].as_f64().unwrap_or(0.0))],
        );
        metric(
            "daqflow_events_recorded_total",
            "Events recorded in the current run.",
            "counter",
            vec![(sys.clone(), st["recorded"].as_f64().unwrap_or(0.0))],
        );
        metric(
            "daqflow_events_per_second",
            "Events built per second (last second).",
            "gauge",
            vec![(sys.clone(), st["events_per_s"].as_f64().unwrap_or(0.0))],
        );
        metric(
            "daqflow_megabytes_per_second",
            "MB built per second (last second).",
            "gauge",
            vec![(sys, st["mb_per_s"].as_f64().unwrap_or(0.0))],
        );
        let comps = st["components"].as_array().cloned().unwrap_or_default();
        let label = |c: &Value| {
            format!(
                "component=\"{}\",kind=\"{}\"",
                esc(c["name"].as_str().unwrap_or("")),
                esc(c["kind"].as_str().unwrap_or(""))
            )
        };
        metric(
            "daqflow_component_up",
            "1 while the component's process runs.",
            "gauge",
            comps.iter().map(|c| (format!("{{{}}}", label(c)), if c["alive"] == true { 1.0 } else { 0.0 })).collect(),
        );
        metric(
            "daqflow_component_state",
            "1 for the state each component is in.",
            "gauge",
            comps
                .iter()
                .map(|c| (format!("{{{},state=\"{}\"}}", label(c), esc(c["state"].as_str().unwrap_or(""))), 1.0))
                .collect(),
        );
        metric(
            "daqflow_component_restarts_total",
            "Times the operator restarted the component.",
            "counter",
            comps.iter().map(|c| (format!("{{{}}}", label(c)), c["restarts"].as_f64().unwrap_or(0.0))).collect(),
        );
        let mut stats = Vec::new();
        for c in &comps {
            if let Some(o) = c["stats"].as_object() {
                for (k, v) in o {
                    if let Some(x) = v.as_f64().filter(|_| k != "run") {
                        stats.push((format!("{{{},stat=\"{}\"}}", label(c), esc(k)), x));
                    }
                }
            }
        }
        metric(
            "daqflow_component_stat",
            "Each numeric counter or rate a component publishes in NAME/stats.",
            "gauge",
            stats,
        );
        m
    }

    /// Stops whatever runs (a run in progress is stopped and recorded), ends every
    /// component process (SIGTERM, then SIGKILL after 5 s) and the control server.
    pub fn shutdown(&self) {
        if matches!(self.state().as_str(), "Running" | "Paused")
            && let Err(e) = self.stop()
        {
            tracing::error!("stopping the run at shutdown: {e}");
        }
        self.inner.closing.store(true, Ordering::SeqCst);
        let names: Vec<String> = self.inner.file.components.iter().rev().map(|c| c.name.clone()).collect();
        // Reset first so that components release what they hold (ET systems, files) cleanly.
        let payloads = names.iter().map(|_| json!({})).collect();
        let _ = self.command_all(&names, "reset", payloads, Duration::from_secs(10));
        let mut children = std::mem::take(&mut *lock(&self.inner.children));
        for c in children.values() {
            // SAFETY: kill(2) with a pid of our own child that has not been reaped yet (it is
            // still in `children`), so the pid cannot have been reused.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (name, c) in children.iter_mut() {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        tracing::warn!(component = %name, "{name} did not end on SIGTERM; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        lock(&self.inner.subscriptions).clear();
        self.inner.dialog.shutdown();
        lock(&self.inner.servers).shutdown();
    }

    /// The binary components run as.
    pub fn binary(&self) -> &Path {
        &self.inner.binary
    }
}

/// A timeout of the system file as a duration, held within the range the file is checked
/// against (a file that was not checked cannot make the operator panic).
fn seconds(s: f64) -> Duration {
    use crate::system::{MAX_TIMEOUT_S, MIN_TIMEOUT_S};
    Duration::try_from_secs_f64(if s.is_nan() { MIN_TIMEOUT_S } else { s.clamp(MIN_TIMEOUT_S, MAX_TIMEOUT_S) })
        .unwrap_or(Duration::from_secs(20))
}

/// The run's live totals: events and bytes built (the builder units' counters) and events
/// recorded (the recorders'), each with the counts of the components' earlier lives in the run,
/// so that a restart never makes them go down.
fn live_totals(file: &SystemFile, s: &Shared) -> (u64, u64, u64) {
    let (mut events, mut bytes, mut recorded) = (0u64, 0u64, 0u64);
    for c in &file.components {
        let Some(v) = s.views.get(&c.name) else { continue };
        let count = |key: &str| {
            std::iter::once(&v.stats).chain(&v.earlier).map(|st| st[key].as_u64().unwrap_or(0)).sum::<u64>()
        };
        match c.kind.as_str() {
            "bu" => {
                events += count("events_built");
                bytes += count("bytes");
            }
            "recorder" => recorded += count("events"),
            _ => {}
        }
    }
    (events, bytes, recorded)
}

fn strip_histograms(v: &Value) -> Value {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        m.remove("histograms");
        m.remove("snapshot");
    }
    v
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What every component process is started with.
struct Launch {
    /// The `daqflow` binary.
    binary: PathBuf,
    /// `system.remote_command`.
    remote: String,
    /// Where the components' logs go.
    logs: PathBuf,
    /// The system token's file (`DATA/token`).
    token_file: PathBuf,
}

/// Starts one component's process, its output appended to `logs/NAME.log`. It gets the system
/// token's file in `DAQFLOW_TOKEN_FILE` (a user's own command reads it from there too), and a
/// local `daqflow component` also as `--token-file`.
fn spawn_component(launch: &Launch, spec: &ComponentSpec, control: &str) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let (binary, remote, logs) = (&launch.binary, &launch.remote, &launch.logs);
    let log_path = logs.join(format!("{}.log", spec.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err_log = log.try_clone().map_err(|e| e.to_string())?;
    let mut argv: Vec<String> = match (&spec.command, &spec.host) {
        (Some(cmd), None) => cmd.clone(),
        (Some(cmd), Some(host)) => {
            remote.replace("{host}", host).split_whitespace().map(str::to_owned).chain(cmd.iter().cloned()).collect()
        }
        (None, None) => vec![
            binary.display().to_string(),
            "--token-file".into(),
            launch.token_file.display().to_string(),
            "component".into(),
            spec.kind.clone(),
        ],
        (None, Some(host)) => remote
            .replace("{host}", host)
            .split_whitespace()
            .map(str::to_owned)
            .chain(["component".to_owned(), spec.kind.clone()])
            .collect(),
    };
    argv.extend(["--name".into(), spec.name.clone(), "--control".into(), control.to_owned()]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .env("DAQFLOW_COMPONENT", &spec.name)
        .env("DAQFLOW_TOKEN_FILE", &launch.token_file);
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe; it asks the kernel to send SIGTERM to the child when the
    // operator's launcher thread (which lives as long as the operator) ends, so that no
    // component outlives a crashed operator.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("starting {} ({}): {e}", spec.name, argv.join(" ")))?;
    tracing::info!(component = %spec.name, pid = child.id(), "started {}", argv.join(" "));
    Ok(child)
}
