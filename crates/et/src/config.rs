//! Configuration of an ET system and of its stations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The name of the first station, which holds the unused events.
pub const GRAND_CENTRAL: &str = "GRAND_CENTRAL";

/// The default [`SystemConfig::max_event_bytes`]: 64 MiB, the largest frame daqflow's
/// transport accepts by default, far above a built event (kilobytes to a few megabytes).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 << 20;

/// The default [`SystemConfig::max_temp_bytes`]: 1 GiB, 16 events of the largest default size.
pub const DEFAULT_MAX_TEMP_BYTES: u64 = 1 << 30;

/// How an ET system is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemConfig {
    /// The system's name, unique on the machine: clients find it by this name.
    pub name: String,
    /// Number of event buffers in the pool.
    pub events: u32,
    /// Size of each buffer in bytes; larger events get temporary buffers.
    pub event_size: usize,
    /// Most stations, GrandCentral included (at most 64). Default 32.
    pub max_stations: u32,
    /// Most attachments at a time. Default 128.
    pub max_attachments: u32,
    /// Most temporary buffers for events larger than `event_size` at a time. Default 64.
    pub max_temp_events: u32,
    /// The largest event `new_events` may ask for, in bytes; events up to `event_size` always
    /// fit. Default [`DEFAULT_MAX_EVENT_BYTES`] (64 MiB).
    pub max_event_bytes: usize,
    /// Most large events (larger than `event_size`) one attachment may hold at a time. Default 16.
    pub max_temp_per_attachment: u32,
    /// Most bytes of temporary buffers for large events at a time, in the whole system (each
    /// buffer counts its size rounded up to 4 KiB). Default [`DEFAULT_MAX_TEMP_BYTES`] (1 GiB).
    pub max_temp_bytes: u64,
    /// Most attachments one connection may have at a time: a local process's
    /// [`EtClient`](crate::EtClient) or a remote client's TCP connection (attachments made in
    /// the ET process itself are not counted). Default 32.
    pub max_attachments_per_connection: u32,
    /// Users, besides the one running the ET process and root, whose processes may connect
    /// locally (and so map the shared memory). Default: none.
    pub allowed_uids: Vec<u32>,
    /// TCP address of the remote-access server; `None`: no remote access.
    pub listen: Option<SocketAddr>,
    /// UDP port answering discovery queries for this system's name; `None`: no discovery.
    pub discovery_port: Option<u16>,
    /// An attachment whose process stops heartbeating for this long is declared dead (a
    /// local one is killed: a stuck process may hold a queue lock). Default 5 s.
    pub heartbeat_timeout: Duration,
    /// CPUs the conductor thread (it moves events from station to station) is pinned to;
    /// `None`: not pinned.
    pub conductor_cpus: Option<daqflow_wire::affinity::CpuSet>,
    /// CPUs the serving threads are pinned to: the control thread, each local client's thread
    /// (started by it, so pinned alike), the remote server, discovery, the watchdog and the
    /// reaper of large events; `None`: not pinned.
    pub server_cpus: Option<daqflow_wire::affinity::CpuSet>,
}

impl SystemConfig {
    /// Defaults for system `name` with `events` buffers of `event_size` bytes.
    pub fn new(name: impl Into<String>, events: u32, event_size: usize) -> Self {
        SystemConfig {
            name: name.into(),
            events,
            event_size,
            max_stations: 32,
            max_attachments: 128,
            max_temp_events: 64,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_temp_per_attachment: 16,
            max_temp_bytes: DEFAULT_MAX_TEMP_BYTES,
            max_attachments_per_connection: 32,
            allowed_uids: Vec::new(),
            listen: None,
            discovery_port: None,
            heartbeat_timeout: Duration::from_secs(5),
            conductor_cpus: None,
            server_cpus: None,
        }
    }
}

/// How a call waits for events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wait {
    /// Until events come (or the system dies).
    Sleep,
    /// At most this long.
    Timed(Duration),
    /// Not at all.
    NoWait,
}

/// An event's priority: high-priority events go ahead of low-priority ones in every queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Priority {
    /// The default.
    #[default]
    Low,
    /// Ahead of every low-priority event.
    High,
}

