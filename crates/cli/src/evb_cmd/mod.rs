//! `daqflow evb local`: a whole event builder on this machine. Its arguments become a system
//! file ([`system`]: the EVM, the RUs, their sources, the BUs) that the operator runs like any
//! other (`Operator::launch` → configure → start → stop → shutdown): every component is a child
//! process of the operator, and what a run built and lost is the operator's accounting, its
//! `RunSummary`, and nothing else. The same machinery measures `daqflow bench evb`.

mod system;
mod window;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use daqflow_api::{RunSummary, SystemState, SystemStatus};
use daqflow_component::stdin::Line;
use daqflow_component::{Command, Stats};
use daqflow_evb::model::SizeModel;
use daqflow_evb::stats::{BuDetail, EvmDetail, RuDetail};
use daqflow_runcontrol::operator::{Operator, OperatorError, OperatorOptions};
use daqflow_runcontrol::system::SystemFile;
use serde_json::{Value, json};

use self::system::Plan;
use self::window::{Quantity, Window};
use crate::child::Child;

pub const AFTER_HELP: &str = "Examples:\n  \
    daqflow evb local                                        2 RUs × 2 BUs × 4 streams, 5 s, 1 KiB fragments\n  \
    daqflow evb local --rus 1 --bus 1 --streams 8 --fragment-size 16384 --seconds 10\n  \
    daqflow evb local --size lognormal:2048:1024 --output /dev/shm/evb --threads 2\n  \
    daqflow evb local --stream-table streams.txt --reject 0.5\n  \
    daqflow evb local --kill bu-1@2 --output /tmp/evb      kill BU 1 with SIGKILL after 2 s: lost must stay 0\n  \
    daqflow evb local --kill ru-0@2                          an RU dies: the run stops with an error, no hang\n  \
    daqflow evb local --join-bu 2 --seconds 4                one more BU joins after 2 s\n  \
    daqflow evb local --print-config > evb.toml              the system file it runs (`daqflow run evb.toml`)\n\n\
    The arguments become a system file (the EVM, the RUs, their sources, the BUs) that the\n\
    operator runs: every component is a `daqflow component KIND` process, a component that dies\n\
    or fails stops the run, and the summary is the operator's accounting. It ends with a line\n\
    `lost: N`; the exit status is 0 only when N is 0 and no component failed (with --kill, the\n\
    victim's own death is the drill, not a failure; what it causes is judged).\n\n\
    The operator's logs (logs/NAME.log) and run database go to --data DIR, else to a fresh\n\
    directory under the system's temporary directory, removed after a run that went well.\n\n\
    --json prints one JSON object: `lost` (the operator's, null when its accounting is incomplete),\n\
    `clean`, `measured` (`events_per_s`, `ru_mb_per_s`, `bu_mb_per_s` over the window, `from_s`,\n\
    `seconds`), `killed` (names), `joined` (the --join-bu BU: `name`, `at_s`, `killed`, `summary`,\n\
    `errors`), `errors`, `data` (the kept directory, or null), `system_file` (its text) and `run`:\n\
    the operator's RunSummary (`events`, `triggered`, `lost_reasons`, `components.NAME.summary`\n\
    with each component's statistics, `files`, …). docs/evb.md, \"evb local\", says more.";

