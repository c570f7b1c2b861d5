//! `daqflow bench engine`: the ATLAS DAQ-Unit paper's figures 2, 3 and 11–16 on this machine.
//!
//! Cases:
//! - `timestamp`: what a time stamp costs (fig. 2): 10 000 back-to-back stamps, median and
//!   p99; and what a probe costs when nothing records (`Probe::enter` while off).
//! - `scheduler`: a scheduler of 4 trivial tasks (polls always true), profiled: poll exit →
//!   action entry and action exit → next poll entry, medians corrected for one stamp (fig. 3);
//!   and, unprofiled, the whole cost of one task's poll + action.
//! - `event_manager`: insert (with the copy of a 512 or 768 B fragment), lookup (get and walk
//!   the fragments) and remove, in batches, with the paper's 200 pages of 1 KiB and with 4096
//!   (the work of the ROB's IN, TRG and DC actions, figs. 12–16).
//! - `rob`: the paper's set-up (`testbed::Testbed`: ROBs, TRG 1:100:10, collector) for the
//!   measurement time, on one scheduler thread or with the ROBs apart: events decided and freed
//!   at every ROB per second (the paper: 190 kHz, 5.8 µs per event).
//!
//! - `subfarm`: the paper's sub-farm (sections 4.7, 4.8): an SFI generating two crate fragments
//!   of 256 bytes per event, buffering them in its event manager, formatting each event and
//!   injecting it into the dummy event handler (a process of its own, over TCP), which forwards
//!   it to the SFO; events through the SFO per second, and each task's mean action time from a
//!   profiled run (the paper: ~8.5 ms per event, dominated by the handler's API over a 10 Mbit
//!   network; ~300 µs to generate and build).
//!
//! The PNG shows the distributions (figs. 2, 3 and, from a profiled test-bed run, the ROB's
//! loop time of fig. 11) next to the metrics and the paper's values.

use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure};
use daqflow_engine::profile::{self, Calibration, Probe, ProfileDump};
use daqflow_engine::{EventManager, EventManagerConfig, IdleStrategy, Scheduler, task};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::harness::{BenchConfig, Metrics, Param, Suite};
use super::testbed::{Layout, Testbed, TestbedConfig};
use crate::engine_cmd::consistency;
use crate::profile_cmd::{self, BLUE, GREEN, GREY, Histogram, ORANGE, RED, Rows, Stats};

/// The paper's figures (1999, PowerPC 604 at 300 MHz).
const PAPER_STAMP_NS: f64 = 250.0;
const PAPER_POLL_TO_ACTION_NS: f64 = 200.0;
const PAPER_ACTION_TO_POLL_NS: f64 = 300.0;
const PAPER_ROB_NS_PER_EVENT: f64 = 5800.0;
/// Targets on this machine (the issue).
const TARGET_TRANSITION_NS: f64 = 20.0;
const TARGET_ROB_NS_PER_EVENT: f64 = 300.0;

/// Tasks of the scheduler case.
const TASKS: usize = 4;

/// Distributions kept from the last repetition, for the PNG.
#[derive(Debug, Default)]
pub struct Figures {
    /// Stamp overhead, ns (fig. 2).
    overhead: Vec<f64>,
    /// Poll exit → action entry, ns (fig. 3a).
    poll_to_action: Vec<f64>,
    /// Action exit → next poll entry, ns (fig. 3b).
    action_to_poll: Vec<f64>,
    /// The ROB thread's loop (rob0.in poll entry to the next), ns, with whether an action ran.
    rob_loop: Vec<(f64, bool)>,
}

fn median(v: &[f64]) -> f64 {
    Stats::of(v).map_or(0.0, |s| s.median)
}

