//! What the operator shows: the [`SystemStatus`] of the web UI and of `/metrics`, the rate
//! plot's points, the monitors' histograms and the ET systems' stations, all from the
//! sequencer's [`Snapshot`] and the components' typed [`Stats`]; and the run's summary from
//! what the sequencer hands over at its end.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use daqflow_api::{
    ComponentRecord, ComponentState, ComponentView, RatePoint, RunState, RunSummary, SystemState, SystemStatus,
};
use daqflow_component::{Role, Stats, histogram};
use serde_json::{Value, json};

use super::sequencer::{CloseRun, CounterSample, Snapshot, View};
use crate::accounting::{account, files_on_disk};
use crate::system::{ComponentSpec, SystemFile};

/// How many points the rate plot keeps (one a second).
pub(crate) const RATE_POINTS: usize = 600;

/// The keys of a kind's `detail` that are served by routes of their own (the monitors'
/// histograms, the ET systems' station snapshots) and left out of the status.
pub const BULKY_DETAIL: [&str; 2] = ["histograms", "snapshot"];

/// `stats` without its bulky parts.
pub fn light(stats: &Stats) -> Stats {
    let mut s = stats.clone();
    if let Value::Object(m) = &mut s.detail {
        for k in BULKY_DETAIL {
            m.remove(k);
        }
    }
    s
}

/// The open run's live figures, from the components' counters by their roles. Counters of
/// different processes are read at different moments (each publishes about once a second, at
/// its own time): they are put side by side as of one moment, so that `recorded` never exceeds
/// `events` (a recorder records only what the builders built).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Live {
    /// Events built in the run (the builders', with their earlier lives'), as of their
    /// last counters.
    pub events: u64,
    /// Bytes of those events.
    pub bytes: u64,
    /// Events recorded in the run (the recorders'), as of counters read before the builders'
    /// (the newest such; while builders run and none was, 0).
    pub recorded: u64,
    /// Events built per second: the builders' own rates (each over the last second of its own
    /// counters, so that a publication that came late is neither a drop nor a spike), summed
    /// over those that take the run: the sum of what the components' table shows.
    pub events_per_s: f64,
    /// MB (10⁶ bytes) built per second, likewise.
    pub mb_per_s: f64,
    /// Events the trigger's accounting gave up on so far (`TriggerCounts::lost`, with earlier
    /// lives'); none without a trigger that counts in this run.
    pub lost: Option<u64>,
}

/// Whether a component takes the run (Running or Paused).
fn taking(v: &View) -> bool {
    v.alive && matches!(v.state, Some(ComponentState::Running | ComponentState::Paused))
}

/// A component's samples of run `run` (none of another run).
fn samples_of(v: &View, run: Option<u32>) -> &VecDeque<CounterSample> {
    static NONE: VecDeque<CounterSample> = VecDeque::new();
    if run.is_some() && v.samples.back().map(|s| s.run) == run { &v.samples } else { &NONE }
}

