//! The configuration of the `recorder` kind: every key, documented, checked by [`RecorderConfig::check`].

use std::path::PathBuf;

use daqflow_component::ComponentError;
use daqflow_component::provenance::Digest;
use serde::Deserialize;

/// Configuration of a `recorder`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecorderConfig {
    /// The ET system to consume from (its name).
    pub et: String,
    /// The station (created if missing; default: the component's name).
    #[serde(default)]
    pub station: Option<String>,
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

impl RecorderConfig {
    /// The disk throttling marks, `throttle_high_pct` and `throttle_low_pct`.
    pub fn disk_marks(&self) -> daqflow_wire::file::DiskMarks {
        daqflow_wire::file::DiskMarks { high_pct: self.throttle_high_pct, low_pct: self.throttle_low_pct }
    }

    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.text("et", &self.et);
        if let Some(s) = &self.station {
            c.text("station", s);
        }
        c.text("directory", &self.directory.to_string_lossy());
        c.int("max_file_bytes", self.max_file_bytes, 1 << 16, 1 << 40);
        c.int("batch", self.batch as u64, 1, 100_000);
        if let Err(e) = crate::Selection::parse(&self.select) {
            c.problem("select", format!("= {:?}: {e}", self.select));
        }
        c.int("prescale", self.prescale.into(), 1, 1_000_000);
        c.int("drain_ms", self.drain_ms, 1, 600_000);
        c.int("stop_timeout_ms", self.stop_timeout_ms, 1, 86_400_000);
        if let Err((key, what)) = self.disk_marks().check() {
            c.problem(key, what);
        }
        c.int("throttle_check_ms", self.throttle_check_ms, 1, 60_000);
        c.finish()
    }
}
