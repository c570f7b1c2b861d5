//! Disk throttling: [`DiskWatcher`] watches the free space of the filesystem that holds an
//! output directory and says when a writer should stop taking events (usage above the high
//! water mark) and when it may take them again (usage below the low water mark), after the CMS
//! DAQ2 builder unit, which stops asking for events when its output disk fills.
//!
//! Usage is the percentage of the filesystem a writer cannot use any more:
//! `100 × (size − available) / size`, with `available` the space an unprivileged writer may
//! still use (`statvfs`'s `f_bavail`; on a filesystem without blocks reserved for root `df`'s
//! "Use%" is the same figure rounded up). A high mark of
//! `100` never throttles (usage is never above 100 %).
//!
//! The marks hold whatever the disk's size: a reading of the filesystem is taken at most once
//! per interval, and between two readings the watcher counts the bytes the writer hands to its
//! file (buffered ones included, [`DiskWatcher::wrote`]), so that its estimate of the free
//! space is `free at the last reading − written since`. A writer asks before writing an event
//! ([`DiskWatcher::admit`], with [`DiskWatcher::record_bytes`] of it) or before asking for more
//! ([`DiskWatcher::room`], less the bytes it has in flight) whether the estimate stays at or
//! below the high mark with those bytes added; when it does not, the watcher throttles at
//! once, without waiting for the next reading, and a writer keeps the events it holds until a
//! reading shows usage below the low mark. A fresh reading replaces the estimate. A small disk
//! that frees up therefore never fills faster than the watcher looks: the writer stops at the
//! high mark, however fast it could write.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use daqflow_wire::file::{DiskMarks, DiskWatcher};
//! let dir = std::env::temp_dir();
//! let mut watcher = DiskWatcher::new(&dir, DiskMarks::default(), Duration::from_millis(100));
//! let now = Instant::now();
//! watcher.check(now)?; // at most one statvfs per interval
//! let report = watcher.report(now);
//! assert!(report.total_bytes > 0 && report.free_bytes <= report.total_bytes);
//! # Ok::<(), daqflow_wire::file::DiskError>(())
//! ```

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::format::{INDEX_ENTRY_LEN, RECORD_HEADER_LEN};
use crate::le::pad8;

/// The size and the free space of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskSpace {
    /// Its size in bytes.
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still use.
    pub free_bytes: u64,
}

impl DiskSpace {
    /// The space of the filesystem holding `path` (`statvfs`).
    pub fn of(path: &Path) -> Result<DiskSpace, DiskError> {
        let failed = |source| DiskError { path: path.to_path_buf(), source };
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| failed(io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte")))?;
        // SAFETY: an all-zero `statvfs` is a valid value of a plain C struct of integers.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated string that lives across the call, and `st` is a
        // valid, writable `statvfs` the call fills in.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(failed(io::Error::last_os_error()));
        }
        let unit = st.f_frsize as u64;
        Ok(DiskSpace {
            total_bytes: (st.f_blocks as u64).saturating_mul(unit),
            free_bytes: (st.f_bavail as u64).saturating_mul(unit),
        })
    }

    /// Percentage of the filesystem used, as a writer sees it: `100 × (size − free) / size`
    /// (0 for a filesystem of no size).
    pub fn used_pct(&self) -> f64 {
        if self.total_bytes == 0 {
            return 0.0;
        }
        100.0 * self.total_bytes.saturating_sub(self.free_bytes) as f64 / self.total_bytes as f64
    }

    /// "N MiB free of M MiB (P % used)", for messages.
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        format!(
            "{:.1} MiB free of {:.1} MiB ({:.1} % used)",
            mib(self.free_bytes),
            mib(self.total_bytes),
            self.used_pct()
        )
    }
}

/// The free space of a filesystem could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the free space of the filesystem holding {path}: {source}")]
pub struct DiskError {
    /// The directory that was asked about.
    pub path: PathBuf,
    /// What the operating system said.
    pub source: io::Error,
}

