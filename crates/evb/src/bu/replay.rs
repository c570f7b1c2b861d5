//! The BU's builder threads fed from memory: what building, checking and writing cost, and how
//! they scale with threads, without the RUs, the EVM or a socket in front of them.
//!
//! [`replay`] starts the builder threads a BU starts for a run (the same tasks, FIFOs, outputs
//! and schedulers, made by the same code) and feeds them the [`ReadyEvent`]s it is given, over
//! and over, from the calling thread by the BU's own hand-out (the next builder with room,
//! round-robin), for a warm-up and a window. Each thread's events, bytes and CPU time in the
//! window come back in a [`ReplayReport`], with every event handed out accounted for: a
//! thread busy ≥ 95 % of the time is where more threads must add rate (issue 29; `daqflow bench
//! evb --cases replay`, docs/performance.md).
//!
//! [`ready_events`] makes such events: `rus` super-fragments of `fragments` fragments of
//! `fragment_size` bytes each (CRCs computed), every event in memory of its own.
//!
//! ```
//! use std::time::Duration;
//! use daqflow_evb::bu::{BuConfig, Output, replay::{ready_events, replay}};
//!
//! let events = ready_events(16, 2, 4, 1024);
//! let config = BuConfig { threads: 2, output: Output::Discard, check_crc: true, ..Default::default() };
//! let report = replay(&config, &events, Duration::from_millis(20), Duration::from_millis(50))?;
//! assert!(report.events > 0);
//! assert_eq!(report.events, report.threads.iter().map(|t| t.events).sum::<u64>());
//! assert_eq!((report.flagged, report.lost), (0, 0));
//! assert_eq!(report.handed, report.built + report.unbuilt);
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::{EventId, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags};

use super::{Bu, BuConfig, BuShared, BuilderCounters, ReadyEvent, SfParts};
use crate::EvbError;
use crate::protocol::Trigger;

/// The feeder reads the clock and the builders' liveness every this many turns of 256
/// hand-outs (and after every turn that pushed nothing).
const CHECK_EVERY: u32 = 8;

/// One builder thread's share of a replay's window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadLoad {
    /// Events it built and handed to its output in the window.
    pub events: u64,
    /// Their bytes.
    pub bytes: u64,
    /// CPU time its thread used in the window (user and system), in seconds, from `/proc`
    /// (10 ms ticks); `None` where `/proc` does not say.
    pub cpu_s: Option<f64>,
}

/// What a replay built.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Events built in the window, all threads.
    pub events: u64,
    /// Their bytes (as written: event headers included).
    pub bytes: u64,
    /// Events flagged by the checks (a CRC error, an id mismatch): 0 for events from
    /// [`ready_events`].
    pub flagged: u64,
    /// Events handed to the builder threads, warm-up included.
    pub handed: u64,
    /// Of those, events built (warm-up and after the window included).
    pub built: u64,
    /// Of those, events still in the builders' FIFOs when they were stopped.
    pub unbuilt: u64,
    /// Events handed out and neither built nor left in a FIFO: `handed` − `built` − `unbuilt`
    /// (0 unless a builder dropped one).
    pub lost: u64,
    /// Events confirmed by the builders (in the output and flushed), whole replay.
    pub confirmed: u64,
    /// The window, in seconds.
    pub seconds: f64,
    /// Each builder thread's share of the window, in thread order.
    pub threads: Vec<ThreadLoad>,
    /// Files the outputs wrote (`output = "files"`).
    pub files: usize,
}

impl ReplayReport {
    /// Events built per second.
    pub fn events_per_s(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }

    /// The busiest builder thread's CPU time as a share of the replay's time (0 … 1), if known.
    pub fn max_busy(&self) -> Option<f64> {
        self.threads
            .iter()
            .map(|t| t.cpu_s.map(|c| c / self.seconds.max(1e-9)))
            .try_fold(0.0f64, |m, b| Some(m.max(b?)))
    }
}

/// `count` events of `rus` super-fragments, each of `fragments` fragments of `fragment_size`
/// bytes of varied content (valid CRCs), with event ids 1 … `count`: what a BU's link
/// scheduler hands its builder threads. Each event lives in memory of its own.
pub fn ready_events(count: usize, rus: u32, fragments: u32, fragment_size: usize) -> Vec<ReadyEvent> {
    (1..=count as u64)
        .map(|id| {
            let parts = (0..rus)
                .map(|ru| {
                    let frags: Vec<Fragment> = (0..fragments)
                        .map(|f| {
                            let seed = id as usize * 131 + ru as usize * 31 + f as usize * 7;
                            let payload: Vec<u8> =
                                (0..fragment_size).map(|i| (i.wrapping_mul(13) + seed) as u8).collect();
                            let info = FragmentInfo {
                                source_id: ru * fragments + f,
                                event_id: EventId(id),
                                ..Default::default()
                            };
                            Fragment::parse(Fragment::encode(&info, &payload)).expect("just encoded")
                        })
                        .collect();
                    let bytes = SuperFragment::assemble(ru, EventId(id), SuperFragmentFlags::default(), &frags);
                    let sf = SuperFragment::parse(bytes).expect("just assembled");
                    SfParts { header: *sf.header(), bytes: Bytes::clone(sf.as_bytes()) }
                })
                .collect();
            ReadyEvent { trigger: Trigger { event_id: id, trigger_type: 1, flags: 0, timestamp: 0 }, parts }
        })
        .collect()
}

