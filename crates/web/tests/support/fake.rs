//! A fake operator: an in-memory system (two components) following the run-control state
//! machine, with a process directory, services, logs, runs, histograms and an ET snapshot.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daqflow_api::{
    ComponentState, ComponentView, FileRecord, LogQuery, LogRecord, ParameterChange, Policy, ProcessEntry, RatePoint,
    RunAccounting, RunDetail, RunProvenance, RunRecord, RunState, RunSummary, Severity, SystemState, SystemStatus,
    Transition, TransitionResult,
};
use daqflow_api::{Role, Stats};
use daqflow_web::{Backend, BackendError};
use serde_json::{Value, json};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct State {
    state: SystemState,
    run: Option<u32>,
    run_started_ms: Option<u64>,
    events: f64,
    last: Instant,
    rates: Vec<RatePoint>,
    /// The run database, newest first.
    runs: Vec<RunDetail>,
    last_summary: Option<Box<RunSummary>>,
    /// Parameters changed during the open run.
    changes: Vec<ParameterChange>,
}

/// The fake. `transition_delay` makes every transition take that long (as a real `start` does).
pub struct FakeBackend {
    state: Mutex<State>,
    transition_delay: Duration,
    /// Open `listen` subscriptions.
    pub listeners: Arc<AtomicUsize>,
    /// Commands sent: (name, data).
    pub commands: Mutex<Vec<(String, String)>>,
    /// Parameters set: `COMPONENT.KEY` → value.
    pub sets: Mutex<std::collections::BTreeMap<String, Value>>,
    /// The components the open run goes on without (set by a test): name → why.
    pub degraded: Mutex<std::collections::BTreeMap<String, String>>,
    /// The last log query asked for.
    pub last_query: Mutex<Option<LogQuery>>,
    /// The alarms it shows (none unless a test puts some in); acknowledging one makes it
    /// `acknowledged` and adds the event.
    pub alarms: Mutex<daqflow_api::alarms::AlarmsStatus>,
    /// `bu-1` reports disk throttling (`detail.throttled`) while this is set.
    pub disk_throttled: AtomicBool,
    /// The slow values `source-1` reports (`stats.slow`; none unless a test puts some in).
    pub slow: Mutex<std::collections::BTreeMap<String, daqflow_api::SlowValue>>,
}

const EVENTS_PER_S: f64 = 1000.0;

/// The control plane's rule for service and command names (as `daqflow_dialog` has it).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/' | b'@' | b'+'))
}
const EVENT_BYTES: f64 = 4096.0;

/// The system file the fake runs with.
const CONFIG: &str = "[system]\nname = \"fake\"\n\n[[component]]\nname = \"source-1\"\nkind = \"source\"\n\n\
                      [[component]]\nname = \"bu-1\"\nkind = \"bu\"\n";

/// The summary of a run that stopped well: `events` built and recorded in one file.
fn summary(run: u32, started_ms: u64, stopped_ms: u64, events: u64) -> RunSummary {
    let bytes = events * EVENT_BYTES as u64;
    RunSummary {
        run,
        system: "fake".into(),
        state: RunState::Stopped,
        error: None,
        started_ms,
        stopped_ms,
        seconds: stopped_ms.saturating_sub(started_ms) as f64 / 1000.0,
        accounting: RunAccounting {
            triggered: Some(events),
            rejected: Some(0),
            events,
            recorded: events,
            bytes,
            accounting_complete: true,
            ..RunAccounting::default()
        },
        files: vec![FileRecord {
            component: "bu-1".into(),
            path: format!("/data/run{run:06}_0001.dat").into(),
            events,
            bytes,
            first_event: (events > 0).then_some(1),
            last_event: (events > 0).then_some(events),
            complete: true,
        }],
        file_problems: Vec::new(),
        components: Default::default(),
        errors: Vec::new(),
        overrides: Default::default(),
        degraded: Default::default(),
        changes: Default::default(),
        histograms: Vec::new(),
    }
}

