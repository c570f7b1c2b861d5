//! The history of slow values (MIDAS's history): every `[history] interval_s` the operator
//! takes a sample of every number of every component's last statistics (`COMPONENT.KEY`, the
//! names of [`Stats::values`]), of its own (`system.KEY`) and of the services the system file
//! names (`SERVICE.PATH`), and writes them into the run database (`RunDb::add_samples`), which
//! deletes what is older than `retention_days`.
//!
//! Two threads of their own, so that the operator's event loop never waits for the database:
//! the **sampler** reads the operator's shown snapshot (a lock held only to copy numbers) and
//! hands each interval's samples to a bounded queue without waiting; the **writer** takes them
//! from the queue and writes them with a database connection of its own, one transaction per
//! batch. A full queue (a database slower than the samples come, or gone) drops the batch: the
//! samples dropped are counted (`system.history_dropped`) and logged. A batch the database
//! refuses is dropped the same way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError, channel, sync_channel};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use daqflow_api::{ComponentState, SystemState};
use daqflow_component::Stats;
use serde_json::Value;

use super::{Inner, OperatorError, lock};
use crate::db::{Location, RunDb, Sample};
use crate::system::HistorySection;
use daqflow_component::log::now_ms;

/// Batches (one per interval) the queue between the sampler and the writer holds.
pub(crate) const QUEUE_BATCHES: usize = 64;
/// How often the writer deletes the samples older than the retention.
const RETENTION_EVERY: Duration = Duration::from_secs(600);
/// While batches are dropped, at most one log line this often.
const DROP_LOG_EVERY: Duration = Duration::from_secs(60);
/// How long shutting down waits for the writer to write what is queued.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// The number of a system state in the history (`system.state`).
pub fn state_number(state: SystemState) -> f64 {
    match state {
        SystemState::Initial => 0.0,
        SystemState::Configured => 1.0,
        SystemState::Running => 2.0,
        SystemState::Paused => 3.0,
        SystemState::Error => 4.0,
        SystemState::Mixed => 5.0,
        SystemState::Configuring => 6.0,
        SystemState::Starting => 7.0,
        SystemState::Pausing => 8.0,
        SystemState::Resuming => 9.0,
        SystemState::Stopping => 10.0,
        SystemState::Resetting => 11.0,
    }
}

/// The samples of one component's statistics: `COMPONENT.KEY` for every number of
/// [`Stats::values`] but the monitors' histograms (data, not slow values).
pub(crate) fn component_samples(t_ms: u64, component: &str, stats: &Stats, out: &mut Vec<Sample>) {
    for (key, value) in stats.values() {
        if key.starts_with("detail.histograms.") {
            continue;
        }
        out.push(Sample::new(t_ms, format!("{component}.{key}"), value));
    }
}

/// The numbers of a service's value, named as the history names them: `SERVICE` for a bare
/// number (or boolean), `SERVICE.PATH` for every number in a JSON object or array (the rules of
/// [`Stats::values`]). `None` when the value is not JSON.
pub(crate) fn service_values(service: &str, data: &[u8]) -> Option<Vec<(String, f64)>> {
    let value: Value = serde_json::from_slice(data).ok()?;
    let flat = Stats::default().with_detail(&value).values();
    Some(
        flat.into_iter()
            .filter_map(|(key, v)| {
                let path = key.strip_prefix("detail")?;
                Some((format!("{service}{path}"), v))
            })
            .collect(),
    )
}

/// The queue between the sampler and the writer: bounded, never waits, counts what it drops.
pub(crate) struct SampleQueue {
    tx: SyncSender<Vec<Sample>>,
    dropped: Arc<AtomicU64>,
    /// When the last drop was logged (none since the last batch queued).
    logged: Option<Instant>,
}

impl SampleQueue {
    /// A queue of at most `batches` batches, and its receiving end.
    pub(crate) fn new(batches: usize, dropped: Arc<AtomicU64>) -> (SampleQueue, Receiver<Vec<Sample>>) {
        let (tx, rx) = sync_channel(batches);
        (SampleQueue { tx, dropped, logged: None }, rx)
    }

    /// Queues a batch; when the queue is full (or the writer is gone) the batch is dropped,
    /// counted and logged (the first drop at once, then at most once a minute). Whether it was
    /// queued.
    pub(crate) fn push(&mut self, batch: Vec<Sample>) -> bool {
        let n = batch.len() as u64;
        match self.tx.try_send(batch) {
            Ok(()) => {
                self.logged = None;
                true
            }
            Err(TrySendError::Full(_)) => {
                let total = self.dropped.fetch_add(n, Ordering::Relaxed) + n;
                if self.logged.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY) {
                    self.logged = Some(Instant::now());
                    tracing::warn!(
                        "history: the run database is slower than the samples come: {n} samples dropped ({total} so far)"
                    );
                }
                false
            }
            Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(n, Ordering::Relaxed);
                false
            }
        }
    }
}

