//! Deliberate faults in the event builder's decisions, for the mutation tests of the
//! simulation (`crates/evb/tests/simulation`): each [`Mutation`] breaks one decision of the
//! real machines the way a plausible bug would, and the simulation must then fail. That keeps
//! the simulation from drifting into testing something else than the code: a rule it no longer
//! exercises shows as a mutation that survives.
//!
//! Only with the feature `mutation` (the crate's own tests turn it on); a mutation is on for the
//! thread that calls [`with`], so that tests running beside it are not touched.
//!
//! ```
//! use daqflow_evb::mutation::{self, Mutation};
//! assert!(!mutation::active(Mutation::NoBuTimeout));
//! mutation::with(Mutation::NoBuTimeout, || assert!(mutation::active(Mutation::NoBuTimeout)));
//! assert!(!mutation::active(Mutation::NoBuTimeout));
//! ```

use std::cell::Cell;

/// A deliberate fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The EVM never times out a silent BU (`bu_timeout_ms` ignored).
    NoBuTimeout,
    /// A BU never throttles on its disk (the throttle threshold taken as 100 %).
    NoDiskThrottling,
    /// The EVM forgets the events of a BU that is gone instead of re-assigning them.
    NoReassignment,
    /// An RU takes a BU's connection at once, whatever its generation.
    NoGenerations,
    /// A BU with nothing to ask for or confirm sends no heartbeat.
    NoHeartbeat,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 5] = [
        Mutation::NoBuTimeout,
        Mutation::NoDiskThrottling,
        Mutation::NoReassignment,
        Mutation::NoGenerations,
        Mutation::NoHeartbeat,
    ];
}

thread_local! {
    static ACTIVE: Cell<Option<Mutation>> = const { Cell::new(None) };
}

/// Runs `f` with `m` on (in this thread).
pub fn with<R>(m: Mutation, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Mutation>);
    impl Drop for Reset {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
        }
    }
    let _reset = Reset(ACTIVE.with(|a| a.replace(Some(m))));
    f()
}

/// Whether `m` is on in this thread.
pub fn active(m: Mutation) -> bool {
    ACTIVE.with(|a| a.get() == Some(m))
}