/// Run `run`'s [`Live`] figures. Only counters that say they count that run are taken (a
/// component not yet started still shows the last run's).
pub(crate) fn live(file: &SystemFile, views: &[(String, View)], run: Option<u32>) -> Live {
    let mut out = Live::default();
    let with_role =
        |role: Role| file.components.iter().zip(views).filter(move |(c, _)| c.role == role).map(|(_, (_, v))| v);
    // The builders: their last counters; the moment they were read bounds the recorders'.
    let mut cut: Option<u64> = None;
    let mut any_built = false;
    for v in with_role(Role::Builder) {
        out.events += v.earlier.iter().map(|s| s.events).sum::<u64>();
        out.bytes += v.earlier.iter().map(|s| s.bytes).sum::<u64>();
        let Some(last) = samples_of(v, run).back() else { continue };
        any_built = true;
        out.events += last.events;
        out.bytes += last.bytes;
        // Counters read after the builder left this run (stopped, failed: read after the
        // change of state, on its clock) or the last of a process that ended are final: they
        // hold for any later moment and bound nothing. A state that is not this run's (the
        // Configured of before the start, its Running not heard of yet: the state and the
        // counters come as two services) says nothing about the counters.
        let left_this_run = !taking(v) && v.run == run && last.at_ms >= v.since_ms;
        let is_final = !v.alive || left_this_run;
        if !is_final {
            cut = Some(cut.map_or(last.at_ms, |c| c.min(last.at_ms)));
        }
        if taking(v) {
            out.events_per_s += v.stats.events_per_s;
            out.mb_per_s += v.stats.mb_per_s;
        }
    }
    let has_builders = with_role(Role::Builder).next().is_some();
    for v in with_role(Role::Recorder) {
        out.recorded += v.earlier.iter().map(|s| s.events).sum::<u64>();
        let samples = samples_of(v, run);
        let sample = match cut {
            // Read before every builder's still counting: no more than they had built then.
            Some(cut) => samples.iter().rev().find(|s| s.at_ms < cut),
            // No builder has built in this run yet: nothing can be recorded either.
            None if has_builders && !any_built => None,
            // Every builder's count is final (or there is none): the newest.
            None => samples.back(),
        };
        out.recorded += sample.map_or(0, |s| s.events);
    }
    for v in with_role(Role::Trigger) {
        // This life's counters if they count the run, and the earlier lives' in the run.
        let this_life = (run.is_some() && v.stats.run == run).then_some(&v.stats);
        for t in this_life.into_iter().chain(&v.earlier).filter_map(|s| s.trigger.as_ref()) {
            out.lost = Some(out.lost.unwrap_or(0) + t.lost);
        }
    }
    out
}

/// The run's totals as shown (the status, the history's `system.` values): while a run is
/// open its [`Live`] figures, else the last run's summary (its accounting), or the live
/// figures before any run. Events, bytes, recorded, events/s, MB/s, lost.
pub(crate) fn shown_totals(file: &SystemFile, s: &Snapshot) -> Live {
    let live = live(file, &s.views, s.run);
    match (s.run_started_ms, s.last_summary.as_ref()) {
        (Some(_), _) => live,
        (None, Some(summary)) => Live {
            events: summary.events,
            bytes: summary.bytes,
            recorded: summary.recorded,
            events_per_s: 0.0,
            mb_per_s: 0.0,
            lost: Some(summary.lost),
        },
        (None, None) => Live { events_per_s: 0.0, mb_per_s: 0.0, lost: None, ..live },
    }
}

/// The rate plot, sampled once a second.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    points: VecDeque<RatePoint>,
}

impl Rates {
    /// Takes a sample: the system's rates at `t_ms` (0 while no run is open).
    pub(crate) fn sample(&mut self, file: &SystemFile, snapshot: &Snapshot, t_ms: u64) {
        let t = shown_totals(file, snapshot);
        self.points.push_back(RatePoint { t_ms, events_per_s: t.events_per_s, mb_per_s: t.mb_per_s });
        while self.points.len() > RATE_POINTS {
            self.points.pop_front();
        }
    }

    /// Forgets the points of the last run (a new one starts).
    pub(crate) fn clear(&mut self) {
        self.points.clear();
    }

    pub(crate) fn points(&self) -> Vec<RatePoint> {
        self.points.iter().copied().collect()
    }
}

/// Where the operator runs, for the status.
pub(crate) struct Place<'a> {
    pub file: &'a SystemFile,
    pub control: String,
    pub data: &'a Path,
}

