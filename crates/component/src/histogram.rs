//! Histograms as components publish them in their statistics (`detail.histograms`: the ET
//! `monitor`, the chain's `chain_monitor`, and any component of a user's own), which the
//! operator's `GET /api/histograms` and the web UI draw: one-dimensional [`Histogram`]s,
//! two-dimensional [`Histogram2D`]s and [`Counter`]s, kept by name in a [`HistogramSet`].
//! [`merge`] sums the published form of histograms of the same name and binning (the members of
//! a parallel group each fill their share of the events).
//!
//! ```
//! use daqflow_component::histogram::Histogram;
//! let mut h = Histogram::new("event_size", "Event size", "bytes", 0.0, 100.0, 10);
//! h.fill(5.0);
//! h.fill(250.0);
//! let json = h.to_json();
//! assert_eq!((json["bins"][0].as_u64(), json["overflow"].as_u64()), (Some(1), Some(1)));
//! assert_eq!((json["mean"].as_f64(), json["max"].as_f64()), (Some(127.5), Some(250.0)));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A one-dimensional histogram with fixed bins, and the true sum, extremes and mean of what
/// was filled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Its name (`event_size`, `fragment_size_src3`, `rate`).
    pub name: String,
    /// Its title.
    pub title: String,
    /// The label of its x axis.
    pub x_label: String,
    /// The lower edge of the first bin.
    pub low: f64,
    /// The upper edge of the last bin.
    pub high: f64,
    /// The counts of the bins, from `low` to `high`.
    pub bins: Vec<u64>,
    /// Entries below `low` (and NaN).
    pub underflow: u64,
    /// Entries at or above `high`.
    pub overflow: u64,
    /// Entries counted, under- and overflow included.
    pub entries: u64,
    /// The sum of the values filled (each `n` times), under- and overflow included.
    #[serde(default)]
    pub sum: f64,
    /// The smallest value filled (none while empty).
    #[serde(default)]
    pub min: Option<f64>,
    /// The largest value filled (none while empty).
    #[serde(default)]
    pub max: Option<f64>,
    /// `sum / entries` (none while empty).
    #[serde(default)]
    pub mean: Option<f64>,
    /// What `mean`, `min` and `max` count (`bytes`, `events/s`).
    #[serde(default)]
    pub unit: String,
    /// Whether the bins are a time series (a count per second), not a distribution.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub series: bool,
}

impl Histogram {
    /// `bins` equal bins from `low` to `high`.
    pub fn new(name: &str, title: &str, x_label: &str, low: f64, high: f64, bins: usize) -> Histogram {
        Histogram {
            name: name.into(),
            title: title.into(),
            x_label: x_label.into(),
            low,
            high: if high > low { high } else { low + 1.0 },
            bins: vec![0; bins.max(1)],
            underflow: 0,
            overflow: 0,
            entries: 0,
            sum: 0.0,
            min: None,
            max: None,
            mean: None,
            unit: x_label.into(),
            series: false,
        }
    }

    /// Its name (`event_size`, `fragment_size_src3`, `rate`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The counts of its bins, from `low` to `high`.
    pub fn bins(&self) -> &[u64] {
        &self.bins
    }

    /// Entries counted, under- and overflow included.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Counts one entry at `x`.
    pub fn fill(&mut self, x: f64) {
        self.fill_n(x, 1);
    }

    /// The mean of the values filled (none while empty).
    pub fn mean(&self) -> Option<f64> {
        self.mean
    }

    /// The smallest and the largest value filled (none while empty).
    pub fn extremes(&self) -> Option<(f64, f64)> {
        self.min.zip(self.max)
    }

    /// Counts `n` entries at `x`.
    pub fn fill_n(&mut self, x: f64, n: u64) {
        if n == 0 {
            return;
        }
        self.entries += n;
        if !x.is_nan() {
            self.sum += x * n as f64;
            self.min = Some(self.min.map_or(x, |m| m.min(x)));
            self.max = Some(self.max.map_or(x, |m| m.max(x)));
            self.mean = Some(self.sum / self.entries as f64);
        }
        if x.is_nan() || x < self.low {
            self.underflow += n;
        } else if x >= self.high {
            self.overflow += n;
        } else {
            let i = ((x - self.low) / (self.high - self.low) * self.bins.len() as f64) as usize;
            let last = self.bins.len() - 1;
            self.bins[i.min(last)] += n;
        }
    }

