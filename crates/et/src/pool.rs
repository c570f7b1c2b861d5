//! The shared memory of an ET system: its layout and typed access to it.
//!
//! ```text
//! ┌────────┬──────────────┬─────────────────┬───────────────┬──────────┬────────────────┬──────────┐
//! │ header │ station recs │ attachment recs │ event descs   │ owners   │ queues         │ data     │
//! │ 4 KiB  │ 64 × 320 B   │ A × 64 B        │ N × 32 B      │ N × 4 B  │ (S+2) × (128 B │ N × size │
//! │        │              │                 │               │          │  + 3 × R × 8 B)│          │
//! └────────┴──────────────┴─────────────────┴───────────────┴──────────┴────────────────┴──────────┘
//! ```
//!
//! `R`, a ring's slots, is `N + A + 64` (room for the stale slots a dead process leaves: see
//! [`crate::queue`]). Queue `q < max_stations` is station slot `q`'s input list (slot 0, GrandCentral: the free
//! list); queue `max_stations` feeds the conductor, `max_stations + 1` returns temporary
//! events. Every event's owner (a queue, an attachment, or the ET process) is in the owners
//! array, kept apart from the descriptors so that ownership changes touch few cache lines.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::config::{GroupPolicy, RestoreMode, Selection, StationConfig};
use crate::queue::{Platform, Queue, Ring};
use crate::routing::{self, RouteEnv, Select, StationView};
use crate::sys::{self, Mapping};

pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"DQFLET01");
pub(crate) const LAYOUT_VERSION: u32 = 4;
/// Most stations a system can be built with.
pub const MAX_STATIONS: u32 = 64;
pub(crate) const HEADER_LEN: usize = 4096;

/// Owner values: a queue id, an attachment, or the ET process itself.
pub(crate) const OWNER_ATTACHMENT: u32 = 0x4000_0000;
pub(crate) const OWNER_SYSTEM: u32 = 0x7fff_ffff;
/// Put back to GrandCentral by attachment `owner - OWNER_RETURNING`, which keeps it to push it
/// with others (`local::Returns`); if the attachment ends first, the ET process frees it.
pub(crate) const OWNER_RETURNING: u32 = 0x5000_0000;
/// Most events a pool can have: an event's index and "empty" share a ring slot's low 24 bits.
pub const MAX_EVENTS: u32 = crate::queue::EMPTY - 1;

/// Event descriptor flags.
pub(crate) const FLAG_CORRUPT: u16 = 1;
pub(crate) const FLAG_TEMP: u16 = 2;

/// Station record states.
pub(crate) const STATION_FREE: u32 = 0;
pub(crate) const STATION_ACTIVE: u32 = 1;

/// Attachment record states.
pub(crate) const ATT_FREE: u32 = 0;
pub(crate) const ATT_ACTIVE: u32 = 1;
/// Declared dead: its process must not touch events any more.
pub(crate) const ATT_DEAD: u32 = 2;

#[repr(C)]
pub(crate) struct Header {
    pub magic: u64,
    pub version: u32,
    pub header_len: u32,
    pub et_pid: AtomicU32,
    /// 1 running, 2 stopped.
    pub state: AtomicU32,
    pub heartbeat: AtomicU64,
    pub events: u32,
    pub max_stations: u32,
    pub max_attachments: u32,
    pub _pad: u32,
    pub event_size: u64,
    pub event_stride: u64,
    pub total_len: u64,
    pub off_stations: u64,
    pub off_attachments: u64,
    pub off_descs: u64,
    pub off_owners: u64,
    pub off_queues: u64,
    pub queue_stride: u64,
    pub off_data: u64,
    /// Seqlock of the chain: odd while it changes.
    pub chain_version: AtomicU64,
    pub chain_len: AtomicU32,
    pub _pad2: u32,
    /// Station slots after GrandCentral, in order.
    pub chain: [AtomicU32; MAX_STATIONS as usize],
    pub name: [u8; 64],
}

