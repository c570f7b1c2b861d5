//! The benchmark harness every suite uses: parameter sweeps, warm-up, repetitions, median and
//! min/max, a table on stdout, and `SUITE.csv`, `SUITE.json`, `SUITE.png` in the output
//! directory.
//!
//! A suite calls [`Suite::measure`] once per point of its sweep with a closure that runs one
//! repetition and returns its metrics. References (memcpy, raw sockets) are measured inside the
//! same closure, interleaved with the measurement they qualify, so that a ratio compares two
//! numbers taken under the same load of a shared machine.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Map, Value, json};

/// How a suite runs: quick or full, how many repetitions, how long each measurement lasts.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// A run of a few seconds (fewer points, shorter measurements, one repetition).
    pub quick: bool,
    /// Repetitions of each point (the median is reported).
    pub repetitions: usize,
    /// Duration of one measurement.
    pub measure_time: Duration,
    /// Run one unrecorded repetition first.
    pub warmup: bool,
    /// Where to write CSV, JSON and PNG.
    pub out: Option<PathBuf>,
}

/// The metrics of one repetition, in the order the suite lists them. Names carry their unit
/// (`mb_per_s`, `frames_per_s`, `ns_per_op`, …); `docs/performance.md` lists them.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    values: Vec<(&'static str, f64)>,
    /// Metrics this repetition could not give, and why (a ratio to a reference that did not
    /// measure what it says: [`super::raw::Reference::flaw`]).
    withheld: Vec<(&'static str, String)>,
}

impl Metrics {
    /// No metric yet.
    pub fn new() -> Self {
        Metrics::default()
    }
    /// Adds a metric.
    pub fn with(mut self, name: &'static str, value: f64) -> Self {
        self.values.push((name, value));
        self
    }
    /// Withholds a metric: it is not printed or written for this repetition, and `why` is
    /// printed under the table.
    pub fn withhold(mut self, name: &'static str, why: String) -> Self {
        self.withheld.push((name, why));
        self
    }
    /// A metric's value.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
    /// Why a metric was withheld, if it was.
    pub fn why_withheld(&self, name: &str) -> Option<&str> {
        self.withheld.iter().find(|(n, _)| *n == name).map(|(_, w)| w.as_str())
    }
}

/// Median, minimum and maximum of a metric over the repetitions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    fn of(values: &mut [f64]) -> Summary {
        values.sort_by(|a, b| a.total_cmp(b));
        let n = values.len();
        let median = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
        Summary { median, min: values[0], max: values[n - 1] }
    }
}

/// A parameter value: a number or a word.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// A number (sizes, counts).
    Num(f64),
    /// A word (`shared`, `build`, …) or a flag.
    Text(String),
}

impl From<usize> for Param {
    fn from(v: usize) -> Self {
        Param::Num(v as f64)
    }
}
impl From<u64> for Param {
    fn from(v: u64) -> Self {
        Param::Num(v as f64)
    }
}
impl From<&str> for Param {
    fn from(v: &str) -> Self {
        Param::Text(v.to_owned())
    }
}
impl From<bool> for Param {
    fn from(v: bool) -> Self {
        Param::Text(v.to_string())
    }
}

impl Param {
    fn json(&self) -> Value {
        match self {
            Param::Num(v) if v.fract() == 0.0 && v.abs() < 9e15 => json!(*v as i64),
            Param::Num(v) => json!(v),
            Param::Text(s) if s == "true" => json!(true),
            Param::Text(s) if s == "false" => json!(false),
            Param::Text(s) => json!(s),
        }
    }
    fn text(&self) -> String {
        match self {
            Param::Num(v) if v.fract() == 0.0 => format!("{}", *v as i64),
            Param::Num(v) => format!("{v}"),
            Param::Text(s) => s.clone(),
        }
    }
    /// The number, for plotting.
    pub fn num(&self) -> Option<f64> {
        match self {
            Param::Num(v) => Some(*v),
            Param::Text(_) => None,
        }
    }
}

