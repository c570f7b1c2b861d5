//! The chain monitor: DAQ-Middleware's "monitor", which fills histograms from the data it
//! receives (the kind is `chain_monitor`: `monitor` is the ET system's). `configure` binds
//! `listen`; at `start` it accepts its upstream, checks every chunk as the sink does, and fills,
//! reset at each start:
//! - `chunk_size`: data bytes per chunk, 0 … `max_chunk_bytes`;
//! - `first_word`: the chunk data's first 4 bytes as a little-endian `u32` (chunks shorter
//!   than 4 bytes are not filled), 0 … 2³².
//!
//! Then it spends `work_us` on the chunk (it sleeps), standing for an analysis that takes its
//! time; once `stop` is called it fills the histograms of what is left without the work, so
//! that the end marker comes soon (`drained_at_stop` counts those chunks). The histograms are published with its statistics (`<name>/stats`, key
//! `detail.histograms`, the ET monitor's shape: `docs/operator-guide.md`, "Statistics of the
//! standard kinds"), so the operator's `GET /api/histograms` and the web UI show them.
//!
//! A chain monitor is fed by a dispatcher's sampling output: it takes what it can, the
//! dispatcher counts what it dropped, and a slow monitor never slows the logger beside it.
//!
//! ```no_run
//! use daqflow_chain::chain_monitor::{ChainMonitor, ChainMonitorConfig, ChainMonitorDetail};
//! use daqflow_component::Component;
//! let mut m = ChainMonitor::new("mon", ChainMonitorConfig { work_us: 10_000, ..Default::default() });
//! let listen = m.configure()?["listen"].as_str().unwrap().to_owned(); // a sampling output's downstream
//! m.start(1)?;
//! // … the chain runs …
//! let detail: ChainMonitorDetail = m.stop(None)?.detail_as().unwrap();
//! println!("{}", detail.histograms[0].entries());
//! # let _ = listen;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daqflow_component::histogram::Histogram;
use daqflow_transport::Listener;
use serde::{Deserialize, Serialize};

pub use self::config::{ChainMonitorConfig, schema};
use super::link::{Live, Work, Worker, bind, read, worker_component};
use daqflow_component::sync::{lock, set};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The chain monitor component (its hooks are the chain's one worker's: the thread, the stop,
/// the report).
pub struct ChainMonitor(Worker<Monitoring>);

/// The chain monitor's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// it looked at, its `bytes` theirs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChainMonitorDetail {
    /// The address it listens on (after configure).
    pub listen: Option<String>,
    /// The upstream's address, once it connected.
    pub upstream: Option<String>,
    /// Seconds from the first chunk to the latest.
    pub seconds: f64,
    /// Chunks per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Chunks whose sequence number was not the one expected.
    pub sequence_errors: u64,
    /// Chunks whose data did not match their CRC32C.
    pub crc_errors: u64,
    /// Whether the end marker came.
    pub end_seen: bool,
    /// The histograms: `chunk_size`, `first_word`.
    pub histograms: Vec<Histogram>,
    /// Chunks taken after `stop` was called, filled without `work_us`.
    pub drained_at_stop: u64,
    /// Why the run failed or ended without the end marker, if it did.
    pub error: Option<String>,
}

/// Builds a chain monitor named `name` from its configuration table: the keys are checked,
/// every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: ChainMonitorConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(ChainMonitor::new(name, c)))
}

/// The `chain_monitor` kind: outside the event accounting; it starts before the chain's
/// senders and stops after them, with the sink.
pub fn kind() -> Kind {
    Kind::new(
        "chain_monitor",
        "the chain's end that fills histograms from the chunks it is given",
        Role::Other,
        factory,
    )
    .stages(2, 5)
    .schema(config::schema())
}

impl ChainMonitor {
    /// A chain monitor named `name`.
    pub fn new(name: &str, config: ChainMonitorConfig) -> ChainMonitor {
        let plots = Arc::new(Mutex::new(fresh_plots(&config)));
        let draining = Arc::new(AtomicBool::new(false));
        ChainMonitor(Worker::new(
            name,
            Monitoring { config, listener: None, plots, draining, drained: Arc::new(AtomicU64::new(0)) },
        ))
    }
}

/// What a chain monitor does; [`Worker`] runs it.
struct Monitoring {
    config: ChainMonitorConfig,
    listener: Option<Arc<Listener>>,
    plots: Arc<Mutex<Vec<Histogram>>>,
    /// Set by `stop`: what is left is taken without the work.
    draining: Arc<AtomicBool>,
    drained: Arc<AtomicU64>,
}

