//! The configuration of the `source` kind: every key, documented, range-checked by
//! [`SourceConfig::validate`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use daqflow_component::schema::{ANY_STATE, Key, Schema};

use crate::EvbError;
use crate::model::{self, SizeModel};

/// What a source's payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// The pattern of (event, source), written for every fragment: checkable end to end.
    #[default]
    Pattern,
    /// One pattern buffer sent for every fragment (sizes rounded up to 8 bytes), with a fresh
    /// header each time and the payload's CRC (computed once per size): what hardware emulators
    /// do, so that a measurement on a shared machine is not dominated by generating data.
    Cached,
    /// An emulated digitizer's hits (channel, ADC counts, time; [`super::adc`]): a detector's
    /// quantities for a monitor to show.
    Adc,
}

/// Who the source feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourceRole {
    /// A readout unit (`ru` address).
    #[default]
    Data,
    /// The EVM's trigger input (`ru` is then the EVM's address).
    Trigger,
}

/// Configuration of a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    /// The source id, unique in the system.
    pub source_id: u32,
    /// Address of the RU it feeds (or of the EVM with `role = "trigger"`).
    pub ru: String,
    /// What it feeds.
    pub role: SourceRole,
    /// Payload sizes.
    pub size: SizeModel,
    /// A stream table; this source's line overrides `size`.
    pub stream_table: Option<PathBuf>,
    /// Largest payload.
    pub max_bytes: usize,
    /// Fragments per second; 0: free-running.
    pub rate_hz: f64,
    /// Trigger type written in every fragment.
    pub trigger_type: u32,
    /// Payload content.
    pub payload: Payload,
    /// Channels of the `adc` payload (its hits' channels are `source_id × channels + k`).
    pub channels: u16,
    /// Flip one payload byte of this event after the CRC is computed (to test detection).
    pub corrupt_event: Option<u64>,
    /// Seed of the size model.
    pub seed: u64,
    /// How long (ms) `start` retries connecting.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for a stream its RU no longer reads before cutting it.
    pub stop_timeout_ms: u64,
}

/// The typed schema of the `source` kind's configuration: every key's type, range, unit,
/// default and live states (`docs/operator-guide.md`, "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("source")
        .key(Key::integer("source_id", 0, u32::MAX.into(), "The source id: it names its fragments in every event.").unique())
        .key(Key::address("ru", "Address of the RU it feeds (of the EVM with `role = \"trigger\"`)."))
        .key(Key::choice("role", &["data", "trigger"], "What it feeds: a readout unit, or the EVM's trigger input."))
        .keys(model::schema_keys("size", "Payload sizes"))
        .key(Key::path("stream_table", "A stream table (`source_id mean_bytes rms_bytes` per line); this source's line overrides `size`."))
        .key(Key::integer("max_bytes", 1, 1 << 30, "Largest payload.").unit("bytes"))
        .key(
            Key::float("rate_hz", 0.0, 1e9, "Fragments per second; 0: free-running. Live: a run in progress takes the new pace at once.")
                .unit("Hz")
                .live(ANY_STATE),
        )
        .key(Key::integer("trigger_type", 0, u32::MAX.into(), "Trigger type written in every fragment."))
        .key(Key::choice("payload", &["pattern", "cached", "adc"], "Payload content: the (event, source) pattern, checkable end to end; one cached pattern buffer (what hardware emulators do); or an emulated digitizer's hits (channel, ADC counts, time: docs/evb.md, \"The `adc` payload\")."))
        .key(Key::integer("channels", 1, 4096, "Channels of the `adc` payload; its hits' channels are `source_id × channels + k`."))
        .key(Key::integer("corrupt_event", 0, i64::MAX, "Flip one payload byte of this event after the CRC is computed (to test detection)."))
        .key(Key::integer("seed", 0, i64::MAX, "Seed of the size model."))
        .key(Key::integer("connect_timeout_ms", 1, 3_600_000, "How long `start` retries connecting.").unit("ms"))
        .key(Key::integer("stop_timeout_ms", 1, 3_600_000, "How long `stop` waits for a stream its RU no longer reads before cutting it.").unit("ms"))
        .output(Key::float("mean_bytes", 0.0, f64::MAX, "The mean payload size of its size model."))
        .defaults_from(&SourceConfig::default())
}

impl SourceConfig {
    /// Checks every key against the [`schema`] and the size model's rules between keys; every
    /// problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("source");
        c.schema(&schema(), self);
        if let Err(e) = self.size.validate() {
            c.problem("size", e);
        }
        c.finish()
    }
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            source_id: 0,
            ru: "127.0.0.1:7200".into(),
            role: SourceRole::Data,
            size: SizeModel::default(),
            stream_table: None,
            max_bytes: 1 << 20,
            rate_hz: 0.0,
            trigger_type: 1,
            payload: Payload::Pattern,
            channels: 8,
            corrupt_event: None,
            seed: 0,
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 5_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&SourceConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn every_key_out_of_range_is_named() {
        assert!(SourceConfig::default().validate().is_ok());
        let bad = SourceConfig { ru: "127.0.0.1:123456".into(), rate_hz: -3.0, max_bytes: 0, ..Default::default() };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration: source: "), "{e}");
        assert!(e.contains("`ru` = \"127.0.0.1:123456\" is not an address"), "{e}");
        assert!(e.contains("`max_bytes` = 0 is out of range") && e.contains("`rate_hz` = -3 is out of range"), "{e}");
    }
}
