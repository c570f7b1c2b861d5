//! Attachments on the ET system's machine: events are used in place, in shared memory.
//!
//! A `get` or `new` pops a batch of event indices from a queue under its lock; a `put` routes
//! the events itself (no round trip to the ET process) and pushes each destination's share
//! under that queue's lock. A whole batch costs a few lock operations; nothing is copied.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::config::{Priority, Wait};
use crate::error::EtError;
use crate::event::{Attachment, Data, Event};
use crate::pool::{ATT_ACTIVE, FLAG_CORRUPT, FLAG_TEMP, OWNER_ATTACHMENT, OWNER_RETURNING, Pool, ShmEnv};
use crate::queue::{Block, Empty, Lane};
use crate::routing::{self, Dest, EventHead, StationView};
use crate::sys::Mapping;

/// What a local attachment needs from the system it belongs to: the shared memory, large-event
/// buffers, and detaching. Implemented by a client process (through the ET process's socket)
/// and by the ET process itself (in-process attachments, the remote server).
pub(crate) trait Backend: Send + Sync {
    fn pool(&self) -> &Pool;
    fn system_name(&self) -> &str;
    /// Whether `n` more large events of `size` bytes for attachment `att` fit the system's
    /// limits now (asked before any event is taken for them).
    fn admit_large(&self, att: u32, n: usize, size: usize) -> Result<(), EtError>;
    /// A new temporary buffer of at least `size` bytes for event `event`, held by attachment
    /// `att`: (id, mapping). Its memory is allocated only as it is written.
    fn new_temp(&self, att: u32, event: u32, size: usize) -> Result<(u32, Arc<Mapping>), EtError>;
    /// The mapping of temporary buffer `id`.
    fn temp(&self, id: u32) -> Result<Arc<Mapping>, EtError>;
    /// Ends attachment `att` if the slot is still at `generation` (see `SystemInner::detach`).
    fn detach(&self, att: u32, generation: u32);
    fn is_dead(&self) -> bool;
    /// Whether this backend returns the events its attachments put back to GrandCentral in
    /// groups ([`Returns`]), flushing what is kept at least every 100 ms.
    fn groups_returns(&self) -> bool {
        false
    }
    /// Keeps `returns` to flush it on the backend's own clock (see `groups_returns`).
    fn watch_returns(&self, _returns: std::sync::Weak<Returns>) {}
}

/// Events an attachment put back to GrandCentral and keeps, to push them in one group.
///
/// At one event per call a consumer's push back to GrandCentral's free list, and the producer's
/// pop from it, each take the free list's cache line from the other's core: half of what an
/// event costs. A client process's attachment keeps the events it puts back to GrandCentral
/// (up to `batch`) and pushes them at once when it has `batch` of them, when a get or a new
/// of its own finds nothing to take (before it waits), when it detaches, and at least every
/// 100 ms from the client's heartbeat thread. Kept events are marked `OWNER_RETURNING + att`
/// and counted in the attachment's `held` until pushed, so that every event is accounted for,
/// the ET process frees them if the attachment ends first (they are never restored to a
/// station: the user is done with them), and a drain waiting for every event to be free waits
/// at most that long for them.
pub(crate) struct Returns {
    att: u32,
    generation: u32,
    batch: usize,
    kept: Mutex<Vec<u32>>,
    /// Whether `kept` holds events (read without its lock on every get).
    any: std::sync::atomic::AtomicBool,
}

impl Returns {
    /// Pushes the kept events to GrandCentral, if the attachment is still active and this
    /// one (a declared-dead attachment's events are the ET process's to recover).
    pub(crate) fn flush(&self, pool: &Pool) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_locked(pool, &mut kept);
    }

    fn flush_locked(&self, pool: &Pool, kept: &mut Vec<u32>) {
        if kept.is_empty() {
            return;
        }
        let rec = pool.attachment(self.att);
        if rec.state.load(Ordering::Acquire) == ATT_ACTIVE && rec.generation.load(Ordering::Acquire) == self.generation
        {
            pool.queue(0).push(kept, Lane::Low, OWNER_ATTACHMENT + self.att);
        }
        kept.clear();
        self.any.store(false, Ordering::Relaxed);
    }

    /// Whether any events are kept (a hint: read without the lock).
    fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }
}

/// An attachment to a station of an ET system on this machine.
pub struct LocalAttachment {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) att: u32,
    pub(crate) station: u32,
    pub(crate) station_name: String,
    /// The slot's generation when this attachment was made (see `AttachmentRecord`).
    generation: u32,
    /// Mappings of the large events this attachment holds.
    temps: Mutex<HashMap<u32, Arc<Mapping>>>,
    /// Events put back to GrandCentral and not pushed yet (see [`Returns`]).
    returns: Arc<Returns>,
    /// Set once the attachment was ended on its holder's behalf: dropping must not end the
    /// slot again (it may belong to someone else by then).
    ended: std::sync::atomic::AtomicBool,
}

thread_local! {
    /// Each thread's reusable vectors for its local attachments' calls: no lock per call, and no
    /// allocation once they have grown.
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Runs `f` with this thread's scratch space (a fresh one if a call further up the thread's
/// stack has it, or if the thread is ending and its thread-locals are gone).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut f = Some(f);
    let done = SCRATCH.try_with(|c| c.try_borrow_mut().ok().map(|mut s| (f.take().expect("called once"))(&mut s)));
    match done {
        Ok(Some(r)) => r,
        _ => (f.take().expect("not called yet"))(&mut Scratch::default()),
    }
}

#[derive(Default)]
struct Scratch {
    idx: Vec<u32>,
    high: Vec<bool>,
    /// The indices `new_events_into` and `get_events_into` take (taken out while they run).
    taken: Vec<u32>,
    /// The events `put_events` hands on (taken out while it runs).
    items: Vec<PutItem>,
    chain: Vec<u32>,
    views: Vec<StationView>,
}

/// An event being put: index, control integers, high priority, large, temporary buffer id.
type PutItem = (u32, [i32; 4], bool, bool, u32);

impl std::fmt::Debug for LocalAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAttachment").field("id", &self.att).field("station", &self.station_name).finish()
    }
}

fn block_of(wait: Wait) -> Block {
    match wait {
        Wait::NoWait => Block::No,
        Wait::Sleep => Block::Until(None),
        Wait::Timed(d) => Block::For(d),
    }
}

