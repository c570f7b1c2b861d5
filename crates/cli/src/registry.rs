//! The component kinds the `daqflow` binary runs: one line per kind, the kind's factory in its
//! subsystem's crate (a folder with its configuration and runtime). A new kind is a new folder
//! and a new line here.
//!
//! ```
//! let registry = daqflow::registry::standard();
//! assert!(registry.kinds().contains(&"ru"));
//! ```

use daqflow_component::{Component, ComponentError, Registry, parse_config};
use serde_json::Value;

/// An event-builder configuration's range check as the framework's error, naming the component.
fn evb_checked<T>(
    name: &str,
    config: T,
    validate: impl Fn(&T) -> Result<(), daqflow_evb::EvbError>,
) -> Result<T, ComponentError> {
    match validate(&config) {
        Ok(()) => Ok(config),
        Err(daqflow_evb::EvbError::Config(e)) => Err(ComponentError::Config(format!("{name}: {e}"))),
        Err(e) => Err(ComponentError::Config(format!("{name}: {e}"))),
    }
}

/// Every standard kind: the event builder's `source`, `evm`, `ru`, `bu`, and the run-control
/// components. Each kind's configuration is range-checked when it is made (so by
/// `daqflow run --check` and at every configure), every problem naming its key.
pub fn standard() -> Registry {
    use daqflow_evb::{bu, evm, ru, source};
    let mut r = Registry::new();
    r.add("source", |name, t| {
        let c = evb_checked(name, parse_config::<source::SourceConfig>(name, t)?, source::SourceConfig::validate)?;
        Ok(Box::new(Evb(Box::new(source::Source::new(name, c)))))
    });
    r.add("evm", |name, t| {
        let c = evb_checked(name, parse_config::<evm::EvmConfig>(name, t)?, evm::EvmConfig::validate)?;
        Ok(Box::new(Evb(Box::new(evm::Evm::new(name, c)))))
    });
    r.add("ru", |name, t| {
        let c = evb_checked(name, parse_config::<ru::RuConfig>(name, t)?, ru::RuConfig::validate)?;
        Ok(Box::new(Evb(Box::new(ru::Ru::new(name, c)))))
    });
    r.add("bu", |name, t| {
        let c = evb_checked(name, parse_config::<bu::BuConfig>(name, t)?, bu::BuConfig::validate)?;
        let et: bu::EtOpener = std::sync::Arc::new(|et: &str| {
            let sink = daqflow_et::sink::EtSink::open(et).map_err(|e| e.to_string())?;
            Ok(Box::new(sink) as Box<dyn daqflow_wire::sink::EventSink>)
        });
        Ok(Box::new(Evb(Box::new(bu::Bu::new(name, c).with_et(et)))))
    });
    r.add("generator", daqflow_chain::generator::factory);
    r.add("repeater", daqflow_chain::repeater::factory);
    r.add("sink", daqflow_chain::sink::factory);
    r.add("et", daqflow_et::components::system::factory);
    r.add("recorder", daqflow_et::components::recorder::factory);
    r.add("monitor", daqflow_et::components::monitor::factory);
    r.add("msglogger", daqflow_runcontrol::msglogger::factory);
    r
}

/// An event-builder component (`daqflow-evb`) as a framework component.
pub struct Evb(pub Box<dyn daqflow_evb::component::Component>);

impl Component for Evb {
    fn kind(&self) -> &str {
        self.0.kind()
    }
    fn configure(&mut self) -> Result<Value, ComponentError> {
        Ok(self.0.configure()?)
    }
    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        Ok(self.0.start(run)?)
    }
    fn stop(&mut self, arg: Option<u64>) -> Result<Value, ComponentError> {
        Ok(self.0.stop(arg)?)
    }
    fn pause(&mut self) -> Result<(), ComponentError> {
        Ok(self.0.pause()?)
    }
    fn resume(&mut self) -> Result<(), ComponentError> {
        Ok(self.0.resume()?)
    }
    fn reset(&mut self) -> Result<(), ComponentError> {
        Ok(self.0.reset()?)
    }
    fn stats(&self) -> Value {
        self.0.stats()
    }
    fn failure(&self) -> Option<String> {
        self.0.failure()
    }
}
