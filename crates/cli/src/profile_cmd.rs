//! `daqflow profile DUMP`: what a time-stamp profile says (ATLAS DAQ-Unit paper, section 4).
//!
//! Reads a [`ProfileDump`] (written by `daqflow engine testbed --profile FILE` or by any program
//! that profiles its schedulers) and prints, per probe, the distribution of the time from entry
//! to exit (the paper's figs. 3, 5, 12, …), the scheduler's transitions and each thread's cycle
//! time. With `--out DIR` it draws `histograms.png` (one histogram per probe) and
//! `sequence.png` (a sequence diagram of a time window, like figs. 4 and 17).
//!
//! The drawing helpers here (histogram panels, a categorical axis) are shared with
//! `daqflow bench engine`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Once;

use anyhow::{Context, anyhow};
use daqflow_engine::profile::{ProfileDump, ThreadStamps};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Arguments of `daqflow profile`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The profile dump to read.
    #[arg(value_name = "DUMP")]
    pub dump: PathBuf,
    /// Write histograms.png and sequence.png into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Sequence diagram: start of the window, in µs after the thread's first stamp.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub from_us: f64,
    /// Sequence diagram: length of the window in µs.
    #[arg(long, value_name = "W", default_value_t = 50.0)]
    pub window_us: f64,
    /// Sequence diagram: the thread (scheduler) to draw [default: the first in the dump].
    #[arg(long, value_name = "NAME")]
    pub thread: Option<String>,
}

pub const AFTER_HELP: &str = "\
Prints, for every probe, the time from entry to exit (count, min, median, mean, p99, max in ns,
corrected for the cost of one time stamp, and a small histogram from min to p99); the
scheduler's transitions (poll exit → action entry, action exit → next poll entry); and each
thread's cycle time (its first task's poll entry to the next one). With --out DIR it writes
DIR/histograms.png (one panel per probe) and DIR/sequence.png (entry-to-exit bars of every probe
over a window of one thread, raw stamp times).

Exit status: 0 on success, 2 if the dump is missing or damaged.

Examples:
  daqflow engine testbed --seconds 0.2 --profile run.prof
  daqflow profile run.prof
  daqflow profile run.prof --out profile-out
  daqflow profile run.prof --out profile-out --thread robs --from-us 1000 --window-us 20";

/// Count, min, median, mean, p99 and max of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub count: usize,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    /// The statistics of `values`, `None` when empty.
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let at = |q: f64| v[((n - 1) as f64 * q).round() as usize];
        Some(Stats {
            count: n,
            min: v[0],
            median: at(0.5),
            mean: v.iter().sum::<f64>() / n as f64,
            p99: at(0.99),
            max: v[n - 1],
        })
    }
}

/// Registers the font that travels inside the binary (as the bench plots do).
pub fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

/// Colors of the panels.
pub const BLUE: RGBColor = RGBColor(31, 119, 180);
pub const RED: RGBColor = RGBColor(214, 39, 40);
pub const GREEN: RGBColor = RGBColor(44, 160, 44);
pub const ORANGE: RGBColor = RGBColor(255, 127, 14);
pub const GREY: RGBColor = RGBColor(127, 127, 127);

/// A categorical axis: rows `0..n` at integer positions, one key point (label) per row.
pub struct Rows(RangedCoordf64, usize);

impl Rows {
    /// Rows `0..n`.
    pub fn new(n: usize) -> Rows {
        Rows((-0.5..n.max(1) as f64 - 0.5).into(), n)
    }
}

impl Ranged for Rows {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;
    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.0.map(value, limit)
    }
    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.1).map(|i| i as f64).collect()
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.0.range()
    }
}

/// Which part of a scheduler a probe times, by its name.
fn probe_color(name: &str) -> RGBColor {
    if name.ends_with(".poll") {
        BLUE
    } else if name.ends_with(".action") {
        RED
    } else {
        GREEN
    }
}

/// A histogram panel: `values` (ns) from their minimum to their 99th percentile.
pub struct Histogram<'a> {
    pub title: String,
    pub values: &'a [f64],
    pub x_label: &'a str,
    pub color: RGBColor,
}

