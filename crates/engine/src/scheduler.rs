//! The scheduler: runs its tasks' polls round-robin on one thread and the action of each task
//! whose poll succeeded (the paper's generic I/O module scheduler).
//!
//! The busy path makes no system call: a cycle is one `poll` per task, an `action` for each that
//! is ready, a relaxed load of the stop flag and plain counter updates. When a whole cycle found
//! nothing to do, the [`IdleStrategy`] decides what waiting costs: spin (with the CPU's pause
//! hint), then yield the core, then park the thread with a growing timeout. A [`Waker`] lets a
//! producer on another thread end a park at once. Tasks that read sockets name them
//! ([`Task::wait_fds`]): the park is then a `ppoll` on those sockets (and on an eventfd the
//! [`Waker`] writes), so data arriving ends it at once instead of after the timeout.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::error::SchedulerError;
use crate::profile::{self, Probe, ThreadStamps};
use crate::readiness;
use crate::task::{Module, Single, Task};
use daqflow_wire::affinity::{CpuSet, CpuSetError};

/// What an idle cycle (no poll succeeded) costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleStrategy {
    /// Idle cycles that only spin (pause instruction): the lowest latency, one core busy.
    pub spins: u32,
    /// Further idle cycles that yield the core to other threads.
    pub yields: u32,
    /// First park timeout after the spins and yields; doubled on each further idle park.
    pub park_min: Duration,
    /// Longest park: bounds the latency of a task whose producer cannot wake this thread.
    pub park_max: Duration,
}

impl IdleStrategy {
    /// Never sleeps: for a pinned scheduler on a core of its own, lowest latency.
    pub const BUSY: IdleStrategy =
        IdleStrategy { spins: u32::MAX, yields: 0, park_min: Duration::ZERO, park_max: Duration::ZERO };

    /// Sleeps soon: for a scheduler sharing cores with others (a test beam laptop, CI).
    pub const LAZY: IdleStrategy = IdleStrategy {
        spins: 100,
        yields: 10,
        park_min: Duration::from_micros(50),
        park_max: Duration::from_millis(10),
    };
}

impl Default for IdleStrategy {
    /// Spin 10 000 idle cycles (tens of microseconds), yield 100, then park from 10 µs up to 1 ms.
    fn default() -> Self {
        IdleStrategy {
            spins: 10_000,
            yields: 100,
            park_min: Duration::from_micros(10),
            park_max: Duration::from_millis(1),
        }
    }
}

/// Counters of one task. Written only by the scheduler's thread, read by anyone.
#[derive(Debug, Default)]
struct TaskCounters {
    polls: AtomicU64,
    successes: AtomicU64,
    actions: AtomicU64,
}

/// A task's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskStats {
    /// The task's name.
    pub name: String,
    /// Times its poll ran.
    pub polls: u64,
    /// Polls that said the action had work.
    pub successes: u64,
    /// Actions completed.
    pub actions: u64,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    parked: AtomicBool,
    thread: OnceLock<Thread>,
    /// An eventfd that ends a park in `ppoll` (set by the scheduler's thread before its first
    /// park, so that a waker that sees `parked` also sees it).
    wake_fd: OnceLock<OwnedFd>,
    cycles: AtomicU64,
    idle_cycles: AtomicU64,
    parks: AtomicU64,
}

impl Shared {
    /// Ends a park: the thread's and a `ppoll`'s.
    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
        if let Some(fd) = self.wake_fd.get() {
            let one: u64 = 1;
            // SAFETY: writes the 8 bytes of `one`, which lives across the call, to an eventfd
            // this `Shared` owns (open until it is dropped). A full counter (EAGAIN) is fine: the
            // fd is readable then anyway.
            let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }
}

/// A non-blocking eventfd, or `None` if the kernel refuses one (parks then sleep out their
/// timeout as without sockets).
fn eventfd() -> Option<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits until one of `fds` or `wake` is readable, or `timeout`; drains `wake`.
fn wait_readable(pfds: &mut Vec<libc::pollfd>, wake: RawFd, fds: &[RawFd], timeout: Duration) {
    pfds.clear();
    pfds.push(libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 });
    pfds.extend(fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfds` holds `pfds.len()` initialised pollfd structs and `ts` a valid timespec,
    // both alive across the call; a null signal mask leaves the thread's mask unchanged. An
    // error (EINTR) only ends the wait early: the scheduler looks at its tasks again.
    let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    if n > 0 && pfds[0].revents & libc::POLLIN != 0 {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`, which lives across the call.
        let _ = unsafe { libc::read(wake, (&raw mut count).cast(), 8) };
    }
}