impl LocalAttachment {
    pub(crate) fn new(backend: Arc<dyn Backend>, att: u32, station: u32, station_name: String) -> Self {
        // Made right after the attach: the slot's generation is this attachment's.
        let generation = backend.pool().attachment(att).generation.load(Ordering::Acquire);
        // Groups of at most 32, and of at most 1/64 of the pool (so that the attachments of
        // one process cannot keep much of a small pool); 1 means none.
        let batch =
            if backend.groups_returns() { (backend.pool().layout.events as usize / 64).clamp(1, 32) } else { 1 };
        let returns = Arc::new(Returns { att, generation, batch, kept: Mutex::default(), any: Default::default() });
        if batch > 1 {
            backend.watch_returns(Arc::downgrade(&returns));
        }
        LocalAttachment {
            returns,
            generation,
            backend,
            att,
            station,
            station_name,
            temps: Mutex::default(),
            ended: Default::default(),
        }
    }

    /// The attachment's id in the system.
    pub fn id(&self) -> u32 {
        self.att
    }

    fn owner(&self) -> u32 {
        OWNER_ATTACHMENT + self.att
    }

    fn alive(&self) -> Result<(), EtError> {
        if self.backend.is_dead() {
            return Err(EtError::SystemDead(self.backend.system_name().to_owned()));
        }
        if !self.is_mine() {
            return Err(EtError::AttachmentDead(self.att));
        }
        Ok(())
    }

    /// The slot is active and still this attachment's (not recovered and reused by another).
    fn is_mine(&self) -> bool {
        let rec = self.backend.pool().attachment(self.att);
        rec.state.load(Ordering::Acquire) == ATT_ACTIVE && rec.generation.load(Ordering::Acquire) == self.generation
    }

    fn empty_error(&self, e: Empty, wait: Wait) -> Result<usize, EtError> {
        match e {
            Empty::Nothing if wait == Wait::NoWait => Ok(0),
            Empty::Nothing => Err(EtError::Timeout),
            Empty::Aborted => {
                self.alive()?;
                Err(EtError::SystemDead(self.backend.system_name().to_owned()))
            }
        }
    }

    /// Pops up to `n` events of queue `q`, appending their indices to `idx`.
    fn pop(&self, q: u32, n: usize, wait: Wait, idx: &mut Vec<u32>) -> Result<usize, EtError> {
        self.alive()?;
        let pool = self.backend.pool();
        let me = self.owner();
        let abort = || self.backend.is_dead() || !self.is_mine();
        if n == 0 {
            return Ok(0);
        }
        if self.returns.any() {
            // Whatever this attachment kept goes back before it waits for anything (a
            // producer may be waiting for exactly those events).
            if let Ok(k) = pool.queue(q).pop(n, idx, Block::No, me, &abort) {
                return Ok(k);
            }
            self.returns.flush(pool);
        }
        match pool.queue(q).pop(n, idx, block_of(wait), me, &abort) {
            Ok(k) => Ok(k),
            Err(e) => self.empty_error(e, wait),
        }
    }

