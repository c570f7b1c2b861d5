//! Alarms as the operator shows them (MIDAS's alarms): each `[[alarm]]` of the system file
//! with its state, the events of raising, acknowledging and clearing, and their Prometheus
//! export. The operator (`daqflow-runcontrol`) decides them; the web UI (`daqflow-web`) and
//! the run database (`daqflow-rundb`) only carry these types. `docs/operator-guide.md`,
//! "Alarms", describes the states.
//!
//! ```
//! use daqflow_api::alarms::{AlarmSeverity, AlarmState, AlarmView, AlarmsStatus};
//! let status = AlarmsStatus {
//!     system: "teststand".into(),
//!     alarms: vec![AlarmView {
//!         name: "slow".into(),
//!         severity: AlarmSeverity::Warning,
//!         condition: "evm.events_per_s < 1000 for 10 s while Running".into(),
//!         message: "the trigger rate is low".into(),
//!         state: AlarmState::Raised,
//!         since_ms: Some(1_000),
//!         acknowledged_by: None,
//!         value: Some(12.0),
//!         unit: None,
//!     }],
//!     events: Vec::new(),
//! };
//! assert!(status.to_prometheus().contains("daqflow_alarm_active{system=\"teststand\",name=\"slow\",severity=\"warning\"} 1"));
//! ```

use serde::{Deserialize, Serialize};

/// How serious an alarm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmSeverity {
    /// Something to look at (orange in the web UI, a `warn` log record).
    Warning,
    /// Something wrong (red in the web UI, an `error` log record).
    Error,
}

impl AlarmSeverity {
    /// `warning` or `error`.
    pub fn name(self) -> &'static str {
        match self {
            AlarmSeverity::Warning => "warning",
            AlarmSeverity::Error => "error",
        }
    }

    /// The severity of a name (`warning`, `error`).
    pub fn parse(s: &str) -> Option<AlarmSeverity> {
        match s {
            "warning" => Some(AlarmSeverity::Warning),
            "error" => Some(AlarmSeverity::Error),
            _ => None,
        }
    }
}

/// Where an alarm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmState {
    /// Its condition does not hold, and nothing waits for a person.
    Ok,
    /// Its condition holds; nobody acknowledged it yet.
    Raised,
    /// Its condition holds; a person acknowledged it.
    Acknowledged,
    /// Its condition ended before anybody acknowledged it: it stays shown until a person does
    /// (unless the alarm has `auto_clear = true`).
    Cleared,
}

impl AlarmState {
    /// `ok`, `raised`, `acknowledged`, `cleared`.
    pub fn name(self) -> &'static str {
        match self {
            AlarmState::Ok => "ok",
            AlarmState::Raised => "raised",
            AlarmState::Acknowledged => "acknowledged",
            AlarmState::Cleared => "cleared",
        }
    }

    /// Whether its condition holds (raised or acknowledged).
    pub fn active(self) -> bool {
        matches!(self, AlarmState::Raised | AlarmState::Acknowledged)
    }

    /// Whether it waits for a person to acknowledge it (raised, or cleared unacknowledged).
    pub fn unacknowledged(self) -> bool {
        matches!(self, AlarmState::Raised | AlarmState::Cleared)
    }
}

/// One alarm of the system file, as it is now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlarmView {
    /// Its name (unique in the system).
    pub name: String,
    /// Its severity.
    pub severity: AlarmSeverity,
    /// Its condition, as written.
    pub condition: String,
    /// Its message (the system file's, else the condition).
    pub message: String,
    /// Its state.
    pub state: AlarmState,
    /// Since when it is in its state (Unix ms; none before it was ever raised).
    pub since_ms: Option<u64>,
    /// Who acknowledged it (while acknowledged).
    pub acknowledged_by: Option<String>,
    /// The value its condition compared last (a slow value, free bytes), if it has one.
    pub value: Option<f64>,
    /// What `value` counts, when it is a quantity with a unit: `bytes` (a disk's free space);
    /// none for a slow value (a number in the unit of its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

/// What happened to an alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlarmEventKind {
    /// Its condition started to hold.
    Raised,
    /// A person acknowledged it.
    Acknowledged,
    /// Its condition ended.
    Cleared,
}