/// Draws one histogram panel into `area`.
pub fn draw_histogram<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, h: &Histogram) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let Some(s) = Stats::of(h.values) else {
        area.draw(&Text::new(format!("{}: no data", h.title), (20, 20), ("sans-serif", 15))).map_err(err)?;
        return Ok(());
    };
    let (lo, mut hi) = (s.min, if s.p99 > s.min { s.p99 } else { s.max });
    if hi <= lo {
        hi = lo + lo.abs().max(1.0) * 0.1;
    }
    // Quantised values (counter ticks): one bar per distinct value; otherwise 50 bins.
    let mut distinct: Vec<f64> = h.values.iter().copied().filter(|v| *v >= lo && *v <= hi).collect();
    distinct.sort_by(|a, b| a.total_cmp(b));
    distinct.dedup();
    let bars: Vec<(f64, f64, u64)> = if distinct.len() <= 60 {
        let gap = distinct.windows(2).map(|w| w[1] - w[0]).fold(hi - lo, f64::min).max((hi - lo) / 200.0);
        let mut counts = vec![0u64; distinct.len()];
        for v in h.values {
            if let Ok(i) = distinct.binary_search_by(|d| d.total_cmp(v)) {
                counts[i] += 1;
            }
        }
        distinct.iter().zip(counts).map(|(&d, c)| (d - gap * 0.4, d + gap * 0.4, c)).collect()
    } else {
        let bins = 50;
        let width = (hi - lo) / bins as f64;
        let mut counts = vec![0u64; bins];
        for &v in h.values {
            if v >= lo && v <= hi {
                counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
            }
        }
        counts.into_iter().enumerate().map(|(i, c)| (lo + i as f64 * width, lo + (i + 1) as f64 * width, c)).collect()
    };
    let above = h.values.iter().filter(|v| **v > hi).count();
    let top = bars.iter().map(|b| b.2).max().unwrap_or(1).max(1) as f64;
    let x0 = bars.first().map_or(lo, |b| b.0.min(lo));
    let x1 = bars.last().map_or(hi, |b| b.1.max(hi));
    let pad = (x1 - x0) * 0.03;
    let mut chart = ChartBuilder::on(area)
        .caption(&h.title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(58)
        .build_cartesian_2d(x0 - pad..x1 + pad, 0.0..top * 1.12)
        .map_err(err)?;
    let fmt = |v: &f64| crate::format::si(*v);
    chart
        .configure_mesh()
        .x_desc(h.x_label)
        .y_desc("entries")
        .x_label_formatter(&fmt)
        .y_label_formatter(&fmt)
        .x_labels(6)
        .y_labels(5)
        .label_style(("sans-serif", 11))
        .axis_desc_style(("sans-serif", 12))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            bars.iter()
                .filter(|b| b.2 > 0)
                .map(|&(a, b, c)| Rectangle::new([(a, 0.0), (b, c as f64)], h.color.mix(0.8).filled())),
        )
        .map_err(err)?;
    let (w, _) = area.dim_in_pixel();
    let label = format!(
        "n {}  median {}  mean {}  p99 {}  max {}{}",
        s.count,
        crate::format::si(s.median),
        crate::format::si(s.mean),
        crate::format::si(s.p99),
        crate::format::si(s.max),
        if above > 0 { format!("  ({above} beyond the axis)") } else { String::new() }
    );
    area.draw(&Text::new(label, (w as i32 / 2 - 170, 26), ("sans-serif", 11).into_font().color(&GREY))).map_err(err)?;
    Ok(())
}