fn fresh_plots(c: &ChainMonitorConfig) -> Vec<Histogram> {
    vec![
        Histogram::new("chunk_size", "Chunk size", "bytes", 0.0, c.max_chunk_bytes as f64, c.bins),
        Histogram::new("first_word", "First data word", "value (u32, little-endian)", 0.0, 4_294_967_296.0, c.bins),
    ]
}

impl Work for Monitoring {
    const THREAD: &'static str = "monitor";

    /// Binds `listen`; answers `{"listen": ADDR}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let (listener, answer) =
            bind(name, &self.config.listen, self.config.advertise.as_deref(), self.config.tuning())?;
        self.listener = Some(listener);
        Ok(answer)
    }

    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let listener = self.listener.clone().ok_or_else(|| ComponentError::Failed("not configured".into()))?;
        set(&self.plots, fresh_plots(&self.config));
        let (name, live, plots, check_crc) = (name.to_owned(), live.clone(), self.plots.clone(), self.config.check);
        let work = Duration::from_micros(self.config.work_us);
        self.draining = Arc::new(AtomicBool::new(false));
        self.drained = Arc::new(AtomicU64::new(0));
        let (draining, drained) = (self.draining.clone(), self.drained.clone());
        Ok(Box::new(move || {
            crate::receiver::receive_chunks(&name, run, check_crc, None, &listener, &live, |header, data| {
                {
                    let mut p = lock(&plots);
                    p[0].fill(f64::from(header.len));
                    if let Some(w) = data.first_chunk::<4>() {
                        p[1].fill(f64::from(u32::from_le_bytes(*w)));
                    }
                }
                if draining.load(Ordering::Relaxed) {
                    drained.fetch_add(1, Ordering::Relaxed);
                } else if !work.is_zero() {
                    std::thread::sleep(work);
                }
                Ok(())
            });
        }))
    }

    /// How long `stop` waits for the end marker.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// What is left is taken without the work.
    fn stopping(&mut self, _live: &Live, _last_event: Option<u64>) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Chunks looked at, their bytes, and the histograms so far; a [`ChainMonitorDetail`].
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        stats.with_detail(&ChainMonitorDetail {
            listen: self.listener.as_ref().map(|l| l.local_addr().to_string()),
            upstream: read(&live.upstream),
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            sequence_errors: live.sequence_errors.load(Ordering::Relaxed),
            crc_errors: live.crc_errors.load(Ordering::Relaxed),
            end_seen: read(&live.end).is_some(),
            histograms: read(&self.plots),
            drained_at_stop: self.drained.load(Ordering::Relaxed),
            error: live.failure(),
        })
    }

    fn release(&mut self) {
        self.listener = None;
    }
}

worker_component!(ChainMonitor);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{Generator, GeneratorConfig};

    #[test]
    fn fills_the_histograms_of_every_chunk_and_publishes_them() {
        let config = ChainMonitorConfig { max_chunk_bytes: 2000, bins: 20, ..Default::default() };
        let mut m = ChainMonitor::new("mon", config);
        let listen = m.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        m.start(1).unwrap();
        let mut g = Generator::new(
            "gen",
            GeneratorConfig { downstream: listen, chunk_bytes: 1000, rate_hz: 1000.0, ..Default::default() },
        );
        g.configure().unwrap();
        g.start(1).unwrap();
        g.stop(Some(50)).unwrap();
        let summary = m.stop(None).unwrap();
        let d: ChainMonitorDetail = summary.detail_as().unwrap();
        assert!(d.end_seen && d.error.is_none(), "{d:?}");
        assert_eq!((summary.events, d.sequence_errors, d.crc_errors), (50, 0, 0));
        let size = &d.histograms[0];
        assert_eq!((size.entries(), size.bins()[10], size.mean()), (50, 50, Some(1000.0)), "{size:?}");
        assert_eq!(d.histograms[1].entries(), 50);
        let published = m.stats().detail["histograms"][0]["name"].clone();
        assert_eq!(published, "chunk_size");
    }

    #[test]
    fn at_stop_what_is_left_is_taken_without_the_work() {
        let config = ChainMonitorConfig { work_us: 100_000, ..Default::default() };
        let mut m = ChainMonitor::new("mon", config);
        let listen = m.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        m.start(1).unwrap();
        let mut g = Generator::new(
            "gen",
            GeneratorConfig { downstream: listen, chunk_bytes: 100, rate_hz: 1000.0, ..Default::default() },
        );
        g.configure().unwrap();
        g.start(1).unwrap();
        g.stop(Some(60)).unwrap();
        let summary = m.stop(None).unwrap();
        let d: ChainMonitorDetail = summary.detail_as().unwrap();
        assert!(d.end_seen && d.error.is_none(), "{d:?}");
        assert_eq!((summary.events, d.histograms[0].entries()), (60, 60));
        assert!(d.drained_at_stop > 0 && d.drained_at_stop < 60, "{d:?}");
    }
}