/// Arguments of `daqflow evb`.
#[derive(clap::Args, Debug)]
pub struct EvbArgs {
    #[command(subcommand)]
    pub command: EvbCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum EvbCommand {
    /// Run a whole builder on this machine (a generated system file, run by the operator), take
    /// a run, print a summary.
    #[command(after_help = AFTER_HELP)]
    Local(LocalArgs),
}

/// Arguments of `daqflow evb local`.
#[derive(clap::Args, Debug, Clone)]
pub struct LocalArgs {
    /// Readout units.
    #[arg(long, default_value_t = 2)]
    pub rus: u32,
    /// Builder units.
    #[arg(long, default_value_t = 2)]
    pub bus: u32,
    /// Source streams per RU.
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Length of the run in seconds (a short run goes on until the window has a second
    /// reading of every component: statistics are published once a second).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Fixed fragment payload size in bytes (see --size for other models).
    #[arg(long, default_value_t = 1024)]
    pub fragment_size: usize,
    /// Size model: fixed:BYTES, uniform:MIN:MAX or lognormal:MEAN:RMS (overrides --fragment-size).
    #[arg(long, value_name = "MODEL")]
    pub size: Option<String>,
    /// A table of streams `source_id mean_bytes rms_bytes` (log-normal per stream); sources
    /// are numbered RU × streams + k.
    #[arg(long, value_name = "FILE")]
    pub stream_table: Option<PathBuf>,
    /// Write the built events as data files into DIR (default: discard them).
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Put the built events into the ET system NAME (it must be running).
    #[arg(long, value_name = "NAME", conflicts_with = "output")]
    pub et: Option<String>,
    /// Builder threads per BU.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Skip the BUs' CRC check of every fragment (event ids and structure are still checked).
    #[arg(long)]
    pub no_crc: bool,
    /// Pace the sources at this trigger rate in Hz (default: free-running).
    #[arg(long, value_name = "HZ")]
    pub rate: Option<f64>,
    /// Fraction of events the EVM's level-2 emulation rejects.
    #[arg(long, default_value_t = 0.0)]
    pub reject: f64,
    /// Events in flight per BU.
    #[arg(long)]
    pub credits: Option<u32>,
    /// Sources send one cached pattern with fresh headers (its CRCs computed once per size, cheap) instead of writing
    /// each event's pattern.
    #[arg(long)]
    pub cached_payload: bool,
    /// Run number (taken once per run database: with --data, use a new one for each run).
    #[arg(long, default_value_t = 1)]
    pub run: u32,
    /// Kill component NAME (evm, ru-N, bu-N, src-N) with SIGKILL after SECS seconds (failure
    /// test): `NAME@SECS`. A component that dies stops the run (the operator's policy `stop`):
    /// the EVM re-assigns a dead BU's events at once and the others build them before its
    /// drain ends, so nothing is lost; a dead RU, source or EVM ends the run with an error.
    #[arg(long, value_name = "NAME@SECS")]
    pub kill: Option<String>,
    /// Start one more BU (bu-N, N = --bus) after SECS seconds: a `daqflow component bu`
    /// process of its own on the operator's control plane, configured and started over its
    /// standard input and stopped after the operator's stop; the EVM counts what it builds.
    #[arg(long, value_name = "SECS")]
    pub join_bu: Option<f64>,
    /// Corrupt one payload byte of event EVENT from source SOURCE (after its CRC): `SOURCE:EVENT`.
    #[arg(long, value_name = "SOURCE:EVENT")]
    pub corrupt: Option<String>,
    /// Print the summary as JSON (no progress lines; keys below).
    #[arg(long)]
    pub json: bool,
    /// Extra configuration for every component of a kind (evm, ru, bu, source):
    /// KIND.KEY=VALUE (e.g. ru.buffer_bytes=1e8, source.size.rms=256).
    #[arg(long = "set", value_name = "KIND.KEY=VALUE")]
    pub set: Vec<String>,
    /// Pin every component of a kind (evm, ru, bu, source) to CPUs: KIND=LIST in the kernel's
    /// list form (e.g. `--cpus ru=0 --cpus bu=1`): the system file's `cpus = [..]`. A thread
    /// role inside it: `--set ru.io_cpus=[0]`, `--set bu.build_cpus=[1]`.
    #[arg(long = "cpus", value_name = "KIND=LIST")]
    pub cpus: Vec<String>,
    /// The operator's data directory (logs/NAME.log, runs.sqlite, the system file), kept;
    /// default: a fresh one under the system's temporary directory, removed unless the run
    /// failed.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Time-stamp the EVM, the RUs and the BUs (their scheduler tasks and the builder's probes:
    /// receive, assemble, request, build, write); each writes DIR/NAME-runN.prof at the run's
    /// end, for `daqflow profile`.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// Print the system file these arguments make and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Run the RUs, each with its sources, on these hosts (RU r on the (r mod N)-th), started
    /// through --remote-command; every listener then binds a wildcard and tells the address
    /// the others reach (docs/deployment.md).
    #[arg(long, value_name = "HOST,HOST…", value_delimiter = ',')]
    pub ru_hosts: Vec<String>,
    /// Run the BUs on these hosts (BU b on the (b mod N)-th), as --ru-hosts.
    #[arg(long, value_name = "HOST,HOST…", value_delimiter = ',')]
    pub bu_hosts: Vec<String>,
    /// How a component on another host is started (the system file's `remote_command`).
    #[arg(long, value_name = "COMMAND")]
    pub remote_command: Option<String>,
    /// The control server's address (the system file's `control`; default `127.0.0.1:0`, or
    /// `0.0.0.0:0` with --ru-hosts or --bu-hosts).
    #[arg(long, value_name = "ADDR")]
    pub control: Option<String>,
}

impl Default for LocalArgs {
    fn default() -> Self {
        LocalArgs {
            rus: 2,
            bus: 2,
            streams: 4,
            seconds: 5.0,
            fragment_size: 1024,
            size: None,
            stream_table: None,
            output: None,
            et: None,
            threads: 1,
            no_crc: false,
            rate: None,
            reject: 0.0,
            credits: None,
            cached_payload: false,
            run: 1,
            kill: None,
            join_bu: None,
            corrupt: None,
            json: false,
            set: Vec::new(),
            cpus: Vec::new(),
            data: None,
            profile: None,
            print_config: false,
            ru_hosts: Vec::new(),
            bu_hosts: Vec::new(),
            remote_command: None,
            control: None,
        }
    }
}

/// Parses `fixed:B`, `uniform:MIN:MAX`, `lognormal:MEAN:RMS`.
pub fn parse_size(s: &str) -> anyhow::Result<SizeModel> {
    let parts: Vec<&str> = s.split(':').collect();
    let num = |x: &str| x.parse::<f64>().with_context(|| format!("size model `{s}`: `{x}` is not a number"));
    let m = match parts.as_slice() {
        ["fixed", b] => SizeModel::Fixed { bytes: num(b)? as usize },
        ["uniform", a, b] => SizeModel::Uniform { min: num(a)? as usize, max: num(b)? as usize },
        ["lognormal", m, r] => SizeModel::LogNormal { mean: num(m)?, rms: num(r)? },
        _ => bail!("size model `{s}`: expected fixed:BYTES, uniform:MIN:MAX or lognormal:MEAN:RMS"),
    };
    m.validate().map_err(|e| anyhow::anyhow!(e))?;
    Ok(m)
}

/// The system file `args` make (what `--print-config` prints).
pub fn system_file_text(args: &LocalArgs) -> anyhow::Result<String> {
    Ok(system::system_text(args, &Plan::new(args)?))
}

/// The BU started after the others (`--join-bu`).
#[derive(Debug, Clone)]
pub struct Joined {
    /// Its name (`bu-N`, N = `--bus`).
    pub name: String,
    /// When it joined (seconds into the run).
    pub at_s: f64,
    /// It was killed (`--kill`).
    pub killed: bool,
    /// Its stop summary (none: it was killed, or did not answer).
    pub summary: Option<Stats>,
    /// What went wrong with it.
    pub errors: Vec<String>,
}

/// What a local run measured.
#[derive(Debug, Clone)]
pub struct LocalResult {
    /// The operator's summary of the run: its accounting and every component's summary.
    pub run: RunSummary,
    /// Events lost: the operator's `lost`; `None` when its accounting is incomplete (the EVM
    /// died).
    pub lost: Option<u64>,
    /// Events built per second in the measurement window.
    pub events_per_s: f64,
    /// Fragment MB/s into all RUs in the window.
    pub ru_mb_per_s: f64,
    /// Event MB/s out of all BUs in the window.
    pub bu_mb_per_s: f64,
    /// The window's length on the EVM's clock, and where it opened (seconds into the run).
    pub window_s: f64,
    /// The warm-up: the window opened at the first statistics after it.
    pub warmup_s: f64,
    /// The run's errors (the operator's), then what each component reported, each once.
    pub errors: Vec<String>,
    /// Whether nothing failed but the drill itself (`--kill`'s victim's own death).
    pub clean: bool,
    /// Components killed by `--kill`.
    pub killed: Vec<String>,
    /// The BU of `--join-bu`.
    pub joined: Option<Joined>,
    /// The operator's data directory, if it was kept (`--data`, or a run that failed).
    pub data: Option<PathBuf>,
    /// The system file the operator ran.
    pub system: String,
}

impl LocalResult {
    /// Whether the run went well: nothing lost, everything accounted, nothing failed.
    pub fn ok(&self) -> bool {
        self.clean && self.lost == Some(0)
    }

