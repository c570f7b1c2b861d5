//! The accounting of a run: what was triggered, built, recorded and written, and what was lost
//! and why, from whatever is left when the run ends.
//!
//! A run that ended well has every component's stop summary. A run that failed may not: a
//! component that died gave none. The accounting then takes what it can know from the
//! components that survived (their stop summaries), from the last statistics that the dead
//! ones published, from the earlier lives of components restarted during the run, and from
//! the data files on disk, which are read for every writer of the run whatever its fate.
//!
//! - **triggered**, **rejected**: the event manager's summary; unknown (`null`, with the
//!   reason in `unknown`) when it died.
//! - **built** (`events`): the event manager's count of built events; without it, the events
//!   the builder units built (summaries of the survivors, last statistics of the dead and of
//!   earlier lives).
//! - **recorded**: the whole events in the recorders' files on disk, every file of the run
//!   that a recorder wrote (`.daq`, and `.daq.part` left by one that died).
//! - **lost**: the sum of `lost_reasons`, each a count with its cause: events triggered but not
//!   built (the event manager's accounting), events built but not recorded (with where they
//!   were when the run ended); a component that ended the run in Error (a recorder or a BU on
//!   a full disk) is named with its error. `built = recorded − duplicates + not_recorded` and `triggered =
//!   built + rejected + lost_in_builder` hold wherever the numbers are known; `unknown` says
//!   plainly what cannot be known, and `accounting_complete` is false then.
//!
//! What a component's counters mean comes from its kind's [`Role`]: the trigger's
//! [`TriggerCounts`](daqflow_component::TriggerCounts), the builders' and recorders' `events`; no counter is looked up by name.
//!
//! ```
//! use daqflow_component::{Role, Stats, TriggerCounts};
//! use daqflow_api::FileRecord;
//! use daqflow_runcontrol::accounting::{account, ComponentRun};
//! let trigger = TriggerCounts { triggered: 10, built: 10, ..Default::default() };
//! let evm = ComponentRun::survived("evm", "evm", Role::Trigger, Stats::counted(10, 0).with_trigger(trigger));
//! let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, Stats::counted(10, 100));
//! let files = vec![FileRecord { component: "rec".into(), path: "/d/run000001_rec_0001.daq".into(), events: 8,
//!     bytes: 80, first_event: Some(1), last_event: Some(8), complete: true }];
//! let a = account(&[evm, rec], &files);
//! assert_eq!((a.events, a.recorded, a.lost), (10, 8, 2));
//! assert!(a.accounting_complete);
//! ```

use std::path::{Path, PathBuf};

use daqflow_api::{Died, FileRecord, LostReason};
use daqflow_component::{Role, Stats};

/// What the operator knows of one component at the end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentRun {
    /// The component's name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its kind's role in the accounting.
    pub role: Role,
    /// Its stop summary, when it was stopped (it survived, or was restarted and stopped).
    pub summary: Option<Stats>,
    /// The last statistics it published (used when it gave no summary).
    pub last_stats: Stats,
    /// The last statistics of its earlier lives in this run (it was restarted).
    pub earlier: Vec<Stats>,
    /// Why it ended the run dead (its process ended and was not started again), if it did.
    pub died: Option<String>,
    /// Its error, when it ended the run alive but in Error (e.g. "disk full: …"), if it did.
    pub failed: Option<String>,
    /// Where it writes its data files (a recorder, a builder unit writing files), if it does:
    /// named when its disk held events back.
    pub data: Option<PathBuf>,
}

impl ComponentRun {
    /// A component that was stopped and gave `summary`.
    pub fn survived(name: &str, kind: &str, role: Role, summary: Stats) -> ComponentRun {
        ComponentRun {
            name: name.into(),
            kind: kind.into(),
            role,
            summary: Some(summary),
            last_stats: Stats::default(),
            earlier: Vec::new(),
            died: None,
            failed: None,
            data: None,
        }
    }

    /// A component whose process died (`why`) after publishing `last_stats`.
    pub fn dead(name: &str, kind: &str, role: Role, why: &str, last_stats: Stats) -> ComponentRun {
        ComponentRun {
            name: name.into(),
            kind: kind.into(),
            role,
            summary: None,
            last_stats,
            earlier: Vec::new(),
            died: Some(why.into()),
            failed: None,
            data: None,
        }
    }

    /// The same component, which ended the run in Error with `error`.
    pub fn failed(mut self, error: &str) -> ComponentRun {
        self.failed = Some(error.into());
        self
    }

    /// The same component, writing its data files into `directory`.
    pub fn with_data(mut self, directory: &Path) -> ComponentRun {
        self.data = Some(directory.to_path_buf());
        self
    }

