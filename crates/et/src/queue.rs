//! Event queues: the input list of a station and the free list of GrandCentral.
//!
//! A queue holds event indices in two rings (high and low priority), protected by a lock. The
//! lock in shared memory is a robust, process-shared mutex: if a process dies holding it, the
//! next locker is told, and repairs the queue. The order of the steps inside the lock keeps
//! every event either in exactly one queue or owned by exactly one attachment, whatever the
//! point at which a process dies:
//!
//! - push: write the slots, advance the tail (one store), then mark the events "queued here";
//!   a death before the tail moves leaves them owned by the pusher, a death after leaves them
//!   in the queue, and the repair marks every queued event "queued here";
//! - pop: mark the events taken by the popper, then advance the head; a death before the head
//!   moves leaves them in the queue (the repair marks them queued again), a death after leaves
//!   them owned by the popper, whose recovery finds them.
//!
//! Waiting uses a futex word (`seq`) and a count of waiters: a popper that finds the queue
//! empty registers as a waiter and reads `seq` under the lock, then sleeps while `seq` is
//! unchanged; a pusher that sees a waiter (under the lock) bumps `seq` and wakes after unlocking.
//! The queue logic is generic over the lock, the atomics and the sleeping, so that the same code
//! runs under loom in the tests.

use std::sync::atomic::Ordering;
use std::time::Duration;

/// An atomic 32-bit word: `std`'s in shared memory, loom's in model checks.
pub(crate) trait Word: Sync {
    fn load(&self, o: Ordering) -> u32;
    fn store(&self, v: u32, o: Ordering);
    fn fetch_add(&self, v: u32, o: Ordering) -> u32;
    fn fetch_sub(&self, v: u32, o: Ordering) -> u32;
}

impl Word for std::sync::atomic::AtomicU32 {
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
}

/// What a queue needs from where it lives.
pub(crate) trait Platform {
    type W: Word;
    /// Takes the queue's lock; `true` if its previous holder died inside (repair needed).
    fn lock(&self) -> bool;
    /// Marks the lock's state consistent after a repair.
    fn consistent(&self);
    fn unlock(&self);
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
    /// What the last wait came to: `true` if a longer spin would have been worth it (the spin
    /// found events, or the sleep after it was short), `false` if not.
    fn spun(&self, _worth_it: bool) {}
}

/// The ring positions, protected by the lock. Counters only grow; a slot is `counter % cap`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct Ring {
    pub low_head: u64,
    pub low_tail: u64,
    pub high_head: u64,
    pub high_tail: u64,
}

/// How a pop waits when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Block {
    /// Return at once.
    No,
    /// Until something arrives, `abort()` says stop, or the deadline passes.
    Until(Option<std::time::Instant>),
    /// As `Until`, for at most this long from the moment the queue is first found empty (no
    /// clock is read when events are there).
    For(Duration),
}

/// Marks events as they move: `queued(idx)` when they enter the queue, `taken(idx)` when a
/// popper takes them. Both run under the queue's lock.
pub(crate) trait Marks {
    fn queued(&self, idx: u32);
    fn taken(&self, idx: u32);
}

/// No marks (tests and model checks).
#[cfg(test)]
pub(crate) struct NoMarks;
#[cfg(test)]
impl Marks for NoMarks {
    fn queued(&self, _: u32) {}
    fn taken(&self, _: u32) {}
}

/// A queue: its lock and words, and its two rings of `cap` slots.
pub(crate) struct Queue<'a, P: Platform> {
    pub plat: P,
    pub ring: *mut Ring,
    pub high: *mut u32,
    pub low: *mut u32,
    pub cap: u64,
    /// Events queued (readable without the lock: non-blocking stations and monitors).
    pub count: &'a P::W,
    /// The futex word sleepers wait on.
    pub seq: &'a P::W,
    /// Sleepers registered.
    pub waiters: &'a P::W,
}

/// Why a pop returned without events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// Nothing was queued and the pop was not to wait (or the deadline passed).
    Nothing,
    /// `abort()` said stop (the system died, the attachment was removed).
    Aborted,
}

impl<'a, P: Platform> Queue<'a, P> {
    /// The ring slot of position `c` (positions count up for ever; the ring has `cap` slots).
    #[inline]
    fn slot(&self, c: u64) -> usize {
        (c % self.cap) as usize
    }

    /// The slot after `slot`: a batch divides once, for its first slot, and steps on from
    /// there (a 64-bit division per event was a tenth of an ET consumer's time at batch 100;
    /// docs/performance.md).
    #[inline]
    fn next(&self, slot: usize) -> usize {
        let n = slot + 1;
        if n as u64 == self.cap { 0 } else { n }
    }

