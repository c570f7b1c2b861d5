//! `daqflow run SYSTEM.toml` (the operator) and `daqflow demo` (the operator on the built-in
//! system file): start a described system, serve the web UI, take runs, summarise.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use daqflow_runcontrol::db::LogQuery;
use daqflow_runcontrol::operator::{Operator, OperatorError, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use daqflow_web::{Backend, BackendError, LogFilter};
use serde_json::{Value, json};

/// The demo's system file.
pub const DEMO_SYSTEM: &str = include_str!("demo.toml");

pub const RUN_AFTER_HELP: &str = "Examples:\n  \
    daqflow demo --print-config > teststand.toml     a system file to start from\n  \
    daqflow run teststand.toml                       start it; it prints the web UI's URL (with its token)\n  \
    daqflow run teststand.toml --start --seconds 60  configure, take a 60 s run, stop, exit\n\n\
    Then type transitions (one per line): configure, start [RUN], pause, resume, stop, reset,\n\
    status, quit. Ctrl-C stops a run in progress and ends every component.\n\
    The system file is described in docs/operator-guide.md.";

pub const DEMO_AFTER_HELP: &str = "Examples:\n  \
    daqflow demo                        a run until Ctrl-C; open the web UI URL it prints\n  \
    daqflow demo --seconds 10           a 10-second run, then the summary\n  \
    daqflow demo --data /dev/shm/demo   keep the data on a RAM disk\n  \
    daqflow demo --print-config         the system file the demo runs\n\n\
    The demo runs, on this machine: the control server, an emulated trigger (EVM), 4 sources,\n\
    2 readout units, 2 builder units, an ET system, a recorder and a monitor, the message logger\n\
    and the run database (SQLite), and serves the web UI. The summary's `lost:` line must read 0.";

/// Arguments of `daqflow run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The system file.
    pub system: PathBuf,
    /// Web UI address (overrides the file's `web`); `none` for no web UI.
    #[arg(long, value_name = "ADDR")]
    pub web: Option<String>,
    /// Data directory (overrides the file's `data`).
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
}

/// Arguments of `daqflow demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Stop the run after this many seconds (default: at Ctrl-C).
    #[arg(long, value_name = "N")]
    pub seconds: Option<f64>,
    /// Where files, logs and the run database go.
    #[arg(long, value_name = "DIR", default_value = "daqflow-demo")]
    pub data: PathBuf,
    /// Web UI address (a free port is taken if this one is busy); `none` for no web UI.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub web: String,
    /// Print the demo's system file and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print the summary as JSON (after the human-readable one).
    #[arg(long)]
    pub json: bool,
}

/// The operator as the web UI's backend.
pub struct OperatorBackend(pub Operator);

