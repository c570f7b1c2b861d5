//! The event manager: fragments stored by event id in pages of a preallocated pool (the paper's
//! event buffer; the readout unit's fragment store).
//!
//! The pool is `pages × page_size` bytes allocated once. A fragment of up to one page takes one
//! page; a larger fragment gets its own allocation, counted against a budget (`large_bytes`), so
//! a burst of large fragments is back-pressure like any other, never an allocation storm. The
//! index from event id to the event's fragments (kept in arrival order) is a direct-mapped ring,
//! which finds consecutive event ids at predictable places, with a hash map for ids that collide
//! in it; both are sized once for the most fragments the pool can hold, so they never grow.
//!
//! A fragment that already lives in a reference-counted receive buffer can be stored without a
//! copy ([`EventManager::insert_shared`]): the event manager keeps a handle to the `Bytes` and
//! counts its length against the same budget as large fragments (`large_bytes`, "bytes held
//! outside the pool"). The readout unit stores its streams' fragments this way and sends them on
//! from the same memory.
//!
//! An input task's `poll` asks [`EventManager::has_room`]: a full pool makes the poll fail, the
//! input stops reading, and the back-pressure travels up the link (the paper's ROB does the same).
//!
//! ```
//! use daqflow_engine::{EventManager, EventManagerConfig};
//! let mut em = EventManager::new(EventManagerConfig { page_size: 1024, pages: 200, ..Default::default() }).unwrap();
//! em.insert(7, 0, b"fragment of source 0").unwrap();
//! em.insert(7, 1, b"fragment of source 1").unwrap();
//! let event = em.get(7).unwrap();
//! assert_eq!(event.fragment_count(), 2);
//! assert_eq!(event.fragments().nth(1).unwrap().data, b"fragment of source 1");
//! assert_eq!(em.remove(7), Some(2));
//! assert_eq!(em.free_pages(), 200);
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{ConfigError, InsertError};

/// Event ids are mostly consecutive: a multiplicative hash spreads them over the table.
#[derive(Default, Clone, Copy)]
pub struct EventIdHasher(u64);

impl Hasher for EventIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = (id ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Sizes of an event manager.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventManagerConfig {
    /// Bytes per page (the paper: 1024).
    pub page_size: usize,
    /// Pages in the pool (the paper: 200).
    pub pages: usize,
    /// Most bytes held outside the page pool: fragments larger than a page, each in its own
    /// allocation, and shared fragments stored with [`EventManager::insert_shared`]
    /// (default: the pool's size).
    pub large_bytes: Option<usize>,
    /// Most fragments stored at once (default: `pages`, plus room for large fragments).
    pub max_fragments: Option<usize>,
}

impl Default for EventManagerConfig {
    fn default() -> Self {
        EventManagerConfig { page_size: 4096, pages: 4096, large_bytes: None, max_fragments: None }
    }
}

const NONE: u32 = u32::MAX;

#[derive(Debug)]
enum Storage {
    Page(u32),
    Own(Box<[u8]>),
    Shared(bytes::Bytes),
    Free,
}

/// One cache line each: a slot never straddles two, so that reaching one (or prefetching it)
/// costs one line.
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    source: u32,
    len: u32,
    next: u32,
    storage: Storage,
}

/// Slots of an event's first fragments kept in its index entry, besides the chain: they are
/// prefetched all at once, where walking the chain waits at every step for the slot before it
/// (as many cache misses in a row as fragments, when the slots are no longer cached).
const HEAD: usize = 8;

/// An event's place in the index: 48 bytes, so that a ring slot is one cache line.
#[derive(Debug, Clone, Copy)]
struct Entry {
    last: u32,
    count: u32,
    bytes: u64,
    /// The first [`HEAD`] fragments' slots (the rest: [`NONE`]); `head[0]` starts the chain.
    head: [u32; HEAD],
}

impl Entry {
    /// An event's entry with one fragment, in slot `slot`.
    fn new(slot: u32, len: usize) -> Entry {
        let mut head = [NONE; HEAD];
        head[0] = slot;
        Entry { last: slot, count: 1, bytes: len as u64, head }
    }

    /// The slots in [`Entry::head`].
    fn head(&self) -> &[u32] {
        &self.head[..(self.count as usize).min(HEAD)]
    }
}