    /// Takes the lock, repairing the queue if its previous holder died inside.
    fn lock<M: Marks + ?Sized>(&self, marks: &M) -> LockGuard<'_, 'a, P> {
        if self.plat.lock() {
            self.repair(marks);
            self.plat.consistent();
        }
        LockGuard { q: self }
    }

    /// Re-establishes what a dead lock holder may have left half done: the count, and the
    /// marks of every queued event.
    fn repair<M: Marks + ?Sized>(&self, marks: &M) {
        // SAFETY: called with the lock held; `ring` points to this queue's ring state.
        let r = unsafe { &*self.ring };
        let mut n = 0u64;
        for (head, tail, slots) in [(r.high_head, r.high_tail, self.high), (r.low_head, r.low_tail, self.low)] {
            for c in head..tail {
                // SAFETY: `c % cap` is within the ring's `cap` slots; the lock is held.
                let idx = unsafe { *slots.add((c % self.cap) as usize) };
                marks.queued(idx);
                n += 1;
            }
        }
        self.count.store(n as u32, Ordering::Release);
    }

    /// Pushes `items` (high or low priority); returns false if a ring would overflow (a bug:
    /// an event is never in two queues, and every ring holds all of them).
    pub(crate) fn push<M: Marks + ?Sized>(&self, items: &[u32], high: bool, marks: &M) -> bool {
        self.push_upto(items, high, u32::MAX, marks) == Some(items.len())
    }

    /// Pushes the first of `items` while fewer than `limit` events are queued (a non-blocking
    /// station's cue, checked under the lock so that concurrent putters cannot overshoot it);
    /// returns how many were pushed, `None` if a ring would overflow.
    pub(crate) fn push_upto<M: Marks + ?Sized>(
        &self,
        items: &[u32],
        high: bool,
        limit: u32,
        marks: &M,
    ) -> Option<usize> {
        if items.is_empty() {
            return Some(0);
        }
        let (wake, k) = {
            let _g = self.lock(marks);
            let room = limit.saturating_sub(self.count.load(Ordering::Acquire)) as usize;
            let items = &items[..room.min(items.len())];
            if items.is_empty() {
                return Some(0);
            }
            // SAFETY: the lock is held; `ring` points to this queue's ring state.
            let r = unsafe { &mut *self.ring };
            let (head, tail, slots) =
                if high { (r.high_head, &mut r.high_tail, self.high) } else { (r.low_head, &mut r.low_tail, self.low) };
            if *tail - head + items.len() as u64 > self.cap {
                return None;
            }
            let mut slot = self.slot(*tail);
            for &idx in items {
                // SAFETY: `slot` is below `cap` (see `next`); the lock is held.
                unsafe { *slots.add(slot) = idx };
                slot = self.next(slot);
            }
            *tail += items.len() as u64;
            for &idx in items {
                marks.queued(idx);
            }
            self.count.fetch_add(items.len() as u32, Ordering::Release);
            (!items.is_empty() && self.waiters.load(Ordering::Acquire) > 0, items.len())
        };
        if wake {
            self.seq.fetch_add(1, Ordering::Release);
            self.plat.wake(self.seq);
        }
        Some(k)
    }

    /// Puts `items` back at the head of the queue (high or low priority), in their order,
    /// ahead of everything queued: events taken and not used (a remote client's prefetched
    /// batch) go back where they were. Returns false, and changes nothing, if they do not fit
    /// in front of the head (they were not all taken from this queue).
    ///
    /// Steps as for a push: write the slots, move the head back (one store), then mark the
    /// events queued; a death before the head moves leaves them with the pusher.
    pub(crate) fn push_front<M: Marks + ?Sized>(&self, items: &[u32], high: bool, marks: &M) -> bool {
        if items.is_empty() {
            return true;
        }
        let wake = {
            let _g = self.lock(marks);
            // SAFETY: the lock is held; `ring` points to this queue's ring state.
            let r = unsafe { &mut *self.ring };
            let (head, tail, slots) =
                if high { (&mut r.high_head, r.high_tail, self.high) } else { (&mut r.low_head, r.low_tail, self.low) };
            let k = items.len() as u64;
            if *head < k || tail - *head + k > self.cap {
                return false;
            }
            let start = *head - k;
            let mut slot = self.slot(start);
            for &idx in items {
                // SAFETY: `slot` is below `cap` (see `next`); the lock is held.
                unsafe { *slots.add(slot) = idx };
                slot = self.next(slot);
            }
            *head = start;
            for &idx in items {
                marks.queued(idx);
            }
            self.count.fetch_add(items.len() as u32, Ordering::Release);
            self.waiters.load(Ordering::Acquire) > 0
        };
        if wake {
            self.seq.fetch_add(1, Ordering::Release);
            self.plat.wake(self.seq);
        }
        true
    }

