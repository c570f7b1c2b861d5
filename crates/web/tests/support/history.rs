//! The fake operator with a history of slow values: a real run database (an SQLite file in a
//! temporary directory) holding an hour of samples, served through the `Backend`'s history
//! methods as the operator's backend serves its own.
#![allow(dead_code)]

use std::sync::Arc;

use daqflow_api::{
    HistoryQuery, HistorySeries, LogQuery, LogRecord, ProcessEntry, RunDetail, RunRecord, SystemStatus, Transition,
    TransitionResult,
};
use daqflow_rundb::{RunDb, Sample};
use daqflow_web::{Backend, BackendError};
use serde_json::Value;

use super::fake::{FakeBackend, now_ms};

/// The samples' interval (ms) and how many each name has: an hour.
pub const INTERVAL_MS: u64 = 5000;
pub const SAMPLES: u64 = 720;
/// How many samples `system.events_per_s` has: the last 3 minutes.
pub const RUN_SAMPLES: u64 = 36;

/// The fake with a history.
pub struct HistoryBackend {
    pub fake: Arc<FakeBackend>,
    pub db: RunDb,
    _dir: tempfile::TempDir,
}

impl HistoryBackend {
    /// The last hour, a sample every 5 s, of `evm.events` (growing by 1000 a sample),
    /// `evm.events_per_s` (a saw tooth 0 … 99), `bu-0.detail.throttled` (0 or 1) and
    /// `hv/state.voltage` (1500); and of the last 3 minutes only (a run begun then),
    /// `system.events_per_s` (2000).
    pub fn new(fake: Arc<FakeBackend>) -> Arc<HistoryBackend> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = RunDb::open(&dir.path().join("runs.sqlite")).expect("the run database");
        let t0 = now_ms() - SAMPLES * INTERVAL_MS;
        let mut samples = Vec::new();
        for i in 0..SAMPLES {
            let t = t0 + (i + 1) * INTERVAL_MS;
            samples.push(Sample::new(t, "evm.events", (i * 1000) as f64));
            samples.push(Sample::new(t, "evm.events_per_s", (i % 100) as f64));
            samples.push(Sample::new(t, "bu-0.detail.throttled", (i % 2) as f64));
            samples.push(Sample::new(t, "hv/state.voltage", 1500.0));
            if i + RUN_SAMPLES >= SAMPLES {
                samples.push(Sample::new(t, "system.events_per_s", 2000.0));
            }
        }
        db.add_samples(&samples).expect("storing the samples");
        Arc::new(HistoryBackend { fake, db, _dir: dir })
    }
}

impl Backend for HistoryBackend {
    fn status(&self) -> SystemStatus {
        self.fake.status()
    }
    fn transition(&self, t: Transition) -> Result<TransitionResult, BackendError> {
        self.fake.transition(t)
    }
    fn processes(&self) -> Result<Vec<ProcessEntry>, BackendError> {
        self.fake.processes()
    }
    fn send_command(&self, name: &str, data: &str) -> Result<u32, BackendError> {
        self.fake.send_command(name, data)
    }
    fn set(
        &self,
        component: &str,
        key: &str,
        value: Option<Value>,
    ) -> Result<std::collections::BTreeMap<String, Value>, BackendError> {
        self.fake.set(component, key, value)
    }
    fn listen(
        &self,
        service: &str,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn Send>, BackendError> {
        self.fake.listen(service, tx)
    }
    fn logs(&self, query: &LogQuery) -> Result<Vec<LogRecord>, BackendError> {
        self.fake.logs(query)
    }
    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, BackendError> {
        self.fake.runs(limit)
    }
    fn run(&self, run: u32) -> Result<Option<RunDetail>, BackendError> {
        self.fake.run(run)
    }
    fn histograms(&self) -> Value {
        self.fake.histograms()
    }
    fn et(&self) -> Value {
        self.fake.et()
    }
    fn history_names(&self) -> Result<Vec<String>, BackendError> {
        self.db.history_names().map_err(|e| BackendError::Failed(e.to_string()))
    }
    fn history(&self, query: &HistoryQuery) -> Result<Option<HistorySeries>, BackendError> {
        self.db.history(query).map_err(|e| BackendError::Failed(e.to_string()))
    }
}
