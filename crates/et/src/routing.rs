//! Where an event goes when it is put: the decisions of the ET paper's conductors, as a pure
//! function of the station chain, the event's header and a few counters.
//!
//! In daqflow the process that puts events routes them itself (no round trip to the ET
//! process); only stations that select with a closure living in the ET process send events to
//! its conductor, which continues the routing there.
//!
//! Rules, for each station downstream of the one the event leaves, in chain order:
//! - a station with no attachment lets every event flow past it;
//! - the event must pass the station's selection (all; control integers matching, with
//!   wildcards; a built-in predicate; or the ET process's closure);
//! - with a prescale of N, only every Nth selected event is taken, the others flow past;
//! - a blocking station takes every event it selects; a non-blocking one only while fewer than
//!   its cue are queued, the others flow past;
//! - a parallel group (consecutive stations with the same group id) takes the event into one
//!   member that would take it: round-robin, or the one with the shortest queue; a member that
//!   keeps its events while idle but has no attachment is a candidate only when no attached
//!   member takes the event (a farm member that died leaves its share to the others);
//! - an event no station takes returns to GrandCentral.

/// How a parallel group picks its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupPolicy {
    RoundRobin,
    ShortestQueue,
}

/// A station's selection, as stored in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Select {
    All,
    /// Every control integer whose wildcard bit is clear equals the station's.
    Match {
        ints: [i32; 4],
        wild: u32,
    },
    /// `lo <= control[index] <= hi`.
    Range {
        index: usize,
        lo: i32,
        hi: i32,
    },
    /// `control[index] & mask != 0`.
    MaskAny {
        index: usize,
        mask: i32,
    },
    /// `control[index] & mask == mask`.
    MaskAll {
        index: usize,
        mask: i32,
    },
    /// High-priority events only.
    High,
    /// A closure in the ET process decides.
    Closure,
}

/// What routing needs to know of a station, read from shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StationView {
    pub slot: u32,
    /// Parallel group id; 0 for a station on its own.
    pub group: u32,
    pub policy: GroupPolicy,
    /// It has at least one attachment.
    pub attached: bool,
    /// It keeps its events while it has no attachment (`StationConfig::keep_when_idle`).
    pub keeps: bool,
    pub blocking: bool,
    pub cue: u32,
    pub queued: u32,
    pub prescale: u32,
    pub select: Select,
}

/// What routing needs to know of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventHead {
    pub idx: u32,
    pub control: [i32; 4],
    pub high: bool,
}

/// Counters and closures routing uses (shared memory atomics, or the ET process).
pub(crate) trait RouteEnv {
    /// Counts one more event selected by station `slot`; returns the count before.
    fn prescale_tick(&self, slot: u32) -> u64;
    /// Advances the round-robin counter of the group led by `slot`; returns it before.
    fn round_robin(&self, slot: u32) -> u64;
    /// Runs station `slot`'s closure on event `idx`, if this process has it.
    fn closure(&self, slot: u32, idx: u32) -> Option<bool>;
}

/// Where an event goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dest {
    /// Into this station's input list.
    Station(u32),
    /// Back to GrandCentral (the free list).
    GrandCentral,
    /// To the ET process's conductor, which continues from this chain position.
    Conductor(usize),
}

/// Whether station `s` selects `ev` (`None`: a closure this process does not have).
fn selects(s: &StationView, ev: &EventHead, env: &impl RouteEnv) -> Option<bool> {
    let c = ev.control;
    Some(match s.select {
        Select::All => true,
        Select::Match { ints, wild } => (0..4).all(|i| wild & (1 << i) != 0 || c[i] == ints[i]),
        Select::Range { index, lo, hi } => c.get(index).is_some_and(|v| (lo..=hi).contains(v)),
        Select::MaskAny { index, mask } => c.get(index).is_some_and(|v| v & mask != 0),
        Select::MaskAll { index, mask } => c.get(index).is_some_and(|v| v & mask == mask),
        Select::High => ev.high,
        Select::Closure => return env.closure(s.slot, ev.idx),
    })
}

/// Whether station `s` takes `ev`: attached (or, when `idle` is true, keeping its events while
/// idle), selected, prescaled in, and with room.
fn takes(s: &StationView, ev: &EventHead, idle: bool, env: &impl RouteEnv) -> Option<bool> {
    if !(s.attached || (idle && s.keeps)) {
        return Some(false);
    }
    if !selects(s, ev, env)? {
        return Some(false);
    }
    if s.prescale > 1 && !env.prescale_tick(s.slot).is_multiple_of(s.prescale as u64) {
        return Some(false);
    }
    Some(s.blocking || s.queued < s.cue)
}

