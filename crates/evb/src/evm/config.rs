//! The configuration of the `evm` kind: every key, documented, range-checked by
//! [`EvmConfig::validate`].

use daqflow_component::schema::{Key, Schema};
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
    /// Time-stamp profiling: the profile written here at each stop (`{run}`: the run number, `{name}`: the component's name).
    pub profile: Option<std::path::PathBuf>,
    /// With `profile`: time stamps kept per thread.
    pub profile_stamps: usize,
    /// CPUs the EVM's thread is pinned to (`[0, 1]`): it takes triggers, assigns events to BUs and tells every RU. None: not pinned.
    pub io_cpus: Option<Vec<usize>>,
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
            profile: None,
            profile_stamps: 1 << 20,
            io_cpus: None,
        }
    }
}

/// The typed schema of the `evm` kind's configuration: every key's type, range, unit and
/// default (`docs/operator-guide.md`, "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("evm")
        .key(Key::address("listen", "Address RUs, BUs and a trigger source connect to (port 0: any free port)."))
        .key(crate::common::advertise_key())
        .key(Key::integer("rus", 1, 4096, "Number of RUs in the run; assignments start once all have connected."))
        .key(Key::choice("trigger", &["emulated", "source"], "Where triggers come from: emulated level-1 accepts, or trigger fragments from a source with `role = \"trigger\"`."))
        .key(Key::float("rate_hz", 0.0, 1e9, "Emulated trigger rate; 0: as fast as the BUs ask (free-running).").unit("Hz"))
        .key(Key::float("reject_fraction", 0.0, 1.0, "Fraction of events the level-2 emulation rejects (1 only with `rate_hz` > 0 or `trigger = \"source\"`)."))
        .key(Key::integer("reject_group", 1, 1_000_000, "Rejects per grouped reject message to the RUs (ATLAS: 10)."))
        .key(Key::integer("release_group", 1, 1_000_000, "Releases (built events) per grouped discard message to the RUs."))
        .key(Key::integer("assign_batch", 1, 65_536, "Most events in one assignment."))
        .key(Key::integer("assign_timeout_ms", 0, 60_000, "A smaller assignment goes out when its oldest trigger waited this long.").unit("ms"))
        .key(Key::integer("bu_timeout_ms", 1, 3_600_000, "A BU silent this long is taken for dead and its events re-assigned.").unit("ms"))
        .key(Key::integer("drain_timeout_ms", 0, 3_600_000, "After stop, how long the drain may go without an event built before it gives up (the rest is lost, with the BU that held it).").unit("ms"))
        .key(Key::integer("stall_timeout_ms", 0, 86_400_000, "The run fails as stalled when events are in flight and none is built for this long while not paused; 0: never.").unit("ms"))
        .key(Key::integer("max_pending", 1, 1 << 26, "Most triggers waiting for a BU; a trigger source is not read beyond it."))
        .key(Key::integer("seed", 0, i64::MAX, "Seed of the level-2 emulation."))
        .key(crate::common::idle_key("the EVM's scheduler"))
        .keys(crate::common::profile_keys("the EVM"))
        .key(crate::common::cpus_key("io_cpus", "the EVM's thread (triggers, assignments, credits)"))
        .output(Key::address("listen", "The address RUs, BUs and a trigger source are configured with (`advertise`, or the bound address)."))
        .summary(Key::integer("last_event", 0, i64::MAX, "The last event id triggered in the run (a source's `stop_arg`)."))
        .defaults_from(&EvmConfig::default())
}

impl EvmConfig {
    /// Checks every key against the [`schema`] and the rules between keys; every problem names
    /// its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("evm");
        c.schema(&schema(), self);
        c.advertise(self.advertise.as_deref());
        if self.reject_fraction >= 1.0 && self.rate_hz == 0.0 && self.trigger == TriggerMode::Emulated {
            c.problem("reject_fraction", "= 1 with on-demand triggers would trigger forever");
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&EvmConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

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