/// A station's record: its configuration and name on the first three cache lines (written when
/// the station is created or changed, read by every put that routes through it), the counters
/// putters change on the fourth, the one getters change on the fifth, so that a producer and a
/// consumer on different cores do not take each other's lines for every event.
#[repr(C, align(64))]
pub(crate) struct StationRecord {
    pub state: AtomicU32,
    pub blocking: AtomicU32,
    pub cue: AtomicU32,
    pub prescale: AtomicU32,
    /// 0 all, 1 match, 2 range, 3 mask-any, 4 mask-all, 5 high, 6 closure.
    pub select: AtomicU32,
    pub select_ints: [AtomicI32; 4],
    pub select_wild: AtomicU32,
    pub select_index: AtomicU32,
    pub select_a: AtomicI32,
    pub select_b: AtomicI32,
    pub group: AtomicU32,
    pub group_policy: AtomicU32,
    pub restore: AtomicU32,
    pub single_user: AtomicU32,
    pub attachments: AtomicU32,
    /// 1: keeps its events while no attachment is attached (`StationConfig::keep_when_idle`).
    pub keep_idle: AtomicU32,
    pub name_len: AtomicU32,
    pub name: [u8; 64],
    pub _pad: [u8; 48],
    /// Written by putters (offset 192).
    pub prescale_counter: AtomicU64,
    pub rr_counter: AtomicU64,
    pub events_in: AtomicU64,
    pub _pad2: [u8; 40],
    /// Written by getters (offset 256).
    pub events_out: AtomicU64,
    pub _pad3: [u8; 56],
}

#[repr(C, align(64))]
pub(crate) struct AttachmentRecord {
    pub state: AtomicU32,
    pub station: AtomicU32,
    pub pid: AtomicU32,
    /// Incremented by every attach of this slot: a handle that remembers another generation
    /// is stale (its attachment died and the slot was reused).
    pub generation: AtomicU32,
    pub heartbeat: AtomicU64,
    pub held: AtomicU64,
    pub got: AtomicU64,
    pub put: AtomicU64,
    pub dumped: AtomicU64,
}

/// An event's header in shared memory; only its owner reads or writes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EventDesc {
    pub len: u32,
    pub flags: u16,
    pub priority: u8,
    pub _pad: u8,
    pub control: [i32; 4],
    pub temp_id: u32,
    /// For the conductor: the chain position routing continues from.
    pub route_from: u32,
}

impl EventDesc {
    /// Writes what a holder sets (length, control integers, priority), each field only if its
    /// value changes: a descriptor line nobody writes stays in the cache of every core that reads
    /// it, so the consumer that read an event's header on its previous trip reads it again on the
    /// next without the line moving between cores (docs/et.md, "Why the cache lines").
    pub(crate) fn set_header(&mut self, len: u32, control: [i32; 4], priority: u8) {
        set_if_changed(&mut self.len, len);
        set_if_changed(&mut self.control, control);
        set_if_changed(&mut self.priority, priority);
    }

    /// The header of a new event: `len`, nothing else set (written as [`Self::set_header`]).
    pub(crate) fn reset(&mut self, len: u32) {
        self.set_header(len, [0; 4], 0);
        set_if_changed(&mut self.flags, 0);
        set_if_changed(&mut self.temp_id, 0);
    }
}

fn set_if_changed<T: PartialEq>(field: &mut T, v: T) {
    if *field != v {
        *field = v;
    }
}

/// A queue's words: the pushers' line (their lock, the sleepers' count, each ring's tail and
/// the pushers' last look at its head), then the poppers' line (their lock, the futex word,
/// each ring's head),
/// so that a pusher and a popper write no line in common but the slots and the owner words.
/// The three rings' slots follow (docs/et.md, "Queues").
#[repr(C, align(64))]
pub(crate) struct QueueHeader {
    pub push: PushLine,
    pub pop: PopLine,
}

/// The pushers' cache line of a queue.
#[repr(C, align(64))]
pub(crate) struct PushLine {
    /// 0, or the id of the pusher holding the lock.
    pub lock: AtomicU32,
    /// Sleepers registered.
    pub waiters: AtomicU32,
    pub _pad: [u32; 2],
    /// Front, high, low.
    pub tails: [AtomicU64; 3],
    /// Front, high, low: the head as the pushers last read it.
    pub seen: [AtomicU64; 3],
}

