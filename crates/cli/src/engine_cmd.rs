//! `daqflow engine …`: the data-plane engine's examples, run from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, ensure};
use clap::ValueEnum;
use daqflow_engine::IdleStrategy;
use daqflow_engine::profile::{self, ProfileDump};

use crate::bench::testbed::{Layout, Testbed, TestbedConfig, TestbedReport};
use crate::format;

/// Arguments of `daqflow engine`.
#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    #[command(subcommand)]
    pub command: EngineCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum EngineCommand {
    /// Run the ATLAS DAQ-Unit paper's measurement set-up in this process: ROBs generating
    /// fragments, a TRG deciding accept / reject / ROI (1:100:10), an EBIF-like collector and a
    /// level-2 consumer; print what happened, and optionally write a time-stamp profile.
    Testbed(TestbedArgs),
    /// The ATLAS DAQ-Unit paper's dummy sub-farm event handler: takes one connection from an SFI
    /// on --listen, forwards every event to the SFO at --to, and grants the SFI a credit for each
    /// (--window to begin with). `engine testbed --subfarm` starts it; prints `listening on ADDR`.
    Handler(HandlerArgs),
}

/// Arguments of `daqflow engine handler`.
#[derive(clap::Args, Debug)]
pub struct HandlerArgs {
    /// Where the SFI connects.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// The SFO's address.
    #[arg(long)]
    pub to: std::net::SocketAddr,
    /// Events the SFI may inject ahead of what was forwarded.
    #[arg(long, default_value_t = 16)]
    pub window: u32,
}

/// How the modules are spread over threads.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutArg {
    /// Everything on one scheduler thread.
    One,
    /// The ROBs on one scheduler thread, the TRG, the collector and level 2 on another (the
    /// paper's set-up).
    Apart,
}

/// What a scheduler does when no task has work.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleArg {
    /// Spin a while, yield, then park (10 µs … 1 ms).
    Default,
    /// Never sleep (a core each).
    Busy,
    /// Sleep soon (shared cores).
    Lazy,
}

/// Arguments of `daqflow engine testbed`.
#[derive(clap::Args, Debug)]
pub struct TestbedArgs {
    /// Run for this many seconds [default: 1, unless --events is given].
    #[arg(long, value_name = "S")]
    pub seconds: Option<f64>,
    /// Stop when this many events are decided and freed at every ROB.
    #[arg(long, value_name = "N")]
    pub events: Option<u64>,
    /// Number of ROBs (1 … 64).
    #[arg(long, value_name = "R", default_value_t = 2)]
    pub robs: u32,
    /// How the modules are spread over scheduler threads.
    #[arg(long, value_enum, default_value_t = LayoutArg::Apart)]
    pub layout: LayoutArg,
    /// With --layout apart: pin the ROBs' thread and the other thread to these two cores.
    #[arg(long, value_name = "ROB_CORE,OTHER_CORE", value_delimiter = ',')]
    pub pin: Option<Vec<usize>>,
    /// What a scheduler does when none of its tasks has work.
    #[arg(long, value_enum, default_value_t = IdleArg::Default)]
    pub idle: IdleArg,
    /// Time-stamp every task's poll and action and write the profile to FILE (read it with
    /// `daqflow profile FILE`).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// With --profile: stamps kept per scheduler thread (the latest ones; 16 bytes each).
    #[arg(long, value_name = "STAMPS", default_value_t = 4 << 20)]
    pub ring: usize,
    /// Put the paper's sub-farm behind the collector: an SFI buffering the crate fragments in an
    /// event manager and formatting events, the dummy event handler (a process of its own, over
    /// TCP), and an SFO.
    #[arg(long)]
    pub subfarm: bool,
    /// With --subfarm: the SFO writes data files here (else it drops the events, as in the
    /// paper's measurement).
    #[arg(long, value_name = "DIR", requires = "subfarm")]
    pub sfo_dir: Option<PathBuf>,
}