/// `summary` with the histograms its run ended with, a reference for the live ones: the event
/// size (the live binning, 438 entries all in bin 16), a fragment size of another binning, the
/// user monitors' counter at 1,000.
fn with_histograms(mut summary: RunSummary) -> RunSummary {
    let mut sizes = vec![0u64; 64];
    sizes[16] = 438;
    summary.histograms = vec![
        serde_json::json!({"component": "monitor-1", "name": "event_size", "title": "Event size", "x_label": "bytes",
             "low": 0.0, "high": 16384.0, "bins": sizes, "underflow": 0, "overflow": 0, "entries": 438,
             "sum": 438.0 * 4200.0, "min": 4100.0, "max": 4300.0, "mean": 4200.0, "unit": "bytes"}),
        serde_json::json!({"component": "monitor-1", "name": "fragment_size_src0", "title": "Fragment size, source 0",
             "x_label": "bytes", "low": 0.0, "high": 2048.0, "bins": [0, 10], "underflow": 0, "overflow": 0,
             "entries": 10, "sum": 5120.0, "min": 512.0, "max": 512.0, "mean": 512.0, "unit": "bytes"}),
        serde_json::json!({"component": "adc-mons", "members": ["adc-1", "adc-2"], "kind": "counter", "name": "hits",
             "title": "Hits above threshold", "unit": "hits", "value": 1000}),
    ];
    summary
}

/// The run database's record of a run that stopped with `summary`.
fn detail(summary: RunSummary) -> RunDetail {
    RunDetail {
        record: RunRecord {
            run: summary.run,
            system: summary.system.clone(),
            started_ms: summary.started_ms,
            stopped_ms: Some(summary.stopped_ms),
            state: summary.state,
            events: Some(summary.events),
            recorded: Some(summary.recorded),
            lost: Some(summary.lost),
            bytes: Some(summary.bytes),
            error: None,
        },
        config: CONFIG.into(),
        summary: Some(summary),
        provenance: None,
        changes: Vec::new(),
    }
}

impl FakeBackend {
    pub fn new(transition_delay: Duration) -> Arc<FakeBackend> {
        Arc::new(FakeBackend {
            state: Mutex::new(State {
                state: SystemState::Initial,
                run: None,
                run_started_ms: None,
                events: 0.0,
                last: Instant::now(),
                rates: Vec::new(),
                runs: vec![detail(with_histograms(summary(1, 1_700_000_000_000, 1_700_000_060_000, 60_000)))],
                last_summary: None,
                changes: Vec::new(),
            }),
            transition_delay,
            listeners: Arc::new(AtomicUsize::new(0)),
            commands: Mutex::new(Vec::new()),
            sets: Mutex::default(),
            degraded: Mutex::default(),
            last_query: Mutex::new(None),
            alarms: Mutex::default(),
            disk_throttled: AtomicBool::new(false),
            slow: Mutex::default(),
        })
    }

    /// Adds run `run` to the run history (newest first), recorded from `config` with
    /// `provenance` and the `changes` made during it.
    #[allow(dead_code)]
    pub fn add_run(&self, run: u32, config: &str, provenance: RunProvenance, changes: Vec<ParameterChange>) {
        let started = 1_700_000_100_000 + u64::from(run) * 100_000;
        let mut d = detail(summary(run, started, started + 30_000, 1_000));
        d.config = config.into();
        d.provenance = Some(provenance);
        if let Some(summary) = d.summary.as_mut() {
            summary.changes = changes.clone();
        }
        d.changes = changes;
        self.state.lock().unwrap().runs.insert(0, d);
    }

    pub fn state(&self) -> SystemState {
        self.state.lock().unwrap().state
    }

    fn advance(s: &mut State) {
        let now = Instant::now();
        let dt = now.duration_since(s.last).as_secs_f64();
        s.last = now;
        let running = s.state == SystemState::Running;
        if running {
            s.events += dt * EVENTS_PER_S;
        }
        let (events_per_s, mb_per_s) =
            if running { (EVENTS_PER_S, EVENTS_PER_S * EVENT_BYTES / 1e6) } else { (0.0, 0.0) };
        s.rates.push(RatePoint { t_ms: now_ms(), events_per_s, mb_per_s });
        if s.rates.len() > 300 {
            s.rates.remove(0);
        }
    }
}

