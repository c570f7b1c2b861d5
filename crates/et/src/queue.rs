//! Layout 4's event queues: one lock for pushers and one for poppers, each on a cache line only
//! its side writes, and rings whose slots say themselves whether they are filled.
//!
//! A queue has three rings, popped in this order: the *front* ring (events given back to the
//! head of the queue), the high-priority ring and the low-priority ring. A ring is `cap` slots (a
//! power of two) of one 32-bit word each, `round << 24 | event` where the round of position `p`
//! is `p / cap % 256`, and two counters that only grow: `tail` (the pushers') and `head` (the
//! poppers'). The slot of position `p` is `p % cap`. A slot is *filled at `p`* when it holds
//! `round(p) << 24 | e`: a popper at head `p` finds its event by reading the slot alone, without
//! reading the pushers' tail (the line a pusher writes every push); until position `p` is filled
//! its slot holds the round before (or `EMPTY`, never filled), so it cannot read as filled. Nobody empties a
//! slot: the pusher at `t` knows the slot is free once the head has passed `t - cap`, which it
//! reads only when its cached copy of the head (`seen`, on its own line) says the ring may be full.
//!
//! Each side holds its lock (a compare-and-swap from 0 to the locker's id, released by a store)
//! for one call, however many events it moves, and writes plain stores under it:
//!
//! - **push**: for each event, mark it queued here (its owner word), then fill its slot (a
//!   release store: a popper that sees the slot sees the mark); move the tail once at the end.
//! - **pop**: for each slot filled at the head, mark its event held by the taker; move the head
//!   once at the end (a release store: a pusher that sees it may reuse the slots behind it).
//!
//! The owner word of each event (shared memory, one `u32` per event) says where it is: queued
//! in queue `q` (the value `q`) or held by an attachment (or the ET process). A process that
//! dies between two of these steps leaves its lock holding its id, and can leave two kinds of
//! damage, which the ET process repairs ([`Queue::repair`]) with both locks in its hands:
//!
//! - a pusher that died marked events queued here whose slots it had not filled (they are
//!   taken back), and filled slots past the tail (the tail is moved over them);
//! - a popper that died marked events held by itself whose slots are still at the head (the
//!   head is moved over them; the events are taken back with everything else it held).
//!
//! Until then its queue waits for it: a live process that wants the dead one's lock backs off
//! (pauses, then yields, then sleeps) while the lock is held.
//!
//! Sleeping: a popper that found nothing registers in `waiters`, reads the futex word `seq`,
//! looks once more and sleeps while `seq` is unchanged; a pusher, after filling its slots, reads
//! `waiters` and if there are any bumps `seq` (after releasing its lock) and wakes them. Both
//! sides touch `waiters` with a read-modify-write (the pusher adds 0, on the pushers' own line),
//! so the two are ordered: either the pusher sees the popper registered, or the popper's look
//! after registering sees the events. No wake-up is lost. (Registering under the pushers' lock
//! instead, so that a push needs no barrier of its own, measured 3–5 % faster at batch 1, but a
//! model check of it does not end: loom cannot bound the spin of three threads on one lock.) The
//! code is generic over the atomics and the sleeping, so that the same code runs under loom in
//! the tests, where a modelled process can also die between any two of its steps.

use std::sync::atomic::Ordering;
use std::time::Duration;

/// The event field of a slot that was never filled (and the largest number of events a pool
/// may have).
pub(crate) const EMPTY: u32 = 0xff_ffff;

/// Owner value of an event held by attachment `a`: `OWNER_HELD + a`; also attachment `a`'s
/// id in a lock word.
pub(crate) const OWNER_HELD: u32 = 0x4000_0000;

/// The slot word for position `p` of a ring of `cap` slots (a power of two) holding `v` (an
/// event or `EMPTY`): the round of the position (`p / cap`), modulo 256, in the top 8 bits.
/// Before a pusher fills position `p`, its slot holds what the round before wrote (or `EMPTY`,
/// never filled), so the round tells the two apart; no slot can hold a later round while the
/// head is at `p`.
#[inline]
pub(crate) fn word(p: u64, cap: u64, v: u32) -> u32 {
    (((p >> cap.trailing_zeros()) & 0xff) as u32) << 24 | v
}

/// The event of the slot word `w` if it is filled at position `p` (ring of `cap` slots).
#[inline]
fn filled_at(w: u32, p: u64, cap: u64) -> Option<u32> {
    let e = w & EMPTY;
    (e != EMPTY && w == word(p, cap, e)).then_some(e)
}

/// An atomic 32-bit word: `std`'s in shared memory, loom's in model checks.
pub(crate) trait Word: Sync {
    fn load(&self, o: Ordering) -> u32;
    fn store(&self, v: u32, o: Ordering);
    fn fetch_add(&self, v: u32, o: Ordering) -> u32;
    fn fetch_sub(&self, v: u32, o: Ordering) -> u32;
    fn compare_exchange(&self, current: u32, new: u32) -> Result<u32, u32>;
}