/// The poppers' cache line of a queue.
#[repr(C, align(64))]
pub(crate) struct PopLine {
    /// 0, or the id of the popper holding the lock.
    pub lock: AtomicU32,
    /// The futex word sleepers wait on (written only to wake them: here, so that a popper's
    /// look at it does not take the pushers' line).
    pub seq: AtomicU32,
    /// Front, high, low.
    pub heads: [AtomicU64; 3],
}

const fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// Where everything is, computed from the sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub events: u32,
    pub event_size: usize,
    pub event_stride: usize,
    pub max_stations: u32,
    pub max_attachments: u32,
    pub off_stations: usize,
    pub off_attachments: usize,
    pub off_descs: usize,
    pub off_owners: usize,
    pub off_queues: usize,
    pub queue_stride: usize,
    /// Slots of each ring.
    pub ring_cap: usize,
    pub off_data: usize,
    pub total: usize,
}

impl Layout {
    pub(crate) fn new(events: u32, event_size: usize, max_stations: u32, max_attachments: u32) -> Layout {
        let n = events as usize;
        let off_stations = HEADER_LEN;
        let off_attachments = round_up(off_stations + MAX_STATIONS as usize * size_of::<StationRecord>(), 4096);
        let off_descs = round_up(off_attachments + max_attachments as usize * size_of::<AttachmentRecord>(), 64);
        let off_owners = round_up(off_descs + n * size_of::<EventDesc>(), 64);
        let off_queues = round_up(off_owners + n * 4, 4096);
        let ring_cap = n.next_power_of_two();
        let queue_stride = round_up(size_of::<QueueHeader>() + 3 * ring_cap * 4, 64);
        let event_stride = round_up(event_size.max(1), 64);
        let off_data = round_up(off_queues + (max_stations as usize + 2) * queue_stride, 4096);
        let total = round_up(off_data + n * event_stride, 4096);
        Layout {
            events,
            event_size,
            event_stride,
            max_stations,
            max_attachments,
            off_stations,
            off_attachments,
            off_descs,
            off_owners,
            off_queues,
            queue_stride,
            ring_cap,
            off_data,
            total,
        }
    }
}

/// The mapped shared memory of one ET system, with typed access.
pub(crate) struct Pool {
    map: Mapping,
    pub layout: Layout,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("layout", &self.layout).finish()
    }
}

/// Shared memory is not what it should be.
#[derive(Debug, thiserror::Error)]
#[error("the shared memory of the ET system is not valid: {0}")]
pub(crate) struct BadPool(pub String);

impl Pool {
    /// Lays out fresh, zeroed shared memory (the ET process, once).
    pub(crate) fn create(map: Mapping, layout: Layout, name: &str) -> std::io::Result<Pool> {
        assert!(map.len() >= layout.total);
        let pool = Pool { map, layout };
        // SAFETY: the mapping is fresh (all zero) and nobody else maps it yet; the header
        // region is HEADER_LEN bytes and the struct fits in it.
        let h = unsafe { &mut *pool.map.base().cast::<Header>() };
        h.magic = MAGIC;
        h.version = LAYOUT_VERSION;
        h.header_len = HEADER_LEN as u32;
        h.events = layout.events;
        h.max_stations = layout.max_stations;
        h.max_attachments = layout.max_attachments;
        h.event_size = layout.event_size as u64;
        h.event_stride = layout.event_stride as u64;
        h.total_len = layout.total as u64;
        h.off_stations = layout.off_stations as u64;
        h.off_attachments = layout.off_attachments as u64;
        h.off_descs = layout.off_descs as u64;
        h.off_owners = layout.off_owners as u64;
        h.off_queues = layout.off_queues as u64;
        h.queue_stride = layout.queue_stride as u64;
        h.off_data = layout.off_data as u64;
        let n = name.as_bytes();
        h.name[..n.len().min(63)].copy_from_slice(&n[..n.len().min(63)]);
        h.et_pid.store(sys::getpid(), Ordering::Release);
        for q in 0..layout.max_stations + 2 {
            // Every slot never filled (all zero would read "event 0 filled in round 0").
            for ring in &pool.queue(q).rings {
                for slot in ring.slots {
                    slot.store(crate::queue::EMPTY, Ordering::Relaxed);
                }
            }
        }
        Ok(pool)
    }