    /// The JSON summary of `--json` (its keys are documented in [`AFTER_HELP`]).
    pub fn to_json(&self) -> Value {
        json!({
            "lost": self.lost,
            "clean": self.clean,
            "measured": {
                "events_per_s": self.events_per_s,
                "ru_mb_per_s": self.ru_mb_per_s,
                "bu_mb_per_s": self.bu_mb_per_s,
                "from_s": self.warmup_s,
                "seconds": self.window_s,
            },
            "killed": self.killed,
            "joined": self.joined.iter().map(|j| json!({
                "name": j.name, "at_s": j.at_s, "summary": j.summary, "errors": j.errors,
            })).collect::<Vec<_>>(),
            "errors": self.errors,
            "data": self.data,
            "system_file": self.system,
            "run": self.run,
        })
    }
}

/// Longest wait for the late BU's answer to one command.
const CALL: Duration = Duration::from_secs(30);

/// The operator's data directory for one run.
struct DataDir {
    path: PathBuf,
    /// Made here (removed after a run that went well), not given with `--data`.
    temporary: bool,
}

impl DataDir {
    fn new(given: Option<&Path>) -> anyhow::Result<DataDir> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let (path, temporary) = match given {
            Some(d) => (std::path::absolute(d).with_context(|| format!("--data {}", d.display()))?, false),
            None => {
                let n = RUNS.fetch_add(1, Ordering::Relaxed);
                let p = std::env::temp_dir().join(format!("daqflow-evb-local-{}-{n}", std::process::id()));
                if p.exists() {
                    std::fs::remove_dir_all(&p).with_context(|| format!("removing the old {}", p.display()))?;
                }
                (p, true)
            }
        };
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(DataDir { path, temporary })
    }

