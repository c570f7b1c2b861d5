//! A fake operator: an in-memory system (two components) following the run-control state
//! machine, with a process directory, services, logs, runs, histograms and an ET snapshot.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daqflow_web::{Backend, BackendError, LogFilter};
use serde_json::{Value, json};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct State {
    state: &'static str,
    run: u32,
    run_started_ms: Option<u64>,
    events: f64,
    last: Instant,
    rates: Vec<Value>,
    runs: Vec<Value>,
}

/// The fake. `transition_delay` makes every transition take that long (as a real `start` does).
pub struct FakeBackend {
    state: Mutex<State>,
    transition_delay: Duration,
    /// Open `listen` subscriptions.
    pub listeners: Arc<AtomicUsize>,
    /// Commands sent: (name, data).
    pub commands: Mutex<Vec<(String, String)>>,
    /// The last log filter asked for.
    pub last_filter: Mutex<Option<LogFilter>>,
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

impl FakeBackend {
    pub fn new(transition_delay: Duration) -> Arc<FakeBackend> {
        Arc::new(FakeBackend {
            state: Mutex::new(State {
                state: "Initial",
                run: 0,
                run_started_ms: None,
                events: 0.0,
                last: Instant::now(),
                rates: Vec::new(),
                runs: vec![json!({"run": 1, "started_ms": 1_700_000_000_000u64, "stopped_ms": 1_700_000_060_000u64,
                    "state": "Stopped", "events": 60_000, "bytes": 245_760_000u64})],
            }),
            transition_delay,
            listeners: Arc::new(AtomicUsize::new(0)),
            commands: Mutex::new(Vec::new()),
            last_filter: Mutex::new(None),
        })
    }

    pub fn state(&self) -> &'static str {
        self.state.lock().unwrap().state
    }

    fn advance(s: &mut State) {
        let now = Instant::now();
        let dt = now.duration_since(s.last).as_secs_f64();
        s.last = now;
        let running = s.state == "Running";
        if running {
            s.events += dt * EVENTS_PER_S;
        }
        let (eps, mbps) = if running { (EVENTS_PER_S, EVENTS_PER_S * EVENT_BYTES / 1e6) } else { (0.0, 0.0) };
        s.rates.push(json!({"t_ms": now_ms(), "events_per_s": eps, "mb_per_s": mbps}));
        if s.rates.len() > 300 {
            s.rates.remove(0);
        }
    }
}

impl Backend for FakeBackend {
    fn status(&self) -> Value {
        let mut s = self.state.lock().unwrap();
        FakeBackend::advance(&mut s);
        let running = s.state == "Running";
        let duration_s = s.run_started_ms.map_or(0.0, |t| now_ms().saturating_sub(t) as f64 / 1000.0);
        let component = |name: &str, kind: &str, pid: u32| {
            json!({"name": name, "kind": kind, "host": "localhost", "pid": pid, "state": s.state, "run": s.run,
                   "since_ms": now_ms(), "error": null,
                   "stats": {"events": s.events as u64, "events_per_s": if running { EVENTS_PER_S } else { 0.0 }}})
        };
        json!({
            "system": "fake",
            "state": s.state,
            "run": s.run,
            "run_started_ms": s.run_started_ms,
            "duration_s": duration_s,
            "events": s.events as u64,
            "events_per_s": if running { EVENTS_PER_S } else { 0.0 },
            "mb_per_s": if running { EVENTS_PER_S * EVENT_BYTES / 1e6 } else { 0.0 },
            "lost": 0,
            "components": [component("source-1", "source", 101), component("bu-1", "bu", 102)],
            "rates": s.rates,
        })
    }

    fn transition(&self, verb: &str, arg: Value) -> Result<Value, String> {
        std::thread::sleep(self.transition_delay);
        let mut s = self.state.lock().unwrap();
        FakeBackend::advance(&mut s);
        let next = match (verb, s.state) {
            ("configure", "Initial") => "Configured",
            ("start", "Configured") => "Running",
            ("pause", "Running") => "Paused",
            ("resume", "Paused") => "Running",
            ("stop", "Running" | "Paused") => "Configured",
            ("reset", "Configured" | "Error") => "Initial",
            (verb, state) => return Err(format!("`{verb}` is not allowed in state {state}")),
        };
        match verb {
            "start" => {
                s.run = arg.get("run").and_then(Value::as_u64).map_or(s.run.max(1) + 1, |r| r as u32);
                s.run_started_ms = Some(now_ms());
                s.events = 0.0;
            }
            "stop" => {
                let record = json!({"run": s.run, "started_ms": s.run_started_ms, "stopped_ms": now_ms(),
                                    "state": "Stopped", "events": s.events as u64});
                s.runs.insert(0, record);
                s.run_started_ms = None;
            }
            _ => {}
        }
        s.state = next;
        Ok(json!({"state": next, "run": s.run}))
    }