    /// The histogram as published.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Empties it (same binning).
    pub fn reset(&mut self) {
        self.bins.iter_mut().for_each(|b| *b = 0);
        (self.underflow, self.overflow, self.entries, self.sum) = (0, 0, 0, 0.0);
        (self.min, self.max, self.mean) = (None, None, None);
    }
}

/// The bin of `x` among `n` equal bins from `low` to `high`; `None` outside (and for NaN).
fn bin_of(x: f64, low: f64, high: f64, n: usize) -> Option<usize> {
    if x.is_nan() || x < low || x >= high {
        return None;
    }
    Some((((x - low) / (high - low) * n as f64) as usize).min(n - 1))
}

/// One axis of a [`Histogram2D`]: `bins` equal bins from `low` to `high`, and its label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    /// Its label, with the unit (`channel`, `ADC counts`, `ns`).
    pub label: String,
    /// The lower edge of its first bin.
    pub low: f64,
    /// The upper edge of its last bin.
    pub high: f64,
    /// Its number of bins.
    pub bins: usize,
}

impl Axis {
    /// `bins` equal bins from `low` to `high` (at least one; `high` above `low`).
    pub fn new(label: &str, low: f64, high: f64, bins: usize) -> Axis {
        Axis { label: label.into(), low, high: if high > low { high } else { low + 1.0 }, bins: bins.max(1) }
    }
}

/// A two-dimensional histogram with fixed bins: published as `{"kind": "h2", "name", "title",
/// "x": {axis}, "y": {axis}, "bins": [row-major, y by y: bins[iy * x.bins + ix]], "outside",
/// "entries"}`, where `outside` counts the entries outside either range (and NaN).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram2D {
    /// Its name.
    pub name: String,
    /// Its title.
    pub title: String,
    /// Its x axis.
    pub x: Axis,
    /// Its y axis.
    pub y: Axis,
    /// The counts, row by row (`bins[iy * x.bins + ix]`).
    pub bins: Vec<u64>,
    /// Entries outside the ranges.
    pub outside: u64,
    /// Entries counted, those outside included.
    pub entries: u64,
}

impl Histogram2D {
    /// An empty histogram over `x` × `y`.
    pub fn new(name: &str, title: &str, x: Axis, y: Axis) -> Histogram2D {
        let bins = vec![0; x.bins * y.bins];
        Histogram2D { name: name.into(), title: title.into(), x, y, bins, outside: 0, entries: 0 }
    }

    /// Counts one entry at (`x`, `y`).
    pub fn fill(&mut self, x: f64, y: f64) {
        self.fill_n(x, y, 1);
    }

    /// Counts `n` entries at (`x`, `y`).
    pub fn fill_n(&mut self, x: f64, y: f64, n: u64) {
        self.entries += n;
        match (bin_of(x, self.x.low, self.x.high, self.x.bins), bin_of(y, self.y.low, self.y.high, self.y.bins)) {
            (Some(ix), Some(iy)) => self.bins[iy * self.x.bins + ix] += n,
            _ => self.outside += n,
        }
    }

    /// The count of bin (`ix`, `iy`).
    pub fn bin(&self, ix: usize, iy: usize) -> u64 {
        if ix < self.x.bins && iy < self.y.bins { self.bins[iy * self.x.bins + ix] } else { 0 }
    }

    /// Empties it.
    pub fn reset(&mut self) {
        self.bins.iter_mut().for_each(|b| *b = 0);
        (self.outside, self.entries) = (0, 0);
    }

    /// The histogram as published.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        v["kind"] = json!("h2");
        v
    }
}

