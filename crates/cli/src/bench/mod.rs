//! `daqflow bench SUITE`: reproduce the papers' figures on this machine.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

mod chain;
pub mod dialog;
mod engine;
mod et;
mod evb;
mod evb_hosts;
mod files;
pub mod harness;
pub mod helper;
mod hosts;
mod jlab_et;
mod plot;
mod raw;
mod relay;
pub mod subfarm;
pub mod testbed;
mod transport;

pub use harness::BenchConfig;

/// The suites.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuiteName {
    /// Framed TCP: throughput and frame rate vs frame size, and 1, 2, 4 connections into one
    /// receiver, next to raw blocking sockets.
    Transport,
    /// The control plane (DIALOG figs. 9–10): many sender processes publishing into one
    /// subscriber process, vs message size, next to raw TCP.
    Dialog,
    /// The Event Transfer system (ET figs. 2–4): events/s and MB/s vs event size next to memcpy,
    /// vs batch size, vs consumers on shared or separate stations, and through a remote
    /// attachment; separate processes for the system, the producer and the consumers.
    Et,
    /// The data-plane engine (ATLAS DAQ-Unit figs. 2, 3, 11–16): time-stamp overhead, scheduler
    /// transitions, event manager insert / lookup / remove, and the ROB test bed's events/s.
    Engine,
    /// The event builder (CMS DAQ2 figs. 4–7): RU throughput vs fragment size and streams, BU
    /// throughput per task (build, CRC check, write files) and builder threads, RUs × BUs
    /// scaling, realistic per-stream sizes, and busy processes beside it; whole builders as
    /// processes, next to raw TCP and a raw relay of the RU's topology.
    Evb,
    /// The data-file writer alone (issue 29's file row): MB/s vs event size, in 1 or 8 parts,
    /// next to write(2) of 1 MiB blocks into the same directory and memcpy.
    Files,
    /// The DAQ-Middleware component chain (figs. 4–9): generator → k repeaters → sink as
    /// processes, k = 0 … 6, MB/s vs chunk size 1 KiB … 1 MiB, next to raw TCP.
    Chain,
}

/// Arguments of `daqflow bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The suite to run.
    #[arg(value_enum)]
    pub suite: SuiteName,
    /// A run of a few seconds: fewer points, short measurements, one repetition.
    #[arg(long)]
    pub quick: bool,
    /// Write SUITE.csv, SUITE.json and SUITE.png into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Repetitions per point; the median is reported [default: 5 (dialog, et, engine, evb, chain: 3),
    /// or 1 with --quick].
    #[arg(long)]
    pub repetitions: Option<usize>,
    /// Seconds per measurement [default: 1, or 0.25 with --quick; dialog: 2, or 0.5; evb: the
    /// window after 0.5 s of warm-up of each event-builder run, 1.5, or 1 with --quick; chain: the
    /// window after the warm-up of each chain run, 1, or 0.3 with --quick].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// dialog: number of sender processes.
    #[arg(long, default_value_t = 25)]
    pub senders: usize,
    /// dialog: message sizes in bytes, comma-separated [default: 16,128,1024,2048,10240,102400,1048576;
    /// with --quick 16,128,1024,102400]. et: event sizes of the size sweep [default:
    /// 8,64,512,1024,5120,16384,65536,262144,1048576; with --quick 64,4096,65536]. evb: fragment
    /// sizes of the RU sweep [default: 256,1024,4096,16384,65536; with --quick 1024,16384]. chain:
    /// chunk sizes [default: 1024,4096,16384,65536,262144,1048576; with --quick 4096,65536,1048576].
    /// files: event sizes [default: 1024,4096,16384,65536,131072,1048576; with --quick 4096,131072].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// evb, chain: run the components in N test hosts, network namespaces of this machine
    /// (10.77.0.1 … N, joined by a software bridge, with an sshd each; needs root, iproute2 and
    /// OpenSSH), next to raw TCP between the same namespaces. evb (N ≥ 3): `evb local` in host
    /// 1 with the EVM, RUs and their sources on hosts 2 … k+1 and BUs on the rest, k = (N−1)/2,
    /// started over ssh; fragment sizes 1024,4096,16384 with 1 and 2 RUs (--quick: 1024,16384,
    /// 1 RU); suite `evb-hosts`. chain (N = 2): the generator on host 1, the sink on host 2
    /// started over ssh, at the chain's chunk sizes; suite `chain-hosts`. The hosts share this
    /// machine's cores: this measures the software path across hosts, not a network.
    #[arg(long, value_name = "N")]
    pub hosts: Option<usize>,
    /// files, and et's case recorder: the directory the files are written into (and removed
    /// from after each repetition) [default: /dev/shm, else the system's temporary directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// evb and et: run only these cases [default: all]. evb: ru, target_1ru_1bu, bu, scaling,
    /// replay, realistic, pinning, contention; et: size, batch, consumers, jlab, remote,
    /// recorder.
    #[arg(long, value_delimiter = ',', value_name = "CASE,CASE…")]
    pub cases: Option<Vec<String>>,
    /// et: also run Jefferson Lab's ET (its et_start, et_producer and et_consumer, found in DIR
    /// or DIR/examples; build them with scripts/build-jlab-et.sh) beside daqflow's in every
    /// repetition, 64 B events in batches of 1 and 100: case `jlab`, metric `ratio_to_jlab`.
    #[arg(long, value_name = "DIR")]
    pub jlab_et: Option<PathBuf>,
}