    /// Checks and adopts shared memory mapped from an ET system's memory file (a client).
    pub(crate) fn open(map: Mapping) -> Result<Pool, BadPool> {
        if map.len() < HEADER_LEN {
            return Err(BadPool(format!("{} bytes is smaller than the header", map.len())));
        }
        // SAFETY: at least HEADER_LEN bytes are mapped; the header is plain data.
        let h = unsafe { &*map.base().cast::<Header>() };
        if h.magic != MAGIC || h.version != LAYOUT_VERSION {
            return Err(BadPool("wrong magic or layout version (another daqflow version?)".into()));
        }
        if h.max_stations > MAX_STATIONS || h.max_stations < 1 {
            return Err(BadPool(format!("{} stations", h.max_stations)));
        }
        if h.events == 0 || h.events > MAX_EVENTS {
            return Err(BadPool(format!("a pool of {} events", h.events)));
        }
        let layout = Layout::new(h.events, h.event_size as usize, h.max_stations, h.max_attachments);
        let consistent = layout.total as u64 == h.total_len
            && layout.off_data as u64 == h.off_data
            && layout.off_queues as u64 == h.off_queues
            && layout.total <= map.len();
        if !consistent {
            return Err(BadPool("offsets disagree with the sizes".into()));
        }
        Ok(Pool { map, layout })
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: checked or created at construction; the mapping lives as long as `self`.
        unsafe { &*self.map.base().cast::<Header>() }
    }

    #[cfg(test)]
    pub(crate) fn name(&self) -> String {
        let n = &self.header().name;
        String::from_utf8_lossy(&n[..n.iter().position(|&b| b == 0).unwrap_or(n.len())]).into_owned()
    }

    pub(crate) fn station(&self, slot: u32) -> &StationRecord {
        assert!(slot < MAX_STATIONS);
        // SAFETY: the station records region holds MAX_STATIONS records.
        unsafe { &*self.map.base().add(self.layout.off_stations).cast::<StationRecord>().add(slot as usize) }
    }