/// Draws panels in a grid of `cols` columns into a PNG with a title line.
pub fn grid_png(
    path: &Path,
    title: &str,
    cols: usize,
    panel: (u32, u32),
    n: usize,
    mut draw: impl FnMut(usize, &DrawingArea<BitMapBackend, Shift>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    register_fonts();
    let cols = cols.clamp(1, n.max(1));
    let rows = n.max(1).div_ceil(cols);
    let size = (panel.0 * cols as u32, panel.1 * rows as u32 + 40);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (head, body) = root.split_vertically(40);
    head.draw(&Text::new(title.to_owned(), (14, 10), ("sans-serif", 19).into_font().style(FontStyle::Bold)))
        .map_err(|e| anyhow!("{e}"))?;
    let areas = body.split_evenly((rows, cols));
    for (i, area) in areas.iter().enumerate().take(n) {
        draw(i, area)?;
    }
    root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}

/// A text histogram on one line: `bins` columns from `lo` to `hi`, heights in eighths.
fn sparkline(values: &[f64], lo: f64, hi: f64, bins: usize) -> String {
    const LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let mut counts = vec![0u64; bins];
    let width = if hi > lo { (hi - lo) / bins as f64 } else { 1.0 };
    for &v in values {
        if v >= lo && v <= hi {
            counts[(((v - lo) / width) as usize).min(bins - 1)] += 1;
        }
    }
    let top = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    counts
        .iter()
        .map(|&c| if c == 0 { LEVELS[0] } else { LEVELS[((c as f64 / top * 8.0).ceil() as usize).clamp(1, 8)] })
        .collect()
}

/// The time from each entry of a thread's first task's poll to the next (the loop time, the
/// paper's fig. 11), in ns, corrected for the stamps recorded in between; `None` if the
/// thread has no poll probe.
pub fn cycle_times(dump: &ProfileDump, thread: &ThreadStamps) -> Option<(u32, Vec<f64>)> {
    let probe = thread.stamps.iter().map(|s| s.probe()).filter(|&p| dump.probe_name(p).ends_with(".poll")).min()?;
    Some((probe, loop_intervals(dump, thread, probe).into_iter().map(|(ns, _)| ns).collect()))
}

/// The time from each entry of `probe` to the next in `thread`, in ns corrected for the stamps
/// in between (every stamp costs the calibrated overhead), and whether an action ran in it.
pub fn loop_intervals(dump: &ProfileDump, thread: &ThreadStamps, probe: u32) -> Vec<(f64, bool)> {
    let cal = &dump.calibration;
    let overhead = cal.overhead_ns();
    let is_action: Vec<bool> = dump.probes.iter().map(|n| n.ends_with(".action")).collect();
    let mut out = Vec::new();
    let mut last: Option<(u64, usize)> = None;
    let mut busy = false;
    for (i, s) in thread.stamps.iter().enumerate() {
        if s.probe() == probe && !s.is_exit() {
            if let Some((tsc, at)) = last {
                let ns = cal.ns(s.tsc.wrapping_sub(tsc)) - overhead * (i - at) as f64;
                out.push((ns.max(0.0), busy));
            }
            last = Some((s.tsc, i));
            busy = false;
        } else if !s.is_exit() && is_action.get(s.probe() as usize).copied().unwrap_or(false) {
            busy = true;
        }
    }
    out
}

/// One row of the summary table.
fn summary_row(name: &str, values: &[f64], width: usize) -> String {
    match Stats::of(values) {
        None => format!("  {name:<width$}  {:>9}", 0),
        Some(s) => {
            let f = |v: f64| if v >= 1e5 { crate::format::si(v) } else { format!("{v:.1}") };
            format!(
                "  {name:<width$}  {:>9}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  |{}|",
                s.count,
                f(s.min),
                f(s.median),
                f(s.mean),
                f(s.p99),
                f(s.max),
                sparkline(values, s.min, s.p99.max(s.min), 24)
            )
        }
    }
}

fn header(width: usize) -> String {
    format!(
        "  {:<width$}  {:>9}  {:>8}  {:>8}  {:>8}  {:>8}  {:>9}  {}",
        "", "count", "min", "median", "mean", "p99", "max", "histogram, min … p99"
    )
}

/// An entry-to-exit bar of the sequence diagram, in ns from the window's start.
struct Bar {
    probe: u32,
    start: f64,
    end: f64,
}

/// The bars of `thread` in the window `[from_ns, from_ns + window_ns)` after its first stamp.
fn window_bars(dump: &ProfileDump, thread: &ThreadStamps, from_ns: f64, window_ns: f64) -> Vec<Bar> {
    let Some(first) = thread.stamps.first() else { return Vec::new() };
    let cal = &dump.calibration;
    let at = |tsc: u64| cal.ns(tsc.wrapping_sub(first.tsc)) - from_ns;
    let mut open: std::collections::HashMap<u32, f64> = Default::default();
    let mut bars = Vec::new();
    for s in &thread.stamps {
        let t = at(s.tsc);
        if t > window_ns {
            break;
        }
        if s.is_exit() {
            if let Some(start) = open.remove(&s.probe())
                && t >= 0.0
            {
                bars.push(Bar { probe: s.probe(), start: start.max(0.0), end: t });
            }
        } else {
            open.insert(s.probe(), t);
        }
    }
    // Entries in the window whose exit comes after it.
    bars.extend(open.into_iter().map(|(probe, start)| Bar { probe, start: start.max(0.0), end: window_ns }));
    bars
}

fn draw_sequence(
    path: &Path,
    dump: &ProfileDump,
    thread: &ThreadStamps,
    from_us: f64,
    window_us: f64,
) -> anyhow::Result<usize> {
    register_fonts();
    let bars = window_bars(dump, thread, from_us * 1e3, window_us * 1e3);
    let mut probes: Vec<u32> = bars.iter().map(|b| b.probe).collect();
    probes.sort_unstable();
    probes.dedup();
    let n = probes.len();
    let names: Vec<String> = probes.iter().map(|&p| dump.probe_name(p)).collect();
    let label_width = names.iter().map(|n| n.chars().count()).max().unwrap_or(10) as u32 * 7 + 20;
    let size = (1600, (n as u32 * 26 + 140).max(320));
    let root = BitMapBackend::new(path, size).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let title = format!(
        "daqflow profile — thread {}: {} … {} µs after its first stamp (entry → exit of each probe, raw stamps)",
        thread.thread,
        from_us,
        from_us + window_us
    );
    if n == 0 {
        root.draw(&Text::new(format!("{title}: no stamps in this window"), (20, 20), ("sans-serif", 16)))
            .map_err(err)?;
        root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
        return Ok(0);
    }
    // Row 0 (the first probe) at the top.
    let row = |p: u32| (n - 1 - probes.binary_search(&p).unwrap_or(0)) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 17))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(label_width)
        .build_cartesian_2d(0.0..window_us, Rows::new(n))
        .map_err(err)?;
    let x_fmt = |v: &f64| format!("{v:.1}");
    let y_fmt = |v: &f64| {
        let i = v.round() as usize;
        if i < n { names[n - 1 - i].clone() } else { String::new() }
    };
    chart
        .configure_mesh()
        .x_desc("µs from the start of the window")
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_labels(12)
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().map(|b| {
            let y = row(b.probe);
            let color = probe_color(&dump.probe_name(b.probe));
            Rectangle::new([(b.start / 1e3, y - 0.32), (b.end / 1e3, y + 0.32)], color.filled())
        }))
        .map_err(err)?;
    root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    Ok(bars.len())
}