/// Where the events held by an attachment that dies go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RestoreMode {
    /// On to the next stations, as if it had put them (the default).
    #[default]
    Output,
    /// Back into the station's input list, for the next consumer.
    Input,
    /// Back to GrandCentral (recycled).
    GrandCentral,
    /// To the station's other attachments (through its input list); on if there are none.
    Redistribute,
}

/// How a parallel group picks the station an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum GroupPolicy {
    /// In turn.
    #[default]
    RoundRobin,
    /// The member with the fewest queued events.
    ShortestQueue,
}

/// A view of an event for selection closures.
#[derive(Debug)]
pub struct EventView<'a> {
    /// Control integers.
    pub control: [i32; 4],
    /// Priority.
    pub priority: Priority,
    /// The event's data.
    pub data: &'a [u8],
}

/// A selection closure; it runs in the ET system's process.
pub type SelectFn = Arc<dyn Fn(&EventView<'_>) -> bool + Send + Sync>;

/// Which events a station selects.
#[derive(Clone, Default, Serialize, Deserialize)]
pub enum Selection {
    /// Every event.
    #[default]
    All,
    /// Events whose control integers equal these (`None`: any value).
    Match([Option<i32>; 4]),
    /// Events with `lo <= control[index] <= hi`.
    Range {
        /// Which control integer.
        index: usize,
        /// Lowest value taken.
        lo: i32,
        /// Highest value taken.
        hi: i32,
    },
    /// Events with any bit of `mask` set in `control[index]`.
    MaskAny {
        /// Which control integer.
        index: usize,
        /// The bits.
        mask: i32,
    },
    /// Events with every bit of `mask` set in `control[index]`.
    MaskAll {
        /// Which control integer.
        index: usize,
        /// The bits.
        mask: i32,
    },
    /// High-priority events.
    HighPriority,
    /// A closure; only for stations created in the ET system's own process
    /// ([`EtSystem::create_station`](crate::EtSystem::create_station)).
    #[serde(skip)]
    Closure(SelectFn),
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::All => write!(f, "All"),
            Selection::Match(m) => write!(f, "Match({m:?})"),
            Selection::Range { index, lo, hi } => write!(f, "Range(control[{index}] in {lo}..={hi})"),
            Selection::MaskAny { index, mask } => write!(f, "MaskAny(control[{index}] & {mask:#x})"),
            Selection::MaskAll { index, mask } => write!(f, "MaskAll(control[{index}] & {mask:#x})"),
            Selection::HighPriority => write!(f, "HighPriority"),
            Selection::Closure(_) => write!(f, "Closure"),
        }
    }
}

/// The command-line form, which [`Selection::parse`] reads back (`closure` for a closure).
impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::All => write!(f, "all"),
            Selection::Match(m) => {
                let ints: Vec<String> =
                    m.iter().map(|c| c.map_or_else(|| "*".to_string(), |v| v.to_string())).collect();
                write!(f, "match:{}", ints.join(","))
            }
            Selection::Range { index, lo, hi } => write!(f, "range:{index}:{lo}:{hi}"),
            Selection::MaskAny { index, mask } => write!(f, "mask-any:{index}:{mask:#x}"),
            Selection::MaskAll { index, mask } => write!(f, "mask-all:{index}:{mask:#x}"),
            Selection::HighPriority => write!(f, "high"),
            Selection::Closure(_) => write!(f, "closure"),
        }
    }
}

