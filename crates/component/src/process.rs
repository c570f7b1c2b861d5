//! The run loop of a component process (`daqflow component KIND`): a [`Driver`] fed with
//! commands from standard input and, with a control address, from the control plane.
//!
//! **Standard input**, one command per line: `configure`, `start RUN`, `pause`, `resume`,
//! `stop [ARG]`, `set KEY=VALUE`, `stats`, `state`, `schema` (the kind's typed schema), `reset`, `quit`. Each gets exactly one JSON line on
//! standard output: `{"ok":true,"state":"Running","result":…}` or
//! `{"ok":false,"state":…,"error":"…"}`. A failure during the run prints
//! `{"event":"error","error":"…"}` by itself. End of input (without a control address, or with
//! [`Options::end_with_stdin`]), `quit`, SIGTERM or SIGINT end a running component with its
//! summary and exit.
//!
//! **Control plane** (`docs/operator-guide.md`, "Component protocol"): the process joins
//! dialog under its name and registers the commands `NAME/VERB` and `all/VERB` for every
//! [`Verb`]. A command's payload is a [`Request`]: empty or a bare number (from a person), or
//! JSON with an `id`, a `reply_to` and the command's arguments (`run`, `last_event`, `config`).
//! Each request that names `reply_to` is answered with the command `REPLY_TO/reply`, whose
//! payload is the [`CommandReply`] (the id, the component, the command, its state after, the
//! outcome). It provides
//! - `NAME/state`: its [`ComponentStatus`] on every change and once a second;
//! - `NAME/stats`: its [`Stats`](crate::Stats) once a second;
//! - `NAME/log`: a JSON array of the process's recent log records (`crate::log`);
//! - `NAME/schema`: its kind's typed [`Schema`] as JSON (`null` for a kind without one), once.
//!
//! **Lease.** A process on the control plane that has not been connected to a control server
//! for longer than its lease ([`Options::lease`]) ends by itself: the control server and its
//! spares are gone (the operator died, or its host, or the network between), and nobody could
//! stop it any more. It stops a run in progress (so its counters and files are closed), logs
//! why and exits as failed.
//!
//! With an `operator`, the component takes commands only from the process of that name: the
//! operator that started it, whose control lock then covers every way to drive the run. A
//! command from anyone else (even with the system token, e.g. `daqflow dialog send all/stop`)
//! is refused with a reply saying so.
//!
//! **A slow component** ([`Options::transition_delay`], for trying run control against
//! transitions that take time): the process waits that long before it joins the control plane
//! and before each transition it is asked for (`configure`, `start`, `pause`, `resume`, `stop`,
//! `reset`), as a detector that ramps its high voltage would.
//!
//! ```no_run
//! // The kinds the binary knows (`daqflow::registry::standard()` in the `daqflow` command).
//! let registry = daqflow_component::Registry::new();
//! let options = daqflow_component::process::Options {
//!     kind: "sink".into(),
//!     name: "sink-1".into(),
//!     config: toml::Table::new(),
//!     start: None,
//!     control: Some("127.0.0.1:7000".into()),
//!     lease: Some(std::time::Duration::from_secs(15)),
//!     end_with_stdin: false,
//!     operator: Some("operator".into()), // commands from the operator only
//!     incarnation: Some(1),               // the launch its operator gave it
//!     transition_delay: std::time::Duration::ZERO,
//! };
//! let failed = daqflow_component::process::run(registry, options)?;
//! # let _ = failed;
//! # Ok::<(), daqflow_component::process::ProcessError>(())
//! ```

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::log::now_ms;
use crate::schema::Schema;
use crate::stdin::{Line, LineAnswer, LineEvent, LineFailure, answer_json};
use crate::{Command, CommandReply, ComponentError, ComponentStatus, Driver, Registry, Request, State, Verb};

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
    /// With a control address: end when no control server has been reachable for this long
    /// (`None`: never).
    pub lease: Option<Duration>,
    /// End when standard input ends, also with a control address: the launcher (the operator,
    /// over ssh) holds it open for as long as it wants the process, so its end means the
    /// launcher or the connection to it is gone.
    pub end_with_stdin: bool,
    /// With a control address: the only process whose commands are taken (the operator that
    /// started this one). Commands from any other process are refused, with a reply that says
    /// so; `None`: anyone's (with the system token).
    pub operator: Option<String>,
    /// The incarnation its operator launched it as (`--incarnation`, `DAQFLOW_INCARNATION`),
    /// put in every `NAME/state` it publishes: the operator takes statuses only from the
    /// incarnation it launched. `None`: started by hand.
    pub incarnation: Option<u64>,
    /// How long to wait before joining the control plane and before each transition (zero:
    /// not at all): a slow component, for trying run control against transitions that take
    /// time (`DAQFLOW_TRANSITION_DELAY` of `daqflow component`).
    pub transition_delay: Duration,
}

