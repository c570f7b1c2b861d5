//! `daqflow bench evb`: the CMS event-builder paper's figures 4–7 on this machine.
//!
//! Every repetition of every point starts a whole event builder with
//! [`run_local`](crate::evb_cmd::run_local): a system file of the EVM, the RUs, the BUs and the
//! sources that the operator runs, each a component process (`daqflow component KIND`), the
//! sources free-running with the cached payload (one pattern with a fresh header per fragment,
//! its CRC computed once per size: cheap sources, so that the builder is what is measured).
//! Rates are taken over a window after a warm-up, from the components' own counters and clocks;
//! a point fails if the operator's accounting says an event was lost (or cannot say) or any
//! component reported an error.
//!
//! - (a) `ru`: RU throughput vs fragment size, 256 B … 64 KiB, with 4, 8 and 16 streams into one
//!   RU; one EVM, two BUs that build and discard (fig. 4). A dedicated `target` point: 1 KiB × 8
//!   streams through 1 RU → 1 BU.
//! - (b) `bu`: BU throughput of one BU fed by 1 RU × 8 streams, vs event size for the tasks
//!   `build` (no CRC check), `crc` (CRC check of every fragment) and `write` (CRC check and data
//!   files in a fresh directory under `/dev/shm`), and vs builder threads 1 … 4 (fig. 5), `crc`
//!   and `write` (1, 2, 4): what writing costs against the same threads without files.
//! - (b') `replay`: the BU's builder threads fed from memory (`daqflow_evb::bu::replay`: the
//!   same tasks, FIFOs and outputs, no RU, EVM or socket), 128 KiB events of 4 RUs × 8
//!   fragments, tasks `build`, `crc` and `write`, 1, 2 and 4 threads (and 8 with 8 CPUs or
//!   more): what building costs and how it scales, with each thread's CPU time and, for `crc`,
//!   this thread's CRC32C of the same fragments as the reference.
//! - (c) `scaling`: 1×1, 2×2 and 4×4 RUs × BUs at a few fragment sizes, 2 streams per RU (fig. 6).
//! - (d) `realistic`: log-normal fragment sizes per stream from a stream table, means 500 B … 8 KiB
//!   and relative RMS 0.5, through 2 RUs × 2 BUs (fig. 7).
//!
//! - (e) `pinning`: one BU fed by 1 RU × 8 streams checking CRCs (as (b)), unpinned and
//!   pinned the way CMS DAQ2 pins its event builder: the EVM, the RU and the sources on the
//!   first half of the CPUs this process may use, the BU on the other half (`cpus = [..]` of
//!   each component; needs at least two CPUs).
//!
//! - (f) `contention`: the target's builder (1 KiB × 8 streams, 1 RU → 1 BU) with 0, 1, 2, 4
//!   processes spinning beside it for the whole repetition (`daqflow bench-helper busy`); the
//!   goal is events/s ≥ 0.8 × quiet × CPUs / (CPUs + k).
//!
//! Every repetition first measures the raw reference, one blocking TCP connection over
//! 127.0.0.1 between two threads moving fragment-sized messages, so that `ratio_to_raw`
//! compares two numbers taken under the same load; (a)'s points then measure the raw relay of
//! their topology ([`super::relay`]: senders → one relay → receivers, as processes), and
//! `ratio_to_relay` compares the RU with it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};
use super::helper::{Helper, helper_args};
use super::{TempDir, ram_disk};
use crate::evb_cmd::{LocalArgs, run_local};

/// Seconds of every event-builder run before the measurement window opens.
const WARMUP_S: f64 = 0.5;

/// What a BU does with each built event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    /// Build and check the structure, no CRC check, discard.
    Build,
    /// Build and check every fragment's CRC, discard.
    Crc,
    /// Build, check the CRCs, write data files into a fresh directory under `/dev/shm`.
    Write,
}

impl Task {
    fn name(self) -> &'static str {
        match self {
            Task::Build => "build",
            Task::Crc => "crc",
            Task::Write => "write",
        }
    }
}

/// Which side's throughput a point reports as `mb_per_s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Fragment bytes into all RUs.
    Ru,
    /// Event bytes out of all BUs.
    Bu,
}

/// One event builder to measure.
#[derive(Debug, Clone)]
struct Setup {
    rus: u32,
    bus: u32,
    /// Streams (sources) per RU.
    streams: u32,
    /// Fixed fragment size, or the mean of the stream table's.
    fragment: usize,
    task: Task,
    /// Builder threads per BU.
    threads: usize,
    /// Per-stream log-normal sizes (overrides `fragment` in the sources).
    table: Option<PathBuf>,
    side: Side,
    /// `evb local --cpus KIND=LIST` for each kind: the components pinned (empty: none).
    cpus: Vec<String>,
    /// Whether to measure the raw relay of the same topology ([`super::relay`]) too.
    relay: bool,
    /// Busy processes competing for the CPUs during the whole repetition.
    busy: usize,
}