pub const AFTER_HELP: &str = "\
Each suite prints a table (median of the repetitions, with min … max where they differ by more
than 5%), and with --out writes SUITE.csv, SUITE.json (an array of {case, params, metrics})
and SUITE.png. References are measured in the same run and reported as ratios. The machines
we share are noisy: compare medians, and repeat a run before believing a change.

Examples:
  daqflow bench transport --quick --out bench-out
  daqflow bench dialog --quick --out bench-out
  daqflow bench et --quick --out bench-out
  daqflow bench et --jlab-et /opt/jlab-et/bin --out bench-out   beside Jefferson Lab's ET
  daqflow bench engine --quick --out bench-out
  daqflow bench evb --quick --out bench-out
  daqflow bench chain --quick --out bench-out
  daqflow bench files --quick --out bench-out
  sudo daqflow bench evb --hosts 5 --out bench-out      the builder across 5 namespaces (evb-hosts.*)
  sudo daqflow bench chain --hosts 2 --out bench-out    generator and sink on 2 namespaces (chain-hosts.*)
  daqflow bench dialog --senders 25 --sizes 16,1024 --seconds 3
  daqflow bench transport --repetitions 9 --seconds 2 --out bench-out";

pub fn run(args: &Args) -> anyhow::Result<()> {
    let (default_seconds, default_reps) = match args.suite {
        SuiteName::Transport => (if args.quick { 0.25 } else { 1.0 }, 5),
        SuiteName::Dialog => (if args.quick { 0.5 } else { 2.0 }, 3),
        SuiteName::Et => (if args.quick { 0.25 } else { 1.0 }, 3),
        SuiteName::Engine => (if args.quick { 0.25 } else { 1.0 }, 3),
        SuiteName::Evb => (if args.quick { 1.0 } else { 1.5 }, 3),
        SuiteName::Chain => (if args.quick { 0.3 } else { 1.0 }, 3),
        SuiteName::Files => (if args.quick { 0.3 } else { 1.0 }, 5),
    };
    let config = BenchConfig {
        quick: args.quick,
        repetitions: args.repetitions.unwrap_or(if args.quick { 1 } else { default_reps }),
        measure_time: Duration::from_secs_f64(args.seconds.unwrap_or(default_seconds).max(0.01)),
        warmup: !args.quick,
        out: args.out.clone(),
    };
    if args.cases.is_some() && (args.hosts.is_some() || !matches!(args.suite, SuiteName::Evb | SuiteName::Et)) {
        anyhow::bail!("--cases applies to the evb and et suites (without --hosts), not {}", suite_name(args.suite));
    }
    if let Some(n) = args.hosts {
        let (suite, failures) = match args.suite {
            SuiteName::Evb => {
                evb_hosts::run(config, evb_hosts::EvbHostsOptions::new(n, args.quick, args.sizes.clone()))?
            }
            SuiteName::Chain => chain::run_hosts(config, chain::ChainOptions::new(args.quick, args.sizes.clone()), n)?,
            other => anyhow::bail!("--hosts applies to the evb and chain suites, not {}", suite_name(other)),
        };
        return suite.finish_unless_failed(&failures);
    }
    let suite = match args.suite {
        SuiteName::Transport => transport::run(config)?,
        SuiteName::Dialog => {
            let sizes = args.sizes.clone().unwrap_or_else(|| {
                if args.quick { vec![16, 128, 1024, 102400] } else { vec![16, 128, 1024, 2048, 10240, 102400, 1 << 20] }
            });
            dialog::run(config, dialog::DialogOptions { senders: args.senders.max(1), sizes })?
        }
        SuiteName::Et => {
            let sizes = args.sizes.clone().unwrap_or_else(|| {
                if args.quick {
                    vec![64, 4096, 65536]
                } else {
                    vec![8, 64, 512, 1024, 5120, 16384, 65536, 262144, 1 << 20]
                }
            });
            let jlab = args.jlab_et.as_deref().map(jlab_et::JlabEt::find).transpose()?;
            let cases = known_cases("et", &args.cases, &et::CASES)?;
            let dir = args.dir.clone().unwrap_or_else(ram_disk);
            et::run(config, et::EtOptions { sizes, jlab, cases, dir })?
        }
        SuiteName::Engine => {
            let (suite, figures) = engine::run(config)?;
            return engine::finish(&suite, &figures);
        }
        SuiteName::Evb => {
            let sizes = args
                .sizes
                .clone()
                .unwrap_or_else(|| if args.quick { vec![1024, 16384] } else { vec![256, 1024, 4096, 16384, 65536] });
            let cases = known_cases("evb", &args.cases, &evb::CASES)?;
            let (suite, failures) = evb::run(config, evb::EvbOptions { sizes, cases })?;
            return suite.finish_unless_failed(&failures);
        }
        SuiteName::Chain => {
            let (suite, failures) = chain::run(config, chain::ChainOptions::new(args.quick, args.sizes.clone()))?;
            return suite.finish_unless_failed(&failures);
        }
        SuiteName::Files => {
            let sizes = args.sizes.clone().unwrap_or_else(|| {
                if args.quick { vec![4096, 131072] } else { vec![1024, 4096, 16384, 65536, 131072, 1 << 20] }
            });
            let dir = args.dir.clone().unwrap_or_else(ram_disk);
            files::run(config, files::FilesOptions { sizes, dir })?
        }
    };
    suite.finish()
}

