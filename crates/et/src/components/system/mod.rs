//! `et`: an ET system (`daqflow-et`) as a component. `configure` creates the system (shared
//! memory named after it), `reset` stops it; runs do not change it. Its statistics are the
//! system's snapshot (stations, queue depths, events in and out, attachments).
//!
//! ```
//! use daqflow_component::Component;
//! use daqflow_et::components::system::{EtComponent, EtConfig};
//! let mut et = EtComponent::new("et-doc", EtConfig { name: Some(format!("doc-{}", std::process::id())), events: 64, event_size: 1024, ..Default::default() });
//! let info = et.configure()?;
//! assert!(info["et"].as_str().unwrap().starts_with("doc-"));
//! et.reset()?;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

use serde_json::{Value, json};

use daqflow_component::Component;
use daqflow_component::ComponentError;

mod config;
pub use config::EtConfig;

/// Builds a `et` component named `name` from its configuration table (the registry's entry
/// for the kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: EtConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(EtComponent::new(name, c)))
}

/// An ET system component.
pub struct EtComponent {
    name: String,
    config: EtConfig,
    system: Option<crate::EtSystem>,
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
        let mut c = crate::SystemConfig::new(&name, self.config.events, self.config.event_size);
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
        let system = crate::EtSystem::create(c)?;
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
    use crate::{Attachment, EtClient, EtError, Limit, Wait};

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
        let producer = client.attach(crate::GRAND_CENTRAL).unwrap();
        assert!(matches!(
            producer.new_events(1, 10_001, Wait::NoWait),
            Err(EtError::OverLimit { limit: Limit::EventBytes, max: 10_000, .. })
        ));
        assert!(matches!(
            client.attach(crate::GRAND_CENTRAL),
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