impl Setup {
    fn new(rus: u32, bus: u32, streams: u32, fragment: usize) -> Setup {
        Setup {
            rus,
            bus,
            streams,
            fragment,
            task: Task::Build,
            threads: 1,
            table: None,
            side: Side::Ru,
            cpus: Vec::new(),
            relay: false,
            busy: 0,
        }
    }
}

/// The pinned layout of (e): the EVM, the RUs and the sources on the first half of `allowed`,
/// the BUs on the rest; none with fewer than two CPUs.
fn pinned_layout(allowed: &daqflow_wire::affinity::CpuSet) -> Option<Vec<String>> {
    let cpus = allowed.cpus();
    if cpus.len() < 2 {
        return None;
    }
    let (front, back) = cpus.split_at(cpus.len() / 2);
    let list = |c: &[usize]| c.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let (front, back) = (list(front), list(back));
    Some(vec![format!("evm={front}"), format!("ru={front}"), format!("source={front}"), format!("bu={back}")])
}

/// One repetition: the competing load if any, the raw reference, the raw relay if asked for,
/// then the event builder.
fn point(s: &Setup, window: f64, raw_time: Duration, n: u64) -> anyhow::Result<Metrics> {
    // Killed when dropped, at the end of the repetition; the limit only bounds a process this
    // one could not kill.
    let limit = (window + WARMUP_S + 120.0).to_string();
    let _busy = (0..s.busy)
        .map(|_| Helper::spawn(&helper_args(&["busy", "--seconds", &limit])))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let raw = super::raw::one_hop(s.fragment, raw_time)?;
    let relay_of = || super::relay::measure((s.rus * s.streams) as usize, s.bus as usize, s.fragment, raw_time);
    let relay = if s.relay { Some(relay_of()?) } else { None };
    let out = match s.task {
        Task::Write => Some(TempDir::new(&ram_disk(), "evb", &format!("out-{n}"))?),
        Task::Build | Task::Crc => None,
    };
    let args = LocalArgs {
        rus: s.rus,
        bus: s.bus,
        streams: s.streams,
        seconds: WARMUP_S + window,
        fragment_size: s.fragment,
        stream_table: s.table.clone(),
        output: out.as_ref().map(|d| d.0.clone()),
        threads: s.threads,
        no_crc: s.task == Task::Build,
        cached_payload: true,
        cpus: s.cpus.clone(),
        ..LocalArgs::default()
    };
    let r = run_local(&args, WARMUP_S, false)?;
    drop(out);
    // The run's and the components' own words, the first few of them (a failing run reports
    // one per source).
    let errors = &r.errors;
    let why = match errors.len() {
        0 => String::new(),
        1..=3 => format!(": {}", errors.join("; ")),
        n => format!(": {}; and {} more", errors[..3].join("; "), n - 3),
    };
    let lost = match r.lost {
        Some(0) => 0,
        Some(n) => bail!("{n} event(s) lost{why}"),
        None => bail!("no complete accounting of lost events ({}){why}", r.run.unknown.join("; ")),
    };
    if !r.clean {
        bail!("a component failed{why}");
    }
    if r.events_per_s <= 0.0 {
        bail!("no event built in the measurement window");
    }
    let mb = match s.side {
        Side::Ru => r.ru_mb_per_s,
        Side::Bu => r.bu_mb_per_s,
    };
    let raw = super::raw::settle(raw, mb, || super::raw::one_hop(s.fragment, raw_time))?;
    let m = Metrics::new().with("events_per_s", r.events_per_s).with("mb_per_s", mb);
    let mut m = super::raw::with_ratio(m, "ratio_to_raw", mb, &raw);
    if let Some(relay) = relay {
        let relay = super::raw::settle(relay, mb, relay_of)?;
        m = super::raw::with_reference(m, "relay_mb_per_s", "ratio_to_relay", mb, &relay);
    }
    Ok(m.with("lost_events", lost as f64))
}

/// Options of the event-builder suite.
#[derive(Debug, Clone)]
pub struct EvbOptions {
    /// Fragment sizes of (a).
    pub sizes: Vec<usize>,
    /// Only these cases (`None`: all).
    pub cases: Option<Vec<String>>,
}

/// The suite's cases, in the order it runs them.
pub const CASES: [&str; 8] = ["ru", "target_1ru_1bu", "bu", "replay", "scaling", "realistic", "pinning", "contention"];

/// Means of the `realistic` stream table: 500 B … 8 KiB, evenly spaced on a log scale.
fn table_means(streams: usize) -> Vec<f64> {
    let (lo, hi) = (500.0_f64, 8192.0_f64);
    (0..streams).map(|k| (lo * (hi / lo).powf(k as f64 / (streams - 1).max(1) as f64)).round()).collect()
}