/// Asks the CPU to bring `value`'s first cache line closer (a hint: nothing else happens).
#[inline(always)]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program can observe and never faults; `value` is a
    // valid reference in any case. `sse` is part of every x86_64 target.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// One cache line: a lookup touches one line of the ring.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct RingSlot {
    id: u64,
    used: bool,
    entry: Entry,
}

/// Event id → the event's entry. Event ids are mostly consecutive, so a direct-mapped ring
/// (slot `id mod size`) finds almost every event at one predictable, cache-friendly place;
/// an id whose slot is taken by another live event goes to a hash map sized once.
#[derive(Debug)]
struct Index {
    ring: Box<[RingSlot]>,
    mask: u64,
    in_ring: usize,
    overflow: HashMap<u64, Entry, BuildHasherDefault<EventIdHasher>>,
}

impl Index {
    fn with_capacity(events: usize) -> Index {
        let size = events.next_power_of_two().max(16);
        let entry = Entry { last: NONE, count: 0, bytes: 0, head: [NONE; HEAD] };
        let empty = RingSlot { id: 0, used: false, entry };
        let mut overflow = HashMap::with_hasher(BuildHasherDefault::default());
        overflow.reserve(events);
        Index { ring: vec![empty; size].into_boxed_slice(), mask: size as u64 - 1, in_ring: 0, overflow }
    }

    #[inline]
    fn get(&self, id: u64) -> Option<&Entry> {
        let s = &self.ring[(id & self.mask) as usize];
        if s.used && s.id == id { Some(&s.entry) } else { self.overflow.get(&id) }
    }

    #[inline]
    fn get_mut(&mut self, id: u64) -> Option<&mut Entry> {
        let s = &mut self.ring[(id & self.mask) as usize];
        if s.used && s.id == id { Some(&mut s.entry) } else { self.overflow.get_mut(&id) }
    }

    /// Adds `id`, which must not be present.
    #[inline]
    fn insert(&mut self, id: u64, entry: Entry) {
        let s = &mut self.ring[(id & self.mask) as usize];
        if s.used {
            self.overflow.insert(id, entry);
        } else {
            *s = RingSlot { id, used: true, entry };
            self.in_ring += 1;
        }
    }

    #[inline]
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let s = &mut self.ring[(id & self.mask) as usize];
        if s.used && s.id == id {
            s.used = false;
            self.in_ring -= 1;
            Some(s.entry)
        } else {
            self.overflow.remove(&id)
        }
    }

    fn len(&self) -> usize {
        self.in_ring + self.overflow.len()
    }

    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.ring.iter().filter(|s| s.used).map(|s| s.id).chain(self.overflow.keys().copied())
    }
}

/// One stored fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// The source (stream, ROB) it came from, as given to [`EventManager::insert`].
    pub source: u32,
    /// Its bytes.
    pub data: &'a [u8],
    /// The reference-counted buffer holding `data`, for a fragment stored with
    /// [`EventManager::insert_shared`]: cloning it sends the fragment on without a copy.
    pub shared: Option<&'a bytes::Bytes>,
}

/// The fragments of one event.
#[derive(Debug, Clone, Copy)]
pub struct EventFragments<'a> {
    em: &'a EventManager,
    entry: &'a Entry,
}

impl<'a> EventFragments<'a> {
    /// Number of fragments.
    pub fn fragment_count(&self) -> usize {
        self.entry.count as usize
    }
    /// Total bytes of its fragments.
    pub fn bytes(&self) -> u64 {
        self.entry.bytes
    }
    /// The fragments in the order they were inserted.
    pub fn fragments(&self) -> impl Iterator<Item = Fragment<'a>> + 'a {
        let em = self.em;
        // Along the chain: its first steps are the head's slots, which a caller that
        // prefetched the event finds in the cache.
        let mut at = self.entry.head[0];
        std::iter::from_fn(move || {
            if at == NONE {
                return None;
            }
            let slot = &em.slots[at as usize];
            at = slot.next;
            let shared = match &slot.storage {
                Storage::Shared(b) => Some(b),
                _ => None,
            };
            Some(Fragment { source: slot.source, data: em.slot_data(slot), shared })
        })
    }
}

