//! Time-stamp profiling (ATLAS DAQ-Unit paper, sections 4.2–4.8).
//!
//! A time stamp is one read of the CPU's time-stamp counter (`rdtsc` on x86-64; a monotonic
//! nanosecond clock elsewhere) stored with a probe id into a ring buffer that belongs to the
//! recording thread: no lock, no system call, no allocation. A thread records only between
//! [`start_recording`] and [`stop_recording`]; everywhere else [`Probe::enter`] and
//! [`Probe::exit`] cost one relaxed load of a global counter and a branch, and a scheduler
//! without profiling runs a loop compiled without any stamp at all.
//!
//! [`calibrate`] measures what a stamp costs (the distribution of the paper's figure 2) and how
//! many ticks make a nanosecond; a [`ProfileDump`] (calibration, probe names, each thread's stamps)
//! is written to a file that `daqflow profile` turns into histograms and sequence diagrams.
//!
//! ```
//! use daqflow_engine::profile::{self, Probe};
//! let work = Probe::new("doc-example.work");
//! profile::start_recording(1024);
//! work.enter();
//! let x: u64 = (0..100u64).sum();
//! work.exit();
//! let stamps = profile::stop_recording().unwrap();
//! assert_eq!(stamps.stamps.len(), 2);
//! assert!(stamps.stamps[1].tsc >= stamps.stamps[0].tsc);
//! # assert_eq!(x, 4950);
//! ```

use std::cell::UnsafeCell;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::ProfileError;

/// One time stamp: the counter's value and the probe event (probe index × 2, + 1 for an exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Ticks of the time-stamp counter.
    pub tsc: u64,
    /// `probe << 1 | exit`.
    pub id: u32,
}

impl Stamp {
    /// The probe's index in [`probe_names`].
    pub fn probe(&self) -> u32 {
        self.id >> 1
    }
    /// Whether this stamp marks an exit (else an entry).
    pub fn is_exit(&self) -> bool {
        self.id & 1 == 1
    }
}

/// Reads the time-stamp counter.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions on x86-64 (it reads a counter register).
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Threads recording now: the off path of [`Probe::enter`] is one load of this.
static RECORDING: AtomicUsize = AtomicUsize::new(0);

struct Ring {
    /// A power of two long.
    buf: Vec<Stamp>,
    /// Stamps written so far; the slot is `next & mask`.
    next: u64,
    mask: u64,
}

thread_local! {
    static RING: UnsafeCell<Option<Ring>> = const { UnsafeCell::new(None) };
}

/// Records a stamp if this thread is recording. Used by the scheduler's profiled loop.
#[inline(always)]
pub(crate) fn record(id: u32) {
    let tsc = ticks();
    RING.with(|r| {
        // SAFETY: the ring is this thread's own; `record`, `start_recording` and
        // `stop_recording` are the only code touching it and none calls another while holding
        // the reference, so the reference is unique.
        if let Some(ring) = unsafe { &mut *r.get() } {
            let slot = (ring.next & ring.mask) as usize;
            // SAFETY: `slot <= mask < buf.len()` (the length is `mask + 1`).
            unsafe { *ring.buf.get_unchecked_mut(slot) = Stamp { tsc, id } };
            ring.next += 1;
        }
    })
}

/// Starts recording on this thread into a ring of `capacity` stamps (rounded up to a power of
/// two, at least 2), keeping the most recent ones when it wraps. Restarting discards what was
/// recorded.
pub fn start_recording(capacity: usize) {
    let capacity = capacity.max(2).next_power_of_two();
    RING.with(|r| {
        // SAFETY: see `record`.
        let slot = unsafe { &mut *r.get() };
        if slot.is_none() {
            RECORDING.fetch_add(1, Ordering::Relaxed);
        }
        *slot = Some(Ring { buf: vec![Stamp { tsc: 0, id: 0 }; capacity], next: 0, mask: capacity as u64 - 1 });
    })
}

