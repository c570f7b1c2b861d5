//! The builder unit's logic, without sockets: collecting super-fragments per event, completion,
//! and building and checking an event from its parts without copying them.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use bytes::Bytes;
use daqflow_wire::{
    EVENT_HEADER_LEN, EventFlags, EventId, EventInfo, FragmentFlags, SuperFragment, SuperFragmentFlags,
    SuperFragmentHeader,
};

use daqflow_engine::event_manager::EventIdHasher;

use crate::protocol::Trigger;

/// One received super-fragment, as received (a slice of the receive buffer).
#[derive(Debug, Clone)]
pub struct SfParts {
    /// The header.
    pub header: SuperFragmentHeader,
    /// The whole encoded super-fragment, header included.
    pub bytes: Bytes,
}

/// An event whose super-fragments have all arrived.
#[derive(Debug, Clone)]
pub struct ReadyEvent {
    /// Its trigger data.
    pub trigger: Trigger,
    /// One super-fragment per RU, in RU order.
    pub parts: Vec<SfParts>,
}

#[derive(Debug, Default)]
struct Partial {
    trigger: Option<Trigger>,
    parts: Vec<SfParts>,
}

/// Collects super-fragments into events.
#[derive(Debug, Default)]
pub struct BuCore {
    rus: Vec<u32>,
    /// By event id, with the event manager's hash of consecutive ids (the default hasher was a
    /// measurable share of the BU's I/O thread: three look-ups per event).
    events: HashMap<u64, Partial, BuildHasherDefault<EventIdHasher>>,
}

impl BuCore {
    /// An empty collector.
    pub fn new() -> BuCore {
        BuCore::default()
    }

    /// Events assigned or partly received, not complete yet.
    pub fn in_progress(&self) -> usize {
        self.events.len()
    }

    /// Events of `triggers` are assigned to this BU, with super-fragments from `rus`.
    pub fn on_triggers(&mut self, rus: &[u32], triggers: &[Trigger], ready: &mut Vec<ReadyEvent>) {
        if self.rus != rus {
            self.rus = rus.to_vec();
        }
        for t in triggers {
            let p = self.events.entry(t.event_id).or_default();
            // Super-fragments may arrive before the trigger data (they come from the RUs, the
            // trigger data from the EVM): they wait in `events` either way.
            p.trigger = Some(*t);
            self.complete(t.event_id, ready);
        }
    }

    /// A super-fragment from RU `ru` (one frame's payload). A malformed one is an error: the
    /// link cannot be trusted any more.
    pub fn on_super_fragment(&mut self, ru: u32, bytes: Bytes, ready: &mut Vec<ReadyEvent>) -> Result<(), String> {
        let sf = SuperFragment::parse(bytes).map_err(|e| format!("RU {ru}: malformed super-fragment: {e}"))?;
        let header = *sf.header();
        if header.ru_id != ru {
            return Err(format!("RU {ru} sent a super-fragment of RU {}", header.ru_id));
        }
        self.add(SfParts { header, bytes: sf.as_bytes().clone() }, ready);
        Ok(())
    }

    fn add(&mut self, parts: SfParts, ready: &mut Vec<ReadyEvent>) {
        let id = parts.header.event_id.0;
        let p = self.events.entry(id).or_default();
        // A duplicate from the same RU (a re-assignment racing the original) replaces it.
        p.parts.retain(|q| q.header.ru_id != parts.header.ru_id);
        p.parts.push(parts);
        self.complete(id, ready);
    }

    fn complete(&mut self, id: u64, ready: &mut Vec<ReadyEvent>) {
        let Some(p) = self.events.get(&id) else { return };
        if p.trigger.is_none() || p.parts.len() < self.rus.len() {
            return;
        }
        let mut p = self.events.remove(&id).expect("present");
        p.parts.sort_by_key(|s| s.header.ru_id);
        ready.push(ReadyEvent { trigger: p.trigger.expect("checked"), parts: p.parts });
    }

    /// Forgets every event in progress (end of run); returns their ids.
    pub fn clear(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.events.drain().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids
    }
}