/// One measured point.
#[derive(Debug, Clone)]
pub struct Point {
    /// Which part of the suite (`frame_size`, `connections`, …).
    pub case: String,
    /// The parameters, in the suite's order.
    pub params: Vec<(&'static str, Param)>,
    /// Each metric over the repetitions, in the suite's order.
    pub metrics: Vec<(&'static str, Summary)>,
    /// Repetitions recorded.
    pub repetitions: usize,
    /// Metrics withheld in some repetitions (summed over the others) or in all (absent from
    /// `metrics`): the metric, in how many repetitions, and the first reason.
    pub withheld: Vec<(&'static str, usize, String)>,
}

impl Point {
    /// A parameter's value.
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|(n, _)| *n == name).map(|(_, p)| p)
    }
    /// A metric's summary.
    pub fn metric(&self, name: &str) -> Option<Summary> {
        self.metrics.iter().find(|(n, _)| *n == name).map(|&(_, s)| s)
    }
}

/// A curve in a plot: one metric of the points of one case whose parameters match `filter`,
/// against the plot's x parameter.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// The case the points belong to.
    pub case: &'static str,
    /// The metric on the y axis.
    pub metric: &'static str,
    /// Parameters the points must have.
    pub filter: Vec<(&'static str, Param)>,
}

/// One panel of a suite's PNG.
#[derive(Debug, Clone)]
pub struct Plot {
    /// Panel title.
    pub title: String,
    /// Parameter on the x axis.
    pub x: &'static str,
    /// X axis label, with its unit.
    pub x_label: String,
    /// Logarithmic x axis.
    pub x_log: bool,
    /// Format x tick labels as byte sizes.
    pub x_bytes: bool,
    /// Y axis label, with its unit.
    pub y_label: String,
    /// Logarithmic y axis.
    pub y_log: bool,
    /// The curves.
    pub series: Vec<Series>,
}

impl Plot {
    /// A panel against a size in bytes (`x`), on a logarithmic x axis.
    pub fn over_bytes(
        title: &str,
        x: &'static str,
        x_label: &str,
        y_label: &str,
        y_log: bool,
        series: Vec<Series>,
    ) -> Plot {
        Plot {
            title: title.into(),
            x,
            x_label: x_label.into(),
            x_log: true,
            x_bytes: true,
            y_label: y_label.into(),
            y_log,
            series,
        }
    }
}

/// A benchmark suite's results.
#[derive(Debug)]
pub struct Suite {
    /// Short name (`transport`): names the files.
    pub name: &'static str,
    /// What the suite reproduces.
    pub title: String,
    /// The configuration it ran with.
    pub config: BenchConfig,
    /// The points, in the order measured.
    pub points: Vec<Point>,
    /// Panels of the PNG.
    pub plots: Vec<Plot>,
    /// Lines printed under the table (machine, references, caveats).
    pub notes: Vec<String>,
}

impl Suite {
    /// An empty suite.
    pub fn new(name: &'static str, title: impl Into<String>, config: BenchConfig) -> Self {
        Suite { name, title: title.into(), config, points: Vec::new(), plots: Vec::new(), notes: Vec::new() }
    }

