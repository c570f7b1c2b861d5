//! The event builder as real processes (`daqflow evb local`: a generated system file run by the
//! operator): every event checked in the output files, a BU killed with SIGKILL mid-run with no
//! event lost, a corrupted fragment flagged, a BU joining mid-run, and an RU death stopping the
//! run with a clear error instead of a hang. The counts read are the operator's `RunSummary`
//! (`run` in the JSON summary) and its components' stop summaries.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daqflow_evb::model::check_pattern;
use daqflow_wire::file::{FileReader, ScanItem};
use daqflow_wire::{Event, EventFlags};
use serde_json::Value;

/// Runs `daqflow evb local ARGS --json`; the summary and the exit status. The operator's data
/// (logs, run database) go to a directory of the test's, removed afterwards.
fn evb_local(args: &[&str]) -> (Value, bool, Duration) {
    let data = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["evb", "local", "--json", "--data"])
        .arg(data.path())
        .args(args)
        .output()
        .expect("run daqflow evb local");
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON summary ({e}):\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (summary, out.status.success(), took)
}

/// A component's stop summary in the operator's run summary.
fn summary<'a>(s: &'a Value, name: &str) -> &'a Value {
    &s["run"]["components"][name]["summary"]
}

/// The run's last event, by the EVM's summary.
fn last_event(s: &Value) -> u64 {
    summary(s, "evm")["detail"]["last_event"].as_u64().unwrap_or_else(|| panic!("no last event: {s:#}"))
}

/// Every event in every data file (finished or `.part`) of `dir`: id → (copies, flags), after
/// checking each event's structure, ids, CRCs and payload patterns (unless flagged).
fn events_in(dir: &Path) -> BTreeMap<u64, (u32, EventFlags)> {
    let mut seen: BTreeMap<u64, (u32, EventFlags)> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let reader = FileReader::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for item in reader.scan() {
            let Ok(ScanItem::Record(r)) = item else { continue };
            let ev = Event::parse(r.payload.clone()).unwrap();
            let id = ev.header().event_id.0;
            let check = ev.check().unwrap();
            if ev.header().flags == EventFlags::empty() {
                assert!(check.is_clean(), "event {id} in {}: {check:?}", path.display());
                for sf in ev.super_fragments() {
                    for f in sf.unwrap().fragments() {
                        let f = f.unwrap();
                        let src = f.header().source_id;
                        assert_eq!(check_pattern(f.payload_slice(), id, src), Ok(()), "event {id} source {src}");
                    }
                }
            }
            let e = seen.entry(id).or_insert((0, EventFlags::empty()));
            e.0 += 1;
            e.1 = ev.header().flags;
        }
    }
    seen
}

#[test]
fn two_rus_two_bus_four_streams_every_event_checked_in_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (s, ok, _) = evb_local(&[
        "--rus",
        "2",
        "--bus",
        "2",
        "--streams",
        "4",
        "--seconds",
        "3",
        "--size",
        "uniform:200:3000",
        "--output",
        out,
    ]);
    assert!(ok, "{s:#}");
    assert_eq!(s["lost"], 0);
    let last = last_event(&s);
    assert!(last > 1000, "only {last} events in 3 s");
    assert_eq!(s["run"]["events"].as_u64(), Some(last), "the operator's events built");
    assert_eq!(summary(&s, "evm")["trigger"]["built"].as_u64(), Some(last));
    let seen = events_in(dir.path());
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (1..=last).collect::<Vec<_>>(), "every event, in a file");
    assert!(seen.values().all(|(n, f)| *n == 1 && *f == EventFlags::empty()), "once each, clean");
    let per_bu: Vec<u64> = ["bu-0", "bu-1"].iter().map(|b| summary(&s, b)["events"].as_u64().unwrap()).collect();
    assert_eq!(per_bu.iter().sum::<u64>(), last);
    assert!(per_bu.iter().all(|&n| n > 0), "both BUs built: {per_bu:?}");
}

#[test]
fn a_bu_killed_mid_run_loses_no_event() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (s, ok, _) = evb_local(&[
        "--rus",
        "2",
        "--bus",
        "2",
        "--streams",
        "2",
        "--seconds",
        "4",
        "--rate",
        "4000",
        "--kill",
        "bu-1@1.5",
        "--output",
        out,
    ]);
    assert!(ok, "{s:#}");
    assert_eq!(s["lost"], 0, "{s:#}");
    assert_eq!(s["killed"][0], "bu-1");
    assert_eq!(s["run"]["died"][0]["component"], "bu-1", "{s:#}");
    let last = last_event(&s);
    assert!(
        summary(&s, "evm")["detail"]["reassigned"].as_u64().unwrap() > 0,
        "the dead BU's events were re-assigned: {s:#}"
    );
    // Every event is in a file: the survivor's, or the killed BU's (flushed before it died).
    // An event the killed BU had written but not yet confirmed is in both: at least once.
    let seen = events_in(dir.path());
    let missing: Vec<u64> = (1..=last).filter(|id| !seen.contains_key(id)).collect();
    assert!(missing.is_empty(), "events missing from every file: {missing:?}");
}