/// An atomic 64-bit word (the rings' counters).
pub(crate) trait Word64: Sync {
    fn load(&self, o: Ordering) -> u64;
    fn store(&self, v: u64, o: Ordering);
}

macro_rules! words {
    ($w32:ty, $w64:ty) => {
        impl Word for $w32 {
            fn load(&self, o: Ordering) -> u32 {
                self.load(o)
            }
            fn store(&self, v: u32, o: Ordering) {
                self.store(v, o)
            }
            fn fetch_add(&self, v: u32, o: Ordering) -> u32 {
                self.fetch_add(v, o)
            }
            fn fetch_sub(&self, v: u32, o: Ordering) -> u32 {
                self.fetch_sub(v, o)
            }
            fn compare_exchange(&self, current: u32, new: u32) -> Result<u32, u32> {
                self.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
            }
        }
        impl Word64 for $w64 {
            fn load(&self, o: Ordering) -> u64 {
                self.load(o)
            }
            fn store(&self, v: u64, o: Ordering) {
                self.store(v, o)
            }
        }
    };
}
words!(std::sync::atomic::AtomicU32, std::sync::atomic::AtomicU64);

/// What a queue needs from where it lives.
pub(crate) trait Platform {
    type W: Word;
    type D: Word64;
    /// Sleeps while `word` holds `expected`, at most `timeout` (may return early).
    fn wait(&self, word: &Self::W, expected: u32, timeout: Option<Duration>);
    /// Wakes every sleeper on `word`.
    fn wake(&self, word: &Self::W);
    /// How many times a popper checks the queue before it sleeps.
    fn spin_limit(&self) -> u32 {
        0
    }
    /// One turn of a spin (the `i`-th): a CPU pause.
    fn pause(&self, _i: u32) {
        std::hint::spin_loop();
    }
    /// The `i`-th wait for a lock another holds: a pause at first, later a yield or a sleep (its
    /// holder may be a dead process, whose lock waits for the ET process's repair).
    fn backoff(&self, i: u32) {
        if i < 128 { std::hint::spin_loop() } else { std::thread::yield_now() }
    }
    /// What the last wait came to: `true` if a longer spin would have been worth it.
    fn spun(&self, _worth_it: bool) {}
    /// Whether the calling process is still alive: `false` in a model check once the modelled
    /// process has died, after which it takes no further step. Always `true` elsewhere.
    #[inline]
    fn alive(&self) -> bool {
        true
    }
}

/// How a pop waits when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Block {
    /// Return at once.
    No,
    /// Until something arrives, `abort()` says stop, or the deadline passes.
    Until(Option<std::time::Instant>),
    /// As `Until`, for at most this long from the moment the queue is first found empty.
    For(Duration),
}

/// Why a pop returned without events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// Nothing was queued and the pop was not to wait (or the deadline passed).
    Nothing,
    /// `abort()` said stop (the system died, the attachment was removed).
    Aborted,
}

/// The modelled process died in the middle (model checks only; see [`Platform::alive`]), or
/// `abort()` said stop while it waited for a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Died;

/// Which ring of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Events given back to the head of the queue: popped before everything else.
    Front = 0,
    /// High priority.
    High = 1,
    /// Low priority.
    Low = 2,
}

/// One ring: its counters and its slots (`cap` of them, a power of two).
pub(crate) struct Ring<'a, W, D> {
    /// Poppers' counter (on the poppers' line).
    pub head: &'a D,
    /// Pushers' counter (on the pushers' line).
    pub tail: &'a D,
    /// The pushers' last look at `head` (on the pushers' line).
    pub seen: &'a D,
    pub slots: &'a [W],
}

/// A queue: its three rings, its locks, its sleepers' words, and the pool's owner words.
pub(crate) struct Queue<'a, P: Platform> {
    pub plat: P,
    /// The owner value of an event queued here (the queue's number).
    pub me: u32,
    /// Front, high, low.
    pub rings: [Ring<'a, P::W, P::D>; 3],
    /// 0, or the id of the pusher that holds it (on the pushers' line).
    pub push_lock: &'a P::W,
    /// 0, or the id of the popper that holds it (on the poppers' line).
    pub pop_lock: &'a P::W,
    /// The futex word sleepers wait on.
    pub seq: &'a P::W,
    /// Sleepers registered (on the pushers' line).
    pub waiters: &'a P::W,
    /// Every event's owner word.
    pub owners: &'a [P::W],
}

/// The lock id of a holder (`OWNER_HELD + a`, another owner value naming attachment `a` in its
/// low 28 bits, or the ET process's `0x7fff_ffff`).
#[inline]
pub(crate) fn locker(holder: u32) -> u32 {
    if holder == 0x7fff_ffff { holder } else { OWNER_HELD + (holder & 0x0fff_ffff) }
}

impl<'a, P: Platform> Queue<'a, P> {
    fn cap(&self) -> u64 {
        self.rings[0].slots.len() as u64
    }

