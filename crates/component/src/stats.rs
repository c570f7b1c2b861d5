//! What a component counts: [`Stats`], published live and returned as the summary of a run.
//!
//! Every kind reports the same typed counters (`events`, `bytes`, the rates), each in the sense
//! its kind's [`Role`](crate::Role) gives it (triggered by a trigger, built by a builder,
//! recorded by a recorder, …), which is all the operator's accounting and displays read; the
//! trigger (the event manager) adds its [`TriggerCounts`]. What only one kind has goes in
//! `detail`, the kind's own statistics type serialised once, when the component reports.
//!
//! ```
//! use daqflow_component::Stats;
//! #[derive(serde::Serialize)]
//! struct RecorderDetail { files: u32 }
//! let s = Stats::counted(10, 4096).with_rates(5.0, 0.002).with_detail(&RecorderDetail { files: 1 });
//! let json = serde_json::to_value(&s).unwrap();
//! assert_eq!((json["events"].as_u64(), json["detail"]["files"].as_u64()), (Some(10), Some(1)));
//! let back: Stats = serde_json::from_value(json).unwrap();
//! assert_eq!(back, s);
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `configure` tells the others (e.g. `{"listen": "127.0.0.1:7101"}`): the operator puts
/// these values into other components' parameters (`${name.listen}`).
pub type Info = serde_json::Map<String, Value>;

/// A component's counters: live (its `NAME/stats` service, once a second) and at the end of a
/// run (the `stop` summary).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Events handled in the run, in the sense of the kind's role: triggered (trigger), sent
    /// (readout), built (builder), stored (buffer), recorded (recorder), processed (other).
    pub events: u64,
    /// Bytes of those events.
    pub bytes: u64,
    /// Events per second: over the last second live, over the run in a summary.
    pub events_per_s: f64,
    /// Megabytes (10⁶ bytes) per second, likewise.
    pub mb_per_s: f64,
    /// The trigger's accounting (the event manager only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerCounts>,
    /// The kind's own figures (a JSON object, documented with the kind); null when none.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub detail: Value,
    /// When these counters were read (Unix ms, the component's clock): stamped by the
    /// [`Driver`](crate::Driver) as it reads them, so that counters of different components
    /// can be put side by side as of one moment (the operator never shows more events recorded
    /// than built). None from a publisher that does not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// The run these counters count, stamped by the [`Driver`](crate::Driver): from the
    /// component's start until it is configured anew or reset (after the stop they are the
    /// run's last; before the next start, still that run's). None before its first run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

impl Stats {
    /// `events` events of `bytes` bytes, no rates, no detail.
    pub fn counted(events: u64, bytes: u64) -> Stats {
        Stats { events, bytes, ..Stats::default() }
    }

    /// With rates.
    pub fn with_rates(mut self, events_per_s: f64, mb_per_s: f64) -> Stats {
        self.events_per_s = events_per_s;
        self.mb_per_s = mb_per_s;
        self
    }

    /// With the trigger's accounting.
    pub fn with_trigger(mut self, trigger: TriggerCounts) -> Stats {
        self.trigger = Some(trigger);
        self
    }

    /// With the kind's own figures, serialised now (a type that does not serialise leaves
    /// `detail` null).
    pub fn with_detail<T: Serialize + ?Sized>(mut self, detail: &T) -> Stats {
        self.detail = serde_json::to_value(detail).unwrap_or(Value::Null);
        self
    }

    /// Every number in these counters as `(key, value)`, the names the history of slow values
    /// and the alarms use after `COMPONENT.`: `events`, `bytes`, `events_per_s`, `mb_per_s`,
    /// `trigger.triggered` … `trigger.lost`, `trigger.lost_reasons.CAUSE`, and every number of
    /// `detail` by its path (`detail.files`, `detail.stations.0.events`); booleans are 0 and 1,
    /// strings, nulls and arrays of more than 32 items (a histogram's bins) are left out.
    ///
    /// ```
    /// use daqflow_component::Stats;
    /// let s = Stats::counted(10, 4096).with_detail(&serde_json::json!({"throttled": true, "disk": {"free_gb": 1.5}}));
    /// let v: std::collections::BTreeMap<String, f64> = s.values().into_iter().collect();
    /// assert_eq!(v["events"], 10.0);
    /// assert_eq!(v["detail.throttled"], 1.0);
    /// assert_eq!(v["detail.disk.free_gb"], 1.5);
    /// ```
    pub fn values(&self) -> Vec<(String, f64)> {
        let mut out = vec![
            ("events".to_owned(), self.events as f64),
            ("bytes".to_owned(), self.bytes as f64),
            ("events_per_s".to_owned(), self.events_per_s),
            ("mb_per_s".to_owned(), self.mb_per_s),
        ];
        if let Some(t) = &self.trigger {
            out.push(("trigger.triggered".into(), t.triggered as f64));
            out.push(("trigger.rejected".into(), t.rejected as f64));
            out.push(("trigger.built".into(), t.built as f64));
            out.push(("trigger.lost".into(), t.lost as f64));
            for (cause, n) in &t.lost_reasons {
                out.push((format!("trigger.lost_reasons.{cause}"), *n as f64));
            }
        }
        flatten("detail", &self.detail, &mut out);
        out
    }

    /// The kind's own figures as a typed value, if they are one.
    pub fn detail_as<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.detail.clone()).ok()
    }
}

/// Arrays longer than this are left out of [`Stats::values`].
pub const MAX_ARRAY: usize = 32;

/// Every number under `value`, keyed by its dotted path below `prefix`.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, f64)>) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.push((prefix.to_owned(), f));
            }
        }
        Value::Bool(b) => out.push((prefix.to_owned(), if *b { 1.0 } else { 0.0 })),
        Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        // Long arrays are data (a histogram's bins), not slow values.
        Value::Array(items) if items.len() > MAX_ARRAY => {}
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), v, out);
            }
        }
        Value::Null | Value::String(_) => {}
    }
}

/// The accounting of the events a trigger (the event manager) decided on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TriggerCounts {
    /// Events triggered (assigned an event id).
    pub triggered: u64,
    /// Events the high-level trigger rejected (accounted, not built).
    pub rejected: u64,
    /// Events built and confirmed by a builder.
    pub built: u64,
    /// Events triggered but neither built nor rejected (0 in a run that ended well).
    pub lost: u64,
    /// Why the lost ones were lost: a count per cause.
    pub lost_reasons: BTreeMap<String, u64>,
    /// Why the run was aborted, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