impl Backend for FakeBackend {
    fn status(&self) -> SystemStatus {
        let mut s = self.state.lock().unwrap();
        FakeBackend::advance(&mut s);
        let running = s.state == SystemState::Running;
        let (events_per_s, mb_per_s) =
            if running { (EVENTS_PER_S, EVENTS_PER_S * EVENT_BYTES / 1e6) } else { (0.0, 0.0) };
        let events = s.events as u64;
        let component_state = match s.state {
            SystemState::Configured => ComponentState::Configured,
            SystemState::Running => ComponentState::Running,
            SystemState::Paused => ComponentState::Paused,
            SystemState::Error => ComponentState::Error,
            _ => ComponentState::Initial,
        };
        let throttled = self.disk_throttled.load(Ordering::SeqCst);
        let detail = |name: &str| match name {
            "bu-1" if throttled => json!({
                "queued": 0, "throttled": true, "throttle_count": 1, "throttled_s": 2.5,
                "disk_free_bytes": 3_145_728u64, "disk_used_pct": 96.5,
            }),
            _ => json!({"queued": 0}),
        };
        let component = |name: &str, kind: &str, role: Role, pid: u32| ComponentView {
            name: name.into(),
            kind: kind.into(),
            role,
            host: "localhost".into(),
            pid: Some(pid),
            cpus: Some("0-1".into()),
            alive: true,
            state: component_state,
            run: s.run,
            since_ms: now_ms(),
            error: None,
            restarts: 0,
            policy: Policy::Stop,
            stats: Stats {
                slow: if name == "source-1" { self.slow.lock().unwrap().clone() } else { Default::default() },
                ..Stats::counted(events, events * EVENT_BYTES as u64)
                    .with_rates(events_per_s, mb_per_s)
                    .with_detail(&detail(name))
            },
        };
        SystemStatus {
            system: "fake".into(),
            state: s.state,
            run: s.run,
            running: s.run_started_ms.is_some(),
            run_started_ms: s.run_started_ms,
            duration_s: s.run_started_ms.map(|t| now_ms().saturating_sub(t) as f64 / 1000.0),
            events,
            bytes: events * EVENT_BYTES as u64,
            // While running, a few events are on their way to the recorder.
            recorded: if running { events - events / 50 } else { events },
            events_per_s,
            mb_per_s,
            // While a run is open, what the trigger gave up on so far; then the run's.
            lost: if s.run_started_ms.is_some() { Some(0) } else { s.last_summary.as_ref().map(|r| r.lost) },
            last_error: None,
            last_summary: s.last_summary.clone(),
            control: "127.0.0.1:7000".into(),
            data: "/data".into(),
            components: vec![
                component("source-1", "source", Role::Readout, 101),
                component("bu-1", "bu", Role::Builder, 102),
            ],
            rates: s.rates.clone(),
            overrides: self.sets.lock().unwrap().clone(),
            degraded: self.degraded.lock().unwrap().clone(),
        }
    }