/// Fragments by event id in a preallocated page pool.
#[derive(Debug)]
pub struct EventManager {
    page_size: usize,
    pool: Box<[u8]>,
    free_pages: Vec<u32>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    index: Index,
    large_limit: usize,
    large_used: usize,
    bytes: u64,
}

impl EventManager {
    /// Allocates the pool, the fragment slots and the index, once.
    pub fn new(config: EventManagerConfig) -> Result<EventManager, ConfigError> {
        let bad = |s: &str| Err(ConfigError::Invalid(s.to_owned()));
        if config.page_size == 0 || config.page_size > u32::MAX as usize {
            return bad("event manager: page_size must be between 1 and 4 GiB");
        }
        if config.pages == 0 || config.pages >= NONE as usize {
            return bad("event manager: pages must be at least 1 and below 2^32 - 1");
        }
        let Some(pool_bytes) = config.page_size.checked_mul(config.pages) else {
            return bad("event manager: page_size × pages overflows");
        };
        let large_limit = config.large_bytes.unwrap_or(pool_bytes);
        let max_fragments = config.max_fragments.unwrap_or(config.pages + large_limit / config.page_size.max(1) + 1);
        if max_fragments == 0 || max_fragments >= NONE as usize {
            return bad("event manager: max_fragments must be at least 1 and below 2^32 - 1");
        }
        let mut pool = vec![0u8; pool_bytes].into_boxed_slice();
        // Touch every page now, so that the first fragments of a run do not pay the page faults.
        for at in (0..pool_bytes).step_by(4096) {
            // SAFETY: `at < pool_bytes`: inside the allocation; a volatile write is not elided.
            unsafe { std::ptr::write_volatile(pool.as_mut_ptr().add(at), 0) };
        }
        let index = Index::with_capacity(max_fragments);
        Ok(EventManager {
            page_size: config.page_size,
            pool,
            free_pages: (0..config.pages as u32).rev().collect(),
            slots: (0..max_fragments).map(|_| Slot { source: 0, len: 0, next: NONE, storage: Storage::Free }).collect(),
            free_slots: (0..max_fragments as u32).rev().collect(),
            index,
            large_limit,
            large_used: 0,
            bytes: 0,
        })
    }

