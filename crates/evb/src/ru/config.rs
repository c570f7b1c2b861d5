//! The configuration of the `ru` kind: every key, documented, range-checked by
//! [`RuConfig::validate`].

use daqflow_component::schema::{Key, Schema};
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
    /// Time-stamp profiling: the profile written here at each stop (`{run}`: the run number, `{name}`: the component's name).
    pub profile: Option<std::path::PathBuf>,
    /// With `profile`: time stamps kept per thread.
    pub profile_stamps: usize,
    /// CPUs the RU's thread is pinned to (`[0, 1]`): it receives the sources' fragments and sends super-fragments to the BUs. None: not pinned.
    pub io_cpus: Option<Vec<usize>>,
}

/// The typed schema of the `ru` kind's configuration: every key's type, range, unit and
/// default (`docs/operator-guide.md`, "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("ru")
        .key(Key::integer("id", 0, u32::MAX.into(), "The RU's id: it names its super-fragments to the EVM and the BUs.").unique())
        .key(Key::address("evm", "The EVM's address."))
        .key(Key::address("listen", "Address sources and BUs connect to (port 0: any free port)."))
        .key(crate::common::advertise_key())
        .key(Key::integer("streams", 1, 4096, "Number of source streams."))
        .key(Key::bool("check_crc", "Check each fragment's payload CRC on arrival."))
        .key(Key::integer("buffer_bytes", 1, 1 << 40, "Most bytes of fragments stored (read-ahead, assigned and unconfirmed, incomplete); more than `max_fragment_bytes`.").unit("bytes"))
        .key(Key::integer("read_ahead_bytes", 1, 1 << 40, "Bytes of fragments of events not yet assigned stored before streams past every assigned event stop being read; at most `buffer_bytes`.").unit("bytes"))
        .key(Key::integer("max_fragments", 1, 1 << 26, "Most fragments stored; events read ahead take at most half of them."))
        .key(Key::integer("max_fragment_bytes", 64, 1 << 30, "Largest fragment expected; the streams are read only while this much room is left.").unit("bytes"))
        .key(Key::integer("send_queue_bytes", 4096, 16 << 20, "Most bytes queued towards one BU before its super-fragments wait.").unit("bytes"))
        .key(Key::integer("end_timeout_ms", 1, 3_600_000, "How long `stop` waits for the EVM's end of run.").unit("ms"))
        .key(Key::integer("connect_timeout_ms", 1, 3_600_000, "How long `start` retries connecting to the EVM, and a BU's early connection is held.").unit("ms"))
        .key(crate::common::idle_key("the RU's scheduler"))
        .keys(crate::common::profile_keys("the RU"))
        .key(crate::common::cpus_key("io_cpus", "the RU's thread (receives the sources' fragments, sends super-fragments)"))
        .output(Key::address("listen", "The address sources and BUs are configured with (`advertise`, or the bound address)."))
        .defaults_from(&RuConfig::default())
}

impl RuConfig {
    /// Checks every key against the [`schema`] and the rules between keys; every problem names
    /// its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("ru");
        c.schema(&schema(), self);
        c.advertise(self.advertise.as_deref());
        if self.buffer_bytes <= self.max_fragment_bytes {
            c.problem(
                "buffer_bytes",
                format!("= {} must be more than max_fragment_bytes = {}", self.buffer_bytes, self.max_fragment_bytes),
            );
        }
        if self.read_ahead_bytes > self.buffer_bytes {
            c.problem(
                "read_ahead_bytes",
                format!("= {} must be at most buffer_bytes = {}", self.read_ahead_bytes, self.buffer_bytes),
            );
        }
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
            profile: None,
            profile_stamps: 1 << 20,
            io_cpus: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&RuConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

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