/// Stops recording on this thread and hands over the stamps in time order; `None` if it was
/// not recording.
pub fn stop_recording() -> Option<ThreadStamps> {
    let ring = RING.with(|r| {
        // SAFETY: see `record`.
        unsafe { &mut *r.get() }.take()
    })?;
    RECORDING.fetch_sub(1, Ordering::Relaxed);
    let cap = ring.buf.len() as u64;
    let (lost, stamps) = if ring.next <= cap {
        (0, ring.buf[..ring.next as usize].to_vec())
    } else {
        let start = (ring.next & ring.mask) as usize;
        let mut v = ring.buf[start..].to_vec();
        v.extend_from_slice(&ring.buf[..start]);
        (ring.next - cap, v)
    };
    let name = std::thread::current().name().unwrap_or("unnamed").to_owned();
    Some(ThreadStamps { thread: name, lost, stamps })
}

/// Whether this thread is recording.
pub fn is_recording() -> bool {
    RING.with(|r| {
        // SAFETY: see `record`.
        unsafe { &*r.get() }.is_some()
    })
}

static PROBES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A named place in the code whose entry and exit are time-stamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Probe(u32);

impl Probe {
    /// The probe named `name`, registered on first use (the same name gives the same probe).
    pub fn new(name: &str) -> Probe {
        let mut names = PROBES.lock().unwrap_or_else(|e| e.into_inner());
        let index = match names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                names.push(name.to_owned());
                names.len() - 1
            }
        };
        Probe(index as u32)
    }

    /// The probe's index in [`probe_names`].
    pub fn index(&self) -> u32 {
        self.0
    }

    /// Stamps the entry, if this thread is recording.
    #[inline(always)]
    pub fn enter(&self) {
        if RECORDING.load(Ordering::Relaxed) != 0 {
            record(self.0 << 1);
        }
    }

    /// Stamps the exit, if this thread is recording.
    #[inline(always)]
    pub fn exit(&self) {
        if RECORDING.load(Ordering::Relaxed) != 0 {
            record(self.0 << 1 | 1);
        }
    }

    /// Stamp ids of entry and exit, for the scheduler's unconditional stamps.
    pub(crate) fn ids(&self) -> (u32, u32) {
        (self.0 << 1, self.0 << 1 | 1)
    }
}

/// The names of every probe registered in this process, by index.
pub fn probe_names() -> Vec<String> {
    PROBES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The stamps one thread recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadStamps {
    /// The thread's name (a scheduler's thread carries the scheduler's name).
    pub thread: String,
    /// Older stamps overwritten because the ring wrapped.
    pub lost: u64,
    /// The stamps, oldest first.
    pub stamps: Vec<Stamp>,
}

/// What a time stamp costs and how fast the counter runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Counter ticks per nanosecond.
    pub ticks_per_ns: f64,
    /// Ticks between back-to-back stamps, one per pair (the paper's figure 2), in measurement
    /// order.
    pub overhead_ticks: Vec<u32>,
}

impl Calibration {
    /// Converts ticks to nanoseconds.
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 / self.ticks_per_ns
    }

    /// The median cost of one stamp in nanoseconds: the correction the paper subtracts from
    /// short intervals.
    pub fn overhead_ns(&self) -> f64 {
        let mut v = self.overhead_ticks.clone();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_unstable();
        v[v.len() / 2] as f64 / self.ticks_per_ns
    }
}

/// Measures the counter's rate against the system clock over `window` and the cost of `pairs`
/// back-to-back stamps. Records on the calling thread while it runs (and restores nothing: call
/// it on a thread that is not recording).
pub fn calibrate(window: Duration, pairs: usize) -> Calibration {
    let (t0, c0) = (Instant::now(), ticks());
    while t0.elapsed() < window {
        std::hint::spin_loop();
    }
    let (t1, c1) = (Instant::now(), ticks());
    let ns = (t1 - t0).as_nanos().max(1) as f64;
    let ticks_per_ns = (c1.wrapping_sub(c0) as f64 / ns).max(1e-9);

    let probe = Probe::new("calibration");
    start_recording(pairs.max(1) + 1);
    for _ in 0..=pairs.max(1) {
        probe.enter();
    }
    let stamps = stop_recording().map(|t| t.stamps).unwrap_or_default();
    let overhead_ticks = stamps
        .windows(2)
        .take(pairs.max(1))
        .map(|w| u32::try_from(w[1].tsc.wrapping_sub(w[0].tsc)).unwrap_or(u32::MAX))
        .collect();
    Calibration { ticks_per_ns, overhead_ticks }
}