/// The high and low water marks of disk throttling, in percent of the filesystem used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskMarks {
    /// Above this usage the writer throttles; `100` never throttles.
    pub high_pct: f64,
    /// Below this usage a throttled writer resumes; lower than `high_pct`.
    pub low_pct: f64,
}

impl DiskMarks {
    /// The defaults of the writers' keys `throttle_high_pct` and `throttle_low_pct`: 95 and
    /// 90, far from a disk in normal use, near enough to full to leave room for the files
    /// being closed.
    pub const DEFAULT: DiskMarks = DiskMarks { high_pct: 95.0, low_pct: 90.0 };

    /// Whether throttling is on (`high_pct < 100`).
    pub fn enabled(&self) -> bool {
        self.high_pct < 100.0
    }

    /// Checks the marks, `0 ≤ low < high ≤ 100`: the key at fault
    /// (`throttle_high_pct` or `throttle_low_pct`) and what is wrong with it.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let (h, l) = (self.high_pct, self.low_pct);
        if !(h > 0.0 && h <= 100.0) {
            return Err(("throttle_high_pct", format!("= {h} is out of range: more than 0 … 100")));
        }
        if !(l >= 0.0 && l < h) {
            return Err(("throttle_low_pct", format!("= {l} must be at least 0 and below throttle_high_pct = {h}")));
        }
        Ok(())
    }
}

impl Default for DiskMarks {
    fn default() -> Self {
        DiskMarks::DEFAULT
    }
}

/// A change of a [`DiskWatcher`]'s state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskChange {
    /// Usage went above the high water mark: stop taking events.
    Throttled(DiskSpace),
    /// Usage fell below the low water mark: take events again.
    Resumed(DiskSpace),
}

/// What a [`DiskWatcher`] has seen, for a writer's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DiskReport {
    /// Throttled now.
    pub throttled: bool,
    /// How many times it throttled.
    pub throttle_count: u64,
    /// Seconds spent throttled, the current period included.
    pub throttled_s: f64,
    /// Seconds of the current throttled period (0 when not throttled).
    pub throttled_for_s: f64,
    /// Free bytes at the last check.
    pub free_bytes: u64,
    /// Size of the filesystem at the last check.
    pub total_bytes: u64,
    /// Usage (percent) at the last check.
    pub used_pct: f64,
}

/// Watches the filesystem holding a directory with high and low water marks (hysteresis):
/// throttled once usage goes above `high_pct`, or would go above it with the bytes a writer
/// is about to write, until a reading shows it below `low_pct`.
#[derive(Debug)]
pub struct DiskWatcher {
    directory: PathBuf,
    marks: DiskMarks,
    interval: Duration,
    last_check: Option<Instant>,
    space: DiskSpace,
    throttled_since: Option<Instant>,
    throttle_count: u64,
    throttled_before: Duration,
    /// Bytes handed to the writer since the last reading.
    written: u64,
    /// Draining at the end of a run: the space above the high mark may be used.
    draining: bool,
}

impl DiskWatcher {
    /// A watcher of the filesystem holding `directory`, reading its space at most once per
    /// `interval`.
    pub fn new(directory: &Path, marks: DiskMarks, interval: Duration) -> DiskWatcher {
        DiskWatcher {
            directory: directory.to_path_buf(),
            marks,
            interval,
            last_check: None,
            space: DiskSpace::default(),
            throttled_since: None,
            throttle_count: 0,
            throttled_before: Duration::ZERO,
            written: 0,
            draining: false,
        }
    }

    /// The directory watched.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// Reads the free space if the interval has passed since the last reading, and applies the
    /// marks; the change, if the state changed.
    pub fn check(&mut self, now: Instant) -> Result<Option<DiskChange>, DiskError> {
        if !self.take_reading(now) {
            return Ok(None);
        }
        self.space = DiskSpace::of(&self.directory)?;
        Ok(self.apply(self.space, now))
    }