    /// Writes a station's name (ET process only, while the record is free).
    pub(crate) fn set_station_name(&self, slot: u32, name: &str) {
        let s = self.station(slot);
        let b = &name.as_bytes()[..name.len().min(64)];
        // SAFETY: only the ET process writes names, and only into a free record that no client
        // reads (clients read names of active records, published by the `state` store after).
        unsafe {
            let dst = (&raw const s.name).cast::<u8>().cast_mut();
            std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len());
        }
        s.name_len.store(b.len() as u32, Ordering::Release);
    }

    pub(crate) fn attachment(&self, slot: u32) -> &AttachmentRecord {
        assert!(slot < self.layout.max_attachments);
        // SAFETY: the attachment region holds max_attachments records.
        unsafe { &*self.map.base().add(self.layout.off_attachments).cast::<AttachmentRecord>().add(slot as usize) }
    }

    /// The descriptor of event `idx`. Reading or writing it is only sound for its owner.
    pub(crate) fn desc(&self, idx: u32) -> *mut EventDesc {
        assert!(idx < self.layout.events);
        // SAFETY: the descriptor region holds `events` descriptors.
        unsafe { self.map.base().add(self.layout.off_descs).cast::<EventDesc>().add(idx as usize) }
    }

    pub(crate) fn owner(&self, idx: u32) -> &AtomicU32 {
        &self.owners()[idx as usize]
    }

    /// Every event's owner word.
    pub(crate) fn owners(&self) -> &[AtomicU32] {
        // SAFETY: the owners region holds `events` 32-bit words, 4-byte aligned, for as long as
        // the mapping (`self`) lives.
        unsafe {
            std::slice::from_raw_parts(
                self.map.base().add(self.layout.off_owners).cast::<AtomicU32>(),
                self.layout.events as usize,
            )
        }
    }

    /// How many events each queue holds now (`queued[q]` for queue `q`) and each attachment
    /// (`held[a]`: held, or put back to GrandCentral and kept to go with others), by their owner
    /// words: exact per event, read one event after another while events move.
    pub(crate) fn owner_counts(&self) -> (Vec<u32>, Vec<u64>) {
        let mut queued = vec![0u32; self.layout.max_stations as usize + 2];
        let mut held = vec![0u64; self.layout.max_attachments as usize];
        for o in self.owners() {
            let o = o.load(Ordering::Relaxed);
            if let Some(n) = queued.get_mut(o as usize) {
                *n += 1;
            } else if matches!(o & 0xf000_0000, OWNER_ATTACHMENT | OWNER_RETURNING)
                && let Some(n) = held.get_mut((o & 0x0fff_ffff) as usize)
            {
                *n += 1;
            }
        }
        (queued, held)
    }

    /// The data buffer of event `idx` (`event_size` bytes). Only its owner may touch it.
    pub(crate) fn data(&self, idx: u32) -> *mut u8 {
        assert!(idx < self.layout.events);
        // SAFETY: the data region holds `events` buffers of `event_stride` bytes.
        unsafe { self.map.base().add(self.layout.off_data + idx as usize * self.layout.event_stride) }
    }

    fn queue_header(&self, q: u32) -> *mut QueueHeader {
        assert!(q < self.layout.max_stations + 2);
        // SAFETY: the queues region holds max_stations + 2 queues of `queue_stride` bytes.
        unsafe {
            self.map.base().add(self.layout.off_queues + q as usize * self.layout.queue_stride).cast::<QueueHeader>()
        }
    }

    /// Queue `q`.
    #[inline]
    pub(crate) fn queue(&self, q: u32) -> Queue<'_, ShmPlat> {
        let h = self.queue_header(q);
        let cap = self.layout.ring_cap;
        // SAFETY: the header and its three rings of `cap` 32-bit slots are inside the queue's
        // stride (64-byte aligned); the references live as long as the mapping (`self`).
        unsafe {
            let slots = h.add(1).cast::<AtomicU32>();
            let h = &*h;
            let ring = |i: usize| Ring {
                head: &h.pop.heads[i],
                tail: &h.push.tails[i],
                seen: &h.push.seen[i],
                slots: std::slice::from_raw_parts(slots.add(i * cap), cap),
            };
            Queue {
                plat: ShmPlat,
                me: q,
                rings: [ring(0), ring(1), ring(2)],
                push_lock: &h.push.lock,
                pop_lock: &h.pop.lock,
                seq: &h.pop.seq,
                waiters: &h.push.waiters,
                owners: self.owners(),
            }
        }
    }

    pub(crate) fn conductor_queue(&self) -> u32 {
        self.layout.max_stations
    }

    pub(crate) fn temp_queue(&self) -> u32 {
        self.layout.max_stations + 1
    }

    /// The station slots after GrandCentral, in order (a consistent snapshot).
    pub(crate) fn chain(&self, out: &mut Vec<u32>) {
        let h = self.header();
        loop {
            let v1 = h.chain_version.load(Ordering::Acquire);
            if v1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            out.clear();
            let len = (h.chain_len.load(Ordering::Acquire) as usize).min(MAX_STATIONS as usize);
            out.extend(h.chain[..len].iter().map(|s| s.load(Ordering::Acquire)));
            if h.chain_version.load(Ordering::Acquire) == v1 {
                return;
            }
        }
    }

    /// Replaces the chain (ET process only; readers retry while it changes).
    pub(crate) fn set_chain(&self, slots: &[u32]) {
        let h = self.header();
        h.chain_version.fetch_add(1, Ordering::AcqRel);
        for (i, s) in slots.iter().enumerate() {
            h.chain[i].store(*s, Ordering::Release);
        }
        h.chain_len.store(slots.len() as u32, Ordering::Release);
        h.chain_version.fetch_add(1, Ordering::AcqRel);
    }

    /// What routing needs to know of station `slot`.
    pub(crate) fn station_view(&self, slot: u32) -> StationView {
        let queued = self.queue(slot).len_bound().min(u32::MAX as u64) as u32;
        StationView { queued, ..self.station_config_view(slot) }
    }

    /// Station `slot`'s view without its queue's length (`queued` 0): what deciding whether a
    /// batch goes to one place needs ([`routing::uniform`]). It reads only the station's
    /// configuration lines, not its queue's, which every push and pop changes.
    pub(crate) fn station_config_view(&self, slot: u32) -> StationView {
        let s = self.station(slot);
        let r = |a: &AtomicU32| a.load(Ordering::Relaxed);
        let i = |a: &AtomicI32| a.load(Ordering::Relaxed);
        let select = match r(&s.select) {
            1 => Select::Match {
                ints: [i(&s.select_ints[0]), i(&s.select_ints[1]), i(&s.select_ints[2]), i(&s.select_ints[3])],
                wild: r(&s.select_wild),
            },
            2 => Select::Range { index: r(&s.select_index) as usize, lo: i(&s.select_a), hi: i(&s.select_b) },
            3 => Select::MaskAny { index: r(&s.select_index) as usize, mask: i(&s.select_a) },
            4 => Select::MaskAll { index: r(&s.select_index) as usize, mask: i(&s.select_a) },
            5 => Select::High,
            6 => Select::Closure,
            _ => Select::All,
        };
        StationView {
            slot,
            group: r(&s.group),
            policy: if r(&s.group_policy) == 1 {
                routing::GroupPolicy::ShortestQueue
            } else {
                routing::GroupPolicy::RoundRobin
            },
            attached: r(&s.attachments) > 0,
            // A station that keeps its events while idle takes them as if attached (in a
            // parallel group: only those no attached member takes).
            keeps: r(&s.keep_idle) != 0,
            blocking: r(&s.blocking) != 0,
            cue: r(&s.cue),
            queued: 0,
            prescale: r(&s.prescale),
            select,
        }
    }

    /// Stores a station's configuration (ET process; also while it runs).
    pub(crate) fn store_config(&self, slot: u32, c: &StationConfig) {
        let s = self.station(slot);
        let w = |a: &AtomicU32, v: u32| a.store(v, Ordering::Release);
        let wi = |a: &AtomicI32, v: i32| a.store(v, Ordering::Release);
        w(&s.blocking, u32::from(c.blocking));
        w(&s.keep_idle, u32::from(c.keep_when_idle));
        w(&s.cue, c.cue);
        w(&s.prescale, c.prescale.max(1));
        w(&s.single_user, u32::from(c.single_user));
        w(
            &s.restore,
            match c.restore {
                RestoreMode::Output => 0,
                RestoreMode::Input => 1,
                RestoreMode::GrandCentral => 2,
                RestoreMode::Redistribute => 3,
            },
        );
        w(&s.group_policy, u32::from(c.group_policy == GroupPolicy::ShortestQueue));
        match &c.selection {
            Selection::All => w(&s.select, 0),
            Selection::Match(m) => {
                let mut wild = 0;
                for (k, v) in m.iter().enumerate() {
                    match v {
                        Some(v) => wi(&s.select_ints[k], *v),
                        None => wild |= 1 << k,
                    }
                }
                w(&s.select_wild, wild);
                w(&s.select, 1);
            }
            Selection::Range { index, lo, hi } => {
                w(&s.select_index, *index as u32);
                wi(&s.select_a, *lo);
                wi(&s.select_b, *hi);
                w(&s.select, 2);
            }
            Selection::MaskAny { index, mask } => {
                w(&s.select_index, *index as u32);
                wi(&s.select_a, *mask);
                w(&s.select, 3);
            }
            Selection::MaskAll { index, mask } => {
                w(&s.select_index, *index as u32);
                wi(&s.select_a, *mask);
                w(&s.select, 4);
            }
            Selection::HighPriority => w(&s.select, 5),
            Selection::Closure(_) => w(&s.select, 6),
        }
    }

    /// A station's configuration as stored (closures appear as `Selection::All`; the ET
    /// process keeps them).
    pub(crate) fn load_config(&self, slot: u32) -> StationConfig {
        let s = self.station(slot);
        let r = |a: &AtomicU32| a.load(Ordering::Acquire);
        let i = |a: &AtomicI32| a.load(Ordering::Acquire);
        let selection = match r(&s.select) {
            1 => {
                let wild = r(&s.select_wild);
                let mut m = [None; 4];
                for (k, v) in m.iter_mut().enumerate() {
                    if wild & (1 << k) == 0 {
                        *v = Some(i(&s.select_ints[k]));
                    }
                }
                Selection::Match(m)
            }
            2 => Selection::Range { index: r(&s.select_index) as usize, lo: i(&s.select_a), hi: i(&s.select_b) },
            3 => Selection::MaskAny { index: r(&s.select_index) as usize, mask: i(&s.select_a) },
            4 => Selection::MaskAll { index: r(&s.select_index) as usize, mask: i(&s.select_a) },
            5 => Selection::HighPriority,
            _ => Selection::All,
        };
        StationConfig {
            blocking: r(&s.blocking) != 0,
            cue: r(&s.cue),
            prescale: r(&s.prescale),
            selection,
            single_user: r(&s.single_user) != 0,
            restore: match r(&s.restore) {
                1 => RestoreMode::Input,
                2 => RestoreMode::GrandCentral,
                3 => RestoreMode::Redistribute,
                _ => RestoreMode::Output,
            },
            group_policy: if r(&s.group_policy) == 1 { GroupPolicy::ShortestQueue } else { GroupPolicy::RoundRobin },
            keep_when_idle: r(&s.keep_idle) != 0,
        }
    }
}

