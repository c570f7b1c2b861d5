//! The ET system's standard components, each a kind the `daqflow` binary registers
//! (`daqflow component KIND`, or a `[[component]]` of a system file): [`system`] (kind `et`: an
//! ET system as a component), [`recorder`] (an ET consumer writing data files) and [`monitor`]
//! (an ET consumer filling online histograms). Each folder holds the kind's configuration
//! (`config.rs`: every key documented, unknown keys are errors, every value range-checked), its
//! runtime, its `factory`, and its `kind()`, the registry's line for the kind (role, stages,
//! data files, factory).
//!
//! Each reports [`Stats`](daqflow_component::Stats): `events` and `bytes` in its sense (the
//! ET system: new events handed out to producers; recorder: events recorded; monitor: events
//! looked at), the rates over the last interval live and over the run in the stop summary, and
//! its own figures in `detail` ([`EtDetail`](system::EtDetail),
//! [`RecorderDetail`](recorder::RecorderDetail), [`MonitorDetail`](monitor::MonitorDetail)).

pub mod monitor;
pub mod recorder;
pub mod system;

use std::sync::Mutex;
use std::time::Instant;

pub(crate) use daqflow_component::sync::{read, set};

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The rates of live statistics: over the interval since the previous call, at least 0.2 s
/// long (a call sooner gets the previous rates).
pub(crate) struct Recent(Mutex<(Instant, u64, u64, f64, f64)>);

impl Recent {
    /// Counting from 0 events and bytes, now.
    pub(crate) fn new() -> Recent {
        Recent(Mutex::new((Instant::now(), 0, 0, 0.0, 0.0)))
    }

    /// Events per second and megabytes (10⁶ bytes) per second, given the counters now.
    pub(crate) fn rates(&self, events: u64, bytes: u64) -> (f64, f64) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let dt = r.0.elapsed().as_secs_f64();
        if dt >= 0.2 {
            *r = (
                Instant::now(),
                events,
                bytes,
                events.saturating_sub(r.1) as f64 / dt,
                bytes.saturating_sub(r.2) as f64 / dt / 1e6,
            );
        }
        (r.3, r.4)
    }
}

/// A mean rate: `n` over `seconds`, 0 without time.
pub(crate) fn per_second(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { n as f64 / seconds } else { 0.0 }
}
