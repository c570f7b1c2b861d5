//! A one-dimensional histogram as the kinds that fill histograms publish it in their
//! statistics (`detail.histograms`: the ET `monitor`, the chain's `chain_monitor`), which the
//! operator's `GET /api/histograms` and the web UI draw.
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

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
}
