//! The ET system's standard components in one process, driven through the component state
//! machine: an `et` system, a `recorder` and a `monitor` take a run of built events, and each
//! reports them in its statistics and its stop summary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use daqflow_component::{Driver, Registry, Role, State, Stats};
use daqflow_et::components::monitor::MonitorDetail;
use daqflow_et::components::recorder::RecorderDetail;
use daqflow_et::components::system::EtDetail;
use daqflow_et::{Attachment, EtClient, GRAND_CENTRAL, Wait};
use daqflow_wire::{Event, EventFlags, EventId, EventInfo, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags};

/// The ET system's kinds, as the `daqflow` binary registers them.
fn standard() -> Registry {
    let mut r = Registry::new();
    r.add(daqflow_et::components::system::kind())
        .add(daqflow_et::components::recorder::kind())
        .add(daqflow_et::components::monitor::kind());
    r
}

fn table(s: &str) -> toml::Table {
    s.parse().unwrap()
}

/// A built event of `sources` fragments of 100 bytes each.
fn built_event(id: u64, sources: u32) -> bytes::Bytes {
    let frags: Vec<Fragment> = (0..sources)
        .map(|src| {
            let info = FragmentInfo { source_id: src, event_id: EventId(id), run_number: 1, ..Default::default() };
            Fragment::parse(Fragment::encode(&info, &[7u8; 100])).unwrap()
        })
        .collect();
    let sf =
        SuperFragment::parse(SuperFragment::assemble(0, EventId(id), SuperFragmentFlags::default(), &frags)).unwrap();
    let info =
        EventInfo { event_id: EventId(id), run_number: 1, bu_id: 0, flags: EventFlags::empty(), ..Default::default() };
    Event::assemble(&info, &[sf])
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn detail<T: serde::de::DeserializeOwned>(s: &Stats) -> T {
    s.detail_as().unwrap_or_else(|| panic!("not the kind's detail: {s:?}"))
}

#[test]
fn et_recorder_and_monitor_report_a_run_in_their_stats_and_summaries() {
    let et_name = format!("et-components-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("daqflow-et-components-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let mut et =
        Driver::new(standard(), "et", "et", table(&format!("name = '{et_name}'\nevents = 64\nevent_size = 4096")));
    et.configure(None).unwrap();
    let recorder_keys = format!("et = '{et_name}'\ndirectory = '{}'\ndrain_ms = 100", dir.display());
    let mut recorder = Driver::new(standard(), "recorder", "rec", table(&recorder_keys));
    let info = recorder.configure(None).unwrap();
    assert_eq!(info["directory"].as_str().map(PathBuf::from), Some(dir.clone()));
    let mut monitor = Driver::new(standard(), "monitor", "mon", table(&format!("et = '{et_name}'\ncue = 1000")));
    monitor.configure(None).unwrap();
    for d in [&mut et, &mut recorder, &mut monitor] {
        d.start(1).unwrap();
    }

    let client = EtClient::connect(&et_name).unwrap();
    let producer = client.attach(GRAND_CENTRAL).unwrap();
    let n = 50u64;
    let mut bytes = 0;
    for id in 1..=n {
        let data = if id == n { bytes::Bytes::from_static(b"not a built event") } else { built_event(id, 2) };
        bytes += data.len() as u64;
        let mut events = producer.new_events(1, data.len(), Wait::Sleep).unwrap();
        events[0].write(&data).unwrap();
        producer.put_events(&mut events).unwrap();
    }
    wait_until("the recorder has every event", || recorder.stats().events == n);
    assert_eq!(et.stats().events, n);
    let live = recorder.stats();
    assert_eq!((live.bytes, detail::<RecorderDetail>(&live).files), (bytes, None), "{live:?}");

    let summaries: Vec<Stats> = [&mut et, &mut recorder, &mut monitor].map(|d| d.stop(None).unwrap()).into();
    let [et_summary, rec, mon] = &summaries[..] else { unreachable!() };
    for d in [&et, &recorder, &monitor] {
        assert_eq!(d.state(), State::Configured, "{}: {:?}", d.name(), d.failure());
    }

    // The ET system: every event put through, no bytes counted, the snapshot.
    assert_eq!((et_summary.events, et_summary.bytes), (n, 0), "{et_summary:?}");
    let snapshot = detail::<EtDetail>(et_summary).snapshot.unwrap();
    assert_eq!(snapshot.stations.iter().find(|s| s.name == "rec").map(|s| s.events_out), Some(n));

    // The recorder: every event, its files and metadata.
    assert_eq!((rec.events, rec.bytes), (n, bytes), "{rec:?}");
    assert!(rec.events_per_s > 0.0 && rec.mb_per_s > 0.0, "{rec:?}");
    let d: RecorderDetail = detail(rec);
    assert_eq!((d.bad_events, d.possibly_corrupt), (1, 0), "{d:?}");
    assert!(d.started_ms.is_some() && d.stopped_ms >= d.started_ms, "{d:?}");
    let files = d.files.unwrap();
    assert_eq!(files.iter().map(|f| f.events).sum::<u64>(), n);
    let meta = d.metadata.unwrap();
    assert!(meta.starts_with(&dir) && meta.ends_with("run000001_rec.meta.json"), "{meta:?}");
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    assert_eq!((written["run"].as_u64(), written["events"].as_u64()), (Some(1), Some(n)), "{written}");

    // The monitor: the events it looked at (all: its cue is larger than the run) and its
    // histograms.
    assert_eq!((mon.events, mon.bytes), (n, bytes), "{mon:?}");
    let d: MonitorDetail = detail(mon);
    assert_eq!(d.bad_events, 1);
    let names: Vec<&str> = d.histograms.iter().map(|h| h.name()).collect();
    assert_eq!(names, ["event_size", "fragment_size_src0", "fragment_size_src1", "rate"]);
    assert_eq!(d.histograms[0].entries(), n);
    assert_eq!(d.histograms[3].entries(), n);
    // The mean event size is the true one (the bytes looked at per event), not the bins'.
    let mean = d.histograms[0].mean().unwrap();
    assert!((mean - bytes as f64 / n as f64).abs() < 1e-6, "{mean} for {bytes} bytes in {n} events");
    assert!(d.histograms[3].mean().is_some_and(|m| m > 0.0), "{:?}", d.histograms[3]);

    drop((producer, client));
    for d in [&mut monitor, &mut recorder, &mut et] {
        d.reset().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_kinds_have_the_roles_stages_and_data_files_of_the_system_file() {
    let r = standard();
    let k = |name: &str| {
        let k = r.kind(name).unwrap();
        (k.role, k.start_stage, k.stop_stage)
    };
    assert_eq!(k("et"), (Role::Buffer, 1, 6));
    assert_eq!(k("recorder"), (Role::Recorder, 2, 5));
    assert_eq!(k("monitor"), (Role::Other, 2, 5));
    let data_files = r.kind("recorder").unwrap().data_files.unwrap();
    assert_eq!(data_files(&table("et = 'daq'\ndirectory = 'data/rec'")), Some(PathBuf::from("data/rec")));
    assert_eq!(data_files(&table("et = 'daq'")), None);
    assert!(r.kind("et").unwrap().data_files.is_none() && r.kind("monitor").unwrap().data_files.is_none());
}

/// A recorder throttled by its disk from the start (its high mark below the disk's usage) takes
/// nothing from its station; told `drain_into_reserve = true` (what the operator does when the
/// run stops while it is throttled), it writes what waits into the space above its high mark,
/// throttled still; the key is refused in the configuration and cannot be taken back in the run.
#[test]
fn a_throttled_recorder_told_to_drain_into_its_reserve_writes_what_waits() {
    let et_name = format!("et-reserve-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("daqflow-et-reserve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A high mark below the disk's usage, by a quarter of the space free: throttled from the
    // start, and half the space above the mark (up to `(high + 100) / 2`, above the usage)
    // holds far more than a few events.
    let used = daqflow_wire::file::DiskSpace::of(&dir).unwrap().used_pct();
    let high = used - (100.0 - used) / 4.0;
    if high < 2.0 {
        println!("skipped: the disk of {} is {used:.1} % used, too little for a high mark below it", dir.display());
        return;
    }
    let mut et =
        Driver::new(standard(), "et", "et", table(&format!("name = '{et_name}'\nevents = 64\nevent_size = 4096")));
    et.configure(None).unwrap();
    let keys = format!(
        "et = '{et_name}'\ndirectory = '{}'\ndrain_ms = 100\nthrottle_high_pct = {high}\nthrottle_low_pct = {}",
        dir.display(),
        high / 2.0
    );
    let refused = Driver::new(standard(), "recorder", "rec", table(&format!("{keys}\ndrain_into_reserve = true")))
        .configure(None)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("`drain_into_reserve` is set live in a run"), "{refused}");
    let mut recorder = Driver::new(standard(), "recorder", "rec", table(&keys));
    recorder.configure(None).unwrap();
    let e = recorder.set("drain_into_reserve", &serde_json::json!(true)).unwrap_err().to_string();
    assert!(e.contains("Running") && e.contains("Paused"), "live in a run only: {e}");
    et.start(1).unwrap();
    recorder.start(1).unwrap();
    wait_until("the recorder throttles", || detail::<RecorderDetail>(&recorder.stats()).throttled);

    let client = EtClient::connect(&et_name).unwrap();
    let producer = client.attach(GRAND_CENTRAL).unwrap();
    let n = 20u64;
    for id in 1..=n {
        let data = built_event(id, 2);
        let mut events = producer.new_events(1, data.len(), Wait::Sleep).unwrap();
        events[0].write(&data).unwrap();
        producer.put_events(&mut events).unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(recorder.stats().events, 0, "written while throttled");

    recorder.set("drain_into_reserve", &serde_json::json!(true)).unwrap();
    wait_until("the recorder wrote what waited", || recorder.stats().events == n);
    assert!(detail::<RecorderDetail>(&recorder.stats()).throttled, "it drains throttled still");
    let e = recorder.set("drain_into_reserve", &serde_json::json!(false)).unwrap_err().to_string();
    assert!(e.contains("cannot be taken back in the run"), "{e}");
    let rec = recorder.stop(None).unwrap();
    assert_eq!(rec.events, n, "{rec:?}");
    assert_eq!(detail::<RecorderDetail>(&rec).files.unwrap().iter().map(|f| f.events).sum::<u64>(), n);
    // The next run starts without the reserve: throttled, it writes nothing.
    recorder.start(2).unwrap();
    let data = built_event(n + 1, 2);
    let mut events = producer.new_events(1, data.len(), Wait::Sleep).unwrap();
    events[0].write(&data).unwrap();
    producer.put_events(&mut events).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(recorder.stats().events, 0, "written while throttled in the next run");

    drop((producer, client));
    for d in [&mut recorder, &mut et] {
        d.reset().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