pub const AFTER_HELP: &str = "\
testbed: every event ends rejected (freed by a grouped reject) or built (collected from every
ROB, checked, assembled, then freed by a grouped discard) at every ROB; the run fails (exit 1)
if the counts do not add up. events/s counts events decided and freed at every ROB.

Examples:
  daqflow engine testbed --seconds 2
  daqflow engine testbed --layout one --robs 1 --seconds 1
  daqflow engine testbed --layout apart --pin 0,1 --idle busy --seconds 5
  daqflow engine testbed --events 20200 --profile run.prof && daqflow profile run.prof --out profile-out
  daqflow engine testbed --subfarm --seconds 2           # ROB → EBIF → SFI → handler → SFO

With --subfarm every built crate fragment goes on to the SFI, which formats the event and
injects it into the dummy event handler (a process of its own), which forwards it to the SFO;
the run fails unless every built event reached the SFO.";

pub fn run(args: &EngineArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        EngineCommand::Testbed(a) => testbed(a),
        EngineCommand::Handler(a) => handler(a),
    }
}

fn handler(a: &HandlerArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let listener = std::net::TcpListener::bind(a.listen).with_context(|| format!("listening on {}", a.listen))?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let forwarded = crate::bench::subfarm::run_handler(listener, a.to, a.window).context("the event handler")?;
    eprintln!("event handler: {forwarded} events forwarded");
    Ok(ExitCode::SUCCESS)
}

