//! The measurement window of `evb local`: rates from two readings of each component's own
//! counters and clock.
//!
//! The operator shows each component's statistics as the component last published them, once a
//! second. A rate taken as the change of a counter over the operator's clock between two looks
//! at its status would be off by up to a publication period at each end (±1 s on a 3 s
//! window). A [`Reading`] therefore pairs a counter with the component's own clock,
//! `detail.seconds` (seconds since it started the run, taken when it made those statistics),
//! and a component's rate is the change of its counter over the change of its clock between
//!
//! - its first reading at or after the warm-up by its own clock, and
//! - its last reading before the run is stopped,
//!
//! both of the same process (the same pid), and only if it is still alive at the end: a
//! component that died counts nothing. The events built per second are the EVM's
//! (`trigger.built`); the RUs' MB/s in are the sum of each RU's fragment bytes
//! (`detail.counters.fragment_bytes`) rate; the BUs' MB/s out the sum of each BU's `bytes` rate.
//! Publications come once a second, so [`Window::complete`] says whether every component
//! measured has published a reading after its first; `evb local` lets a run go on past
//! `--seconds` until it has (a second or so, in a run too short for two publications).
//!
//! ```text
//!  component's clock:  0 ──── warm-up ──┬── first ─────────────── last ──┬── stop
//!  publications:        ·      ·      · │  ·      ·      ·      ·      · │
//!                                       └─ rate = Δcounter / Δseconds ───┘
//! ```

use std::collections::BTreeMap;

use daqflow_api::SystemStatus;
use daqflow_component::Stats;

/// Which counter of a component is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quantity {
    /// The EVM's events built (`trigger.built`).
    Built,
    /// An RU's fragment bytes in (`detail.counters.fragment_bytes`).
    FragmentBytes,
    /// A BU's event bytes out (`bytes`).
    EventBytes,
}

impl Quantity {
    /// The quantity a component of `kind` is measured by.
    pub(crate) fn of_kind(kind: &str) -> Option<Quantity> {
        match kind {
            "evm" => Some(Quantity::Built),
            "ru" => Some(Quantity::FragmentBytes),
            "bu" => Some(Quantity::EventBytes),
            _ => None,
        }
    }

    fn value(self, stats: &Stats) -> Option<f64> {
        match self {
            Quantity::Built => stats.trigger.as_ref().map(|t| t.built as f64),
            Quantity::FragmentBytes => stats.detail.get("counters")?.get("fragment_bytes")?.as_f64(),
            Quantity::EventBytes => Some(stats.bytes as f64),
        }
    }
}

/// A counter and the component's clock when it was read.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    seconds: f64,
    value: f64,
}

#[derive(Debug, Clone)]
struct Series {
    quantity: Quantity,
    pid: Option<u32>,
    first: Reading,
    last: Reading,
    /// Alive at the last look, and the same process throughout.
    counts: bool,
}

impl Series {
    fn rate(&self) -> Option<f64> {
        let dt = self.last.seconds - self.first.seconds;
        (self.counts && dt > 0.0).then(|| (self.last.value - self.first.value).max(0.0) / dt)
    }
}

/// What the window measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Measured {
    /// Events built per second (the EVM's).
    pub events_per_s: f64,
    /// Fragment MB/s into all RUs (10⁶ bytes).
    pub ru_mb_per_s: f64,
    /// Event MB/s out of all BUs.
    pub bu_mb_per_s: f64,
    /// The window's length on the EVM's clock (0: no window).
    pub seconds: f64,
}

/// The readings of every component measured.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    warmup: f64,
    series: BTreeMap<String, Series>,
}

impl Window {
    /// A window opening `warmup` seconds into the run, by each component's clock.
    pub(crate) fn new(warmup: f64) -> Window {
        Window { warmup, series: BTreeMap::new() }
    }

    /// One look at component `name` (process `pid`, `alive` or not) and its statistics.
    pub(crate) fn observe(&mut self, name: &str, quantity: Quantity, pid: Option<u32>, alive: bool, stats: &Stats) {
        let (Some(seconds), Some(value)) =
            (stats.detail.get("seconds").and_then(|s| s.as_f64()), quantity.value(stats))
        else {
            return;
        };
        let reading = Reading { seconds, value };
        match self.series.get_mut(name) {
            Some(s) => {
                if s.pid != pid {
                    s.counts = false;
                } else if alive && seconds >= s.last.seconds {
                    s.last = reading;
                }
                s.counts &= alive;
            }
            None if alive && seconds >= self.warmup => {
                self.series
                    .insert(name.to_owned(), Series { quantity, pid, first: reading, last: reading, counts: true });
            }
            None => {}
        }
    }

    /// One look at every EVM, RU and BU of the operator's status.
    pub(crate) fn observe_status(&mut self, status: &SystemStatus) {
        for c in &status.components {
            if let Some(q) = Quantity::of_kind(&c.kind) {
                self.observe(&c.name, q, c.pid, c.alive, &c.stats);
            }
        }
    }

