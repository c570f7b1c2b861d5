//! The file writer on a full disk (a 1 MiB tmpfs the test mounts): the error says the disk is
//! full, the file is left as `.part` cut back to its last whole record (no partial record, no
//! trailer after garbage), the reader finds exactly the events the writer says are in it, and
//! [`DiskWatcher`] sees the disk above its high mark.
//!
//! Mounting needs root: as another user the test runs itself again in a user and mount
//! namespace (`unshare --user --map-root-user --mount`), and is skipped with the reason printed
//! when that is not possible either.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daqflow_wire::EventId;
use daqflow_wire::file::{
    DiskChange, DiskMarks, DiskWatcher, FileReader, FileWriteError, FileWriter, FileWriterConfig,
};

const IN_NAMESPACE: &str = "DAQFLOW_TEST_IN_MOUNT_NAMESPACE";

/// A tmpfs mounted on a fresh directory, unmounted when dropped (on a panic too).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "daqflow-test"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
        Tmpfs(dir)
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// Whether this process may mount (root, or already in a namespace); otherwise the test runs
/// again under `unshare` (its result is this one's) or is skipped with the reason printed.
fn may_mount(name: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false);
    if root || std::env::var_os(IN_NAMESPACE).is_some() {
        return true;
    }
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(IN_NAMESPACE, "1")
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) if o.status.code() == Some(101) => {
            panic!("{name} in a namespace:\n{}", String::from_utf8_lossy(&o.stdout))
        }
        Ok(o) => {
            println!("skipped {name}: not root, no user namespace ({})", String::from_utf8_lossy(&o.stderr).trim())
        }
        Err(e) => println!("skipped {name}: not root, and `unshare` cannot run ({e})"),
    }
    false
}

#[test]
fn a_writer_on_a_full_disk_leaves_whole_records_only_and_says_the_disk_is_full() {
    let name = "a_writer_on_a_full_disk_leaves_whole_records_only_and_says_the_disk_is_full";
    if !may_mount(name) {
        return;
    }
    let disk = Tmpfs::mount("1m");
    let mut watcher = DiskWatcher::new(disk.path(), DiskMarks { high_pct: 90.0, low_pct: 50.0 }, Duration::ZERO);
    assert_eq!(watcher.check(Instant::now()).unwrap(), None, "an empty disk throttles");

    let mut cfg = FileWriterConfig::new(disk.path(), 1);
    cfg.buffer_bytes = 64 << 10;
    let mut w = FileWriter::new(cfg).unwrap();
    let payload = vec![0xa5u8; 3000];
    let mut written = 0u64;
    let error = loop {
        match w.write_event(EventId(written + 1), &payload) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 1000, "1 MiB never filled");
    };
    assert!(error.is_disk_full(), "{error}");
    assert!(error.to_string().contains("No space left on device"), "{error}");
    assert!(matches!(w.write_event(EventId(0), b"x"), Err(FileWriteError::Failed)));
    assert!(w.flush().is_err());
    assert!(matches!(watcher.check(Instant::now()).unwrap(), Some(DiskChange::Throttled(_))));
    assert!(watcher.report(Instant::now()).throttled);

    // The file: `.part`, whole records only, exactly those the writer reports.
    let abandoned = w.abandoned().to_vec();
    assert_eq!(abandoned.len(), 1, "{abandoned:?}");
    let part = &abandoned[0];
    assert!(part.path.to_string_lossy().ends_with(".daq.part"), "{part:?}");
    assert!(part.events > 0 && part.events < written, "{} whole of {written}: {part:?}", part.events);
    assert_eq!(std::fs::metadata(&part.path).unwrap().len(), part.file_bytes);
    assert!(w.finish().unwrap().is_empty(), "no file was closed");
    let reader = FileReader::open(&part.path).unwrap();
    assert!(!reader.is_complete());
    let report = reader.verify(true).unwrap();
    assert_eq!(report.records, part.events, "{report:?}");
    assert_eq!(report.cut_short, None, "a partial record was left: {report:?}");
    assert_eq!(part.first_event, Some(EventId(1)));
    assert_eq!(part.last_event, Some(EventId(part.events)));
}

#[test]
fn a_writer_on_a_full_disk_leaves_no_file_that_is_not_a_readable_data_file() {
    let name = "a_writer_on_a_full_disk_leaves_no_file_that_is_not_a_readable_data_file";
    if !may_mount(name) {
        return;
    }
    let disk = Tmpfs::mount("1m");
    let mut cfg = FileWriterConfig::new(disk.path(), 2);
    cfg.buffer_bytes = 64 << 10;
    cfg.stream = Some("rec".into());
    let mut w = FileWriter::new(cfg.clone()).unwrap();
    // The rest of the disk taken by a ballast: the first flush of the writer fails.
    let mut ballast = std::fs::File::create(disk.path().join("ballast")).unwrap();
    let chunk = vec![0x5au8; 4096];
    let mut fill = || while std::io::Write::write_all(&mut ballast, &chunk).is_ok() {};
    fill();
    w.write_event(EventId(1), &[1u8; 10_000]).unwrap(); // more than the page the header is in
    let error = w.flush().unwrap_err();
    assert!(error.is_disk_full(), "{error}");
    // The file held no whole record on disk: it is gone, not left empty or header-only.
    assert!(w.abandoned().is_empty(), "{:?}", w.abandoned());
    assert!(w.finish().unwrap().is_empty());
    // A new writer (a restarted recorder) on the disk full again (the removed file's space
    // taken) cannot write its header: it fails, leaving no file.
    fill();
    cfg.stream = Some("rec.r1".into());
    let error = FileWriter::new(cfg).err().expect("a writer on a full disk");
    assert!(error.is_disk_full(), "{error}");
    let left: Vec<String> = std::fs::read_dir(disk.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "ballast")
        .collect();
    assert!(left.is_empty(), "files left on the full disk: {left:?}");
}
