//! Mutexes that outlive a panic: a component's threads share their counters and state behind
//! `std::sync::Mutex`, and a thread that panicked while holding one must not take the component
//! (its statistics, its stop) down with it. These three helpers are the one way the component
//! crates lock: the value as it was left is used.
//!
//! ```
//! use std::sync::Mutex;
//! use daqflow_component::sync::{lock, read, set};
//!
//! let upstream = Mutex::new(None::<String>);
//! set(&upstream, Some("127.0.0.1:7000".to_owned()));
//! assert_eq!(read(&upstream).as_deref(), Some("127.0.0.1:7000"));
//! lock(&upstream).take();
//! assert_eq!(read(&upstream), None);
//! ```

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, even if a thread panicked while holding it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A copy of what `m` holds, even if a thread panicked while holding it.
pub fn read<T: Clone>(m: &Mutex<T>) -> T {
    lock(m).clone()
}

/// Replaces what `m` holds, even if a thread panicked while holding it.
pub fn set<T>(m: &Mutex<T>, value: T) {
    *lock(m) = value;
}
