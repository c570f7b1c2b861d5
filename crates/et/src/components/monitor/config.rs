//! The configuration of the `monitor` kind: every key, documented, checked by [`MonitorConfig::check`].

use daqflow_component::ComponentError;
use serde::Deserialize;

/// Configuration of a `monitor`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorConfig {
    /// The ET system to sample (its name).
    pub et: String,
    /// The station (created if missing; default: the component's name).
    #[serde(default)]
    pub station: Option<String>,
    /// Take events only while fewer than this many wait in the station.
    #[serde(default = "default_cue")]
    pub cue: u32,
    /// Look at every Nth event only.
    #[serde(default = "default_one")]
    pub prescale: u32,
    /// Upper edge of the event-size histogram (bytes).
    #[serde(default = "default_event_size_max")]
    pub event_size_max: f64,
    /// Upper edge of the fragment-size histograms (bytes).
    #[serde(default = "default_fragment_size_max")]
    pub fragment_size_max: f64,
    /// Bins per size histogram.
    #[serde(default = "default_bins")]
    pub bins: usize,
    /// Seconds the rate histogram covers.
    #[serde(default = "default_rate_window")]
    pub rate_window_s: usize,
}

impl MonitorConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.text("et", &self.et);
        if let Some(s) = &self.station {
            c.text("station", s);
        }
        c.int("cue", self.cue.into(), 1, 1_000_000);
        c.int("prescale", self.prescale.into(), 1, 1_000_000);
        c.float("event_size_max", self.event_size_max, 1.0, 1e12);
        c.float("fragment_size_max", self.fragment_size_max, 1.0, 1e12);
        c.int("bins", self.bins as u64, 1, 100_000);
        c.int("rate_window_s", self.rate_window_s as u64, 1, 86_400);
        c.finish()
    }
}

fn default_cue() -> u32 {
    200
}
fn default_one() -> u32 {
    1
}
fn default_event_size_max() -> f64 {
    65536.0
}
fn default_fragment_size_max() -> f64 {
    16384.0
}
fn default_bins() -> usize {
    64
}
fn default_rate_window() -> usize {
    120
}