    /// Removes a temporary directory unless `keep`; the path when it stays.
    fn finish(self, keep: bool) -> Option<PathBuf> {
        if self.temporary && !keep {
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                eprintln!("evb local: could not remove {}: {e}", self.path.display());
            }
            return None;
        }
        if self.temporary {
            eprintln!("evb local: the operator's logs and run database are kept in {}", self.path.display());
        }
        Some(self.path)
    }
}

/// Runs a whole builder: the system file `args` make, run by the operator for one run;
/// `progress` prints a line a second. The window opens after `warmup` seconds.
pub fn run_local(args: &LocalArgs, warmup: f64, progress: bool) -> anyhow::Result<LocalResult> {
    let plan = Plan::new(args)?;
    let late_name = args.join_bu.map(|_| format!("bu-{}", args.bus));
    let names = system::component_names(args);
    if let Some((victim, _)) = &plan.kill
        && !names.contains(victim)
        && late_name.as_ref() != Some(victim)
    {
        bail!("--kill {victim}: no component of that name (evm, ru-N, src-N, bu-N)");
    }
    let text = system::system_text(args, &plan);
    let file = SystemFile::parse(&text, &daqflow::registry::standard())
        .map_err(|e| anyhow::anyhow!("the generated system file has problems:\n{e}\n\n{text}"))?;
    let data = DataDir::new(args.data.as_deref())?;
    let system_path = data.path.join("evb-local.toml");
    std::fs::write(&system_path, &text).with_context(|| format!("writing {}", system_path.display()))?;
    // The operator takes this process's token, and so does the late BU, which gets it from here.
    crate::ensure_process_token()?;
    let mut options = OperatorOptions::new(file, crate::child::self_exe()?);
    options.data = Some(data.path.clone());
    let op = match Operator::launch(options) {
        Ok(op) => op,
        Err(e) => {
            let kept = data.finish(true).unwrap_or_default();
            bail!("starting the system: {e} (logs in {})", kept.join("logs").display());
        }
    };
    let taken = take_run(&op, args, &plan, late_name, warmup, progress);
    op.shutdown();
    match taken {
        Ok(mut r) => {
            r.system = text;
            r.data = data.finish(!r.ok());
            Ok(r)
        }
        Err(e) => {
            let kept = data.finish(true).unwrap_or_default();
            Err(e.context(format!("the operator's logs and run database are in {}", kept.display())))
        }
    }
}

