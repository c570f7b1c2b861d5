//! `et`: an ET system (`daqflow-et`) as a component. `configure` creates the system (shared
//! memory named after it), `reset` stops it; runs do not change it. Its statistics are the
//! system's snapshot (stations, queue depths, events in and out, attachments).
//!
//! ```
//! use daqflow_component::Component;
//! use daqflow_runcontrol::components::et::{EtComponent, EtConfig};
//! let mut et = EtComponent::new("et-doc", EtConfig { name: Some(format!("doc-{}", std::process::id())), events: 64, event_size: 1024, ..Default::default() });
//! let info = et.configure()?;
//! assert!(info["et"].as_str().unwrap().starts_with("doc-"));
//! et.reset()?;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

use serde::Deserialize;
use serde_json::{Value, json};

use daqflow_component::Component;
use daqflow_component::ComponentError;

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
    /// An attachment silent for this long is declared dead and its events are recovered.
    pub heartbeat_timeout_ms: u64,
}

impl Default for EtConfig {
    fn default() -> Self {
        // The ET system's own defaults for its limits.
        let d = daqflow_et::SystemConfig::new("", 1, 1);
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
        c.int("heartbeat_timeout_ms", self.heartbeat_timeout_ms, 100, 3_600_000);
        c.finish()
    }
}

/// An ET system component.
pub struct EtComponent {
    name: String,
    config: EtConfig,
    system: Option<daqflow_et::EtSystem>,
}

impl EtComponent {
    /// A component that will create the system on configure.
    pub fn new(name: &str, config: EtConfig) -> EtComponent {
        EtComponent { name: name.to_owned(), config, system: None }
    }

    fn snapshot(&self) -> Value {
        self.system.as_ref().map_or(Value::Null, |s| serde_json::to_value(s.snapshot()).unwrap_or(Value::Null))
    }
}

impl Component for EtComponent {
    fn kind(&self) -> &str {
        "et"
    }

    fn configure(&mut self) -> Result<Value, ComponentError> {
        let name = self.config.name.clone().unwrap_or_else(|| self.name.clone());
        self.config.check(&self.name)?;
        let mut c = daqflow_et::SystemConfig::new(&name, self.config.events, self.config.event_size);
        c.max_temp_events = self.config.max_temp_events;
        c.max_event_bytes = self.config.max_event_bytes;
        c.max_temp_bytes = self.config.max_temp_bytes;
        c.max_temp_per_attachment = self.config.max_temp_per_attachment;
        c.max_attachments_per_connection = self.config.max_attachments_per_connection;
        c.allowed_uids = self.config.allowed_uids.clone();
        c.heartbeat_timeout = std::time::Duration::from_millis(self.config.heartbeat_timeout_ms.max(100));
        if let Some(l) = &self.config.listen {
            c.listen = Some(l.parse().map_err(|e| ComponentError::Config(format!("listen = {l:?}: {e}")))?);
        }
        let system = daqflow_et::EtSystem::create(c)?;
        let remote = system.remote_addr().map(|a| a.to_string());
        self.system = Some(system);
        Ok(json!({ "et": name, "remote": remote }))
    }

    fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
        Ok(())
    }

    fn stop(&mut self, _arg: Option<u64>) -> Result<Value, ComponentError> {
        Ok(json!({ "snapshot": self.snapshot() }))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        if let Some(s) = self.system.take() {
            s.stop();
        }
        Ok(())
    }

    fn stats(&self) -> Value {
        json!({ "snapshot": self.snapshot() })
    }
}

impl Drop for EtComponent {
    fn drop(&mut self) {
        let _ = self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_et::{Attachment, EtClient, EtError, Limit, Wait};

    #[test]
    fn the_limit_keys_reach_the_et_system() {
        let name = format!("et-keys-{}", std::process::id());
        let table: toml::Table = toml::from_str(&format!(
            "name = {name:?}\nevents = 16\nevent_size = 1024\nmax_event_bytes = 10000\n\
             max_attachments_per_connection = 1\nallowed_uids = [4242]"
        ))
        .unwrap();
        let config: EtConfig = daqflow_component::parse_config("et", table).unwrap();
        assert_eq!(config.allowed_uids, [4242]);
        let mut et = EtComponent::new("et", config);
        et.configure().unwrap();
        let client = EtClient::connect(&name).unwrap();
        let producer = client.attach(daqflow_et::GRAND_CENTRAL).unwrap();
        assert!(matches!(
            producer.new_events(1, 10_001, Wait::NoWait),
            Err(EtError::OverLimit { limit: Limit::EventBytes, max: 10_000, .. })
        ));
        assert!(matches!(
            client.attach(daqflow_et::GRAND_CENTRAL),
            Err(EtError::OverLimit { limit: Limit::AttachmentsPerConnection, .. })
        ));
        drop((producer, client));
        et.reset().unwrap();
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let table: toml::Table = toml::from_str("max_event_size = 1").unwrap();
        let e = daqflow_component::parse_config::<EtConfig>("et", table).expect_err("refused");
        assert!(e.to_string().contains("max_event_size"), "{e}");
    }
}