impl Selection {
    /// Parses `all`, `match:1,*,3,*`, `range:INDEX:LO:HI`, `mask-any:INDEX:MASK`,
    /// `mask-all:INDEX:MASK` or `high` (command-line form).
    pub fn parse(s: &str) -> Result<Selection, String> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let int = |t: &str| {
            let t = t.trim();
            if let Some(h) = t.strip_prefix("0x") {
                // Hex is the bit pattern: 0xffffffff is -1.
                u32::from_str_radix(h, 16).map(|v| v as i32).map_err(|e| format!("{t:?}: {e}"))
            } else {
                t.parse::<i32>().map_err(|e| format!("{t:?}: {e}"))
            }
        };
        let parts: Vec<&str> = rest.split(':').collect();
        match kind {
            "all" => Ok(Selection::All),
            "high" => Ok(Selection::HighPriority),
            "match" => {
                let mut m = [None; 4];
                for (i, t) in rest.split(',').enumerate() {
                    if i >= 4 {
                        return Err("at most 4 control integers".into());
                    }
                    m[i] = if t.trim() == "*" { None } else { Some(int(t)?) };
                }
                Ok(Selection::Match(m))
            }
            "range" if parts.len() == 3 => {
                Ok(Selection::Range { index: control_index(parts[0])?, lo: int(parts[1])?, hi: int(parts[2])? })
            }
            "mask-any" if parts.len() == 2 => {
                Ok(Selection::MaskAny { index: control_index(parts[0])?, mask: int(parts[1])? })
            }
            "mask-all" if parts.len() == 2 => {
                Ok(Selection::MaskAll { index: control_index(parts[0])?, mask: int(parts[1])? })
            }
            _ => Err(format!(
                "{s:?}: expected all, high, match:A,B,C,D (* for any), range:I:LO:HI, mask-any:I:MASK or mask-all:I:MASK"
            )),
        }
    }
}

fn control_index(t: &str) -> Result<usize, String> {
    match t.trim().parse::<usize>() {
        Ok(i) if i < 4 => Ok(i),
        _ => Err(format!("{t:?}: a control integer index is 0 to 3")),
    }
}

/// How a station behaves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StationConfig {
    /// Blocking (the default): gets every event it selects. Non-blocking: only while fewer
    /// than `cue` events wait in its input list; the others flow past it.
    pub blocking: bool,
    /// The input-list length a non-blocking station accepts events up to. Default 100.
    pub cue: u32,
    /// Takes only every Nth selected event. Default 1 (all).
    pub prescale: u32,
    /// Which events it selects.
    pub selection: Selection,
    /// At most one attachment (default: any number, sharing the flow).
    pub single_user: bool,
    /// Where the events of an attachment that dies go.
    pub restore: RestoreMode,
    /// For a member of a parallel group: how the group picks.
    pub group_policy: GroupPolicy,
    /// Keeps the events it selects while no attachment is attached, instead of letting them
    /// flow past as an idle station does (the paper's rule, and the default): for a consumer
    /// that must see every event across its own restart, such as a recorder. The producers
    /// wait once the pool's free events are used up. Default false.
    #[serde(default)]
    pub keep_when_idle: bool,
}

impl Default for StationConfig {
    fn default() -> Self {
        StationConfig {
            blocking: true,
            cue: 100,
            prescale: 1,
            selection: Selection::All,
            single_user: false,
            restore: RestoreMode::Output,
            group_policy: GroupPolicy::RoundRobin,
            keep_when_idle: false,
        }
    }
}

/// Where a new station goes in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Position {
    /// After every station (the default).
    #[default]
    End,
    /// Right after GrandCentral.
    First,
    /// Right after the named station (after its whole group, if it is in one).
    After(String),
    /// In a parallel group with the named station: an event goes to one of them.
    ParallelWith(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse_from_the_command_line() {
        assert!(matches!(Selection::parse("all"), Ok(Selection::All)));
        assert!(matches!(Selection::parse("match:1,*,0x10,*"), Ok(Selection::Match([Some(1), None, Some(16), None]))));
        assert!(matches!(Selection::parse("range:2:-5:5"), Ok(Selection::Range { index: 2, lo: -5, hi: 5 })));
        assert!(matches!(Selection::parse("mask-all:0:0x3"), Ok(Selection::MaskAll { index: 0, mask: 3 })));
        assert!(Selection::parse("range:7:0:1").is_err());
        assert!(Selection::parse("bogus").is_err());
        for text in ["all", "high", "match:1,*,16,*", "range:2:-5:5", "mask-any:1:0x30", "mask-all:0:0x3"] {
            assert_eq!(Selection::parse(text).unwrap().to_string(), text);
        }
    }
}