    /// "the disk of `NAME` (DIR) is full: …" when a data writer ended the run throttled by its
    /// disk (its counters say `detail.throttled`): the events it had no room for are why.
    fn disk_full(&self) -> Option<String> {
        let detail = &self.now().detail;
        if !matches!(self.role, Role::Recorder | Role::Builder) || detail["throttled"] != true {
            return None;
        }
        let dir = self.data.as_ref().map(|d| format!(" ({})", d.display())).unwrap_or_default();
        let space = match (detail["disk_free_bytes"].as_u64(), detail["disk_used_pct"].as_f64()) {
            (Some(free), Some(used)) => format!(", {:.1} MiB free, {used:.1} % used", free as f64 / 1048576.0),
            _ => String::new(),
        };
        let seconds = detail["throttled_for_s"].as_f64().map(|s| format!(" for {s:.0} s")).unwrap_or_default();
        Some(format!(
            "the disk of `{}`{dir} is full: it ended the run throttled by it{seconds} (above throttle_high_pct{space})",
            self.name
        ))
    }

    /// Its counters now: the summary, or (dead) its last statistics.
    fn now(&self) -> &Stats {
        self.summary.as_ref().unwrap_or(&self.last_stats)
    }

    /// Events and bytes over the component's whole run: now plus its earlier lives.
    fn counted(&self) -> (u64, u64) {
        std::iter::once(self.now())
            .chain(&self.earlier)
            .fold((0u64, 0u64), |(e, b), s| (e.saturating_add(s.events), b.saturating_add(s.bytes)))
    }
}

/// Whether file name `file` is a data file of run `run` written by component `name`: its
/// stream is the name itself, a restarted life of it (`NAME.rN`) or one of its builder threads
/// (`NAME-tN`).
pub fn is_file_of(file: &str, run: u32, name: &str) -> bool {
    let Some(rest) = file.strip_prefix(&format!("run{run:06}_")).and_then(|r| r.strip_prefix(name)) else {
        return false;
    };
    if !(rest.ends_with(".daq") || rest.ends_with(".daq.part")) {
        return false;
    }
    let digits_then_sequence = |r: &str| {
        let n = r.chars().take_while(char::is_ascii_digit).count();
        n > 0 && r[n..].starts_with('_')
    };
    if let Some(r) = rest.strip_prefix('_') {
        return r.chars().take_while(char::is_ascii_digit).count() == 4;
    }
    rest.strip_prefix(".r").is_some_and(digits_then_sequence)
        || rest.strip_prefix("-t").is_some_and(digits_then_sequence)
}

