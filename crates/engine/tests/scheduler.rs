//! The scheduler and profiling, across threads. (The paper's test bed, ROBs, TRG and collector
//! together, is tested where it lives: `crates/cli/src/bench/testbed.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use daqflow_engine::profile::{self, Probe, ProfileDump};
use daqflow_engine::{EventManager, EventManagerConfig, IdleStrategy, Scheduler, SchedulerError, fifo, task};

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn every_ready_task_gets_its_turn_round_robin() {
    let mut s = Scheduler::new("fair").with_idle(IdleStrategy::LAZY);
    let stop = s.stop_handle();
    let total = Arc::new(AtomicU64::new(0));
    for i in 0..3 {
        let total = total.clone();
        let stop = stop.clone();
        s.add(task::from_fn(
            format!("t{i}"),
            (),
            |_| true,
            move |_| {
                if total.fetch_add(1, Ordering::Relaxed) + 1 == 30_000 {
                    stop.stop();
                }
                Ok(())
            },
        ));
    }
    // A task that is never ready is polled every cycle but never run.
    s.add(task::from_fn("never", (), |_| false, |_| Err("must not run".into())));
    let report = s.spawn().unwrap().join().unwrap();
    let actions: Vec<u64> = report.tasks.iter().map(|t| t.actions).collect();
    assert_eq!(actions[..3], [10_000, 10_000, 10_000], "{report:?}");
    assert_eq!(actions[3], 0);
    assert_eq!(report.tasks[3].polls, report.cycles);
    for t in &report.tasks[..3] {
        assert_eq!((t.polls, t.successes), (report.cycles, t.actions));
    }
}

#[test]
fn stop_ends_an_idle_parked_scheduler_promptly() {
    let s = Scheduler::new("idle").with_idle(IdleStrategy {
        spins: 10,
        yields: 10,
        park_min: Duration::from_secs(60),
        park_max: Duration::from_secs(60),
    });
    let mut s = s;
    s.add(task::from_fn("nothing", (), |_| false, |_| Ok(())));
    let running = s.spawn().unwrap();
    wait_until("the scheduler to park", || running.counters().parks() > 0);
    let t = Instant::now();
    let report = running.stop().unwrap();
    // Parked for 60 s, yet stopped at once: the stop handle unparks it.
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(report.parks >= 1 && report.idle_cycles == report.cycles);
}

#[test]
fn a_waker_ends_the_park_of_a_consumer_on_another_thread() {
    let (mut tx, rx) = fifo::<u64>(16);
    let got = Arc::new(AtomicU64::new(0));
    let mut s = Scheduler::new("consumer").with_idle(IdleStrategy {
        spins: 10,
        yields: 0,
        park_min: Duration::from_secs(60),
        park_max: Duration::from_secs(60),
    });
    let g = got.clone();
    s.add(task::from_fn(
        "pop",
        rx,
        |rx| !rx.is_empty(),
        move |rx| {
            g.fetch_add(rx.pop()?, Ordering::Relaxed);
            Ok(())
        },
    ));
    let waker = s.waker();
    let running = s.spawn().unwrap();
    for i in 1..=5u64 {
        wait_until("the consumer to park", || running.counters().parks() >= i);
        tx.push(i).unwrap();
        waker.wake();
        wait_until("the value to arrive", || got.load(Ordering::Relaxed) == i * (i + 1) / 2);
    }
    running.stop().unwrap();
}

/// A task reading a socket: its readability ends the park (a `ppoll` on it), no waker needed.
struct SocketReader {
    socket: std::os::unix::net::UnixStream,
    /// Read by the poll, counted by the action.
    pending: u64,
    got: Arc<AtomicU64>,
    /// With a counter: reads only while the readiness cache says the socket is worth reading,
    /// and counts its reads (its system calls).
    cached: Option<Arc<AtomicU64>>,
}

impl task::Task for SocketReader {
    fn name(&self) -> &str {
        "read"
    }
    fn poll(&mut self) -> bool {
        use daqflow_engine::readiness;
        use std::io::Read;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.socket);
        if let Some(reads) = &self.cached {
            if self.pending > 0 || !readiness::worth_reading(fd) {
                return self.pending > 0;
            }
            reads.fetch_add(1, Ordering::Relaxed);
        }
        let mut b = [0u8; 64];
        match self.socket.read(&mut b) {
            Ok(n) if n > 0 => self.pending += b[..n].iter().map(|&x| u64::from(x)).sum::<u64>(),
            _ if self.cached.is_some() => readiness::found_empty(fd),
            _ => {}
        }
        self.pending > 0
    }
    fn action(&mut self) -> Result<(), daqflow_engine::BoxError> {
        self.got.fetch_add(std::mem::take(&mut self.pending), Ordering::Relaxed);
        Ok(())
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        out.push(std::os::fd::AsRawFd::as_raw_fd(&self.socket));
    }
}