    fn check(&self) -> Result<(), Died> {
        if self.plat.alive() { Ok(()) } else { Err(Died) }
    }

    /// Takes `lock` for `id`, backing off while another holds it; gives up if `abort()` says
    /// so (looked at every 64 turns once the wait is long).
    fn lock(&self, lock: &P::W, id: u32, abort: &dyn Fn() -> bool) -> Result<(), Died> {
        let mut i = 0u32;
        loop {
            // A compare-and-swap each turn, not a look first: the lock is seldom contended
            // (each side's is usually one process's), and a read-modify-write always sees the
            // latest value (a model check's spin would otherwise read a stale one forever).
            if lock.compare_exchange(0, id).is_ok() {
                return self.check();
            }
            self.plat.backoff(i);
            i = i.saturating_add(1);
            if i >= 1024 && i.is_multiple_of(64) && abort() {
                return Err(Died);
            }
        }
    }

    /// Pushes `items` (events `holder` holds) onto `lane`; wakes sleepers.
    pub(crate) fn push(&self, items: &[u32], lane: Lane, holder: u32) {
        let _ = self.try_push(items, lane, holder, &|| false);
    }

    /// Pushes the first of `items` while fewer than `limit` events are queued (a non-blocking
    /// station's cue; concurrent putters may overshoot it by what they push at the same moment);
    /// returns how many were pushed.
    pub(crate) fn push_upto(&self, items: &[u32], lane: Lane, limit: u32, holder: u32) -> usize {
        let room =
            if limit == u32::MAX { items.len() } else { (limit as u64).saturating_sub(self.len_bound()) as usize };
        let k = room.min(items.len());
        self.push(&items[..k], lane, holder);
        k
    }

    fn try_push(&self, items: &[u32], lane: Lane, holder: u32, abort: &dyn Fn() -> bool) -> Result<(), Died> {
        if items.is_empty() {
            return Ok(());
        }
        self.lock(self.push_lock, locker(holder), abort)?;
        let ring = &self.rings[lane as usize];
        let cap = self.cap();
        let mut t = ring.tail.load(Ordering::Relaxed);
        let mut seen = ring.seen.load(Ordering::Relaxed);
        for &e in items {
            if t.wrapping_sub(seen) >= cap {
                // Full as far as we last looked: look at the head. (A ring has room for every
                // event of the pool, so this only waits for a popper that has not yet moved
                // the head past the events it took.)
                let mut i = 0;
                loop {
                    seen = ring.head.load(Ordering::Acquire);
                    if t.wrapping_sub(seen) < cap {
                        break;
                    }
                    self.plat.backoff(i);
                    i = i.saturating_add(1);
                }
                ring.seen.store(seen, Ordering::Relaxed);
            }
            self.owners[e as usize].store(self.me, Ordering::Relaxed);
            self.check()?;
            ring.slots[(t & (cap - 1)) as usize].store(word(t, cap, e), Ordering::Release);
            self.check()?;
            t += 1;
        }
        ring.tail.store(t, Ordering::Release);
        self.check()?;
        // A read-modify-write, not a load: a popper's registration (also one) is ordered
        // against it, so either it is seen here, or its look after registering sees the events.
        let sleepers = self.waiters.fetch_add(0, Ordering::AcqRel);
        self.push_lock.store(0, Ordering::Release);
        self.check()?;
        if sleepers > 0 {
            self.wake_all();
        }
        Ok(())
    }

    /// Whether a slot at a head is filled (a look without the lock: a hint).
    fn ready(&self) -> bool {
        let cap = self.cap();
        self.rings.iter().any(|r| {
            let h = r.head.load(Ordering::Relaxed);
            filled_at(r.slots[(h & (cap - 1)) as usize].load(Ordering::Relaxed), h, cap).is_some()
        })
    }

    /// Takes up to `max` events into `out` for `taker` (its owner value), the rings in order,
    /// without waiting for events (it waits for the poppers' lock); returns how many.
    #[cfg(test)]
    pub(crate) fn take(&self, max: usize, out: &mut Vec<u32>, taker: u32) -> usize {
        self.try_take(max, out, taker, &|| false).unwrap_or_else(|n| n)
    }

    /// As `take`; `Err(n)` if the caller died (model checks) or `abort()` said stop while it
    /// waited for the lock, after taking `n`.
    fn try_take(&self, max: usize, out: &mut Vec<u32>, taker: u32, abort: &dyn Fn() -> bool) -> Result<usize, usize> {
        if max == 0 || !self.ready() {
            return Ok(0);
        }
        self.lock(self.pop_lock, locker(taker), abort).map_err(|_| 0usize)?;
        let cap = self.cap();
        let mut n = 0;
        for ring in &self.rings {
            let start = ring.head.load(Ordering::Relaxed);
            let mut h = start;
            while n < max {
                let Some(e) = filled_at(ring.slots[(h & (cap - 1)) as usize].load(Ordering::Acquire), h, cap) else {
                    break;
                };
                self.owners[e as usize].store(taker, Ordering::Relaxed);
                out.push(e);
                n += 1;
                self.check().map_err(|_| n)?;
                h += 1;
            }
            if h != start {
                ring.head.store(h, Ordering::Release);
                self.check().map_err(|_| n)?;
            }
        }
        self.pop_lock.store(0, Ordering::Release);
        Ok(n)
    }