/// A named count (hits, errors, a detector's triggers): published as `{"kind": "counter",
/// "name", "title", "value", "unit"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    /// Its name.
    pub name: String,
    /// Its title.
    pub title: String,
    /// What it counts (`hits`, `events`).
    pub unit: String,
    /// The count.
    pub value: u64,
}

impl Counter {
    /// A counter at 0.
    pub fn new(name: &str, title: &str, unit: &str) -> Counter {
        Counter { name: name.into(), title: title.into(), unit: unit.into(), value: 0 }
    }

    /// The published form.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        v["kind"] = json!("counter");
        v
    }
}

/// One entry of a [`HistogramSet`].
#[derive(Debug, Clone, PartialEq)]
pub enum Booked {
    /// A one-dimensional histogram.
    H1(Histogram),
    /// A two-dimensional one.
    H2(Histogram2D),
    /// A counter.
    Counter(Counter),
}

/// A component's histograms and counters by name, in the order they were booked: what a
/// monitor of a user's own fills and publishes (`stats().detail["histograms"]` =
/// [`HistogramSet::to_json`]), emptied at each run's start ([`HistogramSet::reset`]).
///
/// ```
/// use daqflow_component::histogram::{Axis, HistogramSet};
/// let mut set = HistogramSet::default();
/// set.h1("adc_ch0", "Channel 0", "ADC counts", 0.0, 4096.0, 128).fill(812.0);
/// set.h2("hitmap", "Hits", Axis::new("channel", 0.0, 16.0, 16), Axis::new("time (ns)", 0.0, 400.0, 40)).fill(3.0, 120.0);
/// set.counter("hits", "Hits above threshold", "hits").value += 1;
/// let published = set.to_json();
/// assert_eq!(published.as_array().unwrap().len(), 3);
/// assert_eq!(published[1]["kind"], "h2");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSet {
    booked: BTreeMap<String, (usize, Booked)>,
}

impl HistogramSet {
    fn book(&mut self, name: &str, make: impl FnOnce() -> Booked) -> &mut Booked {
        let next = self.booked.len();
        &mut self.booked.entry(name.to_owned()).or_insert_with(|| (next, make())).1
    }

    /// The one-dimensional histogram `name`, booked with these bins on first use. A name
    /// booked as another kind is booked again as asked (its contents are lost).
    pub fn h1(&mut self, name: &str, title: &str, x_label: &str, low: f64, high: f64, bins: usize) -> &mut Histogram {
        let make = || Booked::H1(Histogram::new(name, title, x_label, low, high, bins));
        let entry = self.book(name, make);
        if !matches!(entry, Booked::H1(_)) {
            *entry = Booked::H1(Histogram::new(name, title, x_label, low, high, bins));
        }
        match entry {
            Booked::H1(h) => h,
            _ => unreachable!("booked as H1 just above"),
        }
    }

    /// The two-dimensional histogram `name`, booked over `x` × `y` on first use.
    pub fn h2(&mut self, name: &str, title: &str, x: Axis, y: Axis) -> &mut Histogram2D {
        let entry = self.book(name, || Booked::H2(Histogram2D::new(name, title, x.clone(), y.clone())));
        if !matches!(entry, Booked::H2(_)) {
            *entry = Booked::H2(Histogram2D::new(name, title, x, y));
        }
        match entry {
            Booked::H2(h) => h,
            _ => unreachable!("booked as H2 just above"),
        }
    }

    /// The counter `name`, at 0 on first use.
    pub fn counter(&mut self, name: &str, title: &str, unit: &str) -> &mut Counter {
        let entry = self.book(name, || Booked::Counter(Counter::new(name, title, unit)));
        if !matches!(entry, Booked::Counter(_)) {
            *entry = Booked::Counter(Counter::new(name, title, unit));
        }
        match entry {
            Booked::Counter(c) => c,
            _ => unreachable!("booked as a counter just above"),
        }
    }

    /// Empties every histogram and counter (a run starts), keeping what is booked.
    pub fn reset(&mut self) {
        for (_, b) in self.booked.values_mut() {
            match b {
                Booked::H1(h) => h.reset(),
                Booked::H2(h) => h.reset(),
                Booked::Counter(c) => c.value = 0,
            }
        }
    }