fn draw_histograms(path: &Path, dump: &ProfileDump, source: &Path) -> anyhow::Result<usize> {
    let mut panels: Vec<(String, Vec<f64>, RGBColor)> = Vec::new();
    for (probe, values) in dump.intervals() {
        let name = dump.probe_name(probe);
        let color = probe_color(&name);
        panels.push((format!("{name}: entry → exit"), values, color));
    }
    let t = dump.transitions();
    if !t.poll_to_action.is_empty() || !t.action_to_poll.is_empty() {
        panels.push(("scheduler: poll exit → action entry".into(), t.poll_to_action, ORANGE));
        panels.push(("scheduler: action exit → next poll entry".into(), t.action_to_poll, ORANGE));
    }
    for thread in &dump.threads {
        if let Some((probe, values)) = cycle_times(dump, thread) {
            panels.push((format!("{} cycle ({} entry → next)", thread.thread, dump.probe_name(probe)), values, GREY));
        }
    }
    let title = format!("daqflow profile {} — time per probe, ns (corrected for one stamp)", source.display());
    grid_png(path, &title, 4, (440, 290), panels.len(), |i, area| {
        let (title, values, color) = &panels[i];
        draw_histogram(area, &Histogram { title: title.clone(), values, x_label: "ns", color: *color })
    })?;
    Ok(panels.len())
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.window_us.is_finite() && args.window_us > 0.0, "--window-us must be a positive number");
    anyhow::ensure!(args.from_us.is_finite() && args.from_us >= 0.0, "--from-us must be zero or positive");
    let dump = ProfileDump::read(&args.dump).context("reading the profile")?;
    let cal = &dump.calibration;
    let overhead = Stats::of(&cal.overhead_ticks.iter().map(|&t| cal.ns(u64::from(t))).collect::<Vec<_>>());
    let stamps: usize = dump.threads.iter().map(|t| t.stamps.len()).sum();
    println!(
        "profile {}: {} thread(s), {stamps} stamps, {} probe name(s)",
        args.dump.display(),
        dump.threads.len(),
        dump.probes.len()
    );
    println!(
        "counter: {:.3} ticks/ns; one time stamp costs {:.1} ns (median{}), subtracted from every interval",
        cal.ticks_per_ns,
        cal.overhead_ns(),
        overhead.map(|s| format!(", p99 {:.1} ns, max {:.1} ns", s.p99, s.max)).unwrap_or_default()
    );
    for t in &dump.threads {
        let span = match (t.stamps.first(), t.stamps.last()) {
            (Some(a), Some(b)) => cal.ns(b.tsc.wrapping_sub(a.tsc)) / 1e3,
            _ => 0.0,
        };
        let lost = if t.lost > 0 {
            format!(" ({} older stamps lost: the ring wrapped, these are the latest)", t.lost)
        } else {
            String::new()
        };
        println!("  thread {}: {} stamps over {span:.1} µs{lost}", t.thread, t.stamps.len());
    }

    let intervals = dump.intervals();
    let names: Vec<String> = intervals.iter().map(|(p, _)| dump.probe_name(*p)).collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0).max(34);
    println!("\ntime from entry to exit per probe (ns, corrected for one stamp):");
    println!("{}", header(width));
    for ((_, values), name) in intervals.iter().zip(&names) {
        println!("{}", summary_row(name, values, width));
    }
    let t = dump.transitions();
    println!("\nscheduler transitions (ns, corrected for one stamp; the paper: 200 and 300 ns):");
    println!("{}", header(width));
    println!("{}", summary_row("poll exit → action entry", &t.poll_to_action, width));
    println!("{}", summary_row("action exit → next poll entry", &t.action_to_poll, width));
    println!("\ncycle time per thread (its first task's poll entry to the next, ns, corrected for the stamps in it):");
    println!("{}", header(width));
    for thread in &dump.threads {
        if let Some((probe, values)) = cycle_times(&dump, thread) {
            println!("{}", summary_row(&format!("{} ({})", thread.thread, dump.probe_name(probe)), &values, width));
        }
    }

    if let Some(dir) = &args.out {
        crate::ensure_dir(dir)?;
        let thread = match &args.thread {
            Some(name) => dump.threads.iter().find(|t| &t.thread == name).ok_or_else(|| {
                let names: Vec<&str> = dump.threads.iter().map(|t| t.thread.as_str()).collect();
                anyhow!("no thread `{name}` in the profile (it has: {})", names.join(", "))
            })?,
            None => dump.threads.first().ok_or_else(|| anyhow!("the profile holds no thread: nothing to draw"))?,
        };
        let hist = dir.join("histograms.png");
        let panels = draw_histograms(&hist, &dump, &args.dump)?;
        let seq = dir.join("sequence.png");
        let bars = draw_sequence(&seq, &dump, thread, args.from_us, args.window_us)?;
        println!("\nwrote {} ({panels} panels)", hist.display());
        println!(
            "wrote {} (thread {}, {} … {} µs: {bars} entry-to-exit bars)",
            seq.display(),
            thread.thread,
            args.from_us,
            args.from_us + args.window_us
        );
        if bars == 0 {
            eprintln!("daqflow: warning: no stamps in that window; see the thread's span above");
        } else if bars < 20 {
            eprintln!(
                "daqflow: note: few bars in that window: the start of a run is slow (first touches of pages and \
                 caches); look later with --from-us, or wider with --window-us"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
