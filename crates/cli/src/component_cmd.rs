//! `daqflow component KIND`: one component as a process, driven by line commands on its standard
//! input (what `daqflow evb local` and scripts use; the run-control layer drives the same
//! components over the control plane).
//!
//! Commands, one per line: `configure`, `start RUN`, `pause`, `resume`, `stop [ARG]`, `stats`,
//! `state`, `reset`, `quit`. Every command gets exactly one JSON line on standard output:
//! `{"ok":true,"state":"Running","result":…}` or `{"ok":false,"state":…,"error":"…"}`. When the
//! component fails during a run, a line `{"event":"error","error":"…"}` appears by itself. End of
//! input stops a running component and exits; so does SIGTERM or Ctrl-C.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use daqflow_evb::component::Component;
use serde_json::{Value, json};

pub const AFTER_HELP: &str = "Examples:\n  \
    daqflow component evm --name evm --set rus=2 --set listen=127.0.0.1:7100\n  \
    daqflow component ru --name ru-0 --set id=0 --set evm=127.0.0.1:7100 --set streams=4\n  \
    daqflow component bu --name bu-0 --config bu.toml --set output=files --set directory=/dev/shm/run\n  \
    daqflow component source --name src-3 --set source_id=3 --set ru=127.0.0.1:7201 --set size.kind=lognormal \\\n      \
    --set size.mean=2048 --set size.rms=512\n\n\
    Then type commands (one per line): configure, start RUN, pause, resume, stats, stop [LAST_EVENT],\n\
    reset, quit.\n\
    Each gets one JSON line back. With --start RUN the component configures and starts at once and\n\
    runs until its input ends or it gets SIGTERM / Ctrl-C; it then stops and prints its summary.\n\n\
    With --control HOST:PORT the component also joins the control plane: `daqflow dialog send\n\
    evm/start 7`, `daqflow dialog listen evm/state`.\n\n\
    Configuration keys of every kind: docs/evb.md.";

/// The component kinds this binary runs.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A front-end readout stream (FEROL emulator).
    Source,
    /// The event manager.
    Evm,
    /// A readout unit.
    Ru,
    /// A builder unit.
    Bu,
}

/// Arguments of `daqflow component`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to run.
    #[arg(value_enum)]
    pub kind: Kind,
    /// The component's name, unique in the system.
    #[arg(long)]
    pub name: String,
    /// A TOML file with the configuration keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set one configuration key (dotted for nested keys: size.kind=lognormal); after --config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Configure and start run RUN at once, then run until the input ends or a signal.
    #[arg(long, value_name = "RUN")]
    pub start: Option<u32>,
    /// Also take commands from the control plane (the dialog control server at HOST:PORT):
    /// `NAME/configure`, `NAME/start` (payload: the run number), `NAME/pause`, `NAME/resume`,
    /// `NAME/stop` (payload: optional last event), `NAME/reset`, and the same under `all/`;
    /// publish `NAME/state` and `NAME/stats` (JSON, once a second and on every change). The end
    /// of standard input then does not end the process; SIGTERM or Ctrl-C does.
    #[arg(long, value_name = "HOST:PORT")]
    pub control: Option<String>,
}

/// The commands a component takes over the control plane.
const VERBS: [&str; 6] = ["configure", "start", "pause", "resume", "stop", "reset"];

/// A component's presence on the control plane.
struct ControlLink {
    dialog: daqflow_dialog::Dialog,
    state: daqflow_dialog::Service,
    stats: daqflow_dialog::Service,
    _commands: Vec<daqflow_dialog::CommandRegistration>,
    since: std::time::SystemTime,
    last_state: &'static str,
    last_result: Value,
}