/// A component's configuration as `daqflow component` takes it: the TOML file `config`, if
/// any, then each `KEY=VALUE` of `sets` over it (dotted keys for nested tables:
/// `size.kind=lognormal`; the value as TOML, else as a bare string). Used by the `daqflow`
/// binary and by components written in other languages (the Python package).
///
/// ```
/// let t = daqflow_component::process::config_table(None, &["rate_hz=2000".into(), "size.kind=fixed".into()]).unwrap();
/// assert_eq!(t["rate_hz"].as_integer(), Some(2000));
/// assert_eq!(t["size"]["kind"].as_str(), Some("fixed"));
/// ```
pub fn config_table(config: Option<&std::path::Path>, sets: &[String]) -> Result<toml::Table, ProcessError> {
    let bad = |text: String| ProcessError::Config(text);
    let mut table = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| bad(format!("reading {}: {e}", path.display())))?;
            text.parse::<toml::Table>().map_err(|e| bad(format!("{}: {e}", path.display())))?
        }
        None => toml::Table::new(),
    };
    for s in sets {
        let Some((key, value)) = s.split_once('=') else { return Err(bad(format!("--set {s}: expected KEY=VALUE"))) };
        let value = parse_value(value.trim());
        let mut path: Vec<&str> = key.trim().split('.').collect();
        let last = path.pop().filter(|k| !k.is_empty()).ok_or_else(|| bad(format!("--set {s}: empty key")))?;
        let mut t = &mut table;
        for p in path {
            let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = entry.as_table_mut().ok_or_else(|| bad(format!("--set {s}: `{p}` is not a table")))?;
        }
        t.insert(last.to_owned(), value);
    }
    Ok(table)
}

impl Options {
    /// The options of a component program of your own, from its command line and environment
    /// as the operator starts it: the operator appends `--name NAME --control ADDR` to the
    /// system file's `command` and sets `DAQFLOW_LEASE_S`, `DAQFLOW_OPERATOR` and
    /// `DAQFLOW_INCARNATION` (and `DAQFLOW_TOKEN_FILE`, which the control plane reads). Also
    /// taken, for running it by hand: `--set KEY=VALUE` (repeated), `--config FILE`, `--start
    /// RUN`, `--lease SECONDS`, `--operator NAME` and `--incarnation N`. Without `--control` the process takes commands on its standard
    /// input only.
    ///
    /// ```
    /// let args = ["--set", "volts=1500", "--name", "hv-1", "--control", "127.0.0.1:7000"];
    /// let o = daqflow_component::process::Options::from_args("hv", args.iter().map(|s| s.to_string())).unwrap();
    /// assert_eq!((o.name.as_str(), o.control.as_deref()), ("hv-1", Some("127.0.0.1:7000")));
    /// assert_eq!(o.config["volts"].as_integer(), Some(1500));
    /// ```
    pub fn from_args(kind: &str, args: impl IntoIterator<Item = String>) -> Result<Options, ProcessError> {
        let bad = |text: String| ProcessError::Config(text);
        let env_lease = std::env::var("DAQFLOW_LEASE_S").ok();
        let mut options = Options {
            kind: kind.to_owned(),
            name: kind.to_owned(),
            config: toml::Table::new(),
            start: None,
            control: None,
            lease: None,
            end_with_stdin: false,
            operator: std::env::var("DAQFLOW_OPERATOR").ok().filter(|o| !o.is_empty()),
            incarnation: None,
            transition_delay: Duration::ZERO,
        };
        let (mut sets, mut config, mut lease) = (Vec::new(), None, env_lease);
        let mut incarnation = std::env::var(INCARNATION_ENV).ok().filter(|i| !i.is_empty());
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") && f != "--set" => (f.to_owned(), Some(v.to_owned())),
                _ => (arg.clone(), None),
            };
            let known =
                ["--name", "--control", "--set", "--config", "--start", "--lease", "--operator", "--incarnation"];
            if !known.contains(&flag.as_str()) {
                return Err(bad(format!("unknown argument `{arg}` (known: {})", known.join(", "))));
            }
            let value = match inline.or_else(|| args.next()) {
                Some(v) => v,
                None => return Err(bad(format!("`{flag}` needs a value"))),
            };
            match flag.as_str() {
                "--name" => options.name = value,
                "--control" => options.control = Some(value),
                "--set" => sets.push(value),
                "--config" => config = Some(std::path::PathBuf::from(value)),
                "--start" => {
                    options.start =
                        Some(value.parse().map_err(|_| bad(format!("--start {value}: a run number, 1 or more")))?)
                }
                "--lease" => lease = Some(value),
                "--incarnation" => incarnation = Some(value),
                _ => options.operator = Some(value),
            }
        }
        options.incarnation = incarnation.map(|i| parse_incarnation(&i)).transpose()?;
        options.config = config_table(config.as_deref(), &sets)?;
        if options.control.is_some() {
            let seconds = match lease {
                Some(s) => s
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && (0.0..=86_400.0).contains(s))
                    .ok_or_else(|| bad(format!("lease `{s}`: seconds from 0 (never) to 86400")))?,
                None => 15.0,
            };
            options.lease = (seconds > 0.0).then(|| Duration::from_secs_f64(seconds));
        }
        Ok(options)
    }
}