    fn transition(&self, t: Transition) -> Result<TransitionResult, BackendError> {
        std::thread::sleep(self.transition_delay);
        let mut s = self.state.lock().unwrap();
        FakeBackend::advance(&mut s);
        if !t.allowed_in(s.state) {
            return Err(BackendError::Conflict(format!("cannot {} the system in state {}", t.name(), s.state)));
        }
        let (next, result) = match t {
            Transition::Configure => (SystemState::Configured, TransitionResult::Configured(Default::default())),
            Transition::Start { run } => {
                let last = s.runs.first().map_or(0, |r| r.record.run);
                let run = run.unwrap_or(last + 1);
                if s.runs.iter().any(|r| r.record.run == run) {
                    return Err(BackendError::Invalid(format!("run {run} was taken already")));
                }
                s.run = Some(run);
                s.run_started_ms = Some(now_ms());
                s.events = 0.0;
                (SystemState::Running, TransitionResult::Started(run))
            }
            Transition::Pause => (SystemState::Paused, TransitionResult::Done),
            Transition::Resume => (SystemState::Running, TransitionResult::Done),
            Transition::Stop => {
                let run = s.run.unwrap_or(0);
                let mut done = summary(run, s.run_started_ms.unwrap_or(0), now_ms(), s.events as u64);
                done.changes = std::mem::take(&mut s.changes);
                done.degraded = self.degraded.lock().unwrap().iter().map(|(n, why)| format!("{n}: {why}")).collect();
                s.runs.insert(0, detail(done.clone()));
                s.run_started_ms = None;
                s.last_summary = Some(Box::new(done.clone()));
                (SystemState::Configured, TransitionResult::Stopped(Box::new(done)))
            }
            Transition::Reset => {
                s.run_started_ms = None;
                (SystemState::Initial, TransitionResult::Done)
            }
        };
        s.state = next;
        Ok(result)
    }

    fn processes(&self) -> Result<Vec<ProcessEntry>, BackendError> {
        let process = |name: &str, port: u16, pid: u32, provides: &[&str], subscribes: &[&str], commands: &[&str]| {
            let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
            ProcessEntry {
                name: name.into(),
                host: "localhost".into(),
                port,
                pid,
                start_time_ns: 1_700_000_000_000_000_000,
                last_heartbeat_ns: now_ms() * 1_000_000,
                provides: strings(provides),
                subscribes: strings(subscribes),
                commands: strings(commands),
            }
        };
        Ok(vec![
            process(
                "source-1",
                40001,
                101,
                &["source-1/state", "source-1/stats", "source-1/log"],
                &[],
                &["source-1/configure", "source-1/start", "all/stop"],
            ),
            process(
                "bu-1",
                40002,
                102,
                &["bu-1/state", "bu-1/stats"],
                &["source-1/state"],
                &["bu-1/configure", "all/stop"],
            ),
        ])
    }

    fn alarms(&self) -> Result<daqflow_api::alarms::AlarmsStatus, BackendError> {
        Ok(self.alarms.lock().unwrap().clone())
    }

    fn acknowledge_alarm(&self, name: &str, who: &str) -> Result<daqflow_api::alarms::AlarmView, BackendError> {
        use daqflow_api::alarms::{AlarmEvent, AlarmEventKind, AlarmState};
        let mut all = self.alarms.lock().unwrap();
        let system = all.system.clone();
        let Some(alarm) = all.alarms.iter_mut().find(|a| a.name == name) else {
            return Err(BackendError::Invalid(format!("there is no alarm `{name}`")));
        };
        if alarm.state != AlarmState::Raised {
            return Err(BackendError::Invalid(format!("alarm `{name}` is not raised")));
        }
        alarm.state = AlarmState::Acknowledged;
        alarm.acknowledged_by = Some(who.to_owned());
        let (view, event) = (
            alarm.clone(),
            AlarmEvent {
                t_ms: now_ms(),
                system,
                name: name.to_owned(),
                kind: AlarmEventKind::Acknowledged,
                severity: alarm.severity,
                message: alarm.message.clone(),
                who: Some(who.to_owned()),
            },
        );
        all.events.insert(0, event);
        Ok(view)
    }

    fn set(
        &self,
        component: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        if !["source-1", "bu-1"].contains(&component) {
            return Err(BackendError::Invalid(format!("no component `{component}`")));
        }
        let mut state = self.state.lock().unwrap();
        if matches!(state.state, SystemState::Configured | SystemState::Running | SystemState::Paused) {
            // Live: only the source's rate, as a real source has it.
            if (component, key) != ("source-1", "rate_hz") {
                return Err(BackendError::Invalid(format!(
                    "{component}: `{key}` cannot change after configure; the live parameters of source-1 are: rate_hz"
                )));
            }
            if let (SystemState::Running | SystemState::Paused, Some(v)) = (state.state, &value) {
                let change =
                    ParameterChange { t_ms: now_ms(), component: component.into(), key: key.into(), value: v.clone() };
                state.changes.push(change);
            }
        }
        drop(state);
        let mut sets = self.sets.lock().unwrap();
        match value {
            Some(v) => sets.insert(format!("{component}.{key}"), v),
            None => sets.remove(&format!("{component}.{key}")),
        };
        Ok(sets.clone())
    }