/// Feeds `events` (over and over, round-robin over the threads) to the builder threads a BU
/// with `config` starts for a run, for `warmup` and then the measuring `window`; then stops
/// them and reports (rates and CPU times over the window, the accounting over the whole
/// replay). The output is `config`'s (`discard`, or `files` in `config.directory`; `et` needs
/// an ET system and is refused here). Run number 1.
pub fn replay(
    config: &BuConfig,
    events: &[ReadyEvent],
    warmup: Duration,
    window: Duration,
) -> Result<ReplayReport, EvbError> {
    config.validate()?;
    if config.output == super::Output::Et {
        return Err(EvbError::Config("replay: output = \"et\" is not replayed (discard or files)".into()));
    }
    if events.is_empty() {
        return Err(EvbError::Config("replay: no events to replay".into()));
    }
    if config.output == super::Output::Files {
        std::fs::create_dir_all(&config.directory)
            .map_err(|e| EvbError::io(format!("creating {}", config.directory.display()), e))?;
    }
    let run = 1;
    // A name of its own per replay: the threads' CPU times are found by name, and replays may
    // run side by side in one process (the kernel keeps 15 bytes of a name: `rp{n}-build{t}`).
    static REPLAYS: AtomicU32 = AtomicU32::new(0);
    let name = format!("rp{}", REPLAYS.fetch_add(1, Ordering::Relaxed) % 1000);
    let mut bu = Bu::new(&name, config.clone());
    let builders = (0..config.threads).map(|_| BuilderCounters::default()).collect();
    let shared = bu.unit.begin(run, BuShared { builders, ..Default::default() });
    let mut b = bu.spawn_builders(run)?;
    let names: Vec<String> = b.running.iter().map(|(_, r)| r.name().to_owned()).collect();
    let (mut handed, mut confirmed, mut next) = (0u64, 0u64, 0usize);
    let start = Instant::now();
    let (measure_from, end) = (start + warmup, start + warmup + window);
    // (events, bytes, CPU seconds) of each thread when the window opens and when it closes.
    let snapshot = || -> Vec<(u64, u64, Option<f64>)> {
        shared
            .extra
            .builders
            .iter()
            .zip(&names)
            .map(|(c, n)| (c.events.load(Ordering::Relaxed), c.bytes.load(Ordering::Relaxed), thread_cpu_s(n)))
            .collect()
    };
    let (mut opened, mut closed) = (None, None);
    let mut failed = None;
    // The clock and the builders' liveness are read every few turns, and after every turn
    // that pushed nothing, so that the feeder's own checks stay out of the rate at small
    // events (the window's ends are the times of its snapshots, whenever they are taken).
    let mut check = true;
    let mut turns = 0u32;
    loop {
        if check || turns.is_multiple_of(CHECK_EVERY) {
            let now = Instant::now();
            if opened.is_none() && now >= measure_from {
                opened = Some((now, snapshot()));
            }
            if now >= end {
                closed = Some((now, snapshot()));
                break;
            }
            if let Some((t, _)) = b.running.iter().enumerate().find(|(_, (_, r))| r.is_finished()) {
                let why = super::read(&shared.extra.output_failed).unwrap_or_else(|| "its output failed".into());
                failed = Some(format!("builder thread {t} stopped: {why}"));
                break;
            }
        }
        turns = turns.wrapping_add(1);
        let mut pushed = 0;
        for _ in 0..256 {
            let ev = events[(handed % events.len() as u64) as usize].clone();
            // As the BU's I/O thread hands events out.
            if super::hand_out(&mut b.to, &mut next, ev).is_err() {
                break;
            }
            handed += 1;
            pushed += 1;
        }
        for rx in &mut b.from {
            while rx.pop().is_ok() {
                confirmed += 1;
            }
        }
        check = pushed == 0;
        if pushed == 0 {
            // Every FIFO full: leave the cores to the builders a while.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let (_, closed_files, mut errors) = super::stop_builders(&mut b.running, &b.outputs);
    for rx in &mut b.from {
        while rx.pop().is_ok() {
            confirmed += 1;
        }
    }
    // What the builders had not taken is still in their FIFOs (their ends are gone with them).
    let unbuilt: u64 = b.to.iter().map(|tx| (tx.buffer().capacity() - tx.slots()) as u64).sum();
    if let Some(f) = failed {
        errors.insert(0, f);
    }
    if !errors.is_empty() {
        return Err(EvbError::Failed(format!("replay: {}", errors.join("; "))));
    }
    let (Some((t0, first)), Some((t1, last))) = (opened, closed) else {
        return Err(EvbError::Failed("replay: the window never opened".into()));
    };
    let threads: Vec<ThreadLoad> = first
        .iter()
        .zip(&last)
        .map(|(a, b)| ThreadLoad {
            events: b.0 - a.0,
            bytes: b.1 - a.1,
            cpu_s: match (a.2, b.2) {
                (Some(x), Some(y)) => Some(y - x),
                _ => None,
            },
        })
        .collect();
    let built: u64 = shared.extra.builders.iter().map(|c| c.events.load(Ordering::Relaxed)).sum();
    if built + unbuilt > handed {
        return Err(EvbError::Failed(format!(
            "replay: {built} events built and {unbuilt} left of {handed} handed out"
        )));
    }
    Ok(ReplayReport {
        events: threads.iter().map(|t| t.events).sum(),
        bytes: threads.iter().map(|t| t.bytes).sum(),
        flagged: shared.extra.builders.iter().map(|c| c.flagged.load(Ordering::Relaxed)).sum(),
        handed,
        built,
        unbuilt,
        lost: handed - built - unbuilt,
        confirmed,
        seconds: t1.duration_since(t0).as_secs_f64(),
        threads,
        files: closed_files.len(),
    })
}

/// CPU time (user + system) of this process's thread named `name`, in seconds (`None` if no
/// such thread or no `/proc`).
fn thread_cpu_s(name: &str) -> Option<f64> {
    let stat = daqflow_wire::affinity::TaskStat::of_own_thread(name)?;
    Some(stat.cpu_ticks as f64 / daqflow_wire::affinity::clock_ticks_per_s())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bu::Output;

    #[test]
    fn a_replay_accounts_for_every_event_it_hands_out_and_flags_none() {
        let events = ready_events(8, 3, 2, 512);
        let config = BuConfig { threads: 2, output: Output::Discard, check_crc: true, ..Default::default() };
        let r = replay(&config, &events, Duration::from_millis(20), Duration::from_millis(100)).unwrap();
        assert!(r.events > 0);
        assert_eq!(r.flagged, 0);
        assert_eq!(r.lost, 0, "{r:?}");
        assert_eq!(r.handed, r.built + r.unbuilt);
        assert!(r.built >= r.events);
        // Each thread's CPU time is its own (found by a name no other replay has).
        assert!(r.threads.iter().all(|t| t.cpu_s.is_some_and(|c| c >= 0.0 && c <= 2.0 * r.seconds + 0.05)), "{r:?}");
        assert_eq!(r.threads.len(), 2);
        assert!(r.threads.iter().all(|t| t.events > 0), "{r:?}");
        assert_eq!(r.events, r.threads.iter().map(|t| t.events).sum::<u64>());
        // Discard holds an event as soon as it is put: each one built is confirmed.
        assert_eq!(r.confirmed, r.built);
        let event_bytes = r.bytes / r.events;
        assert_eq!(
            event_bytes as usize,
            daqflow_wire::EVENT_HEADER_LEN + events[0].parts.iter().map(|p| p.bytes.len()).sum::<usize>()
        );
    }

    #[test]
    fn a_replay_into_files_writes_readable_files_of_every_built_event() {
        let dir = tempfile::tempdir().unwrap();
        let events = ready_events(4, 2, 2, 256);
        let config = BuConfig {
            threads: 2,
            output: Output::Files,
            directory: dir.path().into(),
            check_crc: true,
            ..Default::default()
        };
        let r = replay(&config, &events, Duration::from_millis(20), Duration::from_millis(100)).unwrap();
        assert!(r.files >= 2, "{r:?}");
        let mut on_disk = 0u64;
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let mut reader = daqflow_wire::file::FileReader::open(f.path()).unwrap();
            assert!(reader.verify(true).unwrap().is_clean(), "{}", f.path().display());
            on_disk += reader.len().unwrap();
        }
        assert_eq!(on_disk, r.built);
    }

    #[test]
    fn a_corrupted_fragment_is_flagged_by_the_crc_check() {
        let mut events = ready_events(2, 1, 1, 256);
        let mut bad = events[0].parts[0].bytes.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        events[0].parts[0].bytes = Bytes::from(bad);
        let config = BuConfig { threads: 1, output: Output::Discard, check_crc: true, ..Default::default() };
        let r = replay(&config, &events, Duration::from_millis(10), Duration::from_millis(50)).unwrap();
        assert!(r.flagged > 0 && r.flagged < r.built, "{r:?}");
    }

    #[test]
    fn et_output_is_refused() {
        let config = BuConfig { output: Output::Et, et: "x".into(), ..Default::default() };
        let e = replay(&config, &ready_events(1, 1, 1, 8), Duration::ZERO, Duration::from_millis(1)).unwrap_err();
        assert!(e.to_string().contains("not replayed"), "{e}");
    }
}
