//! The EVM's bookkeeping, without sockets: triggers, credits, assignments, level-2 rejects,
//! re-assignment after a BU loss, and the run's accounting.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::time::{Duration, Instant};

use daqflow_engine::event_manager::EventIdHasher;

use crate::model::Rng;
use crate::protocol::{Message, Trigger};

/// Most unassigned credits one BU may hold.
pub const MAX_CREDITS: u64 = 1 << 20;

/// What the core wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// To one BU.
    Bu(u32, Message),
    /// To every RU.
    Rus(Message),
    /// Level-2 rejects, to every RU (grouped into the engine's reject messages by the caller).
    Reject(Vec<u64>),
    /// Built events whose fragments the RUs may free (grouped into discard messages).
    Release(Vec<u64>),
}

#[derive(Debug, Default)]
struct Bu {
    /// Which admission of its id: the BUs with that id removed before it.
    generation: u32,
    credits: u64,
    /// Assigned, not yet confirmed, by event id: a hash map (an ordered map's insert and
    /// remove of every event were 9 % of the EVM's time at 250 k events/s). A lost BU's events
    /// are sorted when they go back to the queue.
    outstanding: HashMap<u64, Trigger, BuildHasherDefault<EventIdHasher>>,
    built: u64,
}

/// Counters of a run: every triggered event is in exactly one of built, rejected, lost, or still
/// in flight (pending or assigned).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Accounting {
    /// Events triggered (level-1 accepts): ids 1..=triggered.
    pub triggered: u64,
    /// Events assigned to a BU (re-assignments counted again).
    pub assignments: u64,
    /// Events confirmed by their BU.
    pub built: u64,
    /// Events rejected by the level-2 emulation.
    pub rejected: u64,
    /// Events re-assigned after their BU was lost.
    pub reassigned: u64,
    /// Events lost, with the reason.
    pub lost: BTreeMap<String, u64>,
    /// Confirmations for events the BU did not hold (ignored).
    pub unexpected_confirmations: u64,
}

impl Accounting {
    /// Events lost, all reasons together.
    pub fn lost_total(&self) -> u64 {
        self.lost.values().sum()
    }
}

/// Settings of the core.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreConfig {
    /// Fraction of events the level-2 emulation rejects (0 … 1).
    pub reject_fraction: f64,
    /// Most events in one assignment.
    pub assign_batch: u32,
    /// A smaller assignment is sent once its oldest trigger waited this long.
    pub assign_timeout: Duration,
    /// Seed of the level-2 emulation.
    pub seed: u64,
}

/// The EVM's state.
#[derive(Debug)]
pub struct EvmCore {
    config: CoreConfig,
    rus: Vec<u32>,
    rng: Rng,
    next_id: u64,
    /// Accepted triggers waiting for a BU, oldest first (re-assigned ones go to the front), with
    /// the time they became pending.
    pending: VecDeque<(Trigger, Instant)>,
    bus: BTreeMap<u32, Bu>,
    /// Per BU id, the BUs with that id removed so far (each with a BU gone to the RUs): the
    /// generation of the next one admitted.
    removed: BTreeMap<u32, u32>,
    /// Round-robin position among BUs.
    turn: u32,
    stopped_at: Option<u64>,
    acc: Accounting,
}

impl EvmCore {
    /// A core for a run with these RUs.
    pub fn new(config: CoreConfig, rus: Vec<u32>) -> EvmCore {
        EvmCore {
            rng: Rng::new(config.seed),
            config,
            rus,
            next_id: 1,
            pending: VecDeque::new(),
            bus: BTreeMap::new(),
            removed: BTreeMap::new(),
            turn: 0,
            stopped_at: None,
            acc: Accounting::default(),
        }
    }

    /// The RUs of the run.
    pub fn rus(&self) -> &[u32] {
        &self.rus
    }

    /// The accounting so far.
    pub fn accounting(&self) -> &Accounting {
        &self.acc
    }

    /// Triggers waiting for a BU.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Events assigned and not yet confirmed.
    pub fn in_flight(&self) -> usize {
        self.bus.values().map(|b| b.outstanding.len()).sum()
    }

