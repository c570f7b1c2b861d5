//! The component kinds the `daqflow` binary runs.
//!
//! ```
//! let registry = daqflow_runcontrol::registry::standard();
//! assert!(registry.kinds().contains(&"ru"));
//! ```

use crate::component::{Evb, Registry, parse_config};

/// Every standard kind: the event builder's `source`, `evm`, `ru`, `bu`, and the run-control
/// components.
pub fn standard() -> Registry {
    use crate::components::{et, monitor, msglogger, recorder};
    use daqflow_evb::{bu, evm, ru, source};
    let mut r = Registry::new();
    r.add("source", |name, t| Ok(Box::new(Evb(Box::new(source::Source::new(name, parse_config(name, t)?))))));
    r.add("evm", |name, t| Ok(Box::new(Evb(Box::new(evm::Evm::new(name, parse_config(name, t)?))))));
    r.add("ru", |name, t| Ok(Box::new(Evb(Box::new(ru::Ru::new(name, parse_config(name, t)?))))));
    r.add("bu", |name, t| Ok(Box::new(Evb(Box::new(bu::Bu::new(name, parse_config(name, t)?))))));
    r.add("generator", |name, t| Ok(Box::new(crate::chain::generator::Generator::new(name, parse_config(name, t)?))));
    r.add("repeater", |name, t| Ok(Box::new(crate::chain::repeater::Repeater::new(name, parse_config(name, t)?))));
    r.add("sink", |name, t| Ok(Box::new(crate::chain::sink::Sink::new(name, parse_config(name, t)?))));
    r.add("et", |name, t| Ok(Box::new(et::EtComponent::new(name, parse_config(name, t)?))));
    r.add("recorder", |name, t| Ok(Box::new(recorder::Recorder::new(name, parse_config(name, t)?))));
    r.add("monitor", |name, t| Ok(Box::new(monitor::Monitor::new(name, parse_config(name, t)?))));
    r.add("msglogger", |name, t| Ok(Box::new(msglogger::MsgLogger::new(name, parse_config(name, t)?))));
    r
}