    /// Takes `lock` for the ET process (`id`) whatever holds it, once that holder is free or
    /// dead (`dead(id)`): repairs only.
    fn seize(&self, lock: &P::W, id: u32, dead: &dyn Fn(u32) -> bool) {
        let (mut i, mut v) = (0u32, 0);
        loop {
            if v == 0 || (v != id && dead(v)) {
                match lock.compare_exchange(v, id) {
                    Ok(_) => return,
                    Err(now) => v = now,
                }
                continue;
            }
            self.plat.backoff(i);
            i = i.saturating_add(1);
            v = lock.compare_exchange(0, 0).unwrap_or_else(|now| now);
        }
    }

    /// Whether a lock of this queue is held by a holder `dead` says is dead.
    pub(crate) fn needs_repair(&self, dead: &dyn Fn(u32) -> bool) -> bool {
        [self.push_lock, self.pop_lock].iter().any(|l| {
            let v = l.load(Ordering::Acquire);
            v != 0 && dead(v)
        })
    }

    /// Repairs the queue after a locker died in it (the ET process, as `id`): takes both locks
    /// (from the dead, or once their live holders release them), moves each tail over the slots
    /// a dead pusher filled and each head over the slots whose events a dead popper took, and
    /// takes back the events a dead pusher marked queued here without filling their slots
    /// (their owner becomes `id`); returns those. Both locks are free again afterwards.
    pub(crate) fn repair(&self, id: u32, dead: &dyn Fn(u32) -> bool) -> Vec<u32> {
        self.seize(self.push_lock, id, dead);
        self.seize(self.pop_lock, id, dead);
        let cap = self.cap();
        let mut queued = vec![false; self.owners.len()];
        for ring in &self.rings {
            let mut h = ring.head.load(Ordering::Acquire);
            let mut t = ring.tail.load(Ordering::Acquire);
            if (t.wrapping_sub(h) as i64) < 0 {
                // Poppers took events a dead pusher had filled past the tail it left.
                t = h;
            }
            while t.wrapping_sub(h) < cap
                && filled_at(ring.slots[(t & (cap - 1)) as usize].load(Ordering::Acquire), t, cap).is_some()
            {
                t += 1;
            }
            while h != t {
                match filled_at(ring.slots[(h & (cap - 1)) as usize].load(Ordering::Acquire), h, cap) {
                    Some(e) if self.owners[e as usize].load(Ordering::Acquire) != self.me => h += 1,
                    _ => break,
                }
            }
            for p in h..t {
                if let Some(e) = filled_at(ring.slots[(p & (cap - 1)) as usize].load(Ordering::Acquire), p, cap) {
                    queued[e as usize] = true;
                }
            }
            ring.tail.store(t, Ordering::Release);
            ring.seen.store(h, Ordering::Relaxed);
            ring.head.store(h, Ordering::Release);
        }
        let mut orphans = Vec::new();
        for (e, o) in self.owners.iter().enumerate() {
            if !queued[e] && o.load(Ordering::Acquire) == self.me {
                o.store(id, Ordering::Release);
                orphans.push(e as u32);
            }
        }
        self.pop_lock.store(0, Ordering::Release);
        self.push_lock.store(0, Ordering::Release);
        self.wake_all();
        orphans
    }

    /// The events queued here (tail minus head, over the rings; exact between calls, a bound
    /// while a call is under way): a non-blocking station's cue, the ET process's looks.
    pub(crate) fn len_bound(&self) -> u64 {
        self.rings.iter().map(|r| r.tail.load(Ordering::Acquire).saturating_sub(r.head.load(Ordering::Acquire))).sum()
    }