    /// Whether every component measured (the EVM, every live RU and BU of `status`, and
    /// whatever else was observed) has a reading after its first. One that died or came back
    /// as another process is not waited for: it counts nothing.
    pub(crate) fn complete(&self, status: &SystemStatus) -> bool {
        let measured = |name: &str| match self.series.get(name) {
            Some(s) => !s.counts || s.last.seconds > s.first.seconds,
            None => false,
        };
        let live = status.components.iter().filter(|c| c.alive && Quantity::of_kind(&c.kind).is_some());
        live.clone().all(|c| measured(&c.name))
            && live.clone().any(|c| c.kind == "evm")
            && self.series.keys().all(|n| measured(n))
    }

    /// The rates over the window.
    pub(crate) fn measured(&self) -> Measured {
        let mut m = Measured::default();
        for s in self.series.values() {
            let Some(rate) = s.rate() else { continue };
            match s.quantity {
                Quantity::Built => {
                    m.events_per_s += rate;
                    m.seconds = s.last.seconds - s.first.seconds;
                }
                Quantity::FragmentBytes => m.ru_mb_per_s += rate / 1e6,
                Quantity::EventBytes => m.bu_mb_per_s += rate / 1e6,
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_component::TriggerCounts;
    use serde_json::json;

    fn evm(seconds: f64, built: u64) -> Stats {
        Stats::default()
            .with_trigger(TriggerCounts { built, ..Default::default() })
            .with_detail(&json!({ "seconds": seconds }))
    }

    fn ru(seconds: f64, bytes: u64) -> Stats {
        Stats::default().with_detail(&json!({ "seconds": seconds, "counters": { "fragment_bytes": bytes } }))
    }

    fn bu(seconds: f64, bytes: u64) -> Stats {
        Stats::counted(0, bytes).with_detail(&json!({ "seconds": seconds }))
    }

    #[test]
    fn rates_are_taken_on_each_components_clock_from_its_first_reading_after_the_warm_up() {
        let mut w = Window::new(1.0);
        // Before the warm-up: ignored. The same publication seen many times: no window yet.
        w.observe("evm", Quantity::Built, Some(1), true, &evm(0.6, 600));
        w.observe("evm", Quantity::Built, Some(1), true, &evm(1.6, 1600));
        w.observe("evm", Quantity::Built, Some(1), true, &evm(1.6, 1600));
        assert_eq!(w.measured().events_per_s, 0.0);
        // Published 1.1 s later (the operator looked 2 s later: its clock would say 800/s).
        w.observe("evm", Quantity::Built, Some(1), true, &evm(2.7, 3250));
        w.observe("ru-0", Quantity::FragmentBytes, Some(2), true, &ru(1.2, 1_000_000));
        w.observe("ru-0", Quantity::FragmentBytes, Some(2), true, &ru(3.2, 21_000_000));
        w.observe("ru-1", Quantity::FragmentBytes, Some(3), true, &ru(1.4, 0));
        w.observe("ru-1", Quantity::FragmentBytes, Some(3), true, &ru(2.4, 5_000_000));
        let m = w.measured();
        assert!((m.events_per_s - 1500.0).abs() < 1e-6, "{m:?}");
        assert!((m.seconds - 1.1).abs() < 1e-9);
        assert!((m.ru_mb_per_s - 15.0).abs() < 1e-9, "10 MB/s + 5 MB/s: {m:?}");
    }

    #[test]
    fn a_component_that_died_or_came_back_as_another_process_counts_nothing() {
        let mut w = Window::new(0.5);
        w.observe("bu-0", Quantity::EventBytes, Some(5), true, &bu(1.0, 0));
        w.observe("bu-0", Quantity::EventBytes, Some(5), true, &bu(2.0, 4_000_000));
        w.observe("bu-1", Quantity::EventBytes, Some(6), true, &bu(1.0, 0));
        w.observe("bu-1", Quantity::EventBytes, Some(6), true, &bu(2.0, 4_000_000));
        w.observe("bu-2", Quantity::EventBytes, Some(7), true, &bu(1.0, 0));
        w.observe("bu-2", Quantity::EventBytes, Some(8), true, &bu(0.5, 1_000_000));
        assert!((w.measured().bu_mb_per_s - 8.0).abs() < 1e-9);
        w.observe("bu-1", Quantity::EventBytes, Some(6), false, &bu(2.0, 4_000_000));
        assert!((w.measured().bu_mb_per_s - 4.0).abs() < 1e-9, "bu-1 died, bu-2 was restarted");
    }

    #[test]
    fn statistics_without_a_clock_or_the_counter_are_no_reading() {
        let mut w = Window::new(0.0);
        w.observe("evm", Quantity::Built, Some(1), true, &Stats::counted(10, 0));
        w.observe("ru-0", Quantity::FragmentBytes, Some(1), true, &bu(1.0, 10));
        assert!(w.series.is_empty());
    }
}
