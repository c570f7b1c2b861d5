//! `daqflow evb local`: a whole event builder on this machine, every component a child process
//! (`daqflow component …`) driven over its standard input; and the same machinery for
//! `daqflow bench evb`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ExitCode, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use daqflow_evb::model::SizeModel;
use serde_json::{Value, json};

pub const AFTER_HELP: &str = "Examples:\n  \
    daqflow evb local                                        2 RUs × 2 BUs × 4 streams, 5 s, 1 KiB fragments\n  \
    daqflow evb local --rus 1 --bus 1 --streams 8 --fragment-size 16384 --seconds 10\n  \
    daqflow evb local --size lognormal:2048:1024 --output /dev/shm/evb --threads 2\n  \
    daqflow evb local --stream-table streams.txt --reject 0.5\n  \
    daqflow evb local --kill bu-1@2 --output /tmp/evb      kill BU 1 with SIGKILL after 2 s: lost must stay 0\n  \
    daqflow evb local --kill ru-0@2                          an RU dies: the run stops with an error, no hang\n  \
    daqflow evb local --join-bu 2 --seconds 4                one more BU joins after 2 s\n\n\
    Every component runs as `daqflow component KIND` (see its --help). The summary ends with a\n\
    line `lost: N`; the exit status is 0 only when N is 0 and no component failed.";

/// Arguments of `daqflow evb`.
#[derive(clap::Args, Debug)]
pub struct EvbArgs {
    #[command(subcommand)]
    pub command: EvbCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum EvbCommand {
    /// Start a whole builder as child processes on this machine, take a run, print a summary.
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
    /// Length of the run in seconds.
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
    /// Run number.
    #[arg(long, default_value_t = 1)]
    pub run: u32,
    /// Kill component NAME (evm, ru-N, bu-N, src-N) with SIGKILL after SECS seconds (failure
    /// test): `NAME@SECS`.
    #[arg(long, value_name = "NAME@SECS")]
    pub kill: Option<String>,
    /// Start one more BU after SECS seconds.
    #[arg(long, value_name = "SECS")]
    pub join_bu: Option<f64>,
    /// Corrupt one payload byte of event EVENT from source SOURCE (after its CRC): `SOURCE:EVENT`.
    #[arg(long, value_name = "SOURCE:EVENT")]
    pub corrupt: Option<String>,
    /// Print the summary as JSON (no progress lines).
    #[arg(long)]
    pub json: bool,
    /// Extra configuration for every component of a kind: KIND.KEY=VALUE (e.g. ru.buffer_bytes=1e8).
    #[arg(long = "set", value_name = "KIND.KEY=VALUE")]
    pub set: Vec<String>,
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
        }
    }
}