    /// Whether nothing is booked.
    pub fn is_empty(&self) -> bool {
        self.booked.is_empty()
    }

    /// Every entry, published (`detail.histograms`), in booking order.
    pub fn to_json(&self) -> Value {
        let mut all: Vec<&(usize, Booked)> = self.booked.values().collect();
        all.sort_by_key(|(i, _)| *i);
        Value::Array(
            all.into_iter()
                .map(|(_, b)| match b {
                    Booked::H1(h) => h.to_json(),
                    Booked::H2(h) => h.to_json(),
                    Booked::Counter(c) => c.to_json(),
                })
                .collect(),
        )
    }
}

/// The kind of a published histogram: `"h1"` (also when the key is absent: the built-in
/// monitors' form), `"h2"` or `"counter"`.
pub fn kind_of(published: &Value) -> &str {
    published.get("kind").and_then(Value::as_str).unwrap_or("h1")
}

/// Adds the published histogram `other` to `into` (members of a parallel group each fill their
/// share): bins, entries and their sums, extremes and mean. Only histograms of the same kind,
/// name and binning are added, and not time series (each member's seconds are its own):
/// otherwise nothing changes and `false` is returned.
pub fn merge(into: &mut Value, other: &Value) -> bool {
    let kind = kind_of(into);
    if kind != kind_of(other) || into.get("name") != other.get("name") || into.get("series").is_some() {
        return false;
    }
    let same = |keys: &[&str]| keys.iter().all(|k| into.get(*k) == other.get(*k));
    let add = |into: &mut Value, key: &str| {
        let sum =
            into.get(key).and_then(Value::as_u64).unwrap_or(0) + other.get(key).and_then(Value::as_u64).unwrap_or(0);
        into[key] = json!(sum);
    };
    let add_bins = |into: &mut Value| -> bool {
        let (Some(a), Some(b)) =
            (into.get("bins").and_then(Value::as_array), other.get("bins").and_then(Value::as_array))
        else {
            return false;
        };
        if a.len() != b.len() {
            return false;
        }
        let summed: Vec<Value> =
            a.iter().zip(b).map(|(x, y)| json!(x.as_u64().unwrap_or(0) + y.as_u64().unwrap_or(0))).collect();
        into["bins"] = Value::Array(summed);
        true
    };
    match kind {
        "counter" => {
            add(into, "value");
            true
        }
        "h2" => {
            if !same(&["x", "y"]) || !add_bins(into) {
                return false;
            }
            add(into, "outside");
            add(into, "entries");
            true
        }
        _ => {
            if !same(&["low", "high"]) || !add_bins(into) {
                return false;
            }
            for key in ["underflow", "overflow", "entries"] {
                add(into, key);
            }
            let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
            let sum = f(into, "sum").unwrap_or(0.0) + f(other, "sum").unwrap_or(0.0);
            into["sum"] = json!(sum);
            let pick = |a: Option<f64>, b: Option<f64>, min: bool| match (a, b) {
                (Some(a), Some(b)) => Some(if min { a.min(b) } else { a.max(b) }),
                (a, b) => a.or(b),
            };
            into["min"] = json!(pick(f(into, "min"), f(other, "min"), true));
            into["max"] = json!(pick(f(into, "max"), f(other, "max"), false));
            let entries = into["entries"].as_u64().unwrap_or(0);
            into["mean"] =
                if into["min"].is_null() || entries == 0 { Value::Null } else { json!(sum / entries as f64) };
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2d_histogram_counts_row_by_row_and_what_falls_outside() {
        let mut h = Histogram2D::new("map", "Map", Axis::new("channel", 0.0, 4.0, 4), Axis::new("ns", 0.0, 100.0, 2));
        h.fill(1.5, 10.0);
        h.fill(3.9, 99.0);
        h.fill_n(3.0, 50.0, 2);
        h.fill(4.0, 10.0);
        h.fill(f64::NAN, 10.0);
        h.fill(0.0, -1.0);
        assert_eq!((h.bin(1, 0), h.bin(3, 1), h.bin(9, 9)), (1, 3, 0));
        assert_eq!((h.entries, h.outside), (7, 3));
        let j = h.to_json();
        assert_eq!((j["kind"].as_str(), j["bins"].as_array().unwrap().len()), (Some("h2"), 8));
        assert_eq!(j["bins"][4 + 3], 3, "row 1 (y ≥ 50), column 3");
        h.reset();
        assert_eq!((h.entries, h.outside, h.bins.iter().sum::<u64>()), (0, 0, 0));
    }

    #[test]
    fn a_set_keeps_booking_order_and_a_run_start_empties_it() {
        let mut set = HistogramSet::default();
        set.h1("b", "B", "x", 0.0, 10.0, 10).fill(1.0);
        set.counter("a", "A", "hits").value += 5;
        set.h1("b", "ignored: already booked", "x", 0.0, 99.0, 3).fill(2.0);
        let j = set.to_json();
        assert_eq!((j[0]["name"].as_str(), j[1]["name"].as_str()), (Some("b"), Some("a")));
        assert_eq!((j[0]["entries"].as_u64(), j[0]["title"].as_str()), (Some(2), Some("B")));
        assert_eq!(j[1]["value"], 5);
        set.reset();
        let j = set.to_json();
        assert_eq!(
            (j[0]["entries"].as_u64(), j[1]["value"].as_u64(), j[0]["mean"].is_null()),
            (Some(0), Some(0), true)
        );
        // The same name asked for as another kind is booked again as that kind.
        set.counter("b", "B as a counter", "n").value = 1;
        assert_eq!(set.to_json()[0]["kind"], "counter");
    }

    #[test]
    fn members_histograms_of_the_same_binning_add_up() {
        let mut a = Histogram::new("adc", "ADC", "counts", 0.0, 10.0, 5);
        let mut b = a.clone();
        a.fill(1.0);
        a.fill(-1.0);
        b.fill(9.0);
        b.fill(20.0);
        let mut merged = a.to_json();
        assert!(merge(&mut merged, &b.to_json()));
        let mut both = a.clone();
        for x in [9.0, 20.0] {
            both.fill(x);
        }
        assert_eq!(merged, both.to_json(), "as if one histogram had been filled with every value");
        // Another binning, another name, a kind or a time series: not added.
        let other = Histogram::new("adc", "ADC", "counts", 0.0, 20.0, 5).to_json();
        assert!(!merge(&mut merged, &other));
        assert!(!merge(&mut merged, &Histogram::new("tdc", "", "", 0.0, 10.0, 5).to_json()));
        assert!(!merge(&mut merged, &Counter::new("adc", "", "").to_json()));
        let mut series = Histogram::new("rate", "", "", -2.0, 0.0, 2);
        series.series = true;
        let mut s = series.to_json();
        assert!(!merge(&mut s, &series.to_json()));
        assert_eq!(merged, both.to_json(), "unchanged by the refusals");

        let axes = || (Axis::new("x", 0.0, 2.0, 2), Axis::new("y", 0.0, 2.0, 2));
        let (x, y) = axes();
        let mut h = Histogram2D::new("m", "M", x, y);
        h.fill(0.5, 0.5);
        let (x, y) = axes();
        let mut g = Histogram2D::new("m", "M", x, y);
        g.fill(0.5, 0.5);
        g.fill(5.0, 0.5);
        let mut merged = h.to_json();
        assert!(merge(&mut merged, &g.to_json()));
        assert_eq!(
            (merged["bins"][0].as_u64(), merged["outside"].as_u64(), merged["entries"].as_u64()),
            (Some(2), Some(1), Some(3))
        );
        let mut c = Counter::new("n", "N", "hits");
        c.value = 2;
        let mut merged = c.to_json();
        assert!(merge(&mut merged, &c.to_json()));
        assert_eq!(merged["value"], 4);
    }
}
