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
//!   were when the run ended). `built = recorded − duplicates + not_recorded` and `triggered =
//!   built + rejected + lost_in_builder` hold wherever the numbers are known; `unknown` says
//!   plainly what cannot be known, and `accounting_complete` is false then.
//!
//! ```
//! use daqflow_runcontrol::accounting::{account, ComponentRun, FileRecord};
//! use serde_json::json;
//! let evm = ComponentRun::survived("evm", "evm", json!({"triggered": 10, "built": 10, "rejected": 0, "lost": 0}));
//! let rec = ComponentRun::survived("rec", "recorder", json!({"events": 10, "bytes": 100, "files": []}));
//! let files = vec![FileRecord { component: "rec".into(), path: "/d/run000001_rec_0001.daq".into(), events: 8,
//!     bytes: 80, first_event: Some(1), last_event: Some(8), complete: true }];
//! let a = account(&[evm, rec], &files);
//! assert_eq!((a["events"].as_u64(), a["recorded"].as_u64(), a["lost"].as_u64()), (Some(10), Some(8), Some(2)));
//! assert_eq!(a["accounting_complete"], true);
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// What the operator knows of one component at the end of a run.
#[derive(Debug, Clone, Default)]
pub struct ComponentRun {
    /// The component's name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its stop summary, when it was stopped (it survived, or was restarted and stopped).
    pub summary: Option<Value>,
    /// The last statistics it published (used when it gave no summary).
    pub last_stats: Value,
    /// The last statistics of its earlier lives in this run (it was restarted).
    pub earlier: Vec<Value>,
    /// Why it ended the run dead (its process ended and was not started again), if it did.
    pub died: Option<String>,
}

impl ComponentRun {
    /// A component that was stopped and gave `summary`.
    pub fn survived(name: &str, kind: &str, summary: Value) -> ComponentRun {
        ComponentRun { name: name.into(), kind: kind.into(), summary: Some(summary), ..ComponentRun::default() }
    }

    /// A component whose process died (`why`) after publishing `last_stats`.
    pub fn dead(name: &str, kind: &str, why: &str, last_stats: Value) -> ComponentRun {
        ComponentRun { name: name.into(), kind: kind.into(), last_stats, died: Some(why.into()), ..Default::default() }
    }

    /// A counter over the component's whole run: its summary's (or, dead, its last
    /// statistics') value plus its earlier lives'.
    fn counter(&self, key: &str) -> u64 {
        let now = self.summary.as_ref().unwrap_or(&self.last_stats);
        let earlier: u64 = self.earlier.iter().map(|v| v[key].as_u64().unwrap_or(0)).sum();
        now[key].as_u64().unwrap_or(0).saturating_add(earlier)
    }
}

/// One data file of the run as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    /// The component that wrote it.
    pub component: String,
    /// Its path.
    pub path: PathBuf,
    /// Whole event records in it.
    pub events: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The first event id in it.
    pub first_event: Option<u64>,
    /// The last event id in it.
    pub last_event: Option<u64>,
    /// Closed properly (a trailer); false for a `.part` file whose writer died.
    pub complete: bool,
}