/// The BU started after the others, over its standard input.
struct Late {
    child: Child,
    at_s: f64,
}

/// Configure, start, the run (progress, the drill, the window), stop: the result, before the
/// operator is shut down.
fn take_run(
    op: &Operator,
    args: &LocalArgs,
    plan: &Plan,
    late_name: Option<String>,
    warmup: f64,
    progress: bool,
) -> anyhow::Result<LocalResult> {
    let infos = op.configure().context("configuring the system")?;
    let evm_addr = infos.get("evm").and_then(|i| i.get("listen")).and_then(Value::as_str).map(str::to_owned);
    let stop_signal = crate::component_cmd::install_signal_flag()?;
    let run = op.start(Some(args.run)).with_context(|| format!("starting run {}", args.run))?;
    let t0 = Instant::now();
    let mut window = Window::new(warmup);
    let mut late: Option<Late> = None;
    let mut killed: Vec<String> = Vec::new();
    let mut next_print = 1.0;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let t = t0.elapsed().as_secs_f64();
        let status = op.status();
        window.observe_status(&status);
        let late_stats = late.as_mut().filter(|l| !l.child.killed()).and_then(|l| {
            let s = l.child.call(Line::Stats, CALL).ok().and_then(|v| serde_json::from_value::<Stats>(v).ok())?;
            window.observe(&l.child.name, Quantity::EventBytes, Some(l.child.pid()), true, &s);
            Some(s)
        });
        if stop_signal.load(Ordering::Relaxed) {
            break;
        }
        if !op.run_open() || matches!(status.state, SystemState::Stopping | SystemState::Error) {
            if progress {
                let why = status.components.iter().find_map(|c| c.error.as_ref().map(|e| format!("{}: {e}", c.name)));
                println!(
                    "{t:5.1} s  the operator stops the run ({})",
                    why.unwrap_or_else(|| "a component failed".into())
                );
            }
            break;
        }
        // The late BU can be killed once it is there.
        if let Some((victim, at)) = &plan.kill
            && t >= *at
            && !killed.contains(victim)
            && (late_name.as_ref() != Some(victim) || late.is_some())
        {
            kill(victim, &status, late.as_mut(), t, progress)?;
            killed.push(victim.clone());
        }
        if let (Some(at), Some(name)) = (args.join_bu, &late_name)
            && t >= at
            && late.is_none()
        {
            let evm = evm_addr.as_deref().context("the EVM told no address at configure")?;
            let sets = system::bu_params(args, plan, args.bus, evm).to_sets();
            let mut child = Child::spawn_with_control("bu", name, &sets, Some(&op.control_list()))?;
            child.call(Line::Command(Command::Configure { config: None }), CALL)?;
            child.call(Line::Command(Command::Start { run }), CALL)?;
            if progress {
                println!("{t:5.1} s  {name} joined (pid {})", child.pid());
            }
            late = Some(Late { child, at_s: t });
        }
        if progress && t >= next_print {
            println!("{}", progress_line(t, &status, late_stats.as_ref()));
            let _ = std::io::stdout().flush();
            next_print += 1.0;
        }
        // The run is long enough once the window has two readings of every component (at most
        // a few seconds past its length: statistics come once a second).
        if t >= args.seconds && (window.complete(&status) || t >= args.seconds + 3.0) {
            break;
        }
    }
    let measured = window.measured();
    let summary = stop(op)?;
    let status = op.status();
    let joined = late.map(|mut l| {
        let mut errors = Vec::new();
        let summary = if l.child.killed() {
            None
        } else {
            match l.child.call(Line::Command(Command::Stop { last_event: None }), Duration::from_secs(60)) {
                Ok(v) => serde_json::from_value::<Stats>(v).ok(),
                Err(e) => {
                    errors.push(e.to_string());
                    None
                }
            }
        };
        l.child.drain_events();
        errors.extend(l.child.errors.iter().map(|e| format!("{}: {e}", l.child.name)));
        l.child.finish();
        if let Some(s) = &summary {
            errors.extend(reported_errors(&l.child.name, s));
        }
        Joined { name: l.child.name.clone(), at_s: l.at_s, killed: l.child.killed(), summary, errors }
    });
    let mut errors: Vec<String> = Vec::new();
    let mut add = |e: String| {
        if !errors.contains(&e) {
            errors.push(e);
        }
    };
    summary.errors.iter().cloned().for_each(&mut add);
    summary.file_problems.iter().map(|p| format!("data file: {p}")).for_each(&mut add);
    for c in &status.components {
        if let Some(record) = summary.components.get(&c.name)
            && let Some(stats) = record.summary.as_ref().or(record.last_stats.as_ref())
        {
            reported_errors(&c.name, stats).into_iter().for_each(&mut add);
        }
        // A dead one is in the run's errors already, and in `died`.
        if let Some(e) = c.error.as_ref().filter(|_| c.alive) {
            add(format!("{}: {e}", c.name));
        }
    }
    joined.iter().flat_map(|j| j.errors.iter().cloned()).for_each(&mut add);
    // The drill's victim dying is what was asked for: while it stayed dead, the errors that
    // name it first are its own death's; what the others report is judged.
    let dead = |v: &&String| {
        summary.died.iter().any(|d| &d.component == *v) || joined.as_ref().is_some_and(|j| &j.name == *v && j.killed)
    };
    let own = |e: &String| {
        killed.iter().filter(dead).any(|v| e.starts_with(&format!("{v}:")) || e.starts_with(&format!("{v} ")))
    };
    let clean = errors.iter().all(own);
    Ok(LocalResult {
        lost: summary.accounting_complete.then_some(summary.lost),
        run: summary,
        events_per_s: measured.events_per_s,
        ru_mb_per_s: measured.ru_mb_per_s,
        bu_mb_per_s: measured.bu_mb_per_s,
        window_s: measured.seconds,
        warmup_s: warmup,
        errors,
        clean,
        killed,
        joined,
        data: None,
        system: String::new(),
    })
}