    fn send_command(&self, name: &str, data: &str) -> Result<u32, BackendError> {
        if name == "panic" {
            panic!("the fake backend panics on command `panic`");
        }
        if !valid_name(name) {
            return Err(BackendError::Invalid(format!("{name:?} is not a valid command name")));
        }
        if name == "nobody" {
            return Err(BackendError::NotFound("no process registered the command `nobody`".into()));
        }
        self.commands.lock().unwrap().push((name.to_owned(), data.to_owned()));
        Ok(2)
    }

    fn listen(
        &self,
        service: &str,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn Send>, BackendError> {
        if !service.ends_with("/stats") && !service.ends_with("/state") {
            return Err(BackendError::NotFound(format!("no service `{service}` in the directory")));
        }
        struct Subscription(Arc<AtomicBool>, Arc<AtomicUsize>);
        impl Drop for Subscription {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
                self.1.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        self.listeners.fetch_add(1, Ordering::SeqCst);
        let flag = stop.clone();
        let service = service.to_owned();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                n += 1;
                let value = if n == 1 {
                    // A multi-line value, to check that it arrives whole.
                    format!("{{\"service\": \"{service}\",\n \"n\": {n}}}")
                } else {
                    json!({"service": service, "n": n}).to_string()
                };
                if tx.send(value).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Ok(Box::new(Subscription(stop, self.listeners.clone())))
    }

    fn logs(&self, query: &LogQuery) -> Result<Vec<LogRecord>, BackendError> {
        *self.last_query.lock().unwrap() = Some(query.clone());
        if query.text.as_deref() == Some("unreadable") {
            return Err(BackendError::Failed("the message log is unreadable".into()));
        }
        let base = now_ms() - 10_000;
        Ok((0..20u64)
            .rev()
            .map(|i| {
                let severity = [Severity::Info, Severity::Warn, Severity::Error, Severity::Debug][(i % 4) as usize];
                let process = if i % 2 == 0 { "source-1" } else { "bu-1" };
                LogRecord {
                    seq: i + 1,
                    t_ms: base + i * 100,
                    severity,
                    process: process.into(),
                    target: "daqflow::fake".into(),
                    message: format!("message {i} from {process}"),
                }
            })
            .filter(|r| {
                query.since_ms.is_none_or(|s| r.t_ms >= s)
                    && query.until_ms.is_none_or(|u| r.t_ms <= u)
                    && query.process.as_deref().is_none_or(|p| r.process == p)
                    && query.min_severity.is_none_or(|m| r.severity >= m)
                    && query.text.as_deref().is_none_or(|t| r.message.to_lowercase().contains(&t.to_lowercase()))
            })
            .take(query.limit())
            .collect())
    }

    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, BackendError> {
        let s = self.state.lock().unwrap();
        Ok(s.runs.iter().take(limit).map(|r| r.record.clone()).collect())
    }

    fn run(&self, run: u32) -> Result<Option<RunDetail>, BackendError> {
        if run == 999 {
            return Err(BackendError::Failed("the run database is unreadable".into()));
        }
        let s = self.state.lock().unwrap();
        Ok(s.runs.iter().find(|r| r.record.run == run).cloned())
    }

    /// A source's schema as the standard kind declares it (for the Parameters form): `rate_hz`
    /// live in any configured state, `source_id` not live.
    fn schemas(&self) -> std::collections::BTreeMap<String, daqflow_api::schema::Schema> {
        use daqflow_api::schema::{ANY_STATE, Key, Schema};
        let source = Schema::new("source")
            .key(Key::integer("source_id", 0, u32::MAX.into(), "The source id.").default_value(0))
            .key(
                Key::float("rate_hz", 0.0, 1e9, "Fragments per second; 0: free-running.")
                    .unit("Hz")
                    .live(ANY_STATE)
                    .default_value(0.0),
            );
        std::collections::BTreeMap::from([("source-1".to_owned(), source)])
    }

    /// As a monitor publishes them: event sizes of 3 to 6 kB in a histogram up to 16 kB
    /// (64 bins), fragments of a fixed 512 bytes in bins of 64 bytes (whose centre is 544),
    /// and the events seen in each of the last 120 seconds; and as the operator sums a user's
    /// group of monitors: a two-dimensional map and a counter.
    fn histograms(&self) -> Value {
        let sizes: Vec<u64> = (0..64u64)
            .map(|i| if (12..24).contains(&i) { 100 - (i as i64 - 18).unsigned_abs() * 9 } else { 0 })
            .collect();
        let entries: u64 = sizes.iter().sum();
        let mut fragments = vec![0u64; 64];
        fragments[8] = 4000;
        json!([
            {"component": "monitor-1", "name": "event_size", "title": "Event size", "x_label": "bytes",
             "low": 0.0, "high": 16384.0, "bins": sizes, "underflow": 0, "overflow": 0, "entries": entries,
             "sum": entries as f64 * 4608.5, "min": 3100.0, "max": 6050.0, "mean": 4608.5, "unit": "bytes"},
            {"component": "monitor-1", "name": "fragment_size_src0", "title": "Fragment size, source 0",
             "x_label": "bytes", "low": 0.0, "high": 4096.0, "bins": fragments, "underflow": 0, "overflow": 0,
             "entries": 4000, "sum": 2_048_000.0, "min": 512.0, "max": 512.0, "mean": 512.0, "unit": "bytes"},
            {"component": "monitor-1", "name": "rate", "title": "Events seen per second", "x_label": "seconds ago",
             "low": -120.0, "high": 0.0, "bins": vec![2000u64; 120], "underflow": 0, "overflow": 0,
             "entries": 240_000, "sum": 240_000.0, "min": 2000.0, "max": 2000.0, "mean": 2000.0,
             "unit": "events/s", "series": true},
            // A user's monitors, two members of a group: a channel × time map (4 × 2 bins) and a
            // counter, summed.
            {"component": "adc-mons", "members": ["adc-1", "adc-2"], "kind": "h2", "name": "hitmap",
             "title": "Hits per channel and time",
             "x": {"label": "channel", "low": 0.0, "high": 4.0, "bins": 4},
             "y": {"label": "time (ns)", "low": 0.0, "high": 400.0, "bins": 2},
             "bins": [5, 0, 120, 7, 0, 3, 60, 1], "outside": 4, "entries": 200},
            {"component": "adc-mons", "members": ["adc-1", "adc-2"], "kind": "counter", "name": "hits",
             "title": "Hits above threshold", "unit": "hits", "value": 23353},
        ])
    }

    fn et(&self) -> Value {
        let config = json!({"blocking": true, "cue": 100, "prescale": 1, "selection": "All", "single_user": false,
                            "restore": "Output", "group_policy": "RoundRobin"});
        json!([{"component": "et-1", "snapshot": {
            "name": "/tmp/et_fake", "pid": 103, "events": 1000, "event_size": 65536, "free_events": 990,
            "temp_events": 0, "in_transit": 0, "remote": "127.0.0.1:11111", "time_ns": 0,
            "stations": [
                {"name": "GRAND_CENTRAL", "group": null, "config": config, "closure": false, "queued": 990,
                 "events_in": 5000, "events_out": 5010, "attachments": 1},
                {"name": "recorder", "group": null, "config": config, "closure": false, "queued": 10,
                 "events_in": 5000, "events_out": 4990, "attachments": 1},
            ],
            "attachments": [
                {"id": 1, "station": "recorder", "pid": 104, "remote": false, "held": 0, "got": 4990, "put": 4990, "dumped": 0},
            ],
        }}])
    }
}
