//! The standard run-control components: `et` (an ET system as a component), `recorder` (ET
//! consumer → data files), `monitor` (ET consumer → online histograms) and `msglogger` (every
//! process's log records → the run database). Each file holds the kind's configuration
//! struct (every key documented; unknown keys are errors) and its runtime.

pub mod et;
pub mod monitor;
pub mod msglogger;
pub mod recorder;

use std::sync::Mutex;

/// A copy of what a mutex holds, even if a thread panicked while holding it.
pub(crate) fn read<T: Clone>(m: &Mutex<T>) -> T {
    m.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Sets what a mutex holds.
pub(crate) fn set<T>(m: &Mutex<T>, v: T) {
    *m.lock().unwrap_or_else(|p| p.into_inner()) = v;
}
