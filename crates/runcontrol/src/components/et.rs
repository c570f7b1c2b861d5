//! `et`: an ET system (`daqflow-et`) as a component. `configure` creates the system (shared
//! memory named after it), `reset` stops it; runs do not change it. Its statistics are the
//! system's snapshot (stations, queue depths, events in and out, attachments).
//!
//! ```
//! use daqflow_runcontrol::component::Component;
//! use daqflow_runcontrol::components::et::{EtComponent, EtConfig};
//! let mut et = EtComponent::new("et-doc", EtConfig { name: Some(format!("doc-{}", std::process::id())), events: 64, event_size: 1024, ..Default::default() });
//! let info = et.configure()?;
//! assert!(info["et"].as_str().unwrap().starts_with("doc-"));
//! et.reset()?;
//! # Ok::<(), daqflow_runcontrol::ComponentError>(())
//! ```

use serde::Deserialize;
use serde_json::{Value, json};

use crate::ComponentError;
use crate::component::Component;

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
    /// Serve remote attachments on this TCP address (e.g. `127.0.0.1:11111`); none by default.
    pub listen: Option<String>,
    /// An attachment silent for this long is declared dead and its events are recovered.
    pub heartbeat_timeout_ms: u64,
}

impl Default for EtConfig {
    fn default() -> Self {
        EtConfig {
            name: None,
            events: 2048,
            event_size: 64 * 1024,
            max_temp_events: 64,
            listen: None,
            heartbeat_timeout_ms: 5000,
        }
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
        if self.config.events == 0 || self.config.event_size == 0 {
            return Err(ComponentError::Config("events and event_size must be at least 1".into()));
        }
        let mut c = daqflow_et::SystemConfig::new(&name, self.config.events, self.config.event_size);
        c.max_temp_events = self.config.max_temp_events;
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
