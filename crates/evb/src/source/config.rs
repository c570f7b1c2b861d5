//! The configuration of the `source` kind: every key, documented, range-checked by
//! [`SourceConfig::validate`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::EvbError;
use crate::model::SizeModel;

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
    /// Flip one payload byte of this event after the CRC is computed (to test detection).
    pub corrupt_event: Option<u64>,
    /// Seed of the size model.
    pub seed: u64,
    /// How long (ms) `start` retries connecting.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for a stream its RU no longer reads before cutting it.
    pub stop_timeout_ms: u64,
}

impl SourceConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("source");
        c.address("ru", &self.ru);
        if let Err(e) = self.size.validate() {
            c.problem("size", e);
        }
        c.int("max_bytes", self.max_bytes as u64, 1, 1 << 30);
        c.float("rate_hz", self.rate_hz, 0.0, 1e9);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000);
        c.int("stop_timeout_ms", self.stop_timeout_ms, 1, 3_600_000);
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
    fn every_key_out_of_range_is_named() {
        assert!(SourceConfig::default().validate().is_ok());
        let bad = SourceConfig { ru: "127.0.0.1:123456".into(), rate_hz: -3.0, max_bytes: 0, ..Default::default() };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration: source: `ru` = \"127.0.0.1:123456\""), "{e}");
        assert!(e.contains("`max_bytes` = 0 is out of range") && e.contains("`rate_hz` = -3 is out of range"), "{e}");
    }
}