/// The futex of a queue in shared memory, and the popper's adaptive spin.
pub(crate) struct ShmPlat;

impl Platform for ShmPlat {
    type W = AtomicU32;
    type D = AtomicU64;
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
        sys::futex_wait(word, expected, timeout)
    }
    fn wake(&self, word: &AtomicU32) {
        sys::futex_wake(word, u32::MAX)
    }
    fn spin_limit(&self) -> u32 {
        SPINS.with(|s| s.get())
    }
    fn pause(&self, i: u32) {
        // Every 256 turns, let another thread that wants this core run (the one that will push,
        // when more threads are busy than there are cores); with a core to itself this returns
        // at once.
        if i % 256 == 255 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    fn backoff(&self, i: u32) {
        // Another holds the lock: for one call, or until the ET process repairs the queue if
        // its holder died (a sleep then costs no core).
        if i < 128 {
            std::hint::spin_loop();
        } else if i < 1024 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    fn spun(&self, worth_it: bool) {
        SPINS.with(|s| {
            let n = s.get();
            s.set(if worth_it { (n * 2).min(MAX_POP_SPINS) } else { (n / 2).max(MIN_POP_SPINS) });
        });
    }
}

thread_local! {
    /// This thread's current spin limit (see [`MAX_POP_SPINS`]).
    static SPINS: std::cell::Cell<u32> = const { std::cell::Cell::new(MIN_POP_SPINS) };
}

/// How many times a popper re-checks an empty queue (with a CPU pause between checks) before it
/// sleeps on the futex: adaptive, per thread, between these bounds (`Queue::pop` reports each
/// wait through `Platform::spun`). A spin that found events, or a sleep that ended within 200 µs,
/// doubles the thread's limit; a longer sleep halves it. Where waits are short and the pusher runs
/// on the other core (a remote consumer's server thread handing events back to a local producer
/// every few tens of microseconds), the limit climbs until the spin covers the wait and no
/// wake-up system call is on the critical path (remote 64 B: about 1 M events/s without spinning,
/// 1–3.8 M with a fixed 2000, 3.7–3.9 M adaptive). Idle queues bring it back to the minimum
/// within a few waits. See docs/et.md, "Why an adaptive spin before sleeping".
const MIN_POP_SPINS: u32 = 256;
const MAX_POP_SPINS: u32 = 32 * 1024;

/// Routing counters in shared memory (no closures: a client process has none).
pub(crate) struct ShmEnv<'a>(pub &'a Pool);

