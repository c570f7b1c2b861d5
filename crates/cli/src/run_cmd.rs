//! `daqflow run SYSTEM.toml` (the operator) and `daqflow demo` (the operator on the built-in
//! system file): start a described system, serve the web UI, take runs, summarise.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use daqflow_api::{
    LogQuery, LogRecord, ProcessEntry, RunDetail, RunRecord, RunState, RunSummary, SystemStatus, Transition,
    TransitionResult,
};
use daqflow_runcontrol::operator::lock::OperatorLock;
use daqflow_runcontrol::operator::{Operator, OperatorError, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use daqflow_web::{Backend, BackendError};
use serde_json::{Value, json};

mod console;

use crate::terminal::{Hangup, Interrupts, say, say_err, say_inline};

/// The demo's system file.
pub const DEMO_SYSTEM: &str = include_str!("demo.toml");

/// The demo's data directory unless `--data` gives one.
const DEMO_DATA: &str = "daqflow-demo";

pub const RUN_AFTER_HELP: &str = "Examples:\n  \
    daqflow demo --print-config > teststand.toml     a system file to start from\n  \
    daqflow run teststand.toml                       start it; it prints the web UI's URL (with its token)\n  \
    daqflow run teststand.toml --start --seconds 60  configure, take a 60 s run, stop, exit\n  \
    daqflow run teststand.toml --repeat 12 --start   run 12's configuration again, as stored\n\n\
    Then type transitions (one per line): configure, start [RUN], pause, resume, stop, reset,\n\
    status, quit; `set NAME.KEY=VALUE` changes a component's parameter: while Initial for the\n\
    next configure (`unset NAME.KEY` takes it back), while Configured, Running or Paused a live\n\
    parameter at once (docs/operator-guide.md, \"Live parameters\"); `repeat RUN` (while\n\
    Initial) takes the parameters run RUN was configured with. Every run that ends prints its\n\
    summary. End of input (nohup, cron, < /dev/null): with --start or a web UI, no console: the\n\
    operator goes on until Ctrl-C or SIGTERM (with --web none, until the run ends); otherwise it\n\
    is quit. The exit status is 0 when every run summarised lost nothing, else 1.\n\n\
    Ctrl-C (or SIGTERM) ends the system in order: a transition under way finishes, a run in\n\
    progress is stopped and recorded, every component resets and ends. A second Ctrl-C says\n\
    what that waits for; a third ends at once (exit status 130). A closed terminal (SIGHUP)\n\
    does what --on-hangup says (default: keep going).\n\
    The system file is described in docs/operator-guide.md.";

pub const DEMO_AFTER_HELP: &str = "Examples:\n  \
    daqflow demo                        runs until Ctrl-C; open the web UI URL it prints\n  \
    daqflow demo --seconds 10           10 seconds, then the summary\n  \
    daqflow demo --data /dev/shm/demo   keep the data on a RAM disk\n  \
    daqflow demo --print-config         the system file the demo runs\n  \
    daqflow demo --keep 10GiB           keep up to 10 GiB of earlier runs' files (default 2 GiB)\n\n\
    The demo runs, on this machine: the control server, an emulated trigger (EVM), 4 sources,\n\
    2 readout units, 2 builder units, an ET system, a recorder and a monitor, the message logger\n\
    and the run database (SQLite), and serves the web UI. It starts a run at once; a run stopped\n\
    from the web UI (or by a policy) prints its summary and the demo goes on: runs started from\n\
    the web UI are followed the same way, until Ctrl-C or --seconds, which stop the run that is\n\
    open. Each summary's `lost:` line must read 0; the exit status is 0 only when every run's did.\n\
    A run records about 8 MB/s (30 GB an hour) into DATA/files; when a run starts, the files of\n\
    the oldest earlier runs beyond --keep are deleted (the demo says which).\n\n\
    Ctrl-C (or SIGTERM, or closing the terminal) ends the demo in order, whatever it is doing: a\n\
    transition under way finishes, the open run is stopped and summarised, every component\n\
    resets and ends. A second Ctrl-C says what that waits for; a third ends at once (exit 130).\n\n\
    One operator per data directory: a demo or `daqflow run` using the directory already makes\n\
    this one refuse, naming it (DATA/operator.lock; docs/operator-guide.md). While it runs,\n\
    `daqflow --data DATA dialog ls` lists its processes (it prints that line).";

/// Arguments of `daqflow run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The system file.
    pub system: PathBuf,
    /// Web UI address (overrides the file's `web`); `none` for no web UI.
    #[arg(long, value_name = "ADDR")]
    pub web: Option<String>,
    /// Data directory (overrides the file's `data`). One operator at a time: a directory
    /// another operator is using is refused.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Control server address (overrides the file's `control`).
    #[arg(long, value_name = "HOST:PORT")]
    pub control: Option<String>,
    /// Configure and start a run at once.
    #[arg(long)]
    pub start: bool,
    /// With --start: stop the run after this many seconds and exit.
    #[arg(long, value_name = "N")]
    pub seconds: Option<f64>,
    /// Only check the system file and exit.
    #[arg(long)]
    pub check: bool,
    /// Run with run N's configuration: the system file it stored in the run database of
    /// SYSTEM.toml (which must be of the same system) and the parameters set over it; the
    /// place (data directory, database) stays SYSTEM.toml's. The new runs record that they
    /// repeat run N.
    #[arg(long, value_name = "N")]
    pub repeat: Option<u32>,
    /// What a closed terminal (SIGHUP: a window closed, an ssh session dropped) does: `keep`
    /// goes on without it (the web UI, SIGINT or SIGTERM end the system), `stop` ends the
    /// system in order, as Ctrl-C does.
    #[arg(long, value_enum, value_name = "WHAT", default_value = "keep")]
    pub on_hangup: Hangup,
}