/// Runs the suite: the results and the failed points.
pub fn run(config: BenchConfig, opts: EvbOptions) -> anyhow::Result<(Suite, Vec<String>)> {
    // Every event-builder run has its own warm-up before its window: an extra unrecorded
    // repetition per point would only add process start-ups.
    let config = BenchConfig { warmup: false, ..config };
    let mut suite =
        Suite::new("evb", "the event builder (CMS DAQ2 figs. 4–7): RU, BU, scaling, realistic sizes", config.clone());
    let quick = config.quick;
    let window = config.measure_time.as_secs_f64();
    let raw_time = Duration::from_secs_f64(if quick { 0.25 } else { 0.4 });
    let mut n = 0u64;
    let mut failures: Vec<String> = Vec::new();
    // A failing point (lost events, a component error) is reported and the suite goes on; the
    // command fails at the end, after writing the files.
    let cases = opts.cases.clone();
    let mut measure = |suite: &mut Suite, case: &str, params: Vec<(&'static str, Param)>, s: Setup| {
        if cases.as_ref().is_some_and(|c| !c.iter().any(|c| c == case)) {
            return;
        }
        let r = suite.measure(case, params, || {
            n += 1;
            point(&s, window, raw_time, n)
        });
        if let Err(e) = r {
            eprintln!("\n  FAILED: {e:#}");
            failures.push(format!("{e:#}"));
        }
    };

    // (a) One RU: fragment size × streams, two BUs building and discarding.
    let ru_streams: &[u32] = if quick { &[8] } else { &[4, 8, 16] };
    for &streams in ru_streams {
        for &f in &opts.sizes {
            let p = vec![("fragment_bytes", f.into()), ("streams", (streams as usize).into()), rus(1), bus(2)];
            measure(&mut suite, "ru", p, Setup { relay: true, ..Setup::new(1, 2, streams, f) });
        }
    }
    // The first target's exact point: 1 KiB × 8 streams, 1 RU → 1 BU.
    let p = vec![("fragment_bytes", 1024usize.into()), ("streams", 8usize.into()), rus(1), bus(1)];
    measure(&mut suite, "target_1ru_1bu", p, Setup { relay: true, ..Setup::new(1, 1, 8, 1024) });

    // (b) One BU fed by 1 RU × 8 streams: event size × task, then builder threads.
    let bu_streams = 8u32;
    let bu_sizes: &[usize] = if quick { &[16384] } else { &[1024, 4096, 16384, 65536] };
    let threads_fragment = 16384usize;
    let bu_params = |f: usize, task: Task, threads: usize| -> Vec<(&'static str, Param)> {
        vec![
            ("task", task.name().into()),
            ("threads", threads.into()),
            ("event_bytes", (f * bu_streams as usize).into()),
            ("fragment_bytes", f.into()),
            ("streams", (bu_streams as usize).into()),
            rus(1),
            bus(1),
        ]
    };
    for task in [Task::Build, Task::Crc, Task::Write] {
        for &f in bu_sizes {
            let s = Setup { task, side: Side::Bu, ..Setup::new(1, 1, bu_streams, f) };
            measure(&mut suite, "bu", bu_params(f, task, 1), s);
        }
    }
    // threads = 1 is the `crc` and `write` points of the size sweep above. Writing is measured
    // at 2 and 4 threads too (one file stream per thread): its cost is against `crc` at the
    // same threads.
    let threads: &[usize] = if quick { &[2] } else { &[2, 3, 4] };
    let thread_tasks: &[Task] = if quick { &[Task::Crc] } else { &[Task::Crc, Task::Write] };
    for &task in thread_tasks {
        for &t in threads {
            if task == Task::Write && t == 3 {
                continue;
            }
            let s = Setup { task, threads: t, side: Side::Bu, ..Setup::new(1, 1, bu_streams, threads_fragment) };
            measure(&mut suite, "bu", bu_params(threads_fragment, task, t), s);
        }
    }

    // (b') The BU's builder threads fed from memory (no RU, EVM or socket in front of them):
    // 128 KiB events of 4 RUs × 8 fragments of 4 KiB, 1 … 4 threads.
    let mut replay_failures = Vec::new();
    if cases.as_ref().is_none_or(|c| c.iter().any(|c| c == "replay")) {
        let (r_rus, r_frags, r_size) = (4u32, 8u32, 4096usize);
        // 64 MiB of events: more than the caches hold, as a BU's data in flight (8 MiB quick).
        let pool = daqflow_evb::bu::replay::ready_events(if quick { 64 } else { 512 }, r_rus, r_frags, r_size);
        let event_bytes = (r_rus * r_frags) as usize * r_size;
        let tasks: &[Task] = if quick { &[Task::Crc] } else { &[Task::Build, Task::Crc, Task::Write] };
        // 8 threads too where there are 8 CPUs (issue 29: ≥ 3× at 4 threads on ≥ 8 cores).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let replay_threads: Vec<usize> =
            if quick { vec![1, 2] } else { [1, 2, 4, 8].into_iter().filter(|&t| t <= 4 || t <= cpus).collect() };
        for &task in tasks {
            for &t in &replay_threads {
                let p = vec![
                    ("task", task.name().into()),
                    ("threads", t.into()),
                    ("event_bytes", event_bytes.into()),
                    ("fragment_bytes", r_size.into()),
                    ("streams", ((r_rus * r_frags) as usize).into()),
                    rus(r_rus),
                ];
                suite.measure_or_record("replay", p, &mut replay_failures, || replay_point(&pool, task, t, window));
            }
        }
    }

    // (c) Scaling: N RUs × N BUs, 2 streams per RU.
    let scale_streams = 2u32;
    let scale_n: &[u32] = if quick { &[1, 2] } else { &[1, 2, 4] };
    let scale_sizes: &[usize] = if quick { &[1024] } else { &[1024, 4096, 16384] };
    for &f in scale_sizes {
        for &k in scale_n {
            let p = vec![
                rus(k),
                bus(k),
                ("streams", (scale_streams as usize).into()),
                ("fragment_bytes", f.into()),
                ("sources", ((k * scale_streams) as usize).into()),
            ];
            measure(&mut suite, "scaling", p, Setup::new(k, k, scale_streams, f));
        }
    }

    // (d) Realistic: per-stream log-normal sizes from a table, 2 RUs × 2 BUs × 4 streams.
    let (real_rus, real_streams) = (2u32, 4u32);
    let means = table_means((real_rus * real_streams) as usize);
    let table_dir = TempDir::new(&std::env::temp_dir(), "evb", "table")?;
    let table = table_dir.0.join("streams.txt");
    let mut text = String::from("# source_id mean_bytes rms_bytes (log-normal; RU r has sources r*4 .. r*4+3)\n");
    for (id, m) in means.iter().enumerate() {
        text.push_str(&format!("{id} {m} {}\n", (m * 0.5).round()));
    }
    std::fs::write(&table, &text).with_context(|| format!("writing {}", table.display()))?;
    let mean = (means.iter().sum::<f64>() / means.len() as f64).round() as usize;
    let p = vec![
        rus(real_rus),
        bus(2),
        ("streams", (real_streams as usize).into()),
        ("fragment_bytes", mean.into()),
        ("event_bytes", (means.iter().sum::<f64>().round() as usize).into()),
    ];
    let s = Setup { table: Some(table.clone()), ..Setup::new(real_rus, 2, real_streams, mean) };
    measure(&mut suite, "realistic", p, s);
    drop(table_dir);

    // (e) Pinning: the same builder unpinned and pinned, alternating so that both see the
    // machine's load alike.
    let allowed = daqflow_wire::affinity::allowed().context("the CPUs this process may use")?;
    let layout = pinned_layout(&allowed);
    let pin_sizes: &[usize] = if quick { &[16384] } else { &[4096, 16384] };
    if let Some(layout) = &layout {
        for &f in pin_sizes {
            for pinned in [false, true] {
                let mut p = bu_params(f, Task::Crc, 1);
                p.insert(0, ("pinning", if pinned { "pinned" } else { "unpinned" }.into()));
                let s = Setup {
                    task: Task::Crc,
                    side: Side::Bu,
                    cpus: if pinned { layout.clone() } else { Vec::new() },
                    ..Setup::new(1, 1, bu_streams, f)
                };
                measure(&mut suite, "pinning", p, s);
            }
        }
    }

    // (f) Contention: the target's builder with k processes spinning beside it, started before
    // the repetition's raw reference and killed after its run.
    let busy: &[usize] = if quick { &[0, 2] } else { &[0, 1, 2, 4] };
    for &k in busy {
        let p = vec![
            ("busy", k.into()),
            ("fragment_bytes", 1024usize.into()),
            ("streams", 8usize.into()),
            rus(1),
            bus(1),
            ("cpus", allowed.cpus().len().into()),
        ];
        measure(&mut suite, "contention", p, Setup { busy: k, ..Setup::new(1, 1, 8, 1024) });
    }

    failures.extend(replay_failures);
    suite.plots = plots(ru_streams, threads_fragment, scale_sizes);
    notes(&mut suite, window, raw_time, &means);
    replay_notes(&mut suite);
    suite.note(match &layout {
        Some(l) => format!(
            "pinning: as bu (crc, 1 RU × 8 streams → 1 BU, mb_per_s out of the BU), unpinned (every process where the \
             OS puts it, on CPUs {allowed}) and pinned with each component's `cpus` ({}); at each size the \
             unpinned repetitions run first, then the pinned ones. On a machine shared with other work the difference is within the spread unless the medians' \
             ranges do not overlap.",
            l.join(" ")
        ),
        None => format!("pinning: not measured (this process may use only CPU {allowed}; pinning needs two)"),
    });
    suite.note_failures(&failures);
    Ok((suite, failures))
}

