//! The alarms of a system (MIDAS's alarms), as a pure state machine: fed what the operator sees
//! once a second (the system's state, every component's state and slow values, the free space
//! of the directories the conditions name) and the time, it raises and clears alarms and takes
//! acknowledgements, and says every event; the operator logs, stores and shows them. Tested on
//! virtual time, like the [`sequencer`](super::sequencer).
//!
//! An alarm is Ok, Raised (its condition held for its `for` time), Acknowledged (a person saw
//! it, while its condition still holds) or Cleared (its condition ended before anybody
//! acknowledged it: it stays shown until a person does, unless `auto_clear`). A condition whose
//! value is missing (a component that published no such key, a directory that cannot be
//! read) does not hold; nor does one whose `while` states do not include the system's state.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use daqflow_api::alarms::{AlarmEvent, AlarmEventKind, AlarmSeverity, AlarmState, AlarmView, AlarmsStatus};
use daqflow_api::{ComponentState, SystemState};

use super::sequencer::{Now, Snapshot};
use crate::alarm::{AlarmSpec, Disk, Test};

/// How many events the alarms keep to show (the run database keeps them all).
pub const RECENT_EVENTS: usize = 100;

/// Why an acknowledgement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// The system file has no such alarm.
    #[error("there is no alarm `{name}` (the system has: {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// The system's alarms.
        known: String,
    },
    /// The alarm is Ok: nothing to acknowledge.
    #[error("alarm `{0}` is not raised: there is nothing to acknowledge")]
    NotRaised(String),
}

/// One component as the alarms see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentObservation {
    /// Its name.
    pub name: String,
    /// Its state as shown.
    pub state: ComponentState,
    /// Its slow values (`Stats::values`).
    pub values: Vec<(String, f64)>,
    /// The units its slow values' sources give (`Stats::units`: an EPICS channel's `V`).
    pub units: BTreeMap<String, String>,
}

/// What the alarms are fed once a second.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The system's state.
    pub state: SystemState,
    /// Every component.
    pub components: Vec<ComponentObservation>,
    /// Free bytes of each directory of [`Alarms::directories`] that could be read.
    pub free_bytes: BTreeMap<PathBuf, f64>,
}

impl Observation {
    /// From the sequencer's snapshot and the directories' free space.
    pub fn from_snapshot(snapshot: &Snapshot, free_bytes: BTreeMap<PathBuf, f64>) -> Observation {
        Observation {
            state: snapshot.state,
            components: snapshot
                .views
                .iter()
                .map(|(name, v)| ComponentObservation {
                    name: name.clone(),
                    state: v.shown(),
                    values: v.stats.values(),
                    units: v.stats.units(),
                })
                .collect(),
            free_bytes,
        }
    }
}

/// The bytes free for an unprivileged user on the file system of `dir` (statvfs, through the
/// one reading of it, `daqflow_wire::file::DiskSpace`), if it can be read.
pub fn free_bytes(dir: &Path) -> Option<f64> {
    daqflow_wire::file::DiskSpace::of(dir).ok().map(|s| s.free_bytes as f64)
}

/// A size for people: `82.7 GB`, `512 B` (decimal units, as the conditions take them).
pub fn size(bytes: f64) -> String {
    for (unit, scale) in [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)] {
        if bytes.abs() >= scale {
            return format!("{:.1} {unit}", bytes / scale);
        }
    }
    format!("{} B", bytes.round())
}

