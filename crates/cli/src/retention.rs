//! What the demo keeps: the data files of earlier runs, bounded (`daqflow demo --keep`).
//!
//! The demo records about 8 MB/s for as long as a run lasts. When a run starts, the demo
//! deletes the files of the oldest earlier runs, a whole run at a time, until the files of the
//! earlier runs take at most `--keep` bytes; the run in progress never loses a file. Only files
//! named as writers name them (`runRRRRRR_….daq`, `….daq.part`, docs/formats.md, "File names
//! and rotation"; the recorder's `runRRRRRR_….meta.json`) are looked at: nothing else in the
//! directory is touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The default of `daqflow demo --keep`: 2 GiB of earlier runs' files.
pub(crate) const DEFAULT_KEEP: &str = "2GiB";

/// `--keep`: at most this many bytes of earlier runs' files, or `None` for no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keep(pub Option<u64>);

/// `--keep`: a number of bytes (`2GiB`, `500MiB`, `65536`), or `all` for no bound.
pub(crate) fn parse_keep(s: &str) -> Result<Keep, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(Keep(None));
    }
    crate::et_cmd::parse_bytes(s).map(|n| Keep(Some(n))).map_err(|e| format!("{e}, or `all`"))
}

/// The run number of a data file's name, if it is one.
fn run_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("run")?;
    let digits = rest.get(..6)?;
    let tail = rest.get(6..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !tail.starts_with('_') {
        return None;
    }
    if !(tail.ends_with(".daq") || tail.ends_with(".daq.part") || tail.ends_with(".meta.json")) {
        return None;
    }
    digits.parse().ok()
}

/// The files of one earlier run.
#[derive(Debug, Default)]
struct RunFiles {
    files: Vec<PathBuf>,
    bytes: u64,
    /// When its newest file was last written.
    newest: Option<SystemTime>,
}

/// What [`prune`] deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    /// The runs whose files were deleted, oldest first.
    pub runs: Vec<u32>,
    /// Files deleted.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// What the earlier runs' files take now.
    pub kept_bytes: u64,
}

/// Deletes the files of the oldest runs in `dir` other than `current` (the run in progress,
/// never touched), a whole run at a time, until the others take at most `keep` bytes. Runs are
/// ordered by when their newest file was last written. A directory that does not exist holds
/// nothing.
pub(crate) fn prune(dir: &Path, keep: u64, current: Option<u32>) -> std::io::Result<Pruned> {
    let mut runs: BTreeMap<u32, RunFiles> = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Pruned::default()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(run) = entry.file_name().to_str().and_then(run_of) else { continue };
        if Some(run) == current {
            continue;
        }
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        let r = runs.entry(run).or_default();
        r.files.push(entry.path());
        r.bytes += meta.len();
        let modified = meta.modified().ok();
        r.newest = r.newest.max(modified);
    }
    let mut order: Vec<(u32, RunFiles)> = runs.into_iter().collect();
    order.sort_by_key(|(run, r)| (r.newest, *run));
    let mut pruned = Pruned { kept_bytes: order.iter().map(|(_, r)| r.bytes).sum(), ..Pruned::default() };
    for (run, r) in order {
        if pruned.kept_bytes <= keep {
            break;
        }
        for f in &r.files {
            match std::fs::remove_file(f) {
                Ok(()) => pruned.files += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(std::io::Error::new(e.kind(), format!("deleting {}: {e}", f.display()))),
            }
        }
        pruned.bytes += r.bytes;
        pruned.kept_bytes -= r.bytes;
        pruned.runs.push(run);
    }
    Ok(pruned)
}

/// What the demo prints after [`prune`] deleted something.
pub(crate) fn report(p: &Pruned, keep: u64, dir: &Path) -> String {
    let runs: Vec<String> = p.runs.iter().map(u32::to_string).collect();
    format!(
        "deleted the files of earlier run{} {} ({} file{}, {}) from {}: the demo keeps at most {} of earlier runs' \
         files (--keep; --keep all keeps everything); {} kept",
        if runs.len() == 1 { "" } else { "s" },
        runs.join(", "),
        p.files,
        if p.files == 1 { "" } else { "s" },
        human(p.bytes),
        dir.display(),
        human(keep),
        human(p.kept_bytes),
    )
}

/// Bytes in binary units, as `--keep` takes them.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v.fract() == 0.0 { format!("{v:.0} {}", UNITS[unit]) } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn file(dir: &Path, name: &str, bytes: usize, age_s: u64) -> PathBuf {
        let path = dir.join(name);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(bytes as u64).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        path
    }

    #[test]
    fn only_data_file_names_count_with_their_run() {
        assert_eq!(run_of("run000012_0001.daq"), Some(12));
        assert_eq!(run_of("run000012_recorder_0003.daq.part"), Some(12));
        assert_eq!(run_of("run000012_recorder.meta.json"), Some(12));
        for other in ["run12_0001.daq", "run000012.daq", "run000012_0001.txt", "notes.daq", "run00001x_0001.daq"] {
            assert_eq!(run_of(other), None, "{other}");
        }
    }

    #[test]
    fn the_oldest_earlier_runs_go_first_whole_and_the_run_in_progress_never() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Run 7 is the oldest by its files, though its number is not the lowest.
        let old = [file(d, "run000007_0001.daq", 3000, 300), file(d, "run000007_0002.daq.part", 1000, 290)];
        let middle = file(d, "run000003_0001.daq", 2000, 200);
        let newest = file(d, "run000005_0001.daq", 2000, 100);
        let current = file(d, "run000009_0001.daq.part", 50_000, 400);
        let other = file(d, "notes.txt", 100_000, 1000);
        // 8000 bytes of earlier runs; keep 5000: run 7 (4000) goes, 4000 stay.
        let p = prune(d, 5000, Some(9)).unwrap();
        assert_eq!(p, Pruned { runs: vec![7], files: 2, bytes: 4000, kept_bytes: 4000 });
        assert!(old.iter().all(|f| !f.exists()));
        assert!(middle.exists() && newest.exists() && current.exists() && other.exists());
        assert!(report(&p, 5000, d).starts_with("deleted the files of earlier run 7 (2 files, 3.9 KiB) from "));
        // Within the bound: nothing more goes.
        assert_eq!(prune(d, 4000, Some(9)).unwrap().runs, Vec::<u32>::new());
        // Keep nothing: every earlier run goes, the run in progress and other files stay.
        let p = prune(d, 0, Some(9)).unwrap();
        assert_eq!((p.runs, p.files, p.kept_bytes), (vec![3, 5], 2, 0));
        assert!(current.exists() && other.exists());
        assert_eq!(prune(&d.join("missing"), 0, None).unwrap(), Pruned::default());
    }

    #[test]
    fn keep_takes_sizes_or_all() {
        assert_eq!(parse_keep("2GiB"), Ok(Keep(Some(2 << 30))));
        assert_eq!(parse_keep(DEFAULT_KEEP), Ok(Keep(Some(2 << 30))));
        assert_eq!(parse_keep("all"), Ok(Keep(None)));
        assert_eq!(parse_keep("0"), Ok(Keep(Some(0))));
        assert!(parse_keep("lots").unwrap_err().contains("or `all`"));
        assert_eq!(human(2 << 30), "2 GiB");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
