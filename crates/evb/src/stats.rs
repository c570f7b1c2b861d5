//! What each event-builder kind counts besides the common counters: the `detail` of its
//! [`Stats`](daqflow_component::Stats), live (`NAME/stats`) and in the summary `stop` returns.
//! The figures are named here, once.
//!
//! Every kind reports the common counters in the sense of its role:
//!
//! | kind | role | `events` | `bytes` | `trigger` | `detail` |
//! | --- | --- | --- | --- | --- | --- |
//! | `source` | readout | fragments sent | their bytes (headers included) | — | [`SourceDetail`] |
//! | `evm` | trigger | events triggered | 0 | [`TriggerCounts`](daqflow_component::TriggerCounts) | [`EvmDetail`] |
//! | `ru` | readout | super-fragments sent to BUs | their bytes | — | [`RuDetail`] |
//! | `bu` | builder | events built | their bytes | — | [`BuDetail`] |
//!
//! `events_per_s` and `mb_per_s` are the rates of `events` and `bytes`: over the last second
//! live, the mean over the run in the summary.
//!
//! ```
//! use daqflow_component::Stats;
//! use daqflow_evb::stats::BuDetail;
//! let s = Stats::counted(100, 51_200).with_detail(&BuDetail { id: 1, events_flagged: 2, ..Default::default() });
//! let json = serde_json::to_value(&s).unwrap();
//! assert_eq!(json["detail"]["events_flagged"], 2);
//! assert_eq!(s.detail_as::<BuDetail>().unwrap().id, 1);
//! ```

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::bu::Output;
use crate::ru::RuCounters;

/// A source's own figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceDetail {
    /// The source id.
    pub source_id: u32,
    /// The run.
    pub run: u32,
    /// Seconds since the start of the run; in the summary, the stream's duration.
    pub seconds: f64,
    /// The last event sent (the fragments' event ids are 1 … `last_event`).
    pub last_event: u64,
    /// Why the stream ended badly (summary), if it did.
    pub error: Option<String>,
}

/// The event manager's own figures (its accounting is the `trigger` of its stats).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvmDetail {
    /// The run.
    pub run: u32,
    /// Seconds since the start of the run; in the summary, until the run was drained.
    pub seconds: f64,
    /// The run's last event, once triggering stopped (always in the summary).
    pub last_event: Option<u64>,
    /// Events assigned to a BU (re-assignments counted again).
    pub assignments: u64,
    /// Events re-assigned after their BU was lost.
    pub reassigned: u64,
    /// Confirmations for events the BU did not hold (ignored).
    pub unexpected_confirmations: u64,
    /// Triggers waiting for a BU.
    pub pending: usize,
    /// Events assigned and not yet confirmed.
    pub in_flight: usize,
    /// Events built (confirmed) per second: live over the last second, the run's mean in the
    /// summary.
    pub built_per_s: f64,
    /// RUs connected.
    pub rus_connected: usize,
    /// RUs the run waits for (`rus`).
    pub rus_expected: usize,
    /// The BUs connected, with their credits.
    pub bus: Vec<EvmBu>,
}

/// A BU as its EVM sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvmBu {
    /// The BU's id.
    pub id: u32,
    /// Credits not yet used.
    pub credits: u64,
    /// Events assigned to it and not yet confirmed.
    pub in_flight: usize,
    /// Events it built (confirmed).
    pub built: u64,
}

/// A readout unit's own figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuDetail {
    /// The RU's id.
    pub id: u32,
    /// The run.
    pub run: u32,
    /// Seconds since the start of the run; in the summary, the run's duration.
    pub seconds: f64,
    /// The run's last event, once the EVM said the run ended.
    pub last_event: Option<u64>,
    /// Fragments, super-fragments, sequence and CRC errors, releases, rejects, …
    pub counters: RuCounters,
    /// Fragments received per second (live: over the last second; summary: the run's mean).
    pub fragments_per_s: f64,
    /// Megabytes of fragments received per second, likewise.
    pub fragment_mb_per_s: f64,
    /// Events stored.
    pub events_stored: usize,
    /// Bytes of fragments stored.
    pub bytes_stored: u64,
    /// Bytes of fragments of events not yet assigned (or rejected) stored.
    pub read_ahead_bytes: u64,
    /// Source streams connected.
    pub streams_connected: usize,
    /// BUs connected.
    pub bus_connected: usize,
    /// BU connections held, not taken yet: the EVM's BU gone for an earlier generation of their
    /// id has not come yet, or a live connection has their id and generation.
    pub bus_held: usize,
    /// Events of the run still stored at the end (summary; 0 unless the run was cut short).
    pub leftover_events: Option<usize>,
    /// The first sequence and CRC problems seen.
    pub problems: Vec<String>,
    /// Why the run failed here, if it did.
    pub error: Option<String>,
}

/// A builder unit's own figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BuDetail {
    /// The BU's id.
    pub id: u32,
    /// The run.
    pub run: u32,
    /// Seconds since the start of the run; in the summary, the run's duration.
    pub seconds: f64,
    /// Events built with a flag set (CRC error, event id mismatch, incomplete, truncated).
    pub events_flagged: u64,
    /// Fragments whose CRC did not match.
    pub crc_errors: u64,
    /// Events waiting for super-fragments.
    pub in_progress: usize,
    /// RUs connected.
    pub rus_connected: usize,
    /// Builder threads.
    pub threads: usize,
    /// Where built events go.
    pub output: Output,
    /// Events still incomplete at the end (summary).
    pub incomplete_at_end: Option<usize>,
    /// The BU was stopped while the run went on (it left the run; the EVM re-assigned what it
    /// had not built).
    pub left_during_run: bool,
    /// The data files written (summary; `output = "files"`).
    pub files: Vec<BuFile>,
    /// Errors of the builder threads and their outputs (summary).
    pub errors: Vec<String>,
    /// Why the run failed here, if it did.
    pub error: Option<String>,
    /// Disk throttling (`output = "files"`): the BU asks for no events now, its disk being
    /// above `throttle_high_pct` (until it is below `throttle_low_pct`).
    pub throttled: bool,
    /// How many times it throttled in the run.
    pub throttle_count: u64,
    /// Seconds spent throttled in the run.
    pub throttled_s: f64,
    /// Seconds of the current throttled period (0 when not throttled): the operator stops the
    /// run once it passes `[system] disk_full_stop_s`.
    pub throttled_for_s: f64,
    /// Free bytes on the filesystem of `directory` at the last reading (`output = "files"`).
    pub disk_free_bytes: Option<u64>,
    /// Usage of that filesystem (percent) at the last reading (`output = "files"`).
    pub disk_used_pct: Option<f64>,
}

/// A data file a BU wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BuFile {
    /// Where it is.
    pub path: PathBuf,
    /// Events in it.
    pub events: u64,
    /// Its size.
    pub bytes: u64,
    /// The first event id in it.
    pub first_event: Option<u64>,
    /// The last event id in it.
    pub last_event: Option<u64>,
}