/// A value for people: whole numbers whole (`23353`), others to 4 significant digits
/// (`499.1`, `0.01235`), without trailing zeros; very small ones in exponent notation.
pub fn readable(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() || a >= 1e15 {
        return v.to_string();
    }
    if a >= 1000.0 || v == v.trunc() {
        return format!("{v:.0}");
    }
    if a < 1e-4 {
        return format!("{v:.3e}");
    }
    let decimals = (3 - a.log10().floor() as i32).clamp(0, 8) as usize;
    let text = format!("{v:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    text.to_owned()
}

#[derive(Debug, Clone)]
struct Entry {
    spec: AlarmSpec,
    state: AlarmState,
    /// Since when its test holds (monotonic), for `for`.
    holds_since: Option<Instant>,
    since_ms: Option<u64>,
    acknowledged_by: Option<String>,
    value: Option<f64>,
    /// What made it hold last (`evm.events_per_s = 12`).
    detail: String,
}

/// Every alarm of a system.
#[derive(Debug, Clone)]
pub struct Alarms {
    system: String,
    data: PathBuf,
    entries: Vec<Entry>,
    events: VecDeque<AlarmEvent>,
}

impl Alarms {
    /// The alarms of `specs` for system `system` whose data directory is `data`, every one Ok.
    pub fn new(system: &str, data: &Path, specs: &[AlarmSpec]) -> Alarms {
        Alarms {
            system: system.to_owned(),
            data: data.to_owned(),
            entries: specs
                .iter()
                .map(|spec| Entry {
                    spec: spec.clone(),
                    state: AlarmState::Ok,
                    holds_since: None,
                    since_ms: None,
                    acknowledged_by: None,
                    value: None,
                    detail: String::new(),
                })
                .collect(),
            events: VecDeque::new(),
        }
    }

    /// Whether the system has any alarm.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The directories whose free space the conditions test.
    pub fn directories(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .entries
            .iter()
            .filter_map(|e| match &e.spec.condition.test {
                Test::Disk { dir, .. } => Some(self.directory(dir)),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    fn directory(&self, dir: &Disk) -> PathBuf {
        match dir {
            Disk::Data => self.data.clone(),
            Disk::Dir(d) => d.clone(),
        }
    }

    /// Earlier events (from the run database, newest first) to show with the new ones.
    pub fn remember(&mut self, events: Vec<AlarmEvent>) {
        self.events.extend(events);
        self.events.truncate(RECENT_EVENTS);
    }

    /// Whether an alarm's test holds now, with the value it compared and a description.
    fn test(&self, test: &Test, seen: &Observation) -> (bool, Option<f64>, String) {
        match test {
            Test::Value { component, key, op, limit } => {
                let seen = seen.components.iter().find(|c| &c.name == component);
                let value = seen.and_then(|c| c.values.iter().find(|(k, _)| k == key).map(|(_, v)| *v));
                let unit = seen.and_then(|c| c.units.get(key)).map(|u| format!(" {u}")).unwrap_or_default();
                match value {
                    Some(v) => (op.holds(v, *limit), Some(v), format!("{component}.{key} = {}{unit}", readable(v))),
                    None => (false, None, format!("{component}.{key} is not published")),
                }
            }
            Test::State { component, states } => {
                let hit = seen
                    .components
                    .iter()
                    .filter(|c| component.as_ref().is_none_or(|n| &c.name == n))
                    .find(|c| states.contains(&c.state));
                match hit {
                    Some(c) => (true, None, format!("{} is {}", c.name, c.state)),
                    None => (false, None, String::new()),
                }
            }
            Test::Disk { dir, op, limit } => {
                let path = self.directory(dir);
                match seen.free_bytes.get(&path) {
                    Some(&free) => {
                        (op.holds(free, *limit), Some(free), format!("{} has {} free", path.display(), size(free)))
                    }
                    None => (false, None, format!("{} cannot be read", path.display())),
                }
            }
        }
    }

    fn event(&mut self, i: usize, kind: AlarmEventKind, now: Now, who: Option<String>) -> AlarmEvent {
        let e = &self.entries[i];
        let message = match kind {
            AlarmEventKind::Raised if !e.detail.is_empty() => format!("{} ({})", e.spec.message, e.detail),
            _ => e.spec.message.clone(),
        };
        let event = AlarmEvent {
            t_ms: now.wall_ms,
            system: self.system.clone(),
            name: e.spec.name.clone(),
            kind,
            severity: e.spec.severity,
            message,
            who,
        };
        self.events.push_front(event.clone());
        self.events.truncate(RECENT_EVENTS);
        event
    }

    /// Evaluates every alarm on what is seen at `now`; returns the events (raised, cleared).
    pub fn evaluate(&mut self, seen: &Observation, now: Now) -> Vec<AlarmEvent> {
        let mut out = Vec::new();
        for i in 0..self.entries.len() {
            let condition = &self.entries[i].spec.condition;
            let gated = !condition.states.is_empty() && !condition.states.contains(&seen.state);
            let (holds, value, detail) = self.test(&condition.test, seen);
            let holds = holds && !gated;
            let hold = condition.hold;
            let e = &mut self.entries[i];
            e.value = value;
            if holds {
                e.detail = detail;
            }
            let since = if holds { *e.holds_since.get_or_insert(now.mono) } else { now.mono };
            if !holds {
                e.holds_since = None;
            }
            let active = holds && now.mono.saturating_duration_since(since) >= hold;
            let next = match (e.state, active) {
                (AlarmState::Ok | AlarmState::Cleared, true) => Some((AlarmState::Raised, AlarmEventKind::Raised)),
                (AlarmState::Raised, false) if e.spec.auto_clear => Some((AlarmState::Ok, AlarmEventKind::Cleared)),
                (AlarmState::Raised, false) => Some((AlarmState::Cleared, AlarmEventKind::Cleared)),
                (AlarmState::Acknowledged, false) => Some((AlarmState::Ok, AlarmEventKind::Cleared)),
                _ => None,
            };
            if let Some((state, kind)) = next {
                e.state = state;
                e.since_ms = Some(now.wall_ms);
                if kind == AlarmEventKind::Raised {
                    e.acknowledged_by = None;
                }
                out.push(self.event(i, kind, now, None));
            }
        }
        out
    }

    /// A person (`who`) acknowledges alarm `name`: Raised becomes Acknowledged, Cleared becomes
    /// Ok. Returns the event, or none for an alarm acknowledged already.
    pub fn acknowledge(&mut self, name: &str, who: &str, now: Now) -> Result<Option<AlarmEvent>, AckError> {
        let Some(i) = self.entries.iter().position(|e| e.spec.name == name) else {
            return Err(AckError::Unknown {
                name: name.to_owned(),
                known: self.entries.iter().map(|e| e.spec.name.as_str()).collect::<Vec<_>>().join(", "),
            });
        };
        let e = &mut self.entries[i];
        let next = match e.state {
            AlarmState::Ok => return Err(AckError::NotRaised(name.to_owned())),
            AlarmState::Acknowledged => return Ok(None),
            AlarmState::Raised => AlarmState::Acknowledged,
            AlarmState::Cleared => AlarmState::Ok,
        };
        e.state = next;
        e.since_ms = Some(now.wall_ms);
        e.acknowledged_by = (next == AlarmState::Acknowledged).then(|| who.to_owned());
        Ok(Some(self.event(i, AlarmEventKind::Acknowledged, now, Some(who.to_owned()))))
    }

    /// Every alarm and the recent events.
    pub fn status(&self) -> AlarmsStatus {
        AlarmsStatus {
            system: self.system.clone(),
            alarms: self
                .entries
                .iter()
                .map(|e| AlarmView {
                    name: e.spec.name.clone(),
                    severity: e.spec.severity,
                    condition: e.spec.condition.text.clone(),
                    message: e.spec.message.clone(),
                    state: e.state,
                    since_ms: e.since_ms,
                    acknowledged_by: e.acknowledged_by.clone(),
                    value: e.value,
                    unit: matches!(e.spec.condition.test, Test::Disk { .. }).then(|| "bytes".to_owned()),
                })
                .collect(),
            events: self.events.iter().cloned().collect(),
        }
    }
}

/// The log line of an event (what the message browser shows), at `warn` or `error` for a
/// raised alarm by its severity, at `info` for the rest.
pub fn log_event(e: &AlarmEvent) {
    match (e.kind, e.severity) {
        (AlarmEventKind::Raised, AlarmSeverity::Error) => tracing::error!("alarm `{}` raised: {}", e.name, e.message),
        (AlarmEventKind::Raised, AlarmSeverity::Warning) => tracing::warn!("alarm `{}` raised: {}", e.name, e.message),
        (AlarmEventKind::Acknowledged, _) => {
            tracing::info!("alarm `{}` acknowledged by {}", e.name, e.who.as_deref().unwrap_or("?"))
        }
        (AlarmEventKind::Cleared, _) => tracing::info!("alarm `{}` cleared: {}", e.name, e.message),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::alarm::Condition;

    fn spec(name: &str, when: &str, auto_clear: bool) -> AlarmSpec {
        AlarmSpec {
            name: name.into(),
            severity: AlarmSeverity::Warning,
            condition: Condition::parse(when, &["evm", "ru-0"]).unwrap(),
            message: format!("{name} message"),
            auto_clear,
            line: 1,
        }
    }

    fn seen(state: SystemState, rate: Option<f64>, ru: ComponentState, free: Option<f64>) -> Observation {
        Observation {
            state,
            components: vec![
                ComponentObservation {
                    name: "evm".into(),
                    state: ComponentState::Running,
                    values: rate.map(|r| ("events_per_s".to_owned(), r)).into_iter().collect(),
                    units: BTreeMap::new(),
                },
                ComponentObservation { name: "ru-0".into(), state: ru, values: Vec::new(), units: BTreeMap::new() },
            ],
            free_bytes: free.map(|f| (PathBuf::from("/data"), f)).into_iter().collect(),
        }
    }

    fn kinds(events: &[AlarmEvent]) -> Vec<(&str, AlarmEventKind)> {
        events.iter().map(|e| (e.name.as_str(), e.kind)).collect()
    }

    fn state(a: &Alarms, name: &str) -> AlarmState {
        a.status().alarms.iter().find(|x| x.name == name).unwrap().state
    }

    #[test]
    fn a_slow_value_from_elsewhere_raises_with_its_unit_and_a_vanished_one_clears() {
        // An EPICS channel's value (`Stats::slow`), with its engineering unit.
        let mut a = Alarms::new("s", Path::new("/data"), &[spec("hv", "ru-0.HV:CH1:VMON > 1510 for 5 s", false)]);
        let t0 = Now::start();
        let at = |s: u64| t0.after(Duration::from_secs(s));
        let mut high = seen(SystemState::Running, Some(10.0), ComponentState::Running, None);
        high.components[1].values.push(("HV:CH1:VMON".into(), 1512.5));
        high.components[1].units.insert("HV:CH1:VMON".into(), "V".into());
        assert!(a.evaluate(&high, at(0)).is_empty());
        let raised = a.evaluate(&high, at(5));
        assert_eq!(kinds(&raised), vec![("hv", AlarmEventKind::Raised)]);
        assert_eq!(raised[0].message, "hv message (ru-0.HV:CH1:VMON = 1512 V)");
        // The channel disconnects: its value is gone, the test is false.
        let gone = seen(SystemState::Running, Some(10.0), ComponentState::Running, None);
        assert_eq!(kinds(&a.evaluate(&gone, at(6))), vec![("hv", AlarmEventKind::Cleared)]);
    }

    #[test]
    fn a_rate_alarm_is_raised_after_its_time_only_while_running_and_clears() {
        let mut a = Alarms::new(
            "s",
            Path::new("/data"),
            &[spec("slow", "evm.events_per_s < 1000 for 10 s while Running", false)],
        );
        let t0 = Now::start();
        let at = |s: u64| t0.after(Duration::from_secs(s));
        let low = seen(SystemState::Running, Some(10.0), ComponentState::Running, None);
        // Low, but not in Running: the condition is gated.
        assert!(a.evaluate(&seen(SystemState::Configured, Some(0.0), ComponentState::Running, None), at(0)).is_empty());
        assert!(a.evaluate(&low, at(1)).is_empty());
        assert!(a.evaluate(&low, at(10)).is_empty(), "held 9 s of 10");
        // A high second restarts the time.
        assert!(
            a.evaluate(&seen(SystemState::Running, Some(5000.0), ComponentState::Running, None), at(11)).is_empty()
        );
        assert!(a.evaluate(&low, at(12)).is_empty());
        assert!(a.evaluate(&low, at(21)).is_empty());
        let raised = a.evaluate(&low, at(22));
        assert_eq!(kinds(&raised), vec![("slow", AlarmEventKind::Raised)]);
        assert_eq!(raised[0].message, "slow message (evm.events_per_s = 10)");
        assert_eq!(raised[0].t_ms, at(22).wall_ms);
        assert_eq!(state(&a, "slow"), AlarmState::Raised);
        assert_eq!(a.status().alarms[0].value, Some(10.0));
        assert!(a.evaluate(&low, at(23)).is_empty(), "raised once");
        // Pausing the run ends it (the `while` gate), unacknowledged: Cleared until a person acknowledges.
        let cleared = a.evaluate(&seen(SystemState::Paused, Some(0.0), ComponentState::Running, None), at(24));
        assert_eq!(kinds(&cleared), vec![("slow", AlarmEventKind::Cleared)]);
        assert_eq!(state(&a, "slow"), AlarmState::Cleared);
        let ack = a.acknowledge("slow", "alice", at(25)).unwrap().unwrap();
        assert_eq!((ack.kind, ack.who.as_deref()), (AlarmEventKind::Acknowledged, Some("alice")));
        assert_eq!(state(&a, "slow"), AlarmState::Ok);
        assert_eq!(a.acknowledge("slow", "alice", at(26)), Err(AckError::NotRaised("slow".into())));
        // A missing value does not hold.
        assert!(a.evaluate(&seen(SystemState::Running, None, ComponentState::Running, None), at(40)).is_empty());
        assert!(a.evaluate(&seen(SystemState::Running, None, ComponentState::Running, None), at(60)).is_empty());
        assert_eq!(a.status().events.len(), 3, "raised, cleared, acknowledged; newest first");
        assert_eq!(a.status().events[0].kind, AlarmEventKind::Acknowledged);
    }

    #[test]
    fn an_acknowledged_alarm_clears_to_ok_and_is_raised_again_later() {
        let mut a = Alarms::new("s", Path::new("/data"), &[spec("ru", "ru-0 in Error, Dead", false)]);
        let t0 = Now::start();
        let at = |s: u64| t0.after(Duration::from_secs(s));
        let dead = seen(SystemState::Error, None, ComponentState::Dead, None);
        let fine = seen(SystemState::Running, None, ComponentState::Running, None);
        assert!(a.evaluate(&fine, at(0)).is_empty());
        assert_eq!(kinds(&a.evaluate(&dead, at(1))), vec![("ru", AlarmEventKind::Raised)]);
        assert_eq!(a.status().events[0].message, "ru message (ru-0 is Dead)");
        assert!(a.acknowledge("ru", "bob", at(2)).unwrap().is_some());
        assert_eq!(a.status().alarms[0].acknowledged_by.as_deref(), Some("bob"));
        assert_eq!(a.acknowledge("ru", "carol", at(3)), Ok(None), "acknowledged once");
        assert_eq!(state(&a, "ru"), AlarmState::Acknowledged);
        assert_eq!(kinds(&a.evaluate(&fine, at(4))), vec![("ru", AlarmEventKind::Cleared)]);
        assert_eq!(state(&a, "ru"), AlarmState::Ok);
        assert_eq!(kinds(&a.evaluate(&dead, at(5))), vec![("ru", AlarmEventKind::Raised)]);
        assert_eq!(a.status().alarms[0].acknowledged_by, None);
        let e = a.acknowledge("nothing", "bob", at(6)).unwrap_err().to_string();
        assert_eq!(e, "there is no alarm `nothing` (the system has: ru)");
    }

    #[test]
    fn auto_clear_goes_back_to_ok_and_any_and_disk_tests_hold() {
        let mut a = Alarms::new(
            "s",
            Path::new("/data"),
            &[spec("any", "any in Error", true), spec("disk", "disk data free < 5 GB for 2 s", false)],
        );
        assert_eq!(a.directories(), vec![PathBuf::from("/data")]);
        let t0 = Now::start();
        let at = |s: u64| t0.after(Duration::from_secs(s));
        let bad = seen(SystemState::Error, None, ComponentState::Error, Some(1e9));
        assert_eq!(kinds(&a.evaluate(&bad, at(0))), vec![("any", AlarmEventKind::Raised)]);
        assert!(a.evaluate(&bad, at(1)).is_empty());
        let raised = a.evaluate(&bad, at(2));
        assert_eq!(kinds(&raised), vec![("disk", AlarmEventKind::Raised)]);
        assert_eq!(raised[0].message, "disk message (/data has 1.0 GB free)");
        let disk = a.status().alarms.into_iter().find(|x| x.name == "disk").unwrap();
        assert_eq!((disk.value, disk.unit.as_deref()), (Some(1e9), Some("bytes")), "free bytes, said so");
        let any = a.status().alarms.into_iter().find(|x| x.name == "any").unwrap();
        assert_eq!((any.value, any.unit), (None, None));
        let fine = seen(SystemState::Running, None, ComponentState::Running, Some(6e9));
        assert_eq!(
            kinds(&a.evaluate(&fine, at(3))),
            vec![("any", AlarmEventKind::Cleared), ("disk", AlarmEventKind::Cleared)]
        );
        assert_eq!((state(&a, "any"), state(&a, "disk")), (AlarmState::Ok, AlarmState::Cleared));
        // A directory that cannot be read does not hold.
        assert!(a.evaluate(&seen(SystemState::Running, None, ComponentState::Running, None), at(10)).is_empty());
        assert!(a.evaluate(&seen(SystemState::Running, None, ComponentState::Running, None), at(20)).is_empty());
        // Cleared, raised again: Raised.
        a.evaluate(&bad, at(30));
        assert!(kinds(&a.evaluate(&bad, at(32))).contains(&("disk", AlarmEventKind::Raised)));
        assert_eq!(state(&a, "disk"), AlarmState::Raised);
    }

    #[test]
    fn values_are_told_with_sensible_digits_and_sizes_with_units() {
        for (v, text) in [
            (499.08728815659686, "499.1"),
            (10.0, "10"),
            (23353.0, "23353"),
            (1234.56, "1235"),
            (0.5, "0.5"),
            (0.0123456, "0.01235"),
            (-2.25, "-2.25"),
            (0.0, "0"),
            (3e-7, "3.000e-7"),
        ] {
            assert_eq!(readable(v), text, "{v}");
        }
        assert_eq!(size(82_702_245_888.0), "82.7 GB");
        assert_eq!(size(512.0), "512 B");
        // In a raised alarm's message too.
        let mut a = Alarms::new("s", Path::new("/data"), &[spec("slow", "evm.events_per_s < 1000", false)]);
        let raised = a.evaluate(
            &seen(SystemState::Running, Some(499.08728815659686), ComponentState::Running, None),
            Now::start(),
        );
        assert_eq!(raised[0].message, "slow message (evm.events_per_s = 499.1)");
        assert_eq!(a.status().alarms[0].unit, None, "a slow value is in the unit of its key");
    }

    #[test]
    fn free_bytes_reads_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some_and(|b| b > 0.0));
        assert_eq!(free_bytes(&dir.path().join("nothing")), None);
        assert_eq!(free_bytes(Path::new("a\0b")), None);
    }
}