/// The running binary, for starting components: `/proc/self/exe` stays valid when the file is
/// replaced by a rebuild during a long run (its path would then name a deleted or newer file).
fn self_exe() -> anyhow::Result<PathBuf> {
    let proc = PathBuf::from("/proc/self/exe");
    if proc.exists() { Ok(proc) } else { std::env::current_exe().context("finding the daqflow binary") }
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

/// A component process driven over its standard input (`daqflow component`; also used by
/// `daqflow bench chain`).
pub(crate) struct Child {
    pub(crate) name: String,
    process: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    /// Failures the component reported by itself (`{"event":"error"}` lines).
    pub(crate) errors: Vec<String>,
    killed: bool,
}

impl Child {
    pub(crate) fn spawn(kind: &str, name: &str, sets: &[String]) -> anyhow::Result<Child> {
        let mut cmd = std::process::Command::new(self_exe()?);
        std::os::unix::process::CommandExt::arg0(&mut cmd, "daqflow");
        cmd.args(["component", kind, "--name", name]);
        // The system these children form proves one token on every connection.
        cmd.env(crate::TOKEN_ENV, crate::ensure_process_token()?.reveal());
        if std::env::var_os("DAQFLOW_LOG").is_none() {
            cmd.env("DAQFLOW_LOG", "warn");
        }
        for s in sets {
            cmd.arg("--set").arg(s);
        }
        let mut process = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdout = process.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let label = name.to_owned();
        std::thread::Builder::new().name(format!("{name}-out")).spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("{label}: {line}"),
                }
            }
        })?;
        Ok(Child {
            name: name.into(),
            stdin: process.stdin.take(),
            process,
            lines: rx,
            errors: Vec::new(),
            killed: false,
        })
    }

    /// Sends a command and waits for its answer.
    pub(crate) fn call(&mut self, command: &str, timeout: Duration) -> anyhow::Result<Value> {
        self.send(command)?;
        self.answer(command, timeout)
    }

    /// Sends a command without waiting for the answer ([`Child::answer`]).
    fn send(&mut self, command: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow::anyhow!("{}: input closed", self.name))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("{}: sending `{command}` (has it died?)", self.name))
    }

    /// Waits for the answer to `command`, sent before.
    fn answer(&mut self, command: &str, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if v.get("event").is_some() => {
                    let e = v["error"].as_str().unwrap_or("?").to_owned();
                    if !self.errors.contains(&e) {
                        self.errors.push(e);
                    }
                }
                Ok(v) => {
                    if v["ok"] == true {
                        return Ok(v["result"].clone());
                    }
                    bail!("{}: {command}: {}", self.name, v["error"].as_str().unwrap_or("failed"));
                }
                Err(RecvTimeoutError::Timeout) => bail!("{}: no answer to `{command}` within {timeout:?}", self.name),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.process.wait().map(|s| s.to_string()).unwrap_or_default();
                    bail!("{}: exited ({status}) before answering `{command}`", self.name)
                }
            }
        }
    }

    /// Errors the component reported by itself.
    pub(crate) fn drain_events(&mut self) {
        while let Ok(v) = self.lines.try_recv() {
            if v.get("event").is_some() {
                let e = v["error"].as_str().unwrap_or("?").to_owned();
                if !self.errors.contains(&e) {
                    self.errors.push(e);
                }
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        self.stdin = None;
        self.killed = true;
    }

    pub(crate) fn finish(&mut self) {
        if self.killed {
            return;
        }
        if let Some(mut s) = self.stdin.take() {
            let _ = writeln!(s, "quit");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.process.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.process.kill();
                    let _ = self.process.wait();
                    return;
                }
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.killed && matches!(self.process.try_wait(), Ok(None)) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// What a local run measured.
#[derive(Debug, Clone)]
pub struct LocalResult {
    /// The full summary (EVM, RUs, BUs, sources, measured rates).
    pub summary: Value,
    /// Events lost (`None`: no accounting, the EVM is gone).
    pub lost: Option<u64>,
    /// Events built per second in the measurement window.
    pub events_per_s: f64,
    /// Fragment MB/s into all RUs in the window.
    pub ru_mb_per_s: f64,
    /// Event MB/s out of all BUs in the window.
    pub bu_mb_per_s: f64,
    /// Whether every component ended without error.
    pub clean: bool,
}

const CALL: Duration = Duration::from_secs(30);

fn sets_for(kind: &str, args: &LocalArgs) -> Vec<String> {
    args.set.iter().filter_map(|s| s.strip_prefix(&format!("{kind}.")).map(str::to_owned)).collect()
}

fn counter(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or(0.0)
}

/// Runs a whole builder as child processes; `progress` prints a line a second.
pub fn run_local(args: &LocalArgs, warmup: f64, progress: bool) -> anyhow::Result<LocalResult> {
    let size = match &args.size {
        Some(s) => parse_size(s)?,
        None => SizeModel::Fixed { bytes: args.fragment_size },
    };
    let size_sets = match size {
        SizeModel::Fixed { bytes } => vec!["size.kind=fixed".to_owned(), format!("size.bytes={bytes}")],
        SizeModel::Uniform { min, max } => {
            vec!["size.kind=uniform".into(), format!("size.min={min}"), format!("size.max={max}")]
        }
        SizeModel::LogNormal { mean, rms } => {
            vec!["size.kind=lognormal".into(), format!("size.mean={mean:?}"), format!("size.rms={rms:?}")]
        }
    };
    let kill = match &args.kill {
        Some(s) => {
            let (name, t) = s.split_once('@').ok_or_else(|| anyhow::anyhow!("--kill {s}: expected NAME@SECS"))?;
            Some((name.to_owned(), t.parse::<f64>().with_context(|| format!("--kill {s}: bad time"))?))
        }
        None => None,
    };
    let corrupt = match &args.corrupt {
        Some(s) => {
            let (src, ev) = s.split_once(':').ok_or_else(|| anyhow::anyhow!("--corrupt {s}: expected SOURCE:EVENT"))?;
            Some((src.parse::<u32>()?, ev.parse::<u64>()?))
        }
        None => None,
    };
    let (rus, bus, streams) = (args.rus, args.bus, args.streams);
    if rus == 0 || bus == 0 || streams == 0 {
        bail!("--rus, --bus and --streams must be at least 1");
    }
    // EVM.
    let mut evm_sets = vec![format!("rus={rus}"), format!("reject_fraction={:?}", args.reject)];
    evm_sets.extend(sets_for("evm", args));
    let mut evm = Child::spawn("evm", "evm", &evm_sets)?;
    let evm_addr = evm.call("configure", CALL)?["listen"].as_str().unwrap_or_default().to_owned();
    // RUs and their sources.
    let mut ru_children = Vec::new();
    let mut sources = Vec::new();
    for r in 0..rus {
        let mut sets = vec![format!("id={r}"), format!("evm=\"{evm_addr}\""), format!("streams={streams}")];
        sets.extend(sets_for("ru", args));
        let mut c = Child::spawn("ru", &format!("ru-{r}"), &sets)?;
        let addr = c.call("configure", CALL)?["listen"].as_str().unwrap_or_default().to_owned();
        for k in 0..streams {
            let id = r * streams + k;
            let mut sets = vec![format!("source_id={id}"), format!("ru=\"{addr}\""), format!("seed={id}")];
            sets.extend(size_sets.iter().cloned());
            if let Some(t) = &args.stream_table {
                sets.push(format!("stream_table=\"{}\"", t.display()));
            }
            if let Some(rate) = args.rate {
                sets.push(format!("rate_hz={rate:?}"));
            }
            if args.cached_payload {
                sets.push("payload=cached".into());
            }
            if let Some((src, ev)) = corrupt
                && src == id
            {
                sets.push(format!("corrupt_event={ev}"));
            }
            sets.extend(sets_for("source", args));
            let mut s = Child::spawn("source", &format!("src-{id}"), &sets)?;
            s.call("configure", CALL)?;
            sources.push(s);
        }
        ru_children.push(c);
    }
    let bu_sets = |b: u32| -> Vec<String> {
        let mut sets = vec![format!("id={b}"), format!("evm=\"{evm_addr}\""), format!("threads={}", args.threads)];
        if args.no_crc {
            sets.push("check_crc=false".into());
        }
        if let Some(c) = args.credits {
            sets.push(format!("credits={c}"));
        }
        if let Some(dir) = &args.output {
            sets.push("output=files".into());
            sets.push(format!("directory=\"{}\"", dir.display()));
        }
        if let Some(et) = &args.et {
            sets.push("output=et".into());
            sets.push(format!("et=\"{et}\""));
        }
        sets.extend(sets_for("bu", args));
        sets
    };
    let mut bu_children = Vec::new();
    for b in 0..bus {
        let mut c = Child::spawn("bu", &format!("bu-{b}"), &bu_sets(b))?;
        c.call("configure", CALL)?;
        bu_children.push(c);
    }
    // Start: the EVM, the RUs and BUs, then the sources.
    let start = format!("start {}", args.run);
    evm.call(&start, CALL)?;
    for c in ru_children.iter_mut().chain(bu_children.iter_mut()).chain(sources.iter_mut()) {
        c.call(&start, CALL)?;
    }
    let t0 = Instant::now();
    let mut window: Option<(Value, Vec<Value>, Vec<Value>)> = None;
    let mut killed = false;
    let mut joined = false;
    let mut run_errors: Vec<String> = Vec::new();
    let mut next_print = 1.0;
    let stop_signal = crate::component_cmd::install_signal_flag()?;
    loop {
        let t = t0.elapsed().as_secs_f64();
        if t >= args.seconds || stop_signal.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        if window.is_none() && t >= warmup {
            let e = evm.call("stats", CALL)?;
            let r: Vec<Value> = ru_children.iter_mut().map(|c| c.call("stats", CALL)).collect::<Result<_, _>>()?;
            let b: Vec<Value> = bu_children
                .iter_mut()
                .filter(|c| !c.killed)
                .map(|c| c.call("stats", CALL))
                .collect::<Result<_, _>>()?;
            window = Some((e, r, b));
        }
        if let Some((name, at)) = &kill
            && !killed
            && t >= *at
        {
            let victim = std::iter::once(&mut evm)
                .chain(ru_children.iter_mut())
                .chain(bu_children.iter_mut())
                .chain(sources.iter_mut())
                .find(|c| &c.name == name);
            match victim {
                Some(c) => {
                    if progress {
                        println!("{t:5.1} s  killing {} (pid {}) with SIGKILL", c.name, c.process.id());
                    }
                    c.kill();
                }
                None => bail!("--kill: no component named {name}"),
            }
            killed = true;
        }
        if let Some(at) = args.join_bu
            && !joined
            && t >= at
        {
            let b = bu_children.len() as u32;
            let mut c = Child::spawn("bu", &format!("bu-{b}"), &bu_sets(b))?;
            c.call("configure", CALL)?;
            c.call(&start, CALL)?;
            if progress {
                println!("{t:5.1} s  bu-{b} joined");
            }
            bu_children.push(c);
            joined = true;
        }
        for c in std::iter::once(&mut evm)
            .chain(ru_children.iter_mut())
            .chain(bu_children.iter_mut())
            .chain(sources.iter_mut())
        {
            c.drain_events();
        }
        let failed = std::iter::once(&mut evm).chain(ru_children.iter_mut()).chain(sources.iter_mut()).find_map(|c| {
            match c.errors.first() {
                Some(e) => Some(format!("{} failed: {e}", c.name)),
                None if c.killed || !matches!(c.process.try_wait(), Ok(None)) => Some(format!("{} is gone", c.name)),
                None => None,
            }
        });
        if let Some(f) = failed {
            if progress {
                println!("{t:5.1} s  {f}; stopping the run");
            }
            run_errors.push(f);
            break;
        }
        if progress && t >= next_print {
            let e = evm.call("stats", CALL)?;
            let mb: f64 = bu_children
                .iter_mut()
                .filter(|c| !c.killed)
                .map(|c| c.call("stats", CALL).map(|v| counter(&v, &["mb_per_s"])))
                .sum::<anyhow::Result<f64>>()?;
            println!(
                "{t:5.1} s  built {:>10}  {:>9}/s  {:>10}  in flight {:>6}  state {}",
                e["built"],
                crate::format::si(counter(&e, &["events_per_s"])),
                format!("{:.1} MB/s", mb),
                e["in_flight"],
                e["state"].as_str().unwrap_or("?"),
            );
            next_print += 1.0;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The measurement window ends here (a dead component counts nothing).
    let quick = Duration::from_secs(5);
    let e1 = if evm.killed { Value::Null } else { evm.call("stats", quick).unwrap_or(Value::Null) };
    let r1: Vec<Value> = ru_children
        .iter_mut()
        .map(|c| if c.killed { Value::Null } else { c.call("stats", quick).unwrap_or(Value::Null) })
        .collect();
    let b1: Vec<Value> =
        bu_children.iter_mut().filter(|c| !c.killed).map(|c| c.call("stats", quick).unwrap_or(Value::Null)).collect();
    let (mut events_per_s, mut ru_mb, mut bu_mb) = (0.0, 0.0, 0.0);
    if let Some((e0, r0, b0)) = &window {
        let dt = counter(&e1, &["t"]) - counter(e0, &["t"]);
        if dt > 0.0 {
            events_per_s = (counter(&e1, &["built"]) - counter(e0, &["built"])) / dt;
        }
        for (a, b) in r0.iter().zip(&r1) {
            let dt = counter(b, &["t"]) - counter(a, &["t"]);
            if dt > 0.0 {
                ru_mb += (counter(b, &["fragment_bytes"]) - counter(a, &["fragment_bytes"])) / dt / 1e6;
            }
        }
        if b0.len() == b1.len() {
            for (a, b) in b0.iter().zip(&b1) {
                let dt = counter(b, &["t"]) - counter(a, &["t"]);
                if dt > 0.0 {
                    bu_mb += (counter(b, &["bytes"]) - counter(a, &["bytes"])) / dt / 1e6;
                }
            }
        }
    }
    // Stop: the EVM stops triggering and drains (sources keep going until it has), then the
    // sources end their streams at the last event, then the RUs and BUs end.
    let mut errors: Vec<String> = run_errors;
    let evm_summary = match evm.call("stop", Duration::from_secs(60)) {
        Ok(v) => v,
        Err(e) => {
            errors.push(e.to_string());
            Value::Null
        }
    };
    let last = evm_summary["last_event"].as_u64().unwrap_or(0);
    // Each kind is stopped all at once (the command goes to every process, then the answers
    // are collected), so that slow stops overlap instead of adding up.
    let mut stop_all = |children: &mut Vec<Child>, cmd: &str| -> Vec<Value> {
        let sent: Vec<anyhow::Result<()>> = children.iter_mut().filter(|c| !c.killed).map(|c| c.send(cmd)).collect();
        children
            .iter_mut()
            .filter(|c| !c.killed)
            .zip(sent)
            .map(|(c, sent)| match sent.and_then(|()| c.answer(cmd, Duration::from_secs(60))) {
                Ok(v) => v,
                Err(e) => {
                    errors.push(e.to_string());
                    json!({ "component": c.name, "error": e.to_string() })
                }
            })
            .collect()
    };
    let src_summaries = stop_all(&mut sources, &format!("stop {last}"));
    let ru_summaries = stop_all(&mut ru_children, "stop");
    let bu_summaries = stop_all(&mut bu_children, "stop");
    for c in
        std::iter::once(&mut evm).chain(ru_children.iter_mut()).chain(bu_children.iter_mut()).chain(sources.iter_mut())
    {
        c.drain_events();
        for e in &c.errors {
            errors.push(format!("{}: {e}", c.name));
        }
        c.finish();
    }
    for s in std::iter::once(&evm_summary).chain(&ru_summaries).chain(&bu_summaries).chain(&src_summaries) {
        if let Some(e) = s["error"].as_str() {
            let e = format!("{}: {e}", s["component"].as_str().unwrap_or("?"));
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
    }
    let lost = evm_summary["lost"].as_u64();
    let killed_names: Vec<&str> = std::iter::once(&evm)
        .chain(ru_children.iter())
        .chain(bu_children.iter())
        .chain(sources.iter())
        .filter(|c| c.killed)
        .map(|c| c.name.as_str())
        .collect();
    let summary = json!({
        "run": args.run,
        "rus": rus,
        "bus": bu_children.len(),
        "streams_per_ru": streams,
        "size_model": size,
        "seconds": args.seconds,
        "measured": {
            "events_per_s": events_per_s,
            "ru_mb_per_s": ru_mb,
            "bu_mb_per_s": bu_mb,
            "window_from_s": warmup,
        },
        "evm": evm_summary,
        "rus_summary": ru_summaries,
        "bus_summary": bu_summaries,
        "sources": src_summaries,
        "killed": killed_names,
        "errors": errors,
        "lost": lost,
    });
    Ok(LocalResult { clean: errors.is_empty(), lost, events_per_s, ru_mb_per_s: ru_mb, bu_mb_per_s: bu_mb, summary })
}

pub fn run(args: &EvbArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        EvbCommand::Local(local) => {
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
                println!("{}", serde_json::to_string_pretty(&r.summary)?);
            } else {
                print_summary(&r);
            }
            Ok(if r.clean && r.lost == Some(0) { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

fn print_summary(r: &LocalResult) {
    let s = &r.summary;
    let evm = &s["evm"];
    let si = crate::format::si;
    println!();
    if evm.is_null() {
        println!("run {}: no accounting (the EVM did not end the run)", s["run"]);
    } else {
        println!("run {}: last event {}", s["run"], evm["last_event"]);
        println!(
            "  events: triggered {}, built {}, rejected (level 2) {}, re-assigned {}",
            evm["triggered"], evm["built"], evm["rejected"], evm["reassigned"]
        );
    }
    println!(
        "  rate (after warm-up): {} events/s, {:.1} MB/s into the RUs, {:.1} MB/s out of the BUs",
        si(r.events_per_s),
        r.ru_mb_per_s,
        r.bu_mb_per_s
    );
    for ru in s["rus_summary"].as_array().into_iter().flatten() {
        let c = &ru["counters"];
        println!(
            "  {}: {} fragments, {:.1} MB/s, {} super-fragments, sequence errors {}, CRC errors {}",
            ru["component"].as_str().unwrap_or("?"),
            c["fragments"],
            counter(ru, &["mb_per_s"]),
            c["super_fragments"],
            c["sequence_errors"],
            c["crc_errors"]
        );
    }
    for bu in s["bus_summary"].as_array().into_iter().flatten() {
        let files = bu["files"].as_array().map_or(0, Vec::len);
        println!(
            "  {}: {} events built, {}/s, {:.1} MB/s, flagged {} (CRC errors {}){}",
            bu["component"].as_str().unwrap_or("?"),
            bu["events_built"],
            si(counter(bu, &["events_per_s"])),
            counter(bu, &["mb_per_s"]),
            bu["events_flagged"],
            bu["crc_errors"],
            if files > 0 { format!(", {files} file(s)") } else { String::new() }
        );
    }
    for k in s["killed"].as_array().into_iter().flatten() {
        println!("  {}: killed during the run", k.as_str().unwrap_or("?"));
    }
    if let Some(reasons) = evm["lost_reasons"].as_object() {
        for (why, n) in reasons {
            println!("  lost {n}: {why}");
        }
    }
    for e in s["errors"].as_array().into_iter().flatten() {
        println!("  error: {}", e.as_str().unwrap_or("?"));
    }
    match r.lost {
        Some(n) => println!("lost: {n}"),
        None => println!("lost: unknown (the EVM is gone; every event it had not accounted for is in doubt)"),
    }
}
