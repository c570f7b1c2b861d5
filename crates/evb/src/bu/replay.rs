//! The BU's builder threads fed from memory: what building, checking and writing cost, and how
//! they scale with threads, without the RUs, the EVM or a socket in front of them.
//!
//! [`replay`] starts the builder threads a BU starts for a run (the same tasks, FIFOs, outputs
//! and schedulers, made by the same code) and feeds them the [`ReadyEvent`]s it is given, over
//! and over, round-robin from the calling thread as the BU's I/O thread hands them out, for the
//! given time. Each thread's events, bytes and CPU time come back in a [`ReplayReport`]: a
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
//! let report = replay(&config, &events, Duration::from_millis(50))?;
//! assert!(report.events > 0);
//! assert_eq!(report.events, report.threads.iter().map(|t| t.events).sum::<u64>());
//! assert_eq!((report.flagged, report.lost), (0, 0));
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::{EventId, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags};

use super::{Bu, BuConfig, BuShared, BuilderCounters, ReadyEvent, SfParts};
use crate::EvbError;
use crate::protocol::Trigger;

/// One builder thread's share of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadLoad {
    /// Events it built and handed to its output.
    pub events: u64,
    /// Their bytes.
    pub bytes: u64,
    /// CPU time its thread used (user and system), in seconds; `None` where `/proc` does not
    /// say.
    pub cpu_s: Option<f64>,
}