    /// Pops up to `max` events (high priority first) into `out`, waiting per `block`.
    pub(crate) fn pop<M: Marks + ?Sized>(
        &self,
        max: usize,
        out: &mut Vec<u32>,
        block: Block,
        marks: &M,
        abort: &dyn Fn() -> bool,
    ) -> Result<usize, Empty> {
        let mut block = block;
        loop {
            let seq = {
                let _g = self.lock(marks);
                let got = self.take(max, out, marks);
                if got > 0 {
                    return Ok(got);
                }
                match block {
                    Block::No => return Err(Empty::Nothing),
                    Block::For(d) => block = Block::Until(Some(std::time::Instant::now() + d)),
                    Block::Until(_) => {}
                }
                self.seq.load(Ordering::Acquire)
            };
            if abort() {
                return Err(Empty::Aborted);
            }
            // Spin a little before sleeping: a producer on another core usually pushes within
            // microseconds, and a futex sleep and wake-up cost more than that. A spinning
            // taker is not registered as a waiter, so pushers make no wake-up system call for it.
            let mut spun = 0;
            let limit = self.plat.spin_limit();
            while spun < limit && self.count.load(Ordering::Acquire) == 0 && self.seq.load(Ordering::Acquire) == seq {
                self.plat.pause(spun);
                spun += 1;
            }
            if limit > 0 && self.count.load(Ordering::Acquire) > 0 {
                self.plat.spun(true);
                continue;
            }
            let timeout = match block {
                Block::Until(Some(deadline)) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(Empty::Nothing);
                    }
                    // Wake up now and then to notice `abort()`.
                    Some(left.min(Duration::from_millis(100)))
                }
                Block::Until(None) | Block::No | Block::For(_) => Some(Duration::from_millis(100)),
            };
            // Register and read the futex word under the lock, having looked once more: a
            // push after this sees the waiter (it reads `waiters` under the lock) and bumps
            // `seq`, so the wait below cannot miss it.
            let seq = {
                let _g = self.lock(marks);
                let got = self.take(max, out, marks);
                if got > 0 {
                    return Ok(got);
                }
                self.waiters.fetch_add(1, Ordering::AcqRel);
                self.seq.load(Ordering::Acquire)
            };
            let slept = std::time::Instant::now();
            self.plat.wait(self.seq, seq, timeout);
            self.waiters.fetch_sub(1, Ordering::AcqRel);
            if limit > 0 {
                // A short sleep: a longer spin would have found the events without it.
                self.plat.spun(slept.elapsed() < Duration::from_micros(200));
            }
        }
    }

    /// Takes up to `max` queued events; the lock must be held.
    fn take<M: Marks + ?Sized>(&self, max: usize, out: &mut Vec<u32>, marks: &M) -> usize {
        // SAFETY: the caller holds the lock; `ring` points to this queue's ring state.
        let r = unsafe { &mut *self.ring };
        let mut got = 0usize;
        for (head, tail, slots) in [(&mut r.high_head, r.high_tail, self.high), (&mut r.low_head, r.low_tail, self.low)]
        {
            let n = ((tail - *head) as usize).min(max - got);
            if n == 0 {
                continue;
            }
            let start = out.len();
            out.reserve(n);
            let mut slot = self.slot(*head);
            for _ in 0..n {
                // SAFETY: `slot` is below `cap` (see `next`); the lock is held.
                out.push(unsafe { *slots.add(slot) });
                slot = self.next(slot);
            }
            // Mark first, then advance: see the module docs.
            for &idx in &out[start..] {
                marks.taken(idx);
            }
            *head += n as u64;
            got += n;
            if got == max {
                break;
            }
        }
        if got > 0 {
            self.count.fetch_sub(got as u32, Ordering::Release);
        }
        got
    }

    /// Calls `f` on every queued event, under the lock (monitoring, census).
    pub(crate) fn for_each<M: Marks + ?Sized>(&self, marks: &M, mut f: impl FnMut(u32)) {
        let _g = self.lock(marks);
        // SAFETY: the lock is held; `ring` points to this queue's ring state.
        let r = unsafe { &*self.ring };
        for (head, tail, slots) in [(r.high_head, r.high_tail, self.high), (r.low_head, r.low_tail, self.low)] {
            for c in head..tail {
                // SAFETY: modulo `cap`, under the lock.
                f(unsafe { *slots.add((c % self.cap) as usize) });
            }
        }
    }

    /// Wakes every sleeper (they re-check their abort condition).
    pub(crate) fn wake_all(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        self.plat.wake(self.seq);
    }
}