fn query(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

impl Backend for OperatorBackend {
    fn status(&self) -> Value {
        self.0.status()
    }

    fn transition(&self, verb: &str, arg: Value) -> Result<Value, String> {
        let op = &self.0;
        let r = match verb {
            "configure" => op.configure().map(|_| json!({ "state": op.state() })),
            "start" => {
                let run = arg.get("run").and_then(Value::as_u64).map(|r| r as u32);
                op.start(run).map(|run| json!({ "run": run }))
            }
            "stop" => op.stop(),
            "pause" => op.pause().map(|()| Value::Null),
            "resume" => op.resume().map(|()| Value::Null),
            "reset" => op.reset().map(|()| Value::Null),
            other => {
                return Err(format!("unknown transition `{other}` (configure, start, stop, pause, resume, reset)"));
            }
        };
        r.map_err(|e| e.to_string())
    }

    fn processes(&self) -> Result<Value, String> {
        let ps = self.0.dialog().processes(Duration::from_secs(3)).map_err(|e| e.to_string())?;
        Ok(Value::Array(
            ps.into_iter()
                .map(|p| {
                    json!({
                        "name": p.name, "host": p.host, "port": p.port, "pid": p.pid,
                        "start_time_ns": p.start_time_ns, "last_heartbeat_ns": p.last_heartbeat_ns,
                        "provides": p.provides, "subscribes": p.subscribes, "commands": p.commands,
                    })
                })
                .collect(),
        ))
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
        let processes = self.0.dialog().processes(Duration::from_secs(3)).map_err(|e| e.to_string())?;
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
            .map_err(|e| e.to_string())?;
        Ok(Box::new(sub))
    }

    fn logs(&self, f: &LogFilter) -> Result<Value, String> {
        let q = LogQuery {
            since_ms: f.since_ms,
            until_ms: f.until_ms,
            process: f.process.clone(),
            min_severity: f.min_severity.clone(),
            text: f.text.clone(),
            limit: f.limit,
        };
        let records = self.0.db().logs(&q).map_err(|e| e.to_string())?;
        serde_json::to_value(records).map_err(|e| e.to_string())
    }

    fn runs(&self, limit: usize) -> Result<Value, String> {
        self.0.db().runs(limit).map(Value::Array).map_err(|e| e.to_string())
    }

    fn run(&self, run: u32) -> Result<Option<Value>, String> {
        self.0.db().run(run).map_err(|e| e.to_string())
    }

    fn histograms(&self) -> Value {
        self.0.histograms()
    }

    fn et(&self) -> Value {
        self.0.et()
    }

    fn metrics(&self) -> String {
        self.0.metrics()
    }
}

/// The binary components run as: `/proc/self/exe` stays valid when the file is replaced.
fn binary() -> anyhow::Result<PathBuf> {
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
    let options = daqflow_web::WebOptions { access_token: Some(token.clone()), ..daqflow_web::WebOptions::default() };
    let backend: Arc<dyn Backend> = Arc::new(OperatorBackend(op.clone()));
    let handle = match daqflow_web::spawn(addr, backend.clone(), options.clone()) {
        Ok(h) => h,
        Err(daqflow_web::WebError::Bind { source, .. })
            if fallback && source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let host = addr.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
            let h = daqflow_web::spawn(format!("{host}:0"), backend, options)?;
            eprintln!("{addr} is busy; the web UI is on {} instead", h.url());
            h
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Some(Web { handle, token }))
}

fn parse_system(text: &str, origin: &str) -> anyhow::Result<SystemFile> {
    SystemFile::parse(text, &daqflow::registry::standard()).map_err(|e| {
        let lines: Vec<String> = e.problems.iter().map(|p| format!("  {origin}: {p}")).collect();
        anyhow::anyhow!("the system file has {} problem(s):\n{}", e.problems.len(), lines.join("\n"))
    })
}

/// One progress line.
fn progress_line(st: &Value, t: f64) -> String {
    format!(
        "{t:6.1} s  {:<11} run {:<4} events {:>9}  ({:>7.0}/s, {:6.1} MB/s)  recorded {:>9}",
        st["state"].as_str().unwrap_or("?"),
        st["run"].as_u64().map_or("-".into(), |r| r.to_string()),
        st["events"].as_u64().unwrap_or(0),
        st["events_per_s"].as_f64().unwrap_or(0.0),
        st["mb_per_s"].as_f64().unwrap_or(0.0),
        st["recorded"].as_u64().unwrap_or(0),
    )
}

/// Checks every file of a run summary (`daqflow inspect --verify`): (files, clean, those left
/// open by a writer that died but intact up to their last whole event, problems).
fn verify_files(summary: &Value) -> (usize, usize, Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut open = Vec::new();
    let mut clean = 0;
    let files = summary["files"].as_array().cloned().unwrap_or_default();
    for f in &files {
        let path = f["path"].as_str().unwrap_or("");
        match daqflow_wire::file::FileReader::open(path).and_then(|r| r.verify(true)) {
            Ok(report) if report.is_clean() => clean += 1,
            Ok(report) if report.problems.is_empty() => open
                .push(format!("{path}: {} whole events, every CRC good; not closed (its writer died)", report.records)),
            Ok(report) => problems.push(format!("{path}: {report:?}")),
            Err(e) => problems.push(format!("{path}: {e}")),
        }
    }
    (files.len(), clean, open, problems)
}

/// Takes one run: start, progress until `seconds` or Ctrl-C, stop; the summary. The run ends
/// only when it is stopped: here, or by a component's policy `stop`; a component restarted by
/// its policy rejoins the run and does not end it.
fn take_run(op: &Operator, seconds: Option<f64>, live: bool) -> anyhow::Result<Value> {
    let stop_flag = crate::component_cmd::install_signal_flag()?;
    let run = op.start(None)?;
    println!("run {run} started{}", seconds.map_or(" (Ctrl-C stops it)".into(), |s| format!(" for {s} s")));
    let t0 = Instant::now();
    let tty = live && std::io::stdout().is_terminal();
    let mut next = Instant::now() + Duration::from_secs(1);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let t = t0.elapsed().as_secs_f64();
        if stop_flag.load(Ordering::Relaxed) || seconds.is_some_and(|s| t >= s) {
            break;
        }
        if !op.run_open() {
            println!();
            println!("the run ended by itself: {}", query(&op.status()["last_error"]));
            break;
        }
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            let line = progress_line(&op.status(), t);
            if tty {
                print!("\r{line}");
            } else {
                println!("{line}");
            }
            let _ = std::io::stdout().flush();
        }
    }
    if tty {
        println!();
    }
    if op.run_open() {
        println!("stopping run {run}: producers first, then the builder, then the consumers drain ET …");
        match op.stop() {
            Ok(summary) => return Ok(summary),
            // A policy is stopping it meanwhile: its summary is the run's.
            Err(OperatorError::Busy(_) | OperatorError::IllegalTransition { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Stopped by a policy (or being stopped): wait for that stop to record the run.
    let limit =
        Duration::try_from_secs_f64(op.file().system.stop_timeout_s * 8.0 + 60.0).unwrap_or(Duration::from_secs(600));
    if !op.wait_run_closed(limit) {
        bail!("run {run} was being stopped by a policy and is still not closed after {:.0} s", limit.as_secs_f64());
    }
    Ok(op.last_summary())
}

/// A count of the summary, or `unknown` with the reason when it could not be known.
fn count_or_unknown(summary: &Value, key: &str) -> String {
    match summary[key].as_u64() {
        Some(n) => n.to_string(),
        None => "unknown (see below)".into(),
    }
}

fn print_summary(summary: &Value, op: &Operator, web: Option<&Web>) -> (bool, Value) {
    let (nfiles, clean, left_open, problems) = verify_files(summary);
    let seconds = summary["seconds"].as_f64().unwrap_or(0.0);
    let events = summary["events"].as_u64().unwrap_or(0);
    let bytes = summary["bytes"].as_u64().unwrap_or(0);
    println!();
    println!(
        "run {} of system {}: {seconds:.1} s{}",
        summary["run"].as_u64().map_or("?".into(), |r| r.to_string()),
        summary["system"].as_str().unwrap_or(""),
        if summary["state"] == "failed" { " (failed)" } else { "" }
    );
    println!("  triggered:  {}", count_or_unknown(summary, "triggered"));
    println!("  built:      {events}  ({:.0} events/s)", if seconds > 0.0 { events as f64 / seconds } else { 0.0 });
    println!("  rejected:   {}", count_or_unknown(summary, "rejected"));
    println!(
        "  recorded:   {}  ({:.1} MB, {:.1} MB/s; counted in the files on disk)",
        summary["recorded"].as_u64().unwrap_or(0),
        bytes as f64 / 1e6,
        if seconds > 0.0 { bytes as f64 / seconds / 1e6 } else { 0.0 }
    );
    if summary["duplicates"].as_u64().unwrap_or(0) > 0 {
        println!(
            "  duplicates: {} (events built again after a builder unit died; see docs/evb.md)",
            summary["duplicates"]
        );
    }
    let open_note = if left_open.is_empty() {
        String::new()
    } else {
        format!(", {} left open by a writer that died", left_open.len())
    };
    println!("  files:      {nfiles} written, {clean} verified (structure and every CRC){open_note}");
    for f in &left_open {
        println!("    left open: {f}");
    }
    for p in &problems {
        println!("    problem: {p}");
    }
    for d in summary["died"].as_array().into_iter().flatten() {
        println!("  died:       {} ({})", query(&d["component"]), query(&d["why"]));
    }
    let errors = summary["errors"].as_array().cloned().unwrap_or_default();
    for e in &errors {
        println!("  error:      {}", query(e));
    }
    println!("  database:   {}", op.db().path().display());
    println!("  logs:       {}", op.data_dir().join("logs").display());
    if let Some(w) = web {
        println!("  web UI:     {} (while it ran)", w.handle.url());
    }
    for r in summary["lost_reasons"].as_array().into_iter().flatten() {
        println!("  lost:       {}  {}", r["events"].as_u64().unwrap_or(0), query(&r["reason"]));
    }
    let unknown = summary["unknown"].as_array().cloned().unwrap_or_default();
    for u in &unknown {
        println!("  unknown:    {}", query(u));
    }
    let lost = summary["lost"].as_u64();
    match (lost, unknown.is_empty()) {
        (Some(n), true) => println!("lost: {n}"),
        (Some(n), false) => println!("lost: at least {n} (more cannot be known: see `unknown` above)"),
        (None, _) => println!("lost: unknown (the run has no accounting)"),
    }
    let ok = lost == Some(0)
        && unknown.is_empty()
        && problems.is_empty()
        && errors.is_empty()
        && nfiles == clean + left_open.len();
    let mut full = summary.clone();
    full["verified_files"] = json!(clean);
    full["file_problems"] = json!(problems);
    (ok, full)
}

pub fn demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    if args.print_config {
        print!("{DEMO_SYSTEM}");
        return Ok(ExitCode::SUCCESS);
    }
    let file = parse_system(DEMO_SYSTEM, "demo.toml")?;
    println!("daqflow demo: {} components on this machine, data in {}", file.components.len(), args.data.display());
    let mut options = OperatorOptions::new(file, binary()?);
    options.data = Some(args.data.clone());
    let op = Operator::launch(options)?;
    let result = (|| -> anyhow::Result<ExitCode> {
        let web = start_web(&args.web, &op, true)?;
        if let Some(w) = &web {
            println!("web UI: {}", w.login_url());
        }
        println!("control server: {}", op.control_addr());
        op.configure()?;
        println!("configured: {}", op.file().components.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "));
        let summary = take_run(&op, args.seconds, true)?;
        let (ok, full) = print_summary(&summary, &op, web.as_ref());
        if args.json {
            println!("{}", serde_json::to_string_pretty(&full)?);
        }
        if let Some(w) = web {
            let _ = w.handle.shutdown();
        }
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })();
    op.shutdown();
    result
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
    let mut options = OperatorOptions::new(file, binary()?);
    options.data = args.data.clone();
    options.control = args.control.clone();
    let op = Operator::launch(options)?;
    let result = (|| -> anyhow::Result<ExitCode> {
        let web = start_web(&web_addr, &op, false)?;
        println!(
            "system `{}` up: control server {}, web UI {}",
            op.file().system.name,
            op.control_addr(),
            web.as_ref().map_or("none".into(), Web::login_url)
        );
        if args.start {
            op.configure()?;
            if let Some(s) = args.seconds {
                let summary = take_run(&op, Some(s), true)?;
                let (ok, _) = print_summary(&summary, &op, web.as_ref());
                return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            let run = op.start(None)?;
            println!("run {run} started");
        }
        println!("commands: configure, start [RUN], pause, resume, stop, reset, status, quit");
        operator_console(&op, web.as_ref())?;
        Ok(ExitCode::SUCCESS)
    })();
    op.shutdown();
    result
}

/// Transitions typed on standard input, until `quit`, end of input or Ctrl-C.
fn operator_console(op: &Operator, web: Option<&Web>) -> anyhow::Result<()> {
    let stop_flag = crate::component_cmd::install_signal_flag()?;
    let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
    std::thread::Builder::new().name("console".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    })?;
    let mut stdin_open = true;
    loop {
        if stop_flag.load(Ordering::Relaxed) {
            println!("stopping");
            return Ok(());
        }
        let line = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(l)) => l,
            // End of input: keep serving the web UI until Ctrl-C.
            Ok(None) => {
                if stdin_open && web.is_none() {
                    return Ok(());
                }
                stdin_open = false;
                continue;
            }
            Err(_) => continue,
        };
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or("");
        let r: Result<Value, String> = match verb {
            "" => continue,
            "quit" | "exit" => return Ok(()),
            "status" => Ok(op.status()),
            "configure" => op.configure().map(|_| Value::Null).map_err(|e| e.to_string()),
            "start" => {
                let run = words.next().map(str::parse::<u32>).transpose();
                match run {
                    Ok(run) => op.start(run).map(|r| json!({ "run": r })).map_err(|e| e.to_string()),
                    Err(_) => Err("usage: start [RUN]".into()),
                }
            }
            "stop" => op.stop().map_err(|e| e.to_string()),
            "pause" => op.pause().map(|()| Value::Null).map_err(|e| e.to_string()),
            "resume" => op.resume().map(|()| Value::Null).map_err(|e| e.to_string()),
            "reset" => op.reset().map(|()| Value::Null).map_err(|e| e.to_string()),
            other => Err(format!("unknown command `{other}`")),
        };
        match r {
            Ok(v) if verb == "stop" => {
                let _ = print_summary(&v, op, web);
            }
            Ok(Value::Null) => println!("{verb}: done; state {}", op.state()),
            Ok(v) => println!("{}", serde_json::to_string_pretty(&strip_rates(v)).unwrap_or_default()),
            Err(e) => println!("{verb}: {e}"),
        }
    }
}

fn strip_rates(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.remove("rates");
    }
    v
}
