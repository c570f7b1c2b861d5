//! Snapshots of an ET system for monitors (`daqflow et monitor`, the web UI).

use serde::{Deserialize, Serialize};

use crate::config::StationConfig;

/// The state of an ET system at one moment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The system's name.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Events in the pool.
    pub events: u32,
    /// Size of each.
    pub event_size: usize,
    /// Events in GrandCentral (unused).
    pub free_events: u32,
    /// Temporary buffers of large events in use.
    pub temp_events: u32,
    /// Bytes those buffers may take (their sizes; memory is committed only as data is written).
    #[serde(default)]
    pub temp_bytes: u64,
    /// Events held by the ET process itself (moving between stations).
    pub in_transit: u32,
    /// The stations, GrandCentral first, in chain order.
    pub stations: Vec<StationStatus>,
    /// The attachments.
    pub attachments: Vec<AttachmentStatus>,
    /// The remote-access address, if any.
    pub remote: Option<String>,
    /// When the snapshot was taken (ns since the Unix epoch).
    pub time_ns: u64,
}

/// One station in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StationStatus {
    /// Its name.
    pub name: String,
    /// Its parallel group, if in one.
    pub group: Option<u32>,
    /// Its configuration (a closure selection shows as `All` with `closure: true`).
    pub config: StationConfig,
    /// Whether it selects with a closure.
    pub closure: bool,
    /// Events in its input list.
    pub queued: u32,
    /// Events that entered its input list.
    pub events_in: u64,
    /// Events its attachments took out.
    pub events_out: u64,
    /// Attachments.
    pub attachments: u32,
}

/// One attachment in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachmentStatus {
    /// Its id.
    pub id: u32,
    /// Its station.
    pub station: String,
    /// The process that uses it (the ET process for remote clients).
    pub pid: u32,
    /// Whether it serves a remote client.
    pub remote: bool,
    /// Events it holds now.
    pub held: u64,
    /// Events it got (new or from its station).
    pub got: u64,
    /// Events it put.
    pub put: u64,
    /// Events it dumped.
    pub dumped: u64,
}

impl Snapshot {
    /// Every event, counted once: free, queued in a station, held by an attachment, or in
    /// transit. Equals `events` when nothing is lost.
    ///
    /// A snapshot is taken without stopping the flow: while events move, those being handed
    /// from one queue to the next at that instant are in neither, and the sum may fall short
    /// by that many. At rest it is exact.
    pub fn accounted(&self) -> u64 {
        self.free_events as u64
            + self.in_transit as u64
            + self.stations.iter().skip(1).map(|s| s.queued as u64).sum::<u64>()
            + self.attachments.iter().map(|a| a.held).sum::<u64>()
    }
}