/// Asks the kernel, without waiting, which of `fds` are readable (closed, in error): their
/// `revents` in `pfds`. An error (EINTR) leaves every `revents` 0: nothing learnt, the next
/// check or park asks again.
fn check_readable(pfds: &mut Vec<libc::pollfd>, fds: &[RawFd]) {
    pfds.clear();
    pfds.extend(fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
    if pfds.is_empty() {
        return;
    }
    // SAFETY: `pfds` holds `pfds.len()` initialised pollfd structs, alive across the call; a
    // zero timeout only asks.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 0) };
    if n < 0 {
        for p in pfds.iter_mut() {
            p.revents = 0;
        }
    }
}

/// One writer per counter: a plain add, no locked instruction on the hot path.
#[inline(always)]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// Stops a scheduler: cloneable, usable from any thread or from one of its own tasks.
#[derive(Debug, Clone)]
pub struct StopHandle(Arc<Shared>);

impl StopHandle {
    /// Asks the scheduler to stop after the current cycle (waking it if parked).
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        self.0.wake();
    }
    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        self.0.stop.load(Ordering::Relaxed)
    }
}

/// Ends a scheduler's park at once: give one to a producer on another thread and call
/// [`Waker::wake`] after pushing into a FIFO the scheduler's tasks poll. Costs one load when the
/// scheduler is not parked.
#[derive(Debug, Clone)]
pub struct Waker(Arc<Shared>);

impl Waker {
    /// Wakes the scheduler if it is parked.
    #[inline]
    pub fn wake(&self) {
        if self.0.parked.load(Ordering::SeqCst) {
            self.0.wake();
        }
    }
}

/// Live counters of a scheduler and its tasks.
#[derive(Debug, Clone)]
pub struct Counters {
    shared: Arc<Shared>,
    names: Arc<[String]>,
    tasks: Arc<[TaskCounters]>,
}

impl Counters {
    /// Each task's counters now.
    pub fn tasks(&self) -> Vec<TaskStats> {
        self.names
            .iter()
            .zip(self.tasks.iter())
            .map(|(name, c)| TaskStats {
                name: name.clone(),
                polls: c.polls.load(Ordering::Relaxed),
                successes: c.successes.load(Ordering::Relaxed),
                actions: c.actions.load(Ordering::Relaxed),
            })
            .collect()
    }
    /// Cycles run (one poll of every task each).
    pub fn cycles(&self) -> u64 {
        self.shared.cycles.load(Ordering::Relaxed)
    }
    /// Cycles in which no poll succeeded.
    pub fn idle_cycles(&self) -> u64 {
        self.shared.idle_cycles.load(Ordering::Relaxed)
    }
    /// Times the thread parked.
    pub fn parks(&self) -> u64 {
        self.shared.parks.load(Ordering::Relaxed)
    }
}

/// What a scheduler did, when it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The scheduler's name.
    pub name: String,
    /// Cycles run.
    pub cycles: u64,
    /// Cycles in which no poll succeeded.
    pub idle_cycles: u64,
    /// Times the thread parked.
    pub parks: u64,
    /// Each task's counters.
    pub tasks: Vec<TaskStats>,
    /// The time stamps, if profiling was on.
    pub stamps: Option<ThreadStamps>,
}

/// A set of tasks run round-robin on one thread.
///
/// ```
/// use daqflow_engine::{task, Scheduler};
///
/// let mut s = Scheduler::new("example");
/// let stop = s.stop_handle();
/// s.add(task::from_fn("work", 0u64, |_| true, move |done| {
///     *done += 1;
///     if *done == 1000 {
///         stop.stop();
///     }
///     Ok(())
/// }));
/// let report = s.spawn().unwrap().join().unwrap();
/// assert_eq!(report.tasks[0].actions, 1000);
/// ```
pub struct Scheduler {
    name: String,
    modules: Vec<Box<dyn Module>>,
    /// (module, task of the module), in polling order.
    tasks: Vec<(usize, usize)>,
    names: Vec<String>,
    idle: IdleStrategy,
    cpus: Option<Result<CpuSet, CpuSetError>>,
    profile: Option<usize>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.name)
            .field("tasks", &self.names)
            .field("idle", &self.idle)
            .field("cpus", &self.cpus)
            .field("profile", &self.profile)
            .finish()
    }
}

impl Scheduler {
    /// An empty scheduler with the default idle strategy, not pinned, not profiling.
    pub fn new(name: impl Into<String>) -> Scheduler {
        Scheduler {
            name: name.into(),
            modules: Vec::new(),
            tasks: Vec::new(),
            names: Vec::new(),
            idle: IdleStrategy::default(),
            cpus: None,
            profile: None,
            shared: Arc::default(),
        }
    }