#[test]
fn data_on_a_socket_a_task_waits_on_ends_the_park() {
    use std::io::Write;
    let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
    rx.set_nonblocking(true).unwrap();
    let got = Arc::new(AtomicU64::new(0));
    // Parks of a minute: only the socket (or the stop's eventfd write) can end them in time.
    let mut s = Scheduler::new("socket").with_idle(IdleStrategy {
        spins: 10,
        yields: 0,
        park_min: Duration::from_secs(60),
        park_max: Duration::from_secs(60),
    });
    s.add(SocketReader { socket: rx, pending: 0, got: got.clone(), cached: None });
    let running = s.spawn().unwrap();
    for i in 1..=5u64 {
        wait_until("the reader to park", || running.counters().parks() >= i);
        tx.write_all(&[i as u8]).unwrap();
        wait_until("the byte to be read", || got.load(Ordering::Relaxed) == i * (i + 1) / 2);
    }
    wait_until("the reader to park again", || running.counters().parks() >= 6);
    let t = Instant::now();
    running.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(30), "the stop ends a park in ppoll too");
}

#[test]
fn a_failing_action_stops_the_scheduler_with_its_error() {
    let mut s = Scheduler::new("failing");
    s.add(task::from_fn(
        "ok",
        0u32,
        |_| true,
        |n| {
            *n += 1;
            Ok(())
        },
    ));
    s.add(task::from_fn(
        "breaks",
        0u32,
        |_| true,
        |n| {
            *n += 1;
            if *n == 3 { Err("link to RU 2 closed".into()) } else { Ok(()) }
        },
    ));
    let err = s.spawn().unwrap().join().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SchedulerError::Task { .. }), "{err:?}");
    assert!(text.contains("`breaks`") && text.contains("`failing`") && text.contains("link to RU 2 closed"), "{text}");
}

#[test]
fn a_panicking_task_is_reported_not_propagated() {
    let mut s = Scheduler::new("panicky");
    s.add(task::from_fn("boom", (), |_| true, |_| panic!("bad index")));
    let err = s.spawn().unwrap().join().unwrap_err();
    assert!(matches!(&err, SchedulerError::Panicked { message, .. } if message.contains("bad index")), "{err:?}");
}

#[test]
fn pinning_to_an_allowed_core_works_and_to_a_missing_core_fails_clearly() {
    let mut s = Scheduler::new("pinned").pinned_to(0);
    let stop = s.stop_handle();
    s.add(task::from_fn(
        "once",
        (),
        |_| true,
        move |_| {
            stop.stop();
            Ok(())
        },
    ));
    s.spawn().unwrap().join().unwrap();
    let mut s = Scheduler::new("nowhere").pinned_to(1000);
    s.add(task::from_fn("never", (), |_| false, |_| Ok(())));
    let err = s.spawn().unwrap().join().unwrap_err();
    assert!(matches!(&err, SchedulerError::Pin { cpus, .. } if cpus == "1000"), "{err:?}");
    assert!(err.to_string().contains("outside the CPUs this process may use"), "{err}");
}

#[test]
fn a_full_event_manager_stops_the_input_task_until_fragments_are_removed() {
    // Input stores fragments while the event manager has room; a slow "trigger" frees one
    // event every 10th cycle. The input must wait (its poll fails), never error, never allocate.
    let em =
        EventManager::new(EventManagerConfig { page_size: 256, pages: 8, large_bytes: Some(0), ..Default::default() })
            .unwrap();
    struct State {
        em: EventManager,
        next: u64,
        oldest: u64,
        cycle: u64,
        refused_polls: u64,
    }
    let state = State { em, next: 0, oldest: 0, cycle: 0, refused_polls: 0 };
    let mut s = Scheduler::new("backpressure").with_idle(IdleStrategy::LAZY);
    let stop = s.stop_handle();
    let m = daqflow_engine_module(state, stop);
    s.add_module(m);
    let report = s.run().unwrap();
    let input = &report.tasks[0];
    assert_eq!(input.actions, 1000);
    assert!(input.polls > input.successes, "the input must have been refused while full: {report:?}");

    fn daqflow_engine_module(state: State, stop: daqflow_engine::StopHandle) -> impl daqflow_engine::Module {
        struct M(State, daqflow_engine::StopHandle);
        impl daqflow_engine::Module for M {
            fn tasks(&self) -> usize {
                2
            }
            fn task_name(&self, t: usize) -> String {
                ["input", "trigger"][t].into()
            }
            fn poll(&mut self, t: usize) -> bool {
                let s = &mut self.0;
                if t == 0 {
                    let ok = s.next < 1000 && s.em.has_room(200);
                    if !ok && s.next < 1000 {
                        s.refused_polls += 1;
                    }
                    ok
                } else {
                    s.cycle += 1;
                    s.cycle.is_multiple_of(10) && s.oldest < s.next
                }
            }
            fn action(&mut self, t: usize) -> Result<(), daqflow_engine::BoxError> {
                let s = &mut self.0;
                if t == 0 {
                    s.em.insert(s.next, 0, &[7; 200])?;
                    s.next += 1;
                    assert!(s.em.events() <= 8);
                } else {
                    assert_eq!(s.em.remove(s.oldest), Some(1));
                    s.oldest += 1;
                    if s.oldest == 1000 {
                        assert!(s.refused_polls > 0);
                        self.1.stop();
                    }
                }
                Ok(())
            }
        }
        M(state, stop)
    }
}

