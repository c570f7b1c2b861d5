//! The `daqflow` binary end to end: help, version, inspect on good and damaged files, and a
//! quick benchmark writing its table, CSV, JSON and PNG.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use daqflow_wire::file::{FILE_HEADER_LEN, FileWriter, FileWriterConfig, RECORD_HEADER_LEN, record_len};
use daqflow_wire::*;

fn daqflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_daqflow")).args(args).output().expect("run daqflow")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A built event of `streams` fragments of `len` bytes each, in two super-fragments.
fn event(id: u64, streams: u32, len: usize) -> Vec<u8> {
    let frag = |s: u32| {
        let info = FragmentInfo { source_id: s, event_id: EventId(id), run_number: 42, ..Default::default() };
        let payload: Vec<u8> = (0..len).map(|i| (i as u64 + id * 7 + s as u64) as u8).collect();
        Fragment::parse(Fragment::encode(&info, &payload)).unwrap()
    };
    let sfs: Vec<SuperFragment> = (0..2u32)
        .map(|ru| {
            let fr: Vec<Fragment> = (0..streams / 2).map(|s| frag(ru * 100 + s)).collect();
            SuperFragment::parse(SuperFragment::assemble(ru, EventId(id), SuperFragmentFlags::default(), &fr)).unwrap()
        })
        .collect();
    let info = EventInfo { bu_id: 1, event_id: EventId(id), run_number: 42, ..Default::default() };
    Event::assemble(&info, &sfs).to_vec()
}

fn write_run(dir: &Path, events: u64) -> PathBuf {
    let mut cfg = FileWriterConfig::new(dir, 42);
    cfg.sync_on_close = false;
    let mut w = FileWriter::new(cfg).unwrap();
    for i in 0..events {
        w.write_event(EventId(1000 + i), &event(1000 + i, 4, 100 + (i as usize % 7) * 50)).unwrap();
    }
    w.finish().unwrap().remove(0).path
}

#[test]
fn help_lists_every_subcommand_with_examples() {
    let o = daqflow(&["--help"]);
    assert!(o.status.success());
    let t = text(&o);
    for cmd in ["version", "inspect", "bench", "Examples"] {
        assert!(t.contains(cmd), "{cmd} missing from:\n{t}");
    }
    for sub in ["inspect", "bench"] {
        let o = daqflow(&[sub, "--help"]);
        assert!(o.status.success());
        assert!(text(&o).contains("Examples"), "{sub} --help has no examples");
    }
}

#[test]
fn version_names_the_formats() {
    let o = daqflow(&["version"]);
    assert!(o.status.success());
    let t = text(&o);
    assert!(t.contains(env!("CARGO_PKG_VERSION")) && t.contains("data file v1"), "{t}");
}

#[test]
fn inspect_summarizes_and_verifies_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 50);
    let o = daqflow(&["inspect", "--verify", path.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("run 42, file 1"), "{t}");
    assert!(t.contains("events: 50 (event ids 1000 … 1049; first 1000, last 1049 in file order)"), "{t}");
    assert!(t.contains("event size: min"), "{t}");
    assert!(t.contains("closed properly"), "{t}");
    assert!(t.contains("50 events checked fragment by fragment"), "{t}");

    let o = daqflow(&["inspect", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["events"].as_u64(), v["first_event"].as_u64(), v["complete"].as_bool()),
        (Some(50), Some(1000), Some(true))
    );
}