    /// Sets the idle strategy.
    pub fn with_idle(mut self, idle: IdleStrategy) -> Scheduler {
        self.idle = idle;
        self
    }

    /// Pins the scheduler's thread to `core` when it starts.
    pub fn pinned_to(mut self, core: usize) -> Scheduler {
        self.cpus = Some(CpuSet::single(core));
        self
    }

    /// Pins the scheduler's thread to `cpus` when it starts (a thread role's `*_cpus` key);
    /// `None`: not pinned (it runs where the process may).
    pub fn pinned_to_cpus(mut self, cpus: Option<CpuSet>) -> Scheduler {
        self.cpus = cpus.map(Ok);
        self
    }

    /// Records every task's poll and action entry and exit into a ring of `capacity` stamps
    /// (the latest are kept); the stamps come back in [`Report::stamps`].
    pub fn with_profiling(mut self, capacity: usize) -> Scheduler {
        self.profile = Some(capacity);
        self
    }

    /// Adds a task; tasks are polled in the order they were added.
    pub fn add(&mut self, task: impl Task + 'static) -> &mut Scheduler {
        self.add_module(Single(task))
    }

    /// Adds every task of a module, in the module's order.
    pub fn add_module(&mut self, module: impl Module + 'static) -> &mut Scheduler {
        let m = self.modules.len();
        for t in 0..module.tasks() {
            self.tasks.push((m, t));
            self.names.push(module.task_name(t));
        }
        self.modules.push(Box::new(module));
        self
    }

