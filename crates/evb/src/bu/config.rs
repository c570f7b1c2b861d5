//! The configuration of the `bu` kind: every key, documented, range-checked by
//! [`BuConfig::validate`].

use std::path::PathBuf;

use daqflow_component::provenance::Digest;
use daqflow_component::schema::{Key, Schema};
use serde::{Deserialize, Serialize};

use crate::{EvbError, Idle};

/// Where built events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// Nowhere (for measurements): confirmed once built and checked.
    #[default]
    Discard,
    /// Data files in `directory`, one stream per builder thread.
    Files,
    /// The ET system named `et`.
    Et,
}

/// When a BU confirms an event put into its ET system to the EVM (after which the EVM no longer
/// re-assigns it if the BU dies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EtConfirm {
    /// Once it is in the ET system: survives the BU's death, not the ET system's.
    #[default]
    Put,
    /// Once every station's consumers are done with it (the recorder wrote it): survives the
    /// death of the whole host. Needs `threads = 1` and the BU as the ET system's only producer.
    Consumed,
}

/// Configuration of a builder unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BuConfig {
    /// The BU's id, unique in the run.
    pub id: u32,
    /// The EVM's address.
    pub evm: String,
    /// Most events in flight (assigned and not yet confirmed); see also `max_bytes_in_flight`.
    pub credits: u32,
    /// Credits are handed back in groups of this many.
    pub request_batch: u32,
    /// Most bytes of events in flight (assigned, not yet confirmed), estimated from the mean
    /// size of the events built so far: credits are withheld above it, so that large events do
    /// not take more memory in the RUs than they have. The first request asks for one
    /// `request_batch`, before any event size is known.
    pub max_bytes_in_flight: u64,
    /// Builder threads.
    pub threads: usize,
    /// Verify every fragment's CRC (event ids and structure are always checked).
    pub check_crc: bool,
    /// Where built events go.
    pub output: Output,
    /// Directory of the data files (`output = "files"`).
    pub directory: PathBuf,
    /// A data file is closed and the next opened at this size.
    pub max_file_bytes: u64,
    /// Name of the ET system (`output = "et"`).
    pub et: String,
    /// With `output = "et"`: confirm an event to the EVM once it is in the ET system (`put`), or
    /// once every consumer is done with it (`consumed`: the recorder wrote it), so that an event
    /// lost with the BU's whole host is built again elsewhere.
    pub et_confirm: EtConfirm,
    /// Written events are flushed to the operating system (and then confirmed) at least this
    /// often (ms), and sooner by the byte and event thresholds of [`super::FlushRule`].
    pub flush_interval_ms: u64,
    /// The BU tells the EVM it is alive at least this often (ms).
    pub heartbeat_ms: u64,
    /// How long (ms) `stop` waits for the EVM's end of run.
    pub end_timeout_ms: u64,
    /// How long (ms) `start` retries connecting to the EVM and the RUs.
    pub connect_timeout_ms: u64,
    /// Idle strategy of the BU's schedulers.
    pub idle: Idle,
    /// Time-stamp profiling: the profile written here at each stop (`{run}`: the run number, `{name}`: the component's name).
    pub profile: Option<std::path::PathBuf>,
    /// With `profile`: time stamps kept per thread.
    pub profile_stamps: usize,
    /// CPUs the BU's I/O thread is pinned to (`[0, 1]`): it receives super-fragments from the
    /// RUs and talks with the EVM. None: not pinned.
    pub io_cpus: Option<Vec<usize>>,
    /// CPUs the builder threads are pinned to (each of the `threads` may run on any of them):
    /// they build and check events and write them to the output. None: not pinned.
    pub build_cpus: Option<Vec<usize>>,
    /// The digest of the system file the run was configured from (64 hex digits), written in
    /// every data file's header. Reserved: the operator sets it (`docs/operator-guide.md`,
    /// "Provenance"); without it the headers hold zeros.
    pub system_digest: Option<Digest>,
    /// Disk throttling (`output = "files"`): above this usage (percent of the filesystem
    /// holding `directory`) the BU asks the EVM for no more events (the events already
    /// assigned are still built and written) until usage falls below `throttle_low_pct`.
    /// `100` turns it off.
    pub throttle_high_pct: f64,
    /// A throttled BU asks for events again below this usage (percent; below
    /// `throttle_high_pct`).
    pub throttle_low_pct: f64,
    /// How often (ms) the free space is read.
    pub throttle_check_ms: u64,
}