/// The data files of run `run` that component `name` wrote into `directory`, read from disk:
/// closed ones through their trailer, `.part` ones up to their last whole event. Anything that
/// is not a regular file is skipped; a file that cannot be read is returned in the second
/// list with the reason.
pub fn files_on_disk(directory: &Path, run: u32, name: &str) -> (Vec<FileRecord>, Vec<String>) {
    let (mut files, mut problems) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(directory) else { return (files, problems) };
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if !is_file_of(&file_name, run, name) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        match daqflow_wire::file::FileReader::open(&path) {
            Ok(mut reader) => {
                let (complete, bytes) = (reader.is_complete(), reader.size());
                match reader.index() {
                    Ok(index) => files.push(FileRecord {
                        component: name.into(),
                        events: index.len() as u64,
                        first_event: index.first().map(|e| e.event_id.0),
                        last_event: index.last().map(|e| e.event_id.0),
                        path,
                        bytes,
                        complete,
                    }),
                    Err(e) => problems.push(format!("{}: {e}", path.display())),
                }
            }
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    (files, problems)
}

/// The accounting of a run (the module documentation says how each figure is found): the
/// API's one type of it, which every run's summary holds.
pub use daqflow_api::RunAccounting as Accounting;

/// The accounting of a run from what is known of its components and the files on disk.
pub fn account(components: &[ComponentRun], files: &[FileRecord]) -> Accounting {
    let of = |role: Role| -> Vec<&ComponentRun> { components.iter().filter(|c| c.role == role).collect() };
    let has = |role: Role| components.iter().any(|c| c.role == role);
    let dead = |role: Role| of(role).into_iter().filter(|c| c.died.is_some()).collect::<Vec<_>>();
    let mut reasons: Vec<LostReason> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let names = |cs: &[&ComponentRun]| cs.iter().map(|c| format!("`{}`", c.name)).collect::<Vec<_>>().join(", ");
    let died_text = |cs: &[&ComponentRun]| {
        cs.iter()
            .map(|c| format!("`{}` died ({})", c.name, c.died.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Components that ended the run alive but in Error (a full disk), by role.
    let failed = |role: Role| -> Vec<&ComponentRun> {
        components.iter().filter(|c| c.role == role && c.died.is_none() && c.failed.is_some()).collect()
    };
    let failed_text = |cs: &[&ComponentRun]| {
        cs.iter()
            .map(|c| format!("`{}` failed ({})", c.name, c.failed.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(", ")
    };

    // Triggered, rejected and built: the trigger's accounting, while it lived.
    let triggers = of(Role::Trigger);
    let trigger_dead = dead(Role::Trigger);
    let (mut triggered, mut rejected, mut lost_in_builder) = (Some(0u64), Some(0u64), 0u64);
    let mut built_by_trigger = 0u64;
    for t in &triggers {
        match &t.summary {
            Some(s) => {
                let c = s.trigger.clone().unwrap_or_default();
                triggered = triggered.map(|n| n + c.triggered);
                rejected = rejected.map(|n| n + c.rejected);
                built_by_trigger += c.built;
                lost_in_builder += c.lost;
                if c.lost > 0 {
                    let why = c.lost_reasons.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join("; ");
                    let aborted = c.error.as_ref().map(|e| format!("the run was aborted ({e}); ")).unwrap_or_default();
                    let in_dead: Vec<&ComponentRun> = components
                        .iter()
                        .filter(|c| c.died.is_some() && matches!(c.role, Role::Readout | Role::Builder))
                        .collect();
                    // A recorder or ET system that failed holds the builder back: its error is
                    // the cause of what the builder could not confirm.
                    let in_failed: Vec<&ComponentRun> =
                        [failed(Role::Readout), failed(Role::Builder), failed(Role::Buffer), failed(Role::Recorder)]
                            .concat();
                    let full: Vec<String> = components.iter().filter_map(|c| c.disk_full()).collect();
                    let place = match (in_dead.is_empty(), in_failed.is_empty()) {
                        (true, true) if !full.is_empty() => format!("after {}: ", full.join(", ")),
                        (true, true) => String::new(),
                        (false, true) => format!("after {}: ", died_text(&in_dead)),
                        (true, false) => format!("after {}: ", failed_text(&in_failed)),
                        (false, false) => format!("after {}, {}: ", died_text(&in_dead), failed_text(&in_failed)),
                    };
                    reasons.push(LostReason {
                        events: c.lost,
                        reason: format!("triggered but not built: {place}{aborted}the event manager says: {why}"),
                    });
                }
            }
            None => {
                triggered = None;
                rejected = None;
                let last = t.last_stats.trigger.clone().unwrap_or_default();
                unknown.push(format!(
                    "the event manager `{}` {}: events it triggered after its last report (triggered {}, built {}) \
                     cannot be accounted, so events triggered but not built are unknown",
                    t.name,
                    t.died.as_ref().map_or("gave no summary".into(), |w| format!("died ({w})")),
                    last.triggered,
                    last.built,
                ));
            }
        }
    }
    let builders = of(Role::Builder);
    let built_by_builders: u64 = builders.iter().map(|b| b.counted().0).sum();
    let built = if has(Role::Trigger) && trigger_dead.is_empty() && triggers.iter().all(|t| t.summary.is_some()) {
        built_by_trigger
    } else {
        built_by_builders.max(built_by_trigger)
    };

    // Recorded: the recorders' files on disk.
    let recorders = of(Role::Recorder);
    let (mut recorded, mut recorded_bytes) = (0u64, 0u64);
    for r in &recorders {
        let mine: Vec<&FileRecord> = files.iter().filter(|f| f.component == r.name).collect();
        if !mine.is_empty() {
            recorded += mine.iter().map(|f| f.events).sum::<u64>();
            recorded_bytes += mine.iter().map(|f| f.bytes).sum::<u64>();
        } else {
            // No file found: what it said.
            let (e, b) = r.counted();
            recorded += e;
            recorded_bytes += b;
        }
    }
    let (not_recorded, duplicates) =
        if recorders.is_empty() { (0, 0) } else { (built.saturating_sub(recorded), recorded.saturating_sub(built)) };
    if not_recorded > 0 {
        let (buffer_dead, rec_dead, builder_dead) = (dead(Role::Buffer), dead(Role::Recorder), dead(Role::Builder));
        let place = if !buffer_dead.is_empty() {
            format!("in the ET system that died or on their way to it ({})", died_text(&buffer_dead))
        } else if !rec_dead.is_empty() {
            format!(
                "left in ET or in the memory of the recorder that died ({}); none of its files holds them",
                died_text(&rec_dead)
            )
        } else if !builder_dead.is_empty() {
            format!("in ET or in a builder unit that died ({})", died_text(&builder_dead))
        } else if !failed(Role::Recorder).is_empty() {
            format!(
                "left in ET by the recorders that failed ({}); none of their files holds them",
                failed_text(&failed(Role::Recorder))
            )
        } else if let Some(full) = recorders.iter().find_map(|r| r.disk_full()) {
            format!("still in ET, with no room for them: {full}")
        } else {
            format!("still in ET when the recorders ({}) stopped draining", names(&recorders))
        };
        reasons.push(LostReason { events: not_recorded, reason: format!("built but not recorded: {place}") });
    }
    if !has(Role::Trigger) && !dead(Role::Builder).is_empty() {
        unknown.push(format!(
            "without an event manager, events the builder units that died ({}) built after their last report cannot be counted",
            names(&dead(Role::Builder))
        ));
    }
    let lost: u64 = reasons.iter().map(|r| r.events).sum();
    let died = components
        .iter()
        .filter_map(|c| {
            c.died.as_ref().map(|why| Died { component: c.name.clone(), kind: c.kind.clone(), why: why.clone() })
        })
        .collect();
    let bytes = if recorders.is_empty() { builders.iter().map(|b| b.counted().1).sum() } else { recorded_bytes };
    Accounting {
        triggered,
        rejected,
        events: built,
        recorded,
        bytes,
        lost,
        lost_reasons: reasons,
        accounting_complete: unknown.is_empty(),
        unknown,
        lost_in_builder,
        not_recorded,
        duplicates,
        died,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_component::TriggerCounts;

    fn file(component: &str, events: u64, complete: bool) -> FileRecord {
        FileRecord {
            component: component.into(),
            path: format!("/d/run000001_{component}_0001.daq").into(),
            events,
            bytes: events * 10,
            first_event: Some(1),
            last_event: Some(events),
            complete,
        }
    }

    fn trigger(triggered: u64, built: u64, lost: u64) -> Stats {
        Stats::counted(triggered, 0).with_trigger(TriggerCounts { triggered, built, lost, ..Default::default() })
    }

    #[test]
    fn file_names_belong_to_their_writer_and_its_restarted_lives_only() {
        for (f, ok) in [
            ("run000007_recorder_0001.daq", true),
            ("run000007_recorder_0002.daq.part", true),
            ("run000007_recorder.r1_0001.daq", true),
            ("run000007_bu-0-t1_0001.daq", false),
            ("run000007_recorder_0001.daq.tmp", false),
            ("run000007_recorder2_0001.daq", false),
            ("run000008_recorder_0001.daq", false),
            ("run000007_recorder.meta.json", false),
            ("run000007_recorder.rx_0001.daq", false),
        ] {
            assert_eq!(is_file_of(f, 7, "recorder"), ok, "{f}");
        }
        assert!(is_file_of("run000007_bu-0-t1_0001.daq", 7, "bu-0"));
    }

    #[test]
    fn a_dead_recorder_is_counted_from_its_files_and_the_rest_is_lost_with_the_reason() {
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, trigger(100, 100, 0));
        let rec = ComponentRun::dead("rec", "recorder", Role::Recorder, "signal: 9 (SIGKILL)", Stats::counted(70, 0));
        let a = account(&[evm, rec], &[file("rec", 60, false)]);
        assert_eq!((a.events, a.recorded, a.lost, a.not_recorded), (100, 60, 40, 40));
        let reason = &a.lost_reasons[0].reason;
        assert!(reason.contains("recorder that died") && reason.contains("SIGKILL"), "{reason}");
        assert!(a.accounting_complete);
        assert_eq!(a.died[0].component, "rec");
    }

    #[test]
    fn events_a_throttled_recorder_had_no_room_for_name_its_disk() {
        let mut counts = TriggerCounts { triggered: 100, built: 90, lost: 10, ..Default::default() };
        counts.lost_reasons.insert("BU 0 did not confirm them before the drain timeout".into(), 10);
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, Stats::counted(100, 0).with_trigger(counts));
        let detail = serde_json::json!({
            "throttled": true, "throttled_for_s": 21.4, "disk_free_bytes": 2u64 << 20, "disk_used_pct": 91.7
        });
        let held = Stats { detail, ..Stats::counted(60, 0) };
        let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, held).with_data(Path::new("/data/run"));
        let a = account(&[evm, rec], &[file("rec", 60, true)]);
        assert_eq!((a.lost_in_builder, a.not_recorded, a.lost), (10, 30, 40));
        for r in &a.lost_reasons {
            assert!(
                r.reason.contains("the disk of `rec` (/data/run) is full") && r.reason.contains("for 21 s"),
                "{r:?}"
            );
            assert!(r.reason.contains("2.0 MiB free, 91.7 % used"), "{r:?}");
        }
        // Not throttled at the end: the disk is not blamed.
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, trigger(100, 100, 0));
        let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, Stats::counted(90, 0));
        let a = account(&[evm, rec.with_data(Path::new("/data/run"))], &[file("rec", 90, true)]);
        assert!(a.lost_reasons[0].reason.contains("stopped draining"), "{:?}", a.lost_reasons);
    }

    #[test]
    fn a_dead_event_manager_makes_triggered_unknown_and_says_so() {
        let evm = ComponentRun::dead("evm", "evm", Role::Trigger, "signal: 9 (SIGKILL)", trigger(50, 40, 0));
        let bu = ComponentRun::survived("bu-0", "bu", Role::Builder, Stats::counted(45, 0));
        let mut bu1 = ComponentRun::survived("bu-1", "bu", Role::Builder, Stats::counted(5, 0));
        bu1.earlier.push(Stats::counted(10, 0));
        let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, Stats::default());
        let a = account(&[evm, bu, bu1, rec], &[file("rec", 58, true)]);
        assert_eq!(a.triggered, None);
        assert_eq!((a.events, a.recorded, a.lost), (60, 58, 2));
        assert!(!a.accounting_complete);
        assert!(a.unknown[0].contains("`evm` died") && a.unknown[0].contains("triggered 50, built 40"), "{a:?}");
    }

    #[test]
    fn the_event_managers_losses_after_an_abort_name_the_dead_readout_unit() {
        let mut counts = TriggerCounts { triggered: 100, built: 90, lost: 10, ..Default::default() };
        counts.lost_reasons.insert("not assigned before the drain timeout".into(), 10);
        counts.error = Some("RU 0 lost: closed".into());
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, Stats::counted(100, 0).with_trigger(counts));
        let ru = ComponentRun::dead("ru-0", "ru", Role::Readout, "signal: 9 (SIGKILL)", Stats::default());
        let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, Stats::default());
        let a = account(&[evm, ru, rec], &[file("rec", 90, true)]);
        assert_eq!((a.lost, a.lost_in_builder), (10, 10));
        let reason = &a.lost_reasons[0].reason;
        assert!(reason.contains("`ru-0` died") && reason.contains("RU 0 lost"), "{reason}");
        assert_eq!(a.triggered, Some(a.events + a.lost));
    }

    #[test]
    fn kinds_count_by_their_role_not_their_name() {
        // A builder of a kind the accounting has never heard of counts as a builder.
        let b = ComponentRun::survived("hlt-0", "my-builder", Role::Builder, Stats::counted(12, 1200));
        let other = ComponentRun::survived("mon", "bu", Role::Other, Stats::counted(1000, 0));
        let a = account(&[b, other], &[]);
        assert_eq!((a.events, a.bytes), (12, 1200));
    }

    #[test]
    fn a_recorder_that_failed_on_a_full_disk_names_its_error_for_what_it_did_not_record() {
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, trigger(100, 100, 0));
        let rec = ComponentRun::survived("rec", "recorder", Role::Recorder, Stats::counted(70, 0))
            .failed("disk full: writing into /data (0.0 MiB free of 64.0 MiB (100.0 % used))");
        let a = account(&[evm, rec], &[file("rec", 60, false)]);
        assert_eq!((a.events, a.recorded, a.lost, a.not_recorded), (100, 60, 40, 40));
        let reason = &a.lost_reasons[0].reason;
        assert!(reason.contains("`rec` failed (disk full: writing into /data"), "{reason}");
        assert!(a.accounting_complete);
    }

    #[test]
    fn the_event_managers_losses_name_a_builder_unit_that_failed_on_a_full_disk() {
        let mut counts = TriggerCounts { triggered: 50, built: 40, lost: 10, ..Default::default() };
        counts.lost_reasons.insert("no builder unit left to build them".into(), 10);
        let evm = ComponentRun::survived("evm", "evm", Role::Trigger, Stats::counted(50, 0).with_trigger(counts));
        let bu = ComponentRun::survived("bu-0", "bu", Role::Builder, Stats::counted(45, 0)).failed("disk full: …");
        let a = account(&[evm, bu], &[]);
        assert_eq!((a.lost, a.lost_in_builder), (10, 10));
        let reason = &a.lost_reasons[0].reason;
        assert!(reason.contains("after `bu-0` failed (disk full: …)"), "{reason}");
    }
}