/// The history's threads and subscriptions, while the operator runs.
pub(crate) struct History {
    stop: Option<Sender<()>>,
    sampler: Option<std::thread::JoinHandle<()>>,
    writer_done: Receiver<()>,
    _subscriptions: Vec<daqflow_dialog::Subscription>,
}

/// The latest numbers of each named service (service → its values).
type ServiceValues = Arc<Mutex<BTreeMap<String, Vec<(String, f64)>>>>;

impl History {
    /// Starts sampling for the operator `inner` into the database at `location` (a connection
    /// of its own), as `section` says.
    pub(crate) fn start(
        inner: Weak<Inner>,
        location: &Location,
        section: &HistorySection,
        dialog: &daqflow_dialog::Dialog,
    ) -> Result<History, OperatorError> {
        let db = RunDb::connect(location).map_err(|e| OperatorError::Setup(format!("history: {e}")))?;
        let services: ServiceValues = Arc::default();
        let mut subscriptions = Vec::new();
        for name in &section.services {
            let (values, service) = (services.clone(), name.clone());
            let mut warned = false;
            let sub = dialog
                .subscribe(name, move |event| match event {
                    daqflow_dialog::ServiceEvent::Update { data, .. } => match service_values(&service, &data) {
                        Some(v) => {
                            lock(&values).insert(service.clone(), v);
                        }
                        None => {
                            lock(&values).remove(&service);
                            if !warned {
                                warned = true;
                                tracing::warn!("history: the service {service} does not publish JSON: not sampled");
                            }
                        }
                    },
                    // Lost (the provider went away), or what a newer client library adds: no value
                    // until the next update.
                    _ => {
                        lock(&values).remove(&service);
                    }
                })
                .map_err(|e| OperatorError::Setup(format!("history: subscribing to {name}: {e}")))?;
            subscriptions.push(sub);
        }
        let dropped = Arc::new(AtomicU64::new(0));
        let (queue, rx) = SampleQueue::new(QUEUE_BATCHES, dropped.clone());
        let (done_tx, writer_done) = channel();
        let retention_ms = section.retention_ms();
        let writer_dropped = dropped.clone();
        std::thread::Builder::new()
            .name("history-writer".into())
            .spawn(move || {
                write(db, rx, retention_ms, writer_dropped);
                let _ = done_tx.send(());
            })
            .map_err(|e| OperatorError::Setup(format!("history: {e}")))?;
        let (stop, stopped) = channel();
        let interval = section.interval();
        let sampler = std::thread::Builder::new()
            .name("history-sampler".into())
            .spawn(move || sample(inner, interval, services, queue, dropped, stopped))
            .map_err(|e| OperatorError::Setup(format!("history: {e}")))?;
        Ok(History { stop: Some(stop), sampler: Some(sampler), writer_done, _subscriptions: subscriptions })
    }

    /// Stops sampling, and waits a little for the writer to write what is queued.
    pub(crate) fn stop(mut self) {
        self.stop.take();
        if let Some(s) = self.sampler.take() {
            let _ = s.join();
        }
        if self.writer_done.recv_timeout(FLUSH_WAIT).is_err() {
            tracing::warn!("history: the run database did not take the last samples within {FLUSH_WAIT:?}");
        }
    }
}

/// The sampler: every `interval`, the samples of the moment into the queue, until `stopped`.
fn sample(
    inner: Weak<Inner>,
    interval: Duration,
    services: ServiceValues,
    mut queue: SampleQueue,
    dropped: Arc<AtomicU64>,
    stopped: Receiver<()>,
) {
    let mut next = Instant::now() + interval;
    loop {
        match stopped.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            // Late (a stopped machine): the next sample one interval from now.
            next = now + interval;
        }
        let Some(inner) = inner.upgrade() else { return };
        let t_ms = now_ms();
        let mut batch = Vec::new();
        {
            let shown = lock(&inner.shown);
            let s = &shown.snapshot;
            for (name, view) in &s.views {
                let joined =
                    view.alive && !matches!(view.state, None | Some(ComponentState::Starting | ComponentState::Dead));
                if joined {
                    component_samples(t_ms, name, &view.stats, &mut batch);
                }
            }
            // The numbers the status shows at this moment.
            let t = super::status::shown_totals(&inner.file, s);
            for (key, value) in [
                ("state", state_number(s.state)),
                ("running", f64::from(u8::from(s.run_started_ms.is_some()))),
                ("events", t.events as f64),
                ("bytes", t.bytes as f64),
                ("recorded", t.recorded as f64),
                ("events_per_s", t.events_per_s),
                ("mb_per_s", t.mb_per_s),
            ] {
                batch.push(Sample::new(t_ms, format!("system.{key}"), value));
            }
            if let Some(run) = s.run {
                batch.push(Sample::new(t_ms, "system.run", f64::from(run)));
            }
        }
        drop(inner);
        for values in lock(&services).values() {
            batch.extend(values.iter().map(|(name, v)| Sample::new(t_ms, name.clone(), *v)));
        }
        batch.push(Sample::new(t_ms, "system.history_dropped", dropped.load(Ordering::Relaxed) as f64));
        queue.push(batch);
    }
}