struct LockGuard<'q, 'a, P: Platform> {
    q: &'q Queue<'a, P>,
}

impl<P: Platform> Drop for LockGuard<'_, '_, P> {
    fn drop(&mut self) {
        self.q.plat.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicU32};

    /// A queue on the heap with a std lock, for sequential tests.
    struct Heap {
        ring: Box<Ring>,
        high: Vec<u32>,
        low: Vec<u32>,
        words: [AtomicU32; 3],
        lock: AtomicBool,
    }

    struct HeapPlat<'a>(&'a AtomicBool);
    impl Platform for HeapPlat<'_> {
        type W = AtomicU32;
        fn lock(&self) -> bool {
            while self.0.swap(true, Ordering::Acquire) {
                std::hint::spin_loop();
            }
            false
        }
        fn consistent(&self) {}
        fn unlock(&self) {
            self.0.store(false, Ordering::Release);
        }
        fn wait(&self, _: &AtomicU32, _: u32, _: Option<Duration>) {
            std::thread::yield_now();
        }
        fn wake(&self, _: &AtomicU32) {}
    }

    fn heap(cap: usize) -> Heap {
        Heap {
            ring: Box::default(),
            high: vec![0; cap],
            low: vec![0; cap],
            words: [AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)],
            lock: AtomicBool::new(false),
        }
    }

    fn queue(h: &mut Heap) -> Queue<'_, HeapPlat<'_>> {
        Queue {
            plat: HeapPlat(&h.lock),
            ring: &mut *h.ring,
            high: h.high.as_mut_ptr(),
            low: h.low.as_mut_ptr(),
            cap: h.high.len() as u64,
            count: &h.words[0],
            seq: &h.words[1],
            waiters: &h.words[2],
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// Against a model: two deques, high popped first, FIFO within a priority; events given
        /// back to the front come out first again, in their order.
        #[test]
        fn behaves_like_two_fifo_deques(
            cap in 1usize..100,
            ops in proptest::collection::vec((0u8..3, any::<bool>(), 1usize..20), 0..200),
        ) {
            // Any ring size, not only powers of two (a pool's 3000 events are not one).
            let mut h = heap(cap);
            let q = queue(&mut h);
            let (mut mh, mut ml) = (VecDeque::new(), VecDeque::new());
            let mut next = 0u32;
            for (op, high, n) in ops {
                if op == 2 {
                    // Take n, keep the first half, give the rest back to the front.
                    let mut out = Vec::new();
                    let got = q.pop(n, &mut out, Block::No, &NoMarks, &|| false).unwrap_or(0);
                    let back = out.split_off(got / 2);
                    for _ in 0..out.len() {
                        if mh.pop_front().is_none() { ml.pop_front(); }
                    }
                    let (bh, bl): (Vec<u32>, Vec<u32>) = back.iter().partition(|x| mh.contains(*x));
                    prop_assert!(q.push_front(&bl, false, &NoMarks));
                    prop_assert!(q.push_front(&bh, true, &NoMarks));
                    // In the model they never left: the pops that follow find them first.
                } else if op == 0 {
                    let items: Vec<u32> = (next..next + n as u32).collect();
                    let fits = (if high { mh.len() } else { ml.len() }) + n <= cap;
                    prop_assert_eq!(q.push(&items, high, &NoMarks), fits);
                    if fits {
                        next += n as u32;
                        if high { mh.extend(items) } else { ml.extend(items) }
                    }
                } else {
                    let mut out = Vec::new();
                    let got = q.pop(n, &mut out, Block::No, &NoMarks, &|| false).unwrap_or(0);
                    let mut expected = Vec::new();
                    while expected.len() < n {
                        if let Some(x) = mh.pop_front() { expected.push(x) } else if let Some(x) = ml.pop_front() { expected.push(x) } else { break }
                    }
                    prop_assert_eq!(got, expected.len());
                    prop_assert_eq!(out, expected);
                }
                prop_assert_eq!(q.count.load(Ordering::Relaxed) as usize, mh.len() + ml.len());
            }
        }
    }

    #[test]
    fn a_timed_pop_returns_empty_when_nothing_comes() {
        let mut h = heap(8);
        let q = queue(&mut h);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_millis(30);
        assert_eq!(q.pop(4, &mut out, Block::Until(Some(deadline)), &NoMarks, &|| false), Err(Empty::Nothing));
        assert_eq!(q.pop(4, &mut out, Block::Until(None), &NoMarks, &|| true), Err(Empty::Aborted));
    }
}