/// Stops the run, or waits for the stop the operator's policy began: its summary.
fn stop(op: &Operator) -> anyhow::Result<RunSummary> {
    match op.stop() {
        Ok(s) => return Ok(s),
        Err(OperatorError::Busy(_) | OperatorError::IllegalTransition { .. }) => {}
        Err(e) => return Err(anyhow::Error::new(e).context("stopping the run")),
    }
    let limit =
        Duration::try_from_secs_f64(op.file().system.stop_timeout_s * 8.0 + 60.0).unwrap_or(Duration::from_secs(600));
    if !op.wait_run_closed(limit) {
        bail!("the run is being stopped by the operator and is still open after {:.0} s", limit.as_secs_f64());
    }
    op.last_summary().context("the run was closed without a summary")
}

/// Kills `victim` with SIGKILL: a component of the operator (its pid from the status), or the
/// late BU.
fn kill(victim: &str, status: &SystemStatus, late: Option<&mut Late>, t: f64, progress: bool) -> anyhow::Result<()> {
    if let Some(l) = late.filter(|l| l.child.name == victim) {
        if progress {
            println!("{t:5.1} s  killing {victim} (pid {}) with SIGKILL", l.child.pid());
        }
        l.child.kill();
        return Ok(());
    }
    let Some(c) = status.components.iter().find(|c| c.name == victim) else {
        bail!("--kill {victim}: no such component (a late BU is killed only once it joined)");
    };
    let pid = c.pid.filter(|_| c.alive).with_context(|| format!("--kill {victim}: its process is not running"))?;
    let pid = libc::pid_t::try_from(pid).with_context(|| format!("--kill {victim}: pid {pid}"))?;
    if progress {
        println!("{t:5.1} s  killing {victim} (pid {pid}) with SIGKILL");
    }
    // SAFETY: kill(2) with a process id and a signal number; no memory is involved. The pid is
    // that of a component process the operator started and still follows.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        bail!("--kill {victim}: kill({pid}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a component's statistics say went wrong: the trigger's abort reason, the kind's
/// `detail.error` and `detail.errors`.
fn reported_errors(name: &str, stats: &Stats) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(e) = stats.trigger.as_ref().and_then(|t| t.error.as_ref()) {
        v.push(format!("{name}: {e}"));
    }
    if let Some(e) = stats.detail.get("error").and_then(Value::as_str) {
        v.push(format!("{name}: {e}"));
    }
    for e in stats.detail.get("errors").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        v.push(format!("{name}: {e}"));
    }
    v
}