fn rus(n: u32) -> (&'static str, Param) {
    ("rus", (n as usize).into())
}

fn bus(n: u32) -> (&'static str, Param) {
    ("bus", (n as usize).into())
}

fn notes(suite: &mut Suite, window: f64, raw_time: Duration, means: &[f64]) {
    suite.note(super::machine_note());
    suite.note(format!(
        "Every repetition runs a whole event builder as separate processes (`daqflow component` EVM, RUs, BUs, \
         sources, started and driven by the operator from a generated system file: `daqflow evb local`'s \
         machinery) on loopback for {WARMUP_S} s of warm-up and a window of about {window} s (rates from the \
         components' own counters and clocks, published once a second). \
         Sources are free-running and send the cached payload (one pattern with a fresh header per fragment, \
         its CRC computed once per size: cheap sources). RUs check every fragment's CRC on arrival. BUs build and discard without a CRC \
         check (task build) except in (b): crc checks every fragment's CRC, write also writes data files into a \
         fresh directory under /dev/shm (removed after each run). mb_per_s: fragment bytes into all RUs per second \
         (ru, target_1ru_1bu, scaling, realistic) or event bytes out of all BUs (bu); MB = 10^6 bytes. \
         lost_events: from the operator's accounting of the run (the EVM's, by role); a point fails if it is not \
         0 or a component reported an error."
    ));
    suite.note(format!(
        "raw reference (raw_mb_per_s), measured before each run: one blocking TCP connection over 127.0.0.1 between \
         two threads of the bench process, messages of the point's fragment size (the table's mean in realistic), \
         written 1 MiB per call, read 4 MiB at a time, for {} s after a 0.1 s warm-up. It is loopback's best case for one hop; the builder moves \
         every byte twice over loopback (source → RU, RU → BU), checks CRCs and runs 1 + RUs + BUs + sources processes \
         on the same cores, so ratio_to_raw well below 1 is expected here.",
        raw_time.as_secs_f64()
    ));
    suite.note(
        "scaling: 2 streams per RU (4×4 × 8 streams would be 32 sources on this 2-core machine). On a cluster each \
         RU and BU has its own host and NIC, so the aggregate throughput grows with the number of RU/BU pairs until \
         the switch's bisection bandwidth is reached (the paper's fig. 6); here every process shares the same cores \
         and loopback, so the aggregate is flat or drops as processes are added.",
    );
    let list: Vec<String> = means.iter().map(|m| format!("{m:.0}")).collect();
    suite.note(format!(
        "realistic: 8 streams with log-normal sizes, means {} B and RMS half the mean, sources 0–3 on RU 0 and 4–7 \
         on RU 1 (so the RUs are unbalanced, as in physics running); fragment_bytes is the mean of the means, \
         event_bytes their sum.",
        list.join(", ")
    ));
    let pick = |case: &str, f: f64, streams: f64| {
        suite.points.iter().find(|p| {
            p.case == case
                && p.param("fragment_bytes").and_then(Param::num) == Some(f)
                && p.param("streams").and_then(Param::num) == Some(streams)
        })
    };
    let target1 = pick("target_1ru_1bu", 1024.0, 8.0).and_then(|p| p.metric("events_per_s")).map(|s| s.median);
    let target2 = pick("ru", 16384.0, 8.0).and_then(|p| p.metric("ratio_to_raw")).map(|s| s.median);
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    suite.note(match target1 {
        Some(v) => format!(
            "target: 1 KiB fragments × 8 streams, 1 RU → 1 BU (build, no CRC): ≥ 100 kHz events — measured {} \
             events/s ({})",
            crate::format::si(v),
            verdict(v >= 100e3)
        ),
        None => "target: 1 KiB × 8 streams, 1 RU → 1 BU: ≥ 100 kHz events — not measured".into(),
    });
    suite.note(match target2 {
        Some(v) => format!(
            "target: 16 KiB fragments (ru, 8 streams, 2 BUs): ≥ 50% of the raw loopback reference — measured {:.0}% \
             ({})",
            v * 100.0,
            verdict(v >= 0.5)
        ),
        None => "target: 16 KiB fragments: ≥ 50% of raw loopback — not measured (no ru point at 16 KiB × 8)".into(),
    });
    relay_notes(suite);
    write_notes(suite);
    contention_notes(suite);
}

