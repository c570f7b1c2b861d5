//! The configuration of the `et` kind: every key, documented, checked by [`EtConfig::check`].

use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema, Type};
use serde::{Deserialize, Serialize};

/// Configuration of an `et` component.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// CPUs the conductor thread is pinned to (it moves events from station to station);
    /// none: not pinned.
    pub conductor_cpus: Option<Vec<usize>>,
    /// CPUs the serving threads are pinned to (the control thread and each local client's,
    /// the remote server, discovery, the watchdog); none: not pinned.
    pub server_cpus: Option<Vec<usize>>,
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
            conductor_cpus: None,
            server_cpus: None,
        }
    }
}

/// The typed schema of the `et` kind's configuration (`docs/operator-guide.md`, "Parameters
/// of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("et")
        .key(Key::text("name", "The ET system's name, which producers and consumers use to find it; default: the component's name."))
        .key(Key::integer("events", 1, 1_000_000, "Number of event buffers in the pool."))
        .key(Key::integer("event_size", 1, 1 << 30, "Size of each buffer; larger events get temporary buffers.").unit("bytes"))
        .key(Key::integer("max_temp_events", 0, 1_000_000, "Most temporary buffers for larger events at a time."))
        .key(Key::integer("max_event_bytes", 1, 1 << 34, "The largest event a producer may ask for.").unit("bytes"))
        .key(Key::integer("max_temp_bytes", 0, 1 << 40, "Most bytes the temporary buffers may take in all.").unit("bytes"))
        .key(Key::integer("max_temp_per_attachment", 0, 1_000_000, "Most larger events one attachment may hold at a time."))
        .key(Key::integer("max_attachments_per_connection", 1, 1_000_000, "Most attachments one client connection, local or remote, may have."))
        .key(Key::new("allowed_uids", Type::List { of: Box::new(Type::Integer { min: 0, max: u32::MAX.into() }) }, "User ids whose local processes may attach, besides the user running it and root."))
        .key(Key::address("listen", "Serve remote attachments on this TCP address (e.g. `127.0.0.1:11111`); none by default."))
        .key(Key::text("advertise", "The remote address `configure` gives (`HOST` or `HOST:PORT`) for consumers on other hosts; default: the bound address, or for a wildcard `listen` this host's address towards the control server."))
        .key(Key::integer("heartbeat_timeout_ms", 100, 3_600_000, "An attachment silent this long is declared dead and its events are recovered.").unit("ms"))
        .key(Key::cpus("conductor_cpus", "CPUs the conductor thread (moves events from station to station) is pinned to, inside the component's `cpus`; default: not pinned."))
        .key(Key::cpus("server_cpus", "CPUs the serving threads (control and each local client's, remote server, discovery, watchdog) are pinned to, inside the component's `cpus`; default: not pinned."))
        .output(Key::text("et", "The ET system's name."))
        .output(Key::text("remote", "Its remote address (`listen` as advertised), or empty without `listen`."))
        .defaults_from(&EtConfig::default())
}

impl EtConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
        if let Some(Err(e)) = self.advertise.as_deref().map(daqflow_transport::advertise::check) {
            c.problem("advertise", e.to_string().trim_start_matches("advertise "));
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&EtConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