    /// Credits of all BUs not yet used.
    pub fn total_credits(&self) -> u64 {
        self.bus.values().map(|b| b.credits).sum()
    }

    /// The connected BUs with (credits, events in flight, events built).
    pub fn bus(&self) -> impl Iterator<Item = (u32, u64, usize, u64)> + '_ {
        self.bus.iter().map(|(id, b)| (*id, b.credits, b.outstanding.len(), b.built))
    }

    /// The next event id a trigger will get.
    pub fn next_event_id(&self) -> u64 {
        self.next_id
    }

    /// Whether triggering has stopped, and the last event of the run.
    pub fn stopped_at(&self) -> Option<u64> {
        self.stopped_at
    }

    /// A BU joined: its generation, the number of BUs with its id removed before it (the BU
    /// tells the RUs in its hello; the RU list carries it). Adding a BU that is there already
    /// changes nothing.
    pub fn add_bu(&mut self, bu: u32) -> u32 {
        let generation = self.removed.get(&bu).copied().unwrap_or(0);
        self.bus.entry(bu).or_insert_with(|| Bu { generation, ..Bu::default() }).generation
    }

    /// The generation of BU `bu`, if it is there.
    pub fn generation(&self, bu: u32) -> Option<u32> {
        self.bus.get(&bu).map(|b| b.generation)
    }

    /// A BU is gone: its unconfirmed events go back to the front of the queue (marked
    /// re-assigned) and the RUs are told to drop what they queued for it (BU gone, with its
    /// generation); the next BU with its id gets the next generation.
    pub fn remove_bu(&mut self, bu: u32, now: Instant, out: &mut Vec<Out>) {
        let Some(b) = self.bus.remove(&bu) else { return };
        self.removed.insert(bu, b.generation.saturating_add(1));
        out.push(Out::Rus(Message::BuGone { bu, generation: b.generation }));
        if mutated!(NoReassignment) {
            return;
        }
        self.acc.reassigned += b.outstanding.len() as u64;
        // Back to the front in event order: the oldest event first.
        let mut back: Vec<Trigger> = b.outstanding.into_values().collect();
        back.sort_unstable_by_key(|t| t.event_id);
        for mut t in back.into_iter().rev() {
            t.flags |= Trigger::REASSIGNED;
            self.pending.push_front((t, now));
        }
    }

    /// A level-1 accept (emulated, or from the trigger source). Ids must be given in order; an
    /// id that is not the next one is refused. Returns whether the event was accepted by the
    /// level-2 emulation.
    pub fn trigger(&mut self, t: Trigger, now: Instant, out: &mut Vec<Out>) -> Result<bool, String> {
        if self.stopped_at.is_some() {
            return Err(format!("trigger {} after the end of the run", t.event_id));
        }
        if t.event_id != self.next_id {
            return Err(format!("trigger for event {} where {} was expected", t.event_id, self.next_id));
        }
        self.next_id += 1;
        self.acc.triggered += 1;
        if self.config.reject_fraction > 0.0 && self.rng.unit() < self.config.reject_fraction {
            self.acc.rejected += 1;
            match out.last_mut() {
                Some(Out::Reject(ids)) => ids.push(t.event_id),
                _ => out.push(Out::Reject(vec![t.event_id])),
            }
            return Ok(false);
        }
        self.pending.push_back((t, now));
        Ok(true)
    }

    /// Emulated free-running triggers: makes as many as the BUs' credits can take now, keeping
    /// at most `max_pending` waiting.
    pub fn trigger_on_demand(&mut self, now: Instant, timestamp: u64, max_pending: usize, out: &mut Vec<Out>) {
        if self.stopped_at.is_some() {
            return;
        }
        let room = max_pending.saturating_sub(self.pending.len()) as u64;
        let want = self.total_credits().saturating_sub(self.pending.len() as u64).min(room);
        let mut accepted = 0;
        // With rejects, keep triggering until the credits are covered (bounded for safety).
        let mut budget = want.saturating_mul(4).max(want + 64);
        while accepted < want && budget > 0 {
            budget -= 1;
            let t = Trigger { event_id: self.next_id, trigger_type: 1, flags: 0, timestamp };
            if self.trigger(t, now, out).unwrap_or(false) {
                accepted += 1;
            }
        }
    }

    /// A BU's request: `credits` more, and confirmations of `done`.
    pub fn request(&mut self, bu: u32, credits: u32, done: &[u64], out: &mut Vec<Out>) {
        let Some(b) = self.bus.get_mut(&bu) else { return };
        // A BU cannot hold more than this many unassigned credits (a peer asking for 2^32 would
        // otherwise make the EVM trigger without bound).
        b.credits = (b.credits + u64::from(credits)).min(MAX_CREDITS);
        let mut released = Vec::with_capacity(done.len());
        for id in done {
            if b.outstanding.remove(id).is_some() {
                b.built += 1;
                self.acc.built += 1;
                released.push(*id);
            } else {
                self.acc.unexpected_confirmations += 1;
            }
        }
        if !released.is_empty() {
            out.push(Out::Release(released));
        }
    }

    /// Hands pending triggers to BUs with credits: an assignment of up to `assign_batch` events
    /// goes out when that many are pending, or when the oldest has waited `assign_timeout`, or
    /// when the run is stopping.
    pub fn assign(&mut self, now: Instant, out: &mut Vec<Out>) -> usize {
        let mut assigned = 0;
        while let Some(&(_, oldest)) = self.pending.front() {
            let due = self.stopped_at.is_some() || now.duration_since(oldest) >= self.config.assign_timeout;
            // Next BU with credits, round-robin from `turn`.
            let Some(bu) = self
                .bus
                .range(self.turn..)
                .chain(self.bus.range(..self.turn))
                .find(|(_, b)| b.credits > 0)
                .map(|(id, _)| *id)
            else {
                break;
            };
            let b = self.bus.get_mut(&bu).expect("found above");
            let n = b.credits.min(u64::from(self.config.assign_batch)) as usize;
            if self.pending.len() < n && !due {
                break;
            }
            let n = n.min(self.pending.len());
            let triggers: Vec<Trigger> = self.pending.drain(..n).map(|(t, _)| t).collect();
            b.credits -= n as u64;
            for t in &triggers {
                b.outstanding.insert(t.event_id, *t);
            }
            self.acc.assignments += n as u64;
            assigned += n;
            self.turn = bu.wrapping_add(1);
            out.push(Out::Rus(Message::Assign { bu, events: triggers.iter().map(|t| t.event_id).collect() }));
            out.push(Out::Bu(bu, Message::Triggers { rus: self.rus.clone(), triggers }));
        }
        assigned
    }

    /// Stops triggering; the run's last event is the last one triggered.
    pub fn stop(&mut self) -> u64 {
        *self.stopped_at.get_or_insert(self.next_id - 1)
    }

    /// Checks the books: every event triggered is built, rejected, lost, waiting for a BU, or in
    /// flight at one (`triggered = built + rejected + lost + pending + in flight`); the error says
    /// by how much they do not balance.
    pub fn check_books(&self) -> Result<(), String> {
        let a = &self.acc;
        let (pending, in_flight) = (self.pending.len() as u64, self.in_flight() as u64);
        let accounted = a.built + a.rejected + a.lost_total() + pending + in_flight;
        if a.triggered == accounted {
            return Ok(());
        }
        Err(format!(
            "the books do not balance: triggered {} but built {} + rejected {} + lost {} + pending {pending} + in \
             flight {in_flight} = {accounted}",
            a.triggered,
            a.built,
            a.rejected,
            a.lost_total()
        ))
    }

    /// Whether every triggered event is built, rejected or lost.
    pub fn is_drained(&self) -> bool {
        self.pending.is_empty() && self.in_flight() == 0
    }

    /// Ends the run: whatever is still pending or in flight is counted lost with the reason.
    pub fn finish(&mut self) -> Accounting {
        if !self.pending.is_empty() {
            let n = self.pending.len() as u64;
            let reason = if self.bus.is_empty() {
                "no builder unit left to build them"
            } else {
                "not assigned before the drain timeout"
            };
            *self.acc.lost.entry(reason.into()).or_default() += n;
            self.pending.clear();
        }
        for (id, b) in &mut self.bus {
            if !b.outstanding.is_empty() {
                *self.acc.lost.entry(format!("BU {id} did not confirm them before the drain timeout")).or_default() +=
                    b.outstanding.len() as u64;
                b.outstanding.clear();
            }
        }
        self.acc.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core(reject: f64) -> EvmCore {
        EvmCore::new(
            CoreConfig { reject_fraction: reject, assign_batch: 4, assign_timeout: Duration::from_millis(10), seed: 1 },
            vec![0, 1],
        )
    }

    fn trig(c: &mut EvmCore, n: usize, now: Instant, out: &mut Vec<Out>) {
        for _ in 0..n {
            let id = c.next_event_id();
            c.trigger(Trigger { event_id: id, trigger_type: 1, flags: 0, timestamp: 0 }, now, out).unwrap();
        }
    }

    fn assigned(out: &[Out]) -> Vec<(u32, Vec<u64>)> {
        out.iter()
            .filter_map(|o| match o {
                Out::Rus(Message::Assign { bu, events }) => Some((*bu, events.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn requests_get_the_next_events_in_batches_round_robin() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.add_bu(2);
        c.request(1, 8, &[], &mut out);
        c.request(2, 4, &[], &mut out);
        trig(&mut c, 12, now, &mut out);
        c.assign(now, &mut out);
        assert_eq!(assigned(&out), vec![(1, vec![1, 2, 3, 4]), (2, vec![5, 6, 7, 8]), (1, vec![9, 10, 11, 12])],);
        // The BU gets the same events with their trigger data and the RU list.
        let to_bu1: Vec<u64> = out
            .iter()
            .filter_map(|o| match o {
                Out::Bu(1, Message::Triggers { rus, triggers }) => {
                    assert_eq!(rus, &[0, 1]);
                    Some(triggers.iter().map(|t| t.event_id).collect::<Vec<_>>())
                }
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(to_bu1, [1, 2, 3, 4, 9, 10, 11, 12]);
        assert_eq!(c.total_credits(), 0);
        assert_eq!(c.in_flight(), 12);
    }

    #[test]
    fn a_partial_batch_waits_for_the_timeout() {
        let mut c = core(0.0);
        let t0 = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.request(1, 8, &[], &mut out);
        trig(&mut c, 2, t0, &mut out);
        assert_eq!(c.assign(t0, &mut out), 0);
        assert_eq!(c.assign(t0 + Duration::from_millis(11), &mut out), 2);
    }

    #[test]
    fn confirmations_release_and_count_built() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.request(1, 4, &[], &mut out);
        trig(&mut c, 4, now, &mut out);
        c.assign(now, &mut out);
        out.clear();
        c.request(1, 2, &[1, 2, 99], &mut out);
        assert_eq!(out, vec![Out::Release(vec![1, 2])]);
        assert_eq!((c.accounting().built, c.accounting().unexpected_confirmations), (2, 1));
        c.stop();
        assert!(!c.is_drained());
        c.request(1, 0, &[3, 4], &mut out);
        assert!(c.is_drained());
        assert_eq!(c.finish().lost_total(), 0);
    }

    #[test]
    fn a_lost_bus_unconfirmed_events_go_back_oldest_first_whatever_was_confirmed() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.request(1, 200, &[], &mut out);
        trig(&mut c, 200, now, &mut out);
        c.assign(now, &mut out);
        // Confirmed out of order, as builder threads do: every third one.
        let done: Vec<u64> = (1..=200).rev().filter(|id| id % 3 == 0).collect();
        c.request(1, 0, &done, &mut out);
        out.clear();
        c.remove_bu(1, now, &mut out);
        c.add_bu(2);
        c.request(2, 1000, &[], &mut out);
        c.stop(); // every pending event is due: the last batch goes out short
        c.assign(now, &mut out);
        let again: Vec<u64> = assigned(&out).into_iter().flat_map(|(_, ids)| ids).collect();
        assert_eq!(again, (1..=200).filter(|id| id % 3 != 0).collect::<Vec<_>>());
        assert_eq!(c.accounting().reassigned, again.len() as u64);
    }

    #[test]
    fn a_lost_bu_gets_its_events_reassigned_first_and_marked() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.add_bu(2);
        c.request(1, 4, &[], &mut out);
        trig(&mut c, 8, now, &mut out);
        c.assign(now, &mut out);
        c.request(1, 0, &[1], &mut out);
        out.clear();
        c.remove_bu(1, now, &mut out);
        assert_eq!(out, vec![Out::Rus(Message::BuGone { bu: 1, generation: 0 })]);
        c.request(2, 4, &[], &mut out);
        c.assign(now, &mut out);
        assert_eq!(assigned(&out), vec![(2, vec![2, 3, 4, 5])]);
        let flags: Vec<u32> = out
            .iter()
            .filter_map(|o| match o {
                Out::Bu(2, Message::Triggers { triggers, .. }) => {
                    Some(triggers.iter().map(|t| t.flags).collect::<Vec<_>>())
                }
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(flags, [Trigger::REASSIGNED, Trigger::REASSIGNED, Trigger::REASSIGNED, 0]);
        assert_eq!(c.accounting().reassigned, 3);
        // Without any BU left, the rest is lost with a reason at the end.
        c.remove_bu(2, now, &mut out);
        c.stop();
        let acc = c.finish();
        assert_eq!(acc.built, 1);
        assert_eq!(acc.lost_total(), 7);
        assert_eq!(acc.lost.keys().collect::<Vec<_>>(), ["no builder unit left to build them"]);
        assert_eq!(acc.triggered, acc.built + acc.rejected + acc.lost_total());
    }

    #[test]
    fn level_2_rejects_are_grouped_and_never_assigned() {
        let mut c = core(0.5);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.request(1, 1000, &[], &mut out);
        trig(&mut c, 1000, now, &mut out);
        c.stop();
        c.assign(now, &mut out);
        let rejected: Vec<u64> =
            out.iter().filter_map(|o| if let Out::Reject(v) = o { Some(v.clone()) } else { None }).flatten().collect();
        let assigned: Vec<u64> = assigned(&out).into_iter().flat_map(|(_, v)| v).collect();
        assert!((400..600).contains(&rejected.len()), "{} rejected", rejected.len());
        assert_eq!(rejected.len() + assigned.len(), 1000);
        assert!(rejected.iter().all(|r| !assigned.contains(r)));
        assert_eq!(c.accounting().rejected, rejected.len() as u64);
    }

    #[test]
    fn on_demand_triggers_cover_the_credits_and_stop_at_the_end() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        c.add_bu(1);
        c.request(1, 10, &[], &mut out);
        c.trigger_on_demand(now, 0, 1 << 20, &mut out);
        assert_eq!(c.pending(), 10);
        assert_eq!(c.stop(), 10);
        c.trigger_on_demand(now, 0, 1 << 20, &mut out);
        assert_eq!(c.accounting().triggered, 10);
        assert!(c.trigger(Trigger { event_id: 11, ..Default::default() }, now, &mut out).is_err());
    }

    #[test]
    fn each_admission_of_a_bu_id_has_the_next_generation_and_its_bu_gone_names_it() {
        let mut c = core(0.0);
        let now = Instant::now();
        let mut out = Vec::new();
        assert_eq!((c.add_bu(3), c.add_bu(4)), (0, 0));
        assert_eq!(c.add_bu(3), 0, "adding it again changes nothing");
        c.remove_bu(3, now, &mut out);
        c.remove_bu(3, now, &mut out);
        assert_eq!(out, vec![Out::Rus(Message::BuGone { bu: 3, generation: 0 })], "a BU is removed once");
        assert_eq!((c.generation(3), c.add_bu(3), c.generation(3)), (None, 1, Some(1)));
        out.clear();
        c.remove_bu(3, now, &mut out);
        c.remove_bu(4, now, &mut out);
        assert_eq!(
            out,
            vec![
                Out::Rus(Message::BuGone { bu: 3, generation: 1 }),
                Out::Rus(Message::BuGone { bu: 4, generation: 0 })
            ]
        );
        assert_eq!((c.add_bu(3), c.add_bu(4), c.add_bu(5)), (2, 1, 0));
    }

    #[test]
    fn out_of_order_triggers_are_refused() {
        let mut c = core(0.0);
        let mut out = Vec::new();
        assert!(c.trigger(Trigger { event_id: 2, ..Default::default() }, Instant::now(), &mut out).is_err());
    }
}
