//! The configuration of the `ru` kind: every key, documented, range-checked by
//! [`RuConfig::validate`].

use serde::{Deserialize, Serialize};

use crate::{EvbError, Idle};

/// Configuration of a readout unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuConfig {
    /// The RU's id, unique in the run.
    pub id: u32,
    /// The EVM's address.
    pub evm: String,
    /// Address sources and BUs connect to (port 0: any free port).
    pub listen: String,
    /// The address told to sources and BUs (`HOST` or `HOST:PORT`), when `listen` is not one
    /// they reach. Default: the bound address; for a wildcard `listen` (`0.0.0.0:PORT`), this
    /// host's address on the network towards the control server.
    pub advertise: Option<String>,
    /// Number of source streams.
    pub streams: usize,
    /// Check each fragment's payload CRC on arrival.
    pub check_crc: bool,
    /// Most bytes of fragments stored: the read-ahead, the events assigned to BUs and not yet
    /// confirmed, and those waiting for their last fragments. Full, no stream is read.
    pub buffer_bytes: usize,
    /// Bytes of fragments of events not yet assigned (or rejected) stored before the streams
    /// that are past every assigned event stop being read (back-pressure to the sources). Small
    /// keeps fragments in the cache until they are sent.
    pub read_ahead_bytes: usize,
    /// Most fragments stored; events read ahead take at most half of them.
    pub max_fragments: usize,
    /// Largest fragment expected; the streams are read only while this much room is left.
    pub max_fragment_bytes: usize,
    /// Most bytes queued towards one BU before its super-fragments wait.
    pub send_queue_bytes: usize,
    /// How long (ms) `stop` waits for the EVM's end of run.
    pub end_timeout_ms: u64,
    /// How long (ms) `start` retries connecting to the EVM; and how long a BU's connection is
    /// held before it is closed, when it waits for the EVM's BU gone of an earlier generation of
    /// its id or for a live connection with its id and generation to go.
    pub connect_timeout_ms: u64,
    /// Idle strategy of the RU's scheduler.
    pub idle: Idle,
}

impl RuConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("ru");
        c.address("evm", &self.evm);
        c.address("listen", &self.listen);
        c.advertise(self.advertise.as_deref());
        c.int("streams", self.streams as u64, 1, 4096);
        c.int("max_fragment_bytes", self.max_fragment_bytes as u64, 64, 1 << 30);
        c.int("buffer_bytes", self.buffer_bytes as u64, self.max_fragment_bytes as u64 + 1, 1 << 40);
        c.int("read_ahead_bytes", self.read_ahead_bytes as u64, 1, self.buffer_bytes as u64);
        c.int("max_fragments", self.max_fragments as u64, 1, 1 << 26);
        c.int("send_queue_bytes", self.send_queue_bytes as u64, 4096, 16 << 20);
        c.int("end_timeout_ms", self.end_timeout_ms, 1, 3_600_000);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000);
        c.finish()
    }
}

impl Default for RuConfig {
    fn default() -> Self {
        RuConfig {
            id: 0,
            evm: "127.0.0.1:7100".into(),
            listen: "127.0.0.1:0".into(),
            advertise: None,
            streams: 1,
            check_crc: true,
            buffer_bytes: 128 << 20,
            read_ahead_bytes: 4 << 20,
            max_fragments: 1 << 18,
            max_fragment_bytes: 1 << 20,
            send_queue_bytes: 8 << 20,
            end_timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            idle: Idle::Lazy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_out_of_range_is_named() {
        assert!(RuConfig::default().validate().is_ok());
        let bad = RuConfig { streams: 0, send_queue_bytes: 1_000_000_000, evm: "no port".into(), ..Default::default() };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration: ru: `evm` = \"no port\" is not an address"), "{e}");
        assert!(e.contains("`streams` = 0 is out of range: 1 … 4096"), "{e}");
        assert!(e.contains("`send_queue_bytes` = 1000000000 is out of range: 4096 … 16777216"), "{e}");
    }
}