/// One progress line from the operator's status: the EVM's events built, its rate and events
/// in flight, the BUs' MB/s out, the system's state.
fn progress_line(t: f64, status: &SystemStatus, late: Option<&Stats>) -> String {
    let evm = status.components.iter().find(|c| c.kind == "evm");
    let built = evm.and_then(|c| c.stats.trigger.as_ref()).map_or(0, |tc| tc.built);
    let detail: EvmDetail = evm.and_then(|c| c.stats.detail_as()).unwrap_or_default();
    let mb: f64 = status.components.iter().filter(|c| c.kind == "bu" && c.alive).map(|c| c.stats.mb_per_s).sum::<f64>()
        + late.map_or(0.0, |s| s.mb_per_s);
    format!(
        "{t:5.1} s  built {built:>10}  {:>9}/s  {:>10}  in flight {:>6}  state {}",
        crate::format::si(detail.built_per_s),
        format!("{mb:.1} MB/s"),
        detail.in_flight,
        status.state.name(),
    )
}

pub fn run(args: &EvbArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        EvbCommand::Local(local) => {
            if local.print_config {
                print!("{}", system_file_text(local)?);
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(dir) = &local.output {
                crate::ensure_dir(dir)?;
            }
            let warmup = (local.seconds * 0.2).min(1.0);
            if !local.json {
                println!(
                    "event builder: EVM, {} RU(s) × {} stream(s), {} BU(s) × {} thread(s), {:.0} s{}",
                    local.rus,
                    local.streams,
                    local.bus,
                    local.threads,
                    local.seconds,
                    local.output.as_ref().map(|d| format!(", files in {}", d.display())).unwrap_or_default()
                );
            }
            let r = run_local(local, warmup, !local.json)?;
            if local.json {
                println!("{}", serde_json::to_string_pretty(&r.to_json())?);
            } else {
                print_summary(local, &r);
            }
            Ok(if r.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

/// A component's counters in the run: its stop summary, or its last statistics when it died.
fn counters<'a>(run: &'a RunSummary, name: &str) -> Option<&'a Stats> {
    run.components.get(name).and_then(|c| c.summary.as_ref().or(c.last_stats.as_ref()))
}

fn print_summary(args: &LocalArgs, r: &LocalResult) {
    let s = &r.run;
    let si = crate::format::si;
    let count = |n: Option<u64>| n.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
    println!();
    let evm = s.components.get("evm").and_then(|c| c.summary.as_ref());
    match evm {
        Some(stats) => {
            let d: EvmDetail = stats.detail_as().unwrap_or_default();
            println!("run {} ({}): last event {}", s.run, s.state.name(), count(d.last_event));
            println!(
                "  events: triggered {}, built {}, rejected (level 2) {}, re-assigned {}",
                count(s.triggered),
                s.events,
                count(s.rejected),
                d.reassigned
            );
        }
        None => println!("run {} ({}): no accounting from the EVM (it gave no summary)", s.run, s.state.name()),
    }
    if r.window_s > 0.0 {
        println!(
            "  rate (after warm-up, {:.1} s window): {} events/s, {:.1} MB/s into the RUs, {:.1} MB/s out of the BUs",
            r.window_s,
            si(r.events_per_s),
            r.ru_mb_per_s,
            r.bu_mb_per_s
        );
    } else {
        println!("  rate: not measured (the run ended before the EVM published twice after the warm-up)");
    }
    let died = |name: &str| s.died.iter().find(|d| d.component == name).map(|d| format!(" (died: {})", d.why));
    for r_id in 0..args.rus {
        let name = format!("ru-{r_id}");
        let Some(stats) = counters(s, &name) else { continue };
        let d: RuDetail = stats.detail_as().unwrap_or_default();
        println!(
            "  {name}: {} fragments, {:.1} MB/s, {} super-fragments, sequence errors {}, CRC errors {}{}",
            d.counters.fragments,
            d.fragment_mb_per_s,
            d.counters.super_fragments,
            d.counters.sequence_errors,
            d.counters.crc_errors,
            died(&name).unwrap_or_default()
        );
    }
    let bu_line = |name: &str, stats: &Stats, files: usize, note: &str| {
        let d: BuDetail = stats.detail_as().unwrap_or_default();
        println!(
            "  {name}: {} events built, {}/s, {:.1} MB/s, flagged {} (CRC errors {}){}{note}",
            stats.events,
            si(stats.events_per_s),
            stats.mb_per_s,
            d.events_flagged,
            d.crc_errors,
            if files > 0 { format!(", {files} file(s)") } else { String::new() },
        );
    };
    for b in 0..args.bus {
        let name = format!("bu-{b}");
        let Some(stats) = counters(s, &name) else { continue };
        let files = s.files.iter().filter(|f| f.component == name).count();
        bu_line(&name, stats, files, &died(&name).unwrap_or_default());
    }
    if let Some(j) = &r.joined {
        let note = format!(" (joined at {:.1} s)", j.at_s);
        match &j.summary {
            Some(stats) => {
                let files = stats.detail_as::<BuDetail>().map_or(0, |d| d.files.len());
                bu_line(&j.name, stats, files, &note);
            }
            None => println!("  {}: no summary{note}", j.name),
        }
    }
    for k in &r.killed {
        println!("  {k}: killed during the run (the drill)");
    }
    for d in s.died.iter().filter(|d| !r.killed.contains(&d.component)) {
        println!("  {}: died during the run ({})", d.component, d.why);
    }
    for l in &s.lost_reasons {
        println!("  lost {}: {}", l.events, l.reason);
    }
    for u in &s.unknown {
        println!("  unknown: {u}");
    }
    for e in &r.errors {
        println!("  error: {e}");
    }
    if let Some(d) = &r.data {
        println!("  the operator's logs and run database: {}", d.display());
    }
    if s.accounting_complete {
        println!("lost: {}", s.lost);
    } else {
        println!("lost: at least {} (the accounting is incomplete: see `unknown`)", s.lost);
    }
}