/// What writing files costs the BU: each `bu` point of task `write` against the `crc` point of
/// the same event size and threads (the same work without files). Issue 29's goal: ≤ 10 % on a
/// machine of 8 cores or more.
pub(super) fn write_notes(suite: &mut Suite) {
    super::writing_cost_note(
        suite,
        "bu",
        ("write", "crc"),
        ("threads", " thread(s)"),
        "writing files (bu: write against crc, the same builder without files; the cost is 1 − write/crc)",
    );
}

/// The goal of issue 29 for the RU against the raw relay: 80 % at 4 KiB and above, 60 % below.
fn relay_goal(fragment: f64) -> f64 {
    if fragment >= 4096.0 { 0.8 } else { 0.6 }
}

fn relay_notes(suite: &mut Suite) {
    suite.note(
        "raw relay (relay_mb_per_s, ru and target_1ru_1bu), measured before each run after the raw reference: the \
         RU's topology without the RU, each a process of its own — as many `raw-sender`s as the point has streams, \
         writing messages of the fragment size (1 MiB per call) to one `raw-relay`, which reads up to 4 MiB per input, \
         takes one message of every input per event and writes whole events with writev(2) (up to 1 MiB and 1024 \
         messages per call, no copy, no CRC, no framing) to as many `raw-receiver`s as the point has BUs, in turn; \
         the rate is the relay's, from 0.1 s after its first write to its last. ratio_to_relay is the RU's \
         mb_per_s over it.",
    );
    let mut lines = Vec::new();
    for p in suite.points.iter().filter(|p| p.case == "ru" || p.case == "target_1ru_1bu") {
        let (Some(f), Some(streams), Some(bus)) = (
            p.param("fragment_bytes").and_then(Param::num),
            p.param("streams").and_then(Param::num),
            p.param("bus").and_then(Param::num),
        ) else {
            continue;
        };
        let Some(r) = p.metric("ratio_to_relay").map(|m| m.median) else { continue };
        let goal = relay_goal(f);
        let what = crate::format::bytes(f);
        let verdict = if f < 1024.0 {
            "no goal below 1 KiB".to_string()
        } else if r >= goal {
            format!("goal ≥ {:.0}% met", goal * 100.0)
        } else {
            format!("goal ≥ {:.0}% NOT met", goal * 100.0)
        };
        lines.push(format!("{what} × {streams} streams → {bus} BU(s): {:.0}% ({verdict})", r * 100.0));
    }
    if !lines.is_empty() {
        suite.note(format!("target: the RU against the raw relay — {}", lines.join("; ")));
    }
}