impl RouteEnv for ShmEnv<'_> {
    fn prescale_tick(&self, slot: u32) -> u64 {
        self.0.station(slot).prescale_counter.fetch_add(1, Ordering::Relaxed)
    }
    fn round_robin(&self, slot: u32) -> u64 {
        self.0.station(slot).rr_counter.fetch_add(1, Ordering::Relaxed)
    }
    fn closure(&self, _slot: u32, _idx: u32) -> Option<bool> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_fits_and_is_aligned() {
        for (n, size) in [(1u32, 1usize), (3000, 64), (100_000, 1024), (17, 1 << 20)] {
            let l = Layout::new(n, size, 32, 128);
            assert!(l.off_attachments >= l.off_stations + 64 * size_of::<StationRecord>());
            assert!(l.off_data + n as usize * l.event_stride <= l.total);
            assert_eq!(l.off_queues % 4096, 0);
            assert_eq!(l.queue_stride % 64, 0);
            assert_eq!(l.event_stride % 64, 0);
        }
        assert!(size_of::<Header>() <= HEADER_LEN);
        assert_eq!(size_of::<EventDesc>(), 32);
    }

    /// The queue header's documented offsets: the pushers' words on one line, the poppers' on
    /// the next.
    #[test]
    fn the_queue_header_matches_the_documented_offsets() {
        use std::mem::offset_of;
        assert_eq!(size_of::<QueueHeader>(), 128);
        assert_eq!(offset_of!(QueueHeader, pop), 64);
        let push = [
            offset_of!(PushLine, lock),
            offset_of!(PushLine, waiters),
            offset_of!(PushLine, tails),
            offset_of!(PushLine, seen),
        ];
        assert_eq!(push, [0, 4, 16, 40]);
        assert_eq!([offset_of!(PopLine, lock), offset_of!(PopLine, seq), offset_of!(PopLine, heads)], [0, 4, 8]);
    }

    /// The offsets docs/et.md gives other clients, and the cache lines they are on: a station's
    /// configuration is never on a line a putter or a getter writes for every event.
    #[test]
    fn the_station_record_matches_the_documented_offsets() {
        use std::mem::offset_of;
        assert_eq!(size_of::<StationRecord>(), 320);
        let documented = [
            (offset_of!(StationRecord, state), 0),
            (offset_of!(StationRecord, select), 16),
            (offset_of!(StationRecord, restore), 60),
            (offset_of!(StationRecord, keep_idle), 72),
            (offset_of!(StationRecord, name_len), 76),
            (offset_of!(StationRecord, name), 80),
            (offset_of!(StationRecord, prescale_counter), 192),
            (offset_of!(StationRecord, rr_counter), 200),
            (offset_of!(StationRecord, events_in), 208),
            (offset_of!(StationRecord, events_out), 256),
        ];
        for (actual, doc) in documented {
            assert_eq!(actual, doc);
        }
        let layout = Layout::new(3000, 65536, 32, 128);
        assert_eq!(
            (layout.off_attachments, layout.off_descs, layout.off_owners, layout.off_queues, layout.queue_stride),
            (24_576, 32_768, 128_768, 143_360, 49_280)
        );
        assert_eq!((layout.ring_cap, layout.off_data, layout.total), (4096, 1_822_720, 198_430_720));
    }

    #[test]
    fn a_created_pool_opens_and_its_queues_work() {
        let layout = Layout::new(100, 64, 8, 16);
        let fd = sys::memfd("pool-test", layout.total as u64).unwrap();
        let created = Pool::create(Mapping::map(&fd, layout.total).unwrap(), layout, "test").unwrap();
        let opened = Pool::open(Mapping::map(&fd, layout.total).unwrap()).unwrap();
        assert_eq!(opened.name(), "test");
        let free: Vec<u32> = (0..100).collect();
        created.queue(0).push(&free, crate::queue::Lane::Low, OWNER_SYSTEM);
        let mut got = Vec::new();
        let taker = OWNER_ATTACHMENT + 3;
        opened.queue(0).pop(10, &mut got, crate::queue::Block::No, taker, &|| false).unwrap();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert!(got.iter().all(|&i| created.owner(i).load(Ordering::Relaxed) == taker));
        assert_eq!(created.owner(50).load(Ordering::Relaxed), 0);
        created.set_chain(&[3, 1]);
        let mut chain = Vec::new();
        opened.chain(&mut chain);
        assert_eq!(chain, [3, 1]);
    }
}