impl FileRecord {
    /// The file as JSON (the run summary's `files` entries).
    pub fn to_json(&self) -> Value {
        json!({
            "component": self.component,
            "path": self.path,
            "events": self.events,
            "bytes": self.bytes,
            "first_event": self.first_event,
            "last_event": self.last_event,
            "complete": self.complete,
        })
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

/// The accounting of a run (see the module documentation for each key): `triggered`,
/// `rejected`, `events`, `recorded`, `bytes`, `lost`, `lost_reasons` (`[{"events", "reason"}]`),
/// `unknown` (texts), `accounting_complete`, `lost_in_builder`, `not_recorded`, `duplicates`,
/// `died` (`[{"component", "kind", "why"}]`) and `files`.
pub fn account(components: &[ComponentRun], files: &[FileRecord]) -> Value {
    let of = |kind: &str| -> Vec<&ComponentRun> { components.iter().filter(|c| c.kind == kind).collect() };
    let has = |kind: &str| !of(kind).is_empty();
    let mut reasons: Vec<(u64, String)> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let dead = |kind: &str| of(kind).into_iter().filter(|c| c.died.is_some()).collect::<Vec<_>>();
    let names = |cs: &[&ComponentRun]| cs.iter().map(|c| format!("`{}`", c.name)).collect::<Vec<_>>().join(", ");
    let died_text = |cs: &[&ComponentRun]| {
        cs.iter()
            .map(|c| format!("`{}` died ({})", c.name, c.died.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(", ")
    };

    // Triggered, rejected and built: the event manager's accounting, while it lived.
    let evms = of("evm");
    let evm_dead = dead("evm");
    let (mut triggered, mut rejected, mut lost_in_builder) = (Some(0u64), Some(0u64), 0u64);
    let mut built_by_evm = 0u64;
    for evm in &evms {
        match &evm.summary {
            Some(s) => {
                triggered = triggered.map(|t| t + s["triggered"].as_u64().unwrap_or(0));
                rejected = rejected.map(|r| r + s["rejected"].as_u64().unwrap_or(0));
                built_by_evm += s["built"].as_u64().unwrap_or(0);
                let lost = s["lost"].as_u64().unwrap_or(0);
                lost_in_builder += lost;
                if lost > 0 {
                    let why = s["lost_reasons"]
                        .as_object()
                        .map(|m| m.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join("; "))
                        .unwrap_or_default();
                    let aborted =
                        s["error"].as_str().map(|e| format!("the run was aborted ({e}); ")).unwrap_or_default();
                    let in_dead: Vec<&ComponentRun> = components
                        .iter()
                        .filter(|c| c.died.is_some() && matches!(c.kind.as_str(), "ru" | "source" | "bu"))
                        .collect();
                    let place =
                        if in_dead.is_empty() { String::new() } else { format!("after {}: ", died_text(&in_dead)) };
                    reasons.push((
                        lost,
                        format!("triggered but not built: {place}{aborted}the event manager says: {why}"),
                    ));
                }
            }
            None => {
                triggered = None;
                rejected = None;
                unknown.push(format!(
                    "the event manager `{}` {}: events it triggered after its last report (triggered {}, built {}) \
                     cannot be accounted, so events triggered but not built are unknown",
                    evm.name,
                    evm.died.as_ref().map_or("gave no summary".into(), |w| format!("died ({w})")),
                    evm.last_stats["triggered"].as_u64().unwrap_or(0),
                    evm.last_stats["built"].as_u64().unwrap_or(0),
                ));
            }
        }
    }
    let built_by_bus: u64 = of("bu").iter().map(|b| b.counter("events_built")).sum();
    let built = if has("evm") && evm_dead.is_empty() && evms.iter().all(|e| e.summary.is_some()) {
        built_by_evm
    } else {
        built_by_bus.max(built_by_evm)
    };

    // Recorded: the recorders' files on disk.
    let recorders = of("recorder");
    let mut recorded = 0u64;
    let mut recorded_bytes = 0u64;
    for r in &recorders {
        let mine: Vec<&FileRecord> = files.iter().filter(|f| f.component == r.name).collect();
        if !mine.is_empty() {
            recorded += mine.iter().map(|f| f.events).sum::<u64>();
            recorded_bytes += mine.iter().map(|f| f.bytes).sum::<u64>();
        } else {
            // No file found: what it said.
            recorded += r.counter("events");
            recorded_bytes += r.counter("bytes");
        }
    }
    let (not_recorded, duplicates) =
        if recorders.is_empty() { (0, 0) } else { (built.saturating_sub(recorded), recorded.saturating_sub(built)) };
    if not_recorded > 0 {
        let (et_dead, rec_dead, bu_dead) = (dead("et"), dead("recorder"), dead("bu"));
        let place = if !et_dead.is_empty() {
            format!("in the ET system that died or on their way to it ({})", died_text(&et_dead))
        } else if !rec_dead.is_empty() {
            format!(
                "left in ET or in the memory of the recorder that died ({}); none of its files holds them",
                died_text(&rec_dead)
            )
        } else if !bu_dead.is_empty() {
            format!("in ET or in a builder unit that died ({})", died_text(&bu_dead))
        } else {
            format!("still in ET when the recorders ({}) stopped draining", names(&recorders))
        };
        reasons.push((not_recorded, format!("built but not recorded: {place}")));
    }
    if !has("evm") && !dead("bu").is_empty() {
        unknown.push(format!(
            "without an event manager, events the builder units that died ({}) built after their last report cannot be counted",
            names(&dead("bu"))
        ));
    }
    let lost: u64 = reasons.iter().map(|(n, _)| n).sum();
    let died: Vec<Value> = components
        .iter()
        .filter(|c| c.died.is_some())
        .map(|c| json!({"component": c.name, "kind": c.kind, "why": c.died}))
        .collect();
    let bytes = if recorders.is_empty() { of("bu").iter().map(|b| b.counter("bytes")).sum() } else { recorded_bytes };
    json!({
        "triggered": triggered,
        "rejected": rejected,
        "events": built,
        "recorded": recorded,
        "bytes": bytes,
        "lost": lost,
        "lost_reasons": reasons.iter().map(|(n, r)| json!({"events": n, "reason": r})).collect::<Vec<_>>(),
        "unknown": unknown,
        "accounting_complete": unknown.is_empty(),
        "lost_in_builder": lost_in_builder,
        "not_recorded": not_recorded,
        "duplicates": duplicates,
        "died": died,
        "files": files.iter().map(FileRecord::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let evm =
            ComponentRun::survived("evm", "evm", json!({"triggered": 100, "built": 100, "rejected": 0, "lost": 0}));
        let rec = ComponentRun::dead("rec", "recorder", "signal: 9 (SIGKILL)", json!({"events": 70}));
        let a = account(&[evm, rec], &[file("rec", 60, false)]);
        assert_eq!(a["events"], 100);
        assert_eq!(a["recorded"], 60);
        assert_eq!(a["lost"], 40);
        assert_eq!(a["not_recorded"], 40);
        let reason = a["lost_reasons"][0]["reason"].as_str().unwrap();
        assert!(reason.contains("recorder that died") && reason.contains("SIGKILL"), "{reason}");
        assert_eq!(a["accounting_complete"], true);
        assert_eq!(a["died"][0]["component"], "rec");
    }

    #[test]
    fn a_dead_event_manager_makes_triggered_unknown_and_says_so() {
        let evm = ComponentRun::dead("evm", "evm", "signal: 9 (SIGKILL)", json!({"triggered": 50, "built": 40}));
        let bu = ComponentRun::survived("bu-0", "bu", json!({"events_built": 45}));
        let mut bu1 = ComponentRun::survived("bu-1", "bu", json!({"events_built": 5}));
        bu1.earlier.push(json!({"events_built": 10}));
        let a =
            account(&[evm, bu, bu1, ComponentRun::survived("rec", "recorder", json!({}))], &[file("rec", 58, true)]);
        assert_eq!(a["triggered"], Value::Null);
        assert_eq!(a["events"], 60);
        assert_eq!(a["recorded"], 58);
        assert_eq!(a["lost"], 2);
        assert_eq!(a["accounting_complete"], false);
        assert!(a["unknown"][0].as_str().unwrap().contains("`evm` died"), "{a}");
    }

    #[test]
    fn the_event_managers_losses_after_an_abort_name_the_dead_readout_unit() {
        let evm = ComponentRun::survived(
            "evm",
            "evm",
            json!({"triggered": 100, "built": 90, "rejected": 0, "lost": 10,
                   "lost_reasons": {"not assigned before the drain timeout": 10}, "error": "RU 0 lost: closed"}),
        );
        let ru = ComponentRun::dead("ru-0", "ru", "signal: 9 (SIGKILL)", json!({}));
        let rec = ComponentRun::survived("rec", "recorder", json!({}));
        let a = account(&[evm, ru, rec], &[file("rec", 90, true)]);
        assert_eq!((a["lost"].as_u64(), a["lost_in_builder"].as_u64()), (Some(10), Some(10)));
        let reason = a["lost_reasons"][0]["reason"].as_str().unwrap();
        assert!(reason.contains("`ru-0` died") && reason.contains("RU 0 lost"), "{reason}");
        assert_eq!(a["triggered"].as_u64(), Some(a["events"].as_u64().unwrap() + a["lost"].as_u64().unwrap()));
    }
}