#[test]
fn a_corrupted_fragment_is_detected_and_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (s, _, _) = evb_local(&[
        "--rus",
        "1",
        "--bus",
        "1",
        "--streams",
        "3",
        "--seconds",
        "2",
        "--rate",
        "2000",
        "--corrupt",
        "1:100",
        "--output",
        out,
    ]);
    assert_eq!(s["lost"], 0, "{s:#}");
    assert_eq!(summary(&s, "ru-0")["detail"]["counters"]["crc_errors"], 1, "the RU saw it: {s:#}");
    assert_eq!(summary(&s, "bu-0")["detail"]["events_flagged"], 1, "the BU flagged it: {s:#}");
    let seen = events_in(dir.path());
    assert!(seen[&100].1.contains(EventFlags::CRC_ERROR), "event 100 is flagged in the file");
    assert!(seen.iter().filter(|(id, _)| **id != 100).all(|(_, (_, f))| *f == EventFlags::empty()));
}

#[test]
fn a_bu_joining_mid_run_receives_events() {
    let (s, ok, _) = evb_local(&[
        "--rus",
        "1",
        "--bus",
        "1",
        "--streams",
        "2",
        "--seconds",
        "3",
        "--rate",
        "3000",
        "--join-bu",
        "1",
    ]);
    assert!(ok, "{s:#}");
    assert_eq!(s["lost"], 0);
    // bu-0 is the operator's; bu-1 joined as a process of its own, counted by the EVM.
    assert!(summary(&s, "bu-0")["events"].as_u64().unwrap() > 0, "{s:#}");
    let joined = s["joined"].as_array().unwrap();
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0]["name"], "bu-1");
    let late = joined[0]["summary"]["events"].as_u64().unwrap();
    assert!(late > 100, "the late BU built events: {s:#}");
    let built: u64 = summary(&s, "bu-0")["events"].as_u64().unwrap() + late;
    assert_eq!(s["run"]["events"].as_u64(), Some(built), "the EVM counted both BUs' events: {s:#}");
}

#[test]
fn an_ru_death_stops_the_run_with_a_clear_error_not_a_hang() {
    let (s, ok, took) = evb_local(&[
        "--rus",
        "2",
        "--bus",
        "1",
        "--streams",
        "2",
        "--seconds",
        "30",
        "--rate",
        "2000",
        "--kill",
        "ru-1@1",
    ]);
    assert!(!ok, "the run must fail");
    assert!(took < Duration::from_secs(20), "stopped promptly, took {took:?}");
    let errors = s["errors"].to_string();
    assert!(errors.contains("RU 1"), "the error names the RU: {errors}");
}

#[test]
fn an_evm_death_stops_the_run_with_a_clear_error_not_a_hang() {
    let (s, ok, took) = evb_local(&[
        "--rus",
        "1",
        "--bus",
        "1",
        "--streams",
        "2",
        "--seconds",
        "30",
        "--rate",
        "2000",
        "--kill",
        "evm@1",
    ]);
    assert!(!ok, "the run must fail");
    assert!(took < Duration::from_secs(20), "stopped promptly, took {took:?}");
    assert!(s["lost"].is_null(), "no accounting without the EVM: {s:#}");
    let errors = s["errors"].to_string();
    assert!(errors.contains("lost the EVM"), "the RU and BU say why: {errors}");
}

#[test]
fn paced_sources_with_small_or_empty_fragments_keep_the_builder_going() {
    // Found stalled: paced sources never wrote their small fragments until the run ended (the
    // transport writes by itself only once a chunk is full): 64 events in 3 s at 1 kHz.
    for size in ["256", "0"] {
        let (s, ok, _) = evb_local(&[
            "--rus",
            "1",
            "--bus",
            "1",
            "--streams",
            "2",
            "--seconds",
            "3",
            "--rate",
            "1000",
            "--fragment-size",
            size,
        ]);
        assert!(ok, "{size} B: {s:#}");
        assert_eq!(s["lost"], 0, "{size} B");
        let last = last_event(&s);
        assert!(last >= 1500, "{size} B: only {last} events at 1 kHz in 3 s");
        assert_eq!(s["run"]["events"].as_u64(), Some(last), "{size} B");
    }
}

#[test]
fn paced_sources_far_behind_the_trigger_drain_every_event_at_the_stop() {
    // The emulated trigger runs up to the BUs' credits (2 × 256) ahead of sources paced at
    // 200 Hz: at the stop the sources still have 2.5 s of events to produce, five times the
    // drain timeout. The drain waits while events are still being built.
    let (s, ok, took) = evb_local(&[
        "--rus",
        "1",
        "--bus",
        "2",
        "--streams",
        "2",
        "--rate",
        "200",
        "--seconds",
        "2",
        "--credits",
        "256",
        "--set",
        "evm.drain_timeout_ms=500",
    ]);
    assert!(ok, "{s:#}");
    let run = &s["run"];
    assert_eq!(run["lost"], 0, "{run:#}");
    assert_eq!(run["triggered"], run["events"], "{run:#}");
    assert!(run["triggered"].as_u64().unwrap() > 600, "the trigger ran ahead of the sources: {run:#}");
    assert!(took < Duration::from_secs(60), "{took:?}");
}
