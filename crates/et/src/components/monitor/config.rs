//! The configuration of the `monitor` kind: every key, documented, checked by [`MonitorConfig::check`].

use daqflow_component::ComponentError;
use daqflow_component::schema::{ANY_STATE, Key, Schema};
use serde::{Deserialize, Serialize};

/// Configuration of a `monitor`.
#[derive(Debug, Clone, Deserialize, Serialize)]
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

/// The typed schema of the `monitor` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    let sample: MonitorConfig = toml::from_str("et = \"et\"").expect("a monitor's smallest configuration");
    Schema::new("monitor")
        .key(Key::text("et", "The ET system's name.").required())
        .key(Key::text("station", "Its station (non-blocking: it takes events only while fewer than `cue` wait, so it never slows the data); default: the component's name."))
        .key(Key::integer("cue", 1, 1_000_000, "Most events waiting in its station."))
        .key(Key::integer("prescale", 1, 1_000_000, "Its station takes one event in this many (reconfigured in place).").live(ANY_STATE))
        .key(Key::float("event_size_max", 1.0, 1e12, "Upper edge of the event-size histogram; live: the histograms start again empty.").unit("bytes").live(ANY_STATE))
        .key(Key::float("fragment_size_max", 1.0, 1e12, "Upper edge of the fragment-size histograms; live: the histograms start again empty.").unit("bytes").live(ANY_STATE))
        .key(Key::integer("bins", 1, 100_000, "Bins per size histogram; live: the histograms start again empty.").live(ANY_STATE))
        .key(Key::integer("rate_window_s", 1, 86_400, "Seconds the rate histogram covers.").unit("s"))
        .output(Key::text("station", "Its ET station."))
        .defaults_from(&sample)
}

impl MonitorConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&toml::from_str::<MonitorConfig>("et = \"et\"").unwrap());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
