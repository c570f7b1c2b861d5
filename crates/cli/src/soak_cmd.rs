//! `daqflow soak --minutes N`: the demo's system at full speed for N minutes, run after run,
//! with `kill -9` of its restartable components at random moments. After every run it checks
//! that every event is accounted for (built + duplicates = recorded + not recorded; triggered =
//! built + rejected + lost in the builder), that every data file verifies, that no process's
//! memory or file descriptors grow run after run, and that nothing is left in `/dev/shm`.
//! Exit status 0 only when every check of every run held.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use daqflow_api::{ComponentState, Policy, RunSummary};
use daqflow_runcontrol::operator::{Operator, OperatorOptions};
use serde_json::{Value, json};

pub const AFTER_HELP: &str = "Examples:\n  \
    daqflow soak --minutes 2                         what CI runs\n  \
    daqflow soak --minutes 30 --run-seconds 60       a longer soak (docs/performance.md)\n  \
    daqflow soak --minutes 5 --kill-every 2 --seed 7 more kills, reproducible choices\n\n\
    Each run: the demo's system (its sources free-running: rate_hz = 0), a kill -9 of a random\n\
    component with policy `restart` (msglogger, recorder, monitor, bu-0, bu-1; restarted at\n\
    once, without the restart cap) every --kill-every seconds on average, then a stop. Checked after every run: the run's accounting\n\
    (built + duplicates = recorded + not recorded; triggered = built + rejected + lost in the\n\
    builder), its files (every CRC), each process's RSS and open files against the first run,\n\
    and /dev/shm. A table per run, and soak.json in the data directory.";

/// Arguments of `daqflow soak`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How long to soak, in minutes (runs are taken until this time has passed).
    #[arg(long, default_value = "2")]
    pub minutes: f64,
    /// Length of each run, in seconds.
    #[arg(long, default_value = "20")]
    pub run_seconds: f64,
    /// Mean time between two kills during a run, in seconds (0: no kills).
    #[arg(long, default_value = "6")]
    pub kill_every: f64,
    /// Seed of the random choices (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where files, logs and the run database go (default: a new directory under the system's
    /// temporary directory, removed at the end when every check held).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Let a process's resident memory grow by at most this many MiB over its first run (or
    /// double, whichever is more) before the check fails.
    #[arg(long, default_value = "128")]
    pub rss_slack_mib: u64,
}

/// A small xorshift generator: the soak's choices, reproducible from `--seed`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What one process holds: resident memory (KiB) and open file descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Footprint {
    rss_kib: u64,
    fds: u64,
}

fn footprint(pid: u32) -> Option<Footprint> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Footprint { rss_kib, fds })
}

fn dev_shm_entries() -> u64 {
    std::fs::read_dir("/dev/shm").map_or(0, |d| d.count() as u64)
}

/// The accounting identities of a run's summary (`docs/operator-guide.md`, "What a run's record
/// holds"); what does not hold.
fn accounting_problems(s: &RunSummary) -> Vec<String> {
    let mut problems = Vec::new();
    if !s.accounting_complete {
        problems.push("the accounting is not complete".to_owned());
    }
    if s.events + s.duplicates != s.recorded + s.not_recorded {
        problems.push(format!(
            "built {} + duplicates {} != recorded {} + not recorded {}",
            s.events, s.duplicates, s.recorded, s.not_recorded
        ));
    }
    match (s.triggered, s.rejected) {
        (Some(t), Some(r)) if t != s.events + r + s.lost_in_builder => problems.push(format!(
            "triggered {t} != built {} + rejected {r} + lost in the builder {}",
            s.events, s.lost_in_builder
        )),
        (Some(_), Some(_)) => {}
        _ => problems.push("the trigger's counts are unknown (the event manager died)".to_owned()),
    }
    if s.lost != s.lost_in_builder + s.not_recorded {
        problems.push(format!(
            "lost {} != lost in the builder {} + not recorded {}",
            s.lost, s.lost_in_builder, s.not_recorded
        ));
    }
    let counted: u64 = s.files.iter().map(|f| f.events).sum();
    if counted != s.recorded {
        problems.push(format!("the files hold {counted} events, the summary says {} recorded", s.recorded));
    }
    problems
}

/// Every file of the run checked (every CRC); a file a killed recorder left open is fine when
/// intact up to its last whole event.
fn file_problems(s: &RunSummary) -> Vec<String> {
    let mut problems: Vec<String> = s.file_problems.clone();
    for f in &s.files {
        match daqflow_wire::file::FileReader::open(&f.path).and_then(|r| r.verify(true)) {
            Ok(report) if report.problems.is_empty() => {}
            Ok(report) => problems.push(format!("{}: {:?}", f.path.display(), report.problems)),
            Err(e) => problems.push(format!("{}: {e}", f.path.display())),
        }
    }
    problems
}