/// A producer task pushing `count` numbers into a FIFO and a consumer task popping them, which
/// stops the scheduler when it has them all: a small pipeline whose every poll and action the
/// profile must show.
fn pipeline(name: &str, count: u64) -> Scheduler {
    let (tx, rx) = fifo::<u64>(64);
    let mut s = Scheduler::new(name).with_idle(IdleStrategy::LAZY);
    let stop = s.stop_handle();
    s.add(task::from_fn(
        "produce",
        (tx, 0u64),
        move |(tx, next)| *next < count && !tx.is_full(),
        |(tx, next)| {
            tx.push(*next).map_err(|_| "FIFO full")?;
            *next += 1;
            Ok(())
        },
    ));
    s.add(task::from_fn(
        "consume",
        (rx, 0u64),
        |(rx, _)| !rx.is_empty(),
        move |(rx, got)| {
            rx.pop()?;
            *got += 1;
            if *got == count {
                stop.stop();
            }
            Ok(())
        },
    ));
    s
}

#[test]
fn profiling_records_every_poll_and_action_and_off_records_nothing() {
    let off = pipeline("unprofiled", 1_010).run().unwrap();
    assert_eq!(off.tasks[1].actions, 1_010);
    assert!(off.stamps.is_none());
    assert!(!profile::is_recording(), "a scheduler without profiling leaves this thread not recording");

    let on = pipeline("profiled", 1_010).with_profiling(1 << 22).spawn().unwrap().join().unwrap();
    let t = on.stamps.clone().expect("a profiled scheduler returns its stamps");
    assert_eq!(t.lost, 0);
    assert_eq!(t.thread, "profiled");
    let polls: u64 = on.tasks.iter().map(|t| t.polls).sum();
    let actions: u64 = on.tasks.iter().map(|t| t.actions).sum();
    assert_eq!(actions, 2 * 1_010);
    assert_eq!(t.stamps.len() as u64, 2 * polls + 2 * actions);
    let dump = ProfileDump::new(profile::calibrate(Duration::from_millis(10), 1000), vec![t]);
    let tr = dump.transitions();
    assert_eq!(tr.poll_to_action.len() as u64, actions);
    let intervals = dump.intervals();
    // Probes are named scheduler/task.poll and scheduler/task.action.
    for task in ["produce", "consume"] {
        let action = Probe::new(&format!("profiled/{task}.action")).index();
        let n = intervals.iter().find(|(p, _)| *p == action).map(|(_, v)| v.len());
        assert_eq!(n, Some(1_010), "{task}");
    }
}

#[test]
fn an_idle_scheduler_reads_a_socket_found_empty_only_once_the_kernel_says_it_is_readable() {
    use std::io::Write;
    // One that never parks (its idle checks find the data) and one that parks (its ppoll does).
    for (name, idle) in [
        ("busy", IdleStrategy::BUSY),
        (
            "lazy",
            IdleStrategy { spins: 20, yields: 4, park_min: Duration::from_secs(60), park_max: Duration::from_secs(60) },
        ),
    ] {
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        let (got, reads) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut s = Scheduler::new(name).with_idle(idle);
        s.add(SocketReader { socket: rx, pending: 0, got: got.clone(), cached: Some(reads.clone()) });
        let running = s.spawn().unwrap();
        let mut sum = 0;
        for i in 1..=20u64 {
            std::thread::sleep(Duration::from_millis(2));
            tx.write_all(&[i as u8]).unwrap();
            sum += i;
            wait_until("the byte to be read", || got.load(Ordering::Relaxed) == sum);
        }
        let idle_cycles = running.counters().idle_cycles();
        let reads = reads.load(Ordering::Relaxed);
        running.stop().unwrap();
        // A read for each byte and one that finds the socket empty after it, at most: every
        // other idle cycle asked the kernel (or waited in ppoll) instead.
        assert!(reads <= 2 * 20 + 2, "{name}: {reads} reads for 20 bytes in {idle_cycles} idle cycles");
        if name == "busy" {
            assert!(idle_cycles > 100 * reads, "{name}: {reads} reads in only {idle_cycles} idle cycles");
        }
    }
}