    /// Whether a reading is due at `now` (the interval has passed since the last one); when it
    /// is, `now` counts as the time of the next reading, which the caller takes (a
    /// [`DiskSpace`] from `statvfs`, or from a simulated disk) and gives to
    /// [`DiskWatcher::apply`].
    pub fn take_reading(&mut self, now: Instant) -> bool {
        if self.next_reading().is_some_and(|t| now < t) {
            return false;
        }
        self.last_check = Some(now);
        true
    }

    /// When the next reading is due (`None`: at once, none was taken yet).
    pub fn next_reading(&self) -> Option<Instant> {
        self.last_check.map(|t| t + self.interval)
    }

    /// Applies the marks to `space`, read at `now`, which replaces the estimate (the bytes
    /// written before the reading are in it: a writer pushes them to the operating system
    /// before the reading, or counts them in the bytes it holds in flight); the change, if
    /// the state changed.
    pub fn apply(&mut self, space: DiskSpace, now: Instant) -> Option<DiskChange> {
        self.space = space;
        self.written = 0;
        let used = space.used_pct();
        match self.throttled_since {
            None if self.marks.enabled() && used > self.marks.high_pct => {
                self.throttled_since = Some(now);
                self.throttle_count += 1;
                Some(DiskChange::Throttled(space))
            }
            Some(since) if used < self.marks.low_pct || !self.marks.enabled() => {
                self.throttled_before += now.saturating_duration_since(since);
                self.throttled_since = None;
                Some(DiskChange::Resumed(space))
            }
            _ => None,
        }
    }

    /// Whether the writer should take no events now.
    pub fn throttled(&self) -> bool {
        self.throttled_since.is_some()
    }

    /// The bytes a data file takes for an event of `payload` bytes: its record (header,
    /// payload, padding) and its index entry.
    pub fn record_bytes(payload: usize) -> u64 {
        (RECORD_HEADER_LEN + pad8(payload) + INDEX_ENTRY_LEN) as u64
    }

    /// Counts `bytes` handed to the writer (written to its file, or into its buffer).
    pub fn wrote(&mut self, bytes: u64) {
        self.written = self.written.saturating_add(bytes);
    }

    /// The estimate of the filesystem's space now: the last reading less the bytes written
    /// since.
    pub fn estimate(&self) -> DiskSpace {
        DiskSpace {
            total_bytes: self.space.total_bytes,
            free_bytes: self.space.free_bytes.saturating_sub(self.written),
        }
    }

    /// The bytes that may still be written before the estimated usage goes above the high
    /// mark: 0 when throttled, `u64::MAX` when throttling is off (or before the first
    /// reading).
    pub fn room(&self) -> u64 {
        if !self.marks.enabled() || self.space.total_bytes == 0 {
            return u64::MAX;
        }
        if self.throttled() && !self.draining {
            return 0;
        }
        let total = self.space.total_bytes as f64;
        // Usage at or below the mark: free ≥ total × (100 − mark) / 100.
        let keep_free = (total * (100.0 - self.limit_pct()) / 100.0).ceil() as u64;
        self.estimate().free_bytes.saturating_sub(keep_free)
    }

    /// Whether `bytes` more may be written now: they fit in [`DiskWatcher::room`], or nothing
    /// was written since a reading below the low mark (an event larger than the space between
    /// the marks is written then, rather than held for ever).
    pub fn fits(&self, bytes: u64) -> bool {
        if self.throttled() && !self.draining {
            return false;
        }
        bytes <= self.room()
            || (!self.throttled()
                && self.written == 0
                && self.space.total_bytes > 0
                && self.space.used_pct() < self.marks.low_pct)
    }

    /// From now on (the run's end: the writer drains what is left), the writer may use half
    /// the space above the high mark, throttled or not: usage up to `(high + 100) / 2` %. The
    /// other half stays free for closing the files. [`DiskWatcher::room`] and
    /// [`DiskWatcher::fits`] say so.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Whether the writer drains ([`DiskWatcher::drain`]).
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// The usage (percent) the writer may go up to: the high mark, or half way from it to
    /// 100 % while draining.
    fn limit_pct(&self) -> f64 {
        if self.draining { (self.marks.high_pct + 100.0) / 2.0 } else { self.marks.high_pct }
    }