/// A temporary data directory, removed when dropped unless kept.
struct DataDir {
    path: PathBuf,
    remove: bool,
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if !(args.minutes > 0.0 && args.run_seconds > 0.0 && args.kill_every >= 0.0) {
        anyhow::bail!("--minutes and --run-seconds must be positive, --kill-every 0 or more");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1
    });
    let mut rng = Rng(seed.max(1));
    let mut data = match &args.data {
        Some(p) => DataDir { path: p.clone(), remove: false },
        None => {
            let p = std::env::temp_dir().join(format!("daqflow-soak-{}", std::process::id()));
            DataDir { path: p, remove: false }
        }
    };
    std::fs::create_dir_all(&data.path).with_context(|| format!("creating {}", data.path.display()))?;
    let shm_before = dev_shm_entries();
    let mut file = crate::run_cmd::parse_system(crate::run_cmd::DEMO_SYSTEM, "demo.toml")?;
    // The soak kills on purpose: every kill gets its restart at once, however many in a run.
    file.system.restart_max = 1000;
    file.system.restart_backoff_s = 0.0;
    let restartable: Vec<String> =
        file.components.iter().filter(|c| c.policy == Policy::Restart).map(|c| c.name.clone()).collect();
    let sources: Vec<String> = file.components.iter().filter(|c| c.kind == "source").map(|c| c.name.clone()).collect();
    println!(
        "daqflow soak: {} min of {} s runs, a kill -9 every {} s on average among {} (seed {seed}); data in {}",
        args.minutes,
        args.run_seconds,
        args.kill_every,
        restartable.join(", "),
        data.path.display()
    );
    let mut options = OperatorOptions::new(file, crate::run_cmd::binary()?);
    options.data = Some(data.path.clone());
    let op = Operator::launch(options)?;
    let result = soak(&op, args, &mut rng, &restartable, &sources, &data.path);
    op.shutdown();
    // The operator's processes are gone: nothing of theirs may remain in /dev/shm.
    let deadline = Instant::now() + Duration::from_secs(5);
    while dev_shm_entries() > shm_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let shm_after = dev_shm_entries();
    let (mut report, mut ok) = result?;
    if shm_after > shm_before {
        println!("FAIL: /dev/shm held {shm_before} entries before the soak and {shm_after} after it");
        ok = false;
    }
    report["seed"] = json!(seed);
    report["dev_shm"] = json!({"before": shm_before, "after": shm_after});
    report["ok"] = json!(ok);
    let json_path = data.path.join("soak.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    if ok {
        println!(
            "soak passed: {} runs, {} kills; report in {}",
            report["runs"].as_array().map_or(0, Vec::len),
            report["kills"],
            json_path.display()
        );
        data.remove = args.data.is_none();
        if data.remove {
            println!("(the data directory is removed; give --data to keep it)");
        }
        Ok(ExitCode::SUCCESS)
    } else {
        println!("soak FAILED: see above and {}", json_path.display());
        Ok(ExitCode::from(1))
    }
}