    /// The scheduler's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle that stops the scheduler.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.shared.clone())
    }

    /// A handle that ends the scheduler's park.
    pub fn waker(&self) -> Waker {
        Waker(self.shared.clone())
    }

    /// Runs on a new thread named after the scheduler.
    pub fn spawn(self) -> Result<Running, SchedulerError> {
        let (stop, waker) = (self.stop_handle(), self.waker());
        let name = self.name.clone();
        let (counters, tasks) = self.counters();
        let counters_for_thread = counters.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || self.run_with(counters_for_thread, tasks))
            .map_err(|source| SchedulerError::Thread { scheduler: name.clone(), source })?;
        Ok(Running { name, thread, stop, waker, counters })
    }

    /// Runs on the calling thread until stopped or a task fails.
    pub fn run(self) -> Result<Report, SchedulerError> {
        let (counters, tasks) = self.counters();
        self.run_with(counters, tasks)
    }

    fn counters(&self) -> (Counters, Arc<[TaskCounters]>) {
        let tasks: Arc<[TaskCounters]> = self.tasks.iter().map(|_| TaskCounters::default()).collect();
        let names: Arc<[String]> = self.names.iter().cloned().collect();
        (Counters { shared: self.shared.clone(), names, tasks: tasks.clone() }, tasks)
    }

    fn run_with(mut self, counters: Counters, tasks: Arc<[TaskCounters]>) -> Result<Report, SchedulerError> {
        let _ = self.shared.thread.set(std::thread::current());
        if let Some(cpus) = self.cpus.take() {
            let pin = |name: &str, cpus: String, reason: String| SchedulerError::Pin {
                scheduler: name.to_owned(),
                cpus,
                reason,
            };
            match cpus {
                Ok(cpus) => daqflow_wire::affinity::pin_current_thread(&cpus)
                    .map_err(|e| pin(&self.name, cpus.to_string(), e.to_string()))?,
                Err(e) => return Err(pin(&self.name, "?".into(), e.to_string())),
            }
        }
        let result = match self.profile {
            Some(capacity) => {
                let probes: Vec<(u32, u32, u32, u32)> = self
                    .names
                    .iter()
                    .map(|t| {
                        let (pe, px) = Probe::new(&format!("{}/{t}.poll", self.name)).ids();
                        let (ae, ax) = Probe::new(&format!("{}/{t}.action", self.name)).ids();
                        (pe, px, ae, ax)
                    })
                    .collect();
                profile::start_recording(capacity);
                readiness::forget_all();
                let r = self.cycle_loop::<true>(&tasks, &probes);
                (r, profile::stop_recording())
            }
            None => {
                readiness::forget_all();
                (self.cycle_loop::<false>(&tasks, &[]), None)
            }
        };
        // What the loop learnt is of no use to whatever this thread does next.
        readiness::forget_all();
        let (result, stamps) = result;
        result?;
        Ok(Report {
            name: self.name.clone(),
            cycles: counters.cycles(),
            idle_cycles: counters.idle_cycles(),
            parks: counters.parks(),
            tasks: counters.tasks(),
            stamps,
        })
    }

    /// The hot loop. `PROFILE` is a compile-time switch: without it no stamp code is generated.
    fn cycle_loop<const PROFILE: bool>(
        &mut self,
        counters: &[TaskCounters],
        probes: &[(u32, u32, u32, u32)],
    ) -> Result<(), SchedulerError> {
        let shared = &*self.shared;
        let idle = self.idle;
        let mut idle_cycles: u64 = 0;
        let mut park = idle.park_min;
        let yield_after = u64::from(idle.spins);
        let park_after = yield_after + u64::from(idle.yields);
        // Before the first park can be announced: a waker that sees `parked` sees the eventfd.
        let wake_fd = if idle.park_max > Duration::ZERO {
            eventfd().map(|fd| shared.wake_fd.get_or_init(|| fd).as_raw_fd())
        } else {
            None
        };
        let mut fds: Vec<RawFd> = Vec::new();
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        while !shared.stop.load(Ordering::Relaxed) {
            let wants_park = idle_cycles >= park_after;
            if wants_park {
                // Announce the park before the last look at the tasks: a producer that pushed
                // after that look sees `parked` and unparks us (SeqCst on both sides).
                shared.parked.store(true, Ordering::SeqCst);
            }
            let mut any = false;
            for (i, &(m, t)) in self.tasks.iter().enumerate() {
                let module = &mut self.modules[m];
                let c = &counters[i];
                if PROFILE {
                    profile::record(probes[i].0);
                }
                let ready = module.poll(t);
                if PROFILE {
                    profile::record(probes[i].1);
                }
                bump(&c.polls);
                if ready {
                    bump(&c.successes);
                    if PROFILE {
                        profile::record(probes[i].2);
                    }
                    let result = module.action(t);
                    if PROFILE {
                        profile::record(probes[i].3);
                    }
                    if let Err(source) = result {
                        shared.parked.store(false, Ordering::Relaxed);
                        return Err(SchedulerError::Task {
                            scheduler: self.name.clone(),
                            task: self.names[i].clone(),
                            source,
                        });
                    }
                    bump(&c.actions);
                    any = true;
                }
            }
            bump(&shared.cycles);
            if any {
                if wants_park {
                    shared.parked.store(false, Ordering::Relaxed);
                }
                // Busy: every socket is worth reading again.
                readiness::forget_all();
                idle_cycles = 0;
                park = idle.park_min;
                continue;
            }
            bump(&shared.idle_cycles);
            if wants_park {
                bump(&shared.parks);
                fds.clear();
                for m in &self.modules {
                    m.wait_fds(&mut fds);
                }
                match wake_fd {
                    Some(wake) if !fds.is_empty() => {
                        wait_readable(&mut pfds, wake, &fds, park);
                        readiness::learn(&pfds[1..]);
                    }
                    _ => {
                        std::thread::park_timeout(park);
                        readiness::forget_all();
                    }
                }
                shared.parked.store(false, Ordering::Relaxed);
                park = (park * 2).min(idle.park_max).max(idle.park_min);
            } else if (idle_cycles + 1).is_multiple_of(readiness::RECHECK_EVERY) && readiness::any_empty() {
                // Idle: one look at every socket the tasks read instead of a read of each.
                fds.clear();
                for m in &self.modules {
                    m.wait_fds(&mut fds);
                }
                check_readable(&mut pfds, &fds);
                readiness::learn(&pfds);
            } else if idle_cycles >= yield_after {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            idle_cycles = idle_cycles.saturating_add(1);
        }
        Ok(())
    }
}

/// A scheduler running on its own thread.
#[derive(Debug)]
pub struct Running {
    name: String,
    thread: JoinHandle<Result<Report, SchedulerError>>,
    stop: StopHandle,
    waker: Waker,
    counters: Counters,
}

impl Running {
    /// The scheduler's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// A handle that stops it.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }
    /// A handle that wakes it.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }
    /// Its live counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Whether its thread has ended (stopped, failed or panicked).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
    /// Waits for it to stop (by a stop handle or a failing task).
    pub fn join(self) -> Result<Report, SchedulerError> {
        let name = self.name;
        self.thread.join().unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(SchedulerError::Panicked { scheduler: name, message })
        })
    }
    /// Stops it and waits.
    pub fn stop(self) -> Result<Report, SchedulerError> {
        self.stop.stop();
        self.join()
    }
}