/// Routes `ev` starting at chain position `from` (0 = the first station after GrandCentral).
pub(crate) fn route(chain: &[StationView], from: usize, ev: &EventHead, env: &impl RouteEnv) -> Dest {
    let mut p = from;
    while p < chain.len() {
        let s = &chain[p];
        if s.group == 0 {
            match takes(s, ev, true, env) {
                Some(true) => return Dest::Station(s.slot),
                Some(false) => p += 1,
                None => return Dest::Conductor(p),
            }
            continue;
        }
        // A parallel group: every attached member that would take the event is a candidate;
        // if none would, every member without an attachment that keeps its events while idle.
        let end = chain[p..].iter().position(|m| m.group != s.group).map_or(chain.len(), |n| p + n);
        let mut candidates = [0usize; 64];
        let mut n = 0;
        for idle in [false, true] {
            for (i, m) in chain[p..end].iter().enumerate() {
                if idle && m.attached {
                    continue;
                }
                match takes(m, ev, idle, env) {
                    Some(true) if n < candidates.len() => {
                        candidates[n] = p + i;
                        n += 1;
                    }
                    Some(_) => {}
                    None => return Dest::Conductor(p),
                }
            }
            if n > 0 {
                break;
            }
        }
        if n > 0 {
            let pick = match s.policy {
                GroupPolicy::RoundRobin => candidates[(env.round_robin(s.slot) % n as u64) as usize],
                GroupPolicy::ShortestQueue => *candidates[..n].iter().min_by_key(|&&i| chain[i].queued).expect("n > 0"),
            };
            return Dest::Station(chain[pick].slot);
        }
        p = end;
    }
    Dest::GrandCentral
}