/// One repetition of `replay`: the BU's builder threads fed `pool` from memory for `window` s.
fn replay_point(
    pool: &[daqflow_evb::bu::ReadyEvent],
    task: Task,
    threads: usize,
    window: f64,
) -> anyhow::Result<Metrics> {
    use daqflow_evb::bu::{BuConfig, Output};
    let dir = match task {
        Task::Write => Some(TempDir::new(std::path::Path::new("/dev/shm"), "evb", &format!("replay-{threads}"))?),
        Task::Build | Task::Crc => None,
    };
    let mut config =
        BuConfig { threads, check_crc: task != Task::Build, output: Output::Discard, ..Default::default() };
    if let Some(d) = &dir {
        (config.output, config.directory) = (Output::Files, d.0.clone());
    }
    // The reference, in the same repetition: this thread computing the CRC32C of the same
    // events' fragments, one after the other, for 0.3 s: what one CPU checks at most.
    let crc_ref = (task == Task::Crc).then(|| {
        let (start, mut bytes, mut sink) = (Instant::now(), 0u64, 0u32);
        'pool: loop {
            for ev in pool {
                for p in &ev.parts {
                    let sf = daqflow_wire::SuperFragment::parse(p.bytes.clone()).expect("made by ready_events");
                    for f in sf.fragments().flatten() {
                        sink ^= daqflow_wire::crc::crc32c(f.payload_slice());
                    }
                    bytes += p.bytes.len() as u64;
                }
                if start.elapsed() >= Duration::from_millis(300) {
                    break 'pool;
                }
            }
        }
        std::hint::black_box(sink);
        let seconds = start.elapsed().as_secs_f64();
        super::raw::Reference { bytes, seconds, window: seconds }
    });
    let r =
        daqflow_evb::bu::replay::replay(&config, pool, Duration::from_millis(200), Duration::from_secs_f64(window))?;
    anyhow::ensure!(r.flagged == 0, "replay: {} events flagged by the checks", r.flagged);
    anyhow::ensure!(r.events > 0, "replay: no event built");
    anyhow::ensure!(r.lost == 0, "replay: {} of {} events handed out were neither built nor queued", r.lost, r.handed);
    drop(dir);
    let mut m = Metrics::new()
        .with("events_per_s", r.events_per_s())
        .with("mb_per_s", r.bytes as f64 / r.seconds / 1e6)
        .with("lost_events", r.lost as f64);
    if let Some(b) = r.max_busy() {
        m = m.with("busy_pct", 100.0 * b);
    }
    if let Some(reference) = crc_ref {
        // Per thread the CPUs can run at once, against one thread's CRC: withheld if the
        // reference was slower than that (it did not measure what one CPU checks).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_thread = r.bytes as f64 / r.seconds / 1e6 / threads.min(cpus) as f64;
        m = super::raw::with_reference(m, "crc_mb_per_s", "ratio_to_crc", per_thread, &reference);
    }
    Ok(m)
}