/// ns per `Probe::enter` + `Probe::exit` pair / 2 while no thread records, over `time`.
fn disabled_probe_ns(time: Duration) -> f64 {
    let probe = Probe::new("bench.disabled");
    const BATCH: u64 = 1 << 20;
    let start = Instant::now();
    let mut calls = 0u64;
    loop {
        let p = std::hint::black_box(&probe);
        for _ in 0..BATCH / 2 {
            p.enter();
            p.exit();
        }
        calls += BATCH;
        if start.elapsed() >= time {
            break;
        }
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

/// A scheduler of [`TASKS`] trivial tasks, every poll true; the last task stops it after
/// `cycles` actions if given.
fn trivial_scheduler(name: &str, cycles: Option<u64>) -> Scheduler {
    let mut s = Scheduler::new(name).with_idle(IdleStrategy::BUSY);
    let stop = s.stop_handle();
    for i in 0..TASKS {
        let limit = if i + 1 == TASKS { cycles } else { None };
        let stop = stop.clone();
        s.add(task::from_fn(
            format!("t{i}"),
            0u64,
            |_| true,
            move |n| {
                *n += 1;
                if limit == Some(*n) {
                    stop.stop();
                }
                Ok(())
            },
        ));
    }
    s
}

/// The scheduler case: transitions from a profiled run of `cycles` cycles, the cost of a task
/// with and without profiling.
fn scheduler_point(time: Duration, calibration: &Calibration, figures: &mut Figures) -> anyhow::Result<Metrics> {
    // Profiled: a ring large enough for every stamp (4 per task and cycle).
    let cycles = 50_000u64;
    let ring = (cycles as usize + 16) * TASKS * 4;
    let report = trivial_scheduler("bench-sched-profiled", Some(cycles)).with_profiling(ring).spawn()?.join()?;
    let stamps = report.stamps.ok_or_else(|| anyhow!("the profiled scheduler returned no stamps"))?;
    ensure!(stamps.lost == 0, "the ring lost {} stamps", stamps.lost);
    let (first, last) = (stamps.stamps.first().map_or(0, |s| s.tsc), stamps.stamps.last().map_or(0, |s| s.tsc));
    let actions: u64 = report.tasks.iter().map(|t| t.actions).sum();
    let profiled_ns = calibration.ns(last.wrapping_sub(first)) / actions.max(1) as f64;
    let dump = ProfileDump::new(calibration.clone(), vec![stamps]);
    let t = dump.transitions();
    ensure!(!t.poll_to_action.is_empty() && !t.action_to_poll.is_empty(), "no transitions in the stamps");
    let (p2a, a2p) = (median(&t.poll_to_action), median(&t.action_to_poll));
    figures.poll_to_action = t.poll_to_action;
    figures.action_to_poll = t.action_to_poll;

    // Unprofiled: the live counters over the measurement time, after a short warm-up.
    let running = trivial_scheduler("bench-sched", None).spawn()?;
    let total = |r: &daqflow_engine::Running| r.counters().tasks().iter().map(|t| t.actions).sum::<u64>();
    std::thread::sleep(Duration::from_millis(5));
    let (t0, a0) = (Instant::now(), total(&running));
    std::thread::sleep(time);
    let (t1, a1) = (Instant::now(), total(&running));
    running.stop()?;
    ensure!(a1 > a0, "the scheduler ran no action in {time:?}");
    let cycle_ns = (t1 - t0).as_nanos() as f64 / (a1 - a0) as f64;
    Ok(Metrics::new()
        .with("ns_poll_to_action", p2a)
        .with("ns_action_to_poll", a2p)
        .with("ns_per_task_cycle", cycle_ns)
        .with("ns_per_task_cycle_profiled", profiled_ns))
}

/// The event-manager case: insert, lookup and remove `batch` one-fragment events at a time.
fn event_manager_point(pages: usize, batch: usize, time: Duration) -> anyhow::Result<Metrics> {
    let mut em =
        EventManager::new(EventManagerConfig { page_size: 1024, pages, large_bytes: Some(0), ..Default::default() })?;
    let data: Vec<u8> = (0..768).map(|i| i as u8).collect();
    // The paper's sizes, 512 and 768 B in the ratio 1:3.
    let sizes = [512usize, 768, 768, 768];
    let (mut insert, mut lookup, mut remove) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut ops, mut next, mut checksum) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < time || ops == 0 {
        let first = next;
        let t0 = Instant::now();
        for id in first..first + batch as u64 {
            em.insert(id, 0, &data[..sizes[(id % 4) as usize]])?;
        }
        let t1 = Instant::now();
        for id in first..first + batch as u64 {
            let event = em.get(id).ok_or_else(|| anyhow!("event {id} not found"))?;
            for f in event.fragments() {
                checksum = checksum.wrapping_add(f.data.len() as u64 + u64::from(f.data[f.data.len() - 1]));
            }
        }
        let t2 = Instant::now();
        for id in first..first + batch as u64 {
            ensure!(em.remove(id) == Some(1), "event {id}: remove did not find one fragment");
        }
        let t3 = Instant::now();
        insert += t1 - t0;
        lookup += t2 - t1;
        remove += t3 - t2;
        next += batch as u64;
        ops += batch as u64;
    }
    std::hint::black_box(checksum);
    ensure!(em.free_pages() == pages && em.events() == 0, "the event manager did not empty");
    let ns = |d: Duration| d.as_nanos() as f64 / ops as f64;
    Ok(Metrics::new().with("ns_insert", ns(insert)).with("ns_lookup", ns(lookup)).with("ns_remove", ns(remove)))
}

/// The ROB case: the test bed for `time`.
fn rob_point(robs: u32, layout: Layout, time: Duration) -> anyhow::Result<Metrics> {
    let config = TestbedConfig { robs, ..Default::default() };
    let fifo_capacity = config.fifo_capacity;
    let mut report = Testbed::new(config)?.run(layout, Some(time))?;
    ensure!(consistency(&mut report, fifo_capacity).is_some(), "the test bed's counts do not add up: {report:?}");
    let decided = report.decided();
    ensure!(decided > 0, "no event was decided in {time:?}");
    let events_per_s = decided as f64 / report.elapsed.as_secs_f64();
    Ok(Metrics::new().with("events_per_s", events_per_s).with("ns_per_event", 1e9 / events_per_s))
}

/// The ROB thread's loop time (fig. 11) from a profiled test-bed run with the ROBs apart.
fn rob_loop(time: Duration, calibration: &Calibration) -> anyhow::Result<Vec<(f64, bool)>> {
    let config = TestbedConfig::default();
    let fifo_capacity = config.fifo_capacity;
    let mut report = Testbed::new(config)?.run_profiled(
        Layout::RobsApart(None),
        Some(time),
        Some(1 << 20),
        IdleStrategy::default(),
    )?;
    ensure!(
        consistency(&mut report, fifo_capacity).is_some(),
        "the profiled test bed's counts do not add up: {report:?}"
    );
    let dump = ProfileDump::new(calibration.clone(), report.stamps());
    let thread = dump.threads.iter().find(|t| t.thread == "robs").ok_or_else(|| anyhow!("no stamps of the ROBs"))?;
    let probe = dump
        .probes
        .iter()
        .position(|n| n == "robs/rob0.in.poll")
        .ok_or_else(|| anyhow!("no probe robs/rob0.in.poll"))?;
    Ok(profile_cmd::loop_intervals(&dump, thread, probe as u32))
}

/// The sub-farm case: SFI → event handler (a process) → SFO for `time`, both schedulers
/// profiled; events per second through the SFO and each task's mean action time.
fn subfarm_point(time: Duration, calibration: &Calibration) -> anyhow::Result<Metrics> {
    use super::subfarm::{Handler, HandlerMode, Sfi, SfiInput, Sfo, SubfarmShared};
    use std::sync::Arc;
    let boxed = |e: daqflow_engine::BoxError| anyhow!("{e}");
    let shared = Arc::new(SubfarmShared::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let handler =
        Handler::start(&HandlerMode::Process(std::env::current_exe()?), listener.local_addr()?, 16).map_err(boxed)?;
    let em = EventManagerConfig { page_size: 1024, pages: 200, ..Default::default() };
    let input = SfiInput::Generate { crates: 2, size: 256, limit: u64::MAX };
    let sfi = Sfi::new(input, em, 1, handler.addr, shared.clone()).map_err(boxed)?;
    let sfo = Sfo::accept(&listener, 4 << 20, None, 1, shared.clone()).map_err(boxed)?;
    let mut a = Scheduler::new("sfi").with_profiling(1 << 20);
    a.add_module(sfi);
    let mut b = Scheduler::new("sfo").with_profiling(1 << 20);
    b.add_module(sfo);
    let (stop_a, stop_b) = (a.stop_handle(), b.stop_handle());
    let start = Instant::now();
    let (a, b) = (a.spawn()?, b.spawn()?);
    std::thread::sleep(time);
    stop_a.stop();
    let ra = a.join()?;
    let elapsed = start.elapsed();
    // What the SFI injected reaches the SFO (bounded).
    let until = Instant::now() + Duration::from_secs(5);
    while shared.counts().sfo_done < shared.counts().sent && Instant::now() < until && !b.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop_b.stop();
    let rb = b.join()?;
    handler.join().map_err(boxed)?;
    let c = shared.counts();
    ensure!(
        c.sent == c.sfo_received && c.sfo_received == c.sfo_done && c.received >= 2 * c.built && c.built >= c.sent,
        "the sub-farm's counts do not add up: {c:?}"
    );
    ensure!(c.sfo_done > 0, "no event went through the sub-farm in {time:?}");
    let dump = ProfileDump::new(calibration.clone(), [ra.stamps, rb.stamps].into_iter().flatten().collect());
    let intervals = dump.intervals();
    let mean = |probe: &str| -> f64 {
        intervals
            .iter()
            .find(|(p, _)| dump.probe_name(*p) == probe)
            .and_then(|(_, v)| Stats::of(v))
            .map_or(0.0, |s| s.mean)
    };
    let events_per_s = c.sfo_done as f64 / elapsed.as_secs_f64();
    Ok(Metrics::new()
        .with("events_per_s", events_per_s)
        .with("us_per_event", 1e6 / events_per_s)
        .with("receive_action_ns", mean("sfi/sfi.receive.action"))
        .with("end_of_event_action_ns", mean("sfi/sfi.end_of_event.action"))
        .with("output_poll_ns", mean("sfi/sfi.output.poll"))
        .with("output_action_ns", mean("sfi/sfi.output.action"))
        .with("sfo_input_action_ns", mean("sfo/sfo.input.action"))
        .with("sfo_output_action_ns", mean("sfo/sfo.output.action")))
}

pub fn run(config: BenchConfig) -> anyhow::Result<(Suite, Figures)> {
    let mut suite = Suite::new(
        "engine",
        "the data-plane engine (ATLAS DAQ-Unit figs. 2, 3, 11–16): time stamps, scheduler, event manager, ROB loop",
        config.clone(),
    );
    let time = config.measure_time;
    let mut figures = Figures::default();
    let window = time.clamp(Duration::from_millis(10), Duration::from_millis(100));

    let mut calibration = None;
    suite.measure("timestamp", vec![("pairs", 10_000usize.into())], || {
        let cal = profile::calibrate(window, 10_000);
        let ns: Vec<f64> = cal.overhead_ticks.iter().map(|&t| cal.ns(u64::from(t))).collect();
        let s = Stats::of(&ns).ok_or_else(|| anyhow!("calibration measured no stamp"))?;
        let disabled = disabled_probe_ns(time.min(Duration::from_millis(250)));
        let m = Metrics::new()
            .with("ns_per_timestamp", cal.overhead_ns())
            .with("ns_per_timestamp_p99", s.p99)
            .with("ns_per_disabled_probe", disabled)
            .with("ticks_per_ns", cal.ticks_per_ns);
        figures.overhead = ns;
        calibration = Some(cal);
        Ok(m)
    })?;
    let calibration = calibration.ok_or_else(|| anyhow!("no calibration"))?;

    suite.measure("scheduler", vec![("tasks", TASKS.into())], || scheduler_point(time, &calibration, &mut figures))?;

    for (pages, batch) in [(200usize, 100usize), (4096, 2000)] {
        let params = vec![("page_bytes", 1024usize.into()), ("pages", pages.into()), ("batch", batch.into())];
        suite.measure("event_manager", params, || event_manager_point(pages, batch, time))?;
    }

    for (robs, layout) in [(2u32, "one"), (2, "apart"), (1, "one"), (1, "apart")] {
        let l = if layout == "one" { Layout::OneScheduler } else { Layout::RobsApart(None) };
        suite.measure("rob", vec![("layout", layout.into()), ("robs", u64::from(robs).into())], || {
            rob_point(robs, l, time)
        })?;
    }
    suite.measure("subfarm", vec![("crates", 2usize.into()), ("crate_bytes", 256usize.into())], || {
        subfarm_point(time, &calibration)
    })?;
    eprintln!("  rob loop, profiled (fig. 11)");
    figures.rob_loop = rob_loop(time.min(Duration::from_millis(200)), &calibration)?;

    notes(&mut suite, &figures);
    Ok((suite, figures))
}

fn metric(suite: &Suite, case: &str, filter: &[(&str, Param)], name: &str) -> Option<f64> {
    suite
        .points
        .iter()
        .filter(|p| p.case == case && filter.iter().all(|(n, v)| p.param(n) == Some(v)))
        .find_map(|p| p.metric(name))
        .map(|s| s.median)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn notes(suite: &mut Suite, figures: &Figures) {
    suite.note(super::machine_note());
    suite.note(
        "the paper (ATLAS DAQ-Unit, 1999, PowerPC 604 at 300 MHz, code built without -O): one time stamp 250 ns \
         (fig. 2); poll exit → action entry 0.2 µs and action exit → next poll 0.3 µs (fig. 3); ROB 5.8 µs per event, \
         190 kHz (fig. 11). Targets here: scheduler transitions under 20 ns, ROB loop under 0.3 µs per event \
         (over 3 MHz).",
    );
    suite.note(
        "timestamp: 10 000 back-to-back stamps (median; p99); ns_per_disabled_probe: one Probe::enter or exit while \
         no thread records (the cost of leaving probes in the code). scheduler: 4 tasks whose polls always succeed \
         and whose actions add one; transitions from a profiled run of 50 000 cycles, medians corrected for one \
         stamp (0 means below what a stamp resolves); ns_per_task_cycle: one poll + action unprofiled (live \
         counters over the measurement time), _profiled: the same with the 4 stamps. event_manager: one-fragment \
         events of 512/768 B (1:3), insert copies the bytes; lookup is get + walking the fragments; batches of \
         `batch` events. rob: the paper's set-up in one process (ROBs, TRG 1:100:10 grouping 10 rejects, collector, \
         level 2); events decided and freed at every ROB per second; `one`: everything on one thread, `apart`: the \
         ROBs on one thread and the rest on another (the paper's set-up; on 2 cores the two threads fill the \
         machine).",
    );
    let t = |name: &str| metric(suite, "scheduler", &[], name);
    if let (Some(p2a), Some(a2p)) = (t("ns_poll_to_action"), t("ns_action_to_poll")) {
        suite.note(format!(
            "target: scheduler transitions under {TARGET_TRANSITION_NS} ns: {p2a:.1} / {a2p:.1} ns: {}",
            verdict(p2a < TARGET_TRANSITION_NS && a2p < TARGET_TRANSITION_NS)
        ));
    }
    let best = suite
        .points
        .iter()
        .filter(|p| p.case == "rob" && p.param("robs") == Some(&Param::Num(2.0)))
        .filter_map(|p| p.metric("ns_per_event").map(|s| s.median))
        .fold(f64::INFINITY, f64::min);
    if best.is_finite() {
        suite.note(format!(
            "target: ROB loop under {TARGET_ROB_NS_PER_EVENT} ns per event (2 ROBs, best layout): {best:.0} ns, \
             {} events/s: {}",
            crate::format::si(1e9 / best),
            verdict(best < TARGET_ROB_NS_PER_EVENT)
        ));
    }
    let idle: Vec<f64> = figures.rob_loop.iter().filter(|l| !l.1).map(|l| l.0).collect();
    let busy: Vec<f64> = figures.rob_loop.iter().filter(|l| l.1).map(|l| l.0).collect();
    if let (Some(i), Some(b)) = (Stats::of(&idle), Stats::of(&busy)) {
        suite.note(format!(
            "ROB loop (fig. 11; ROBs apart, profiled, 2 ROBs = 6 tasks; rob0.in poll entry to the next, corrected \
             for the stamps inside): idle loops median {:.0} ns ({} loops), loops with an action mean {:.0} ns ({} \
             loops); the paper: idle ~2 µs, with actions 5.8 µs",
            i.median, i.count, b.mean, b.count
        ));
    }
}

/// Prints the table, writes the files, and replaces the harness's PNG with the engine's panels
/// (histograms the harness's line plots cannot draw).
pub fn finish(suite: &Suite, figures: &Figures) -> anyhow::Result<()> {
    suite.finish()?;
    if let Some(dir) = &suite.config.out {
        render(suite, figures, &dir.join(format!("{}.png", suite.name)))?;
    }
    Ok(())
}

fn render(suite: &Suite, figures: &Figures, path: &std::path::Path) -> anyhow::Result<()> {
    let busy: Vec<f64> = figures.rob_loop.iter().map(|l| l.0).collect();
    let title = format!("daqflow bench engine — {}", suite.title);
    profile_cmd::grid_png(path, &title, 3, (640, 440), 6, |i, area| match i {
        0 => profile_cmd::draw_histogram(
            area,
            &Histogram {
                title: "(fig. 2) cost of one time stamp (paper: 250 ns)".into(),
                values: &figures.overhead,
                x_label: "ns between back-to-back stamps",
                color: BLUE,
            },
        ),
        1 => profile_cmd::draw_histogram(
            area,
            &Histogram {
                title: "(fig. 3a) poll exit → action entry (paper: 0.2 µs)".into(),
                values: &figures.poll_to_action,
                x_label: "ns, corrected for one stamp",
                color: ORANGE,
            },
        ),
        2 => profile_cmd::draw_histogram(
            area,
            &Histogram {
                title: "(fig. 3b) action exit → next poll entry (paper: 0.3 µs)".into(),
                values: &figures.action_to_poll,
                x_label: "ns, corrected for one stamp",
                color: ORANGE,
            },
        ),
        3 => profile_cmd::draw_histogram(
            area,
            &Histogram {
                title: "(fig. 11) ROB loop, rob0.in poll to poll, profiled".into(),
                values: &busy,
                x_label: "ns, corrected for the stamps inside",
                color: GREEN,
            },
        ),
        4 => {
            let get = |case: &str, f: &[(&str, Param)], m: &str| metric(suite, case, f, m).unwrap_or(0.0);
            let small = [("pages", Param::Num(200.0))];
            let large = [("pages", Param::Num(4096.0))];
            let bars = vec![
                ("time stamp".to_owned(), get("timestamp", &[], "ns_per_timestamp"), BLUE),
                ("  paper".to_owned(), PAPER_STAMP_NS, GREY),
                ("disabled probe".to_owned(), get("timestamp", &[], "ns_per_disabled_probe"), BLUE),
                ("poll → action".to_owned(), get("scheduler", &[], "ns_poll_to_action"), ORANGE),
                ("  paper".to_owned(), PAPER_POLL_TO_ACTION_NS, GREY),
                ("action → poll".to_owned(), get("scheduler", &[], "ns_action_to_poll"), ORANGE),
                ("  paper".to_owned(), PAPER_ACTION_TO_POLL_NS, GREY),
                ("task poll + action".to_owned(), get("scheduler", &[], "ns_per_task_cycle"), ORANGE),
                ("EM insert, 200 pages".to_owned(), get("event_manager", &small, "ns_insert"), GREEN),
                ("EM lookup, 200 pages".to_owned(), get("event_manager", &small, "ns_lookup"), GREEN),
                ("EM remove, 200 pages".to_owned(), get("event_manager", &small, "ns_remove"), GREEN),
                ("EM insert, 4096 pages".to_owned(), get("event_manager", &large, "ns_insert"), GREEN),
                ("EM lookup, 4096 pages".to_owned(), get("event_manager", &large, "ns_lookup"), GREEN),
                ("EM remove, 4096 pages".to_owned(), get("event_manager", &large, "ns_remove"), GREEN),
            ];
            draw_bars(area, "time per operation (log scale; grey: the paper)", &bars, Some(TARGET_TRANSITION_NS))
        }
        _ => {
            let mut bars: Vec<(String, f64, RGBColor)> = suite
                .points
                .iter()
                .filter(|p| p.case == "rob")
                .filter_map(|p| {
                    let layout = match p.param("layout") {
                        Some(Param::Text(t)) => t.clone(),
                        _ => "?".into(),
                    };
                    let robs = p.param("robs").and_then(Param::num).unwrap_or(0.0);
                    Some((format!("{robs} ROB(s), {layout}"), p.metric("ns_per_event")?.median, RED))
                })
                .collect();
            bars.push(("paper, 2 ROBs".into(), PAPER_ROB_NS_PER_EVENT, GREY));
            draw_bars(area, "ROB test bed: ns per event (dashed: target)", &bars, Some(TARGET_ROB_NS_PER_EVENT))
        }
    })
}

/// Horizontal bars on a logarithmic axis, labelled with their values; `target` as a dashed line.
fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    bars: &[(String, f64, RGBColor)],
    target: Option<f64>,
) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let positive: Vec<f64> = bars.iter().map(|b| b.1).chain(target).filter(|v| *v > 0.0).collect();
    let lo = positive.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let hi = positive.iter().copied().fold(0.0, f64::max).max(10.0) * 6.0;
    let n = bars.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(160)
        .build_cartesian_2d((lo..hi).log_scale(), Rows::new(n))
        .map_err(err)?;
    let x_fmt = |v: &f64| crate::format::si(*v);
    let y_fmt = |v: &f64| {
        let i = v.round() as usize;
        if i < n { bars[n - 1 - i].0.clone() } else { String::new() }
    };
    chart
        .configure_mesh()
        .x_desc("ns")
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 11))
        .axis_desc_style(("sans-serif", 12))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    for (i, (_, v, color)) in bars.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        if *v > 0.0 {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(lo, y - 0.35), (*v, y + 0.35)],
                    color.mix(0.85).filled(),
                )))
                .map_err(err)?;
        }
        let label = if *v > 0.0 { crate::format::si(*v) } else { "0 (below a stamp)".into() };
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (if *v > 0.0 { *v * 1.1 } else { lo * 1.1 }, y + 0.25),
                ("sans-serif", 11),
            )))
            .map_err(err)?;
    }
    if let Some(t) = target {
        let dashes = 24;
        let span = n as f64;
        chart
            .draw_series((0..dashes).map(|k| {
                let a = -0.5 + span * k as f64 / dashes as f64;
                PathElement::new(vec![(t, a), (t, a + span / dashes as f64 * 0.5)], RED.stroke_width(1))
            }))
            .map_err(err)?;
    }
    Ok(())
}