/// Whether every event put at `from` goes to the same place regardless of its header and of
/// counters (the common case: one blocking station selecting all, or none): then a whole batch
/// is routed at once.
pub(crate) fn uniform(chain: &[StationView], from: usize) -> Option<Dest> {
    for s in &chain[from.min(chain.len())..] {
        if !s.attached && !s.keeps {
            continue;
        }
        let simple = s.group == 0 && s.select == Select::All && s.prescale <= 1 && s.blocking;
        return simple.then_some(Dest::Station(s.slot));
    }
    Some(Dest::GrandCentral)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    #[derive(Default)]
    struct Env {
        prescale: RefCell<HashMap<u32, u64>>,
        rr: Cell<u64>,
        closure: Option<fn(u32) -> bool>,
    }

    impl RouteEnv for Env {
        fn prescale_tick(&self, slot: u32) -> u64 {
            let mut m = self.prescale.borrow_mut();
            let c = m.entry(slot).or_default();
            *c += 1;
            *c - 1
        }
        fn round_robin(&self, _slot: u32) -> u64 {
            self.rr.set(self.rr.get() + 1);
            self.rr.get() - 1
        }
        fn closure(&self, _slot: u32, idx: u32) -> Option<bool> {
            self.closure.map(|f| f(idx))
        }
    }

    fn station(slot: u32) -> StationView {
        StationView {
            slot,
            group: 0,
            policy: GroupPolicy::RoundRobin,
            attached: true,
            keeps: false,
            blocking: true,
            cue: 10,
            queued: 0,
            prescale: 1,
            select: Select::All,
        }
    }

    fn ev(control: [i32; 4]) -> EventHead {
        EventHead { idx: 0, control, high: false }
    }

    #[test]
    fn an_unattached_station_lets_events_flow_past() {
        let chain = [StationView { attached: false, ..station(1) }, station(2)];
        assert_eq!(route(&chain, 0, &ev([0; 4]), &Env::default()), Dest::Station(2));
        assert_eq!(route(&chain, 2, &ev([0; 4]), &Env::default()), Dest::GrandCentral);
        assert_eq!(uniform(&chain, 0), Some(Dest::Station(2)));
    }

    #[test]
    fn selection_by_control_integers_with_wildcards() {
        let sel = Select::Match { ints: [1, 2, 0, 0], wild: 0b1100 };
        let chain = [StationView { select: sel, ..station(1) }, station(2)];
        let env = Env::default();
        assert_eq!(route(&chain, 0, &ev([1, 2, 99, -5]), &env), Dest::Station(1));
        assert_eq!(route(&chain, 0, &ev([1, 3, 0, 0]), &env), Dest::Station(2));
        assert_eq!(uniform(&chain, 0), None);
        let chain = [StationView { select: Select::Range { index: 3, lo: 10, hi: 20 }, ..station(1) }];
        assert_eq!(route(&chain, 0, &ev([0, 0, 0, 15]), &env), Dest::Station(1));
        assert_eq!(route(&chain, 0, &ev([0, 0, 0, 21]), &env), Dest::GrandCentral);
        let chain = [StationView { select: Select::MaskAll { index: 0, mask: 0b101 }, ..station(1) }];
        assert_eq!(route(&chain, 0, &ev([0b111, 0, 0, 0]), &env), Dest::Station(1));
        assert_eq!(route(&chain, 0, &ev([0b011, 0, 0, 0]), &env), Dest::GrandCentral);
        let chain = [StationView { select: Select::High, ..station(1) }];
        assert_eq!(route(&chain, 0, &EventHead { high: true, ..ev([0; 4]) }, &env), Dest::Station(1));
    }

    #[test]
    fn prescale_takes_every_nth_selected_event() {
        let chain = [StationView { prescale: 3, ..station(1) }, station(2)];
        let env = Env::default();
        let got: Vec<Dest> = (0..6).map(|_| route(&chain, 0, &ev([0; 4]), &env)).collect();
        use Dest::Station as S;
        assert_eq!(got, [S(1), S(2), S(2), S(1), S(2), S(2)]);
    }

    #[test]
    fn a_non_blocking_station_takes_events_only_below_its_cue() {
        let full = StationView { blocking: false, cue: 5, queued: 5, ..station(1) };
        let room = StationView { queued: 4, ..full };
        assert_eq!(route(&[full, station(2)], 0, &ev([0; 4]), &Env::default()), Dest::Station(2));
        assert_eq!(route(&[room, station(2)], 0, &ev([0; 4]), &Env::default()), Dest::Station(1));
    }

    #[test]
    fn a_parallel_group_distributes_round_robin_or_to_the_shortest_queue() {
        let g = |slot, queued| StationView { group: 7, queued, ..station(slot) };
        let chain = [g(1, 0), g(2, 0), g(3, 0), station(4)];
        let env = Env::default();
        let got: Vec<Dest> = (0..6).map(|_| route(&chain, 0, &ev([0; 4]), &env)).collect();
        use Dest::Station as S;
        assert_eq!(got, [S(1), S(2), S(3), S(1), S(2), S(3)]);
        let shortest = [
            StationView { policy: GroupPolicy::ShortestQueue, ..g(1, 9) },
            StationView { policy: GroupPolicy::ShortestQueue, ..g(2, 3) },
            StationView { policy: GroupPolicy::ShortestQueue, ..g(3, 5) },
        ];
        assert_eq!(route(&shortest, 0, &ev([0; 4]), &env), S(2));
        // A member that would not take it is skipped; a group none of whose members takes it
        // lets the event flow on.
        let mixed = [StationView { attached: false, ..g(1, 0) }, g(2, 0), station(4)];
        assert_eq!(route(&mixed, 0, &ev([0; 4]), &env), S(2));
        let none = [StationView { attached: false, ..g(1, 0) }, StationView { attached: false, ..g(2, 0) }, station(4)];
        assert_eq!(route(&none, 0, &ev([0; 4]), &env), S(4));
    }

    #[test]
    fn a_group_member_keeping_its_events_while_idle_takes_only_what_no_attached_member_takes() {
        let g = |slot| StationView { group: 7, keeps: true, ..station(slot) };
        let away = StationView { attached: false, ..g(2) };
        let chain = [g(1), away, g(3), station(4)];
        let env = Env::default();
        use Dest::Station as S;
        let got: Vec<Dest> = (0..4).map(|_| route(&chain, 0, &ev([0; 4]), &env)).collect();
        assert_eq!(got, [S(1), S(3), S(1), S(3)]);
        // Every member away: the events wait in the members, none flows past the group.
        let all_away = [StationView { attached: false, ..g(1) }, away, station(4)];
        let got: Vec<Dest> = (0..2).map(|_| route(&all_away, 0, &ev([0; 4]), &env)).collect();
        assert_eq!(got.iter().filter(|d| **d == S(4)).count(), 0, "{got:?}");
        // A station on its own that keeps its events takes them without an attachment.
        let alone = [StationView { attached: false, keeps: true, ..station(1) }, station(2)];
        assert_eq!(route(&alone, 0, &ev([0; 4]), &env), S(1));
        assert_eq!(uniform(&alone, 0), Some(S(1)));
    }

    #[test]
    fn a_closure_station_hands_over_to_the_conductor_unless_this_process_has_it() {
        let chain = [station(1), StationView { select: Select::Closure, ..station(2) }, station(3)];
        assert_eq!(route(&chain, 1, &ev([0; 4]), &Env::default()), Dest::Conductor(1));
        let env = Env { closure: Some(|idx| idx % 2 == 0), ..Env::default() };
        assert_eq!(route(&chain, 1, &EventHead { idx: 4, ..ev([0; 4]) }, &env), Dest::Station(2));
        assert_eq!(route(&chain, 1, &EventHead { idx: 5, ..ev([0; 4]) }, &env), Dest::Station(3));
    }
}