/// Everything a profiling run produced: what `daqflow profile` reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileDump {
    /// The counter's calibration on the recording machine.
    pub calibration: Calibration,
    /// Probe names by index.
    pub probes: Vec<String>,
    /// Each thread's stamps.
    pub threads: Vec<ThreadStamps>,
}

const MAGIC: &[u8; 8] = b"DQPROF\0\x01";

#[derive(Serialize, Deserialize)]
struct Header {
    calibration: Calibration,
    probes: Vec<String>,
    threads: Vec<ThreadHeader>,
}

#[derive(Serialize, Deserialize)]
struct ThreadHeader {
    name: String,
    lost: u64,
    stamps: u64,
}

impl ProfileDump {
    /// A dump of `threads` with this process's probe names.
    pub fn new(calibration: Calibration, threads: Vec<ThreadStamps>) -> ProfileDump {
        ProfileDump { calibration, probes: probe_names(), threads }
    }

    /// Writes the dump (format in `docs/engine.md`: magic, a JSON header, then 12-byte stamps).
    pub fn write(&self, path: &Path) -> Result<(), ProfileError> {
        let io = |source| ProfileError::Io { path: path.display().to_string(), source };
        let header = Header {
            calibration: self.calibration.clone(),
            probes: self.probes.clone(),
            threads: self
                .threads
                .iter()
                .map(|t| ThreadHeader { name: t.thread.clone(), lost: t.lost, stamps: t.stamps.len() as u64 })
                .collect(),
        };
        let json = serde_json::to_vec(&header).map_err(|e| io(std::io::Error::other(e)))?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(json.len() as u64).to_le_bytes()).map_err(io)?;
        out.write_all(&json).map_err(io)?;
        for t in &self.threads {
            for s in &t.stamps {
                out.write_all(&s.tsc.to_le_bytes()).map_err(io)?;
                out.write_all(&s.id.to_le_bytes()).map_err(io)?;
            }
        }
        out.flush().map_err(io)
    }

    /// Reads a dump written by [`ProfileDump::write`], checking every length.
    pub fn read(path: &Path) -> Result<ProfileDump, ProfileError> {
        let p = path.display().to_string();
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|source| ProfileError::Io { path: p.clone(), source })?;
        Self::decode(&bytes).map_err(|reason| ProfileError::Format { path: p, reason })
    }

    /// Decodes the bytes of a dump file.
    pub fn decode(bytes: &[u8]) -> Result<ProfileDump, String> {
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err("not a daqflow profile (bad magic)".into());
        }
        let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let end = 16usize.checked_add(usize::try_from(len).map_err(|_| "header length too large")?);
        let end = end.filter(|&e| e <= bytes.len()).ok_or("header cut short")?;
        let header: Header = serde_json::from_slice(&bytes[16..end]).map_err(|e| format!("bad header: {e}"))?;
        let mut rest = &bytes[end..];
        let mut threads = Vec::with_capacity(header.threads.len());
        for t in header.threads {
            let n = usize::try_from(t.stamps).map_err(|_| "stamp count too large")?;
            let need = n
                .checked_mul(12)
                .filter(|&b| b <= rest.len())
                .ok_or_else(|| format!("stamps of thread `{}` cut short", t.name))?;
            let stamps = rest[..need]
                .chunks_exact(12)
                .map(|c| Stamp {
                    tsc: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                    id: u32::from_le_bytes(c[8..].try_into().expect("4 bytes")),
                })
                .collect();
            rest = &rest[need..];
            threads.push(ThreadStamps { thread: t.name, lost: t.lost, stamps });
        }
        if !rest.is_empty() {
            return Err(format!("{} bytes after the last stamp", rest.len()));
        }
        if header.calibration.ticks_per_ns.is_nan() || header.calibration.ticks_per_ns <= 0.0 {
            return Err("calibration: ticks per ns must be positive".into());
        }
        Ok(ProfileDump { calibration: header.calibration, probes: header.probes, threads })
    }

    /// The probe's name, or `probe N` for an index the dump does not name.
    pub fn probe_name(&self, probe: u32) -> String {
        self.probes.get(probe as usize).cloned().unwrap_or_else(|| format!("probe {probe}"))
    }

    /// Durations from each entry to its exit, per probe, in ns (corrected for one stamp's
    /// overhead, never below zero). Nested probes are fine; an exit with no entry is skipped.
    pub fn intervals(&self) -> Vec<(u32, Vec<f64>)> {
        let correction = self.calibration.overhead_ns();
        let mut by_probe: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
        for t in &self.threads {
            let mut open: std::collections::HashMap<u32, u64> = Default::default();
            for s in &t.stamps {
                if s.is_exit() {
                    if let Some(start) = open.remove(&s.probe()) {
                        let ns = self.calibration.ns(s.tsc.wrapping_sub(start)) - correction;
                        by_probe.entry(s.probe()).or_default().push(ns.max(0.0));
                    }
                } else {
                    open.insert(s.probe(), s.tsc);
                }
            }
        }
        by_probe.into_iter().collect()
    }

    /// The scheduler's transitions (paper figure 3), in ns corrected for one stamp: from a
    /// task's poll exit to its action entry, and from an action's exit to the next poll entry.
    pub fn transitions(&self) -> Transitions {
        let correction = self.calibration.overhead_ns();
        let kind = |probe: u32| {
            let name = self.probes.get(probe as usize).map(String::as_str).unwrap_or("");
            if name.ends_with(".poll") {
                1
            } else if name.ends_with(".action") {
                2
            } else {
                0
            }
        };
        let mut out = Transitions::default();
        for t in &self.threads {
            for w in t.stamps.windows(2) {
                let ns = (self.calibration.ns(w[1].tsc.wrapping_sub(w[0].tsc)) - correction).max(0.0);
                match (kind(w[0].probe()), w[0].is_exit(), kind(w[1].probe()), w[1].is_exit()) {
                    (1, true, 2, false) => out.poll_to_action.push(ns),
                    (2, true, 1, false) => out.action_to_poll.push(ns),
                    _ => {}
                }
            }
        }
        out
    }
}

