//! The configuration of the `et` kind: every key, documented, checked by [`EtConfig::check`].

use daqflow_component::ComponentError;
use serde::Deserialize;

/// Configuration of an `et` component.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EtConfig {
    /// The ET system's name, which producers and consumers use to find it (default: the
    /// component's name).
    pub name: Option<String>,
    /// Number of event buffers in the pool.
    pub events: u32,
    /// Size of each buffer in bytes; larger events get temporary buffers.
    pub event_size: usize,
    /// Most temporary buffers for larger events at a time.
    pub max_temp_events: u32,
    /// The largest event a producer may ask for, in bytes (64 MiB).
    pub max_event_bytes: usize,
    /// Most bytes the temporary buffers of larger events may take in all (1 GiB).
    pub max_temp_bytes: u64,
    /// Most larger events one attachment may hold at a time (16).
    pub max_temp_per_attachment: u32,
    /// Most attachments one client connection, local or remote, may have (32).
    pub max_attachments_per_connection: u32,
    /// User ids whose local processes may attach, besides the user running the system and root
    /// (none).
    pub allowed_uids: Vec<u32>,
    /// Serve remote attachments on this TCP address (e.g. `127.0.0.1:11111`); none by default.
    pub listen: Option<String>,
    /// The remote address answered at configure (`HOST` or `HOST:PORT`), for consumers on other
    /// hosts. Default: the bound address; for a wildcard `listen`, this host's address on the
    /// network towards the control server.
    pub advertise: Option<String>,
    /// An attachment silent for this long is declared dead and its events are recovered.
    pub heartbeat_timeout_ms: u64,
}

impl Default for EtConfig {
    fn default() -> Self {
        // The ET system's own defaults for its limits.
        let d = crate::SystemConfig::new("", 1, 1);
        EtConfig {
            name: None,
            events: 2048,
            event_size: 64 * 1024,
            max_temp_events: d.max_temp_events,
            max_event_bytes: d.max_event_bytes,
            max_temp_bytes: d.max_temp_bytes,
            max_temp_per_attachment: d.max_temp_per_attachment,
            max_attachments_per_connection: d.max_attachments_per_connection,
            allowed_uids: d.allowed_uids,
            listen: None,
            advertise: None,
            heartbeat_timeout_ms: 5000,
        }
    }
}

impl EtConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        if let Some(n) = &self.name {
            c.text("name", n);
        }
        c.int("events", self.events.into(), 1, 1_000_000);
        c.int("event_size", self.event_size as u64, 1, 1 << 30);
        c.int("max_temp_events", self.max_temp_events.into(), 0, 1_000_000);
        c.int("max_event_bytes", self.max_event_bytes as u64, 1, 1 << 34);
        c.int("max_temp_bytes", self.max_temp_bytes, 0, 1 << 40);
        c.int("max_temp_per_attachment", self.max_temp_per_attachment.into(), 0, 1_000_000);
        c.int("max_attachments_per_connection", self.max_attachments_per_connection.into(), 1, 1_000_000);
        if let Some(l) = &self.listen {
            c.address("listen", l);
        }
        if let Some(Err(e)) = self.advertise.as_deref().map(daqflow_transport::advertise::check) {
            c.problem("advertise", e.to_string().trim_start_matches("advertise "));
        }
        c.int("heartbeat_timeout_ms", self.heartbeat_timeout_ms, 100, 3_600_000);
        c.finish()
    }
}