    /// Bytes per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.pool.len() / self.page_size
    }
    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        self.free_pages.len()
    }
    /// Events stored.
    pub fn events(&self) -> usize {
        self.index.len()
    }
    /// Fragments stored.
    pub fn fragments(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }
    /// Bytes stored in fragments.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Bytes held in large fragments' own allocations.
    pub fn large_bytes(&self) -> usize {
        self.large_used
    }

    /// Whether a fragment of `len` bytes can be stored without a copy now
    /// ([`EventManager::insert_shared`]).
    #[inline]
    pub fn has_room_shared(&self, len: usize) -> bool {
        !self.free_slots.is_empty() && self.large_used + len <= self.large_limit
    }

    /// Stores `data` as the next fragment of event `event_id` from `source` without copying it:
    /// the event manager keeps the handle until the event is removed. Its length counts against
    /// `large_bytes`.
    pub fn insert_shared(&mut self, event_id: u64, source: u32, data: bytes::Bytes) -> Result<(), InsertError> {
        let len = data.len();
        if len > self.large_limit || len > u32::MAX as usize {
            return Err(InsertError::TooLarge { len, page_size: self.page_size, large_bytes: self.large_limit });
        }
        if !self.has_room_shared(len) {
            return Err(InsertError::Full { needed: 0, free: self.free_pages.len() });
        }
        let slot_index = self.take_slot().expect("has_room_shared checked a free slot");
        self.large_used += len;
        self.slots[slot_index as usize] = Slot { source, len: len as u32, next: NONE, storage: Storage::Shared(data) };
        self.link(event_id, slot_index, len);
        Ok(())
    }

    /// Whether a fragment of `len` bytes can be stored now: the input task's poll condition.
    #[inline]
    pub fn has_room(&self, len: usize) -> bool {
        !self.free_slots.is_empty()
            && if len <= self.page_size {
                !self.free_pages.is_empty()
            } else {
                self.large_used + len <= self.large_limit
            }
    }

    /// Stores a copy of `data` as the next fragment of event `event_id` from `source`.
    #[inline]
    pub fn insert(&mut self, event_id: u64, source: u32, data: &[u8]) -> Result<(), InsertError> {
        self.insert_with(event_id, source, data.len(), |buf| buf.copy_from_slice(data))
    }

    /// Stores a fragment of `len` bytes that `fill` writes in place (no copy: the ROB formats
    /// its fragments straight into the page).
    pub fn insert_with(
        &mut self,
        event_id: u64,
        source: u32,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), InsertError> {
        if len > self.page_size && (len > self.large_limit || len > u32::MAX as usize) {
            return Err(InsertError::TooLarge { len, page_size: self.page_size, large_bytes: self.large_limit });
        }
        let needed = len.div_ceil(self.page_size).max(1);
        if !self.has_room(len) {
            return Err(InsertError::Full { needed, free: self.free_pages.len() });
        }
        let slot_index = self.take_slot().expect("has_room checked a free slot");
        let storage = if len <= self.page_size {
            let page = self.free_pages.pop().expect("has_room checked a free page");
            let start = page as usize * self.page_size;
            fill(&mut self.pool[start..start + len]);
            Storage::Page(page)
        } else {
            let mut own = vec![0u8; len].into_boxed_slice();
            fill(&mut own);
            self.large_used += len;
            Storage::Own(own)
        };
        self.slots[slot_index as usize] = Slot { source, len: len as u32, next: NONE, storage };
        self.link(event_id, slot_index, len);
        Ok(())
    }

    /// A free slot, the next one prefetched: fragments come one after the other, and the slot
    /// freed longest ago may have left the cache while the data streamed through it.
    #[inline]
    fn take_slot(&mut self) -> Option<u32> {
        let slot = self.free_slots.pop()?;
        if let Some(&next) = self.free_slots.last() {
            prefetch(&self.slots[next as usize]);
        }
        Some(slot)
    }

    /// Appends slot `slot_index` (already filled) to event `event_id`'s list.
    fn link(&mut self, event_id: u64, slot_index: u32, len: usize) {
        self.bytes += len as u64;
        match self.index.get_mut(event_id) {
            Some(entry) => {
                self.slots[entry.last as usize].next = slot_index;
                entry.last = slot_index;
                if let Some(h) = entry.head.get_mut(entry.count as usize) {
                    *h = slot_index;
                }
                entry.count += 1;
                entry.bytes += len as u64;
            }
            None => {
                self.index.insert(event_id, Entry::new(slot_index, len));
            }
        }
    }

    /// The fragments of event `event_id`, if any are stored.
    #[inline]
    pub fn get(&self, event_id: u64) -> Option<EventFragments<'_>> {
        self.index.get(event_id).map(|entry| EventFragments { em: self, entry })
    }

    /// Asks the CPU to fetch event `event_id`'s first fragments' bookkeeping into the cache,
    /// without waiting for it: a caller that knows which event it handles next (the readout
    /// unit's next super-fragment, the next event it frees) calls this one event ahead, and
    /// the misses of both overlap with the work between. Nothing happens for an event not
    /// stored; a hint only, never a change of state.
    #[inline]
    pub fn prefetch(&self, event_id: u64) {
        if let Some(entry) = self.index.get(event_id) {
            for &s in entry.head() {
                prefetch(&self.slots[s as usize]);
            }
        }
    }

    /// Whether event `event_id` has fragments stored.
    #[inline]
    pub fn contains(&self, event_id: u64) -> bool {
        self.index.get(event_id).is_some()
    }

    /// Removes every fragment of event `event_id` and frees their pages: the number removed, or
    /// `None` if the event was not stored.
    #[inline]
    pub fn remove(&mut self, event_id: u64) -> Option<usize> {
        let entry = self.index.remove(event_id)?;
        // The head's slots after the first (read at once below) all together, not one miss
        // after the other along the chain.
        if entry.count > 1 {
            for &s in &entry.head()[1..] {
                prefetch(&self.slots[s as usize]);
            }
        }
        let mut at = entry.head[0];
        while at != NONE {
            let slot = &mut self.slots[at as usize];
            match std::mem::replace(&mut slot.storage, Storage::Free) {
                Storage::Page(p) => self.free_pages.push(p),
                Storage::Own(b) => self.large_used -= b.len(),
                Storage::Shared(b) => self.large_used -= b.len(),
                Storage::Free => {}
            }
            self.bytes -= u64::from(slot.len);
            self.free_slots.push(at);
            at = std::mem::replace(&mut slot.next, NONE);
        }
        Some(entry.count as usize)
    }

    /// Removes a group of events (a grouped reject or discard): the number of events that were
    /// stored and are now removed.
    pub fn remove_many(&mut self, event_ids: impl IntoIterator<Item = u64>) -> usize {
        event_ids.into_iter().filter(|&id| self.remove(id).is_some()).count()
    }

    /// Removes everything (a new run).
    pub fn clear(&mut self) {
        let ids: Vec<u64> = self.index.keys().collect();
        self.remove_many(ids);
    }

    /// The event ids stored, in no particular order.
    pub fn event_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.index.keys()
    }

    fn slot_data<'a>(&'a self, slot: &'a Slot) -> &'a [u8] {
        match &slot.storage {
            Storage::Page(p) => {
                let start = *p as usize * self.page_size;
                &self.pool[start..start + slot.len as usize]
            }
            Storage::Own(b) => b,
            Storage::Shared(b) => b,
            Storage::Free => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert { id: u64, source: u32, len: usize },
        InsertShared { id: u64, source: u32, len: usize },
        Remove(u64),
        RemoveMany(Vec<u64>),
        Lookup(u64),
        Prefetch(u64),
    }

    /// Mostly any of 40 events; often one of 3, so that events of more than [`HEAD`] fragments
    /// (the chain past the entry's head) are common.
    fn id() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..40, 0u64..3]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (id(), 0u32..4, prop_oneof![3 => 0usize..=64, 1 => 65usize..300]).prop_map(|(id, source, len)| Op::Insert { id, source, len }),
            2 => (id(), 0u32..4, 0usize..200).prop_map(|(id, source, len)| Op::InsertShared { id, source, len }),
            2 => (0u64..40).prop_map(Op::Remove),
            1 => proptest::collection::vec(0u64..40, 0..12).prop_map(Op::RemoveMany),
            2 => id().prop_map(Op::Lookup),
            1 => id().prop_map(Op::Prefetch),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_hash_map_of_fragment_lists(ops in proptest::collection::vec(op(), 1..300)) {
            let config = EventManagerConfig { page_size: 64, pages: 16, large_bytes: Some(600), max_fragments: Some(24) };
            let mut em = EventManager::new(config).unwrap();
            // (source, data, stored outside the pool)
            let mut model: HashMap<u64, Vec<(u32, Vec<u8>, bool)>> = HashMap::new();
            let mut fill = 0u8;
            for op in ops {
                match op {
                    Op::Insert { id, source, len } => {
                        fill = fill.wrapping_add(1);
                        let data = vec![fill; len];
                        let frags: usize = model.values().map(Vec::len).sum();
                        let pages: usize = model.values().flatten().filter(|f| !f.2).count();
                        let outside: usize = model.values().flatten().filter(|f| f.2).map(|f| f.1.len()).sum();
                        let room = frags < 24 && if len <= 64 { pages < 16 } else { outside + len <= 600 };
                        prop_assert_eq!(em.has_room(len), room);
                        match em.insert(id, source, &data) {
                            Ok(()) => { prop_assert!(room); model.entry(id).or_default().push((source, data, len > 64)); }
                            Err(InsertError::Full { .. }) => prop_assert!(!room),
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::InsertShared { id, source, len } => {
                        fill = fill.wrapping_add(1);
                        let data = vec![fill; len];
                        let frags: usize = model.values().map(Vec::len).sum();
                        let outside: usize = model.values().flatten().filter(|f| f.2).map(|f| f.1.len()).sum();
                        let room = frags < 24 && outside + len <= 600;
                        prop_assert_eq!(em.has_room_shared(len), room);
                        let shared = bytes::Bytes::from(data.clone());
                        match em.insert_shared(id, source, shared.clone()) {
                            Ok(()) => {
                                prop_assert!(room);
                                let stored = em.get(id).unwrap().fragments().last().unwrap();
                                prop_assert_eq!(stored.shared.map(|b| b.as_ptr()), Some(shared.as_ptr()));
                                model.entry(id).or_default().push((source, data, true));
                            }
                            Err(InsertError::Full { .. }) => prop_assert!(!room),
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::Remove(id) => {
                        prop_assert_eq!(em.remove(id), model.remove(&id).map(|v| v.len()));
                    }
                    Op::RemoveMany(ids) => {
                        let expected = ids.iter().filter(|id| model.remove(id).is_some()).count();
                        prop_assert_eq!(em.remove_many(ids), expected);
                    }
                    // A hint: every check after it must hold as if it had not happened.
                    Op::Prefetch(id) => em.prefetch(id),
                    Op::Lookup(id) => {
                        let got = em.get(id).map(|e| e.fragments().map(|f| (f.source, f.data.to_vec())).collect::<Vec<_>>());
                        let want = model.get(&id).map(|v| v.iter().map(|f| (f.0, f.1.clone())).collect::<Vec<_>>());
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert!(heads_match_the_chains(&em));
                prop_assert_eq!(em.events(), model.len());
                prop_assert_eq!(em.fragments(), model.values().map(Vec::len).sum::<usize>());
                prop_assert_eq!(em.bytes(), model.values().flatten().map(|f| f.1.len() as u64).sum::<u64>());
            }
            em.clear();
            prop_assert_eq!((em.free_pages(), em.events(), em.large_bytes()), (16, 0, 0));
        }
    }

    /// Every event's head holds the first slots of its chain: a wrong head would prefetch the
    /// wrong lines, which no result shows.
    fn heads_match_the_chains(em: &EventManager) -> bool {
        em.index.keys().all(|id| {
            let entry = em.index.get(id).unwrap();
            let mut chain = Vec::new();
            let mut at = entry.head[0];
            while at != NONE {
                chain.push(at);
                at = em.slots[at as usize].next;
            }
            chain.len() == entry.count as usize && chain.iter().take(HEAD).eq(entry.head().iter())
        })
    }

    #[test]
    fn an_event_of_more_fragments_than_the_head_keeps_them_in_order() {
        let config = EventManagerConfig { page_size: 64, pages: 64, ..Default::default() };
        let mut em = EventManager::new(config).unwrap();
        for n in 0..(3 * HEAD as u32) {
            em.insert(9, n, &n.to_le_bytes()).unwrap();
            em.insert(10, n, b"other").unwrap();
            em.prefetch(9);
            let sources: Vec<u32> = em.get(9).unwrap().fragments().map(|f| f.source).collect();
            assert_eq!(sources, (0..=n).collect::<Vec<_>>());
            assert!(heads_match_the_chains(&em));
        }
        let data: Vec<u32> =
            em.get(9).unwrap().fragments().map(|f| u32::from_le_bytes(f.data.try_into().unwrap())).collect();
        assert_eq!(data, (0..3 * HEAD as u32).collect::<Vec<_>>());
        assert_eq!(em.remove(9), Some(3 * HEAD));
        em.prefetch(9);
        assert_eq!(em.remove(10), Some(3 * HEAD));
        assert_eq!(em.free_pages(), 64);
    }

    #[test]
    fn a_full_pool_refuses_until_fragments_are_removed() {
        let mut em = EventManager::new(EventManagerConfig {
            page_size: 128,
            pages: 4,
            large_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
        for id in 0..4 {
            em.insert(id, 0, &[1; 100]).unwrap();
        }
        assert!(!em.has_room(10));
        assert_eq!(em.insert(4, 0, &[1; 10]), Err(InsertError::Full { needed: 1, free: 0 }));
        assert_eq!(
            em.insert(4, 0, &[1; 1000]),
            Err(InsertError::TooLarge { len: 1000, page_size: 128, large_bytes: 0 })
        );
        assert_eq!(em.remove_many([0, 1, 99]), 2);
        assert!(em.has_room(10));
        em.insert(4, 0, &[2; 10]).unwrap();
        assert_eq!(em.get(4).unwrap().fragments().next().unwrap().data, &[2; 10]);
    }

    #[test]
    fn bad_configurations_are_refused() {
        for c in [
            EventManagerConfig { page_size: 0, ..Default::default() },
            EventManagerConfig { pages: 0, ..Default::default() },
            EventManagerConfig { page_size: usize::MAX / 2, pages: 4, ..Default::default() },
            EventManagerConfig { max_fragments: Some(0), ..Default::default() },
        ] {
            assert!(EventManager::new(c).is_err());
        }
    }
}
