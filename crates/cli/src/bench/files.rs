//! `daqflow bench files`: the data-file writer alone, without network or builder, next to what
//! the filesystem and the memory take in the same run.
//!
//! Case `writer`: one [`FileWriter`] (what a BU and a recorder write with: a record header and
//! the CRC32C of every payload, the index, files rotated at 1 GiB, each synced and renamed when
//! closed) writing events of 1 KiB … 1 MiB, each handed over as `parts` slices (1, or 8 as a BU
//! hands over an event's super-fragments), from a 64 MiB pool of distinct bytes (an event is
//! not in the cache when it is written, as a built event is not). Every repetition measures,
//! in the same directory and with the same bytes:
//!
//! - `raw_write`: `write(2)` of 1 MiB blocks into new files of 1 GiB: what the filesystem
//!   itself takes (no format, no CRC, no copy);
//! - `memcpy`: the same bytes copied once into a 1 MiB buffer: what one copy costs.
//!
//! The files go to `--dir` (default `/dev/shm`, a RAM disk, else the temporary directory) and
//! are removed after each repetition.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use daqflow_wire::EventId;
use daqflow_wire::file::{FileWriter, FileWriterConfig};

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};

/// Bytes of distinct payload the events are taken from.
const POOL_BYTES: usize = 64 << 20;

/// Options of the files suite.
#[derive(Debug, Clone)]
pub struct FilesOptions {
    /// Event sizes.
    pub sizes: Vec<usize>,
    /// The directory written into.
    pub dir: PathBuf,
}

/// The payload pool: distinct bytes, so that neither the CRC nor the page cache sees repeats.
fn pool() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    (0..POOL_BYTES / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// What one measurement moved: payload bytes and events in `seconds`.
struct Moved {
    events: u64,
    bytes: u64,
    seconds: f64,
}

impl Moved {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e6
    }
}

