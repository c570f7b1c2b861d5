//! What the operator shows: the [`SystemStatus`] of the web UI and of `/metrics`, the rate
//! plot's points, the monitors' histograms and the ET systems' stations, all from the
//! sequencer's [`Snapshot`] and the components' typed [`Stats`]; and the run's summary from
//! what the sequencer hands over at its end.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use daqflow_api::{ComponentRecord, ComponentView, RatePoint, RunState, RunSummary, SystemState, SystemStatus};
use daqflow_component::{Role, Stats};
use serde_json::{Value, json};

use super::sequencer::{CloseRun, Snapshot, View};
use crate::accounting::{account, files_on_disk};
use crate::system::SystemFile;

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

/// The run's live totals: events and bytes built (the builders' counters) and events recorded
/// (the recorders'), each with the counts of the components' earlier lives in the run, so that
/// a restart never makes them go down.
pub(crate) fn live_totals(file: &SystemFile, views: &[(String, View)]) -> (u64, u64, u64) {
    let (mut events, mut bytes, mut recorded) = (0u64, 0u64, 0u64);
    for (c, (_, v)) in file.components.iter().zip(views) {
        let lives = || std::iter::once(&v.stats).chain(&v.earlier);
        match c.role {
            Role::Builder => {
                events += lives().map(|s| s.events).sum::<u64>();
                bytes += lives().map(|s| s.bytes).sum::<u64>();
            }
            Role::Recorder => recorded += lives().map(|s| s.events).sum::<u64>(),
            _ => {}
        }
    }
    (events, bytes, recorded)
}

/// The rate plot, sampled once a second.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    points: VecDeque<RatePoint>,
    totals: (u64, u64),
}

impl Rates {
    /// Takes a sample: the change of the live totals since the last one.
    pub(crate) fn sample(&mut self, file: &SystemFile, snapshot: &Snapshot, t_ms: u64) {
        let (events, bytes, _) = live_totals(file, &snapshot.views);
        let running = snapshot.run_started_ms.is_some();
        let (e0, b0) = self.totals;
        self.points.push_back(RatePoint {
            t_ms,
            events_per_s: if running { events.saturating_sub(e0) as f64 } else { 0.0 },
            mb_per_s: if running { bytes.saturating_sub(b0) as f64 / 1e6 } else { 0.0 },
        });
        self.totals = (events, bytes);
        while self.points.len() > RATE_POINTS {
            self.points.pop_front();
        }
    }

    /// Forgets the points of the last run (a new one starts).
    pub(crate) fn clear(&mut self) {
        self.points.clear();
        self.totals = (0, 0);
    }

    pub(crate) fn points(&self) -> Vec<RatePoint> {
        self.points.iter().copied().collect()
    }

    pub(crate) fn last(&self) -> Option<RatePoint> {
        self.points.back().copied()
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
    let (events, bytes, recorded) = live_totals(place.file, &s.views);
    let running = s.run_started_ms.is_some();
    let last = rates.last();
    let summary = s.last_summary.as_ref();
    SystemStatus {
        system: place.file.system.name.clone(),
        state: s.state,
        run: s.run,
        running,
        run_started_ms: s.run_started_ms,
        duration_s: s.run_started_ms.map(|t| now_ms.saturating_sub(t) as f64 / 1e3),
        events: if running { events } else { summary.map_or(events, |x| x.events) },
        bytes,
        recorded: if running { recorded } else { summary.map_or(recorded, |x| x.recorded) },
        events_per_s: last.map_or(0.0, |r| r.events_per_s),
        mb_per_s: last.map_or(0.0, |r| r.mb_per_s),
        // Known only once the run's accounting is done, at its stop.
        lost: if running { None } else { summary.map(|x| x.lost) },
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

/// The monitors' histograms: `[{"component", …histogram}]`.
pub(crate) fn histograms(file: &SystemFile, s: &Snapshot) -> Value {
    let mut out = Vec::new();
    for (c, (_, v)) in file.components.iter().zip(&s.views) {
        if let Some(hs) = v.stats.detail.get("histograms").and_then(Value::as_array) {
            for h in hs {
                let mut h = h.clone();
                h["component"] = json!(c.name);
                out.push(h);
            }
        }
    }
    Value::Array(out)
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
        triggered: a.triggered,
        rejected: a.rejected,
        events: a.events,
        recorded: a.recorded,
        bytes: a.bytes,
        lost: a.lost,
        lost_reasons: a.lost_reasons,
        unknown: a.unknown,
        accounting_complete: a.accounting_complete,
        lost_in_builder: a.lost_in_builder,
        not_recorded: a.not_recorded,
        duplicates: a.duplicates,
        died: a.died,
        files,
        file_problems,
        components,
        errors,
        overrides: close.overrides.clone(),
        degraded: close.degraded.clone(),
        changes: close.changes.clone(),
    }
}

/// Whether the system takes a run (for callers that only know the state).
pub fn in_run(state: SystemState) -> bool {
    matches!(state, SystemState::Running | SystemState::Paused)
}