    /// Pops up to `max` events for `taker` (front, high, low), waiting per `block`.
    pub(crate) fn pop(
        &self,
        max: usize,
        out: &mut Vec<u32>,
        block: Block,
        taker: u32,
        abort: &dyn Fn() -> bool,
    ) -> Result<usize, Empty> {
        let mut block = block;
        loop {
            match self.try_take(max, out, taker, abort) {
                Ok(0) => {}
                Ok(got) => return Ok(got),
                Err(0) => return Err(Empty::Aborted),
                Err(got) => return Ok(got),
            }
            if !self.plat.alive() {
                return Err(Empty::Aborted);
            }
            match block {
                Block::No => return Err(Empty::Nothing),
                Block::For(d) => block = Block::Until(Some(std::time::Instant::now() + d)),
                Block::Until(_) => {}
            }
            if abort() {
                return Err(Empty::Aborted);
            }
            // Spin a little before sleeping (docs/et.md, "Why an adaptive spin"), looking at the
            // slots at the heads (and, now and then, at the futex word: a wake-all to abort).
            let seq = self.seq.load(Ordering::Acquire);
            let limit = self.plat.spin_limit();
            let mut spun = 0;
            while spun < limit && !self.ready() && (spun % 64 != 63 || self.seq.load(Ordering::Acquire) == seq) {
                self.plat.pause(spun);
                spun += 1;
            }
            if limit > 0 && spun < limit {
                self.plat.spun(true);
                continue;
            }
            let timeout = match block {
                Block::Until(Some(deadline)) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Empty::Nothing);
                    }
                    Some(left.min(Duration::from_millis(100)))
                }
                Block::Until(None) | Block::No | Block::For(_) => Some(Duration::from_millis(100)),
            };
            // Register, read the futex word, look once more: a push whose read-modify-write of
            // `waiters` comes after the registration sees the sleeper and bumps `seq`, one whose
            // comes before is seen by the look, so the wait cannot miss it.
            self.waiters.fetch_add(1, Ordering::AcqRel);
            let seq = self.seq.load(Ordering::Acquire);
            match self.try_take(max, out, taker, abort) {
                Ok(0) => {}
                Ok(got) | Err(got) if got > 0 => {
                    self.waiters.fetch_sub(1, Ordering::Relaxed);
                    return Ok(got);
                }
                _ => {
                    self.waiters.fetch_sub(1, Ordering::Relaxed);
                    return Err(Empty::Aborted);
                }
            }
            let slept = std::time::Instant::now();
            self.plat.wait(self.seq, seq, timeout);
            self.waiters.fetch_sub(1, Ordering::Relaxed);
            if limit > 0 {
                self.plat.spun(slept.elapsed() < Duration::from_micros(200));
            }
        }
    }

    /// Calls `f` on every event queued here (tests: the ET process counts queued events by
    /// their owner words, `Pool::owner_counts`).
    #[cfg(test)]
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32)) {
        let cap = self.cap();
        for ring in &self.rings {
            let (h, t) = (ring.head.load(Ordering::Acquire), ring.tail.load(Ordering::Acquire));
            for p in h..t.max(h) {
                if let Some(e) = filled_at(ring.slots[(p & (cap - 1)) as usize].load(Ordering::Acquire), p, cap) {
                    f(e);
                }
            }
        }
    }

    /// Wakes every sleeper (they re-check their abort condition).
    pub(crate) fn wake_all(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        self.plat.wake(self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, AtomicU64};

    const HELD: u32 = 0x4000_0000;
    const SYSTEM: u32 = 0x7fff_ffff;

    /// A queue's memory on the heap.
    pub(super) struct Mem<W, D> {
        /// Heads, tails, seen heads (front, high, low each).
        pub counters: Vec<D>,
        pub slots: Vec<Vec<W>>,
        /// Sleepers' futex word, sleepers, push lock, pop lock.
        pub words: [W; 4],
        pub owners: Vec<W>,
    }

    pub(super) fn mem<W, D>(cap: u64, events: u32, w: impl Fn(u32) -> W, d: impl Fn(u64) -> D) -> Mem<W, D> {
        Mem {
            counters: (0..9).map(|_| d(0)).collect(),
            slots: (0..3).map(|_| (0..cap).map(|_| w(EMPTY)).collect()).collect(),
            words: [w(0), w(0), w(0), w(0)],
            // Every event starts held by attachment 1 (the pusher of the death models).
            owners: (0..events).map(|_| w(HELD + 1)).collect(),
        }
    }

    pub(super) fn queue<P: Platform>(m: &Mem<P::W, P::D>, plat: P) -> Queue<'_, P> {
        let ring = |i: usize| Ring {
            head: &m.counters[i],
            tail: &m.counters[3 + i],
            seen: &m.counters[6 + i],
            slots: &m.slots[i],
        };
        Queue {
            plat,
            me: 1,
            rings: [ring(0), ring(1), ring(2)],
            seq: &m.words[0],
            waiters: &m.words[1],
            push_lock: &m.words[2],
            pop_lock: &m.words[3],
            owners: &m.owners,
        }
    }

    struct Plain;
    impl Platform for Plain {
        type W = AtomicU32;
        type D = AtomicU64;
        fn wait(&self, _: &AtomicU32, _: u32, _: Option<Duration>) {
            std::thread::yield_now();
        }
        fn wake(&self, _: &AtomicU32) {}
    }

    use proptest::prelude::*;

    proptest! {
        /// Against a model: three FIFO lanes popped front, high, low; events taken and given
        /// back through the front come out first again; an event's owner word says where it is.
        #[test]
        fn behaves_like_three_fifo_lanes(
            cap_log in 0u32..6,
            ops in proptest::collection::vec((0u8..4, 0usize..3, 1usize..20), 0..200),
        ) {
            // As many events as slots.
            let cap = 1u64 << cap_log;
            let m = mem(cap, cap as u32, AtomicU32::new, AtomicU64::new);
            let q = queue(&m, Plain);
            let mut lanes: [VecDeque<u32>; 3] = Default::default();
            let mut held: Vec<u32> = (0..cap as u32).collect();
            for (op, lane, n) in ops {
                match op {
                    0 | 1 => {
                        let k = n.min(held.len());
                        let items: Vec<u32> = held.drain(..k).collect();
                        let l = [Lane::Front, Lane::High, Lane::Low][lane];
                        q.push(&items, l, HELD + 7);
                        lanes[lane].extend(items);
                    }
                    _ => {
                        let mut out = Vec::new();
                        let got = q.take(n, &mut out, HELD + 3);
                        let mut expected = Vec::new();
                        for l in &mut lanes {
                            while expected.len() < n {
                                match l.pop_front() { Some(x) => expected.push(x), None => break }
                            }
                        }
                        prop_assert_eq!(got, expected.len());
                        prop_assert_eq!(&out, &expected);
                        if op == 3 {
                            // Give them back to the front.
                            q.push(&out, Lane::Front, HELD + 3);
                            lanes[0].extend(out);
                        } else {
                            held.extend(out);
                        }
                    }
                }
                let queued: usize = lanes.iter().map(|l| l.len()).sum();
                prop_assert_eq!(q.len_bound() as usize, queued);
                prop_assert_eq!(m.words[2].load(Ordering::Relaxed), 0, "push lock left held");
                prop_assert_eq!(m.words[3].load(Ordering::Relaxed), 0, "pop lock left held");
                for (e, o) in m.owners.iter().enumerate() {
                    let o = o.load(Ordering::Relaxed);
                    prop_assert!(o == 1 || o == HELD + 3 || o == HELD + 1, "event {} owner {:#x}", e, o);
                    prop_assert_eq!(o == 1, lanes.iter().any(|l| l.contains(&(e as u32))));
                }
            }
        }
    }

    /// What a pusher and a popper that died mid-call leave, repaired by the ET process.
    #[test]
    fn a_repair_takes_back_what_dead_lockers_left_half_done() {
        let m = mem(8, 8, AtomicU32::new, AtomicU64::new);
        let q = queue(&m, Plain);
        q.push(&[0, 1, 2], Lane::Low, HELD + 1);
        // A popper (attachment 2) died after taking event 0, before moving the head: its lock
        // holds its id, event 0's owner names it, the head is still at event 0's slot.
        m.words[3].store(HELD + 2, Ordering::Relaxed);
        m.owners[0].store(HELD + 2, Ordering::Relaxed);
        // A pusher (attachment 1) died pushing events 3, 4 and 5: all three marked queued here,
        // the slot of 3 filled, the tail not moved.
        m.words[2].store(HELD + 1, Ordering::Relaxed);
        for e in [3, 4, 5] {
            m.owners[e].store(1, Ordering::Relaxed);
        }
        m.slots[2][3].store(word(3, 8, 3), Ordering::Relaxed);
        let dead = |v: u32| v == HELD + 1 || v == HELD + 2;
        assert!(q.needs_repair(&dead));
        assert_eq!(q.repair(SYSTEM, &dead), [4, 5]);
        assert!(!q.needs_repair(&dead));
        assert_eq!([4, 5].map(|e| m.owners[e].load(Ordering::Relaxed)), [SYSTEM, SYSTEM]);
        assert_eq!(q.len_bound(), 3, "events 1, 2 and 3 queued");
        let mut seen = Vec::new();
        q.for_each(|e| seen.push(e));
        assert_eq!(seen, [1, 2, 3]);
        let mut out = Vec::new();
        assert_eq!(q.take(10, &mut out, HELD + 3), 3);
        assert_eq!(out, [1, 2, 3]);
        // The queue works on: the pushers' cached head catches up when the ring looks full.
        for round in 0..4u32 {
            let items: Vec<u32> = (0..6).map(|i| (i + round) % 8).collect();
            q.push(&items, Lane::Low, HELD + 3);
            out.clear();
            assert_eq!(q.take(10, &mut out, HELD + 3), 6);
            assert_eq!(out, items);
        }
    }

    /// A pusher that died before moving its tail, whose events a popper took meanwhile: the
    /// repair moves the tail up to the head and beyond, over what is still filled.
    #[test]
    fn a_repair_finds_the_tail_behind_the_head() {
        let m = mem(4, 4, AtomicU32::new, AtomicU64::new);
        let q = queue(&m, Plain);
        m.words[2].store(HELD + 1, Ordering::Relaxed);
        for (p, e) in [(0u64, 0u32), (1, 1), (2, 2)] {
            m.owners[e as usize].store(1, Ordering::Relaxed);
            m.slots[2][p as usize].store(word(p, 4, e), Ordering::Relaxed);
        }
        m.owners[3].store(1, Ordering::Relaxed);
        let mut out = Vec::new();
        assert_eq!(q.take(2, &mut out, HELD + 2), 2);
        assert_eq!(q.repair(SYSTEM, &|v| v == HELD + 1), [3]);
        out.clear();
        assert_eq!(q.take(9, &mut out, HELD + 2), 1);
        assert_eq!(out, [2]);
        assert_eq!(q.len_bound(), 0);
    }

    /// A lock held by a live holder is waited for; an abort ends the wait.
    #[test]
    fn a_popper_waiting_for_a_held_lock_gives_up_when_told() {
        let m = mem(8, 8, AtomicU32::new, AtomicU64::new);
        let q = queue(&m, Plain);
        q.push(&[0], Lane::Low, HELD + 1);
        m.words[3].store(HELD + 2, Ordering::Relaxed);
        let mut out = Vec::new();
        assert_eq!(q.pop(4, &mut out, Block::No, HELD + 3, &|| true), Err(Empty::Aborted));
        m.words[3].store(0, Ordering::Relaxed);
        assert_eq!(q.pop(4, &mut out, Block::No, HELD + 3, &|| true), Ok(1));
    }

    #[test]
    fn a_timed_pop_returns_empty_when_nothing_comes() {
        let m = mem(8, 8, AtomicU32::new, AtomicU64::new);
        let q = queue(&m, Plain);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_millis(30);
        assert_eq!(q.pop(4, &mut out, Block::Until(Some(deadline)), HELD, &|| false), Err(Empty::Nothing));
        assert_eq!(q.pop(4, &mut out, Block::Until(None), HELD, &|| true), Err(Empty::Aborted));
    }

    #[test]
    fn a_slot_tells_its_round_from_the_one_before() {
        // Rounds modulo 256: position 5 and 5 + 256 rings of 8 later look alike, the round
        // before does not, nor a slot never filled.
        assert_eq!(filled_at(word(5 + 256 * 8, 8, 7), 5, 8), Some(7));
        assert_eq!(filled_at(word(256 * 8 + 5 - 8, 8, 7), 5 + 256 * 8, 8), None);
        assert_eq!(filled_at(EMPTY, 5, 8), None);
        assert_eq!(filled_at(EMPTY, 0, 8), None);
    }
}