impl AlarmEventKind {
    /// `raised`, `acknowledged`, `cleared`.
    pub fn name(self) -> &'static str {
        match self {
            AlarmEventKind::Raised => "raised",
            AlarmEventKind::Acknowledged => "acknowledged",
            AlarmEventKind::Cleared => "cleared",
        }
    }

    /// The kind of a name.
    pub fn parse(s: &str) -> Option<AlarmEventKind> {
        match s {
            "raised" => Some(AlarmEventKind::Raised),
            "acknowledged" => Some(AlarmEventKind::Acknowledged),
            "cleared" => Some(AlarmEventKind::Cleared),
            _ => None,
        }
    }
}

/// One event of an alarm (a row of the run database's `alarm_events`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlarmEvent {
    /// When (Unix ms).
    pub t_ms: u64,
    /// The system.
    pub system: String,
    /// The alarm.
    pub name: String,
    /// What happened.
    pub kind: AlarmEventKind,
    /// The alarm's severity.
    pub severity: AlarmSeverity,
    /// The alarm's message, with the value that raised it.
    pub message: String,
    /// Who acknowledged it (acknowledgements only).
    pub who: Option<String>,
}

/// Every alarm of a system and its recent events (`GET /api/alarms`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlarmsStatus {
    /// The system.
    pub system: String,
    /// Every alarm of the system file, in its order.
    pub alarms: Vec<AlarmView>,
    /// The recent events, newest first.
    pub events: Vec<AlarmEvent>,
}

impl AlarmsStatus {
    /// The alarms in Prometheus' text exposition format (`docs/web.md`, "Metrics"):
    /// `daqflow_alarm_active` and `daqflow_alarm_unacknowledged`, one sample per alarm (0 or 1),
    /// and `daqflow_alarms_active`, how many are active. Empty for a system without alarms.
    pub fn to_prometheus(&self) -> String {
        use daqflow_metrics::{Exposition, MetricType};
        let mut e = Exposition::new();
        if self.alarms.is_empty() {
            return e.into_string();
        }
        let mut metric = |name: &'static str, help: &str, f: &dyn Fn(&AlarmView) -> bool| {
            let mut family = e.family(name, help, MetricType::Gauge);
            for a in &self.alarms {
                family.sample(
                    &[("system", self.system.as_str()), ("name", &a.name), ("severity", a.severity.name())],
                    f(a),
                );
            }
        };
        metric("daqflow_alarm_active", "1 while the alarm's condition holds (raised or acknowledged).", &|a| {
            a.state.active()
        });
        metric(
            "daqflow_alarm_unacknowledged",
            "1 while the alarm waits for a person (raised, or cleared before anybody acknowledged it).",
            &|a| a.state.unacknowledged(),
        );
        let active = self.alarms.iter().filter(|a| a.state.active()).count();
        e.family("daqflow_alarms_active", "Alarms whose condition holds.", MetricType::Gauge)
            .sample(&[("system", self.system.as_str())], active);
        e.into_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_export_escapes_labels() {
        for k in [AlarmEventKind::Raised, AlarmEventKind::Acknowledged, AlarmEventKind::Cleared] {
            assert_eq!(AlarmEventKind::parse(k.name()), Some(k));
        }
        for s in [AlarmSeverity::Warning, AlarmSeverity::Error] {
            assert_eq!(AlarmSeverity::parse(s.name()), Some(s));
        }
        assert!(AlarmsStatus::default().to_prometheus().is_empty());
        let view = |name: &str, state| AlarmView {
            name: name.into(),
            severity: AlarmSeverity::Error,
            condition: "any in Error".into(),
            message: String::new(),
            state,
            since_ms: None,
            acknowledged_by: None,
            value: None,
            unit: None,
        };
        let s = AlarmsStatus {
            system: "a\"b".into(),
            alarms: vec![view("x", AlarmState::Cleared), view("y", AlarmState::Acknowledged)],
            events: Vec::new(),
        };
        let text = s.to_prometheus();
        assert!(text.contains("daqflow_alarm_active{system=\"a\\\"b\",name=\"x\",severity=\"error\"} 0"), "{text}");
        assert!(text.contains("daqflow_alarm_unacknowledged{system=\"a\\\"b\",name=\"x\",severity=\"error\"} 1"));
        assert!(text.contains("daqflow_alarm_active{system=\"a\\\"b\",name=\"y\",severity=\"error\"} 1"));
        assert!(text.contains("daqflow_alarms_active{system=\"a\\\"b\"} 1"));
    }
}