#[test]
fn output_into_a_closed_pipe_ends_the_command_quietly_as_in_a_shell() {
    // `daqflow inspect FILE | head -1`: once `head` has gone, the next write fails. A tool that
    // prints ends by SIGPIPE, as `cat` does, rather than panicking with a backtrace.
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 50);
    for args in [vec!["inspect", path.to_str().unwrap()], vec!["version"]] {
        // The reader has gone before the command starts: its first write fails, however
        // little it prints (a reader dropped after the spawn would race a short output that
        // fits in the pipe's buffer).
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe(2) succeeded, so both descriptors are open and owned by nothing else.
        let (read_end, write_end) = unsafe {
            use std::os::fd::FromRawFd;
            (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1]))
        };
        drop(read_end);
        let child = Command::new(env!("CARGO_BIN_EXE_daqflow"))
            .args(&args)
            .stdout(std::process::Stdio::from(write_end))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{args:?}: {:?} {stderr}", o.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn inspect_reports_first_and_last_in_file_order_and_the_id_range_apart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileWriterConfig::new(dir.path(), 42);
    cfg.sync_on_close = false;
    let mut w = FileWriter::new(cfg).unwrap();
    // As a builder unit writes them: in the order they were built.
    for id in [1005u64, 1001, 1009, 1003] {
        w.write_event(EventId(id), &event(id, 4, 100)).unwrap();
    }
    let path = w.finish().unwrap().remove(0).path;
    let o = daqflow(&["inspect", "--json", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids = ["first_event", "last_event", "min_event", "max_event"].map(|k| v[k].as_u64());
    assert_eq!(ids, [Some(1005), Some(1003), Some(1001), Some(1009)], "{v}");
    let t = text(&daqflow(&["inspect", path.to_str().unwrap()]));
    assert!(t.contains("events: 4 (event ids 1001 … 1009; first 1005, last 1003 in file order)"), "{t}");
}

#[test]
fn inspect_says_a_footer_with_a_bad_crc_is_damaged_and_shows_the_magic_it_compared() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 5);
    let good = std::fs::read(&path).unwrap();
    let mut data = good.clone();
    let at = data.len() - 48 + 8; // the footer's event count; its magic numbers stay
    data[at] ^= 0x01;
    std::fs::write(&path, &data).unwrap();
    let o = daqflow(&["inspect", "--verify", path.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "a damaged trailer is damage: {t}");
    assert!(t.contains("trailer is DAMAGED") && t.contains("footer is damaged: its CRC32C is"), "{t}");
    assert!(!t.contains("not closed"), "{t}");

    let mut data = good;
    data[4..8].copy_from_slice(b"XXXX");
    std::fs::write(&path, &data).unwrap();
    let o = daqflow(&["inspect", path.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains(r#"bad magic 44 51 46 4c 58 58 58 58 ("DQFLXXXX"), expected 44 51 46 4c 46 49 4c 45 ("DQFLFILE")"#),
        "{t}"
    );
}

#[test]
fn inspect_verify_names_the_record_with_a_flipped_payload_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 20);
    let mut data = std::fs::read(&path).unwrap();
    // Flip a byte in the payload of record 7.
    let offset: u64 = FILE_HEADER_LEN as u64
        + (0..7).map(|i| record_len(event(1000 + i, 4, 100 + (i as usize % 7) * 50).len())).sum::<u64>();
    data[(offset + RECORD_HEADER_LEN as u64 + 200) as usize] ^= 0x01;
    std::fs::write(&path, &data).unwrap();
    let o = daqflow(&["inspect", "--verify", path.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("first bad record: 7 (event 1007)"), "{t}");
    assert!(t.contains(&format!("record 7 (event 1007) at offset {offset}: payload CRC32C")), "{t}");
}

#[test]
fn inspect_reads_a_file_cut_short_up_to_its_last_whole_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run(dir.path(), 30);
    let data = std::fs::read(&path).unwrap();
    // Cut in the middle of record 21.
    let offset: u64 = FILE_HEADER_LEN as u64
        + (0..21).map(|i| record_len(event(1000 + i, 4, 100 + (i as usize % 7) * 50).len())).sum::<u64>();
    let cut = dir.path().join("run000042_0001.daq.part");
    std::fs::write(&cut, &data[..offset as usize + 100]).unwrap();
    let o = daqflow(&["inspect", cut.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("events: 21 (event ids 1000 … 1020; first 1000, last 1020 in file order)"), "{t}");
    assert!(t.contains("CUT SHORT"), "{t}");
    assert!(t.contains("NOT closed properly"), "{t}");
    let o = daqflow(&["inspect", "--verify", cut.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "intact but cut short: {}", text(&o));
}

/// Runs `daqflow ARGS`, killing it if it has not ended within 20 s (a hang fails the test).
fn daqflow_bounded(args: &[&std::ffi::OsStr]) -> Output {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run daqflow");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("daqflow {args:?} still running after 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
    Output { status, stdout, stderr }
}

#[test]
fn inspect_refuses_a_fifo_a_directory_and_a_device_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("run000001_0001.daq");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (path, what) in [
        (fifo.as_path(), "is a FIFO (named pipe), not a regular file"),
        (dir.path(), "is a directory, not a regular file"),
        (Path::new("/dev/null"), "is a character device, not a regular file"),
    ] {
        for verify in [false, true] {
            let mut args = vec![std::ffi::OsStr::new("inspect")];
            if verify {
                args.push("--verify".as_ref());
            }
            args.push(path.as_os_str());
            let o = daqflow_bounded(&args);
            let t = text(&o);
            assert_eq!(o.status.code(), Some(2), "{path:?}: {t}");
            assert!(t.contains(what), "{path:?}: {t}");
        }
        let o = daqflow_bounded(&["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v["error"].as_str().unwrap().contains(what), "{v}");
    }
}

#[test]
fn inspect_verify_finds_a_bad_fragment_inside_an_intact_record() {
    // A builder that wrote an event with a corrupted fragment: the record CRC matches (it was
    // computed over the bad bytes), the fragment CRC does not.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileWriterConfig::new(dir.path(), 42);
    cfg.sync_on_close = false;
    let mut w = FileWriter::new(cfg).unwrap();
    for i in 0..5u64 {
        let mut e = event(i, 4, 64);
        if i == 3 {
            let n = e.len();
            e[n - 10] ^= 0xff;
        }
        w.write_event(EventId(i), &e).unwrap();
    }
    let path = w.finish().unwrap().remove(0).path;
    let o = daqflow(&["inspect", "--verify", path.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("first bad record: 3 (event 3)"), "{t}");
    assert!(t.contains("fragment of event 3 from source 101"), "{t}");
    // Without --verify's depth the record itself is fine.
    assert_eq!(daqflow(&["inspect", path.to_str().unwrap()]).status.code(), Some(0));
}

#[test]
fn inspect_refuses_a_file_that_is_not_daqflow_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"these are not the events you are looking for, not at all, not one of them").unwrap();
    let o = daqflow(&["inspect", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("file header: bad magic"), "{}", text(&o));
    let o = daqflow(&["inspect", dir.path().join("missing.daq").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

/// `daqflow bench SUITE --quick --seconds 0.05 EXTRA…` writing its files into `files` and its
/// table into `out`, both in a temporary directory (kept while the first value lives).
fn bench_quick_writing_files(
    suite: &str,
    extra: &[&str],
) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, Output) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let mut args = vec!["bench", suite, "--quick", "--seconds", "0.05"];
    args.extend_from_slice(extra);
    args.extend(["--dir", files.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let o = daqflow(&args);
    (dir, out, files, o)
}

#[test]
fn bench_files_quick_writes_every_event_next_to_write_and_memcpy() {
    let (_dir, out, files, o) = bench_quick_writing_files("files", &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("[writer]") && t.contains("target: the file writer alone"), "{t}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("files.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    assert_eq!(points.len(), 4, "{json}");
    for p in points {
        for m in ["events_per_s", "mb_per_s", "raw_write_mb_per_s", "memcpy_mb_per_s", "ratio_to_raw_write"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
    }
    assert_eq!(&std::fs::read(out.join("files.png")).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    // Every repetition's files are removed.
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), 0);
}

#[test]
fn bench_transport_quick_writes_table_csv_json_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = daqflow(&["bench", "transport", "--quick", "--seconds", "0.05", "--out", out.to_str().unwrap()]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("[frame_size]") && t.contains("[connections]") && t.contains("raw reference"), "{t}");
    let csv = std::fs::read_to_string(out.join("transport.csv")).unwrap();
    assert!(csv.starts_with("case,frame_bytes,connections,"), "{csv}");
    let png = std::fs::read(out.join("transport.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("transport.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    let frame_size: Vec<_> = points.iter().filter(|p| p["case"] == "frame_size").collect();
    assert_eq!(frame_size.len(), 4);
    for p in &frame_size {
        assert!(p["params"]["frame_bytes"].is_u64() && p["params"]["connections"] == 1);
        for m in ["frames_per_s", "mb_per_s", "raw_mb_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
        ratio_or_withheld(p);
    }
    let conns: Vec<u64> = points
        .iter()
        .filter(|p| p["case"] == "connections")
        .map(|p| p["params"]["connections"].as_u64().unwrap())
        .collect();
    assert!(conns.contains(&1) && conns.contains(&2) && conns.contains(&4));
}

#[test]
fn bench_dialog_quick_runs_processes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = daqflow(&[
        "bench",
        "dialog",
        "--quick",
        "--senders",
        "3",
        "--sizes",
        "16,4096",
        "--seconds",
        "0.2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dialog.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        assert_eq!(p["params"]["senders"], 3);
        assert_eq!(p["metrics"]["lost_msgs"], 0.0, "{p}");
        assert_eq!(p["metrics"]["out_of_order_msgs"], 0.0, "{p}");
        for m in ["msgs_per_s", "mb_per_s", "peak_rss_mb", "raw_msgs_per_s", "raw_mb_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
    }
    assert!(out.join("dialog.png").exists() && out.join("dialog.csv").exists());
}

#[test]
fn bench_cases_are_checked_before_anything_runs() {
    for (args, says) in [
        (&["bench", "et", "--cases", "batch,bacth"][..], "et has no case \"bacth\"; its cases: size, batch"),
        (&["bench", "evb", "--cases", "ru,bu,nope"][..], "evb has no case \"nope\""),
        (&["bench", "files", "--cases", "batch"][..], "--cases applies to the evb and et suites"),
    ] {
        let o = daqflow(args);
        assert!(!o.status.success() && text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

#[test]
fn bench_et_quick_runs_every_case_across_processes_and_loses_nothing() {
    let (_dir, out, files, o) = bench_quick_writing_files("et", &["--sizes", "8,65536"]);
    let t = text(&o);
    // The suite itself fails (exit 1) if any consumer saw fewer events or bytes than produced.
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("[size]") && t.contains("[batch]") && t.contains("[consumers]") && t.contains("[remote]"),
        "{t}"
    );
    assert!(t.contains("writing files (recorder: record against consume"), "{t}");
    // Every repetition's files were removed.
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), 0);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("et.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    let count = |case: &str| points.iter().filter(|p| p["case"] == case).count();
    assert_eq!(
        (count("size"), count("batch"), count("consumers"), count("remote"), count("recorder")),
        (2, 2, 4, 2, 4),
        "{json}"
    );
    for p in points {
        for k in ["event_bytes", "batch", "consumers"] {
            assert!(p["params"][k].is_u64(), "{k} in {p}");
        }
        if p["case"] == "recorder" {
            // Recorders writing files against consumers without them; the suite fails if a
            // recorder recorded fewer events than produced or one without its header.
            assert!(p["params"]["task"] == "record" || p["params"]["task"] == "consume", "{p}");
        } else {
            assert!(p["params"]["stations"] == "shared" || p["params"]["stations"] == "separate", "{p}");
            assert_eq!(p["params"]["remote"], p["case"] == "remote", "{p}");
        }
        for m in ["events_per_s", "mb_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
        if p["case"] == "size" {
            assert!(p["metrics"]["memcpy_mb_per_s"].as_f64().unwrap() > 0.0, "{p}");
        }
        // Where producer and consumer ran, and what else took the CPU: the conditions of the point.
        for m in ["same_core_pct", "others_cpu_pct"] {
            let v = p["metrics"][m].as_f64().unwrap_or(-1.0);
            assert!((0.0..=100.0).contains(&v), "{m} in {p}");
        }
    }
    let png = std::fs::read(out.join("et.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(std::fs::read_to_string(out.join("et.csv")).unwrap().starts_with("case,"));
}

#[test]
fn bench_engine_quick_measures_every_case_and_draws_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = daqflow(&["bench", "engine", "--quick", "--seconds", "0.05", "--out", out.to_str().unwrap()]);
    let t = text(&o);
    // The suite fails (exit 2) if a test-bed run's counts do not add up.
    assert!(o.status.success(), "{t}");
    for case in ["[timestamp]", "[scheduler]", "[event_manager]", "[rob]", "5.8 µs", "target:"] {
        assert!(t.contains(case), "{case} missing from:\n{t}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("engine.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    let of = |case: &str| points.iter().filter(|p| p["case"] == case).collect::<Vec<_>>();
    let metrics: [(&str, &[&str]); 4] = [
        ("timestamp", &["ns_per_timestamp", "ns_per_disabled_probe"]),
        ("scheduler", &["ns_per_task_cycle"]),
        ("event_manager", &["ns_insert", "ns_lookup", "ns_remove"]),
        ("rob", &["ns_per_event", "events_per_s"]),
    ];
    for (case, names) in metrics {
        let pts = of(case);
        assert!(!pts.is_empty(), "no {case} point in {json}");
        for p in pts {
            for m in names {
                assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
            }
        }
    }
    // Transitions are corrected for one stamp's cost: they may be 0 on a fast machine.
    let sched = &of("scheduler")[0]["metrics"];
    for m in ["ns_poll_to_action", "ns_action_to_poll"] {
        assert!(sched[m].as_f64().unwrap() >= 0.0, "{m} in {sched}");
    }
    let em_pages: Vec<u64> = of("event_manager").iter().map(|p| p["params"]["pages"].as_u64().unwrap()).collect();
    assert!(em_pages.contains(&200), "{em_pages:?}");
    let rob: Vec<(String, u64)> = of("rob")
        .iter()
        .map(|p| (p["params"]["layout"].as_str().unwrap().to_owned(), p["params"]["robs"].as_u64().unwrap()))
        .collect();
    for want in [("one", 2), ("apart", 2), ("one", 1)] {
        assert!(rob.contains(&(want.0.to_owned(), want.1)), "{want:?} missing from {rob:?}");
    }
    let png = std::fs::read(out.join("engine.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bench_evb_quick_builds_events_in_every_case_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = daqflow(&["bench", "evb", "--quick", "--seconds", "0.5", "--out", out.to_str().unwrap()]);
    let t = text(&o);
    // The suite fails (exit 1) if a run lost an event or a component reported an error.
    assert!(o.status.success(), "{t}");
    for want in [
        "[ru]",
        "[target_1ru_1bu]",
        "[bu]",
        "[scaling]",
        "[realistic]",
        "[contention]",
        "[replay]",
        "raw reference",
        "raw relay",
        "target: 1 KiB",
        "target: the RU against the raw relay — 1 KiB × 8 streams → 2 BU(s)",
        "target: the builder under contention — 2 busy: ",
        "— crc: 1 thread ",
        ", 2 threads ",
    ] {
        assert!(t.contains(want), "{want} missing from:\n{t}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("evb.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    let count = |case: &str| points.iter().filter(|p| p["case"] == case).count();
    assert_eq!(
        (
            count("ru"),
            count("target_1ru_1bu"),
            count("bu"),
            count("replay"),
            count("scaling"),
            count("realistic"),
            count("contention")
        ),
        (2, 1, 4, 2, 2, 1, 2),
        "{json}"
    );
    // The builder threads fed from memory: no network, so no raw reference; the CRC check's
    // own reference instead, and every event handed out accounted for.
    let replay: Vec<&serde_json::Value> = points.iter().filter(|p| p["case"] == "replay").collect();
    let threads: Vec<u64> = replay.iter().map(|p| p["params"]["threads"].as_u64().unwrap()).collect();
    assert_eq!(threads, [1, 2]);
    for p in &replay {
        assert_eq!(p["params"]["task"], "crc", "{p}");
        assert_eq!(p["metrics"]["lost_events"], 0.0, "{p}");
        for m in ["events_per_s", "mb_per_s", "busy_pct", "crc_mb_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
        // Withheld where one thread's CRC alone was slower than the point per thread.
        assert!(
            p["metrics"]["ratio_to_crc"].as_f64().is_some_and(|r| r > 0.0)
                || p["withheld"]["ratio_to_crc"]["why"].as_str().is_some_and(|w| w.contains("the reference")),
            "{p}"
        );
    }
    for p in points.iter().filter(|p| p["case"] != "replay") {
        for k in ["fragment_bytes", "streams", "rus", "bus"] {
            assert!(p["params"][k].is_u64(), "{k} in {p}");
        }
        assert_eq!(p["metrics"]["lost_events"], 0.0, "{p}");
        for m in ["events_per_s", "mb_per_s", "raw_mb_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
        ratio_or_withheld(p);
        // The RU's points have the raw relay of their topology too.
        if p["case"] == "ru" || p["case"] == "target_1ru_1bu" {
            assert!(p["metrics"]["relay_mb_per_s"].as_f64().unwrap() > 0.0, "{p}");
            assert!(
                p["metrics"]["ratio_to_relay"].as_f64().is_some_and(|r| r > 0.0)
                    || p["withheld"]["ratio_to_relay"]["why"].as_str().is_some_and(|w| w.contains("the reference")),
                "{p}"
            );
        }
    }
    let busy: Vec<f64> =
        points.iter().filter(|p| p["case"] == "contention").map(|p| p["params"]["busy"].as_f64().unwrap()).collect();
    assert_eq!(busy, [0.0, 2.0]);
    let tasks: Vec<&str> =
        points.iter().filter(|p| p["case"] == "bu").map(|p| p["params"]["task"].as_str().unwrap()).collect();
    for task in ["build", "crc", "write"] {
        assert!(tasks.contains(&task), "{task} missing from {tasks:?}");
    }
    let png = std::fs::read(out.join("evb.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(std::fs::read_to_string(out.join("evb.csv")).unwrap().starts_with("case,fragment_bytes,streams,"));
}

/// `evb local --profile DIR`: the EVM, each RU and each BU write a time-stamp profile at the
/// run's end, and `daqflow profile` shows where an event's time went through the builder.
#[test]
fn evb_local_profile_writes_each_components_time_stamps_for_daqflow_profile() {
    let dir = tempfile::tempdir().unwrap();
    let prof = dir.path().join("prof");
    let o = daqflow(&[
        "evb",
        "local",
        "--rus",
        "1",
        "--bus",
        "1",
        "--streams",
        "2",
        "--seconds",
        "1",
        "--profile",
        prof.to_str().unwrap(),
        "--data",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let probes = [
        ("evm-run1.prof", &["evm.trigger", "evm.assign", "evm-evm/links.action"][..]),
        ("ru-0-run1.prof", &["ru.receive", "ru.assemble", "ru.send"][..]),
        ("bu-0-run1.prof", &["bu.request", "bu.receive", "bu.build", "bu.write", "bu-0-build0/build-0.action"][..]),
    ];
    for (file, wanted) in probes {
        let path = prof.join(file);
        assert!(path.is_file(), "{file} missing: {:?}", std::fs::read_dir(&prof).map(|d| d.count()));
        let o = daqflow(&["profile", path.to_str().unwrap()]);
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        for w in wanted {
            let line = t
                .lines()
                .find(|l| l.trim_start().starts_with(w))
                .unwrap_or_else(|| panic!("{w} missing from {file}:\n{t}"));
            let count: u64 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            assert!(count > 0, "{w} never stamped in {file}: {line}");
        }
    }
}

/// The paper's sub-farm behind the test bed's collector: every built event goes through the SFI,
/// the dummy event handler (a process of its own) and the SFO into a data file, checked event
/// by event; the profile has the SFI's and the SFO's tasks.
#[test]
fn engine_testbed_with_a_subfarm_carries_every_built_event_through_the_event_handler_into_the_sfos_file() {
    let dir = tempfile::tempdir().unwrap();
    let (prof, sfo) = (dir.path().join("run.prof"), dir.path().join("sfo"));
    let o = daqflow(&[
        "engine",
        "testbed",
        "--subfarm",
        "--sfo-dir",
        sfo.to_str().unwrap(),
        "--events",
        "20200",
        "--ring",
        "200000",
        "--profile",
        prof.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("collector: 200 crate fragments built"), "{t}");
    assert!(
        t.contains("sub-farm: SFI received 200 crate fragments, formatted 200 events, injected 200 into the event handler; SFO received 200"),
        "{t}"
    );
    assert!(t.contains("wrote or dropped 200") && t.contains("event handler: 200 events forwarded"), "{t}");
    let files: Vec<_> = std::fs::read_dir(&sfo).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let o = daqflow(&["inspect", "--verify", files[0].to_str().unwrap()]);
    assert!(o.status.success() && text(&o).contains("200 events checked fragment by fragment"), "{}", text(&o));
    let o = daqflow(&["profile", prof.to_str().unwrap()]);
    for want in
        ["sfi.receive.action", "sfi.end_of_event.action", "sfi.output.poll", "sfo.input.action", "sfo.output.action"]
    {
        assert!(text(&o).contains(want), "{want} missing from:\n{}", text(&o));
    }
}

#[test]
fn engine_testbed_profile_then_profile_draws_histograms_and_a_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let prof = dir.path().join("run.prof");
    let o =
        daqflow(&["engine", "testbed", "--events", "20200", "--ring", "200000", "--profile", prof.to_str().unwrap()]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("20200 events decided") && t.contains("consistent"), "{t}");
    assert!(t.contains("rob1: generated 20200, rejected 20000, discarded 200, held 0"), "{t}");

    let out = dir.path().join("out");
    let o = daqflow(&["profile", prof.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in ["rob0.in.poll", "rob0.in.action", "rob1.dc.action", "trg.input", "poll exit → action entry", "median"]
    {
        assert!(t.contains(want), "{want} missing from:\n{t}");
    }
    for png in ["histograms.png", "sequence.png"] {
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
    // A window of another thread, later on.
    let o = daqflow(&[
        "profile",
        prof.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--thread",
        "trg-ebif",
        "--from-us",
        "100",
        "--window-us",
        "20",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("thread trg-ebif, 100 … 120 µs"), "{}", text(&o));
    let o = daqflow(&["profile", prof.to_str().unwrap(), "--out", out.to_str().unwrap(), "--thread", "nope"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no thread `nope`"), "{}", text(&o));
}

#[test]
fn profile_refuses_a_missing_or_damaged_file_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.prof");
    std::fs::write(&garbage, b"this is not a profile, it is a shopping list: eggs, milk, rdtsc").unwrap();
    let o = daqflow(&["profile", garbage.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a daqflow profile"), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
    // A real header followed by fewer stamps than it announces.
    let mut cut = b"DQPROF\0\x01".to_vec();
    let header = br#"{"calibration":{"ticks_per_ns":1.0,"overhead_ticks":[]},"probes":["a"],"threads":[{"name":"t","lost":0,"stamps":5}]}"#;
    cut.extend_from_slice(&(header.len() as u64).to_le_bytes());
    cut.extend_from_slice(header);
    cut.extend_from_slice(&[0; 20]);
    std::fs::write(&garbage, &cut).unwrap();
    let o = daqflow(&["profile", garbage.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("cut short"), "{}", text(&o));
    let o = daqflow(&["profile", dir.path().join("missing.prof").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("missing.prof"), "{}", text(&o));
}

/// `daqflow run FILE --check` on a system file of `[system]` keys `system` and one component of
/// `kind` with `params`; (exit code, output, the file's text).
fn check_system(dir: &Path, system: &str, kind: &str, params: &str) -> (Option<i32>, String, String) {
    let file = format!(
        "[system]\nname = \"t\"\n{system}\n\n[[component]]\nname = \"c\"\nkind = \"{kind}\"\n[component.params]\n{params}\n"
    );
    let path = dir.join("system.toml");
    std::fs::write(&path, &file).unwrap();
    let o = daqflow(&["run", path.to_str().unwrap(), "--check"]);
    (o.status.code(), text(&o), file)
}

#[test]
fn run_check_names_the_key_and_line_of_every_value_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let et = "et = \"e\"\ndirectory = \"/tmp/d\"";
    // (system keys, kind, parameters, the key that is wrong)
    let cases: &[(&str, &str, &str, &str)] = &[
        ("timeout_s = -1", "sink", "", "timeout_s"),
        ("stop_timeout_s = 1e30", "sink", "", "stop_timeout_s"),
        ("timeout_s = nan", "sink", "", "timeout_s"),
        ("control = \"not an address\"", "sink", "", "control"),
        ("control = \"127.0.0.1:99999\"", "sink", "", "control"),
        ("web = \"127.0.0.1\"", "sink", "", "web"),
        ("remote_command = \" \"", "sink", "", "remote_command"),
        ("lease_s = 6", "sink", "", "lease_s"),
        ("lease_s = 1e9", "sink", "", "lease_s"),
        ("lease_s = inf", "sink", "", "lease_s"),
        ("database = \"postgres://daq:hunter2@db\"", "sink", "", "database"),
        ("database = \" \"", "sink", "", "database"),
        ("", "recorder", &format!("{et}\nmax_file_bytes = 0"), "max_file_bytes"),
        ("", "recorder", &format!("{et}\nbatch = 0"), "batch"),
        ("", "recorder", &format!("{et}\nprescale = 0"), "prescale"),
        ("", "recorder", &format!("{et}\nselect = \"some\""), "select"),
        ("", "recorder", &format!("{et}\ndrain_ms = 0"), "drain_ms"),
        ("", "recorder", "et = \"\"\ndirectory = \"/tmp/d\"", "et"),
        ("", "monitor", "et = \"e\"\nbins = 0", "bins"),
        ("", "monitor", "et = \"e\"\nevent_size_max = -5.0", "event_size_max"),
        ("", "monitor", "et = \"e\"\ncue = 0", "cue"),
        ("", "et", "events = 0", "events"),
        ("", "et", "heartbeat_timeout_ms = 5", "heartbeat_timeout_ms"),
        ("", "et", "listen = \"nowhere\"", "listen"),
        ("", "msglogger", "control = \"x\"\ndatabase = \"d.sqlite\"", "control"),
        ("", "msglogger", "control = \"127.0.0.1:1\"\ndatabase = \"d.sqlite\"\npoll_ms = 0", "poll_ms"),
        ("", "msglogger", "control = \"127.0.0.1:1\"\ndatabase = \"postgresql://db/runs\"", "database"),
        ("", "generator", "downstream = \"127.0.0.1:1\"\nrate_hz = -1.0", "rate_hz"),
        ("", "generator", "downstream = \"127.0.0.1:1\"\nchunk_bytes = 0", "chunk_bytes"),
        ("", "generator", "", "downstream"),
        ("", "repeater", "downstream = \"127.0.0.1:1\"\npipe_bytes = 1", "pipe_bytes"),
        ("", "sink", "recv_chunk_bytes = 1", "recv_chunk_bytes"),
        ("", "sink", "stop_timeout_ms = 0", "stop_timeout_ms"),
        ("", "evm", "rus = 0", "rus"),
        ("", "evm", "reject_fraction = 2.0", "reject_fraction"),
        ("", "evm", "listen = \"127.0.0.1:70000\"", "listen"),
        ("", "evm", "bu_timeout_ms = 0", "bu_timeout_ms"),
        ("", "ru", "streams = 0", "streams"),
        ("", "ru", "send_queue_bytes = 1000000000", "send_queue_bytes"),
        ("", "ru", "evm = \"no port\"", "evm"),
        ("", "bu", "credits = 0", "credits"),
        ("", "bu", "threads = 65", "threads"),
        ("", "bu", "output = \"et\"", "et"),
        ("", "bu", "max_file_bytes = 0", "max_file_bytes"),
        ("", "source", "rate_hz = -3.0", "rate_hz"),
        ("", "source", "ru = \"127.0.0.1:123456\"", "ru"),
    ];
    for (system, kind, params, key) in cases {
        let (code, out, text) = check_system(dir.path(), system, kind, params);
        // Refused with an error (not accepted, not a panic's 101).
        assert!(matches!(code, Some(c) if c != 0 && c != 101), "{kind} {params:?} {system:?}: {code:?}:\n{out}");
        assert!(!out.contains("panicked"), "{out}");
        // The line of the key in the file.
        let line = text.lines().position(|l| l.trim_start().starts_with(&format!("{key} ="))).map(|i| i + 1);
        let expected = match line {
            Some(n) => format!("line {n}: "),
            None => String::new(),
        };
        let problem = out.lines().find(|l| l.contains(&format!("`{key}`"))).unwrap_or_else(|| panic!("{key}: {out}"));
        assert!(problem.contains(&expected), "{key}: want {expected:?} in {problem:?}");
        assert!(!out.contains("hunter2"), "a URL's password is shown: {out}");
    }
    // Several problems at once, each on its own line.
    let (code, out, _) =
        check_system(dir.path(), "timeout_s = 0", "recorder", &format!("{et}\nbatch = 0\nprescale = 0"));
    assert_ne!(code, Some(0));
    assert!(out.contains("3 problem(s)") && out.contains("line 3: `timeout_s`"), "{out}");
    assert!(out.contains("line 11: parameters of `c`") && out.contains("line 12: parameters of `c`"), "{out}");
    // The demo's own file is fine.
    let demo = dir.path().join("demo.toml");
    std::fs::write(&demo, daqflow(&["demo", "--print-config"]).stdout).unwrap();
    let o = daqflow(&["run", demo.to_str().unwrap(), "--check"]);
    assert!(o.status.success() && text(&o).contains("no problems"), "{}", text(&o));
}

#[test]
fn a_component_refuses_a_value_out_of_range_at_configure() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["component", "recorder", "--name", "r", "--set", "et=e", "--set", "max_file_bytes=0", "--set"])
        .arg(format!("directory={}", dir.path().display()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "configure").unwrap();
    }
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["ok"], false, "{out}");
    assert!(first["error"].as_str().unwrap().contains("`max_file_bytes` = 0 is out of range"), "{out}");
}

/// `daqflow run FILE --check` on `text`: (exit code, output).
fn check_text(dir: &Path, file: &str) -> (Option<i32>, String) {
    let path = dir.join("system.toml");
    std::fs::write(&path, file).unwrap();
    let o = daqflow(&["run", path.to_str().unwrap(), "--check"]);
    (o.status.code(), text(&o))
}

#[test]
fn run_check_refuses_what_two_components_cannot_share_with_both_lines() {
    let dir = tempfile::tempdir().unwrap();
    let head = "[system]\nname = \"t\"\ncontrol = \"127.0.0.1:7000\"\n";
    let src = |name: &str, id: Option<&str>| {
        let id = id.map(|i| format!("source_id = {i}\n")).unwrap_or_default();
        format!(
            "\n[[component]]\nname = \"{name}\"\nkind = \"source\"\n[component.params]\nru = \"127.0.0.1:7200\"\n{id}"
        )
    };
    // Two sources with one source id: the second names the first, with both lines.
    let text = format!("{head}{}{}", src("src-0", Some("0")), src("src-1", Some("0")));
    let (code, out) = check_text(dir.path(), &text);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains(
            "line 17: `src-1`: source_id = 0 is also the source_id of `src-0` (line 10): no two source components may share it"
        ),
        "{out}"
    );
    // The default counts: two sources without `source_id` are both 0.
    let (_, out) = check_text(dir.path(), &format!("{head}{}{}", src("src-0", None), src("src-1", None)));
    assert!(out.contains("`src-1`: source_id = 0 (the default) is also the source_id of `src-0`"), "{out}");
    // Different ids, or an id made of a reference (known at configure only), pass.
    let (code, out) = check_text(dir.path(), &format!("{head}{}{}", src("src-0", Some("0")), src("src-1", Some("1"))));
    assert_eq!(code, Some(0), "{out}");
    // Readout units and builder units: each kind has its own ids.
    let unit = |name: &str, kind: &str| {
        format!(
            "\n[[component]]\nname = \"{name}\"\nkind = \"{kind}\"\n[component.params]\nid = 1\nevm = \"127.0.0.1:7100\"\n"
        )
    };
    let text = format!("{head}{}{}{}", unit("ru-a", "ru"), unit("ru-b", "ru"), unit("bu-a", "bu"));
    let (_, out) = check_text(dir.path(), &text);
    assert!(out.contains("`ru-b`: id = 1 is also the id of `ru-a`") && out.contains("no two ru components"), "{out}");
    assert!(!out.contains("`bu-a`"), "an RU and a BU may share an id: {out}");
    // Two listeners on one port, and one on the control server's.
    let sink = |name: &str, listen: &str| {
        format!("\n[[component]]\nname = \"{name}\"\nkind = \"sink\"\n[component.params]\nlisten = \"{listen}\"\n")
    };
    let text = format!(
        "{head}{}{}{}{}",
        sink("a", "127.0.0.1:7300"),
        sink("b", "0.0.0.0:7300"),
        sink("c", "127.0.0.1:7000"),
        sink("d", "127.0.0.1:0")
    );
    let (_, out) = check_text(dir.path(), &text);
    assert!(
        out.contains("line 15: `b` would listen on 0.0.0.0:7300, where `a` listens (line 9): two processes cannot listen on one port"),
        "{out}"
    );
    assert!(
        out.contains(
            "line 21: `c` would listen on 127.0.0.1:7000, where the control server (`control`) listens (line 3)"
        ),
        "{out}"
    );
    assert!(!out.contains("`d`"), "port 0 is any free port: {out}");
    // Another host has its own ports.
    let text = format!(
        "{head}{}{}",
        sink("a", "0.0.0.0:7300"),
        sink("b", "0.0.0.0:7300").replace("kind = \"sink\"", "kind = \"sink\"\nhost = \"node2\"")
    );
    let (code, out) = check_text(dir.path(), &text);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn run_check_names_a_misspelt_table_or_kind_and_the_one_meant() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[system]\nname = \"t\"\n\n[[component]]\nname = \"a\"\nkind = \"sink\"\n[component.params]\nlisten = \"127.0.0.1:0\"\n\n\
                [[compnent]]\nname = \"b\"\nkind = \"sink\"\n[component.params]\nlisten = \"127.0.0.1:0\"\n";
    let (code, out) = check_text(dir.path(), text);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("line 10: unknown table `[[compnent]]`; did you mean `[[component]]`?"), "{out}");
    assert!(!out.contains("duplicate key"), "{out}");
    let (_, out) = check_text(dir.path(), "[system]\nname = \"t\"\n[component]\nname = \"a\"\nkind = \"sink\"\n");
    assert!(out.contains("line 3: `[component]` must be `[[component]]`"), "{out}");
    let (_, out) = check_text(dir.path(), "[system]\nname = \"t\"\n[[component]]\nname = \"a\"\nkind = \"sorce\"\n");
    assert!(out.contains("line 5: unknown kind `sorce`; did you mean `source`?"), "{out}");
}

/// A bench point's `ratio_to_raw`: positive, or withheld with the reason (a suite withholds a
/// ratio to a reference that did not measure the path's limit, which a loaded machine can cause).
fn ratio_or_withheld(p: &serde_json::Value) {
    match p["metrics"]["ratio_to_raw"].as_f64() {
        Some(r) => assert!(r > 0.0, "ratio_to_raw in {p}"),
        None => assert!(p["withheld"]["ratio_to_raw"]["why"].as_str().unwrap_or("").contains("the reference"), "{p}"),
    }
}

#[test]
fn run_check_refuses_a_farm_whose_members_disagree_or_an_unknown_group_policy() {
    let dir = tempfile::tempdir().unwrap();
    let head = "[system]\nname = \"t\"\ncontrol = \"127.0.0.1:7000\"\n";
    let rec = |name: &str, extra: &str| {
        format!(
            "\n[[component]]\nname = \"{name}\"\nkind = \"recorder\"\n[component.params]\net = \"daq\"\ndirectory = \
             \"/tmp/d-{name}\"\ngroup = \"farm\"\n{extra}"
        )
    };
    // Three members agreeing: fine.
    let policy = "group_policy = \"shortest_queue\"\n";
    let text = format!("{head}{}{}{}", rec("rec-0", policy), rec("rec-1", policy), rec("rec-2", policy));
    let (code, out) = check_text(dir.path(), &text);
    assert_eq!(code, Some(0), "{out}");
    // One member with another policy (the default): named with its line and the first member's.
    let text = format!("{head}{}{}", rec("rec-0", policy), rec("rec-1", ""));
    let (code, out) = check_text(dir.path(), &text);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains(
            "`rec-1`: group_policy = \"round_robin\" differs from group_policy = \"shortest_queue\" of `rec-0` (line 11), \
             in the same group \"farm\""
        ),
        "{out}"
    );
    // Another selection, two members on one station, a group named like a member's station.
    let text = format!(
        "{head}{}{}{}",
        rec("rec-0", ""),
        rec("rec-1", "select = \"match:1\"\nstation = \"rec-0\"\n"),
        rec("farm", "")
    );
    let (_, out) = check_text(dir.path(), &text);
    assert!(out.contains("`rec-1`: select = \"match:1\" differs from select = \"all\" of `rec-0`"), "{out}");
    assert!(out.contains("`rec-1`: station = \"rec-0\" is also the station of `rec-0` in group \"farm\""), "{out}");
    assert!(out.contains("`farm`: group = \"farm\" is also the name of its station"), "{out}");
    // The same group name on another ET system is another group.
    let text = format!("{head}{}{}", rec("rec-0", policy), rec("rec-1", "").replace("\"daq\"", "\"daq2\""));
    let (code, out) = check_text(dir.path(), &text);
    assert_eq!(code, Some(0), "{out}");
    // An unknown policy names the key and the values it takes.
    let (code, out) = check_text(dir.path(), &format!("{head}{}", rec("rec-0", "group_policy = \"fastest\"\n")));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("group_policy") && out.contains("round_robin") && out.contains("shortest_queue"), "{out}");
}
