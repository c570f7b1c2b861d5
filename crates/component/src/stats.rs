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
    /// Slow values the component reads from elsewhere (a slow-control system's channels, an
    /// EPICS process variable), by name: each is a value of the history and of the alarms as
    /// `COMPONENT.NAME`, with what its source says of it (unit, severity, time stamp). A name
    /// that would shadow one of the counters' own keys ([`SlowValue::name_ok`]) is left out of
    /// [`Stats::values`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub slow: BTreeMap<String, SlowValue>,
}

/// One slow value of [`Stats::slow`]: a number as its source gives it, with that source's
/// unit, severity and time stamp (an EPICS process variable's engineering units, alarm
/// severity and status, and record time stamp).
///
/// ```
/// use daqflow_component::{SlowValue, Stats};
/// let mut s = Stats::counted(0, 0);
/// s.slow.insert("HV:CH1:VMON".into(), SlowValue { value: Some(1512.5), unit: Some("V".into()), severity: Some(1), ..SlowValue::default() });
/// let v: std::collections::BTreeMap<String, f64> = s.values().into_iter().collect();
/// assert_eq!((v["HV:CH1:VMON"], v["HV:CH1:VMON.severity"]), (1512.5, 1.0));
/// assert_eq!(s.units()["HV:CH1:VMON"], "V");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlowValue {
    /// The number; `None` while there is none (a channel disconnected, a value that is not a
    /// number): then the value is absent from the history (a gap) and its alarms' tests are
    /// false.
    pub value: Option<f64>,
    /// Its unit as the source says it (`V`, `uA`, `degC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The source's alarm severity: 0 none, 1 minor, 2 major, 3 invalid (EPICS's
    /// `NO_ALARM` … `INVALID_ALARM`; a disconnected channel is 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub severity: Option<u8>,
    /// The source's alarm status in words (`HIGH`, `HIHI`, `LINK`, `disconnected`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// When the source took the value (Unix ms, the source's clock: an EPICS record's time stamp).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

impl SlowValue {
    /// Whether `name` may name a slow value: 1 … 200 characters, no white space, none of
    /// `< > = ! , "` (the alarms' operators and separators), and not one of the counters' own
    /// keys (`events`, `bytes`, `events_per_s`, `mb_per_s`) nor under `trigger.` or `detail.`.
    pub fn name_ok(name: &str) -> bool {
        !name.is_empty()
            && name.chars().count() <= 200
            && !name.chars().any(|c| c.is_whitespace() || c.is_control() || "<>=!,\"".contains(c))
            && !matches!(name, "events" | "bytes" | "events_per_s" | "mb_per_s" | "trigger" | "detail")
            && !name.starts_with("trigger.")
            && !name.starts_with("detail.")
    }
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
    /// strings, nulls and arrays of more than 32 items (a histogram's bins) are left out; then
    /// each slow value of [`Stats::slow`] that has a number by its name (`HV:CH1:VMON`), and its
    /// severity, when it has one, as `NAME.severity`.
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
        for (name, v) in &self.slow {
            if !SlowValue::name_ok(name) {
                continue;
            }
            if let Some(value) = v.value.filter(|x| x.is_finite()) {
                out.push((name.clone(), value));
            }
            if let Some(severity) = v.severity {
                out.push((format!("{name}.severity"), f64::from(severity)));
            }
        }
        out
    }

    /// The units of the slow values that have one ([`Stats::slow`]), by the key
    /// [`Stats::values`] gives them.
    pub fn units(&self) -> BTreeMap<String, String> {
        self.slow
            .iter()
            .filter(|(name, _)| SlowValue::name_ok(name))
            .filter_map(|(name, v)| Some((name.clone(), v.unit.clone()?)))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_value_without_a_number_or_with_a_name_that_shadows_a_counter_is_left_out() {
        let mut s = Stats::counted(7, 0);
        let v = |value: Option<f64>| SlowValue { value, unit: Some("V".into()), ..SlowValue::default() };
        s.slow.insert(
            "HV:CH2:VMON".into(),
            SlowValue { severity: Some(3), status: Some("disconnected".into()), ..v(None) },
        );
        s.slow.insert("events".into(), v(Some(1.0)));
        s.slow.insert("detail.x".into(), v(Some(1.0)));
        s.slow.insert("a<b".into(), v(Some(1.0)));
        s.slow.insert("nan".into(), v(Some(f64::NAN)));
        let values: BTreeMap<String, f64> = s.values().into_iter().collect();
        assert_eq!(values["events"], 7.0, "the counter is not shadowed");
        assert!(!values.contains_key("HV:CH2:VMON"), "a disconnected channel has no value: {values:?}");
        assert_eq!(values["HV:CH2:VMON.severity"], 3.0);
        assert!(!values.contains_key("detail.x") && !values.contains_key("a<b") && !values.contains_key("nan"));
        assert_eq!(s.units().keys().collect::<Vec<_>>(), ["HV:CH2:VMON", "nan"]);
        s.slow.remove("nan"); // JSON has no NaN: it goes as null
        let back: Stats = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        for bad in ["", "a b", "x,y", "trigger.lost", "bytes", "q\"", &"x".repeat(201)] {
            assert!(!SlowValue::name_ok(bad), "{bad:?}");
        }
        for good in ["HV:CH1:VMON", "cryo.T1", "BL1:ION[2]", "pv-1_a+b"] {
            assert!(SlowValue::name_ok(good), "{good:?}");
        }
    }
}
