//! The configuration of the `bu` kind: every key, documented, range-checked by
//! [`BuConfig::validate`].

use std::path::PathBuf;

use daqflow_component::provenance::Digest;
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
    /// often (ms).
    pub flush_interval_ms: u64,
    /// The BU tells the EVM it is alive at least this often (ms).
    pub heartbeat_ms: u64,
    /// How long (ms) `stop` waits for the EVM's end of run.
    pub end_timeout_ms: u64,
    /// How long (ms) `start` retries connecting to the EVM and the RUs.
    pub connect_timeout_ms: u64,
    /// Idle strategy of the BU's schedulers.
    pub idle: Idle,
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

    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::common::Checks::new("bu");
        c.address("evm", &self.evm);
        c.int("credits", self.credits.into(), 1, 1 << 20);
        c.int("request_batch", self.request_batch.into(), 1, self.credits.max(1).into());
        c.int("max_bytes_in_flight", self.max_bytes_in_flight, 1 << 10, 1 << 40);
        c.int("threads", self.threads as u64, 1, 64);
        if self.output == Output::Files && self.directory.as_os_str().is_empty() {
            c.problem("directory", "must not be empty with output = \"files\"");
        }
        c.int("max_file_bytes", self.max_file_bytes, 1 << 16, 1 << 40);
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
        c.int("flush_interval_ms", self.flush_interval_ms, 1, 60_000);
        c.int("heartbeat_ms", self.heartbeat_ms, 1, 60_000);
        c.int("end_timeout_ms", self.end_timeout_ms, 1, 3_600_000);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000);
        if let Err((key, what)) = self.disk_marks().check() {
            c.problem(key, what);
        }
        c.int("throttle_check_ms", self.throttle_check_ms, 1, 60_000);
        c.finish()
    }
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