/// What a replay built.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Events built, all threads.
    pub events: u64,
    /// Their bytes (as written: event headers included).
    pub bytes: u64,
    /// Events flagged by the checks (a CRC error, an id mismatch): 0 for events from
    /// [`ready_events`].
    pub flagged: u64,
    /// Events handed to the builder threads.
    pub handed: u64,
    /// Of those, events still in the builders' FIFOs when they were stopped.
    pub unbuilt: u64,
    /// Events handed out and neither built nor left in a FIFO: `handed` − `events` − `unbuilt`
    /// (0 unless a builder dropped one).
    pub lost: u64,
    /// Events confirmed by the builders (in the output and flushed).
    pub confirmed: u64,
    /// From the first event handed out to the stop, in seconds.
    pub seconds: f64,
    /// Each builder thread's share, in thread order.
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
/// with `config` starts for a run, for `duration`; then stops them and reports. The output is
/// `config`'s (`discard`, or `files` in `config.directory`; `et` needs an ET system and is
/// refused here). Run number 1.
pub fn replay(config: &BuConfig, events: &[ReadyEvent], duration: Duration) -> Result<ReplayReport, EvbError> {
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
    let mut bu = Bu::new("replay", config.clone());
    let builders = (0..config.threads).map(|_| BuilderCounters::default()).collect();
    let shared = bu.unit.begin(run, BuShared { builders, ..Default::default() });
    let mut b = bu.spawn_builders(run)?;
    let names: Vec<String> = b.running.iter().map(|(_, r)| r.name().to_owned()).collect();
    // A new thread names itself once it runs: wait (a little) until every builder has.
    let named = Instant::now() + Duration::from_millis(200);
    let mut cpu_before = names.iter().map(|n| thread_cpu_s(n)).collect::<Vec<_>>();
    while cpu_before.iter().any(Option::is_none) && Instant::now() < named {
        std::thread::sleep(Duration::from_millis(1));
        cpu_before = names.iter().map(|n| thread_cpu_s(n)).collect();
    }
    let (mut handed, mut confirmed, mut next) = (0u64, 0u64, 0usize);
    let n = b.to.len();
    let start = Instant::now();
    let end = start + duration;
    let mut failed = None;
    'feed: while Instant::now() < end {
        let mut pushed = 0;
        // As the BU's I/O thread: the next builder with room, round-robin.
        for _ in 0..256 {
            let ev = events[(handed % events.len() as u64) as usize].clone();
            let mut ev = Some(ev);
            for k in 0..n {
                let t = (next + k) % n;
                match b.to[t].push(ev.take().expect("not yet pushed")) {
                    Ok(()) => {
                        next = (t + 1) % n;
                        break;
                    }
                    Err(daqflow_engine::fifo::PushError::Full(e)) => ev = Some(e),
                }
            }
            if ev.is_some() {
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
        if let Some((t, _)) = b.running.iter().enumerate().find(|(_, (_, r))| r.is_finished()) {
            let why = super::read(&shared.extra.output_failed).unwrap_or_else(|| "its output failed".into());
            failed = Some(format!("builder thread {t} stopped: {why}"));
            break 'feed;
        }
        if pushed == 0 {
            // Every FIFO full: leave the cores to the builders a while.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_after = names.iter().map(|n| thread_cpu_s(n)).collect::<Vec<_>>();
    let mut errors = Vec::new();
    for (stop, running) in b.running.drain(..) {
        stop.stop();
        if let Err(e) = running.join() {
            errors.push(e.to_string());
        }
    }
    for rx in &mut b.from {
        while rx.pop().is_ok() {
            confirmed += 1;
        }
    }
    // What the builders had not taken is still in their FIFOs (their ends are gone with them).
    let unbuilt: u64 = b.to.iter().map(|tx| (tx.buffer().capacity() - tx.slots()) as u64).sum();
    let mut files = 0;
    for o in &b.outputs {
        match o.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(Ok(closed)) => files += closed.len(),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
    }
    if let Some(f) = failed {
        errors.insert(0, f);
    }
    if !errors.is_empty() {
        return Err(EvbError::Failed(format!("replay: {}", errors.join("; "))));
    }
    let threads: Vec<ThreadLoad> = shared
        .extra
        .builders
        .iter()
        .enumerate()
        .map(|(i, c)| ThreadLoad {
            events: c.events.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            cpu_s: match (cpu_before[i], cpu_after[i]) {
                (Some(a), Some(b)) => Some(b - a),
                _ => None,
            },
        })
        .collect();
    let events = threads.iter().map(|t| t.events).sum::<u64>();
    if events + unbuilt > handed {
        return Err(EvbError::Failed(format!(
            "replay: {events} events built and {unbuilt} left of {handed} handed out"
        )));
    }
    Ok(ReplayReport {
        events,
        bytes: threads.iter().map(|t| t.bytes).sum(),
        flagged: shared.extra.builders.iter().map(|c| c.flagged.load(Ordering::Relaxed)).sum(),
        handed,
        unbuilt,
        lost: handed - events - unbuilt,
        confirmed,
        seconds,
        threads,
        files,
    })
}

/// CPU time (user + system) of this process's thread named `name`, in seconds, from
/// `/proc/self/task/*/stat` (`None` if no such thread or no `/proc`).
fn thread_cpu_s(name: &str) -> Option<f64> {
    // The kernel keeps 15 bytes of a thread's name.
    let short: String = name.chars().take(15).collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != short {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // After the name's closing parenthesis: state is field 3; utime, stime fields 14, 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (u, s): (f64, f64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
        return Some((u + s) / ticks.max(1.0));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bu::Output;

    #[test]
    fn a_replay_accounts_for_every_event_it_hands_out_and_flags_none() {
        let events = ready_events(8, 3, 2, 512);
        let config = BuConfig { threads: 2, output: Output::Discard, check_crc: true, ..Default::default() };
        let r = replay(&config, &events, Duration::from_millis(100)).unwrap();
        assert!(r.events > 0);
        assert_eq!(r.flagged, 0);
        assert_eq!(r.lost, 0, "{r:?}");
        assert_eq!(r.handed, r.events + r.unbuilt);
        assert_eq!(r.threads.len(), 2);
        assert!(r.threads.iter().all(|t| t.events > 0), "{r:?}");
        assert_eq!(r.events, r.threads.iter().map(|t| t.events).sum::<u64>());
        // Discard holds an event as soon as it is put: each one built is confirmed.
        assert_eq!(r.confirmed, r.events);
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
        let r = replay(&config, &events, Duration::from_millis(100)).unwrap();
        assert!(r.files >= 2, "{r:?}");
        let mut on_disk = 0u64;
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let mut reader = daqflow_wire::file::FileReader::open(f.path()).unwrap();
            assert!(reader.verify(true).unwrap().is_clean(), "{}", f.path().display());
            on_disk += reader.len().unwrap();
        }
        assert_eq!(on_disk, r.events);
    }

    #[test]
    fn a_corrupted_fragment_is_flagged_by_the_crc_check() {
        let mut events = ready_events(2, 1, 1, 256);
        let mut bad = events[0].parts[0].bytes.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        events[0].parts[0].bytes = Bytes::from(bad);
        let config = BuConfig { threads: 1, output: Output::Discard, check_crc: true, ..Default::default() };
        let r = replay(&config, &events, Duration::from_millis(50)).unwrap();
        assert!(r.flagged > 0 && r.flagged < r.events, "{r:?}");
    }

    #[test]
    fn et_output_is_refused() {
        let config = BuConfig { output: Output::Et, et: "x".into(), ..Default::default() };
        let e = replay(&config, &ready_events(1, 1, 1, 8), Duration::from_millis(1)).unwrap_err();
        assert!(e.to_string().contains("not replayed"), "{e}");
    }
}
