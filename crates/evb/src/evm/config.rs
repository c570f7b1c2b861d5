//! The configuration of the `evm` kind: every key, documented, range-checked by
//! [`EvmConfig::validate`].

use serde::{Deserialize, Serialize};

use crate::{EvbError, Idle};

/// Where the EVM's triggers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TriggerMode {
    /// Emulated level-1 accepts: on demand (as fast as the BUs ask) or at `rate_hz`.
    #[default]
    Emulated,
    /// Trigger fragments from a source process connected with role `trigger`.
    Source,
}

/// Configuration of the EVM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvmConfig {
    /// Address RUs, BUs and a trigger source connect to (port 0: any free port).
    pub listen: String,
    /// The address answered at configure (what RUs, BUs and a trigger source are configured
    /// with), `HOST` or `HOST:PORT`. Default: the bound address; for a wildcard `listen`, this
    /// host's address on the network towards the control server.
    pub advertise: Option<String>,
    /// Number of RUs in the run; assignments start once all have connected.
    pub rus: usize,
    /// Where triggers come from.
    pub trigger: TriggerMode,
    /// Emulated trigger rate in Hz; 0: as fast as the BUs ask (free-running).
    pub rate_hz: f64,
    /// Fraction of events the level-2 emulation rejects.
    pub reject_fraction: f64,
    /// Rejects per grouped reject message to the RUs (ATLAS: 10).
    pub reject_group: usize,
    /// Releases (built events) per grouped discard message to the RUs.
    pub release_group: usize,
    /// Most events in one assignment.
    pub assign_batch: u32,
    /// A smaller assignment goes out when its oldest trigger waited this long (ms).
    pub assign_timeout_ms: u64,
    /// A BU silent this long (ms) is taken for dead and its events re-assigned.
    pub bu_timeout_ms: u64,
    /// After stop, how long (ms) the drain may go without an event built before it gives up
    /// waiting for every event (the rest is accounted lost, with the BU that held them).
    pub drain_timeout_ms: u64,
    /// The builder is stalled when events are in flight and none has been built (or rejected)
    /// for this long (ms) while the run is not paused: the run then fails with the reason
    /// (which BUs wait for which events). 0: never. Default 30 s.
    pub stall_timeout_ms: u64,
    /// Most triggers waiting for a BU; a trigger source is not read beyond it.
    pub max_pending: usize,
    /// Seed of the level-2 emulation.
    pub seed: u64,
    /// Idle strategy of the EVM's scheduler.
    pub idle: Idle,
}

impl Default for EvmConfig {
    fn default() -> Self {
        EvmConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            rus: 1,
            trigger: TriggerMode::Emulated,
            rate_hz: 0.0,
            reject_fraction: 0.0,
            reject_group: 10,
            release_group: 64,
            assign_batch: 32,
            assign_timeout_ms: 5,
            bu_timeout_ms: 3000,
            drain_timeout_ms: 10_000,
            stall_timeout_ms: 30_000,
            max_pending: 1 << 20,
            seed: 1,
            idle: Idle::Lazy,
        }
    }
}

impl EvmConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("evm");
        c.address("listen", &self.listen);
        c.advertise(self.advertise.as_deref());
        c.int("rus", self.rus as u64, 1, 4096);
        c.float("rate_hz", self.rate_hz, 0.0, 1e9);
        c.float("reject_fraction", self.reject_fraction, 0.0, 1.0);
        if self.reject_fraction >= 1.0 && self.rate_hz == 0.0 && self.trigger == TriggerMode::Emulated {
            c.problem("reject_fraction", "= 1 with on-demand triggers would trigger forever");
        }
        c.int("reject_group", self.reject_group as u64, 1, 1_000_000);
        c.int("release_group", self.release_group as u64, 1, 1_000_000);
        c.int("assign_batch", self.assign_batch.into(), 1, 65_536);
        c.int("assign_timeout_ms", self.assign_timeout_ms, 0, 60_000);
        c.int("bu_timeout_ms", self.bu_timeout_ms, 1, 3_600_000);
        c.int("drain_timeout_ms", self.drain_timeout_ms, 0, 3_600_000);
        c.int("stall_timeout_ms", self.stall_timeout_ms, 0, 86_400_000);
        c.int("max_pending", self.max_pending as u64, 1, 1 << 26);
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_out_of_range_is_named() {
        assert!(EvmConfig::default().validate().is_ok());
        let bad = EvmConfig { rus: 0, reject_fraction: 2.0, listen: "127.0.0.1:70000".into(), ..Default::default() };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration: evm: `listen` = \"127.0.0.1:70000\" is not an address"), "{e}");
        assert!(e.contains("`rus` = 0 is out of range: 1 … 4096"), "{e}");
        assert!(e.contains("`reject_fraction` = 2 is out of range: 0 … 1"), "{e}");
        let forever = EvmConfig { reject_fraction: 1.0, ..Default::default() };
        assert!(forever.validate().unwrap_err().to_string().contains("would trigger forever"));
    }
}