    /// Measures one point: a warm-up repetition (unless quick), then `repetitions` recorded
    /// ones. Progress goes to stderr.
    pub fn measure(
        &mut self,
        case: &str,
        params: Vec<(&'static str, Param)>,
        mut run: impl FnMut() -> anyhow::Result<Metrics>,
    ) -> anyhow::Result<&Point> {
        let label = params.iter().map(|(n, p)| format!("{n}={}", p.text())).collect::<Vec<_>>().join(" ");
        eprint!("  {case} {label} ");
        if self.config.warmup {
            run().with_context(|| format!("{case} {label}: warm-up"))?;
        }
        let reps = self.config.repetitions.max(1);
        let mut samples: Vec<Metrics> = Vec::with_capacity(reps);
        for _ in 0..reps {
            samples.push(run().with_context(|| format!("{case} {label}"))?);
            eprint!(".");
        }
        eprintln!();
        let mut names: Vec<&'static str> = Vec::new();
        for m in &samples {
            for n in m.values.iter().map(|&(n, _)| n).chain(m.withheld.iter().map(|(n, _)| *n)) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        let mut metrics = Vec::new();
        let mut withheld = Vec::new();
        for &n in &names {
            let mut v: Vec<f64> = samples.iter().filter_map(|m| m.get(n)).collect();
            if !v.is_empty() {
                metrics.push((n, Summary::of(&mut v)));
            }
            let whys: Vec<&str> = samples.iter().filter_map(|m| m.why_withheld(n)).collect();
            if let Some(first) = whys.first() {
                eprint!(" ({n} withheld: {first})");
                withheld.push((n, whys.len(), (*first).to_owned()));
            }
        }
        self.points.push(Point { case: case.to_owned(), params, metrics, repetitions: reps, withheld });
        Ok(self.points.last().expect("just pushed"))
    }

    /// [`Suite::measure`]; a point that fails is printed and added to `failures` (for
    /// [`Suite::note_failures`]), and the suite goes on.
    pub fn measure_or_record(
        &mut self,
        case: &str,
        params: Vec<(&'static str, Param)>,
        failures: &mut Vec<String>,
        run: impl FnMut() -> anyhow::Result<Metrics>,
    ) {
        if let Err(e) = self.measure(case, params, run) {
            eprintln!("\n  FAILED: {e:#}");
            failures.push(format!("{e:#}"));
        }
    }

    /// Adds a line to print under the table.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// Lists the points that failed (they are in neither the table nor the files) under the table.
    pub fn note_failures(&mut self, failures: &[String]) {
        if !failures.is_empty() {
            self.note(format!("FAILED points ({}), not in the table or the files:", failures.len()));
            for f in failures {
                self.note(format!("  {f}"));
            }
        }
    }

    /// [`Suite::finish`], then an error if a point failed.
    pub fn finish_unless_failed(&self, failures: &[String]) -> anyhow::Result<()> {
        self.finish()?;
        if !failures.is_empty() {
            anyhow::bail!("{} point(s) of the {} suite failed (see the notes above)", failures.len(), self.name);
        }
        Ok(())
    }

    /// The table, one block per case.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "\n{} — {}", self.name, self.title);
        let _ = writeln!(
            out,
            "(median of {} repetition(s); [min … max] where it varied by more than 5%)",
            self.config.repetitions.max(1)
        );
        let mut cases: Vec<&str> = Vec::new();
        for p in &self.points {
            if !cases.contains(&p.case.as_str()) {
                cases.push(&p.case);
            }
        }
        for case in cases {
            let pts: Vec<&Point> = self.points.iter().filter(|p| p.case == case).collect();
            let param_names: Vec<&str> = pts[0].params.iter().map(|(n, _)| *n).collect();
            let mut metric_names: Vec<&str> = Vec::new();
            for p in &pts {
                for n in p.metrics.iter().map(|(n, _)| *n).chain(p.withheld.iter().map(|(n, _, _)| *n)) {
                    if !metric_names.contains(&n) {
                        metric_names.push(n);
                    }
                }
            }
            let mut rows: Vec<Vec<String>> = Vec::new();
            rows.push(param_names.iter().chain(metric_names.iter()).map(|s| s.to_string()).collect());
            for p in &pts {
                let mut row: Vec<String> = p.params.iter().map(|(_, v)| v.text()).collect();
                for m in &metric_names {
                    let withheld = p.withheld.iter().find(|(n, _, _)| n == m);
                    row.push(match (p.metric(m), withheld) {
                        (Some(s), None) => fmt_summary(s),
                        (Some(s), Some(_)) => format!("{} (*)", fmt_summary(s)),
                        (None, Some(_)) => "withheld (*)".into(),
                        (None, None) => "-".into(),
                    });
                }
                rows.push(row);
            }
            let widths: Vec<usize> =
                (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
            let _ = writeln!(out, "\n[{case}]");
            for (i, row) in rows.iter().enumerate() {
                let line: Vec<String> = row.iter().zip(&widths).map(|(v, w)| format!("{v:>w$}")).collect();
                let _ = writeln!(out, "  {}", line.join("  "));
                if i == 0 {
                    let _ = writeln!(out, "  {}", widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
                }
            }
        }
        let withheld: Vec<String> = self
            .points
            .iter()
            .flat_map(|p| {
                let at = p.params.iter().map(|(n, v)| format!("{n}={}", v.text())).collect::<Vec<_>>().join(" ");
                p.withheld.iter().map(move |(m, k, why)| {
                    let of = if *k == p.repetitions {
                        "every repetition".to_owned()
                    } else {
                        format!("{k} of {} repetitions (the others shown)", p.repetitions)
                    };
                    format!("  [{}] {at}: {m} withheld in {of}: {why}", p.case)
                })
            })
            .collect();
        if !withheld.is_empty() {
            let _ =
                writeln!(out, "\n(*) withheld: a ratio is printed only against a reference that measured what it says");
            for w in withheld {
                let _ = writeln!(out, "{w}");
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out);
            for n in &self.notes {
                let _ = writeln!(out, "{n}");
            }
        }
        out
    }

    /// The JSON points: `[{"case", "params", "metrics", "min", "max", "repetitions", "withheld"}]`
    /// (`withheld`: `{metric: {"repetitions": k, "why": …}}`, empty when nothing was).
    pub fn json(&self) -> Value {
        Value::Array(
            self.points
                .iter()
                .map(|p| {
                    let params: Map<String, Value> = p.params.iter().map(|(n, v)| (n.to_string(), v.json())).collect();
                    let pick = |f: fn(&Summary) -> f64| -> Map<String, Value> {
                        p.metrics.iter().map(|(n, s)| (n.to_string(), json!(f(s)))).collect()
                    };
                    let withheld: Map<String, Value> = p
                        .withheld
                        .iter()
                        .map(|(n, k, why)| (n.to_string(), json!({"repetitions": k, "why": why})))
                        .collect();
                    json!({
                        "case": p.case,
                        "params": params,
                        "metrics": pick(|s| s.median),
                        "min": pick(|s| s.min),
                        "max": pick(|s| s.max),
                        "repetitions": p.repetitions,
                        "withheld": withheld,
                    })
                })
                .collect(),
        )
    }

    /// CSV: one row per point; columns `case`, every parameter, then each metric's median,
    /// `_min` and `_max`.
    pub fn csv(&self) -> String {
        let mut params: Vec<&str> = Vec::new();
        let mut metrics: Vec<&str> = Vec::new();
        for p in &self.points {
            for (n, _) in &p.params {
                if !params.contains(n) {
                    params.push(n);
                }
            }
            for (n, _) in &p.metrics {
                if !metrics.contains(n) {
                    metrics.push(n);
                }
            }
        }
        let mut out = String::from("case");
        for p in &params {
            out.push(',');
            out.push_str(p);
        }
        for m in &metrics {
            let _ = write!(out, ",{m},{m}_min,{m}_max");
        }
        out.push('\n');
        for p in &self.points {
            out.push_str(&p.case);
            for n in &params {
                out.push(',');
                if let Some(v) = p.param(n) {
                    out.push_str(&v.text());
                }
            }
            for m in &metrics {
                match p.metric(m) {
                    Some(s) => {
                        let _ = write!(out, ",{},{},{}", s.median, s.min, s.max);
                    }
                    None => out.push_str(",,,"),
                }
            }
            out.push('\n');
        }
        out
    }

    /// Prints the table and writes the files into `config.out`, if set.
    pub fn finish(&self) -> anyhow::Result<()> {
        print!("{}", self.table());
        if let Some(dir) = &self.config.out {
            crate::ensure_dir(dir)?;
            let write = |name: String, data: &[u8]| -> anyhow::Result<PathBuf> {
                let path = dir.join(name);
                std::fs::write(&path, data).with_context(|| format!("writing {}", path.display()))?;
                Ok(path)
            };
            let csv = write(format!("{}.csv", self.name), self.csv().as_bytes())?;
            let json = write(format!("{}.json", self.name), serde_json::to_string_pretty(&self.json())?.as_bytes())?;
            let png = dir.join(format!("{}.png", self.name));
            super::plot::render(self, &png)?;
            println!("\nwrote {}, {}, {}", csv.display(), json.display(), png.display());
        }
        Ok(())
    }

    /// The points of a plot series, as `(x, summary)` sorted by x.
    pub fn series_points(&self, plot: &Plot, series: &Series) -> Vec<(f64, Summary)> {
        let mut pts: Vec<(f64, Summary)> = self
            .points
            .iter()
            .filter(|p| p.case == series.case)
            .filter(|p| series.filter.iter().all(|(n, v)| p.param(n) == Some(v)))
            .filter_map(|p| Some((p.param(plot.x)?.num()?, p.metric(series.metric)?)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts
    }
}

fn fmt_summary(s: Summary) -> String {
    let m = crate::format::si(s.median);
    if s.median != 0.0 && (s.max - s.min).abs() / s.median.abs() > 0.05 {
        format!("{m} [{} … {}]", crate::format::si(s.min), crate::format::si(s.max))
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BenchConfig {
        BenchConfig { quick: true, repetitions: 3, measure_time: Duration::ZERO, warmup: false, out: None }
    }

    #[test]
    fn median_min_max_over_repetitions() {
        let mut s = Suite::new("t", "test", config());
        let mut i = 0.0;
        s.measure("c", vec![("frame_bytes", 64usize.into())], || {
            i += 1.0;
            Ok(Metrics::new().with("mb_per_s", i * 10.0))
        })
        .unwrap();
        let m = s.points[0].metric("mb_per_s").unwrap();
        assert_eq!((m.median, m.min, m.max), (20.0, 10.0, 30.0));
        let json = s.json();
        assert_eq!(json[0]["case"], "c");
        assert_eq!(json[0]["params"]["frame_bytes"], 64);
        assert_eq!(json[0]["metrics"]["mb_per_s"], 20.0);
        assert!(s.csv().starts_with("case,frame_bytes,mb_per_s,mb_per_s_min,mb_per_s_max\nc,64,20,10,30\n"));
        assert!(s.table().contains("[c]"));
    }

    #[test]
    fn a_withheld_metric_is_summed_over_the_other_repetitions_and_said_why() {
        let mut s = Suite::new("t", "test", config());
        let mut i = 0;
        s.measure("c", vec![("frame_bytes", 64usize.into())], || {
            i += 1;
            let m = Metrics::new().with("mb_per_s", 100.0);
            Ok(if i == 2 {
                m.withhold("ratio_to_raw", "the reference stalled".into())
            } else {
                m.with("ratio_to_raw", 0.5)
            })
        })
        .unwrap();
        s.measure("c", vec![("frame_bytes", 128usize.into())], || {
            Ok(Metrics::new().with("mb_per_s", 100.0).withhold("ratio_to_raw", "the reference was slower".into()))
        })
        .unwrap();
        assert_eq!(s.points[0].metric("ratio_to_raw").unwrap().median, 0.5);
        assert_eq!(s.points[1].metric("ratio_to_raw"), None);
        let table = s.table();
        assert!(table.contains("500m (*)") || table.contains("0.5 (*)") || table.contains(" (*)"), "{table}");
        assert!(table.contains("withheld (*)"), "{table}");
        assert!(
            table.contains("ratio_to_raw withheld in 1 of 3 repetitions (the others shown): the reference stalled"),
            "{table}"
        );
        assert!(
            table.contains("frame_bytes=128: ratio_to_raw withheld in every repetition: the reference was slower"),
            "{table}"
        );
        let json = s.json();
        assert_eq!(json[1]["withheld"]["ratio_to_raw"]["repetitions"], 3);
        assert!(json[1]["metrics"].get("ratio_to_raw").is_none());
        assert!(s.csv().contains("c,128,100,100,100,,,\n"), "{}", s.csv());
    }
}