    /// The handle of held event `idx`, from its descriptor. Always inlined, so that the
    /// callers' `extend` writes it straight into their vector (see `new_events_into`); `pool`
    /// is `self.backend.pool()`, looked up once per batch by the caller (a call through the
    /// backend per event, and a second read of the descriptor in `raw_data`, were a fifth of
    /// a consumer's time at batch 100; docs/performance.md).
    #[inline(always)]
    fn event_from(&self, pool: &Pool, idx: u32, cap_hint: Option<usize>) -> Event<'_> {
        // SAFETY: the event was just taken by this attachment under the queue lock: we own it.
        let d = unsafe { *pool.desc(idx) };
        let (ptr, cap, unmapped) = if d.flags & FLAG_TEMP == 0 {
            (pool.data(idx), pool.layout.event_size, false)
        } else {
            let (ptr, cap) = self.raw_data(idx);
            // A large event whose temporary buffer this process could not map: its bytes are
            // not here. It is handed out empty and marked possibly corrupt (never as the pool
            // slot's unrelated bytes); putting it on leaves the event itself unchanged for
            // the others.
            let unmapped = cap == pool.layout.event_size && !self.has_temp(d.temp_id);
            (ptr, if unmapped { 0 } else { cap }, unmapped)
        };
        Event {
            idx,
            len: cap_hint.unwrap_or(d.len as usize).min(cap),
            cap,
            control: d.control,
            priority: if d.priority == 1 { Priority::High } else { Priority::Low },
            corrupt: d.flags & FLAG_CORRUPT != 0 || unmapped,
            temp_id: if d.flags & FLAG_TEMP != 0 { d.temp_id } else { 0 },
            data: Data::Shared(ptr),
            dirty_header: false,
            dirty_data: false,
            att: self.att,
            _life: PhantomData,
        }
    }

    /// Pushes events (already out of the caller's hands) to queue `q`, high priority first
    /// (`high`: each event's priority; `None`: all low).
    fn push(&self, q: u32, idx: &[u32], high: Option<&[bool]>) {
        let pool = self.backend.pool();
        let pusher = OWNER_ATTACHMENT + self.att;
        let queue = pool.queue(q);
        let high = high.unwrap_or(&[]);
        if high.iter().all(|h| !h) {
            queue.push(idx, Lane::Low, pusher);
        } else if high.iter().all(|h| *h) {
            queue.push(idx, Lane::High, pusher);
        } else {
            let h: Vec<u32> = idx.iter().zip(high).filter(|x| *x.1).map(|x| *x.0).collect();
            let l: Vec<u32> = idx.iter().zip(high).filter(|x| !*x.1).map(|x| *x.0).collect();
            queue.push(&h, Lane::High, pusher);
            queue.push(&l, Lane::Low, pusher);
        }
        if q > 0 && q < pool.layout.max_stations {
            pool.station(q).events_in.fetch_add(idx.len() as u64, Ordering::Relaxed);
        }
    }

    /// Takes one of this thread's scratch vectors out (empty; a new one if a call further up
    /// the thread's stack has the scratch space), so that a call that waits holds nothing.
    fn take_scratch<T>(&self, field: impl FnOnce(&mut Scratch) -> &mut Vec<T>) -> Vec<T> {
        with_scratch(|s| {
            let mut v = std::mem::take(field(s));
            v.clear();
            v
        })
    }

    /// Puts a scratch vector back for the thread's next call.
    fn give_scratch<T>(&self, v: Vec<T>, field: impl FnOnce(&mut Scratch) -> &mut Vec<T>) {
        with_scratch(|s| *field(s) = v);
    }

    /// Writes back what changed in the events' headers and checks they are ours.
    fn settle(&self, events: &[Event<'_>]) -> Result<(), EtError> {
        let pool = self.backend.pool();
        for e in events {
            if e.att != self.att {
                return Err(EtError::NotOwned { idx: e.idx });
            }
            if e.dirty_header {
                // SAFETY: the event is held by this attachment (checked above): we own its
                // descriptor until we push it.
                let d = unsafe { &mut *pool.desc(e.idx) };
                d.set_header(e.len as u32, e.control, u8::from(e.priority == Priority::High));
            }
        }
        Ok(())
    }

    /// Sends events back to GrandCentral (the free list; large ones through the ET process,
    /// which frees their buffers).
    fn recycle(&self, idx: &[u32], temps: &[bool]) {
        let pool = self.backend.pool();
        if temps.iter().any(|t| *t) {
            let t: Vec<u32> = idx.iter().zip(temps).filter(|x| *x.1).map(|x| *x.0).collect();
            let f: Vec<u32> = idx.iter().zip(temps).filter(|x| !*x.1).map(|x| *x.0).collect();
            self.push(pool.temp_queue(), &t, None);
            self.push(0, &f, None);
        } else {
            self.push(0, idx, None);
        }
    }

    /// Sends events put by the user back to GrandCentral: large ones at once (through the ET
    /// process), the others kept and pushed in groups (see [`Returns`]); an attachment counts
    /// kept events as held until their group is pushed.
    fn put_back(&self, idx: &[u32], temps: &[bool]) {
        if self.returns.batch <= 1 || temps.iter().any(|t| *t) {
            self.recycle(idx, temps);
            return;
        }
        let pool = self.backend.pool();
        let mut kept = self.returns.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.is_empty() && idx.len() >= self.returns.batch {
            // A whole group already, and none waiting before it: pushed now, without being
            // marked and kept first (a pass over the batch fewer; as `flush_locked` would push
            // it at once; the caller checked that the attachment is alive).
            drop(kept);
            self.recycle(idx, temps);
            return;
        }
        for &i in idx {
            // No longer the user's (a second put of it is refused), and freed, not restored to
            // the station, if the attachment ends before the group is pushed.
            pool.owner(i).store(OWNER_RETURNING + self.att, Ordering::Release);
        }
        kept.extend_from_slice(idx);
        self.returns.any.store(true, Ordering::Relaxed);
        if kept.len() >= self.returns.batch {
            self.returns.flush_locked(pool, &mut kept);
        }
    }

    /// Counts `n` events put. (What an attachment holds is counted from the owner words, by
    /// the snapshot: no counter of its own to keep up on every call.)
    fn account_out(&self, n: usize) {
        self.backend.pool().attachment(self.att).put.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn account_in(&self, n: usize) {
        self.backend.pool().attachment(self.att).got.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Where routing starts for events leaving `station`: the chain position after it (after its
/// whole group).
pub(crate) fn start_position(chain: &[u32], views: &[StationView], station: u32) -> usize {
    if station == 0 {
        return 0;
    }
    match chain.iter().position(|&s| s == station) {
        Some(p) => {
            let group = views[p].group;
            let mut q = p + 1;
            while group != 0 && q < views.len() && views[q].group == group {
                q += 1;
            }
            q
        }
        // The station was removed while we held events: route from the start.
        None => 0,
    }
}

/// Routes and pushes `events` leaving `from_station`, for any holder of the events (a local
/// attachment, the conductor, recovery). `env` provides prescale counters and closures.
///
/// Within a batch, the queue lengths routing sees include the events this batch already sent
/// (shortest-queue groups and cues stay exact); a non-blocking station's cue is checked again
/// under its queue's lock, and the events it turns away continue down the chain.
pub(crate) fn route_and_push(
    pool: &Pool,
    from_station: u32,
    from_pos: Option<usize>,
    events: &[(u32, [i32; 4], bool, bool)],
    env: &impl routing::RouteEnv,
    holder: u32,
) {
    let mut chain = Vec::with_capacity(16);
    pool.chain(&mut chain);
    let mut views: Vec<StationView> = chain.iter().map(|&s| pool.station_view(s)).collect();
    let from = from_pos.unwrap_or_else(|| start_position(&chain, &views, from_station));
    if let Some(dest) = routing::uniform(&views, from) {
        // The common case: the whole batch goes to one blocking station, or back.
        let all: Vec<(u32, [i32; 4], bool, bool, usize)> =
            events.iter().map(|&(i, c, h, t)| (i, c, h, t, from)).collect();
        push_routed(pool, &mut views, &all, |_| dest, holder);
        return;
    }
    let mut work: Vec<(u32, [i32; 4], bool, bool, usize)> =
        events.iter().map(|&(i, c, h, t)| (i, c, h, t, from)).collect();
    while !work.is_empty() {
        let mut dests = Vec::with_capacity(work.len());
        for &(idx, control, high, _, from) in &work {
            let d = routing::route(&views, from, &EventHead { idx, control, high }, env);
            if let Dest::Station(s) = d
                && let Some(v) = views.iter_mut().find(|v| v.slot == s)
            {
                v.queued = v.queued.saturating_add(1);
            }
            dests.push(d);
        }
        let mut k = 0;
        work = push_routed(
            pool,
            &mut views,
            &work,
            |_| {
                k += 1;
                dests[k - 1]
            },
            holder,
        );
    }
}

/// Pushes each of `events` to `dest(event)`, bucketed by queue, high priority first. Returns
/// the events a non-blocking station turned away (its cue filled meanwhile), each with the
/// chain position to route it on from.
fn push_routed(
    pool: &Pool,
    views: &mut [StationView],
    events: &[(u32, [i32; 4], bool, bool, usize)],
    mut dest: impl FnMut(&(u32, [i32; 4], bool, bool, usize)) -> Dest,
    holder: u32,
) -> Vec<(u32, [i32; 4], bool, bool, usize)> {
    // (queue, chain position if a station, events)
    let mut buckets: Vec<(u32, Option<usize>, Vec<usize>)> = Vec::new();
    for (n, ev) in events.iter().enumerate() {
        let (q, pos) = match dest(ev) {
            Dest::Station(s) => (s, views.iter().position(|v| v.slot == s)),
            Dest::GrandCentral if ev.3 => (pool.temp_queue(), None),
            Dest::GrandCentral => (0, None),
            Dest::Conductor(p) => {
                // SAFETY: the caller holds these events: their descriptors are ours to write.
                unsafe { (*pool.desc(ev.0)).route_from = p as u32 };
                (pool.conductor_queue(), None)
            }
        };
        match buckets.iter_mut().find(|b| b.0 == q) {
            Some(b) => b.2.push(n),
            None => buckets.push((q, pos, vec![n])),
        }
    }
    let mut turned_away = Vec::new();
    let mut idx = Vec::new();
    for (q, pos, members) in buckets {
        let queue = pool.queue(q);
        let limit = match pos {
            Some(p) if !views[p].blocking => views[p].cue,
            _ => u32::MAX,
        };
        let mut pushed = 0;
        // GrandCentral and the temporary-buffer queue ignore priorities.
        let is_high = |m: usize| events[m].2 && q != 0 && q != pool.temp_queue();
        for high in [true, false] {
            let part: Vec<usize> = members.iter().copied().filter(|&m| is_high(m) == high).collect();
            if part.is_empty() {
                continue;
            }
            idx.clear();
            idx.extend(part.iter().map(|&m| events[m].0));
            let lane = if high { Lane::High } else { Lane::Low };
            let k = queue.push_upto(&idx, lane, limit, holder);
            pushed += k;
            if let Some(p) = pos {
                turned_away.extend(part[k..].iter().map(|&m| {
                    let (i, c, h, t, _) = events[m];
                    (i, c, h, t, p + 1)
                }));
            }
        }
        if q > 0 && q < pool.layout.max_stations {
            pool.station(q).events_in.fetch_add(pushed as u64, Ordering::Relaxed);
        }
        if let Some(p) = pos {
            views[p].queued = queue.len_bound().min(u32::MAX as u64) as u32;
        }
    }
    turned_away
}

impl LocalAttachment {
    /// Takes up to `n` new events from GrandCentral, sized `size` (large ones get temporary
    /// buffers, which this attachment keeps mapped until it puts them). Indices into `out`.
    pub(crate) fn raw_new(&self, n: usize, size: usize, wait: Wait, out: &mut Vec<u32>) -> Result<usize, EtError> {
        let start = out.len();
        let pool = self.backend.pool();
        // No batch is larger than the pool.
        let n = n.min(pool.layout.events as usize);
        let large = size > pool.layout.event_size;
        if large && n > 0 {
            // Refused here, a request over a limit takes nothing and waits for nothing.
            self.alive()?;
            self.backend.admit_large(self.att, n, size)?;
        }
        let k = self.pop(0, n, wait, out)?;
        for i in start..out.len() {
            let idx = out[i];
            // SAFETY: just taken from the free list by this attachment: we own it.
            // Usually nothing changes: the same length as last time, nothing else set.
            unsafe { &mut *pool.desc(idx) }.reset(size.min(u32::MAX as usize) as u32);
            if large {
                match self.backend.new_temp(self.att, idx, size) {
                    Ok((id, map)) => {
                        // SAFETY: as above.
                        unsafe {
                            let d = &mut *pool.desc(idx);
                            d.flags = FLAG_TEMP;
                            d.temp_id = id;
                        }
                        self.temps.lock().unwrap_or_else(|p| p.into_inner()).insert(id, map);
                    }
                    Err(e) => {
                        // Give back everything taken, the buffers made so far included.
                        let taken = out.split_off(start);
                        self.account_in(k);
                        let _ = self.raw_dump(&taken);
                        return Err(e);
                    }
                }
            }
        }
        self.account_in(k);
        pool.station(0).events_out.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }

    /// Takes up to `n` events from the station's input list. Indices into `out`.
    pub(crate) fn raw_get(&self, n: usize, wait: Wait, out: &mut Vec<u32>) -> Result<usize, EtError> {
        if self.station == 0 {
            return Err(EtError::Refused("GrandCentral hands out new events: use new_events".into()));
        }
        let n = n.min(self.backend.pool().layout.events as usize);
        let start = out.len();
        let k = self.pop(self.station, n, wait, out)?;
        let pool = self.backend.pool();
        for &idx in &out[start..] {
            // SAFETY: just taken by this attachment.
            let d = unsafe { *pool.desc(idx) };
            if d.flags & FLAG_TEMP != 0 {
                match self.backend.temp(d.temp_id) {
                    Ok(map) => {
                        self.temps.lock().unwrap_or_else(|p| p.into_inner()).insert(d.temp_id, map);
                    }
                    Err(e) => tracing::warn!(event = idx, error = %e, "large event buffer unavailable"),
                }
            }
        }
        self.account_in(k);
        pool.station(self.station).events_out.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }

    /// Whether temporary buffer `id` is mapped in this process.
    fn has_temp(&self, id: u32) -> bool {
        self.temps.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&id)
    }

    /// Where event `idx`'s bytes are, and how many it holds (the event must be held).
    pub(crate) fn raw_data(&self, idx: u32) -> (*mut u8, usize) {
        let pool = self.backend.pool();
        // SAFETY: the caller holds the event.
        let d = unsafe { *pool.desc(idx) };
        if d.flags & FLAG_TEMP != 0
            && let Some(map) = self.temps.lock().unwrap_or_else(|p| p.into_inner()).get(&d.temp_id)
        {
            return (map.base(), map.len());
        }
        (pool.data(idx), pool.layout.event_size)
    }

    /// Checks that every event in `idx` is held by this attachment.
    pub(crate) fn check_held(&self, idx: &[u32]) -> Result<(), EtError> {
        let pool = self.backend.pool();
        let me = self.owner();
        match idx.iter().find(|&&i| i >= pool.layout.events || pool.owner(i).load(Ordering::Acquire) != me) {
            Some(&i) => Err(EtError::NotOwned { idx: i }),
            None => Ok(()),
        }
    }

    /// Hands held events on (their descriptors already written): reads their headers back from
    /// shared memory (the remote server's path).
    pub(crate) fn raw_put(&self, idx: &[u32]) -> Result<(), EtError> {
        self.alive()?;
        let pool = self.backend.pool();
        self.check_held(idx)?;
        let items: Vec<PutItem> = idx
            .iter()
            .map(|&i| {
                // SAFETY: held by this attachment (checked).
                let d = unsafe { *pool.desc(i) };
                (i, d.control, d.priority == 1, d.flags & FLAG_TEMP != 0, d.temp_id)
            })
            .collect();
        self.put_items(&items)
    }

    /// Hands held events on, given their headers (no read of shared memory). The caller has
    /// checked that the attachment is alive.
    fn put_items(&self, items: &[PutItem]) -> Result<(), EtError> {
        if items.is_empty() {
            return Ok(());
        }
        let pool = self.backend.pool();
        if items.iter().any(|x| x.3) {
            let mut temps = self.temps.lock().unwrap_or_else(|p| p.into_inner());
            for x in items.iter().filter(|x| x.3) {
                temps.remove(&x.4);
            }
        }
        with_scratch(|s| {
            let Scratch { chain, views, idx, high, .. } = s;
            pool.chain(chain);
            views.clear();
            views.extend(chain.iter().map(|&slot| pool.station_config_view(slot)));
            let from = start_position(chain, views, self.station);
            match routing::uniform(views, from) {
                // The common case: the whole batch goes to one place.
                Some(Dest::Station(q)) => {
                    idx.clear();
                    idx.extend(items.iter().map(|x| x.0));
                    high.clear();
                    high.extend(items.iter().map(|x| x.2));
                    self.push(q, idx, Some(high));
                }
                Some(Dest::GrandCentral) => {
                    idx.clear();
                    idx.extend(items.iter().map(|x| x.0));
                    high.clear();
                    high.extend(items.iter().map(|x| x.3));
                    self.put_back(idx, high);
                }
                _ => {
                    let batch: Vec<(u32, [i32; 4], bool, bool)> = items.iter().map(|x| (x.0, x.1, x.2, x.3)).collect();
                    route_and_push(pool, self.station, Some(from), &batch, &ShmEnv(pool), self.owner());
                }
            }
        });
        self.account_out(items.len());
        Ok(())
    }

    /// Gives held events back to the front of the station's input list, in their order (ahead
    /// of every queued event, of either priority: its front ring), unchanged and not marked:
    /// events taken and never handed to the user (a remote client's prefetched batch, when it
    /// detaches). They count as never taken.
    pub(crate) fn raw_unget(&self, idx: &[u32]) -> Result<(), EtError> {
        if idx.is_empty() {
            return Ok(());
        }
        if self.station == 0 {
            return Err(EtError::Refused("GrandCentral's new events go back with dump_events".into()));
        }
        self.alive()?;
        self.check_held(idx)?;
        let pool = self.backend.pool();
        pool.queue(self.station).push(idx, Lane::Front, OWNER_ATTACHMENT + self.att);
        let a = pool.attachment(self.att);
        a.got.fetch_sub(idx.len() as u64, Ordering::Relaxed);
        pool.station(self.station).events_out.fetch_sub(idx.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Returns held events straight to GrandCentral.
    pub(crate) fn raw_dump(&self, idx: &[u32]) -> Result<(), EtError> {
        if idx.is_empty() {
            return Ok(());
        }
        self.check_held(idx)?;
        let pool = self.backend.pool();
        let mut temps = self.temps.lock().unwrap_or_else(|p| p.into_inner());
        let temp: Vec<bool> = idx
            .iter()
            .map(|&i| {
                // SAFETY: held by this attachment (checked).
                let d = unsafe { *pool.desc(i) };
                if d.flags & FLAG_TEMP != 0 {
                    temps.remove(&d.temp_id);
                    true
                } else {
                    false
                }
            })
            .collect();
        drop(temps);
        self.recycle(idx, &temp);
        let a = pool.attachment(self.att);
        a.dumped.fetch_add(idx.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Marks the attachment alive (remote server: on every request of its client).
    pub(crate) fn beat(&self) {
        self.backend.pool().attachment(self.att).heartbeat.fetch_add(1, Ordering::Release);
    }
}

impl Attachment for LocalAttachment {
    fn station(&self) -> &str {
        &self.station_name
    }

    fn new_events_into<'a>(
        &'a self,
        n: usize,
        size: usize,
        wait: Wait,
        out: &mut Vec<Event<'a>>,
    ) -> Result<usize, EtError> {
        let mut idx = self.take_scratch(|s| &mut s.taken);
        let k = self.raw_new(n, size, wait, &mut idx);
        let pool = self.backend.pool();
        if size <= pool.layout.event_size {
            // Just reset by `raw_new`: no need to read the descriptors back. Made in place in
            // `out`: a loop of pushes built each event on the stack and copied it, and the
            // copy's 16-byte loads of the narrower stores just made could not be forwarded
            // from the store buffer, a stall on every event (a producer alone at batch 100:
            // 45 M events/s that way, 60-68 M in place; docs/performance.md).
            let (cap, att) = (pool.layout.event_size, self.att);
            out.extend(idx.iter().map(|&i| Event {
                idx: i,
                len: size,
                cap,
                control: [0; 4],
                priority: Priority::Low,
                corrupt: false,
                temp_id: 0,
                data: Data::Shared(pool.data(i)),
                dirty_header: false,
                dirty_data: false,
                att,
                _life: PhantomData,
            }));
        } else {
            out.extend(idx.iter().map(|&i| {
                let mut e = self.event_from(pool, i, Some(size));
                e.len = size.min(e.cap);
                e
            }));
        }
        self.give_scratch(idx, |s| &mut s.taken);
        k
    }

    fn get_events_into<'a>(&'a self, n: usize, wait: Wait, out: &mut Vec<Event<'a>>) -> Result<usize, EtError> {
        let mut idx = self.take_scratch(|s| &mut s.taken);
        let k = self.raw_get(n, wait, &mut idx);
        // Made in place in `out`, as in `new_events_into`.
        let pool = self.backend.pool();
        out.extend(idx.iter().map(|&i| self.event_from(pool, i, None)));
        self.give_scratch(idx, |s| &mut s.taken);
        k
    }

    fn put_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), EtError> {
        if events.is_empty() {
            return Ok(());
        }
        self.alive()?;
        self.settle(events)?;
        let mut items = self.take_scratch(|s| &mut s.items);
        items
            .extend(events.iter().map(|e| (e.idx, e.control, e.priority == Priority::High, e.temp_id != 0, e.temp_id)));
        let put = self.put_items(&items);
        self.give_scratch(items, |s| &mut s.items);
        put?;
        events.clear();
        Ok(())
    }

    fn dump_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), EtError> {
        if events.is_empty() {
            return Ok(());
        }
        self.alive()?;
        self.settle(events)?;
        let idx: Vec<u32> = events.iter().map(|e| e.idx).collect();
        self.raw_dump(&idx)?;
        events.clear();
        Ok(())
    }
}

impl LocalAttachment {
    /// Ends the attachment because its holder died (the remote server's client vanished): its
    /// events come back marked possibly corrupt, and dropping it afterwards does nothing.
    pub(crate) fn end_dead(self, system: &crate::system::SystemInner) {
        self.ended.store(true, Ordering::Release);
        if self.same_generation() {
            system.detach(self.att, self.generation, true);
        }
    }

    /// The slot still belongs to this attachment (whatever its state).
    fn same_generation(&self) -> bool {
        self.backend.pool().attachment(self.att).generation.load(Ordering::Acquire) == self.generation
    }
}

impl Drop for LocalAttachment {
    fn drop(&mut self) {
        // A stale handle (its attachment was recovered and the slot given to someone else) must
        // not end the new owner's attachment.
        if !self.ended.load(Ordering::Acquire) && self.same_generation() {
            // What it kept goes back as put (detaching would recover it as held).
            self.returns.flush(self.backend.pool());
            self.backend.detach(self.att, self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{Backend, LocalAttachment};
    use crate::pool::{OWNER_RETURNING, Pool};
    use crate::sys::Mapping;
    use crate::system::{Holder, InProcess};
    use crate::{Attachment, EtError, EtSystem, Position, StationConfig, SystemConfig, Wait};

    /// The ET process's own access (`InProcess`), changed in one way: a process that cannot
    /// map large events' buffers (out of address space or of file descriptors), or a client
    /// process's grouping of returns.
    struct Tweaked {
        inner: InProcess,
        no_temps: bool,
        groups: bool,
    }

    impl Backend for Tweaked {
        fn pool(&self) -> &Pool {
            self.inner.pool()
        }
        fn system_name(&self) -> &str {
            self.inner.system_name()
        }
        fn admit_large(&self, att: u32, n: usize, size: usize) -> Result<(), EtError> {
            self.inner.admit_large(att, n, size)
        }
        fn new_temp(&self, att: u32, event: u32, size: usize) -> Result<(u32, Arc<Mapping>), EtError> {
            self.inner.new_temp(att, event, size)
        }
        fn temp(&self, id: u32) -> Result<Arc<Mapping>, EtError> {
            if self.no_temps {
                return Err(EtError::io("mapping a large event", std::io::Error::from_raw_os_error(libc::EMFILE)));
            }
            self.inner.temp(id)
        }
        fn detach(&self, att: u32, generation: u32) {
            self.inner.detach(att, generation)
        }
        fn is_dead(&self) -> bool {
            self.inner.is_dead()
        }
        fn groups_returns(&self) -> bool {
            self.groups
        }
    }

    /// A new event's header is reset whatever its last holder left in it: the length to the
    /// size asked for, no control integers, low priority (raw_new writes only what differs).
    #[test]
    fn a_new_event_has_a_clean_header_whatever_its_last_holder_set() {
        use crate::Priority;
        let system = EtSystem::create(SystemConfig::new(format!("clean-{}", std::process::id()), 2, 64)).unwrap();
        system.create_station("s", StationConfig::default(), Position::End).unwrap();
        let consumer = system.attach("s").unwrap();
        let producer = system.attach("GRAND_CENTRAL").unwrap();
        let headers = |size: usize, change: bool| {
            let mut evs = producer.new_events(2, size, Wait::NoWait).unwrap();
            assert_eq!(evs.len(), 2);
            if change {
                for e in &mut evs {
                    e.set_control([1, -2, 3, -4]);
                    e.set_priority(Priority::High);
                    e.set_len(5).unwrap();
                }
            }
            producer.put_events(&mut evs).unwrap();
            let mut got = consumer.get_events(2, Wait::NoWait).unwrap();
            let seen: Vec<_> = got.iter().map(|e| (e.len(), e.control(), e.priority())).collect();
            consumer.put_events(&mut got).unwrap();
            seen
        };
        assert_eq!(headers(8, true), [(5, [1, -2, 3, -4], Priority::High); 2]);
        assert_eq!(headers(8, false), [(8, [0; 4], Priority::Low); 2], "reset after a holder changed it");
        assert_eq!(headers(8, false), [(8, [0; 4], Priority::Low); 2], "unchanged");
        assert_eq!(headers(16, false), [(16, [0; 4], Priority::Low); 2], "another size");
    }

    #[test]
    fn events_pushed_into_a_removed_station_continue_from_its_position() {
        let system = EtSystem::create(SystemConfig::new(format!("removed-{}", std::process::id()), 20, 64)).unwrap();
        for name in ["a", "b", "c"] {
            system.create_station(name, StationConfig::default(), Position::End).unwrap();
        }
        let a = system.attach("a").unwrap();
        let c = system.attach("c").unwrap();
        let b_slot = system.attach("b").unwrap().station; // attached and detached again
        let producer = system.attach("GRAND_CENTRAL").unwrap();
        let mut evs = producer.new_events(3, 8, Wait::NoWait).unwrap();
        producer.put_events(&mut evs).unwrap();
        let got = a.get_events(3, Wait::NoWait).unwrap();
        let idx: Vec<u32> = got.iter().map(|e| e.index()).collect();
        // A putter that read the chain before `b` was removed pushes into it afterwards.
        system.remove_station("b").unwrap();
        a.push(b_slot, &idx, None);
        drop(got);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut at_c = Vec::new();
        while at_c.len() < 3 && std::time::Instant::now() < deadline {
            let evs = c.get_events(3, Wait::Timed(std::time::Duration::from_millis(200))).unwrap_or_default();
            at_c.extend(evs.iter().map(|e| e.index()));
        }
        assert_eq!(at_c, idx, "on to the station after the removed one");
        assert!(a.get_events(3, Wait::NoWait).unwrap().is_empty(), "never back to a station before it");
    }

    #[test]
    fn a_large_event_that_cannot_be_mapped_is_handed_out_empty_and_marked_and_passes_on_unchanged() {
        let system = EtSystem::create(SystemConfig::new(format!("unmapped-{}", std::process::id()), 20, 64)).unwrap();
        system.create_station("blind", StationConfig::default(), Position::End).unwrap();
        system.create_station("after", StationConfig::default(), Position::End).unwrap();
        let (att, slot, _) = system.inner.attach("blind", Holder::InProcess).unwrap();
        let blind = LocalAttachment::new(
            Arc::new(Tweaked { inner: InProcess { system: system.inner.clone() }, no_temps: true, groups: false }),
            att,
            slot,
            "blind".into(),
        );
        let after = system.attach("after").unwrap();
        let producer = system.attach("GRAND_CENTRAL").unwrap();
        let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut evs = producer.new_events(1, payload.len(), Wait::NoWait).unwrap();
        evs[0].write(&payload).unwrap();
        evs[0].set_control([7, 0, 0, 0]);
        producer.put_events(&mut evs).unwrap();

        let mut got = blind.get_events(1, Wait::NoWait).unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].is_possibly_corrupt(), "its bytes are not here: marked");
        assert!(got[0].data().is_empty(), "never the pool slot's unrelated bytes");
        assert_eq!(got[0].control(), [7, 0, 0, 0]);
        blind.put_events(&mut got).unwrap();

        let got = after.get_events(1, Wait::NoWait).unwrap();
        assert_eq!(got[0].data(), &payload[..], "the event itself is unchanged for the next station");
        assert!(!got[0].is_possibly_corrupt());
    }

    #[test]
    fn a_stale_handle_cannot_touch_the_attachment_that_reused_its_slot() {
        let system = EtSystem::create(SystemConfig::new(format!("stale-{}", std::process::id()), 20, 64)).unwrap();
        let old = system.attach("GRAND_CENTRAL").unwrap();
        // The old attachment is recovered (as if its holder had died) and its slot reused.
        system.inner.detach(old.att, old.generation, true);
        let new = system.attach("GRAND_CENTRAL").unwrap();
        assert_eq!(new.att, old.att, "the slot was reused");
        assert!(matches!(old.new_events(1, 10, Wait::NoWait), Err(EtError::AttachmentDead(_))));
        drop(old);
        let mut evs = new.new_events(2, 10, Wait::NoWait).expect("the new attachment still works");
        assert_eq!(evs.len(), 2);
        new.put_events(&mut evs).unwrap();
    }

    #[test]
    fn a_late_detach_of_a_dead_attachment_spares_the_one_that_took_its_slot() {
        // The watchdog found a dead holder and detaches it after releasing the state lock; in
        // between, the holder's connection closed (freeing the slot) and a new process attached
        // to the same slot. The watchdog's detach names the dead attachment's generation.
        let system = EtSystem::create(SystemConfig::new(format!("late-{}", std::process::id()), 20, 64)).unwrap();
        let (att, _, dead_generation) = system.inner.attach("GRAND_CENTRAL", Holder::InProcess).unwrap();
        system.inner.detach(att, dead_generation, true);
        let new = system.attach("GRAND_CENTRAL").unwrap();
        assert_eq!(new.att, att, "the slot was reused");
        system.inner.detach(att, dead_generation, true);
        let mut evs = new.new_events(2, 10, Wait::NoWait).expect("the new attachment was not declared dead");
        new.put_events(&mut evs).unwrap();
        assert_eq!(system.snapshot().attachments.len(), 1, "{:#?}", system.snapshot());
    }

    /// A consumer on the last station (restore mode: input), with a pool of 3000 events: its
    /// returns go back in groups of 32.
    fn grouping_consumer(test: &str) -> (EtSystem, LocalAttachment) {
        let system = EtSystem::create(SystemConfig::new(format!("{test}-{}", std::process::id()), 3000, 64)).unwrap();
        let config = StationConfig { restore: crate::RestoreMode::Input, ..StationConfig::default() };
        system.create_station("last", config, Position::End).unwrap();
        let (att, slot, _) = system.inner.attach("last", Holder::InProcess).unwrap();
        let consumer = LocalAttachment::new(
            Arc::new(Tweaked { inner: InProcess { system: system.inner.clone() }, no_temps: false, groups: true }),
            att,
            slot,
            "last".into(),
        );
        (system, consumer)
    }

    fn produce(system: &EtSystem, n: usize) {
        let producer = system.attach("GRAND_CENTRAL").unwrap();
        for _ in 0..n {
            let mut evs = producer.new_events(1, 64, Wait::NoWait).unwrap();
            producer.put_events(&mut evs).unwrap();
        }
    }

    /// Gets and puts `n` events one at a time.
    fn consume(consumer: &LocalAttachment, n: usize) {
        for _ in 0..n {
            let mut evs = consumer.get_events(1, Wait::NoWait).unwrap();
            assert_eq!(evs.len(), 1);
            consumer.put_events(&mut evs).unwrap();
        }
    }

    #[test]
    fn returns_to_grand_central_go_in_groups_and_every_event_stays_accounted_for() {
        let (system, consumer) = grouping_consumer("groups");
        produce(&system, 40);
        consume(&consumer, 10);
        let s = system.snapshot();
        assert_eq!(s.free_events, 3000 - 40, "the 10 put back are kept");
        assert_eq!(s.attachments.iter().find(|a| a.station == "last").unwrap().held, 10, "and counted held");
        assert_eq!(s.accounted(), 3000, "{s:#?}");
        consume(&consumer, 22);
        let s = system.snapshot();
        assert_eq!(s.free_events, 3000 - 40 + 32, "the 32nd put pushed the group");
        assert_eq!(s.attachments.iter().find(|a| a.station == "last").unwrap().held, 0);
        assert_eq!(s.accounted(), 3000);
        // Put once, an event is no longer the user's, kept or not.
        consume(&consumer, 1);
        let pool = &system.inner.pool;
        let kept = (0..3000).find(|&i| pool.owner(i).load(std::sync::atomic::Ordering::Acquire) >= OWNER_RETURNING);
        assert!(kept.is_some());
        assert!(consumer.check_held(&[kept.unwrap()]).is_err());
    }

    #[test]
    fn a_whole_group_put_goes_back_at_once_alone_or_behind_kept_ones() {
        let (system, consumer) = grouping_consumer("whole-group");
        produce(&system, 100);
        let held = |s: &crate::monitor::Snapshot| s.attachments.iter().find(|a| a.station == "last").unwrap().held;
        // 40 in one put, nothing kept before them: straight back, none held.
        let mut evs = consumer.get_events(40, Wait::NoWait).unwrap();
        assert_eq!(evs.len(), 40);
        consumer.put_events(&mut evs).unwrap();
        let s = system.snapshot();
        assert_eq!((s.free_events, held(&s), s.accounted()), (3000 - 100 + 40, 0, 3000), "{s:#?}");
        // Five kept, then 40 in one put: they join the five, and the 45 go back together.
        consume(&consumer, 5);
        let s = system.snapshot();
        assert_eq!((s.free_events, held(&s), s.accounted()), (3000 - 100 + 40, 5, 3000), "{s:#?}");
        let mut evs = consumer.get_events(40, Wait::NoWait).unwrap();
        consumer.put_events(&mut evs).unwrap();
        let s = system.snapshot();
        assert_eq!((s.free_events, held(&s), s.accounted()), (3000 - 100 + 85, 0, 3000), "{s:#?}");
        // No event was left marked as being returned.
        let pool = &system.inner.pool;
        assert!((0..3000).all(|i| pool.owner(i).load(std::sync::atomic::Ordering::Acquire) < OWNER_RETURNING));
    }

    #[test]
    fn a_get_that_finds_nothing_pushes_what_was_kept_before_it_waits() {
        let (system, consumer) = grouping_consumer("flush-empty");
        produce(&system, 5);
        consume(&consumer, 5);
        assert_eq!(system.snapshot().free_events, 3000 - 5);
        assert!(consumer.get_events(1, Wait::NoWait).unwrap().is_empty());
        let s = system.snapshot();
        assert_eq!((s.free_events, s.accounted()), (3000, 3000), "{s:#?}");
        assert!(s.attachments.iter().all(|a| a.held == 0));
    }

    #[test]
    fn events_kept_by_an_attachment_that_dies_are_freed_not_restored() {
        let (system, consumer) = grouping_consumer("kept-dies");
        produce(&system, 8);
        consume(&consumer, 5);
        // Three more taken and held, five put and kept; then the holder dies.
        let held = consumer.get_events(3, Wait::NoWait).unwrap();
        assert_eq!(held.len(), 3);
        drop(held);
        // Another consumer on the station, so that what is restored to its input stays there.
        let other = system.attach("last").unwrap();
        system.inner.detach(consumer.id(), consumer.generation, true);
        let s = system.snapshot();
        let last = s.stations.iter().find(|st| st.name == "last").unwrap();
        assert_eq!(last.queued, 3, "only the three held are restored to the input, not the five put: {s:#?}");
        assert_eq!(s.free_events, 3000 - 3);
        assert_eq!(s.accounted(), 3000);
        let restored = other.get_events(10, Wait::NoWait).unwrap();
        assert_eq!(restored.len(), 3);
        assert!(restored.iter().all(|e| e.is_possibly_corrupt()));
        drop(consumer);
    }

    /// A producer's process died in the middle of a put, holding the lock of the station's
    /// queue (docs/et.md, "When a process dies holding a lock"): one event marked queued there
    /// without its slot filled, one filled past the tail, one not reached yet. The ET process
    /// repairs the queue: the first two reach the station, the third goes back to the free list
    /// with what the producer held; the lock is free again and every event is accounted for.
    #[test]
    fn a_put_cut_short_by_its_process_dying_holding_the_queue_lock_is_repaired() {
        use crate::pool::OWNER_ATTACHMENT;
        use crate::queue::word;
        use std::sync::atomic::Ordering;
        let (system, consumer) = grouping_consumer("dead-locker");
        let producer = system.attach("GRAND_CENTRAL").unwrap();
        let evs = producer.new_events(3, 64, Wait::NoWait).unwrap();
        let [a, b, c] = [0, 1, 2].map(|i| evs[i].index());
        drop(evs);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let pool = &system.inner.pool;
        pool.attachment(producer.att).pid.store(dead_pid, Ordering::Release);
        let q = pool.queue(consumer.station);
        q.push_lock.store(OWNER_ATTACHMENT + producer.att, Ordering::Release);
        pool.owner(a).store(consumer.station, Ordering::Release);
        pool.owner(b).store(consumer.station, Ordering::Release);
        let low = &q.rings[crate::queue::Lane::Low as usize];
        let t = low.tail.load(Ordering::Acquire);
        let cap = low.slots.len() as u64;
        low.slots[(t % cap) as usize].store(word(t, cap, b), Ordering::Release);
        // A filled slot is a queued event, lock or no lock on the pushers' side.
        let first = consumer.get_events(1, Wait::NoWait).unwrap();
        assert_eq!(first.iter().map(|e| e.index()).collect::<Vec<_>>(), [b]);
        drop(first);
        system.inner.detach(producer.att, producer.generation, true);
        assert_eq!((q.push_lock.load(Ordering::Acquire), q.pop_lock.load(Ordering::Acquire)), (0, 0));
        let s = system.snapshot();
        assert_eq!(s.accounted(), 3000, "{s:#?}");
        let got = consumer.get_events(10, Wait::NoWait).unwrap();
        assert_eq!(got.iter().map(|e| e.index()).collect::<Vec<_>>(), [a]);
        drop(got);
        assert_eq!(pool.owner(c).load(Ordering::Acquire), 0, "a new event the producer held is free again");
        drop(producer);
    }

    /// An attachment whose process was still exiting when it was recovered, holding a queue's
    /// lock: the repair waits for the process to be gone (the watchdog looks every 100 ms), and
    /// until then its slot, whose id the lock word holds, is not given to a new attachment.
    #[test]
    fn a_slot_whose_id_a_dying_processs_lock_holds_is_not_reused_before_the_repair() {
        use crate::pool::OWNER_ATTACHMENT;
        use std::sync::atomic::Ordering;
        let system = EtSystem::create(SystemConfig::new(format!("held-slot-{}", std::process::id()), 20, 64)).unwrap();
        let (att, _, generation) = system.inner.attach("GRAND_CENTRAL", Holder::InProcess).unwrap();
        let mut dying = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pool = &system.inner.pool;
        pool.attachment(att).pid.store(dying.id(), Ordering::Release);
        let q = pool.queue(0);
        q.pop_lock.store(OWNER_ATTACHMENT + att, Ordering::Release);
        system.inner.detach(att, generation, true);
        assert_eq!(q.pop_lock.load(Ordering::Acquire), OWNER_ATTACHMENT + att, "not repaired while its process lives");
        let other = system.attach("GRAND_CENTRAL").unwrap();
        assert_ne!(other.att, att, "the slot whose id the lock holds was given out");
        dying.kill().unwrap();
        dying.wait().unwrap();
        system.inner.repair_queues();
        assert_eq!(q.pop_lock.load(Ordering::Acquire), 0);
        let mut evs = other.new_events(2, 10, Wait::NoWait).unwrap();
        assert_eq!(evs.len(), 2);
        other.put_events(&mut evs).unwrap();
        assert_eq!(system.snapshot().accounted(), 20);
    }

    #[test]
    fn detaching_pushes_what_was_kept() {
        let (system, consumer) = grouping_consumer("kept-detach");
        produce(&system, 7);
        consume(&consumer, 7);
        drop(consumer);
        let s = system.snapshot();
        assert_eq!((s.free_events, s.accounted()), (3000, 3000), "{s:#?}");
        assert!(s.stations.iter().all(|st| st.queued == 0 || st.name == "GRAND_CENTRAL"));
    }
}
