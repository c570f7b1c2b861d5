//! The registry of frame kinds: every daqflow protocol numbers its messages inside a range of
//! its own, so that no two protocols share a kind. A frame that reaches the wrong protocol (a
//! misrouted message, a client at the wrong port that got past the handshake's protocol check)
//! is then an unknown kind, never a message of another meaning. Each protocol defines its kinds
//! from its range's first number, and checks in a test that they stay inside it.
//!
//! | range | protocol | defined in |
//! | --- | --- | --- |
//! | `0x0001`–`0x00FF` | DIALOG control plane (control server and peers) | `daqflow_dialog::protocol::kind` |
//! | `0x0100`–`0x01FF` | ET remote access | `daqflow_et` (remote protocol, `docs/et.md`) |
//! | `0x0C00`–`0x0CFF` | data control messages (accept, reject, ROI, discard) | `daqflow_engine::messages` |
//! | `0x0D00`–`0x0DFF` | the chain (DAQ-Middleware data plane) | `daqflow_chain::protocol` |
//! | `0x0E00`–`0x0EFF` | the event builder | `daqflow_evb::protocol` |
//! | `0x0F00`–`0x0FFF` | component control (commands and their replies) | (reserved) |
//! | `0xFF00`–`0xFFFF` | the transport's authentication handshake | `daqflow_transport::auth` |
//!
//! ```
//! use daqflow_wire::kinds::{self, EVB};
//! assert!(EVB.contains(0x0E01));
//! assert_eq!(kinds::owner(0x0E01), Some("evb"));
//! assert_eq!(kinds::owner(0x0900), None);
//! ```

/// The kinds of one protocol: `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindRange {
    /// The protocol's name (as in the transport's handshake, where it has one).
    pub protocol: &'static str,
    /// The first kind.
    pub first: u16,
    /// The last kind.
    pub last: u16,
}

impl KindRange {
    /// Whether `kind` is in the range.
    pub const fn contains(&self, kind: u16) -> bool {
        kind >= self.first && kind <= self.last
    }

    /// The `n`-th kind of the range (`first + n`).
    ///
    /// # Panics
    /// At compile time (in a `const`), when `n` falls outside the range.
    pub const fn at(&self, n: u16) -> u16 {
        assert!(n <= self.last - self.first, "kind outside its protocol's range");
        self.first + n
    }
}

/// DIALOG: the control server and the connections between processes.
pub const DIALOG: KindRange = KindRange { protocol: "dialog", first: 0x0001, last: 0x00FF };
/// ET remote access.
pub const ET_REMOTE: KindRange = KindRange { protocol: "et", first: 0x0100, last: 0x01FF };
/// The engine's data control messages (ATLAS DAQ-Unit: accept, reject, region of interest,
/// discard), which the event builder sends between its components too.
pub const DATA_CONTROL: KindRange = KindRange { protocol: "data-control", first: 0x0C00, last: 0x0CFF };
/// The chain (DAQ-Middleware): begin and end markers, chunks.
pub const CHAIN: KindRange = KindRange { protocol: "chain", first: 0x0D00, last: 0x0DFF };
/// The event builder: hellos, fragments, assignments, requests, super-fragments.
pub const EVB: KindRange = KindRange { protocol: "evb", first: 0x0E00, last: 0x0EFF };
/// Component control: commands and their replies (reserved).
pub const COMPONENT: KindRange = KindRange { protocol: "component", first: 0x0F00, last: 0x0FFF };
/// The transport's authentication handshake, on every connection before its protocol.
pub const AUTH: KindRange = KindRange { protocol: "auth", first: 0xFF00, last: 0xFFFF };

/// Every range.
pub const ALL: [KindRange; 7] = [DIALOG, ET_REMOTE, DATA_CONTROL, CHAIN, EVB, COMPONENT, AUTH];

/// The protocol a kind belongs to.
pub fn owner(kind: u16) -> Option<&'static str> {
    ALL.iter().find(|r| r.contains(kind)).map(|r| r.protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_protocols_share_a_kind() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(a.first <= a.last, "{a:?}");
            for b in &ALL[i + 1..] {
                assert!(a.last < b.first || b.last < a.first, "{a:?} overlaps {b:?}");
            }
        }
    }
}
