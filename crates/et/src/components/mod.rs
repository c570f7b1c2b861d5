//! The ET system's standard components, each a kind the `daqflow` binary registers
//! (`daqflow component KIND`, or a `[[component]]` of a system file): [`system`] (kind `et`: an
//! ET system as a component), [`recorder`] (an ET consumer writing data files) and [`monitor`]
//! (an ET consumer filling online histograms). Each folder holds the kind's configuration
//! (`config.rs`: every key documented, unknown keys are errors, every value range-checked), its
//! runtime, and its `factory`, the registry's entry for the kind.

pub mod monitor;
pub mod recorder;
pub mod system;

use std::sync::Mutex;

/// A copy of what a mutex holds, even if a thread panicked while holding it.
pub(crate) fn read<T: Clone>(m: &Mutex<T>) -> T {
    m.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Sets what a mutex holds.
pub(crate) fn set<T>(m: &Mutex<T>, v: T) {
    *m.lock().unwrap_or_else(|p| p.into_inner()) = v;
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