/// The environment variable in which the operator gives a process it starts its incarnation
/// (also given as `--incarnation` to `daqflow component`).
pub const INCARNATION_ENV: &str = "DAQFLOW_INCARNATION";

/// Reads an incarnation (`--incarnation`, [`INCARNATION_ENV`]): a whole number.
///
/// ```
/// assert_eq!(daqflow_component::process::parse_incarnation(" 17 ").unwrap(), 17);
/// assert!(daqflow_component::process::parse_incarnation("x").is_err());
/// ```
pub fn parse_incarnation(text: &str) -> Result<u64, ProcessError> {
    text.trim()
        .parse()
        .map_err(|_| ProcessError::Config(format!("incarnation `{text}`: a whole number (the operator gives it)")))
}

/// A TOML value (number, boolean, array, inline table, quoted string) or else a bare string.
pub fn parse_value(v: &str) -> toml::Value {
    format!("v = {v}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_owned()))
}

/// The lease of a process on the control plane: how long it has been without a control
/// server, and whether that is longer than it may be. Pure: fed with the connection state and
/// the time.
#[derive(Debug, Clone)]
struct Lease {
    length: Duration,
    /// Since when no control server has been reachable (`None`: connected now).
    unreachable_since: Option<Instant>,
}

impl Lease {
    /// A lease of `length`, for a process that starts unconnected at `now` (a control server
    /// that never answers ends it too).
    fn new(length: Duration, now: Instant) -> Lease {
        Lease { length, unreachable_since: Some(now) }
    }

    /// Takes whether a control server is reachable at `now`; once the process has been
    /// without one for longer than the lease, for how long.
    fn expired(&mut self, connected: bool, now: Instant) -> Option<Duration> {
        if connected {
            self.unreachable_since = None;
            return None;
        }
        let since = *self.unreachable_since.get_or_insert(now);
        let unreachable = now.saturating_duration_since(since);
        (unreachable > self.length).then_some(unreachable)
    }
}

/// Seconds as people write them: `12 s`, `2.5 s`.
fn seconds_text(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 10.0 || d.subsec_millis() == 0 { format!("{s:.0} s") } else { format!("{s:.1} s") }
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
    /// The configuration could not be read (`--config`, `--set`).
    #[error("the configuration: {0}")]
    Config(String),
    /// A thread or signal handler could not be set up.
    #[error("setting up the process: {0}")]
    Setup(String),
    /// The system token in the environment (`DAQFLOW_TOKEN_FILE`, `DAQFLOW_TOKEN`) is unusable.
    #[error("the system token: {0}")]
    Token(String),
}

/// The system token a component program finds in its environment, as the operator gives it
/// (`DAQFLOW_TOKEN_FILE`, else `DAQFLOW_TOKEN`), unless the process already has one (`daqflow
/// --token-file`): [`run`] takes it, so that a program of your own joins a system with a token
/// without code of its own for it.
fn take_token_from_environment() -> Result<(), ProcessError> {
    if daqflow_transport::auth::process_token().is_some() {
        return Ok(());
    }
    let token = match (std::env::var_os("DAQFLOW_TOKEN_FILE"), std::env::var("DAQFLOW_TOKEN")) {
        (Some(file), _) => daqflow_transport::auth::Token::from_file(std::path::Path::new(&file))
            .map_err(|e| ProcessError::Token(format!("DAQFLOW_TOKEN_FILE: {e}")))?,
        (None, Ok(text)) => daqflow_transport::auth::Token::new(&text)
            .map_err(|e| ProcessError::Token(format!("DAQFLOW_TOKEN: {e}")))?,
        (None, Err(_)) => return Ok(()),
    };
    daqflow_transport::auth::set_process_token(Some(token));
    Ok(())
}

/// One command for the driver.
#[derive(Debug)]
enum Input {
    /// A line from standard input.
    Line(String),
    /// A control-plane command: the verb and its payload.
    Control(Verb, String, bytes::Bytes),
    /// Standard input ended.
    End,
}

/// Runs a line from standard input (a transition after `delay`); the answer and whether to
/// quit (an empty line has no answer).
fn line_command(driver: &mut Driver, line: &str, delay: Duration) -> (Option<LineAnswer>, bool) {
    if line.trim().is_empty() {
        return (None, false);
    }
    let result = match line.parse::<Line>() {
        Ok(Line::Command(command)) => {
            slow_down(command.verb(), delay);
            driver.execute(command).map(|a| Some(answer_json(&a))).map_err(LineFailure::Component)
        }
        Ok(Line::Stats) => Ok(serde_json::to_value(driver.stats()).ok()),
        Ok(Line::State) => Ok(Some(json!({ "failure": driver.failure() }))),
        Ok(Line::Schema) => Ok(serde_json::to_value(driver.schema()).ok()),
        Ok(Line::Quit) => return (Some(LineAnswer::of(driver.state(), Ok(None))), true),
        Err(e) => Err(LineFailure::Line(e)),
    };
    (Some(LineAnswer::of(driver.state(), result)), false)
}

/// Waits `delay` before transition `verb` (a slow component: [`Options::transition_delay`]).
fn slow_down(verb: Verb, delay: Duration) {
    if !delay.is_zero() && Verb::TRANSITIONS.contains(&verb) {
        tracing::info!(command = %verb, "waiting {} before {verb} (a slow component)", seconds_text(delay));
        std::thread::sleep(delay);
    }
}

/// A component's presence on the control plane.
struct ControlLink {
    dialog: daqflow_dialog::Dialog,
    state: daqflow_dialog::Service,
    stats: daqflow_dialog::Service,
    log: daqflow_dialog::Service,
    /// `NAME/schema`: the kind's typed schema, published once.
    _schema: daqflow_dialog::Service,
    _commands: Vec<daqflow_dialog::CommandRegistration>,
    since_ms: u64,
    last_state: Option<State>,
    /// Statuses published so far.
    seq: u64,
    /// The incarnation its operator launched it as, in every status.
    incarnation: Option<u64>,
    log_published: u64,
    /// The only process whose commands are taken, if set.
    operator: Option<String>,
    /// Waited before each transition ([`Options::transition_delay`]).
    delay: Duration,
}

impl ControlLink {
    fn join(
        control: &str,
        name: &str,
        schema: Option<&Schema>,
        tx: Sender<Input>,
    ) -> Result<ControlLink, ProcessError> {
        let err =
            |e: daqflow_dialog::DialogError| ProcessError::Control { addr: control.to_owned(), reason: e.to_string() };
        let dialog = daqflow_dialog::Dialog::connect(control, name).map_err(err)?;
        let state = dialog.provide(&format!("{name}/state")).map_err(err)?;
        let stats = dialog.provide(&format!("{name}/stats")).map_err(err)?;
        let log = dialog.provide(&format!("{name}/log")).map_err(err)?;
        let schema_service = dialog.provide(&format!("{name}/schema")).map_err(err)?;
        let _ = schema_service.update(&serde_json::to_vec(&schema).unwrap_or_default());
        let mut commands = Vec::new();
        for verb in Verb::ALL {
            // A live parameter is one component's: there is no `all/set`.
            let targets: &[&str] = if verb == Verb::Set { &[name] } else { &[name, "all"] };
            for &target in targets {
                let tx = tx.clone();
                let reg = dialog
                    .register_command(&format!("{target}/{verb}"), move |m| {
                        let _ = tx.send(Input::Control(verb, m.from, m.data));
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
            _schema: schema_service,
            _commands: commands,
            since_ms: now_ms(),
            last_state: None,
            seq: 0,
            incarnation: None,
            log_published: 0,
            operator: None,
            delay: Duration::ZERO,
        })
    }

    /// Publishes the state (when it changed, or `force`), the statistics (with `force`) and
    /// new log records.
    fn publish(&mut self, driver: &Driver, force: bool) {
        let state = driver.state();
        let changed = Some(state) != self.last_state;
        if changed {
            self.since_ms = now_ms();
        }
        crate::log::muted(|| {
            if changed || force {
                self.last_state = Some(state);
                // The counters first: an operator that acts on a new state (Error: the run's
                // record is closed) then has the counters of that moment, not a second older.
                let _ = self.stats.update(&serde_json::to_vec(&driver.stats()).unwrap_or_default());
                let status = self.status(driver);
                let _ = self.state.update(&serde_json::to_vec(&status).unwrap_or_default());
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

    /// The status to publish next (numbered).
    fn status(&mut self, driver: &Driver) -> ComponentStatus {
        self.seq += 1;
        ComponentStatus {
            name: driver.name().to_owned(),
            kind: driver.kind().to_owned(),
            pid: std::process::id(),
            incarnation: self.incarnation,
            seq: self.seq,
            state: driver.state(),
            run: driver.run(),
            since_ms: self.since_ms,
            error: driver.failure(),
            cpus: daqflow_wire::affinity::allowed().ok().map(|c| c.to_string()),
        }
    }

    /// Runs a control-plane command and sends the reply to whoever asked for one.
    fn command(&mut self, driver: &mut Driver, verb: Verb, from: &str, payload: &[u8]) {
        let (request, result) = match Request::decode(verb, payload) {
            Ok(request) => match self.operator.as_deref() {
                Some(op) if op != from => {
                    let why = format!(
                        "{} takes commands from its operator `{op}` only (its web UI, under the control lock, or \
                         its console); `{from}` sent `{verb}`",
                        driver.name()
                    );
                    (request, Err(ComponentError::Refused(why)))
                }
                _ => {
                    slow_down(verb, self.delay);
                    let r = driver.execute(request.command.clone());
                    (request, r)
                }
            },
            Err(e) => {
                // Unreadable: still answer, if the payload says where to.
                #[derive(serde::Deserialize)]
                struct Ids {
                    #[serde(default)]
                    id: u64,
                    #[serde(default)]
                    reply_to: Option<String>,
                }
                let ids = serde_json::from_slice::<Ids>(payload).unwrap_or(Ids { id: 0, reply_to: None });
                let request = Request { id: ids.id, reply_to: ids.reply_to, command: Command::Reset };
                (request, Err(e))
            }
        };
        match &result {
            Ok(_) => tracing::info!(command = %verb, state = driver.state().name(), "command done"),
            Err(e) => tracing::warn!(command = %verb, error = %e, "command refused or failed"),
        }
        self.publish(driver, true);
        let mut reply = CommandReply::new(&request, self.status(driver), result);
        reply.command = verb;
        if let Some(to) = &request.reply_to {
            let name = format!("{to}/reply");
            match crate::log::muted(|| self.dialog.send_command(&name, &reply.to_json())) {
                Ok(0) => tracing::warn!("nobody took the reply `{name}`"),
                Ok(_) => {}
                Err(e) => tracing::warn!("sending the reply `{name}`: {e}"),
            }
        }
    }
}

/// Writes one line of the standard-input protocol's output (an answer or an event).
fn reply(out: &Mutex<std::io::Stdout>, line: &impl serde::Serialize) {
    let text = serde_json::to_string(line).unwrap_or_default();
    let mut o = crate::sync::lock(out);
    let _ = writeln!(o, "{text}");
    let _ = o.flush();
}

/// Runs a component process until `quit`, the end of input (without a control address, or with
/// [`Options::end_with_stdin`]), a signal or the end of its lease. Returns whether the component
/// failed during its life (an expired lease counts as a failure).
pub fn run(registry: Registry, options: Options) -> Result<bool, ProcessError> {
    run_observed(registry, options, &mut |_| {})
}

/// [`run`], showing the component to `observe` once it exists, after every command, at least
/// once a second while it runs, and once more at its end: how a binary exports what the
/// component counts (`daqflow component --metrics`, a Prometheus listener the binary links)
/// without the runtime knowing how. `observe` runs on the run loop's thread: it should only copy
/// what it needs (`Driver::state`, `Driver::run`, `Driver::stats`).
pub fn run_observed(
    registry: Registry,
    options: Options,
    observe: &mut dyn FnMut(&Driver),
) -> Result<bool, ProcessError> {
    set_process_name(&options.name);
    take_token_from_environment()?;
    if let Some(control) = &options.control {
        // A wildcard listener advertises this host's address towards the control server.
        daqflow_transport::advertise::set_route_target_from(control);
    }
    let stop_signal = signal_flag()?;
    let mut driver = Driver::new(registry, &options.kind, &options.name, options.config.clone());
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut failed = false;
    if let Some(run) = options.start {
        let start =
            |e: crate::ComponentError| ProcessError::Start { name: options.name.clone(), reason: e.to_string() };
        let info = driver.configure(None).map_err(start)?;
        driver.start(run).map_err(start)?;
        reply(&out, &LineAnswer::of(driver.state(), Ok(Some(Value::Object(info)))));
    }
    let (tx, rx) = std::sync::mpsc::channel::<Input>();
    let mut link = match &options.control {
        Some(addr) => {
            if !options.transition_delay.is_zero() {
                tracing::info!("waiting {} before joining (a slow component)", seconds_text(options.transition_delay));
                std::thread::sleep(options.transition_delay);
            }
            let mut link = ControlLink::join(addr, &options.name, driver.schema(), tx.clone())?;
            link.operator = options.operator.clone();
            link.incarnation = options.incarnation;
            link.delay = options.transition_delay;
            Some(link)
        }
        None => None,
    };
    tracing::info!(kind = %options.kind, pid = std::process::id(), "component started");
    let stdin_ends = link.is_none() || options.end_with_stdin;
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
    observe(&driver);
    let mut lease = match (&link, options.lease) {
        (Some(_), Some(length)) => Some(Lease::new(length, Instant::now())),
        _ => None,
    };
    let ended =
        event_loop(&mut driver, &rx, &mut link, &out, stop_signal, &mut lease, options.transition_delay, observe);
    failed |= ended.failed;
    match ended.why {
        Why::LeaseExpired => failed = true,
        Why::InputEnded if options.end_with_stdin && options.control.is_some() => {
            tracing::warn!("standard input ended (the launcher or the connection to it is gone): ending")
        }
        _ => {}
    }
    // End of input, quit or a signal: end a run in progress with its summary.
    failed |= driver.failure().is_some();
    if matches!(driver.state(), State::Running | State::Paused)
        || driver.run().is_some() && driver.state() == State::Error
    {
        let r = driver.stop(None).map(|s| serde_json::to_value(s).ok()).map_err(LineFailure::Component);
        reply(&out, &LineAnswer::of(driver.state(), r));
    }
    let _ = driver.reset();
    observe(&driver);
    tracing::info!("component ends");
    if let Some(l) = link.as_mut() {
        l.publish(&driver, true);
        l.dialog.shutdown();
    }
    Ok(failed)
}

/// Why the event loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Standard input ended (or its thread).
    InputEnded,
    /// `quit`.
    Quit,
    /// SIGTERM or SIGINT.
    Signal,
    /// No control server for longer than the lease.
    LeaseExpired,
}

/// How the event loop ended: why, and whether the component failed meanwhile.
struct Ended {
    why: Why,
    failed: bool,
}

#[allow(clippy::too_many_arguments)]
fn event_loop(
    driver: &mut Driver,
    rx: &Receiver<Input>,
    link: &mut Option<ControlLink>,
    out: &Mutex<std::io::Stdout>,
    stop_signal: &AtomicBool,
    lease: &mut Option<Lease>,
    delay: Duration,
    observe: &mut dyn FnMut(&Driver),
) -> Ended {
    let mut next_publish = Instant::now();
    let mut reported: Option<String> = None;
    let mut failed = false;
    loop {
        let input = rx.recv_timeout(Duration::from_millis(100));
        // A failure during the run is reported as soon as it is seen.
        let f = driver.failure();
        if f.is_some() && f != reported {
            tracing::error!(error = f.as_deref().unwrap_or(""), "component failed");
            reply(out, &LineEvent { event: "error".into(), error: f.clone().unwrap_or_default() });
            reported = f;
            failed = true;
        }
        if let (Some(lease), Some(l)) = (lease.as_mut(), link.as_ref())
            && let Some(unreachable) = lease.expired(l.dialog.is_connected(), Instant::now())
        {
            tracing::error!(
                "control server unreachable for {}, longer than the lease of {}: ending",
                seconds_text(unreachable),
                seconds_text(lease.length)
            );
            return Ended { why: Why::LeaseExpired, failed };
        }
        match input {
            Ok(Input::End) | Err(RecvTimeoutError::Disconnected) => return Ended { why: Why::InputEnded, failed },
            Err(RecvTimeoutError::Timeout) => {
                if stop_signal.load(Ordering::Relaxed) {
                    return Ended { why: Why::Signal, failed };
                }
                let force = Instant::now() >= next_publish;
                if let Some(l) = link.as_mut() {
                    l.publish(driver, force);
                }
                if force {
                    observe(driver);
                    next_publish = Instant::now() + Duration::from_secs(1);
                }
            }
            Ok(Input::Line(line)) => {
                let (answer, quit) = line_command(driver, &line, delay);
                if let Some(l) = link.as_mut() {
                    l.publish(driver, true);
                }
                observe(driver);
                if let Some(answer) = answer {
                    reply(out, &answer);
                }
                if quit {
                    return Ended { why: Why::Quit, failed };
                }
            }
            Ok(Input::Control(verb, from, payload)) => {
                if let Some(l) = link.as_mut() {
                    l.command(driver, verb, &from, &payload);
                }
                observe(driver);
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
    fn a_lease_expires_only_after_being_unreachable_for_longer_than_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut lease = Lease::new(Duration::from_secs(10), t0);
        // Never connected: counted from the start.
        assert_eq!(lease.expired(false, at(10_000)), None);
        assert_eq!(lease.expired(false, at(10_001)), Some(Duration::from_millis(10_001)));
        // Connected at 10.5 s: the count starts again at the next loss.
        assert_eq!(lease.expired(true, at(10_500)), None);
        assert_eq!(lease.expired(false, at(20_000)), None);
        assert_eq!(lease.expired(true, at(29_000)), None, "reconnected within the lease");
        assert_eq!(lease.expired(false, at(40_000)), None);
        assert_eq!(lease.expired(false, at(50_000)), None, "exactly the lease is still within it");
        assert_eq!(lease.expired(false, at(52_000)), Some(Duration::from_secs(12)));
    }

    #[test]
    fn a_lease_holds_while_connected_whatever_the_time() {
        let t0 = Instant::now();
        let mut lease = Lease::new(Duration::from_secs(1), t0);
        assert_eq!(lease.expired(true, t0), None);
        assert_eq!(lease.expired(true, t0 + Duration::from_secs(3600)), None);
        // A clock that seems to go back does not expire it either.
        assert_eq!(lease.expired(false, t0 + Duration::from_secs(3600)), None);
        assert_eq!(lease.expired(false, t0), None);
    }

    #[test]
    fn seconds_are_written_as_people_write_them() {
        assert_eq!(seconds_text(Duration::from_secs(15)), "15 s");
        assert_eq!(seconds_text(Duration::from_millis(12_400)), "12 s");
        assert_eq!(seconds_text(Duration::from_millis(2_140)), "2.1 s");
        assert_eq!(seconds_text(Duration::from_secs(2)), "2 s");
    }
}