/// Arguments of `daqflow demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// End the demo after this many seconds, stopping the run that is open (default: at Ctrl-C).
    #[arg(long, value_name = "N")]
    pub seconds: Option<f64>,
    /// Where files, logs and the run database go [default: daqflow-demo]. One operator at a
    /// time: a directory another demo or `daqflow run` is using is refused.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Web UI address (a free port is taken if this one is busy); `none` for no web UI.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub web: String,
    /// Print the demo's system file and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print each run's summary as JSON too (after the human-readable one).
    #[arg(long)]
    pub json: bool,
    /// How much of earlier runs' data files to keep (the demo records about 8 MB/s): when a
    /// run starts, the files of the oldest earlier runs are deleted, a run at a time, until
    /// the rest take at most this much (`500MiB`, `10GiB`); `all` keeps every file. The run in
    /// progress never loses a file.
    #[arg(long, value_name = "SIZE", default_value = crate::retention::DEFAULT_KEEP, value_parser = crate::retention::parse_keep)]
    pub keep: crate::retention::Keep,
    /// What a closed terminal (SIGHUP) does: `stop` ends the demo in order, as Ctrl-C does;
    /// `keep` goes on without it (the web UI, SIGINT or SIGTERM end it).
    #[arg(long, value_enum, value_name = "WHAT", default_value = "stop")]
    pub on_hangup: Hangup,
}

/// The operator as the web UI's backend.
pub struct OperatorBackend(pub Operator);

/// An operator error as the web's: a transition the state does not allow, or one under way, is
/// a conflict (409); anything else a failure (500).
fn backend_error(e: OperatorError) -> BackendError {
    match e {
        OperatorError::IllegalTransition { .. } | OperatorError::Busy(_) => BackendError::Conflict(e.to_string()),
        OperatorError::Invalid(_) => BackendError::Invalid(e.to_string()),
        other => BackendError::Failed(other.to_string()),
    }
}

impl Backend for OperatorBackend {
    fn status(&self) -> SystemStatus {
        self.0.status()
    }

    fn transition(&self, t: Transition) -> Result<TransitionResult, BackendError> {
        self.0.transition(t).map_err(backend_error)
    }

    fn processes(&self) -> Result<Vec<ProcessEntry>, BackendError> {
        let ps = self.0.dialog().processes(Duration::from_secs(3)).map_err(|e| BackendError::Failed(e.to_string()))?;
        Ok(ps
            .into_iter()
            .map(|p| ProcessEntry {
                name: p.name,
                host: p.host,
                port: p.port,
                pid: p.pid,
                start_time_ns: p.start_time_ns,
                last_heartbeat_ns: p.last_heartbeat_ns,
                provides: p.provides,
                subscribes: p.subscribes,
                commands: p.commands,
            })
            .collect())
    }

    fn send_command(&self, name: &str, data: &str) -> Result<u32, BackendError> {
        match self.0.dialog().send_command(name, data.as_bytes()) {
            Ok(0) => Err(BackendError::NotFound(format!(
                "no process registered the command `{name}` (GET /api/processes lists the commands)"
            ))),
            Ok(n) => Ok(n),
            Err(e @ daqflow_dialog::DialogError::InvalidName(_)) => Err(BackendError::Invalid(e.to_string())),
            Err(e) => Err(BackendError::Failed(e.to_string())),
        }
    }

    fn set(
        &self,
        component: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        let value = match value.map(json_to_toml).transpose() {
            Ok(v) => v,
            Err(e) => return Err(BackendError::Invalid(format!("{component}.{key}: {e}"))),
        };
        self.0.set(component, key, value).map_err(backend_error)
    }