fn soak(
    op: &Operator,
    args: &Args,
    rng: &mut Rng,
    restartable: &[String],
    sources: &[String],
    data: &Path,
) -> anyhow::Result<(Value, bool)> {
    // Full speed: the sources free-running instead of the demo's 2 kHz.
    for s in sources {
        op.set(s, "rate_hz", Some(toml::Value::Float(0.0)))?;
    }
    op.configure()?;
    let end = Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
    let mut first: BTreeMap<String, Footprint> = BTreeMap::new();
    let mut runs = Vec::new();
    let mut ok = true;
    let mut kills_total = 0u64;
    println!(
        "{:>4} {:>6} {:>10} {:>10} {:>10} {:>5} {:>6} {:>5} {:>9} {:>7}  checks",
        "run", "s", "built", "recorded", "duplicates", "lost", "kills", "files", "max RSS", "max fds"
    );
    while Instant::now() < end {
        let run = op.start(None)?;
        let t0 = Instant::now();
        let length = Duration::from_secs_f64(args.run_seconds)
            .min(end.saturating_duration_since(t0).max(Duration::from_secs(3)));
        let mut kills: Vec<Value> = Vec::new();
        let mut next_kill =
            (args.kill_every > 0.0).then(|| t0 + Duration::from_secs_f64(rng.unit() * 2.0 * args.kill_every));
        let mut ended_early = None;
        while t0.elapsed() < length {
            std::thread::sleep(Duration::from_millis(100));
            if !op.run_open() {
                ended_early = Some(op.status().last_error.unwrap_or_else(|| "the run ended by itself".into()));
                break;
            }
            if let Some(at) = next_kill
                && Instant::now() >= at
            {
                next_kill = Some(at + Duration::from_secs_f64(rng.unit() * 2.0 * args.kill_every));
                // Among the restartable components running now (not one still coming back).
                let status = op.status();
                let live: Vec<(String, u32)> = status
                    .components
                    .iter()
                    .filter(|c| restartable.contains(&c.name) && c.alive && c.state == ComponentState::Running)
                    .filter_map(|c| c.pid.map(|p| (c.name.clone(), p)))
                    .collect();
                if live.is_empty() {
                    continue;
                }
                let (name, pid) = &live[(rng.next() % live.len() as u64) as usize];
                // SAFETY: kill(2) with a pid the operator started and still reports alive; it
                // touches no memory of ours.
                let r = unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
                if r == 0 {
                    kills.push(json!({"component": name, "pid": pid, "at_s": t0.elapsed().as_secs_f64()}));
                }
            }
        }
        // Every component back before the stop, so that the stop finds them all (a restart
        // under way is waited for, up to the system's timeout).
        let settle = Instant::now() + Duration::from_secs(30);
        while Instant::now() < settle
            && op.run_open()
            && op.status().components.iter().any(|c| !c.alive || c.state != ComponentState::Running)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let summary = if op.run_open() && op.run_number() == Some(run) { op.stop()? } else { wait_summary(op, run)? };
        kills_total += kills.len() as u64;
        // Footprints after the run, of every live component and of this process.
        let mut now: BTreeMap<String, Footprint> = BTreeMap::new();
        for c in op.status().components {
            if let Some(f) = c.pid.filter(|_| c.alive).and_then(footprint) {
                now.insert(c.name, f);
            }
        }
        if let Some(f) = footprint(std::process::id()) {
            now.insert("operator".into(), f);
        }
        let mut problems = accounting_problems(&summary);
        problems.extend(file_problems(&summary));
        if let Some(why) = &ended_early {
            problems.push(format!("the run ended before its stop: {why}"));
        }
        for (name, f) in &now {
            match first.get(name) {
                None => {
                    first.insert(name.clone(), *f);
                }
                Some(f0) => {
                    let rss_limit = (f0.rss_kib * 2).max(f0.rss_kib + args.rss_slack_mib * 1024);
                    if f.rss_kib > rss_limit {
                        problems.push(format!(
                            "{name}: resident memory {} MiB after run {run}, {} MiB after the first",
                            f.rss_kib / 1024,
                            f0.rss_kib / 1024
                        ));
                    }
                    // A restarted process starts anew; one that lived through every run may not
                    // keep more files open than after the first (a few for what a run opens).
                    if f.fds > f0.fds + 16 {
                        problems
                            .push(format!("{name}: {} open files after run {run}, {} after the first", f.fds, f0.fds));
                    }
                }
            }
        }
        let max_rss = now.values().map(|f| f.rss_kib).max().unwrap_or(0);
        let max_fds = now.values().map(|f| f.fds).max().unwrap_or(0);
        let check = if problems.is_empty() { "ok".to_owned() } else { format!("FAIL: {}", problems.join("; ")) };
        println!(
            "{:>4} {:>6.1} {:>10} {:>10} {:>10} {:>5} {:>6} {:>5} {:>6} MiB {:>7}  {check}",
            run,
            summary.seconds,
            summary.events,
            summary.recorded,
            summary.duplicates,
            summary.lost,
            kills.len(),
            summary.files.len(),
            max_rss / 1024,
            max_fds
        );
        ok &= problems.is_empty();
        runs.push(json!({
            "run": run, "seconds": summary.seconds, "triggered": summary.triggered, "built": summary.events,
            "recorded": summary.recorded, "duplicates": summary.duplicates, "not_recorded": summary.not_recorded,
            "lost": summary.lost, "files": summary.files.len(), "kills": kills, "problems": problems,
            "footprints": now.iter().map(|(n, f)| (n.clone(), json!({"rss_kib": f.rss_kib, "fds": f.fds}))).collect::<BTreeMap<_, _>>(),
        }));
        // Old runs' files go, so that a long soak does not fill the disk.
        for f in &summary.files {
            let _ = std::fs::remove_file(&f.path);
        }
    }
    let _ = data;
    Ok((json!({"runs": runs, "kills": kills_total}), ok))
}

/// The summary of a run closed by the operator itself (a policy): from the run database.
fn wait_summary(op: &Operator, run: u32) -> anyhow::Result<RunSummary> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = op.last_summary().filter(|s| s.run == run) {
            return Ok(s);
        }
        if let Some(s) = op.db().run(run).ok().flatten().and_then(|d| d.summary) {
            return Ok(s);
        }
        anyhow::ensure!(Instant::now() < deadline, "run {run} is still not closed after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identities_catch_an_event_not_accounted_for() {
        let mut s = daqflow_rundb::example_summary(1, 100);
        s.files.push(daqflow_api::FileRecord {
            component: "recorder".into(),
            path: "/nowhere/run000001_recorder_0001.daq".into(),
            events: 100,
            bytes: 10_000,
            first_event: Some(1),
            last_event: Some(100),
            complete: true,
        });
        assert_eq!(accounting_problems(&s), Vec::<String>::new());
        s.recorded = 99; // one event neither recorded nor counted as not recorded
        assert!(accounting_problems(&s).iter().any(|p| p.contains("built 100 + duplicates 0 != recorded 99")));
        s.recorded = 100;
        s.triggered = Some(101);
        assert!(accounting_problems(&s).iter().any(|p| p.contains("triggered 101")));
        s.triggered = None;
        assert!(accounting_problems(&s).iter().any(|p| p.contains("unknown")));
    }

    #[test]
    fn the_random_choices_repeat_with_the_seed() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next()).collect::<Vec<_>>());
        assert!((0..1000).map(|_| a.unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