/// Each task's rate with more builder threads against one, and how busy one thread was.
fn replay_notes(suite: &mut Suite) {
    let at = |task: &str, t: f64| {
        suite
            .points
            .iter()
            .find(|p| {
                p.case == "replay" && super::is_task(p, task) && p.param("threads").and_then(Param::num) == Some(t)
            })
            .and_then(|p| Some((p.metric("events_per_s")?.median, p.metric("busy_pct").map(|b| b.median))))
    };
    let mut lines = Vec::new();
    for task in ["build", "crc", "write"] {
        let Some((one, busy)) = at(task, 1.0) else { continue };
        let mut parts = vec![format!(
            "{task}: 1 thread {} events/s{}",
            crate::format::si(one),
            busy.map(|b| format!(" ({b:.0} % busy)")).unwrap_or_default()
        )];
        for t in [2.0, 4.0, 8.0] {
            if let Some((rate, _)) = at(task, t) {
                parts.push(format!("{t:.0} threads {:.2}×", rate / one));
            }
        }
        lines.push(parts.join(", "));
    }
    if lines.is_empty() {
        return;
    }
    suite.note(format!(
        "replay: the BU's builder threads (the same tasks, FIFOs and outputs a BU starts for a run) fed from memory by \
         this process's thread by the BU's own hand-out (the next builder with room, round-robin), 0.2 s of warm-up, \
         then the window: 512 events (64 in --quick) of 4 RUs \
         × 8 fragments of 4 KiB (64 MiB, more than the caches), over and over; no RU, EVM or socket. task build: build and \
         discard; crc: and check every fragment's CRC; write: and write data files under /dev/shm. busy_pct: the \
         busiest builder thread's CPU time over the window (from /proc). lost_events: events handed out and \
         neither built nor left in a builder's FIFO (a point fails unless 0). crc_mb_per_s (task crc): \
         the reference, measured before each repetition: this thread computing the CRC32C of every fragment of the \
         same events, one after the other, for 0.3 s; ratio_to_crc: mb_per_s over that × the builder threads the CPUs can run at once \
         (withheld where the reference was slower than the point per thread). On {} CPUs, with the feeding thread \
         beside the builders — {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        lines.join("; ")
    ));
}

fn contention_notes(suite: &mut Suite) {
    let at = |k: f64| {
        suite
            .points
            .iter()
            .find(|p| p.case == "contention" && p.param("busy").and_then(Param::num) == Some(k))
            .and_then(|p| Some((p.metric("events_per_s")?.median, p.param("cpus").and_then(Param::num)?)))
    };
    let Some((quiet, cpus)) = at(0.0) else { return };
    suite.note(format!(
        "contention: the target's builder (1 KiB × 8 streams, 1 RU → 1 BU, build) with `busy` processes beside it, \
         each spinning on a CPU without a pause from before the repetition's raw reference to after its run \
         (`daqflow bench-helper busy`), all in this process's session (one scheduling group). With {cpus:.0} CPUs \
         and k busy processes a fair scheduler leaves the builder {cpus:.0}/({cpus:.0}+k) of the machine; the goal is \
         events/s ≥ 0.8 × quiet × {cpus:.0}/({cpus:.0}+k), with lost_events 0."
    ));
    let mut lines = Vec::new();
    for p in suite.points.iter().filter(|p| p.case == "contention") {
        let Some(k) = p.param("busy").and_then(Param::num).filter(|&k| k > 0.0) else { continue };
        let Some(rate) = p.metric("events_per_s").map(|m| m.median) else { continue };
        let fair = quiet * cpus / (cpus + k);
        let share = rate / fair;
        lines.push(format!(
            "{k:.0} busy: {} events/s, {:.2} × the fair share of the quiet {} ({})",
            crate::format::si(rate),
            share,
            crate::format::si(quiet),
            if share >= 0.8 { "met" } else { "NOT met" }
        ));
    }
    if !lines.is_empty() {
        suite.note(format!("target: the builder under contention — {}", lines.join("; ")));
    }
}