/// A suite's name as the command line spells it.
fn suite_name(suite: SuiteName) -> String {
    suite.to_possible_value().map_or_else(|| format!("{suite:?}"), |v| v.get_name().to_owned())
}

/// `--cases`, checked against the suite's cases: a misspelt case is an error, not a run that
/// measures nothing (or everything).
fn known_cases(suite: &str, cases: &Option<Vec<String>>, known: &[&str]) -> anyhow::Result<Option<Vec<String>>> {
    if let Some(cases) = cases
        && let Some(bad) = cases.iter().find(|c| !known.contains(&c.as_str()))
    {
        anyhow::bail!("{suite} has no case {bad:?}; its cases: {}", known.join(", "));
    }
    Ok(cases.clone())
}

/// A directory removed, with everything in it, when dropped.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    /// A fresh, empty directory `daqflow-bench-SUITE-PID-TAG` under `parent`.
    pub(crate) fn new(parent: &std::path::Path, suite: &str, tag: &str) -> anyhow::Result<TempDir> {
        use anyhow::Context;
        let path = parent.join(format!("daqflow-bench-{suite}-{}-{tag}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing the old {}", path.display()))?;
        }
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("bench: could not remove {}: {e}", self.0.display());
        }
    }
}

/// The RAM disk files are written to (the system's temporary directory if there is none).
pub(crate) fn ram_disk() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

/// Whether `p`'s parameter `task` is `task` (the BU's `build`, `crc`, `write`; the recorder
/// case's `record`, `consume`).
pub(crate) fn is_task(p: &harness::Point, task: &str) -> bool {
    matches!(p.param("task"), Some(harness::Param::Text(x)) if x == task)
}

