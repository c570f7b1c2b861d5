//! The configuration of the `recorder` kind: every key, documented, checked by [`RecorderConfig::check`].

use std::path::PathBuf;

use daqflow_component::ComponentError;
use daqflow_component::State;
use daqflow_component::provenance::Digest;
use daqflow_component::schema::{ANY_STATE, DRAIN_INTO_RESERVE_KEY, Key, Schema};
use serde::{Deserialize, Serialize};

/// Configuration of a `recorder`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecorderConfig {
    /// The ET system to consume from (its name).
    pub et: String,
    /// The station (created if missing; default: the component's name).
    #[serde(default)]
    pub station: Option<String>,
    /// A farm: the name of a parallel group of stations that this recorder's station joins, with
    /// the other recorders (and ET consumers) naming the same group on the same ET system; each
    /// event goes to one member, and the events of a member that dies go to the others
    /// (`RestoreMode::Redistribute`). The group's first station, named after the group, holds
    /// its policy and takes no events. None: a station of its own.
    #[serde(default)]
    pub group: Option<String>,
    /// How the group picks its member: `round_robin` (in turn) or `shortest_queue` (the fewest
    /// events waiting). The same for every member of the group.
    #[serde(default = "default_group_policy")]
    pub group_policy: String,
    /// Where the files go (created if missing).
    pub directory: PathBuf,
    /// A file is closed and the next opened before it would grow beyond this.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// Events taken from ET per call.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Which events: `all`, or `match:A,B,C,D` on the control words (`*` for any; word 0 is
    /// the trigger type, word 1 the builder's event flags).
    #[serde(default = "default_select")]
    pub select: String,
    /// Record every Nth selected event.
    #[serde(default = "default_one")]
    pub prescale: u32,
    /// At stop, how long the station must stay empty before the files are closed.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// At stop, give up draining after this long (the summary says how many events were left).
    #[serde(default = "default_stop_timeout_ms")]
    pub stop_timeout_ms: u64,
    /// `fsync` each file when it is closed.
    #[serde(default = "default_true")]
    pub sync_on_close: bool,
    /// The digest of the system file the run was configured from (64 hex digits), written in
    /// every data file's header. Reserved: the operator sets it (`docs/operator-guide.md`,
    /// "Provenance"); without it the headers hold zeros.
    #[serde(default)]
    pub system_digest: Option<Digest>,
    /// Disk throttling: above this usage (percent of the filesystem holding `directory`) the
    /// recorder stops taking events from its station until usage falls below
    /// `throttle_low_pct`; ET's back-pressure then holds the builder. `100` turns it off.
    #[serde(default = "default_throttle_high_pct")]
    pub throttle_high_pct: f64,
    /// A throttled recorder takes events again below this usage (percent; below
    /// `throttle_high_pct`).
    #[serde(default = "default_throttle_low_pct")]
    pub throttle_low_pct: f64,
    /// How often (ms) the free space is read.
    #[serde(default = "default_throttle_check_ms")]
    pub throttle_check_ms: u64,
    /// Live in a run only, set by the operator: `true` makes the recorder write into its
    /// disk's reserve now, throttled or not (the space above `throttle_high_pct`, down to the
    /// floor: half of it stays free), until the run ends. The operator sets it on a recorder
    /// throttled by its disk when the run stops (for a full disk, `[system]
    /// disk_full_stop_s`, or by hand), before the producers' stop, so that what is in flight
    /// drains through ET; `false` in the configuration (refused otherwise).
    #[serde(default)]
    pub drain_into_reserve: bool,
}

fn default_throttle_high_pct() -> f64 {
    daqflow_wire::file::DiskMarks::DEFAULT.high_pct
}
fn default_throttle_low_pct() -> f64 {
    daqflow_wire::file::DiskMarks::DEFAULT.low_pct
}
fn default_throttle_check_ms() -> u64 {
    100
}

fn default_group_policy() -> String {
    "round_robin".into()
}

/// The values of `group_policy`, as the ET system calls them.
pub const GROUP_POLICIES: [(&str, crate::GroupPolicy); 2] =
    [("round_robin", crate::GroupPolicy::RoundRobin), ("shortest_queue", crate::GroupPolicy::ShortestQueue)];

