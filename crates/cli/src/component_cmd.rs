//! `daqflow component KIND`: one component as a process, driven by line commands on its standard
//! input (what `daqflow bench chain`, the late builder unit of `daqflow evb local --join-bu` and
//! scripts use; the operator drives the same components over the control plane).
//!
//! Commands, one per line: `configure`, `start RUN`, `pause`, `resume`, `stop [ARG]`, `stats`,
//! `state`, `reset`, `quit`. Every command gets exactly one JSON line on standard output:
//! `{"ok":true,"state":"Running","result":…}` or `{"ok":false,"state":…,"error":"…"}`. When the
//! component fails during a run, a line `{"event":"error","error":"…"}` appears by itself. End of
//! input stops a running component and exits; so does SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

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
    Configuration keys: docs/evb.md (source, evm, ru, bu) and docs/operator-guide.md (et, recorder,\n\
    monitor, msglogger, generator, repeater, sink).";

/// Arguments of `daqflow component`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to run: source, evm, ru, bu (the event builder), et, recorder, monitor, msglogger,
    /// generator, repeater, sink.
    pub kind: String,
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
    /// `NAME/configure` (payload: optional {"config": {…}} merged over the configuration),
    /// `NAME/start` (payload: the run number), `NAME/pause`, `NAME/resume`, `NAME/stop`
    /// (payload: optional last event), `NAME/reset`, and the same under `all/`; publish
    /// `NAME/state`, `NAME/stats` (JSON, once a second and on every change) and `NAME/log`.
    /// The end of standard input then does not end the process; SIGTERM or Ctrl-C does.
    #[arg(long, value_name = "HOST:PORT")]
    pub control: Option<String>,
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
pub(crate) fn parse_value(v: &str) -> toml::Value {
    format!("v = {v}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_owned()))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let registry = daqflow::registry::standard();
    if !registry.kinds().contains(&args.kind.as_str()) {
        bail!("unknown component kind `{}` (known: {})", args.kind, registry.kinds().join(", "));
    }
    let options = daqflow_runcontrol::process::Options {
        kind: args.kind.clone(),
        name: args.name.clone(),
        config: config_table(args.config.as_ref(), &args.set)?,
        start: args.start,
        control: args.control.clone(),
    };
    let failed = daqflow_runcontrol::process::run(registry, options)?;
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// A flag set by SIGTERM or SIGINT.
pub fn install_signal_flag() -> anyhow::Result<&'static std::sync::atomic::AtomicBool> {
    Ok(daqflow_runcontrol::process::signal_flag()?)
}