/// Issue 29's "writing files costs ≤ 10 % of the rate without them", for the points of `case`:
/// each point whose `task` is `with` (writing) against the point whose task is `without` at the
/// same `event_bytes` and the same value of the parameter `count.0`. The note opens with `what`
/// and names each pair's rates and cost (1 − with/without), each pair as "SIZE events × N" and
/// `count.1`; the goal is judged on machines of 8 cores or more only. No note without a pair.
pub(crate) fn writing_cost_note(
    suite: &mut harness::Suite,
    case: &str,
    (with, without): (&str, &str),
    count: (&str, &str),
    what: &str,
) {
    use harness::{Param, Point};
    let task = |p: &Point, t: &str| p.case == case && is_task(p, t);
    let rate = |p: &Point| p.metric("mb_per_s").map(|m| m.median);
    let key = |p: &Point| (p.param("event_bytes").and_then(Param::num), p.param(count.0).and_then(Param::num));
    let mut cells = Vec::new();
    for w in suite.points.iter().filter(|p| task(p, with)) {
        let Some(c) = suite.points.iter().find(|p| task(p, without) && key(p) == key(w)) else { continue };
        let ((Some(bytes), Some(n)), Some(wr), Some(cr)) = (key(w), rate(w), rate(c)) else { continue };
        if cr > 0.0 {
            cells.push(format!(
                "{} events × {n}{}: {} against {} MB/s, {:.0} %",
                crate::format::bytes(bytes),
                count.1,
                crate::format::si(wr),
                crate::format::si(cr),
                100.0 * (1.0 - wr / cr)
            ));
        }
    }
    if cells.is_empty() {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    suite.note(format!(
        "{what}: {}. Goal (issue 29): ≤ 10 % on a machine of 8 cores or more{}.",
        cells.join("; "),
        if cpus >= 8 { "" } else { " (this one has fewer: not judged here)" }
    ));
}

/// A line describing the machine, for the notes under every table.
pub fn machine_note() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("machine: {cpu}, {cores} cores available; numbers from a shared machine vary from run to run")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_case_is_refused_with_the_suites_cases() {
        let bad = known_cases("et", &Some(vec!["batch".into(), "bacth".into()]), &et::CASES).unwrap_err();
        assert_eq!(
            bad.to_string(),
            "et has no case \"bacth\"; its cases: size, batch, consumers, jlab, remote, recorder"
        );
        let good = known_cases("evb", &Some(vec!["ru".into(), "contention".into()]), &evb::CASES).unwrap();
        assert_eq!(good, Some(vec!["ru".to_owned(), "contention".to_owned()]));
        assert_eq!(known_cases("et", &None, &et::CASES).unwrap(), None);
    }

    #[test]
    fn the_cost_of_writing_pairs_each_point_with_the_same_work_without_files() {
        use harness::{BenchConfig, Metrics, Suite};
        let config =
            BenchConfig { quick: true, repetitions: 1, measure_time: Duration::ZERO, warmup: false, out: None };
        let mut suite = Suite::new("test", "test", config);
        // The BU's (`bench evb --cases bu`, per builder threads), then the recorders' (`bench et
        // --cases recorder`, per count); a point without its partner (× 2) is left out.
        for (case, task, count, n, bytes, mb) in [
            ("bu", "crc", "threads", 1usize, 131072usize, 2000.0),
            ("bu", "write", "threads", 1, 131072, 1500.0),
            ("bu", "crc", "threads", 4, 131072, 2100.0),
            ("bu", "write", "threads", 4, 131072, 2000.0),
            ("bu", "write", "threads", 2, 131072, 1.0),
            ("recorder", "consume", "consumers", 1, 16384, 8000.0),
            ("recorder", "record", "consumers", 1, 16384, 2000.0),
            ("recorder", "consume", "consumers", 4, 16384, 8000.0),
            ("recorder", "record", "consumers", 4, 16384, 7600.0),
            ("recorder", "record", "consumers", 2, 16384, 1.0),
        ] {
            let p = vec![("task", task.into()), (count, n.into()), ("event_bytes", bytes.into())];
            suite.measure(case, p, || Ok(Metrics::new().with("mb_per_s", mb))).unwrap();
        }
        evb::write_notes(&mut suite);
        et::record_notes(&mut suite);
        let [bu, recorder] = &suite.notes[..] else { panic!("two notes: {:?}", suite.notes) };
        assert!(bu.starts_with("writing files (bu: write against crc"), "{bu}");
        assert!(bu.contains("128 KiB events × 1 thread(s): 1.5 k against 2.0 k MB/s, 25 %"), "{bu}");
        assert!(bu.contains("× 4 thread(s): 2.0 k against 2.1 k MB/s, 5 %"), "{bu}");
        assert!(!bu.contains("2 thread(s)") && !bu.contains("16 KiB"), "{bu}");
        assert!(recorder.starts_with("writing files (recorder: record against consume"), "{recorder}");
        assert!(recorder.contains("16 KiB events × 1: 2.0 k against 8.0 k MB/s, 75 %"), "{recorder}");
        assert!(recorder.contains("16 KiB events × 4: 7.6 k against 8.0 k MB/s, 5 %"), "{recorder}");
        assert!(!recorder.contains("× 2:") && !recorder.contains("128 KiB"), "{recorder}");
        assert!(bu.contains("Goal (issue 29): ≤ 10 % on a machine of 8 cores or more"), "{bu}");
    }
}