/// The writer: every batch of the queue into the database (those waiting together, in one
/// transaction), and the retention's deletes, until the sampler is gone.
fn write(db: RunDb, rx: Receiver<Vec<Sample>>, retention_ms: u64, dropped: Arc<AtomicU64>) {
    let mut next_retention = Instant::now();
    let mut failing = false;
    loop {
        if Instant::now() >= next_retention {
            next_retention = Instant::now() + RETENTION_EVERY;
            match db.delete_history_before(now_ms().saturating_sub(retention_ms)) {
                Ok(0) => {}
                Ok(n) => tracing::info!("history: {n} samples older than the retention deleted"),
                Err(e) => tracing::warn!("history: deleting the samples older than the retention: {e}"),
            }
        }
        let mut batch = match rx.recv_timeout(RETENTION_EVERY) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        match db.add_samples(&batch) {
            Ok(_) => {
                if failing {
                    failing = false;
                    tracing::info!("history: the run database takes samples again");
                }
            }
            Err(e) => {
                let n = batch.len() as u64;
                let total = dropped.fetch_add(n, Ordering::Relaxed) + n;
                if !failing {
                    failing = true;
                    tracing::warn!("history: {n} samples dropped ({total} so far): {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_services_numbers_are_named_by_their_path() {
        let v = service_values("hv/state", br#"{"voltage": 1500.5, "on": true, "name": "x", "ch": [1, 2]}"#).unwrap();
        let v: BTreeMap<String, f64> = v.into_iter().collect();
        let expected: BTreeMap<String, f64> =
            [("hv/state.voltage", 1500.5), ("hv/state.on", 1.0), ("hv/state.ch.0", 1.0), ("hv/state.ch.1", 2.0)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        assert_eq!(v, expected);
        assert_eq!(service_values("cryo/t", b"4.2").unwrap(), vec![("cryo/t".to_owned(), 4.2)]);
        assert_eq!(service_values("cryo/t", b"\"text\"").unwrap(), vec![]);
        assert_eq!(service_values("cryo/t", b"not json"), None);
    }

    #[test]
    fn a_components_numbers_are_named_after_it_without_histograms() {
        let stats = Stats::counted(7, 70).with_detail(&serde_json::json!({
            "throttled": false,
            "histograms": [{"name": "h", "entries": 3, "bins": [1, 2]}],
        }));
        let mut out = Vec::new();
        component_samples(5, "bu-0", &stats, &mut out);
        let names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["bu-0.events", "bu-0.bytes", "bu-0.events_per_s", "bu-0.mb_per_s", "bu-0.detail.throttled"]);
        assert!(out.iter().all(|s| s.t_ms == 5));
        assert_eq!(out[0].value, 7.0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dropped = Arc::new(AtomicU64::new(0));
        let (mut queue, rx) = SampleQueue::new(2, dropped.clone());
        let batch = || vec![Sample::new(1, "a.events", 1.0), Sample::new(1, "a.bytes", 2.0)];
        assert!(queue.push(batch()) && queue.push(batch()));
        // Nobody takes from the queue (a database that hangs): the push returns at once.
        assert!(!queue.push(batch()));
        assert!(!queue.push(batch()));
        assert_eq!(dropped.load(Ordering::Relaxed), 4);
        assert_eq!(rx.try_recv().unwrap().len(), 2);
        assert!(queue.push(batch()), "room again once the writer took a batch");
        drop(rx);
        assert!(!queue.push(batch()));
        assert_eq!(dropped.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn every_system_state_has_its_own_number() {
        let numbers: Vec<f64> = SystemState::ALL.iter().map(|s| state_number(*s)).collect();
        assert_eq!(numbers, (0..12).map(f64::from).collect::<Vec<_>>());
    }
}