    /// Throttles now, before the next reading (the estimate says the disk is at its high
    /// mark); the change, if it was not throttled.
    pub fn throttle(&mut self, now: Instant) -> Option<DiskChange> {
        if self.throttled() || !self.marks.enabled() {
            return None;
        }
        self.throttled_since = Some(now);
        self.throttle_count += 1;
        Some(DiskChange::Throttled(self.estimate()))
    }

    /// Asks to write `bytes` now ([`DiskWatcher::record_bytes`] of an event): when they fit
    /// ([`DiskWatcher::fits`]) they are counted as written and the answer is `Ok(())`; when
    /// they do not, the watcher throttles at once and the answer is `Err` with the change, if
    /// it was not throttled before (the writer keeps the event and writes nothing).
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Result<(), Option<DiskChange>> {
        if self.fits(bytes) {
            self.wrote(bytes);
            return Ok(());
        }
        Err(self.throttle(now))
    }

    /// The last reading of the filesystem's space.
    pub fn space(&self) -> DiskSpace {
        self.space
    }

    /// The figures for the statistics, at `now`.
    pub fn report(&self, now: Instant) -> DiskReport {
        let current = self.throttled_since.map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        DiskReport {
            throttled: self.throttled(),
            throttle_count: self.throttle_count,
            throttled_s: (self.throttled_before + current).as_secs_f64(),
            throttled_for_s: current.as_secs_f64(),
            free_bytes: self.space.free_bytes,
            total_bytes: self.space.total_bytes,
            used_pct: self.space.used_pct(),
        }
    }
}