impl BuConfig {
    /// The disk throttling marks, `throttle_high_pct` and `throttle_low_pct`.
    pub fn disk_marks(&self) -> daqflow_wire::file::DiskMarks {
        daqflow_wire::file::DiskMarks { high_pct: self.throttle_high_pct, low_pct: self.throttle_low_pct }
    }

    /// Checks every key against the [`schema`] and the rules between keys; every problem names
    /// its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("bu");
        c.schema(&schema(), self);
        if self.request_batch > self.credits {
            c.problem("request_batch", format!("= {} must be at most credits = {}", self.request_batch, self.credits));
        }
        if self.output == Output::Files && self.directory.as_os_str().is_empty() {
            c.problem("directory", "must not be empty with output = \"files\"");
        }
        if self.output == Output::Et && self.et.trim().is_empty() {
            c.problem("et", "is required with output = \"et\" (the ET system's name)");
        }
        if self.et_confirm == EtConfirm::Consumed && self.output != Output::Et {
            c.problem("et_confirm", "= \"consumed\" needs output = \"et\"");
        }
        if self.et_confirm == EtConfirm::Consumed && self.threads != 1 {
            c.problem(
                "et_confirm",
                "= \"consumed\" needs threads = 1 (each flush waits until the ET system is drained)",
            );
        }
        if let Err((key, what)) = self.disk_marks().check() {
            c.problem(key, what);
        }
        c.finish()
    }
}

/// The typed schema of the `bu` kind's configuration: every key's type, range, unit and
/// default (`docs/operator-guide.md`, "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("bu")
        .key(Key::integer("id", 0, u32::MAX.into(), "The BU's id: the EVM takes one builder unit of each id at a time.").unique())
        .key(Key::address("evm", "The EVM's address."))
        .key(Key::integer("credits", 1, 1 << 20, "Most events in flight (assigned and not yet confirmed); see also `max_bytes_in_flight`."))
        .key(Key::integer("request_batch", 1, 1 << 20, "Credits are handed back in groups of this many; at most `credits`."))
        .key(Key::integer("max_bytes_in_flight", 1 << 10, 1 << 40, "Most bytes of events in flight, estimated from the mean event size so far: credits are withheld above it.").unit("bytes"))
        .key(Key::integer("threads", 1, 64, "Builder threads."))
        .key(Key::bool("check_crc", "Verify every fragment's CRC (event ids and structure are always checked)."))
        .key(Key::choice("output", &["discard", "files", "et"], "Where built events go: nowhere (measurements), data files in `directory`, or the ET system `et`."))
        .key(Key::path("directory", "Directory of the data files (`output = \"files\"`)."))
        .key(Key::integer("max_file_bytes", 1 << 16, 1 << 40, "A data file is closed and the next opened at this size.").unit("bytes"))
        .key(Key::new("et", daqflow_component::schema::Type::Text { empty: true }, "Name of the ET system (required with `output = \"et\"`)."))
        .key(Key::choice("et_confirm", &["put", "consumed"], "With `output = \"et\"`: confirm an event once it is in the ET system, or once every consumer is done with it (needs `threads = 1`)."))
        .key(Key::integer("flush_interval_ms", 1, 60_000, "Written events are flushed (and then confirmed) at least this often, and as soon as half a builder thread's share of `credits` or of `max_bytes_in_flight` waits.").unit("ms"))
        .key(Key::integer("heartbeat_ms", 1, 60_000, "The BU tells the EVM it is alive at least this often.").unit("ms"))
        .key(Key::integer("end_timeout_ms", 1, 3_600_000, "How long `stop` waits for the EVM's end of run.").unit("ms"))
        .key(Key::integer("connect_timeout_ms", 1, 3_600_000, "How long `start` retries connecting to the EVM and the RUs.").unit("ms"))
        .key(crate::common::idle_key("the BU's schedulers"))
        .keys(crate::common::profile_keys("the BU"))
        .key(crate::common::cpus_key("io_cpus", "the BU's I/O thread (receives super-fragments, talks with the EVM)"))
        .key(crate::common::cpus_key("build_cpus", "every builder thread (builds, checks and writes events; each may run on any of them)"))
        .key(daqflow_component::provenance::schema_key())
        .key(Key::float("throttle_high_pct", 0.0, 100.0, "Disk throttling (`output = \"files\"`): above this usage of `directory`'s filesystem the BU asks for no more events; 100: off.").unit("%"))
        .key(Key::float("throttle_low_pct", 0.0, 100.0, "A throttled BU asks for events again below this usage (below `throttle_high_pct`).").unit("%"))
        .key(Key::integer("throttle_check_ms", 1, 60_000, "How often the free space is read.").unit("ms"))
        .defaults_from(&BuConfig::default())
}