    fn repeat(&self, run: u32) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        self.0.repeat(run).map_err(backend_error)
    }

    fn listen(
        &self,
        service: &str,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn Send>, BackendError> {
        if !daqflow_dialog::protocol::valid_name(service) {
            return Err(BackendError::Invalid(format!(
                "{service:?} is not a valid service name (1 to 200 ASCII letters, digits or - _ . : / @ +)"
            )));
        }
        // The control plane would wait for a provider that may never come: only a service some
        // process provides now can be listened to.
        let processes =
            self.0.dialog().processes(Duration::from_secs(3)).map_err(|e| BackendError::Failed(e.to_string()))?;
        if !processes.iter().any(|p| p.provides.iter().any(|s| s == service)) {
            return Err(BackendError::NotFound(format!(
                "no service `{service}`: no process provides it (GET /api/processes lists the services)"
            )));
        }
        let sub = self
            .0
            .dialog()
            .subscribe(service, move |ev| match ev {
                daqflow_dialog::ServiceEvent::Update { data, .. } => {
                    let _ = tx.send(String::from_utf8_lossy(&data).into_owned());
                }
                daqflow_dialog::ServiceEvent::Lost { provider, cause } => {
                    let _ = tx.send(json!({ "lost": provider, "cause": format!("{cause:?}") }).to_string());
                }
                _ => {}
            })
            .map_err(|e| BackendError::Failed(e.to_string()))?;
        Ok(Box::new(sub))
    }

    fn logs(&self, q: &LogQuery) -> Result<Vec<LogRecord>, BackendError> {
        self.0.db().logs(q).map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, BackendError> {
        self.0.db().runs(limit).map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn run(&self, run: u32) -> Result<Option<RunDetail>, BackendError> {
        self.0.db().run(run).map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn histograms(&self) -> Value {
        self.0.histograms()
    }

    fn schemas(&self) -> std::collections::BTreeMap<String, daqflow_api::schema::Schema> {
        self.0.schemas()
    }

    fn et(&self) -> Value {
        self.0.et()
    }

    fn history_names(&self) -> Result<Vec<String>, BackendError> {
        self.0.history_db().history_names().map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn history(&self, query: &daqflow_api::HistoryQuery) -> Result<Option<daqflow_api::HistorySeries>, BackendError> {
        self.0.history_db().history(query).map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn alarms(&self) -> Result<daqflow_api::alarms::AlarmsStatus, BackendError> {
        Ok(self.0.alarms())
    }

    fn acknowledge_alarm(&self, name: &str, who: &str) -> Result<daqflow_api::alarms::AlarmView, BackendError> {
        self.0.acknowledge_alarm(name, who).map_err(backend_error)
    }
}

/// A JSON value as a TOML parameter (the one conversion, `daqflow_component::schema`).
pub(crate) fn json_to_toml(v: Value) -> Result<toml::Value, String> {
    daqflow_component::schema::json_to_toml(&v).map_err(|e| e.trim_start_matches("= ").to_owned())
}

/// The binary components run as: `/proc/self/exe` stays valid when the file is replaced.
pub(crate) fn binary() -> anyhow::Result<PathBuf> {
    let p = PathBuf::from("/proc/self/exe");
    if p.exists() { Ok(p) } else { std::env::current_exe().context("finding the daqflow binary") }
}

/// The web UI being served, and its access token.
struct Web {
    handle: daqflow_web::WebHandle,
    token: String,
}

impl Web {
    /// The URL that logs a browser in: `http://ADDR:PORT/?token=…`.
    fn login_url(&self) -> String {
        format!("{}?token={}", self.handle.url(), self.token)
    }
}

/// Writes the web token to `<data dir>/web-token`, readable by its owner only, for scripts.
fn write_token_file(data: &std::path::Path, token: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = data.join("web-token");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing the web token to {}", path.display()))?;
    // `mode` applies only to a new file: an old one keeps its bits unless set.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing the web token to {}", path.display()))?;
    Ok(path)
}

/// Serves the web UI with an access token (the system file's `web_token_file`, else a new
/// random one), written to `<data dir>/web-token`; a busy address falls back to a free port
/// when `fallback`.
fn start_web(addr: &str, op: &Operator, fallback: bool) -> anyhow::Result<Option<Web>> {
    if addr == "none" {
        return Ok(None);
    }
    let token = match &op.file().system.web_token_file {
        Some(path) => daqflow_runcontrol::system::read_web_token(path)?,
        None => daqflow_web::random_token().context("making the web UI's access token")?,
    };
    write_token_file(op.data_dir(), &token)?;
    // Off loopback, watching needs the token too: the run's state is nobody else's business.
    let options = daqflow_web::WebOptions {
        access_token: Some(token.clone()),
        token_to_watch: !loopback_only(addr),
        ..daqflow_web::WebOptions::default()
    };
    let backend: Arc<dyn Backend> = Arc::new(OperatorBackend(op.clone()));
    let handle = match daqflow_web::spawn(addr, backend.clone(), options.clone()) {
        Ok(h) => h,
        Err(daqflow_web::WebError::Bind { source, .. })
            if fallback && source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let host = addr.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
            let h = daqflow_web::spawn(format!("{host}:0"), backend, options)?;
            say_err!("{addr} is busy; the web UI is on {} instead", h.url());
            h
        }
        Err(e) => return Err(e.into()),
    };
    // For the tools, beside the control servers (the token stays in `web-token`).
    op.set_web_address(Some(handle.url().trim_end_matches('/').to_owned()))?;
    Ok(Some(Web { handle, token }))
}

/// Whether `addr` (`HOST:PORT`) binds only this host's loopback interface.
fn loopback_only(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn parse_system(text: &str, origin: &str) -> anyhow::Result<SystemFile> {
    SystemFile::parse(text, &daqflow::registry::standard()).map_err(|e| {
        let lines: Vec<String> = e.problems.iter().map(|p| format!("  {origin}: {p}")).collect();
        anyhow::anyhow!("the system file has {} problem(s):\n{}", e.problems.len(), lines.join("\n"))
    })
}

/// One progress line.
fn progress_line(st: &SystemStatus, t: f64) -> String {
    format!(
        "{t:6.1} s  {:<11} run {:<4} events {:>9}  ({:>7.0}/s, {:6.1} MB/s)  recorded {:>9}",
        st.state.name(),
        st.run.map_or("-".into(), |r| r.to_string()),
        st.events,
        st.events_per_s,
        st.mb_per_s,
        st.recorded,
    )
}

/// Prints the progress line at `t` s: over the last one on a terminal, else as a new line;
/// before it, a line for each data writer that its disk began or ceased to throttle
/// ([`throttle_notices`]), so that "recorded 0" never stands there unexplained.
fn show_progress(op: &Operator, t: f64, tty: bool, throttled: &mut std::collections::BTreeSet<String>) {
    let status = op.status();
    let notices = throttle_notices(&status, throttled);
    if tty && !notices.is_empty() {
        say!();
    }
    for notice in notices {
        say!("{notice}");
    }
    let line = progress_line(&status, t);
    if tty {
        say_inline!("\r{line}");
    } else {
        say!("{line}");
    }
}

/// The data writers of the open run (recorders, builder units writing files) whose disk began
/// to throttle them since the last call (their counters of this run say `detail.throttled`,
/// with the filesystem's fill) and those it ceased to; `throttled` holds who is throttled now.
/// A throttled writer takes no events, so ET's back-pressure holds the builder: the progress
/// line's `recorded` stops, and this says why.
fn throttle_notices(st: &SystemStatus, throttled: &mut std::collections::BTreeSet<String>) -> Vec<String> {
    let mut notices = Vec::new();
    for c in &st.components {
        let detail = &c.stats.detail;
        let now = c.alive && st.run.is_some() && c.stats.run == st.run && detail["throttled"] == true;
        let space = match (detail["disk_used_pct"].as_f64(), detail["disk_free_bytes"].as_u64()) {
            (Some(used), Some(free)) => format!(" ({used:.1} % used, {})", human_bytes(free)),
            (Some(used), None) => format!(" ({used:.1} % used)"),
            _ => String::new(),
        };
        if now && throttled.insert(c.name.clone()) {
            notices.push(format!(
                "  {} takes no events: the disk of its files is above its throttle_high_pct{space}; ET's \
                 back-pressure holds the builder until the disk is below throttle_low_pct",
                c.name
            ));
        } else if !now && throttled.remove(&c.name) {
            let why = if c.alive && c.stats.run == st.run {
                format!(": its disk is below throttle_low_pct{space}")
            } else {
                String::new()
            };
            notices.push(format!("  {} takes events again{why}", c.name));
        }
    }
    notices
}

/// `n` bytes as MiB or GiB, for people.
fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB free", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB free", n as f64 / 1048576.0)
    }
}

/// Checks every file of a run summary (`daqflow inspect --verify`): (files, clean, those left
/// open by a writer that died but intact up to their last whole event, problems).
fn verify_files(summary: &RunSummary) -> (usize, usize, Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut open = Vec::new();
    let mut clean = 0;
    for f in &summary.files {
        let path = f.path.display();
        match daqflow_wire::file::FileReader::open(&f.path).and_then(|r| r.verify(true)) {
            Ok(report) if report.is_clean() => clean += 1,
            Ok(report) if report.problems.is_empty() => open
                .push(format!("{path}: {} whole events, every CRC good; not closed (its writer died)", report.records)),
            Ok(report) => problems.push(format!("{path}: {report:?}")),
            Err(e) => problems.push(format!("{path}: {e}")),
        }
    }
    (summary.files.len(), clean, open, problems)
}

/// Takes one run: start, progress until `seconds` or Ctrl-C, stop; the summary. The run ends
/// only when it is stopped: here, or by a component's policy `stop`; a component restarted by
/// its policy rejoins the run and does not end it.
fn take_run(op: &Operator, seconds: Option<f64>, live: bool, interrupts: &Interrupts) -> anyhow::Result<RunSummary> {
    let run = op.start(None)?;
    say!("run {run} started{}", seconds.map_or(" (Ctrl-C stops it)".into(), |s| format!(" for {s} s")));
    let t0 = Instant::now();
    let tty = live && std::io::stdout().is_terminal();
    let mut next = Instant::now() + Duration::from_secs(1);
    let mut throttled = std::collections::BTreeSet::new();
    interrupts.doing(format!("the stop of run {run} to begin"));
    loop {
        let t = t0.elapsed().as_secs_f64();
        if interrupts.requested() || seconds.is_some_and(|s| t >= s) {
            break;
        }
        if !op.run_open() {
            say!();
            say!("the run ended by itself: {}", op.status().last_error.unwrap_or_default());
            break;
        }
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            show_progress(op, t, tty, &mut throttled);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if tty {
        say!();
    }
    stop_run(op, run, interrupts)
}

/// Stops `run` if it is still the open run, else waits for the stop under way (by the web UI or
/// a policy) to record it; its summary. A run opened meanwhile by someone else is not touched.
fn stop_run(op: &Operator, run: u32, interrupts: &Interrupts) -> anyhow::Result<RunSummary> {
    interrupts.doing(format!("the stop of run {run}"));
    if op.run_open() && op.run_number() == Some(run) {
        say!("stopping run {run}: producers first, then the builder, then the consumers drain ET …");
        match op.stop() {
            Ok(summary) if summary.run == run => return Ok(summary),
            Ok(other) => bail!("stopping run {run} closed run {} instead", other.run),
            // A policy or the web UI is stopping it meanwhile: its summary is the run's.
            Err(OperatorError::Busy(_) | OperatorError::IllegalTransition { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    summary_of(op, run)
}

/// Waits for the summary of `run`, which is closed or being closed by someone else: the
/// operator's last one, or the run database's record once the next run has started.
fn summary_of(op: &Operator, run: u32) -> anyhow::Result<RunSummary> {
    let limit =
        Duration::try_from_secs_f64(op.file().system.stop_timeout_s * 8.0 + 60.0).unwrap_or(Duration::from_secs(600));
    let deadline = Instant::now() + limit;
    loop {
        if let Some(summary) = op.last_summary().filter(|s| s.run == run) {
            return Ok(summary);
        }
        // A new run clears the operator's last summary; the database keeps every run's.
        if let Some(summary) = op.db().run(run).ok().flatten().and_then(|d| d.summary) {
            return Ok(summary);
        }
        if Instant::now() >= deadline {
            bail!("run {run} was being stopped and is still not closed after {:.0} s", limit.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The demo's session: a run started at once, then every run the web UI starts, each followed
/// with progress lines and summarised when it closes (stopped from the web UI or by a policy),
/// until Ctrl-C or `seconds`, which stop the run that is open (after the transition under way,
/// if any). Whether every run was perfect (`print_summary`).
fn demo_session(
    op: &Operator,
    seconds: Option<f64>,
    web: Option<&Web>,
    json: bool,
    keep: Option<u64>,
    interrupts: &Interrupts,
) -> anyhow::Result<bool> {
    let mut all_ok = true;
    let web_url = web.map(|w| w.handle.url());
    let mut show = |summary: &RunSummary| -> anyhow::Result<()> {
        interrupts.doing(format!("the summary of run {} (its files are verified)", summary.run));
        let (ok, full) = print_summary(summary, op, web_url.as_deref());
        all_ok &= ok;
        if json {
            say!("{}", serde_json::to_string_pretty(&full)?);
        }
        Ok(())
    };
    let mut following = None;
    let mut throttled = std::collections::BTreeSet::new();
    if !interrupts.requested() {
        let first = op.start(None)?;
        say!("run {first} started{}", seconds.map_or(" (Ctrl-C stops it)".into(), |s| format!(" for {s} s")));
        keep_within(op, keep, first);
        interrupts.doing(format!("the stop of run {first} to begin"));
        following = Some(first);
    }
    let t0 = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut next = Instant::now() + Duration::from_secs(1);
    loop {
        let t = t0.elapsed().as_secs_f64();
        if interrupts.requested() || seconds.is_some_and(|s| t >= s) {
            break;
        }
        if let Some(run) = following
            && (!op.run_open() || op.run_number() != Some(run))
        {
            if tty {
                say!();
            }
            let why = op.status().last_error.map(|e| format!(": {e}")).unwrap_or_default();
            say!("run {run} was stopped from outside the demo (the web UI or a policy){why}");
            show(&summary_of(op, run)?)?;
            say!("the demo goes on: start a run from the web UI; Ctrl-C ends the demo");
            interrupts.doing("the end to begin (no run is open)");
            following = None;
        }
        if following.is_none()
            && op.run_open()
            && let Some(run) = op.run_number()
        {
            say!("run {run} started from outside the demo");
            keep_within(op, keep, run);
            interrupts.doing(format!("the stop of run {run} to begin"));
            following = Some(run);
        }
        if following.is_some() && Instant::now() >= next {
            next = Instant::now() + Duration::from_secs(1);
            show_progress(op, t, tty, &mut throttled);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if tty && following.is_some() {
        say!();
    }
    // A transition under way (from the web UI) finishes first: a run it starts is stopped too,
    // one it stops is summarised.
    op.wait_idle();
    let open = op.run_number().filter(|_| op.run_open());
    if let Some(run) = following.filter(|&f| Some(f) != open) {
        show(&summary_of(op, run)?)?;
    }
    if let Some(run) = open {
        show(&stop_run(op, run, interrupts)?)?;
    }
    Ok(all_ok)
}

/// Deletes the files of the oldest runs before `run` (the run just started, whose files stay)
/// beyond `keep` bytes (`daqflow demo --keep`), and says what it deleted.
fn keep_within(op: &Operator, keep: Option<u64>, run: u32) {
    let Some(keep) = keep else { return };
    let dir = op.data_dir().join("files");
    match crate::retention::prune(&dir, keep, Some(run)) {
        Ok(p) if !p.runs.is_empty() => say!("{}", crate::retention::report(&p, keep, &dir)),
        Ok(_) => {}
        Err(e) => say_err!("daqflow: keeping the demo's files within --keep: {e}"),
    }
}

/// A count of the summary, or `unknown` with the reason when it could not be known.
fn count_or_unknown(n: Option<u64>) -> String {
    n.map_or_else(|| "unknown (see below)".into(), |n| n.to_string())
}

/// Prints the run's summary; whether the run was perfect (nothing lost or unknown, every file
/// good, no error), and the summary as JSON with the files' verification.
fn print_summary(summary: &RunSummary, op: &Operator, web_url: Option<&str>) -> (bool, Value) {
    let (nfiles, clean, left_open, problems) = verify_files(summary);
    let s = summary;
    let per_s = |n: f64| if s.seconds > 0.0 { n / s.seconds } else { 0.0 };
    say!();
    say!(
        "run {} of system {}: {:.1} s{}",
        s.run,
        s.system,
        s.seconds,
        if s.state == RunState::Failed { " (failed)" } else { "" }
    );
    say!("  triggered:  {}", count_or_unknown(s.triggered));
    say!("  built:      {}  ({:.0} events/s)", s.events, per_s(s.events as f64));
    say!("  rejected:   {}", count_or_unknown(s.rejected));
    say!(
        "  recorded:   {}  ({:.1} MB, {:.1} MB/s; counted in the files on disk)",
        s.recorded,
        s.bytes as f64 / 1e6,
        per_s(s.bytes as f64) / 1e6
    );
    if s.duplicates > 0 {
        say!(
            "  duplicates: {} (events recorded twice: built again after a builder unit died, or written by a recorder \
             that died before giving them back to ET; see docs/operator-guide.md, \"What a run's record holds\")",
            s.duplicates
        );
    }
    let open_note = if left_open.is_empty() {
        String::new()
    } else {
        format!(", {} left open by a writer that died", left_open.len())
    };
    say!("  files:      {nfiles} written, {clean} verified (structure and every CRC){open_note}");
    for f in &left_open {
        say!("    left open: {f}");
    }
    for p in &problems {
        say!("    problem: {p}");
    }
    for d in &s.died {
        say!("  died:       {} ({})", d.component, d.why);
    }
    for d in &s.degraded {
        say!("  went on without {d}");
    }
    for e in &s.errors {
        say!("  error:      {e}");
    }
    say!("  database:   {}", op.db().location());
    say!("  logs:       {}", op.data_dir().join("logs").display());
    if let Some(url) = web_url {
        say!("  web UI:     {url} (while it ran)");
    }
    for r in &s.lost_reasons {
        say!("  lost:       {}  {}", r.events, r.reason);
    }
    for u in &s.unknown {
        say!("  unknown:    {u}");
    }
    if s.unknown.is_empty() {
        say!("lost: {}", s.lost);
    } else {
        say!("lost: at least {} (more cannot be known: see `unknown` above)", s.lost);
    }
    let ok = s.lost == 0
        && s.unknown.is_empty()
        && problems.is_empty()
        && s.errors.is_empty()
        && nfiles == clean + left_open.len();
    let mut full = serde_json::to_value(s).unwrap_or(Value::Null);
    full["verified_files"] = json!(clean);
    full["file_problems"] = json!(problems);
    (ok, full)
}

pub fn demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    if args.print_config {
        say_inline!("{DEMO_SYSTEM}");
        return Ok(ExitCode::SUCCESS);
    }
    // First: a Ctrl-C from here on ends the demo in order.
    let interrupts = Interrupts::install(args.on_hangup)?;
    let file = parse_system(DEMO_SYSTEM, "demo.toml")?;
    let data = args.data.clone().unwrap_or_else(|| PathBuf::from(DEMO_DATA));
    let mut options = OperatorOptions::new(file, binary()?);
    options.data = Some(data.clone());
    // Before anything is written there: another operator's directory is refused.
    let data_lock = lock_data_dir(&options)?;
    say!("daqflow demo: {} components on this machine, data in {}", options.file.components.len(), data.display());
    let op = Operator::prepare_locked(options, data_lock)?;
    interrupts.attach(&op);
    let result = (|| -> anyhow::Result<ExitCode> {
        // The web UI first: it shows the components as they start.
        let web = start_web(&args.web, &op, true)?;
        if let Some(w) = &web {
            say!("web UI: {}", w.login_url());
        }
        say!("control server: {}; its processes, services and commands:", op.control_addr());
        say!("  {}", tools_line(&data));
        interrupts.doing("the components to start");
        if !interrupts.requested() {
            op.launch_components()?;
        }
        let mut ok = true;
        if interrupts.requested() {
            say!("no run was taken");
        } else {
            interrupts.doing("the configure");
            op.configure()?;
            say!("configured: {}", op.file().components.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "));
            if interrupts.requested() {
                say!("no run was taken");
            } else {
                ok = demo_session(&op, args.seconds, web.as_ref(), args.json, args.keep.0, &interrupts)?;
            }
        }
        end_components(&op, &interrupts);
        if let Some(w) = web {
            let _ = w.handle.shutdown();
        }
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })();
    op.shutdown();
    result
}

/// Resets and ends every component and the control servers, saying so.
fn end_components(op: &Operator, interrupts: &Interrupts) {
    interrupts.doing("every component to end");
    if interrupts.requested() {
        say!("ending every component …");
    }
    op.shutdown();
    if interrupts.requested() {
        say!("every component ended");
    }
}

pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.system).with_context(|| format!("reading {}", args.system.display()))?;
    let file = parse_system(&text, &args.system.display().to_string())?;
    if args.check {
        println!(
            "{}: system `{}`, {} components, no problems",
            args.system.display(),
            file.system.name,
            file.components.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.seconds.is_some() && !args.start {
        bail!("--seconds needs --start");
    }
    let web_addr = args.web.clone().unwrap_or_else(|| file.system.web.clone());
    // The data directory as given (for the line printed), that of SYSTEM.toml also when
    // repeating a run.
    let data = args.data.clone().unwrap_or_else(|| file.system.data.clone());
    // From here on a Ctrl-C ends the system in order.
    let interrupts = Interrupts::install(args.on_hangup)?;
    let mut options = OperatorOptions::new(file, binary()?);
    options.data = Some(data.clone());
    options.control = args.control.clone();
    // Before anything is read or written there (the run database, the token): another
    // operator's directory is refused.
    let data_lock = lock_data_dir(&options)?;
    if let Some(n) = args.repeat {
        options.file = repeated_system(&options.file, &options.data_dir()?, n)?;
    }
    let op = Operator::prepare_locked(options, data_lock)?;
    interrupts.attach(&op);
    interrupts.doing("the components to start");
    if !interrupts.requested() {
        op.launch_components()?;
    }
    let result = (|| -> anyhow::Result<ExitCode> {
        if let Some(n) = args.repeat {
            let overrides = op.repeat(n)?;
            say!(
                "repeating run {n}: its system file (SHA-256 {}), parameters set over it: {}",
                daqflow_runcontrol::provenance::sha256_hex(op.file().text.as_bytes()),
                serde_json::to_string(&overrides).unwrap_or_default()
            );
        }
        let web = start_web(&web_addr, &op, false)?;
        say!(
            "system `{}` up: control server {}, web UI: {}",
            op.file().system.name,
            op.control_addr(),
            web.as_ref().map_or("none".into(), Web::login_url)
        );
        say!("its processes, services and commands:");
        say!("  {}", tools_line(&data));
        if args.start && !interrupts.requested() {
            interrupts.doing("the configure");
            op.configure()?;
            if let Some(s) = args.seconds {
                let code = if interrupts.requested() {
                    ExitCode::SUCCESS
                } else {
                    let summary = take_run(&op, Some(s), true, &interrupts)?;
                    let (ok, _) = print_summary(&summary, &op, web.as_ref().map(|w| w.handle.url()).as_deref());
                    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
                };
                end_components(&op, &interrupts);
                return Ok(code);
            }
            if !interrupts.requested() {
                let run = op.start(None)?;
                say!("run {run} started");
            }
        }
        say!(
            "commands: configure, start [RUN], pause, resume, stop, reset, status, set, unset, repeat RUN, alarms, ack ALARM, quit"
        );
        let ok = console::run(&op, web.as_ref().map(|w| w.handle.url()), args.start, &interrupts)?;
        end_components(&op, &interrupts);
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })();
    op.shutdown();
    result
}

/// Run `n`'s system file from the run database of `file` (`daqflow run SYSTEM.toml --repeat N`)
/// in the data directory `data` (absolute; its lock held), to run in `file`'s place: its
/// database and data directory. Refuses a run that does not exist or is of another system.
fn repeated_system(file: &SystemFile, data: &std::path::Path, n: u32) -> anyhow::Result<SystemFile> {
    let location = daqflow_runcontrol::db::Location::parse(&file.system.database)
        .map_err(|e| anyhow::anyhow!("system.database: {e}"))?
        .under(data);
    let db = daqflow_runcontrol::db::RunDb::connect(&location)?;
    let Some(detail) = db.run(n)? else {
        bail!("--repeat {n}: there is no run {n} in the run database {location}");
    };
    if detail.record.system != file.system.name {
        bail!(
            "--repeat {n}: run {n} is of system `{}`, not of `{}` (the system file given)",
            detail.record.system,
            file.system.name
        );
    }
    let mut stored = parse_system(&detail.config, &format!("the system file of run {n}"))?;
    // The place is the given file's: the database run N was found in (its stored text has any
    // password redacted), the data directory.
    stored.system.database = file.system.database.clone();
    Ok(stored)
}

/// Creates the data directory and takes its lock (`DATA/operator.lock`) before anything is
/// written there: refused, naming the operator that holds it, while another one does; taken
/// over, saying whose it was, from one that died.
fn lock_data_dir(options: &OperatorOptions) -> anyhow::Result<OperatorLock> {
    let lock = options.lock_data_dir()?;
    if let Some(left) = lock.left_behind() {
        say_err!("taking over the data directory {}: {left}", lock.info().data.display());
    }
    Ok(lock)
}

/// The command that lists the processes of the system whose data directory is `data`, ready to
/// paste: `daqflow --data daqflow-demo dialog ls`, with this binary's path when `daqflow` on
/// the PATH is not this binary (`cargo run`).
fn tools_line(data: &std::path::Path) -> String {
    format!("{} --data {} dialog ls", shell_word(&self_command()), shell_word(&data.display().to_string()))
}

/// How to run this binary from here: `daqflow` when that is what the PATH finds, else its path
/// (relative to the current directory when it is below it).
fn self_command() -> String {
    let Ok(me) = std::env::current_exe().and_then(std::fs::canonicalize) else { return "daqflow".into() };
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .any(|dir| std::fs::canonicalize(dir.join("daqflow")).is_ok_and(|found| found == me))
    });
    if on_path {
        return "daqflow".into();
    }
    let here = std::env::current_dir().and_then(std::fs::canonicalize).ok();
    match here.as_deref().and_then(|h| me.strip_prefix(h).ok()) {
        Some(below) => below.display().to_string(),
        None => me.display().to_string(),
    }
}

/// `text` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./,:=@%+-".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// The console's `alarms`: every alarm with its state, then the recent events.
fn print_alarms(op: &Operator) {
    let status = op.alarms();
    if status.alarms.is_empty() {
        say!("the system file has no [[alarm]]");
        return;
    }
    use daqflow_runcontrol::operator::alarms::{readable, size};
    for a in &status.alarms {
        let by = a.acknowledged_by.as_deref().map(|w| format!(" by {w}")).unwrap_or_default();
        // The value the condition compared last, as people read it (`82.7 GB free`, `499.1`).
        let value = match (a.value, a.unit.as_deref()) {
            (Some(v), Some("bytes")) => format!("; now {} free", size(v)),
            (Some(v), _) => format!("; now {}", readable(v)),
            (None, _) => String::new(),
        };
        say!("{:<13} {:<8} {}{by}: {} [{}{value}]", a.state.name(), a.severity.name(), a.name, a.message, a.condition);
    }
    for e in status.events.iter().take(10) {
        let who = e.who.as_deref().map(|w| format!(" by {w}")).unwrap_or_default();
        say!(
            "  {} {} {}{who}: {}",
            crate::format::utc(e.t_ms.saturating_mul(1_000_000)),
            e.kind.name(),
            e.name,
            e.message
        );
    }
}

/// The console's `ack ALARM`: acknowledged by the console's user.
fn acknowledge_from_console(op: &Operator, name: &str) {
    let who = format!("{} (console)", std::env::var("USER").unwrap_or_else(|_| "operator".into()));
    match op.acknowledge_alarm(name, &who) {
        Ok(a) => say!("alarm {}: {}", a.name, a.state.name()),
        Err(e) => say!("ack: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_throttled_by_its_disk_is_said_once_when_it_begins_and_once_when_it_ends() {
        let writer = |name: &str, run: u32, throttled: bool| {
            let mut c: daqflow_api::ComponentView = serde_json::from_value(json!({
                "name": name, "kind": "recorder", "role": "recorder", "host": "localhost", "pid": 1, "alive": true,
                "state": "Running", "run": run, "since_ms": 0, "restarts": 0, "policy": "stop",
                "stats": {"run": run, "state": "Running"}
            }))
            .unwrap();
            c.stats.run = Some(run);
            c.stats.detail = json!({"throttled": throttled, "disk_used_pct": 96.25, "disk_free_bytes": 4u64 << 30, "throttled_for_s": 1.0});
            c
        };
        let mut st: SystemStatus = serde_json::from_value(json!({
            "system": "s", "state": "Running", "run": 2, "running": true, "events": 0, "bytes": 0, "recorded": 0,
            "events_per_s": 0.0, "mb_per_s": 0.0, "control": "", "data": "/d", "components": [], "rates": []
        }))
        .unwrap();
        let mut shown = std::collections::BTreeSet::new();
        // Counters of the run before that ended throttled say nothing of this run.
        st.components = vec![writer("rec-0", 1, true), writer("rec-1", 2, false)];
        assert!(throttle_notices(&st, &mut shown).is_empty());
        st.components = vec![writer("rec-0", 2, true), writer("rec-1", 2, false)];
        let begun = throttle_notices(&st, &mut shown);
        assert_eq!(begun.len(), 1, "{begun:?}");
        assert!(begun[0].starts_with("  rec-0 takes no events: the disk of its files is above its throttle_high_pct (96.2 % used, 4.0 GiB free)"), "{begun:?}");
        assert!(throttle_notices(&st, &mut shown).is_empty(), "said once");
        st.components = vec![writer("rec-0", 2, false), writer("rec-1", 2, false)];
        assert_eq!(
            throttle_notices(&st, &mut shown),
            ["  rec-0 takes events again: its disk is below throttle_low_pct (96.2 % used, 4.0 GiB free)"]
        );
        // A writer that dies throttled: said to take events again, without a disk.
        st.components = vec![writer("rec-0", 2, true)];
        assert_eq!(throttle_notices(&st, &mut shown).len(), 1);
        st.components[0].alive = false;
        assert_eq!(throttle_notices(&st, &mut shown), ["  rec-0 takes events again"]);
    }

    #[test]
    fn a_parameter_from_json_is_the_toml_value_it_says() {
        assert_eq!(json_to_toml(json!(500)), Ok(toml::Value::Integer(500)));
        assert_eq!(json_to_toml(json!(2.5)), Ok(toml::Value::Float(2.5)));
        assert_eq!(json_to_toml(json!("fixed")), Ok(toml::Value::String("fixed".into())));
        let t = json_to_toml(json!({"kind": "lognormal", "mean": 1024.0, "list": [1, 2]})).unwrap();
        assert_eq!(t["kind"].as_str(), Some("lognormal"));
        assert_eq!(t["list"].as_array().map(Vec::len), Some(2));
        assert!(json_to_toml(json!(null)).unwrap_err().contains("null has none"));
        assert!(json_to_toml(json!([1, null])).is_err());
        assert!(json_to_toml(json!(u64::MAX)).unwrap_err().contains("out of the range of numbers"));
    }
}