/// Model checks with loom: no event is lost or delivered twice, a sleeping popper is always
/// woken (a lost wake-up is a deadlock loom reports), and a process that dies between any two of
/// its steps, while another goes on using the queue, leaves nothing that the ET process's repair
/// does not put right.
#[cfg(test)]
mod loom_tests {
    use super::tests::{Mem, mem, queue};
    use super::*;
    use loom::sync::atomic::{AtomicU32, AtomicU64};
    use loom::sync::{Arc, Condvar, Mutex};
    use std::cell::Cell;

    words!(AtomicU32, AtomicU64);

    const HELD: u32 = 0x4000_0000;
    const SYSTEM: u32 = 0x7fff_ffff;

    struct Shared {
        mem: Mem<AtomicU32, AtomicU64>,
        /// A futex: sleepers check the word under this mutex, wakers notify under it.
        futex: Mutex<()>,
        cv: Condvar,
    }

    /// A modelled process: it dies after `steps` steps (`u32::MAX`: never).
    struct LoomPlat<'a> {
        s: &'a Shared,
        steps: Cell<u32>,
        died: Cell<bool>,
    }
    impl Platform for LoomPlat<'_> {
        type W = AtomicU32;
        type D = AtomicU64;
        fn wait(&self, word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
            // No timeout: a wake-up the protocol forgets must show up as a deadlock.
            let g = self.s.futex.lock().unwrap();
            if word.load(Ordering::Acquire) == expected {
                drop(self.s.cv.wait(g).unwrap());
            }
        }
        fn wake(&self, _: &AtomicU32) {
            let _g = self.s.futex.lock().unwrap();
            self.s.cv.notify_all();
        }
        fn pause(&self, _: u32) {
            loom::thread::yield_now();
        }
        fn backoff(&self, _: u32) {
            loom::thread::yield_now();
        }
        fn alive(&self) -> bool {
            match self.steps.get() {
                u32::MAX => true,
                0 => {
                    self.died.set(true);
                    false
                }
                left => {
                    self.steps.set(left - 1);
                    true
                }
            }
        }
    }

    fn shared(cap: u64, events: u32) -> Arc<Shared> {
        Arc::new(Shared {
            mem: mem(cap, events, AtomicU32::new, AtomicU64::new),
            futex: Mutex::new(()),
            cv: Condvar::new(),
        })
    }

    /// Runs `f` as a process that dies after `steps` steps; returns what `f` returned and
    /// whether it died.
    fn with_queue<R>(s: &Shared, steps: u32, f: impl FnOnce(&Queue<'_, LoomPlat<'_>>) -> R) -> (R, bool) {
        let q = queue(&s.mem, LoomPlat { s, steps: Cell::new(steps), died: Cell::new(false) });
        let r = f(&q);
        (r, q.plat.died.get())
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(f);
    }

    /// What the ET process does for dead attachment 1 (run by the dead one's thread, while the
    /// other goes on): repairs the queue if it holds a lock there, then takes back the events
    /// it held.
    fn recover(s: &Shared) -> Vec<u32> {
        let dead = |v: u32| v == HELD + 1;
        let (mut taken, _) =
            with_queue(s, u32::MAX, |q| if q.needs_repair(&dead) { q.repair(SYSTEM, &dead) } else { Vec::new() });
        for (e, o) in s.mem.owners.iter().enumerate() {
            if o.load(Ordering::Acquire) == HELD + 1 && Word::compare_exchange(o, HELD + 1, SYSTEM).is_ok() {
                taken.push(e as u32);
            }
        }
        taken
    }

    /// Every event once: in `places`, or still queued (taken now by a drain); no lock held.
    fn census(s: &Shared, mut places: Vec<u32>, events: u32) {
        with_queue(s, u32::MAX, |q| {
            let mut out = Vec::new();
            q.take(usize::MAX, &mut out, HELD + 9);
            places.extend(out);
            assert_eq!(q.len_bound(), 0, "slots left behind");
            assert_eq!((q.push_lock.load(Ordering::Relaxed), q.pop_lock.load(Ordering::Relaxed)), (0, 0));
        });
        places.sort();
        assert_eq!(places, (0..events).collect::<Vec<_>>());
    }

    #[test]
    fn a_sleeping_consumer_gets_every_event_from_two_producers() {
        model(|| {
            let s = shared(4, 4);
            let producers: Vec<_> = [[0u32, 1], [2, 3]]
                .into_iter()
                .enumerate()
                .map(|(i, items)| {
                    let s = s.clone();
                    loom::thread::spawn(move || {
                        with_queue(&s, u32::MAX, |q| q.push(&items, Lane::Low, HELD + 6 + i as u32));
                    })
                })
                .collect();
            let mut got = Vec::new();
            with_queue(&s, u32::MAX, |q| {
                while got.len() < 4 {
                    let _ = q.pop(4, &mut got, Block::Until(None), HELD + 5, &|| false);
                }
            });
            for p in producers {
                p.join().unwrap();
            }
            got.sort();
            assert_eq!(got, [0, 1, 2, 3]);
            assert_eq!(s.mem.words[1].load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    fn two_sleeping_consumers_share_the_events_without_duplicates() {
        model(|| {
            let s = shared(2, 2);
            let consumers: Vec<_> = (0..2)
                .map(|i| {
                    let s = s.clone();
                    loom::thread::spawn(move || {
                        let mut got = Vec::new();
                        with_queue(&s, u32::MAX, |q| {
                            let _ = q.pop(1, &mut got, Block::Until(None), HELD + 2 + i, &|| false);
                        });
                        got
                    })
                })
                .collect();
            with_queue(&s, u32::MAX, |q| q.push(&[0, 1], Lane::High, HELD + 4));
            let mut all: Vec<u32> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
            all.sort();
            assert_eq!(all, [0, 1]);
        });
    }

    /// A pusher dies after each possible number of steps while a popper takes; the ET process
    /// repairs: every event ends up once, taken, queued, or back with the ET process.
    #[test]
    fn a_pusher_dying_at_any_step_loses_and_duplicates_nothing() {
        for steps in 0..8 {
            model(move || {
                let s = shared(2, 2);
                let pusher = {
                    let s = s.clone();
                    loom::thread::spawn(move || {
                        let (_, died) = with_queue(&s, steps, |q| q.push(&[0, 1], Lane::Low, HELD + 1));
                        if died { recover(&s) } else { Vec::new() }
                    })
                };
                let (got, _) = with_queue(&s, u32::MAX, |q| {
                    let mut got = Vec::new();
                    q.take(2, &mut got, HELD + 2);
                    got
                });
                let mut places = pusher.join().unwrap();
                places.extend(got);
                census(&s, places, 2);
            });
        }
    }

    /// A popper dies after each possible number of steps while another pops the same queue.
    #[test]
    fn a_popper_dying_at_any_step_loses_and_duplicates_nothing() {
        for steps in 0..5 {
            model(move || {
                let s = shared(2, 2);
                with_queue(&s, u32::MAX, |q| q.push(&[0, 1], Lane::Low, HELD + 4));
                let dying = {
                    let s = s.clone();
                    loom::thread::spawn(move || {
                        let (got, died) = with_queue(&s, steps, |q| {
                            let mut got = Vec::new();
                            q.take(2, &mut got, HELD + 1);
                            got
                        });
                        if died { recover(&s) } else { got }
                    })
                };
                let (got, _) = with_queue(&s, u32::MAX, |q| {
                    let mut got = Vec::new();
                    q.take(1, &mut got, HELD + 2);
                    got
                });
                let mut places = dying.join().unwrap();
                places.extend(got);
                census(&s, places, 2);
            });
        }
    }
}