impl ControlLink {
    fn start(control: &str, name: &str, tx: std::sync::mpsc::Sender<Option<String>>) -> anyhow::Result<ControlLink> {
        let dialog = daqflow_dialog::Dialog::connect(control, name)
            .map_err(|e| anyhow::anyhow!("joining the control plane at {control}: {e}"))?;
        let state = dialog.provide(&format!("{name}/state")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let stats = dialog.provide(&format!("{name}/stats")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut commands = Vec::new();
        for verb in VERBS {
            for target in [name, "all"] {
                let tx = tx.clone();
                let reg = dialog
                    .register_command(&format!("{target}/{verb}"), move |m| {
                        let arg = String::from_utf8_lossy(&m.data).trim().to_owned();
                        // A payload may be a bare number or JSON {"run": N} / {"last_event": N}.
                        let arg = serde_json::from_str::<Value>(&arg)
                            .ok()
                            .and_then(|v| v.get("run").or_else(|| v.get("last_event")).and_then(Value::as_u64))
                            .map_or(arg, |n| n.to_string());
                        let _ = tx.send(Some(format!("{verb} {arg}")));
                    })
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                commands.push(reg);
            }
        }
        Ok(ControlLink {
            dialog,
            state,
            stats,
            _commands: commands,
            since: std::time::SystemTime::now(),
            last_state: "",
            last_result: Value::Null,
        })
    }

    /// Publishes the state (when it changed, or `force`) and the statistics.
    fn publish(&mut self, c: &dyn Component, result: Option<&Value>, force: bool) {
        if let Some(r) = result {
            self.last_result = r.clone();
        }
        let state = c.state().name();
        if state != self.last_state {
            self.since = std::time::SystemTime::now();
        }
        if state != self.last_state || force || result.is_some() {
            self.last_state = state;
            let since = self.since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let stats = c.stats();
            let v = json!({
                "state": state,
                "run": stats.get("run").cloned().unwrap_or(Value::Null),
                "since_ms": since,
                "error": c.failure(),
                "last_command": self.last_result,
            });
            let _ = self.state.update(v.to_string().as_bytes());
            let _ = self.stats.update(stats.to_string().as_bytes());
        }
    }
}

/// Reads `--config` and applies `--set`s into one TOML table.
pub fn config_table(config: Option<&PathBuf>, sets: &[String]) -> anyhow::Result<toml::Table> {
    let mut table = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            text.parse::<toml::Table>().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => toml::Table::new(),
    };
    for s in sets {
        let Some((key, value)) = s.split_once('=') else { bail!("--set {s}: expected KEY=VALUE") };
        let value = parse_value(value.trim());
        let mut path: Vec<&str> = key.trim().split('.').collect();
        let last = path.pop().filter(|k| !k.is_empty()).ok_or_else(|| anyhow::anyhow!("--set {s}: empty key"))?;
        let mut t = &mut table;
        for p in path {
            let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = entry.as_table_mut().ok_or_else(|| anyhow::anyhow!("--set {s}: `{p}` is not a table"))?;
        }
        t.insert(last.to_owned(), value);
    }
    Ok(table)
}

/// A TOML value (number, boolean, array, inline table, quoted string) or else a bare string.
fn parse_value(v: &str) -> toml::Value {
    format!("v = {v}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_owned()))
}

/// Builds the component of `kind` from a configuration table; unknown keys are errors.
pub fn make(kind: Kind, name: &str, table: toml::Table) -> anyhow::Result<Box<dyn Component>> {
    use daqflow_evb::{bu, evm, ru, source};
    let what = |e: toml::de::Error| anyhow::anyhow!("configuration of {name}: {}", e.message());
    Ok(match kind {
        Kind::Source => Box::new(source::Source::new(name, table.try_into().map_err(what)?)),
        Kind::Evm => Box::new(evm::Evm::new(name, table.try_into().map_err(what)?)),
        Kind::Ru => Box::new(ru::Ru::new(name, table.try_into().map_err(what)?)),
        Kind::Bu => Box::new(bu::Bu::new(name, table.try_into().map_err(what)?)),
    })
}

fn reply(out: &Mutex<std::io::Stdout>, v: &Value) {
    let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

/// Runs one command; the JSON answer.
fn command(c: &mut dyn Component, line: &str) -> (Value, bool) {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("");
    let arg = words.next();
    let result: Result<Value, String> = match verb {
        "configure" => c.configure().map_err(|e| e.to_string()),
        "start" => match arg.map(str::parse::<u32>) {
            Some(Ok(run)) => c.start(run).map(|()| json!({ "run": run })).map_err(|e| e.to_string()),
            _ => Err("usage: start RUN".into()),
        },
        "stop" => match arg.map(str::parse::<u64>).transpose() {
            Ok(a) => c.stop(a).map_err(|e| e.to_string()),
            Err(_) => Err("usage: stop [LAST_EVENT]".into()),
        },
        "pause" => c.pause().map(|()| Value::Null).map_err(|e| e.to_string()),
        "resume" => c.resume().map(|()| Value::Null).map_err(|e| e.to_string()),
        "stats" => Ok(c.stats()),
        "state" => Ok(json!({ "failure": c.failure() })),
        "reset" => c.reset().map(|()| Value::Null).map_err(|e| e.to_string()),
        "quit" => return (json!({ "ok": true, "state": c.state().name() }), true),
        "" => return (Value::Null, false),
        other => Err(format!(
            "unknown command `{other}` (configure, start RUN, pause, resume, stop [N], stats, state, reset, quit)"
        )),
    };
    let state = c.state().name();
    let v = match result {
        Ok(r) => json!({ "ok": true, "state": state, "result": r }),
        Err(e) => json!({ "ok": false, "state": state, "error": e }),
    };
    (v, false)
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    set_process_name(&args.name);
    let table = config_table(args.config.as_ref(), &args.set)?;
    let component = Arc::new(Mutex::new(make(args.kind, &args.name, table)?));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let quit = Arc::new(AtomicBool::new(false));
    // Report a failure during the run as soon as it happens.
    {
        let (component, out, quit) = (component.clone(), out.clone(), quit.clone());
        std::thread::Builder::new().name("failure-watch".into()).spawn(move || {
            let mut reported: Option<String> = None;
            while !quit.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                let Ok(c) = component.try_lock() else { continue };
                let f = c.failure();
                drop(c);
                if f.is_some() && f != reported {
                    reply(&out, &json!({ "event": "error", "error": f }));
                    reported = f;
                }
            }
        })?;
    }
    let stop_signal = install_signal_flag()?;
    if let Some(run) = args.start {
        let mut c = component.lock().unwrap_or_else(|p| p.into_inner());
        let info = c.configure().map_err(|e| anyhow::anyhow!("{}: {e}", args.name))?;
        c.start(run).map_err(|e| anyhow::anyhow!("{}: {e}", args.name))?;
        reply(&out, &json!({ "ok": true, "state": c.state().name(), "result": info }));
    }
    // Commands from stdin on a thread, so that a signal is seen while no command comes.
    let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
    let mut link = match &args.control {
        Some(addr) => Some(ControlLink::start(addr, &args.name, tx.clone())?),
        None => None,
    };
    let stdin_ends = link.is_none();
    if let Some(l) = link.as_mut() {
        let c = component.lock().unwrap_or_else(|p| p.into_inner());
        l.publish(c.as_ref(), None, true);
    }
    std::thread::Builder::new().name("stdin".into()).spawn(move || {
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
        if stdin_ends {
            let _ = tx.send(None);
        }
    })?;
    let mut next_publish = std::time::Instant::now();
    loop {
        let line = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if stop_signal.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(l) = link.as_mut() {
                    let c = component.lock().unwrap_or_else(|p| p.into_inner());
                    let force = std::time::Instant::now() >= next_publish;
                    l.publish(c.as_ref(), None, force);
                    if force {
                        next_publish = std::time::Instant::now() + Duration::from_secs(1);
                    }
                }
                continue;
            }
            Err(_) => break,
        };
        let mut c = component.lock().unwrap_or_else(|p| p.into_inner());
        let (v, done) = command(c.as_mut(), line.trim());
        if let Some(l) = link.as_mut() {
            l.publish(c.as_ref(), Some(&v), true);
        }
        drop(c);
        if !v.is_null() {
            reply(&out, &v);
        }
        if done {
            break;
        }
    }
    // End of input, quit or a signal: end a run in progress with its summary.
    let mut c = component.lock().unwrap_or_else(|p| p.into_inner());
    let failed = c.failure().is_some();
    use daqflow_evb::component::State;
    if matches!(c.state(), State::Running | State::Paused | State::Error) {
        match c.stop(None) {
            Ok(summary) => reply(&out, &json!({ "ok": true, "state": c.state().name(), "result": summary })),
            Err(e) => reply(&out, &json!({ "ok": false, "state": c.state().name(), "error": e.to_string() })),
        }
    }
    let _ = c.reset();
    if let Some(l) = link.as_mut() {
        l.publish(c.as_ref(), None, true);
        l.dialog.shutdown();
    }
    quit.store(true, Ordering::Relaxed);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Names the process after the component (what `ps` and `top` show; at most 15 bytes).
fn set_process_name(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from `buf`, which
    // lives across the call and ends with a NUL.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// A flag set by SIGTERM or SIGINT.
pub fn install_signal_flag() -> anyhow::Result<&'static AtomicBool> {
    static FLAG: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        FLAG.store(true, Ordering::SeqCst);
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_signal` is async-signal-safe (one atomic store) and lives for the whole
        // program; `signal` only replaces the disposition of these two signals.
        let r = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        if r == libc::SIG_ERR {
            bail!("installing the signal handler failed");
        }
    }
    Ok(&FLAG)
}