/// The writer: events of `size` bytes in `parts` slices for `window`.
fn writer(dir: &Path, pool: &[u8], size: usize, parts: usize, window: Duration) -> anyhow::Result<Moved> {
    let mut w = FileWriter::new(FileWriterConfig::new(dir, 1)).context("opening the writer")?;
    let part = size.div_ceil(parts);
    let events_in_pool = (pool.len() / size).max(1);
    let (mut events, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let end = start + window;
    let mut slices: Vec<&[u8]> = Vec::with_capacity(parts);
    while Instant::now() < end {
        for _ in 0..16 {
            let at = (events as usize % events_in_pool) * size;
            let event = &pool[at..at + size];
            slices.clear();
            slices.extend(event.chunks(part));
            w.write_event_parts(EventId(events), &slices).context("writing")?;
            events += 1;
            bytes += size as u64;
        }
    }
    let files = w.finish().context("closing")?;
    let seconds = start.elapsed().as_secs_f64();
    let written: u64 = files.iter().map(|f| f.events).sum();
    anyhow::ensure!(written == events, "the files hold {written} events, {events} were written");
    Ok(Moved { events, bytes, seconds })
}

/// The filesystem alone: `write(2)` of 1 MiB blocks from the pool into new files of 1 GiB, as
/// the writer's (each removed once the window is over).
fn raw_write(dir: &Path, pool: &[u8], window: Duration) -> anyhow::Result<Moved> {
    const BLOCK: usize = 1 << 20;
    const FILE_BLOCKS: u64 = 1024;
    let path = |k: u64| dir.join(format!("raw-{k}.bin"));
    let create = |k: u64| File::create(path(k)).with_context(|| format!("creating {}", path(k).display()));
    let (mut blocks, mut at) = (0u64, 0usize);
    let mut f = create(0)?;
    let start = Instant::now();
    let end = start + window;
    while Instant::now() < end {
        f.write_all(&pool[at..at + BLOCK])?;
        blocks += 1;
        at = (at + BLOCK) % (pool.len() - BLOCK + 1);
        if blocks.is_multiple_of(FILE_BLOCKS) {
            f.sync_all()?;
            f = create(blocks / FILE_BLOCKS)?;
        }
    }
    f.sync_all()?;
    let seconds = start.elapsed().as_secs_f64();
    drop(f);
    for k in 0..=blocks / FILE_BLOCKS {
        let _ = std::fs::remove_file(path(k));
    }
    Ok(Moved { events: blocks, bytes: blocks * BLOCK as u64, seconds })
}

/// One copy of the same bytes into a 1 MiB buffer, `size` at a time.
fn memcpy(pool: &[u8], size: usize, window: Duration) -> Moved {
    let mut buf = vec![0u8; 1 << 20];
    let size = size.min(buf.len());
    let (mut bytes, mut at, mut to) = (0u64, 0usize, 0usize);
    let start = Instant::now();
    let end = start + window;
    while Instant::now() < end {
        for _ in 0..64 {
            if to + size > buf.len() {
                to = 0;
            }
            if at + size > pool.len() {
                at = 0;
            }
            buf[to..to + size].copy_from_slice(std::hint::black_box(&pool[at..at + size]));
            std::hint::black_box(&mut buf);
            to += size;
            at += size;
            bytes += size as u64;
        }
    }
    Moved { events: 0, bytes, seconds: start.elapsed().as_secs_f64() }
}

pub fn run(config: BenchConfig, opts: FilesOptions) -> anyhow::Result<Suite> {
    let mut suite = Suite::new("files", "the data-file writer alone, next to write(2) and memcpy", config.clone());
    let window = config.measure_time;
    let pool = pool();
    let mut n = 0u64;
    for &parts in &[1usize, 8] {
        for &size in &opts.sizes {
            if size < parts * 64 {
                continue;
            }
            let params = vec![("event_bytes", size.into()), ("parts", parts.into())];
            suite.measure("writer", params, || {
                n += 1;
                let scratch = super::TempDir::new(&opts.dir, "files", &n.to_string())?;
                let raw = raw_write(&scratch.0, &pool, window)?;
                let ours = writer(&scratch.0, &pool, size, parts, window)?;
                let copy = memcpy(&pool, size, window.min(Duration::from_millis(300)));
                Ok(Metrics::new()
                    .with("events_per_s", ours.events as f64 / ours.seconds)
                    .with("mb_per_s", ours.mb_per_s())
                    .with("raw_write_mb_per_s", raw.mb_per_s())
                    .with("memcpy_mb_per_s", copy.mb_per_s())
                    .with("ratio_to_raw_write", ours.mb_per_s() / raw.mb_per_s()))
            })?;
        }
    }
    let s = |label: &str, metric: &'static str, parts: usize| Series {
        label: label.into(),
        case: "writer",
        metric,
        filter: vec![("parts", parts.into())],
    };
    suite.plots = vec![
        Plot::over_bytes(
            "the file writer, MB/s of payload vs event size",
            "event_bytes",
            "event size",
            "MB/s",
            true,
            vec![
                s("writer, 1 part", "mb_per_s", 1),
                s("writer, 8 parts", "mb_per_s", 8),
                s("write(2), 1 MiB blocks", "raw_write_mb_per_s", 1),
                s("memcpy", "memcpy_mb_per_s", 1),
            ],
        ),
        Plot::over_bytes(
            "the file writer against write(2) of 1 MiB blocks",
            "event_bytes",
            "event size",
            "ratio",
            false,
            vec![s("1 part", "ratio_to_raw_write", 1), s("8 parts", "ratio_to_raw_write", 8)],
        ),
    ];
    suite.note(super::machine_note());
    suite.note(format!(
        "directory: {} ({}); writer: FileWriter with its defaults (1 GiB files, each synced and renamed at \
         close, CRC32C of every payload); raw_write: write(2) of 1 MiB blocks into new 1 GiB files of the same \
         directory; memcpy: one copy of the same sizes into a 1 MiB buffer. Payload from a 64 MiB pool of distinct \
         bytes. MB = 10^6 bytes of payload.",
        opts.dir.display(),
        fs_type(&opts.dir)
    ));
    let pick = |size: f64, parts: f64| {
        suite.points.iter().find(|p| {
            p.case == "writer"
                && p.param("event_bytes").and_then(Param::num) == Some(size)
                && p.param("parts").and_then(Param::num) == Some(parts)
        })
    };
    if let Some(p) = pick(131072.0, 8.0).or_else(|| pick(65536.0, 1.0))
        && let Some(mb) = p.metric("mb_per_s")
    {
        let size = crate::format::bytes(p.param("event_bytes").and_then(Param::num).unwrap_or(0.0));
        let note = format!(
            "target: the file writer alone ≥ 3 GB/s on the 2-core VM (issue 29) — measured {:.2} GB/s at {size} events",
            mb.median / 1e3
        );
        suite.notes.push(note);
    }
    Ok(suite)
}

/// The filesystem type of `dir` (`tmpfs`, `ext4`, …) from /proc/self/mounts: the longest mount
/// point that holds it.
fn fs_type(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, kind) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(point).then(|| (point.len(), kind.to_owned()))
        })
        .max()
        .map_or_else(|| "filesystem unknown".into(), |(_, kind)| kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_point_writes_every_event_it_counts() {
        let dir = tempfile::tempdir().unwrap();
        let pool: Vec<u8> = pool().into_iter().take(4 << 20).collect();
        let m = writer(dir.path(), &pool, 16384, 8, Duration::from_millis(50)).unwrap();
        assert!(m.events > 0 && m.bytes == m.events * 16384);
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        let mut read = 0;
        for f in &files {
            let mut r = daqflow_wire::file::FileReader::open(f).unwrap();
            for i in 0..r.len().unwrap() {
                let rec = r.read_record(i).unwrap();
                let at = (rec.event_id.0 as usize % (pool.len() / 16384)) * 16384;
                assert_eq!(&rec.payload[..], &pool[at..at + 16384]);
                read += 1;
            }
        }
        assert_eq!(read, m.events);
    }

    #[test]
    fn the_filesystem_type_is_found() {
        assert_ne!(fs_type(Path::new("/")), "filesystem unknown");
    }
}
