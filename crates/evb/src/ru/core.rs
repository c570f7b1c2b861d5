//! The readout unit's logic, without sockets: fragments in, super-fragments out.

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};
use daqflow_engine::{EventManager, EventManagerConfig};

use super::RuConfig;
use daqflow_wire::{
    EventId, Fragment, FragmentFlags, SUPER_FRAGMENT_HEADER_LEN, SuperFragmentFlags, SuperFragmentHeader,
};

/// Counters of a readout unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RuCounters {
    /// Fragments received from the streams.
    pub fragments: u64,
    /// Bytes of those fragments (headers included).
    pub fragment_bytes: u64,
    /// Super-fragments sent to BUs.
    pub super_fragments: u64,
    /// Bytes of those super-fragments.
    pub super_fragment_bytes: u64,
    /// Fragments whose event id broke a stream's sequence (gap, repeat, or wrong source id).
    pub sequence_errors: u64,
    /// Fragments whose payload CRC did not match (flagged, still built).
    pub crc_errors: u64,
    /// Super-fragments sent with a stream's fragment missing.
    pub incomplete: u64,
    /// Events freed after their BU confirmed them.
    pub released: u64,
    /// Events freed after a level-2 reject.
    pub rejected: u64,
    /// Assignments dropped because their BU was lost (the EVM re-assigns them).
    pub dropped_for_lost_bu: u64,
    /// Fragments after the run's last event, discarded.
    pub after_run_end: u64,
}

#[derive(Debug, Clone, Default)]
struct Stream {
    /// Ended cleanly (end frame): past every event.
    ended: bool,
    source_id: Option<u32>,
    /// Next event id expected.
    next: u64,
    /// Highest event id received (0: none).
    last: u64,
}

/// What an RU does with a BU's hello, by its generation ([`RuCore::bu_admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuAdmission {
    /// Every earlier generation of the id is gone: the connection is the BU the RU serves
    /// under the id now (the RU's queue for the id is its events).
    Take,
    /// An earlier generation is not gone yet: its BU gone from the EVM is on its way (the EVM
    /// sent it before the RU list that let this BU connect). The connection is held, nothing
    /// read or sent, until it arrives.
    Wait {
        /// Generations of the id gone so far (the one the RU serves now).
        gone: u64,
    },
    /// This generation is gone: a connection of a BU that left, never to be taken.
    Refuse {
        /// Generations of the id gone so far.
        gone: u64,
    },
}

/// A super-fragment ready to send: its header and its fragments' bytes.
#[derive(Debug, Clone)]
pub struct OutgoingSf {
    /// The header.
    pub header: SuperFragmentHeader,
    /// The fragments, in the order they arrived, each one encoded fragment.
    pub fragments: Vec<Bytes>,
}

/// The readout unit's state.
#[derive(Debug)]
pub struct RuCore {
    ru_id: u32,
    buffer_bytes: usize,
    read_ahead: usize,
    /// The highest event id assigned to a BU or rejected so far: the RU has been asked for every
    /// event up to it.
    asked: u64,
    /// Bytes stored of events after `asked` (read ahead of the assignments).
    ahead_bytes: u64,
    /// Fragments stored of events after `asked`.
    ahead_fragments: usize,
    /// Most fragments read ahead: half the fragment slots, so that tiny fragments read ahead
    /// never take the slots the assigned events' missing fragments need.
    ahead_fragments_limit: usize,
    /// Events with a fragment whose CRC did not match (rare: looked up only when not empty).
    crc_flagged: std::collections::HashSet<u64>,
    check_crc: bool,
    streams: Vec<Stream>,
    em: EventManager,
    queues: BTreeMap<u32, VecDeque<u64>>,
    /// Per BU id, the generations the EVM said are gone (the highest named, plus one): the
    /// generation of the BU the RU serves under the id.
    gone: BTreeMap<u32, u64>,
    rejects: VecDeque<u64>,
    run_end: Option<u64>,
    counters: RuCounters,
    problems: Vec<String>,
}

const MAX_PROBLEMS: usize = 20;

