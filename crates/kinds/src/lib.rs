//! The component kinds the `daqflow` binary runs: one line per kind, the only list of them (the
//! binary, its tests and the fuzz targets take it from here). Each kind lives in a folder of its
//! subsystem's crate (its component, its `config.rs`) and describes itself with a
//! [`Kind`](daqflow_component::Kind): its role in the run's accounting, its start and stop
//! stages, where it writes data files, its factory. A new kind is a new folder and a new line
//! here.
//!
//! ```
//! let registry = daqflow_kinds::standard();
//! assert!(registry.kinds().contains(&"ru"));
//! assert_eq!(registry.kind("evm").unwrap().role, daqflow_component::Role::Trigger);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use daqflow_component::Registry;

pub mod adc_monitor;

/// Every standard kind: the event builder's `source`, `evm`, `ru`, `bu`, the ET system's `et`,
/// `recorder`, `monitor` (and `adc_monitor`, the demo's detector monitor, a monitor of a user's
/// own), the chain's `generator`, `repeater`, `sink`, `gatherer`, `dispatcher`, `logger`, `chain_monitor`, and the message logger.
/// Each kind's configuration is range-checked when it is made (so by `daqflow run --check` and
/// at every configure), every problem naming its key.
pub fn standard() -> Registry {
    let mut r = Registry::new();
    r.add(daqflow_evb::source::kind());
    r.add(daqflow_evb::evm::kind());
    r.add(daqflow_evb::ru::kind());
    r.add(daqflow_evb::bu::kind(Some(et_output())));
    r.add(daqflow_et::components::system::kind());
    r.add(daqflow_et::components::recorder::kind());
    r.add(daqflow_et::components::monitor::kind());
    r.add(adc_monitor::kind());
    r.add(daqflow_chain::generator::kind());
    r.add(daqflow_chain::repeater::kind());
    r.add(daqflow_chain::sink::kind());
    r.add(daqflow_chain::gatherer::kind());
    r.add(daqflow_chain::dispatcher::kind());
    r.add(daqflow_chain::logger::kind());
    r.add(daqflow_chain::chain_monitor::kind());
    r.add(daqflow_runcontrol::msglogger::kind());
    r
}

/// How a builder unit opens an ET system as its output (`output = "et"`): a producer attached
/// to its GRAND_CENTRAL station.
fn et_output() -> daqflow_evb::bu::EtOpener {
    std::sync::Arc::new(|name: &str| {
        let sink = daqflow_et::sink::EtSink::open(name).map_err(|e| e.to_string())?;
        Ok(Box::new(sink) as Box<dyn daqflow_wire::sink::EventSink>)
    })
}