/// The live status.
pub(crate) fn system_status(place: &Place<'_>, s: &Snapshot, rates: &Rates, now_ms: u64) -> SystemStatus {
    let components = place
        .file
        .components
        .iter()
        .zip(&s.views)
        .map(|(c, (_, v))| ComponentView {
            name: c.name.clone(),
            kind: c.kind.clone(),
            role: c.role,
            host: c.host.clone().unwrap_or_else(|| "localhost".into()),
            pid: v.pid,
            cpus: v.cpus.clone(),
            alive: v.alive,
            state: v.shown(),
            run: v.run,
            since_ms: v.since_ms,
            error: v.exit.clone().map(|e| format!("process ended: {e}")).or(v.error.clone()),
            restarts: v.restarts,
            policy: c.policy,
            stats: light(&v.stats),
        })
        .collect();
    let totals = shown_totals(place.file, s);
    let running = s.run_started_ms.is_some();
    SystemStatus {
        system: place.file.system.name.clone(),
        state: s.state,
        run: s.run,
        running,
        run_started_ms: s.run_started_ms,
        duration_s: s.run_started_ms.map(|t| now_ms.saturating_sub(t) as f64 / 1e3),
        events: totals.events,
        bytes: totals.bytes,
        recorded: totals.recorded,
        events_per_s: totals.events_per_s,
        mb_per_s: totals.mb_per_s,
        lost: totals.lost,
        last_error: s.last_error.clone(),
        last_summary: s.last_summary.clone(),
        control: place.control.clone(),
        data: place.data.to_owned(),
        components,
        rates: rates.points(),
        overrides: s.overrides.clone(),
        degraded: s.degraded.clone(),
    }
}

/// The components' histograms: `[{"component", …histogram}]`. Those of the same name, kind and
/// binning from the members of one parallel group (the same `group` parameter: an ET farm; or
/// one `[[group]]`) are summed into one whose `component` is the group's name and `members`
/// the members that published it: each member fills its share of the events. A time series, and
/// a member's histogram that does not add up with the group's (another binning), stay the
/// member's own.
pub(crate) fn histograms(file: &SystemFile, s: &Snapshot) -> Value {
    summed_histograms(file, s.views.iter().map(|(_, v)| &v.stats))
}

/// The histograms a run ends with, summed as [`histograms`] sums the live ones: each
/// component's from its stop summary, or its last statistics when it gave none (it died).
pub(crate) fn final_histograms(file: &SystemFile, close: &CloseRun) -> Vec<Value> {
    let stats: Vec<&Stats> = file
        .components
        .iter()
        .map(|c| {
            let run = close.components.iter().find(|r| r.name == c.name);
            run.map(|r| r.summary.as_ref().unwrap_or(&r.last_stats)).unwrap_or(&EMPTY_STATS)
        })
        .collect();
    match summed_histograms(file, stats.into_iter()) {
        Value::Array(all) => all,
        _ => Vec::new(),
    }
}

static EMPTY_STATS: std::sync::LazyLock<Stats> = std::sync::LazyLock::new(Stats::default);

/// [`histograms`] of the statistics `stats`, one per component of `file`, in its order.
fn summed_histograms<'a>(file: &SystemFile, stats: impl Iterator<Item = &'a Stats>) -> Value {
    let mut out: Vec<Value> = Vec::new();
    for (c, stats) in file.components.iter().zip(stats) {
        let Some(hs) = stats.detail.get("histograms").and_then(Value::as_array) else { continue };
        let group = group_of(file, c);
        for h in hs {
            let mut h = h.clone();
            if let Some(g) = group.filter(|_| h.get("series").is_none()) {
                let summed =
                    out.iter_mut().find(|e| e["component"] == g && e["members"].is_array() && e["name"] == h["name"]);
                match summed {
                    Some(e) => {
                        if histogram::merge(e, &h) {
                            if let Some(m) = e["members"].as_array_mut() {
                                m.push(json!(c.name));
                            }
                            continue;
                        }
                        h["component"] = json!(c.name);
                    }
                    None => {
                        h["component"] = json!(g);
                        h["members"] = json!([c.name]);
                    }
                }
            } else {
                h["component"] = json!(c.name);
            }
            out.push(h);
        }
    }
    Value::Array(out)
}

/// The parallel group component `c` is a member of: its `group` parameter (an ET farm), else
/// the `[[group]]` that lists it.
fn group_of<'a>(file: &'a SystemFile, c: &'a ComponentSpec) -> Option<&'a str> {
    c.params
        .get("group")
        .and_then(toml::Value::as_str)
        .or_else(|| file.groups.iter().find(|g| g.members.contains(&c.name)).map(|g| g.name.as_str()))
}