impl RuCore {
    /// An RU as `config` describes it (its id, streams, buffer sizes and CRC check).
    pub fn new(config: &RuConfig) -> RuCore {
        let em = EventManager::new(EventManagerConfig {
            page_size: 64,
            pages: 1,
            large_bytes: Some(config.buffer_bytes),
            max_fragments: Some(config.max_fragments.max(1)),
        })
        .expect("valid event manager sizes");
        let streams = config.streams;
        RuCore {
            ru_id: config.id,
            buffer_bytes: config.buffer_bytes,
            read_ahead: config.read_ahead_bytes,
            asked: 0,
            ahead_bytes: 0,
            ahead_fragments: 0,
            ahead_fragments_limit: (config.max_fragments / 2).max(1),
            crc_flagged: Default::default(),
            check_crc: config.check_crc,
            streams: vec![Stream { ended: false, source_id: None, next: 1, last: 0 }; streams],
            em,
            queues: BTreeMap::new(),
            gone: BTreeMap::new(),
            rejects: VecDeque::new(),
            run_end: None,
            counters: RuCounters::default(),
            problems: Vec::new(),
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> &RuCounters {
        &self.counters
    }

    /// The first problems seen (sequence and CRC errors), for the summary.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Events with fragments stored.
    pub fn events_stored(&self) -> usize {
        self.em.events()
    }

    /// Bytes of fragments stored.
    pub fn bytes_stored(&self) -> u64 {
        self.em.bytes()
    }

    /// Whether stream `slot` may deliver a fragment of up to `len` bytes now (the stream tasks'
    /// poll condition). Never beyond the buffer. A stream that still owes fragments of events
    /// already assigned to a BU or rejected always may: those events are freed once complete,
    /// and their number is bounded by the BUs' credits. A stream that is past them reads ahead
    /// only while the events nobody asked for yet hold less than the read-ahead: so the streams
    /// never fill the buffer with them, and a fragment is still in the cache when it is sent (a
    /// 64 MiB read-ahead cost a tenth of the rate at 1 KiB fragments).
    pub fn may_read(&self, slot: usize, len: usize) -> bool {
        self.em.has_room_shared(len)
            && (self.streams[slot].last < self.asked
                || ((self.ahead_bytes as usize) < self.read_ahead && self.ahead_fragments < self.ahead_fragments_limit))
    }

    /// The RU has been asked for every event up to `id` (assigned or rejected): the events
    /// between the last such id and it no longer count as read ahead.
    fn asked_up_to(&mut self, id: u64) {
        if id <= self.asked {
            return;
        }
        // Only stored events count; none is stored past the streams' highest event.
        let top = id.min(self.streams.iter().map(|s| s.last).max().unwrap_or(0));
        for k in self.asked.saturating_add(1)..=top {
            self.no_longer_ahead(k);
        }
        self.asked = id;
    }

    /// Event `id`'s stored fragments no longer count as read ahead.
    fn no_longer_ahead(&mut self, id: u64) {
        if let Some(e) = self.em.get(id) {
            self.ahead_bytes -= e.bytes();
            self.ahead_fragments -= e.fragment_count();
        }
    }

    /// Removes event `id`'s fragments: the number removed.
    fn forget(&mut self, id: u64) -> Option<usize> {
        if id > self.asked {
            self.no_longer_ahead(id);
        }
        if !self.crc_flagged.is_empty() {
            self.crc_flagged.remove(&id);
        }
        self.em.remove(id)
    }

    /// The oldest assigned event not yet sent.
    fn oldest_waiting(&self) -> Option<u64> {
        self.queues.values().filter_map(|q| q.front().copied()).min()
    }

    /// Whether the RU is stuck: its buffer is full, an assigned event waits for fragments and no
    /// stream may deliver them. The buffer is then too small for the events in flight.
    pub fn is_stuck(&self, len: usize) -> bool {
        !self.em.has_room_shared(len) && self.oldest_waiting().is_some_and(|id| !self.ready(id))
    }

    /// Bytes of fragments stored and the buffer size.
    pub fn buffer(&self) -> (u64, usize) {
        (self.em.bytes(), self.buffer_bytes)
    }

    /// Bytes stored of events not yet assigned or rejected.
    pub fn read_ahead_bytes(&self) -> u64 {
        self.ahead_bytes
    }

    /// Binds stream `slot` to source `source_id`.
    pub fn bind_stream(&mut self, slot: usize, source_id: u32) {
        self.streams[slot].source_id = Some(source_id);
    }

    /// Stream `slot` ended cleanly after event `last`: it counts as past every later event, so
    /// that an assigned event it will never deliver goes out marked incomplete instead of
    /// waiting for the drain timeout.
    pub fn stream_ended(&mut self, slot: usize, last: u64) {
        let s = &mut self.streams[slot];
        s.last = s.last.max(last);
        s.ended = true;
    }

    /// Highest event id stream `slot` delivered.
    pub fn stream_last(&self, slot: usize) -> u64 {
        self.streams[slot].last
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            tracing::warn!(ru = self.ru_id, "{p}");
            self.problems.push(p);
        }
    }

    /// A fragment from stream `slot`. A structurally broken fragment is an error (the stream
    /// cannot be trusted any more); sequence and CRC problems are counted and flagged.
    pub fn on_fragment(&mut self, slot: usize, bytes: Bytes) -> Result<(), String> {
        let fragment = Fragment::parse(bytes).map_err(|e| format!("stream {slot}: malformed fragment: {e}"))?;
        let h = *fragment.header();
        let id = h.event_id.0;
        self.counters.fragments += 1;
        self.counters.fragment_bytes += fragment.as_bytes().len() as u64;
        let stream = &mut self.streams[slot];
        let expected_source = stream.source_id;
        let expected = stream.next;
        if stream.last > 0 && id <= stream.last {
            // A repeat (or a step back): storing it would make the event look complete with
            // another stream's fragment missing. Dropped, counted, logged.
            let past = stream.last;
            self.counters.sequence_errors += 1;
            self.problem(format!("source {}: event {id} again (already past {past}): dropped", h.source_id));
            return Ok(());
        }
        stream.next = id.saturating_add(1);
        stream.last = stream.last.max(id);
        if expected_source.is_some_and(|s| s != h.source_id) {
            self.counters.sequence_errors += 1;
            self.problem(format!(
                "stream {slot}: fragment of source {} on the stream of source {}",
                h.source_id,
                expected_source.unwrap_or(0)
            ));
        }
        if id != expected {
            self.counters.sequence_errors += 1;
            self.problem(format!("source {}: event {id} where {expected} was expected", h.source_id));
        }
        if self.run_end.is_some_and(|end| id > end) {
            self.counters.after_run_end += 1;
            return Ok(());
        }
        let mut bytes = fragment.into_bytes();
        let mut crc_error = h.flags.contains(FragmentFlags::CRC_ERROR);
        if self.check_crc {
            let payload =
                &bytes[daqflow_wire::FRAGMENT_HEADER_LEN..daqflow_wire::FRAGMENT_HEADER_LEN + h.payload_len as usize];
            if daqflow_wire::crc::crc32c(payload) != h.payload_crc {
                self.counters.crc_errors += 1;
                crc_error = true;
                self.problem(format!("source {}: event {id}: payload CRC mismatch", h.source_id));
                // Flag it in the fragment's header (a copy: the received bytes are shared).
                let mut copy = BytesMut::from(&bytes[..]);
                let flags = h.flags.with(FragmentFlags::CRC_ERROR);
                copy[8..12].copy_from_slice(&flags.0.to_le_bytes());
                bytes = copy.freeze();
            }
        }
        if crc_error {
            self.crc_flagged.insert(id);
        }
        let len = bytes.len() as u64;
        self.em.insert_shared(id, slot as u32, bytes).map_err(|e| format!("stream {slot}: storing event {id}: {e}"))?;
        if id > self.asked {
            self.ahead_bytes += len;
            self.ahead_fragments += 1;
        }
        Ok(())
    }

    /// Whether every stream delivered event `id` (or has gone past it).
    fn ready(&self, id: u64) -> bool {
        self.em.get(id).is_some_and(|e| e.fragment_count() >= self.streams.len())
            || self.streams.iter().all(|s| s.ended || s.last >= id)
    }

    /// Events `ids` are assigned to BU `bu`.
    pub fn assign(&mut self, bu: u32, ids: impl IntoIterator<Item = u64>) {
        let q = self.queues.entry(bu).or_default();
        let mut top = 0;
        q.extend(ids.into_iter().inspect(|&id| top = top.max(id)));
        self.asked_up_to(top);
    }

    /// BU `bu` of generation `generation` is gone (the EVM said so): drop what is queued for it,
    /// and serve the id's next generation from now on. The EVM sends the assignments of a BU
    /// and its BU gone on one connection, in order: what is queued for the id until then is
    /// that generation's. False for a generation already gone (nothing changes; a correct EVM
    /// never sends it).
    pub fn bu_gone(&mut self, bu: u32, generation: u32) -> bool {
        let gone = self.gone.entry(bu).or_default();
        if u64::from(generation) < *gone {
            return false;
        }
        *gone = u64::from(generation) + 1;
        if let Some(q) = self.queues.remove(&bu) {
            self.counters.dropped_for_lost_bu += q.len() as u64;
        }
        true
    }

    /// Whether a connection of BU `bu` of generation `generation` is taken now, held until its
    /// predecessors' BU gone arrive, or refused: the generation rule (`docs/evb.md`).
    pub fn bu_admission(&self, bu: u32, generation: u32) -> BuAdmission {
        let gone = self.bu_generations_gone(bu);
        match u64::from(generation).cmp(&gone) {
            std::cmp::Ordering::Equal => BuAdmission::Take,
            std::cmp::Ordering::Greater => BuAdmission::Wait { gone },
            std::cmp::Ordering::Less => BuAdmission::Refuse { gone },
        }
    }

    /// How many generations of BU id `bu` the EVM said are gone: the generation the RU serves
    /// under the id now.
    pub fn bu_generations_gone(&self, bu: u32) -> u64 {
        self.gone.get(&bu).copied().unwrap_or(0)
    }

    /// The BUs with assignments waiting.
    pub fn waiting_bus(&self) -> impl Iterator<Item = u32> + '_ {
        self.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(b, _)| *b)
    }

    /// Whether the next super-fragment for `bu` can be built now, and its size.
    pub fn next_ready(&self, bu: u32) -> Option<usize> {
        let id = *self.queues.get(&bu)?.front()?;
        self.ready(id).then(|| SUPER_FRAGMENT_HEADER_LEN + self.em.get(id).map_or(0, |e| e.bytes() as usize))
    }

    /// Takes the next super-fragment for `bu` if it can be built now. The fragments stay stored
    /// until the event is released: a re-assignment builds it again.
    pub fn next_for(&mut self, bu: u32) -> Option<OutgoingSf> {
        let mut fragments = Vec::new();
        let header = self.next_into(bu, &mut fragments)?;
        Some(OutgoingSf { header, fragments })
    }

    /// [`RuCore::next_for`] into a reused vector: `fragments` gets the fragments (in the order
    /// they arrived), the super-fragment header is returned.
    pub fn next_into(&mut self, bu: u32, fragments: &mut Vec<Bytes>) -> Option<SuperFragmentHeader> {
        let id = *self.queues.get(&bu)?.front()?;
        if !self.ready(id) {
            return None;
        }
        let queue = self.queues.get_mut(&bu).expect("has a queue");
        queue.pop_front();
        // The next super-fragment's fragments, fetched while this one is built and sent.
        if let Some(&next) = queue.front() {
            self.em.prefetch(next);
        }
        fragments.clear();
        let mut body = 0usize;
        // Flagged on arrival: reading each fragment's flags here would touch its memory only to
        // learn what is almost always known.
        let crc_error = !self.crc_flagged.is_empty() && self.crc_flagged.contains(&id);
        if let Some(e) = self.em.get(id) {
            for f in e.fragments() {
                let b = f.shared.cloned().unwrap_or_else(|| Bytes::copy_from_slice(f.data));
                body += b.len();
                fragments.push(b);
            }
        }
        let mut flags = SuperFragmentFlags::default();
        if fragments.len() < self.streams.len() {
            flags = flags.with(SuperFragmentFlags::INCOMPLETE);
            self.counters.incomplete += 1;
        }
        if crc_error {
            flags = flags.with(SuperFragmentFlags::CRC_ERROR);
        }
        let header = SuperFragmentHeader {
            flags,
            ru_id: self.ru_id,
            event_id: EventId(id),
            fragment_count: fragments.len() as u32,
            total_len: (SUPER_FRAGMENT_HEADER_LEN + body) as u32,
        };
        self.counters.super_fragments += 1;
        self.counters.super_fragment_bytes += header.total_len as u64;
        Some(header)
    }

    /// Built events: free their fragments.
    pub fn release(&mut self, ids: impl IntoIterator<Item = u64>) {
        let mut ids = ids.into_iter().peekable();
        while let Some(id) = ids.next() {
            // The next event's fragments, fetched while this one is freed.
            if let Some(&next) = ids.peek() {
                self.em.prefetch(next);
            }
            if self.forget(id).is_some() {
                self.counters.released += 1;
            }
        }
    }

    /// Level-2 rejects: freed once every stream delivered them.
    pub fn reject(&mut self, ids: impl IntoIterator<Item = u64>) {
        let mut top = 0;
        self.rejects.extend(ids.into_iter().inspect(|&id| top = top.max(id)));
        self.asked_up_to(top);
        self.process_rejects();
    }

    /// Frees rejected events that are complete; whether any is still waiting.
    pub fn process_rejects(&mut self) -> bool {
        while let Some(&id) = self.rejects.front() {
            if !self.ready(id) {
                return true;
            }
            self.rejects.pop_front();
            self.forget(id);
            self.counters.rejected += 1;
        }
        false
    }

    /// Whether rejects wait for fragments.
    pub fn rejects_waiting(&self) -> bool {
        self.rejects.front().is_some_and(|&id| self.ready(id))
    }

    /// The run ended with event `last`: fragments after it are discarded from now on.
    pub fn run_end(&mut self, last: u64) {
        self.run_end = Some(last);
        let after: Vec<u64> = self.em.event_ids().filter(|&id| id > last).collect();
        for id in after {
            if let Some(n) = self.forget(id) {
                self.counters.after_run_end += n as u64;
            }
        }
    }

    /// Whether the run's end was announced.
    pub fn ended(&self) -> Option<u64> {
        self.run_end
    }

    /// Events of the run still stored (should be none after the run ended): they are counted
    /// and freed.
    pub fn leftover(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.em.event_ids().collect();
        ids.sort_unstable();
        self.em.clear();
        self.ahead_bytes = 0;
        self.ahead_fragments = 0;
        self.crc_flagged.clear();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_wire::FragmentInfo;

    fn frag(source: u32, id: u64, payload: &[u8]) -> Bytes {
        Fragment::encode(&FragmentInfo { source_id: source, event_id: EventId(id), ..Default::default() }, payload)
    }

    fn sized(streams: usize, buffer_bytes: usize, read_ahead_bytes: usize) -> RuCore {
        RuCore::new(&RuConfig {
            id: 0,
            streams,
            buffer_bytes,
            read_ahead_bytes,
            max_fragment_bytes: 100,
            max_fragments: 1000,
            check_crc: false,
            ..Default::default()
        })
    }

    /// Bytes of one test fragment with a 100-byte payload.
    fn frag_len() -> u64 {
        frag(10, 1, &[0; 100]).len() as u64
    }

    #[test]
    fn streams_read_ahead_only_up_to_the_read_ahead_and_an_assignment_makes_room() {
        let mut r = sized(2, 100_000, 1000);
        let mut id = 1;
        while r.may_read(0, 100) {
            r.on_fragment(0, frag(10, id, &[0; 100])).unwrap();
            id += 1;
        }
        let ahead = r.read_ahead_bytes();
        assert!((1000..1000 + frag_len()).contains(&ahead), "read ahead {ahead} bytes");
        assert_eq!(ahead, (id - 1) * frag_len());
        assert!(!r.may_read(1, 100), "nobody asked for any event yet");
        r.assign(0, [1, 2, 3]);
        assert_eq!(r.read_ahead_bytes(), ahead - 3 * frag_len(), "events 1 to 3 were asked for");
        assert!(r.may_read(0, 100), "the leader reads ahead again");
        assert!(r.may_read(1, 100), "stream 1 owes events 1 to 3");
    }

    #[test]
    fn a_stream_that_owes_assigned_events_reads_past_the_read_ahead_but_never_past_the_buffer() {
        let mut r = sized(2, 100_000, 1000);
        let fill = |r: &mut RuCore, from: u64| {
            let mut id = from;
            while r.may_read(0, 100) {
                r.on_fragment(0, frag(10, id, &[0; 100])).unwrap();
                id += 1;
            }
            id
        };
        // Stream 0 fills the read-ahead, all of it is assigned, and it fills the read-ahead again.
        let next = fill(&mut r, 1);
        r.assign(0, 1..next);
        fill(&mut r, next);
        let asked = r.asked;
        assert!(asked > 5 && r.read_ahead_bytes() >= 1000);
        assert!(!r.may_read(0, 100), "the leader is past every assigned event");
        for k in 1..=asked {
            assert!(r.may_read(1, 100), "stream 1 owes event {k}");
            r.on_fragment(1, frag(11, k, &[0; 100])).unwrap();
        }
        assert!(!r.may_read(1, 100), "stream 1 owes nothing more and the read-ahead is full");

        // A small buffer: full, not even a stream that owes events may deliver.
        let mut r = sized(2, 1000, 1000);
        let mut id = 1;
        while r.may_read(0, 100) {
            r.on_fragment(0, frag(10, id, &[0; 100])).unwrap();
            id += 1;
        }
        r.assign(0, 1..id);
        assert!(!r.may_read(1, 100), "the buffer is full");
        assert!(r.is_stuck(100), "assigned events wait for fragments that cannot be stored");
    }

    #[test]
    fn tiny_fragments_read_ahead_take_at_most_half_the_fragment_slots() {
        let mut r = RuCore::new(&RuConfig {
            streams: 2,
            buffer_bytes: 1 << 20,
            read_ahead_bytes: 1 << 20,
            max_fragment_bytes: 100,
            max_fragments: 10,
            check_crc: false,
            ..Default::default()
        });
        let mut id = 1;
        while r.may_read(0, 100) {
            r.on_fragment(0, frag(10, id, b"")).unwrap();
            id += 1;
        }
        assert_eq!(id - 1, 5, "half of the 10 slots");
        r.assign(0, 1..=5);
        for k in 1..=5 {
            assert!(r.may_read(1, 100), "stream 1 owes event {k}: slots are left for it");
            r.on_fragment(1, frag(11, k, b"")).unwrap();
        }
    }

    #[test]
    fn releases_rejects_and_the_run_end_keep_the_read_ahead_exact() {
        let mut r = sized(1, 100_000, 100_000);
        for id in 1..=10 {
            r.on_fragment(0, frag(10, id, &[0; 100])).unwrap();
        }
        assert_eq!(r.read_ahead_bytes(), 10 * frag_len());
        r.reject([2]);
        assert_eq!(r.read_ahead_bytes(), 8 * frag_len(), "events 1 and 2 were asked for");
        r.assign(0, [1]);
        assert_eq!(r.read_ahead_bytes(), 8 * frag_len());
        r.release([1]);
        r.run_end(7);
        assert_eq!(r.read_ahead_bytes(), 5 * frag_len(), "events 3 to 7 are still ahead");
        assert_eq!(r.leftover(), vec![3, 4, 5, 6, 7]);
        assert_eq!(r.read_ahead_bytes(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Fragment(usize),
        Assign(u64),
        Reject(u64),
        Release(u64),
        RunEnd(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..3usize).prop_map(Op::Fragment),
            2 => (1..6u64).prop_map(Op::Assign),
            1 => (1..4u64).prop_map(Op::Reject),
            2 => (0..8u64).prop_map(Op::Release),
            1 => (0..40u64).prop_map(Op::RunEnd),
        ]
    }

    proptest::proptest! {
        /// Whatever the order of fragments, assignments, rejects, releases and the run's end, the
        /// read-ahead is the bytes stored of events after the last one asked for.
        #[test]
        fn the_read_ahead_is_the_bytes_stored_after_the_last_event_asked_for(
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut r = sized(3, 1 << 20, 1 << 20);
            let mut next = [1u64; 3];
            let mut last_assigned = 0;
            for op in ops {
                match op {
                    Op::Fragment(s) => {
                        r.on_fragment(s, frag(10 + s as u32, next[s], &vec![0; 8 * (s + 1)])).unwrap();
                        next[s] += 1;
                    }
                    Op::Assign(n) => {
                        r.assign(0, last_assigned + 1..=last_assigned + n);
                        last_assigned += n;
                    }
                    Op::Reject(n) => {
                        r.reject(last_assigned + 1..=last_assigned + n);
                        last_assigned += n;
                    }
                    Op::Release(back) => r.release([last_assigned.saturating_sub(back)]),
                    Op::RunEnd(last) => {
                        if r.ended().is_none() {
                            r.run_end(last);
                        }
                    }
                }
                let ahead = || r.em.event_ids().filter(|&id| id > r.asked).map(|id| r.em.get(id).unwrap());
                proptest::prop_assert_eq!(r.read_ahead_bytes(), ahead().map(|e| e.bytes()).sum::<u64>());
                proptest::prop_assert_eq!(r.ahead_fragments, ahead().map(|e| e.fragment_count()).sum::<usize>());
            }
        }
    }

    fn ru(streams: usize) -> RuCore {
        let mut r = RuCore::new(&RuConfig {
            id: 3,
            streams,
            buffer_bytes: 1 << 20,
            max_fragment_bytes: 1 << 16,
            max_fragments: 1000,
            check_crc: true,
            ..Default::default()
        });
        for s in 0..streams {
            r.bind_stream(s, 10 + s as u32);
        }
        r
    }

    #[test]
    fn an_assigned_event_waits_for_every_stream_then_builds_without_copying() {
        let mut r = ru(2);
        let a = frag(10, 1, b"aaaa");
        r.on_fragment(0, a.clone()).unwrap();
        r.assign(7, [1]);
        assert!(r.next_ready(7).is_none());
        assert!(r.next_for(7).is_none());
        r.on_fragment(1, frag(11, 1, b"bbbbbbbb")).unwrap();
        let sf = r.next_for(7).unwrap();
        assert_eq!(sf.header.event_id, EventId(1));
        assert_eq!(sf.header.ru_id, 3);
        assert_eq!(sf.header.fragment_count, 2);
        assert_eq!(sf.header.flags, SuperFragmentFlags::default());
        assert_eq!(sf.fragments[0].as_ptr(), a.as_ptr(), "sent from the received memory");
        assert_eq!(sf.header.total_len as usize, 32 + sf.fragments.iter().map(Bytes::len).sum::<usize>());
        // Still stored until released; a re-assignment builds it again.
        r.assign(8, [1]);
        assert!(r.next_for(8).is_some());
        r.release([1]);
        assert_eq!(r.events_stored(), 0);
        assert_eq!(r.counters().released, 1);
    }

    #[test]
    fn a_repeated_fragment_is_dropped_not_taken_for_another_stream() {
        let mut r = ru(2);
        r.on_fragment(0, frag(10, 1, b"x")).unwrap();
        r.on_fragment(0, frag(10, 1, b"x")).unwrap(); // stream 0 sends event 1 twice
        assert_eq!(r.counters().sequence_errors, 1);
        r.assign(1, [1]);
        assert!(r.next_for(1).is_none(), "still waiting for stream 1");
        r.on_fragment(1, frag(11, 1, b"y")).unwrap();
        let sf = r.next_for(1).unwrap();
        assert_eq!(sf.header.fragment_count, 2);
        assert_eq!(sf.header.flags, SuperFragmentFlags::default());
    }

    #[test]
    fn an_ended_stream_lets_later_events_go_out_incomplete() {
        let mut r = ru(2);
        r.on_fragment(0, frag(10, 1, b"x")).unwrap();
        r.on_fragment(0, frag(10, 2, b"x")).unwrap();
        r.on_fragment(1, frag(11, 1, b"y")).unwrap();
        r.stream_ended(1, 1);
        r.assign(1, [1, 2]);
        assert_eq!(r.next_for(1).unwrap().header.fragment_count, 2);
        let sf = r.next_for(1).unwrap();
        assert!(sf.header.flags.contains(SuperFragmentFlags::INCOMPLETE));
    }

    #[test]
    fn a_gap_in_a_stream_is_counted_and_the_event_goes_out_incomplete() {
        let mut r = ru(2);
        r.on_fragment(0, frag(10, 1, b"x")).unwrap();
        r.on_fragment(1, frag(11, 2, b"y")).unwrap(); // stream 1 skipped event 1
        assert_eq!(r.counters().sequence_errors, 1);
        r.assign(1, [1]);
        let sf = r.next_for(1).unwrap();
        assert!(sf.header.flags.contains(SuperFragmentFlags::INCOMPLETE));
        assert_eq!(sf.header.fragment_count, 1);
        assert_eq!(r.counters().incomplete, 1);
    }

    #[test]
    fn a_corrupted_payload_is_flagged_in_the_fragment_and_the_super_fragment() {
        let mut r = ru(1);
        let mut bad = BytesMut::from(&frag(10, 1, b"payload!")[..]);
        bad[50] ^= 0xFF;
        r.on_fragment(0, bad.freeze()).unwrap();
        assert_eq!(r.counters().crc_errors, 1);
        r.assign(1, [1]);
        let sf = r.next_for(1).unwrap();
        assert!(sf.header.flags.contains(SuperFragmentFlags::CRC_ERROR));
        let f = Fragment::parse(sf.fragments[0].clone()).unwrap();
        assert!(f.header().flags.contains(FragmentFlags::CRC_ERROR));
        assert!(f.verify_crc().is_err());
    }

    #[test]
    fn rejects_wait_for_their_fragments_then_free_them() {
        let mut r = ru(2);
        r.reject([1, 2]);
        assert!(r.process_rejects());
        for id in 1..=2 {
            r.on_fragment(0, frag(10, id, b"a")).unwrap();
            r.on_fragment(1, frag(11, id, b"b")).unwrap();
        }
        assert!(!r.process_rejects());
        assert_eq!((r.counters().rejected, r.events_stored()), (2, 0));
    }

    #[test]
    fn a_bu_is_taken_once_every_earlier_generation_of_its_id_is_gone_and_never_after_its_own() {
        let mut r = ru(1);
        assert_eq!(r.bu_admission(4, 0), BuAdmission::Take);
        // The successor of generation 0 arrives before generation 0's BU gone: held.
        assert_eq!(r.bu_admission(4, 1), BuAdmission::Wait { gone: 0 });
        assert_eq!(r.bu_admission(4, 2), BuAdmission::Wait { gone: 0 });
        r.assign(4, [1, 2]);
        assert!(r.bu_gone(4, 0));
        assert_eq!(r.counters().dropped_for_lost_bu, 2, "generation 0's queue goes with it");
        assert_eq!(r.bu_generations_gone(4), 1);
        assert_eq!(r.bu_admission(4, 1), BuAdmission::Take);
        assert_eq!(r.bu_admission(4, 2), BuAdmission::Wait { gone: 1 });
        assert_eq!(r.bu_admission(4, 0), BuAdmission::Refuse { gone: 1 });
        // Generation 1's events are queued after its predecessor's BU gone: a stale BU gone for
        // generation 0 again would change nothing.
        r.assign(4, [3]);
        assert!(!r.bu_gone(4, 0));
        assert_eq!((r.bu_generations_gone(4), r.waiting_bus().collect::<Vec<_>>()), (1, vec![4]));
        // Other ids are untouched.
        assert_eq!(r.bu_admission(5, 0), BuAdmission::Take);
        // A generation that never connected here (it died first) is gone all the same.
        assert!(r.bu_gone(4, 1) && r.bu_gone(4, 2));
        assert_eq!(r.bu_admission(4, 3), BuAdmission::Take);
        assert!(r.bu_gone(4, u32::MAX));
        assert_eq!(r.bu_admission(4, u32::MAX), BuAdmission::Refuse { gone: 1 << 32 });
    }

    #[test]
    fn a_lost_bu_drops_its_queue_and_the_run_end_discards_later_fragments() {
        let mut r = ru(1);
        r.assign(4, [1, 2, 3]);
        assert!(r.bu_gone(4, 0));
        assert_eq!(r.counters().dropped_for_lost_bu, 3);
        assert_eq!(r.waiting_bus().count(), 0);
        for id in 1..=5 {
            r.on_fragment(0, frag(10, id, b"z")).unwrap();
        }
        r.run_end(3);
        assert_eq!(r.counters().after_run_end, 2);
        r.on_fragment(0, frag(10, 6, b"z")).unwrap();
        assert_eq!(r.counters().after_run_end, 3);
        assert_eq!(r.leftover(), vec![1, 2, 3]);
    }

    #[test]
    fn garbage_on_a_stream_is_an_error_not_a_panic() {
        let mut r = ru(1);
        assert!(r.on_fragment(0, Bytes::from_static(b"definitely not a fragment, too short?")).is_err());
        assert!(r.on_fragment(0, Bytes::new()).is_err());
    }
}