/// Scheduler transition times in ns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transitions {
    /// Poll exit → action entry of the same task.
    pub poll_to_action: Vec<f64>,
    /// Action exit → next poll entry.
    pub action_to_poll: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing() {
        let p = Probe::new("test.off");
        assert!(!is_recording());
        for _ in 0..1000 {
            p.enter();
            p.exit();
        }
        assert!(stop_recording().is_none());
    }

    #[test]
    fn ring_keeps_the_latest_stamps_and_counts_the_lost() {
        let p = Probe::new("test.ring");
        start_recording(4);
        for _ in 0..5 {
            p.enter();
            p.exit();
        }
        let t = stop_recording().unwrap();
        assert_eq!((t.lost, t.stamps.len()), (6, 4));
        assert!(t.stamps.windows(2).all(|w| w[0].tsc <= w[1].tsc));
        assert!(t.stamps[0].id == p.index() << 1 && t.stamps[3].is_exit());
        assert!(!is_recording());
    }

    #[test]
    fn dump_round_trips_and_rejects_damage() {
        let mut cal = calibrate(Duration::from_millis(5), 100);
        assert_eq!(cal.overhead_ticks.len(), 100);
        assert!(cal.ticks_per_ns > 0.0);
        // A calibration that JSON without exact float parsing reads back one bit off (seen on a
        // CI machine): the dump keeps it exactly.
        cal.ticks_per_ns = 2.5961298582995638;
        let a = Probe::new("test.dump.a");
        start_recording(16);
        a.enter();
        a.exit();
        let t = stop_recording().unwrap();
        let dump = ProfileDump::new(cal, vec![t]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.prof");
        dump.write(&path).unwrap();
        let back = ProfileDump::read(&path).unwrap();
        assert_eq!(back, dump);
        let iv = back.intervals();
        assert!(iv.iter().any(|(p, v)| *p == a.index() && v.len() == 1));
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 7, 15, 20, bytes.len() - 1] {
            assert!(ProfileDump::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), magic: bool) {
            if magic && bytes.len() >= 8 {
                bytes[..8].copy_from_slice(MAGIC);
            }
            let _ = ProfileDump::decode(&bytes);
        }
    }
}