/// Model checks of the push / pop / wake protocol with loom: no event is lost or delivered
/// twice, and a sleeping popper is always woken (a lost wake-up is a deadlock loom reports).
#[cfg(test)]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicU32;
    use loom::sync::{Arc, Condvar, Mutex};

    impl Word for AtomicU32 {
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
    }

    /// The shared state of a modelled queue.
    struct Shared {
        /// A blocking lock (a spin lock would make loom explore without end).
        lock: Mutex<bool>,
        lock_cv: Condvar,
        ring: std::cell::UnsafeCell<Ring>,
        slots: std::cell::UnsafeCell<[u32; 16]>,
        low: std::cell::UnsafeCell<[u32; 16]>,
        count: AtomicU32,
        seq: AtomicU32,
        waiters: AtomicU32,
        /// A futex: sleepers check the word under this mutex, wakers notify under it.
        futex: Mutex<()>,
        cv: Condvar,
    }
    // SAFETY: the UnsafeCells are only touched with `lock` held (the queue protocol).
    unsafe impl Sync for Shared {}

    struct LoomPlat<'a>(&'a Shared);
    impl Platform for LoomPlat<'_> {
        type W = AtomicU32;
        fn lock(&self) -> bool {
            let mut held = self.0.lock.lock().unwrap();
            while *held {
                held = self.0.lock_cv.wait(held).unwrap();
            }
            *held = true;
            false
        }
        fn consistent(&self) {}
        fn unlock(&self) {
            *self.0.lock.lock().unwrap() = false;
            self.0.lock_cv.notify_one();
        }
        fn wait(&self, word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
            // No timeout: a wake-up the protocol forgets must show up as a deadlock.
            let g = self.0.futex.lock().unwrap();
            if word.load(Ordering::Acquire) == expected {
                drop(self.0.cv.wait(g).unwrap());
            }
        }
        fn wake(&self, _: &AtomicU32) {
            let _g = self.0.futex.lock().unwrap();
            self.0.cv.notify_all();
        }
    }

    fn with_queue<R>(s: &Shared, f: impl FnOnce(&Queue<'_, LoomPlat<'_>>) -> R) -> R {
        let q = Queue {
            plat: LoomPlat(s),
            ring: s.ring.get(),
            high: s.slots.get().cast(),
            low: s.low.get().cast(),
            cap: 16,
            count: &s.count,
            seq: &s.seq,
            waiters: &s.waiters,
        };
        f(&q)
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared {
            lock: Mutex::new(false),
            lock_cv: Condvar::new(),
            ring: std::cell::UnsafeCell::new(Ring::default()),
            slots: std::cell::UnsafeCell::new([0; 16]),
            low: std::cell::UnsafeCell::new([0; 16]),
            count: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            futex: Mutex::new(()),
            cv: Condvar::new(),
        })
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    #[test]
    fn a_sleeping_consumer_gets_every_event_from_two_producers() {
        model(|| {
            let s = shared();
            let producers: Vec<_> = [[1u32, 2], [3, 4]]
                .into_iter()
                .map(|items| {
                    let s = s.clone();
                    loom::thread::spawn(move || with_queue(&s, |q| assert!(q.push(&items, false, &NoMarks))))
                })
                .collect();
            let mut got = Vec::new();
            with_queue(&s, |q| {
                while got.len() < 4 {
                    let _ = q.pop(4, &mut got, Block::Until(None), &NoMarks, &|| false);
                }
            });
            for p in producers {
                p.join().unwrap();
            }
            got.sort();
            assert_eq!(got, [1, 2, 3, 4]);
            assert_eq!(s.count.load(Ordering::Relaxed), 0);
            assert_eq!(s.waiters.load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    fn two_sleeping_consumers_share_the_events_without_duplicates() {
        model(|| {
            let s = shared();
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let s = s.clone();
                    loom::thread::spawn(move || {
                        let mut got = Vec::new();
                        with_queue(&s, |q| {
                            let _ = q.pop(1, &mut got, Block::Until(None), &NoMarks, &|| false);
                        });
                        got
                    })
                })
                .collect();
            with_queue(&s, |q| assert!(q.push(&[7, 8], true, &NoMarks)));
            let mut all: Vec<u32> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
            all.sort();
            assert_eq!(all, [7, 8]);
        });
    }
}