impl Default for BuConfig {
    fn default() -> Self {
        BuConfig {
            id: 0,
            evm: "127.0.0.1:7100".into(),
            credits: 1024,
            request_batch: 32,
            max_bytes_in_flight: 16 << 20,
            threads: 1,
            check_crc: true,
            output: Output::Discard,
            directory: PathBuf::from("data"),
            max_file_bytes: 1 << 30,
            et: String::new(),
            et_confirm: EtConfirm::Put,
            flush_interval_ms: 20,
            heartbeat_ms: 200,
            end_timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            idle: Idle::Lazy,
            profile: None,
            profile_stamps: 1 << 20,
            io_cpus: None,
            build_cpus: None,
            system_digest: None,
            throttle_high_pct: daqflow_wire::file::DiskMarks::DEFAULT.high_pct,
            throttle_low_pct: daqflow_wire::file::DiskMarks::DEFAULT.low_pct,
            throttle_check_ms: 100,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&BuConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn every_key_out_of_range_is_named() {
        assert!(BuConfig::default().validate().is_ok());
        let bad = BuConfig { credits: 0, threads: 65, max_file_bytes: 0, output: Output::Et, ..Default::default() };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.starts_with("configuration: bu: `credits` = 0 is out of range: 1 … 1048576"), "{e}");
        assert!(e.contains("`threads` = 65 is out of range: 1 … 64"), "{e}");
        assert!(e.contains("`max_file_bytes` = 0 is out of range"), "{e}");
        assert!(e.contains("`et` is required with output = \"et\""), "{e}");
        let files = BuConfig { output: Output::Files, directory: PathBuf::new(), ..Default::default() };
        assert!(files.validate().unwrap_err().to_string().contains("`directory` must not be empty"));
        let consumed = BuConfig { et_confirm: EtConfirm::Consumed, threads: 2, ..Default::default() };
        let e = consumed.validate().unwrap_err().to_string();
        assert!(e.contains("`et_confirm` = \"consumed\" needs output = \"et\""), "{e}");
        assert!(e.contains("needs threads = 1"), "{e}");
        let marks = BuConfig { throttle_high_pct: 80.0, throttle_low_pct: 85.0, ..Default::default() };
        let e = marks.validate().unwrap_err().to_string();
        assert!(e.contains("`throttle_low_pct` = 85 must be at least 0 and below throttle_high_pct = 80"), "{e}");
    }
}