    fn processes(&self) -> Result<Value, String> {
        Ok(json!([
            {"name": "source-1", "host": "localhost", "port": 40001, "pid": 101,
             "provides": ["source-1/state", "source-1/stats", "source-1/log"], "subscribes": [],
             "commands": ["source-1/configure", "source-1/start", "all/stop"]},
            {"name": "bu-1", "host": "localhost", "port": 40002, "pid": 102,
             "provides": ["bu-1/state", "bu-1/stats"], "subscribes": ["source-1/state"],
             "commands": ["bu-1/configure", "all/stop"]},
        ]))
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

    fn logs(&self, filter: &LogFilter) -> Result<Value, String> {
        *self.last_filter.lock().unwrap() = Some(filter.clone());
        let rank = |s: &str| ["trace", "debug", "info", "warn", "error"].iter().position(|x| *x == s).unwrap_or(2);
        let base = now_ms() - 10_000;
        let records: Vec<Value> = (0..20u64)
            .rev()
            .map(|i| {
                let severity = ["info", "warn", "error", "debug"][(i % 4) as usize];
                let process = if i % 2 == 0 { "source-1" } else { "bu-1" };
                json!({"seq": i + 1, "t_ms": base + i * 100, "severity": severity, "process": process,
                       "target": "daqflow::fake", "message": format!("message {i} from {process}")})
            })
            .filter(|r| {
                let t = r["t_ms"].as_u64().unwrap_or(0);
                filter.since_ms.is_none_or(|s| t >= s)
                    && filter.until_ms.is_none_or(|u| t <= u)
                    && filter.process.as_deref().is_none_or(|p| r["process"] == p)
                    && filter
                        .min_severity
                        .as_deref()
                        .is_none_or(|m| rank(r["severity"].as_str().unwrap_or("")) >= rank(m))
                    && filter.text.as_deref().is_none_or(|t| r["message"].as_str().unwrap_or("").contains(t))
            })
            .take(filter.limit.unwrap_or(200))
            .collect();
        Ok(Value::Array(records))
    }

    fn runs(&self, limit: usize) -> Result<Value, String> {
        let s = self.state.lock().unwrap();
        Ok(Value::Array(s.runs.iter().take(limit).cloned().collect()))
    }

    fn run(&self, run: u32) -> Result<Option<Value>, String> {
        if run == 999 {
            return Err("the run database is unreadable".into());
        }
        let s = self.state.lock().unwrap();
        Ok(s.runs.iter().find(|r| r["run"] == run).map(|r| {
            let mut r = r.clone();
            r["config"] = json!({"system": "fake", "components": ["source-1", "bu-1"]});
            r["files"] = json!([format!("/data/run{run:06}_0001.dat")]);
            r
        }))
    }

    fn histograms(&self) -> Value {
        let bins: Vec<u64> = (0..20u64).map(|i| 100 - (i as i64 - 10).unsigned_abs() * 9).collect();
        json!([
            {"component": "monitor-1", "name": "event_size", "title": "Event size", "x_label": "bytes",
             "low": 0.0, "high": 8192.0, "bins": bins, "underflow": 0, "overflow": 3, "entries": 1200},
            {"component": "monitor-1", "name": "fragments", "title": "Fragments per event", "x_label": "fragments",
             "low": 0.0, "high": 10.0, "bins": [0, 0, 5, 50, 400, 50, 5, 0, 0, 0], "underflow": 0, "overflow": 0,
             "entries": 510},
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

    fn metrics(&self) -> String {
        let s = self.state.lock().unwrap();
        format!(
            "# HELP daqflow_events_total Events built.\n# TYPE daqflow_events_total counter\ndaqflow_events_total {}\n\
             # HELP daqflow_run Current run number.\n# TYPE daqflow_run gauge\ndaqflow_run{{system=\"fake\"}} {}",
            s.events as u64, s.run
        )
    }
}