fn testbed(a: &TestbedArgs) -> anyhow::Result<ExitCode> {
    let seconds = match (a.seconds, a.events) {
        (Some(s), _) => {
            ensure!(s.is_finite() && s > 0.0, "--seconds must be a positive number");
            Some(Duration::from_secs_f64(s))
        }
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(1)),
    };
    ensure!(a.events != Some(0), "--events must be at least 1");
    let layout = match (a.layout, &a.pin) {
        (LayoutArg::One, None) => Layout::OneScheduler,
        (LayoutArg::One, Some(_)) => anyhow::bail!("--pin needs --layout apart"),
        (LayoutArg::Apart, None) => Layout::RobsApart(None),
        (LayoutArg::Apart, Some(cores)) => {
            ensure!(cores.len() == 2, "--pin takes two cores: the ROBs' and the others' (e.g. --pin 0,1)");
            Layout::RobsApart(Some((cores[0], cores[1])))
        }
    };
    let idle = match a.idle {
        IdleArg::Default => IdleStrategy::default(),
        IdleArg::Busy => IdleStrategy::BUSY,
        IdleArg::Lazy => IdleStrategy::LAZY,
    };
    let subfarm = a.subfarm.then(|| -> anyhow::Result<_> {
        Ok(crate::bench::testbed::SubfarmConfig {
            handler: crate::bench::subfarm::HandlerMode::Process(std::env::current_exe()?),
            sfo_directory: a.sfo_dir.clone(),
            ..Default::default()
        })
    });
    let subfarm = subfarm.transpose()?;
    let config = TestbedConfig { robs: a.robs, events: a.events, subfarm, ..Default::default() };
    let fifo_capacity = config.fifo_capacity;
    let testbed = Testbed::new(config.clone()).context("setting up the test bed")?;
    let sizes: Vec<String> = config.fragment_sizes.iter().map(|(s, w)| format!("{s} B ×{w}")).collect();
    println!(
        "testbed: {} ROB(s), {}; fragments {}; accept:reject:ROI {}:{}:{}; event manager {} pages of {} B per ROB",
        config.robs,
        match layout {
            Layout::OneScheduler => "one scheduler thread".to_owned(),
            Layout::RobsApart(None) => "ROBs on one thread, TRG + collector + level 2 on another".to_owned(),
            Layout::RobsApart(Some((r, o))) => format!("ROBs on core {r}, TRG + collector + level 2 on core {o}"),
        },
        sizes.join(" / "),
        config.ratio.accept,
        config.ratio.reject,
        config.ratio.roi,
        config.event_manager.pages,
        config.event_manager.page_size,
    );
    let ring = a.ring.max(2);
    // Calibrate before the schedulers start, so that they do not disturb it.
    let calibration = a.profile.as_ref().map(|_| profile::calibrate(Duration::from_millis(50), 10_000));
    let mut report = testbed
        .run_profiled(layout, seconds, a.profile.as_ref().map(|_| ring), idle)
        .context("running the test bed")?;
    print_report(&report);
    if let (Some(path), Some(calibration)) = (&a.profile, calibration) {
        let threads = report.stamps();
        let stamps: usize = threads.iter().map(|t| t.stamps.len()).sum();
        let lost: u64 = threads.iter().map(|t| t.lost).sum();
        let dump = ProfileDump::new(calibration, threads);
        dump.write(path).context("writing the profile")?;
        println!(
            "profile: wrote {} ({} thread(s), {stamps} stamps{}); read it with `daqflow profile {}`",
            path.display(),
            dump.threads.len(),
            if lost > 0 {
                format!(", the latest of each thread: {lost} older ones did not fit the ring of {ring}")
            } else {
                String::new()
            },
            path.display()
        );
    }
    match consistency(&mut report, fifo_capacity) {
        Some(in_flight) => {
            println!(
                "consistent: every event generated was rejected, discarded or is still held, at every ROB{}",
                if in_flight > 0 {
                    format!(" ({in_flight} ROI fragment(s) were still on their way to level 2 when the run stopped)")
                } else {
                    String::new()
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!("INCONSISTENT: the counts above do not add up");
            Ok(ExitCode::from(1))
        }
    }
}

/// Whether every event and every ROI fragment is accounted for (the test bed drains the ROI
/// data in flight before it reports): `Some(0)` if so, `None` if not.
pub fn consistency(report: &mut TestbedReport, _fifo_capacity: usize) -> Option<u64> {
    report.is_consistent().then_some(0)
}

fn print_report(r: &TestbedReport) {
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let decided = r.decided();
    let rate = decided as f64 / secs;
    println!(
        "ran {secs:.3} s: {decided} events decided and freed at every ROB: {} events/s ({} per event)",
        format::si(rate),
        if rate > 0.0 { format!("{:.0} ns", 1e9 / rate) } else { "-".into() }
    );
    for i in 0..r.generated.len() {
        println!(
            "  rob{i}: generated {}, rejected {}, discarded {}, held {}, ROI fragments sent {}",
            r.generated[i], r.rejected[i], r.discarded[i], r.held[i], r.roi_sent[i]
        );
    }
    println!("  TRG: {} accepts, {} rejects, {} ROIs", r.accepts, r.rejects, r.rois);
    println!(
        "  collector: {} crate fragments built ({}); level 2: {} ROI fragments received",
        r.built,
        format::bytes(r.built_bytes as f64),
        r.roi_received
    );
    if let Some(f) = &r.subfarm {
        println!(
            "  sub-farm: SFI received {} crate fragments, formatted {} events, injected {} into the event handler; \
             SFO received {} ({}), wrote or dropped {}",
            f.received,
            f.built,
            f.sent,
            f.sfo_received,
            format::bytes(f.sfo_bytes as f64),
            f.sfo_done
        );
    }
    for s in &r.schedulers {
        let busy = s.cycles.saturating_sub(s.idle_cycles);
        let tasks: Vec<String> =
            s.tasks.iter().map(|t| format!("{} {}", t.name, format::si(t.actions as f64))).collect();
        println!(
            "  scheduler {}: {} cycles ({} with work), {} parks; actions: {}",
            s.name,
            format::si(s.cycles as f64),
            format::si(busy as f64),
            s.parks,
            tasks.join(", ")
        );
    }
}
