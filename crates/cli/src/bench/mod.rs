//! `daqflow bench SUITE`: reproduce the papers' figures on this machine.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

pub mod harness;
mod plot;
mod transport;

pub use harness::BenchConfig;

/// The suites.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuiteName {
    /// Framed TCP: throughput and frame rate vs frame size, and 1, 2, 4 connections into one
    /// receiver, next to raw blocking sockets.
    Transport,
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
    /// Repetitions per point; the median is reported [default: 5, or 1 with --quick].
    #[arg(long)]
    pub repetitions: Option<usize>,
    /// Seconds per measurement [default: 1, or 0.25 with --quick].
    #[arg(long)]
    pub seconds: Option<f64>,
}

pub const AFTER_HELP: &str = "\
Each suite prints a table (median of the repetitions, with min … max where they differ by more
than 5%), and with --out writes SUITE.csv, SUITE.json (an array of {case, params, metrics})
and SUITE.png. References are measured in the same run and reported as ratios. The machines
we share are noisy: compare medians, and repeat a run before believing a change.

Examples:
  daqflow bench transport --quick --out bench-out
  daqflow bench transport --repetitions 9 --seconds 2 --out bench-out";

pub fn run(args: &Args) -> anyhow::Result<()> {
    let config = BenchConfig {
        quick: args.quick,
        repetitions: args.repetitions.unwrap_or(if args.quick { 1 } else { 5 }),
        measure_time: Duration::from_secs_f64(args.seconds.unwrap_or(if args.quick { 0.25 } else { 1.0 }).max(0.01)),
        warmup: !args.quick,
        out: args.out.clone(),
    };
    let suite = match args.suite {
        SuiteName::Transport => transport::run(config)?,
    };
    suite.finish()
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