/// The ET systems' snapshots: `[{"component", "snapshot"}]`.
pub(crate) fn et(file: &SystemFile, s: &Snapshot) -> Value {
    Value::Array(
        file.components
            .iter()
            .zip(&s.views)
            .filter(|(c, _)| c.role == Role::Buffer)
            .map(|(c, (_, v))| json!({ "component": c.name, "snapshot": v.stats.detail.get("snapshot") }))
            .collect(),
    )
}

/// The summary of a run the sequencer closed: its accounting from the components and the files
/// on disk, every component's counters.
pub(crate) fn run_summary(system: &str, close: &CloseRun, now_ms: u64) -> RunSummary {
    let mut files = Vec::new();
    let mut file_problems = Vec::new();
    for (name, dir) in &close.data {
        let (found, problems) = files_on_disk(dir, close.run, name);
        files.extend(found);
        file_problems.extend(problems);
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let a = account(&close.components, &files);
    let components: BTreeMap<String, ComponentRecord> = close
        .components
        .iter()
        .map(|c| {
            let record = ComponentRecord {
                kind: c.kind.clone(),
                summary: c.summary.clone(),
                last_stats: c.summary.is_none().then(|| light(&c.last_stats)),
                died: c.died.clone(),
                earlier_lives: c.earlier.len(),
            };
            (c.name.clone(), record)
        })
        .collect();
    let stopped_ms = now_ms.max(close.started_ms);
    let errors = close.errors.clone();
    RunSummary {
        run: close.run,
        system: system.to_owned(),
        state: if errors.is_empty() { RunState::Stopped } else { RunState::Failed },
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        started_ms: close.started_ms,
        stopped_ms,
        seconds: (stopped_ms - close.started_ms) as f64 / 1e3,
        accounting: a,
        files,
        file_problems,
        components,
        errors,
        overrides: close.overrides.clone(),
        degraded: close.degraded.clone(),
        changes: close.changes.clone(),
        histograms: Vec::new(),
    }
}

/// Whether the system takes a run (for callers that only know the state).
pub fn in_run(state: SystemState) -> bool {
    matches!(state, SystemState::Running | SystemState::Paused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_component::{Component, ComponentError, Kind, Registry, TriggerCounts};

    struct Stub;
    impl Component for Stub {
        fn start(&mut self, _: u32) -> Result<(), ComponentError> {
            Ok(())
        }
        fn stop(&mut self, _: Option<u64>) -> Result<Stats, ComponentError> {
            Ok(Stats::default())
        }
    }

    /// A system of an EVM, two BUs and a recorder.
    fn file() -> SystemFile {
        let mut r = Registry::new();
        for (kind, role) in [("evm", Role::Trigger), ("bu", Role::Builder), ("recorder", Role::Recorder)] {
            r.add(Kind::new(kind, "a stub", role, |_, _| Ok(Box::new(Stub))));
        }
        let text = "[system]\nname = \"s\"\n[[component]]\nname = \"evm\"\nkind = \"evm\"\n\
                    [[component]]\nname = \"bu-0\"\nkind = \"bu\"\n[[component]]\nname = \"bu-1\"\nkind = \"bu\"\n\
                    [[component]]\nname = \"rec\"\nkind = \"recorder\"\n";
        SystemFile::parse(text, &r).unwrap_or_else(|e| panic!("{e}"))
    }

    fn views() -> Vec<(String, View)> {
        ["evm", "bu-0", "bu-1", "rec"]
            .iter()
            .map(|n| {
                let mut v = View::default();
                v.alive = true;
                v.state = Some(ComponentState::Running);
                ((*n).to_owned(), v)
            })
            .collect()
    }

    /// Counters of run 1 as a component reads them at `at_ms` (they came at `at_ms` too).
    /// Run 1, open since time 0, with these components.
    fn running(views: Vec<(String, View)>) -> Snapshot {
        Snapshot {
            state: SystemState::Running,
            run: Some(1),
            run_started_ms: Some(0),
            views,
            last_error: None,
            last_summary: None,
            overrides: BTreeMap::new(),
            degraded: BTreeMap::new(),
            waiting_for: Vec::new(),
            waiting: None,
        }
    }

    fn counted(views: &mut [(String, View)], name: &str, at_ms: u64, events: u64, per_s: f64) {
        let v = &mut views.iter_mut().find(|(n, _)| n == name).unwrap().1;
        let mut stats = Stats::counted(events, events * 1000).with_rates(per_s, per_s * 1000.0 / 1e6);
        (stats.at_ms, stats.run) = (Some(at_ms), Some(1));
        v.take_stats(stats, at_ms);
    }

    #[test]
    fn recorded_is_taken_as_of_before_the_builders_counters_never_above_them() {
        let f = file();
        let mut v = views();
        // Nothing built yet in this run: nothing recorded either, whatever a recorder says.
        counted(&mut v, "rec", 900, 40, 0.0);
        assert_eq!((live(&f, &v, Some(1)).events, live(&f, &v, Some(1)).recorded), (0, 0));
        counted(&mut v, "bu-0", 1000, 100, 100.0);
        counted(&mut v, "bu-1", 1000, 100, 100.0);
        counted(&mut v, "rec", 1500, 190, 0.0);
        counted(&mut v, "bu-0", 2000, 150, 50.0);
        counted(&mut v, "bu-1", 2000, 150, 50.0);
        // The recorder read its counter after the builders: 320 recorded, of 300 built as of
        // 2000 ms (more were built meanwhile). Shown: its count of before, 190 of 300.
        counted(&mut v, "rec", 2100, 320, 0.0);
        let l = live(&f, &v, Some(1));
        assert_eq!((l.events, l.bytes, l.recorded), (300, 300_000, 190));
        // Once both builders read theirs later, the recorder's 320 is shown.
        counted(&mut v, "bu-0", 2500, 200, 50.0);
        assert_eq!(live(&f, &v, Some(1)).recorded, 190, "bu-1's last is still of 2000 ms");
        counted(&mut v, "bu-1", 2600, 200, 50.0);
        assert_eq!(live(&f, &v, Some(1)).recorded, 320);
        // A builder that left the run (stopped at 2700 ms on its clock) bounds the recorder's
        // counters until its counters of after that come: they are final.
        v[2].1.state = Some(ComponentState::Configured);
        (v[2].1.since_ms, v[2].1.run) = (2700, Some(1));
        counted(&mut v, "rec", 2800, 350, 0.0);
        counted(&mut v, "bu-0", 2900, 300, 50.0);
        assert_eq!(live(&f, &v, Some(1)).recorded, 320, "bu-1's count of 2600 ms may not be its last");
        counted(&mut v, "bu-1", 2750, 210, 0.0);
        assert_eq!(live(&f, &v, Some(1)).recorded, 350, "bu-1's 210 is final");
        // A builder whose process ended has its last count.
        v[2].1.state = Some(ComponentState::Dead);
        v[2].1.alive = false;
        counted(&mut v, "rec", 3000, 395, 0.0);
        counted(&mut v, "bu-0", 3100, 400, 50.0);
        let l = live(&f, &v, Some(1));
        assert_eq!((l.events, l.recorded), (610, 395));
        assert!(l.recorded <= l.events);
    }

    #[test]
    fn a_builders_state_of_before_the_start_does_not_make_its_run_counters_final() {
        // The operator heard the builders' counters of run 1 but not yet their Running: their
        // views still say Configured, of no run (or the last one). Their counters are live, so
        // they still bound the recorder's.
        let f = file();
        let mut v = views();
        for run in [None, Some(0)] {
            for b in [1, 2] {
                v[b].1.state = Some(ComponentState::Configured);
                (v[b].1.since_ms, v[b].1.run) = (500, run);
            }
            counted(&mut v, "bu-0", 1000, 100, 100.0);
            counted(&mut v, "bu-1", 1000, 100, 100.0);
            counted(&mut v, "rec", 900, 150, 0.0);
            counted(&mut v, "rec", 1500, 260, 0.0);
            let l = live(&f, &v, Some(1));
            assert_eq!((l.events, l.recorded), (200, 150), "builders of run {run:?}");
        }
    }

    #[test]
    fn counters_that_are_not_the_runs_count_nothing_and_a_new_run_forgets_the_last() {
        let f = file();
        let mut v = views();
        // Before its start a builder still shows the last run's 5000 (or, configured anew,
        // counters of no run): not this run's.
        let mut old = Stats::counted(5000, 1);
        (old.at_ms, old.run) = (Some(1000), Some(0));
        v[1].1.take_stats(old.clone(), 1000);
        assert_eq!(live(&f, &v, Some(1)).events, 0);
        old.run = None;
        v[1].1.take_stats(old, 1000);
        assert_eq!(live(&f, &v, Some(1)).events, 0);
        counted(&mut v, "bu-0", 1100, 10, 10.0);
        assert_eq!(live(&f, &v, Some(1)).events, 10);
        // Run 2's first counters: run 1's samples are gone; they count for run 2 only.
        let mut next = Stats::counted(3, 3);
        (next.at_ms, next.run) = (Some(1200), Some(2));
        v[1].1.take_stats(next, 1200);
        assert_eq!(v[1].1.samples.len(), 1);
        assert_eq!(live(&f, &v, Some(1)).events, 0);
        assert_eq!(live(&f, &v, Some(2)).events, 3);
    }

    #[test]
    fn the_system_rate_is_the_sum_of_the_builders_own_that_take_the_run() {
        let f = file();
        let mut v = views();
        counted(&mut v, "bu-0", 10_000, 1000, 1000.0);
        counted(&mut v, "bu-1", 10_000, 1000, 1500.0);
        let l = live(&f, &v, Some(1));
        assert_eq!((l.events_per_s, l.mb_per_s), (2500.0, 2.5));
        // A builder no longer Running (stopped, or out of the run) adds nothing; nor does one
        // whose counters are not this run's.
        v[1].1.state = Some(ComponentState::Configured);
        assert_eq!(live(&f, &v, Some(1)).events_per_s, 1500.0);
        assert_eq!(live(&f, &v, Some(2)).events_per_s, 0.0);
    }

    #[test]
    fn the_rate_plot_has_no_gap_and_no_spike_when_publications_drift_against_its_samples() {
        // Builders publishing every 1.05 s (their own clock), the plot sampling every 1 s: a
        // plot of the change of the totals per sample would show a second with nothing
        // published (0) and then one with two publications (twice the rate).
        let f = file();
        let mut v = views();
        let mut rates = Rates::default();
        let (mut next_publish, mut events) = (0u64, 0u64);
        for t_ms in (1000..=30_000).step_by(1000) {
            while next_publish <= t_ms {
                events += 1050;
                counted(&mut v, "bu-0", next_publish, events, 1000.0);
                counted(&mut v, "bu-1", next_publish, events, 1000.0);
                next_publish += 1050;
            }
            let snapshot = running(v.clone());
            rates.sample(&f, &snapshot, t_ms);
        }
        let points = rates.points();
        assert_eq!(points.len(), 30);
        assert!(points.iter().all(|p| p.events_per_s == 2000.0), "{points:?}");
    }

    #[test]
    fn histograms_of_a_groups_members_are_summed_and_the_others_stay_their_own() {
        use daqflow_component::histogram::{Histogram, HistogramSet};
        let mut r = Registry::new();
        r.add(Kind::new("mon", "a stub", Role::Other, |_, _| Ok(Box::new(Stub))));
        let text = "[system]\nname = \"s\"\n\
                    [[component]]\nname = \"m-0\"\nkind = \"mon\"\n[component.params]\ngroup = \"mons\"\n\
                    [[component]]\nname = \"m-1\"\nkind = \"mon\"\n[component.params]\ngroup = \"mons\"\n\
                    [[component]]\nname = \"u-0\"\nkind = \"mon\"\n[[component]]\nname = \"u-1\"\nkind = \"mon\"\n\
                    [[component]]\nname = \"solo\"\nkind = \"mon\"\n\
                    [[group]]\nname = \"users\"\nmembers = [\"u-0\", \"u-1\"]\nmin = 1\n";
        let f = SystemFile::parse(text, &r).unwrap_or_else(|e| panic!("{e}"));
        let published = |fill: f64, wide: bool| {
            let mut set = HistogramSet::default();
            set.h1("adc", "ADC", "counts", 0.0, if wide { 200.0 } else { 100.0 }, 10).fill(fill);
            set.counter("hits", "Hits", "hits").value = 2;
            let mut rate = Histogram::new("rate", "Rate", "s", -2.0, 0.0, 2);
            rate.series = true;
            let mut all = set.to_json();
            all.as_array_mut().unwrap().push(rate.to_json());
            all
        };
        let views: Vec<(String, View)> = [
            ("m-0", 10.0, false),
            ("m-1", 20.0, false),
            ("u-0", 30.0, false),
            ("u-1", 40.0, true),
            ("solo", 50.0, false),
        ]
        .into_iter()
        .map(|(n, fill, wide)| {
            let mut v = View::default();
            v.stats.detail = json!({ "histograms": published(fill, wide) });
            (n.to_owned(), v)
        })
        .collect();
        let snapshot = running(views);
        let out = histograms(&f, &snapshot);
        let shown: Vec<(String, String, Value, Value)> = out
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                let n = h.get("entries").or(h.get("value")).cloned().unwrap();
                (
                    h["component"].as_str().unwrap().to_owned(),
                    h["name"].as_str().unwrap().to_owned(),
                    n,
                    h.get("members").cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        let s = |a: &str, b: &str, n: u64, m: Value| (a.to_owned(), b.to_owned(), json!(n), m);
        assert_eq!(
            shown,
            [
                s("mons", "adc", 2, json!(["m-0", "m-1"])),
                s("mons", "hits", 4, json!(["m-0", "m-1"])),
                s("m-0", "rate", 0, Value::Null),
                s("m-1", "rate", 0, Value::Null),
                s("users", "adc", 1, json!(["u-0"])),
                s("users", "hits", 4, json!(["u-0", "u-1"])),
                s("u-0", "rate", 0, Value::Null),
                s("u-1", "adc", 1, Value::Null),
                s("u-1", "rate", 0, Value::Null),
                s("solo", "adc", 1, Value::Null),
                s("solo", "hits", 2, Value::Null),
                s("solo", "rate", 0, Value::Null),
            ],
            "a time series and a histogram of another binning stay their member's"
        );
        let adc = &out[0];
        assert_eq!(
            (adc["mean"].as_f64(), adc["min"].as_f64(), adc["max"].as_f64()),
            (Some(15.0), Some(10.0), Some(20.0))
        );
    }

    #[test]
    fn lost_is_the_triggers_so_far_in_a_run() {
        let f = file();
        let mut v = views();
        assert_eq!(live(&f, &v, Some(1)).lost, None, "no trigger counts");
        let mut evm =
            Stats::counted(10, 0).with_trigger(TriggerCounts { triggered: 10, lost: 2, ..Default::default() });
        (evm.at_ms, evm.run) = (Some(5), Some(1));
        v[0].1.take_stats(evm.clone(), 5);
        v[0].1.earlier.push(Stats::counted(4, 0).with_trigger(TriggerCounts { lost: 1, ..Default::default() }));
        assert_eq!(live(&f, &v, Some(1)).lost, Some(3));
        // The last run's counters are not this run's.
        evm.run = Some(0);
        v[0].1.take_stats(evm, 6);
        assert_eq!(live(&f, &v, Some(1)).lost, Some(1));
    }
}