/// How much a builder thread checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckLevel {
    /// Verify every fragment's payload CRC (the paper's "checksum" step).
    pub crc: bool,
}

/// A built event: its header and its parts in order (event header, then the super-fragments
/// as received), ready for a vectored write; no byte of event data was copied.
#[derive(Debug, Clone)]
pub struct BuiltEvent {
    /// The event id.
    pub event_id: u64,
    /// The flags found by the checks.
    pub flags: EventFlags,
    /// Total bytes.
    pub len: usize,
    /// Event header, then the super-fragments.
    pub parts: Vec<Bytes>,
    /// Fragments whose CRC did not match (when checked).
    pub crc_errors: u32,
    /// Parts that belong to another event, or could not be read.
    pub id_mismatches: u32,
}

/// Builds (and checks) one event: every super-fragment and fragment must carry the event's id;
/// flags set by the front end or the RU are carried into the event's flags; with `level.crc`
/// every fragment's payload CRC is verified.
pub fn build(ev: ReadyEvent, bu_id: u32, run: u32, level: CheckLevel) -> BuiltEvent {
    let id = ev.trigger.event_id;
    let mut flags = EventFlags::empty();
    let mut crc_errors = 0u32;
    let mut id_mismatches = 0u32;
    let mut parts = Vec::with_capacity(1 + ev.parts.len());
    parts.push(Bytes::new()); // the event header, below
    for p in ev.parts {
        let h = p.header;
        if h.event_id.0 != id {
            id_mismatches += 1;
        }
        if h.flags.contains(SuperFragmentFlags::INCOMPLETE) {
            flags = flags.with(EventFlags::INCOMPLETE);
        }
        if h.flags.contains(SuperFragmentFlags::CRC_ERROR) {
            flags = flags.with(EventFlags::CRC_ERROR);
        }
        let sf = SuperFragment::parse(p.bytes.clone()).expect("parsed when received");
        for f in sf.fragments() {
            let Ok(f) = f else {
                id_mismatches += 1;
                flags = flags.with(EventFlags::INCOMPLETE);
                break;
            };
            let fh = f.header();
            if fh.event_id.0 != id {
                id_mismatches += 1;
            }
            if fh.flags.contains(FragmentFlags::TRUNCATED) {
                flags = flags.with(EventFlags::TRUNCATED);
            }
            if fh.flags.contains(FragmentFlags::CRC_ERROR) {
                flags = flags.with(EventFlags::CRC_ERROR);
            }
            if level.crc && f.verify_crc().is_err() {
                crc_errors += 1;
                flags = flags.with(EventFlags::CRC_ERROR);
            }
        }
        parts.push(p.bytes);
    }
    if id_mismatches > 0 {
        flags = flags.with(EventFlags::EVENT_ID_MISMATCH);
    }
    let info =
        EventInfo { flags, bu_id, event_id: EventId(id), run_number: run, trigger_type: ev.trigger.trigger_type };
    let header = info.header_for(parts[1..].iter().map(Bytes::len));
    let len = header.total_len as usize;
    parts[0] = Bytes::copy_from_slice(&header.encode());
    debug_assert_eq!(len, EVENT_HEADER_LEN + parts[1..].iter().map(Bytes::len).sum::<usize>());
    BuiltEvent { event_id: id, flags, len, parts, crc_errors, id_mismatches }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_wire::{Event, Fragment, FragmentInfo};

    fn frag(source: u32, id: u64, payload: &[u8]) -> Bytes {
        Fragment::encode(&FragmentInfo { source_id: source, event_id: EventId(id), ..Default::default() }, payload)
    }

    fn sf(ru: u32, id: u64, frags: Vec<Bytes>) -> Bytes {
        let frags: Vec<Fragment> = frags.into_iter().map(|f| Fragment::parse(f).unwrap()).collect();
        SuperFragment::assemble(ru, EventId(id), SuperFragmentFlags::default(), &frags)
    }

    fn send(c: &mut BuCore, ru: u32, id: u64, frags: Vec<Bytes>, ready: &mut Vec<ReadyEvent>) {
        c.on_super_fragment(ru, sf(ru, id, frags), ready).unwrap();
    }

    fn trig(id: u64) -> Trigger {
        Trigger { event_id: id, trigger_type: 2, flags: 0, timestamp: 0 }
    }

    #[test]
    fn an_event_completes_when_the_trigger_and_every_ru_arrived_in_any_order() {
        let mut c = BuCore::new();
        let mut ready = Vec::new();
        send(&mut c, 1, 5, vec![frag(10, 5, b"one"), frag(11, 5, b"two")], &mut ready);
        c.on_triggers(&[0, 1], &[trig(5)], &mut ready);
        assert!(ready.is_empty());
        send(&mut c, 0, 5, vec![frag(0, 5, b"zero")], &mut ready);
        assert_eq!(ready.len(), 1);
        assert_eq!(c.in_progress(), 0);
        let built = build(ready.pop().unwrap(), 9, 3, CheckLevel { crc: true });
        assert_eq!(built.flags, EventFlags::empty());
        // The parts make a valid event that the wire format's checker accepts.
        let bytes: Vec<u8> = built.parts.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(bytes.len(), built.len);
        let event = Event::parse(Bytes::from(bytes)).unwrap();
        let check = event.check().unwrap();
        assert!(check.is_clean());
        assert_eq!((check.super_fragments, check.fragments), (2, 3));
        assert_eq!(event.header().bu_id, 9);
        assert_eq!(event.header().trigger_type, 2);
    }

    #[test]
    fn crc_and_id_problems_are_flagged() {
        let mut c = BuCore::new();
        let mut ready = Vec::new();
        c.on_triggers(&[0], &[trig(1), trig(2)], &mut ready);
        let mut bad = sf(0, 1, vec![frag(0, 1, b"payload")]).to_vec();
        bad[32 + daqflow_wire::FRAGMENT_HEADER_LEN] ^= 1;
        c.on_super_fragment(0, Bytes::from(bad), &mut ready).unwrap();
        send(&mut c, 0, 2, vec![frag(0, 99, b"wrong event")], &mut ready);
        let a = build(ready.remove(0), 0, 1, CheckLevel { crc: true });
        assert!(a.flags.contains(EventFlags::CRC_ERROR));
        assert_eq!(a.crc_errors, 1);
        let b = build(ready.remove(0), 0, 1, CheckLevel { crc: false });
        assert!(b.flags.contains(EventFlags::EVENT_ID_MISMATCH));
    }

    #[test]
    fn protocol_violations_are_errors() {
        let mut c = BuCore::new();
        let mut ready = Vec::new();
        assert!(c.on_super_fragment(0, frag(0, 1, b"x"), &mut ready).is_err());
        assert!(c.on_super_fragment(1, sf(2, 2, vec![frag(0, 2, b"y")]), &mut ready).is_err());
        assert!(c.on_super_fragment(0, Bytes::from_static(b"short"), &mut ready).is_err());
        let whole = sf(0, 1, vec![frag(0, 1, b"x"), frag(1, 1, b"y")]);
        assert!(c.on_super_fragment(0, whole.slice(..whole.len() - 8), &mut ready).is_err());
        assert_eq!(c.in_progress(), 0);
    }

    #[test]
    fn super_fragments_before_the_trigger_data_wait_and_a_duplicate_replaces_its_original() {
        let mut c = BuCore::new();
        let mut ready = Vec::new();
        send(&mut c, 0, 4, vec![frag(0, 4, b"a")], &mut ready);
        send(&mut c, 0, 4, vec![frag(0, 4, b"A")], &mut ready);
        send(&mut c, 1, 4, vec![frag(1, 4, b"b")], &mut ready);
        assert!(ready.is_empty());
        let mut t = trig(4);
        t.flags = Trigger::REASSIGNED;
        c.on_triggers(&[0, 1], &[t], &mut ready);
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].parts.len(), 2);
        assert_eq!(c.clear(), Vec::<u64>::new());
    }
}