fn plots(ru_streams: &[u32], threads_fragment: usize, scale_sizes: &[usize]) -> Vec<Plot> {
    let s = |label: &str, case: &'static str, metric: &'static str, filter: Vec<(&'static str, Param)>| Series {
        label: label.into(),
        case,
        metric,
        filter,
    };
    let per_streams = |metric: &'static str| -> Vec<Series> {
        ru_streams
            .iter()
            .map(|&k| s(&format!("{k} streams"), "ru", metric, vec![("streams", (k as usize).into())]))
            .collect()
    };
    let mut ru_mb = per_streams("mb_per_s");
    // The reference depends on the fragment size only: draw the one measured with the fewest
    // streams (the runs most likely to complete at every size).
    let raw_streams = ru_streams.iter().copied().min().unwrap_or(8);
    ru_mb.push(s(
        &format!("raw loopback TCP (with the {raw_streams}-stream points)"),
        "ru",
        "raw_mb_per_s",
        vec![("streams", (raw_streams as usize).into())],
    ));
    ru_mb.extend(ru_streams.iter().map(|&k| {
        s(
            &format!("raw relay, {k} senders → 2 receivers"),
            "ru",
            "relay_mb_per_s",
            vec![("streams", (k as usize).into())],
        )
    }));
    let tasks: Vec<Series> = [Task::Build, Task::Crc, Task::Write]
        .iter()
        .map(|t| s(t.name(), "bu", "mb_per_s", vec![("task", t.name().into()), ("threads", 1usize.into())]))
        .collect();
    let scale = |metric: &'static str| -> Vec<Series> {
        scale_sizes
            .iter()
            .map(|&f| {
                s(
                    &format!("{} fragments", crate::format::bytes(f as f64)),
                    "scaling",
                    metric,
                    vec![("fragment_bytes", f.into())],
                )
            })
            .collect()
    };
    vec![
        Plot {
            title: "(a) one RU, 2 BUs: RU throughput vs fragment size (fig. 4)".into(),
            x: "fragment_bytes",
            x_label: "fragment size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "MB/s into the RU".into(),
            y_log: false,
            series: ru_mb,
        },
        Plot {
            title: "(a) one RU: events/s vs fragment size".into(),
            x: "fragment_bytes",
            x_label: "fragment size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "events per second".into(),
            y_log: true,
            series: per_streams("events_per_s"),
        },
        Plot {
            title: "(b) one BU (1 RU × 8 streams): throughput vs event size (fig. 5)".into(),
            x: "event_bytes",
            x_label: "event size (bytes of payload)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "MB/s out of the BU".into(),
            y_log: false,
            series: tasks,
        },
        Plot {
            title: format!(
                "(b) one BU, CRC check (and files), {} events: builder threads",
                crate::format::bytes((threads_fragment * 8) as f64)
            ),
            x: "threads",
            x_label: "builder threads".into(),
            x_log: false,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: false,
            series: [Task::Crc, Task::Write]
                .into_iter()
                .map(|t| {
                    s(
                        t.name(),
                        "bu",
                        "events_per_s",
                        vec![("task", t.name().into()), ("fragment_bytes", threads_fragment.into())],
                    )
                })
                .collect(),
        },
        Plot {
            title: "(b') builder threads fed from memory, 128 KiB events (replay)".into(),
            x: "threads",
            x_label: "builder threads".into(),
            x_log: false,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: true,
            series: ["build", "crc", "write"]
                .into_iter()
                .map(|t| s(t, "replay", "events_per_s", vec![("task", t.into())]))
                .collect(),
        },
        Plot {
            title: "(c) N RUs × N BUs, 2 streams per RU: aggregate throughput (fig. 6)".into(),
            x: "rus",
            x_label: "RUs = BUs (all on this host)".into(),
            x_log: false,
            x_bytes: false,
            y_label: "MB/s into all RUs".into(),
            y_log: false,
            series: scale("mb_per_s"),
        },
        Plot {
            title: "(c) N RUs × N BUs: events/s".into(),
            x: "rus",
            x_label: "RUs = BUs (all on this host)".into(),
            x_log: false,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: false,
            series: scale("events_per_s"),
        },
        Plot {
            title: "(e) one BU (1 RU × 8 streams, CRC check): unpinned vs pinned (CMS DAQ2's binding)".into(),
            x: "event_bytes",
            x_label: "event size (bytes of payload)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "MB/s out of the BU".into(),
            y_log: false,
            series: ["unpinned", "pinned"]
                .iter()
                .map(|&m| s(m, "pinning", "mb_per_s", vec![("pinning", m.into())]))
                .collect(),
        },
        Plot {
            title: "(f) 1 KiB × 8 streams, 1 RU → 1 BU, with busy processes beside it".into(),
            x: "busy",
            x_label: "busy processes, each spinning on a CPU".into(),
            x_log: false,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: false,
            series: vec![s("events/s", "contention", "events_per_s", vec![])],
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_layout_puts_the_bus_on_cpus_of_their_own() {
        let set = |s: &str| s.parse::<daqflow_wire::affinity::CpuSet>().unwrap();
        assert_eq!(pinned_layout(&set("0")), None);
        assert_eq!(pinned_layout(&set("0-1")).unwrap(), ["evm=0", "ru=0", "source=0", "bu=1"]);
        assert_eq!(pinned_layout(&set("2-4,8")).unwrap(), ["evm=2,3", "ru=2,3", "source=2,3", "bu=4,8"]);
    }

    #[test]
    fn the_stream_table_spans_500_b_to_8_kib() {
        let m = table_means(8);
        assert_eq!((m.len(), m[0], m[7]), (8, 500.0, 8192.0));
        assert!(m.windows(2).all(|w| w[0] < w[1]), "{m:?}");
    }

    #[test]
    fn the_raw_reference_moves_bytes() {
        assert!(crate::bench::raw::one_hop(1024, Duration::from_millis(50)).unwrap().mb_per_s() > 0.0);
    }
}