fn default_max_file_bytes() -> u64 {
    1 << 30
}
fn default_batch() -> usize {
    100
}
fn default_select() -> String {
    "all".into()
}
fn default_one() -> u32 {
    1
}
fn default_drain_ms() -> u64 {
    500
}
fn default_stop_timeout_ms() -> u64 {
    30_000
}
fn default_true() -> bool {
    true
}

/// The typed schema of the `recorder` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    let sample: RecorderConfig =
        toml::from_str("et = \"et\"\ndirectory = \"data\"").expect("a recorder's smallest configuration");
    Schema::new("recorder")
        .key(Key::text("et", "The ET system's name.").required())
        .key(Key::text("station", "Its station (blocking; the events of a dead recorder go back to its input, in a `group` to the other members); default: the component's name."))
        .key(Key::text("group", "A farm: the parallel group of stations its station joins (each event to one member; a dead member's events go to the others); the group's first station is named after it. Default: a station of its own."))
        .key(Key::choice("group_policy", &["round_robin", "shortest_queue"], "How the group picks the member of each event: in turn, or the fewest events waiting; the same for every member."))
        .key(Key::path("directory", "Where the data files go.").required())
        .key(
            Key::integer("max_file_bytes", 1 << 16, 1 << 40, "A data file is closed and the next opened at this size; live: from the next run.")
                .unit("bytes")
                .live(&[State::Configured]),
        )
        .key(Key::integer("batch", 1, 100_000, "Events taken from the station at a time."))
        .key(Key::text("select", "`all`, or `match:A,B,C,D` on the control words (word 0 the trigger type, word 1 the builder's event flags; `*` for any)."))
        .key(Key::integer("prescale", 1, 1_000_000, "Its station takes one event in this many.").live(ANY_STATE))
        .key(Key::integer("drain_ms", 1, 600_000, "At stop, how long the station is drained after the producers stopped.").unit("ms"))
        .key(Key::integer("stop_timeout_ms", 1, 86_400_000, "How long `stop` waits for the drain and the last file's close.").unit("ms"))
        .key(Key::bool("sync_on_close", "Sync each file to disk when it is closed."))
        .key(daqflow_component::provenance::schema_key())
        .key(Key::float("throttle_high_pct", 0.0, 100.0, "Disk throttling: above this usage of `directory`'s filesystem it takes no events; 100: off.").unit("%"))
        .key(Key::float("throttle_low_pct", 0.0, 100.0, "A throttled recorder takes events again below this usage (below `throttle_high_pct`).").unit("%"))
        .key(Key::integer("throttle_check_ms", 1, 60_000, "How often the free space is read.").unit("ms"))
        .key(
            Key::bool(DRAIN_INTO_RESERVE_KEY, "Set by the operator, not by `set`, when a run stops while the recorder is throttled by its disk: `true` writes into the disk's reserve above `throttle_high_pct` now, throttled or not, until the run ends (half of the reserve stays free).")
                .live(&[State::Running, State::Paused]),
        )
        .output(Key::text("station", "Its ET station."))
        .output(Key::path("directory", "Where its data files go."))
        .defaults_from(&sample)
}

impl RecorderConfig {
    /// The disk throttling marks, `throttle_high_pct` and `throttle_low_pct`.
    pub fn disk_marks(&self) -> daqflow_wire::file::DiskMarks {
        daqflow_wire::file::DiskMarks { high_pct: self.throttle_high_pct, low_pct: self.throttle_low_pct }
    }

    /// The ET group policy of `group_policy`.
    pub fn group_policy(&self) -> crate::GroupPolicy {
        GROUP_POLICIES.iter().find(|(n, _)| *n == self.group_policy).map_or_else(Default::default, |p| p.1)
    }

    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
        if let Some(g) = &self.group {
            let station = self.station.as_deref().unwrap_or(name);
            if g.is_empty() || g.len() > 64 || g == crate::GRAND_CENTRAL {
                c.problem("group", format!("= {g:?}: a station name (1 to 64 bytes, not {})", crate::GRAND_CENTRAL));
            } else if g == station {
                c.problem(
                    "group",
                    format!("= {g:?} is also its station's name: the group's first station is named after the group"),
                );
            }
        }
        if let Err(e) = crate::Selection::parse(&self.select) {
            c.problem("select", format!("= {:?}: {e}", self.select));
        }
        if let Err((key, what)) = self.disk_marks().check() {
            c.problem(key, what);
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems =
            schema().struct_problems(&toml::from_str::<RecorderConfig>("et = \"et\"\ndirectory = \"data\"").unwrap());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