/// Whether `e` says the disk is full (`ENOSPC`, or `EDQUOT`: the user's quota is).
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) || e.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(used_pct: u64) -> DiskSpace {
        DiskSpace { total_bytes: 1000, free_bytes: 1000 - used_pct * 10 }
    }

    #[test]
    fn throttles_above_high_and_resumes_below_low_only() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        assert_eq!(w.apply(space(80), t0), None, "at the mark is not above it");
        assert!(matches!(w.apply(space(81), t0), Some(DiskChange::Throttled(_))));
        assert_eq!(w.apply(space(70), t0 + Duration::from_secs(1)), None, "between the marks: still throttled");
        assert!(w.throttled());
        assert!(matches!(w.apply(space(59), t0 + Duration::from_secs(2)), Some(DiskChange::Resumed(_))));
        assert_eq!(w.apply(space(79), t0 + Duration::from_secs(3)), None);
        assert!(matches!(w.apply(space(100), t0 + Duration::from_secs(4)), Some(DiskChange::Throttled(_))));
        let r = w.report(t0 + Duration::from_secs(5));
        assert_eq!((r.throttled, r.throttle_count, r.free_bytes), (true, 2, 0));
        assert!((r.throttled_s - 3.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn bytes_written_since_the_reading_throttle_before_the_high_mark_is_passed() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        // 50 % used: 300 bytes may go before the high mark (800 used of 1000).
        assert_eq!(w.apply(space(50), t0), None);
        assert_eq!(w.room(), 300);
        assert_eq!(w.admit(200, t0), Ok(()));
        assert_eq!(w.estimate(), DiskSpace { total_bytes: 1000, free_bytes: 300 });
        assert_eq!(w.room(), 100);
        assert_eq!(w.admit(100, t0), Ok(()), "up to the mark exactly");
        // One byte more would pass it: throttled now, with no reading in between.
        let t1 = t0 + Duration::from_millis(10);
        match w.admit(1, t1) {
            Err(Some(DiskChange::Throttled(s))) => assert_eq!(s.free_bytes, 200, "{s:?}"),
            other => panic!("{other:?}"),
        }
        assert!(w.throttled());
        assert_eq!((w.room(), w.admit(1, t1)), (0, Err(None)), "throttled already: nothing, and no second change");
        // A reading between the marks keeps it throttled; one below the low mark resumes it
        // and replaces the estimate.
        assert_eq!(w.apply(space(70), t1 + Duration::from_secs(1)), None);
        assert!(w.throttled());
        assert!(matches!(w.apply(space(59), t1 + Duration::from_secs(2)), Some(DiskChange::Resumed(_))));
        assert_eq!(w.room(), 210);
        let r = w.report(t1 + Duration::from_secs(3));
        assert_eq!((r.throttle_count, r.throttled), (1, false));
        assert!((r.throttled_s - 2.0).abs() < 1e-9 && r.throttled_for_s == 0.0, "{r:?}");
    }

    #[test]
    fn an_event_larger_than_the_space_between_the_marks_is_written_after_a_reading_below_low() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        w.apply(space(50), t0);
        assert!(w.fits(400), "nothing written since a reading below the low mark");
        assert_eq!(w.admit(400, t0), Ok(()));
        assert!(!w.fits(1), "then the estimate says above the high mark");
        assert!(w.throttle(t0).is_some());
        // Between the marks with nothing written: the large event waits for the low mark.
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        w.apply(space(65), t0);
        assert!(!w.fits(400) && w.fits(150));
    }

    #[test]
    fn a_writer_draining_at_the_end_of_the_run_uses_half_the_space_above_the_high_mark() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        w.apply(space(85), t0);
        assert!(w.throttled() && !w.fits(1));
        w.drain();
        assert!(w.draining() && w.throttled());
        // Up to 90 %: 50 bytes of 1000.
        assert_eq!(w.room(), 50);
        assert_eq!(w.admit(50, t0), Ok(()));
        assert_eq!(w.admit(1, t0), Err(None), "throttled already");
    }

    #[test]
    fn the_current_throttled_period_is_reported() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 80.0, low_pct: 60.0 }, Duration::ZERO);
        w.apply(space(90), t0);
        let r = w.report(t0 + Duration::from_millis(1500));
        assert!(r.throttled && (r.throttled_for_s - 1.5).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn without_throttling_or_before_a_reading_there_is_always_room() {
        let t0 = Instant::now();
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 100.0, low_pct: 90.0 }, Duration::ZERO);
        w.apply(space(99), t0);
        assert_eq!(w.room(), u64::MAX);
        assert_eq!(w.admit(1 << 40, t0), Ok(()));
        assert_eq!(w.throttle(t0), None);
        let w = DiskWatcher::new(Path::new("/"), DiskMarks::default(), Duration::ZERO);
        assert_eq!(w.room(), u64::MAX);
        assert_eq!(DiskWatcher::record_bytes(1), 24 + 8 + 16);
    }

    #[test]
    fn a_high_mark_of_100_never_throttles() {
        let mut w = DiskWatcher::new(Path::new("/"), DiskMarks { high_pct: 100.0, low_pct: 90.0 }, Duration::ZERO);
        assert_eq!(w.apply(space(100), Instant::now()), None);
        assert!(!w.throttled());
    }

    #[test]
    fn marks_out_of_range_are_named() {
        assert!(DiskMarks::default().check().is_ok());
        let (key, e) = DiskMarks { high_pct: 101.0, low_pct: 50.0 }.check().unwrap_err();
        assert_eq!(key, "throttle_high_pct");
        assert!(e.contains("= 101 is out of range"), "{e}");
        let (key, e) = DiskMarks { high_pct: 50.0, low_pct: 50.0 }.check().unwrap_err();
        assert_eq!(key, "throttle_low_pct");
        assert!(e.contains("below throttle_high_pct = 50"), "{e}");
    }

    #[test]
    fn a_directory_that_does_not_exist_is_a_clear_error() {
        let e = DiskSpace::of(Path::new("/no/such/directory/here")).unwrap_err();
        assert!(e.to_string().contains("/no/such/directory/here"), "{e}");
        let s = DiskSpace::of(&std::env::temp_dir()).unwrap();
        assert!(s.total_bytes > 0 && s.used_pct() <= 100.0, "{s:?}");
    }
}
