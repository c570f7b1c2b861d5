//! `daqflow inspect`: summaries and verification of data files.

use std::path::PathBuf;
use std::process::ExitCode;

use daqflow_wire::file::{FileReader, Problem, ScanItem, Verifier, VerifyReport};
use serde_json::json;

use crate::format;

/// Arguments of `daqflow inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Check every record and, for records that hold daqflow events, the event's structure and
    /// every fragment CRC; exit non-zero if anything is wrong (see the exit status below).
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object per file (one per line) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Data files: `.daq`, or `.daq.part` left behind by a writer that stopped.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

pub const AFTER_HELP: &str = "\
Exit status:
  0  every file was read (with --verify: and is intact)
  1  --verify found a damaged record, bytes that are not records, or a trailer that is damaged
     or disagrees with the records
  2  a file could not be read as a daqflow data file
  3  --verify: the records are intact but a file was cut short or never closed (a writer died)

Examples:
  daqflow inspect data/run000123_*.daq
  daqflow inspect --verify data/run000123_bu-1_0007.daq.part
  daqflow inspect --json data/*.daq | jq .events";

/// What one file holds.
struct Summary {
    sizes: Vec<u32>,
    /// The event ids of the first and the last record in file order.
    first: Option<u64>,
    last: Option<u64>,
    /// The smallest and the largest event id (a file need not be in id order: a builder unit
    /// writes events as they are built).
    min: Option<u64>,
    max: Option<u64>,
    report: VerifyReport,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut worst = 0u8;
    for path in &args.files {
        // Opening a FIFO blocks until someone writes to it, and a device or a directory is no
        // data file: only regular files are opened.
        if let Some(what) = not_a_regular_file(path) {
            if args.json {
                println!("{}", json!({ "file": path, "error": what }));
            } else {
                eprintln!("{}: {what}", path.display());
            }
            worst = worst.max(2);
            continue;
        }
        let reader = match FileReader::open(path) {
            Ok(r) => r,
            Err(e) => {
                if args.json {
                    println!("{}", json!({ "file": path, "error": e.to_string() }));
                } else {
                    eprintln!("{}: {e}", path.display());
                }
                worst = worst.max(2);
                continue;
            }
        };
        let summary = match summarize(&reader, args.verify) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                worst = worst.max(2);
                continue;
            }
        };
        if args.json {
            println!("{}", to_json(path, &reader, &summary, args.verify));
        } else {
            print_text(path, &reader, &summary, args.verify);
        }
        if args.verify {
            let code = if !summary.report.problems.is_empty() {
                1
            } else if !summary.report.is_clean() {
                3
            } else {
                0
            };
            // 1 (damage) outranks 3 (cut short), which outranks 0.
            worst = match (worst, code) {
                (2, _) | (_, 2) => 2,
                (1, _) | (_, 1) => 1,
                (a, b) => a.max(b),
            };
        }
    }
    Ok(ExitCode::from(worst))
}

/// Why `path` is not to be opened as a data file (it does not exist, or is not a regular
/// file: a FIFO, a socket, a device, a directory), or `None` for a regular file. Symbolic
/// links are followed.
fn not_a_regular_file(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let t = match std::fs::metadata(path) {
        Ok(m) => m.file_type(),
        Err(e) => return Some(e.to_string()),
    };
    let what = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    };
    Some(format!("is {what}, not a regular file; refusing to read it as a data file"))
}

fn summarize(reader: &FileReader, deep: bool) -> anyhow::Result<Summary> {
    let mut verifier = Verifier::new(deep);
    let mut sizes = Vec::new();
    let (mut first, mut last, mut min, mut max) = (None, None, None::<u64>, None::<u64>);
    for item in reader.scan() {
        let item = item?;
        if let ScanItem::Record(r) | ScanItem::CrcMismatch { record: r, .. } = &item {
            let id = r.event_id.0;
            sizes.push(r.payload.len() as u32);
            first.get_or_insert(id);
            last = Some(id);
            min = Some(min.map_or(id, |m| m.min(id)));
            max = Some(max.map_or(id, |m| m.max(id)));
        }
        verifier.observe(&item);
    }
    Ok(Summary { sizes, first, last, min, max, report: verifier.finish(reader) })
}

struct Stats {
    min: u32,
    median: u32,
    mean: f64,
    max: u32,
    /// `(upper bound in bytes, count)` of power-of-two buckets, from the smallest non-empty one.
    histogram: Vec<(u64, u64)>,
}

fn stats(sizes: &[u32]) -> Option<Stats> {
    if sizes.is_empty() {
        return None;
    }
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let mut buckets = [0u64; 33];
    for &s in sizes {
        buckets[(32 - s.max(1).saturating_sub(1).leading_zeros()) as usize] += 1;
    }
    let lo = buckets.iter().position(|&c| c > 0).unwrap_or(0);
    let hi = buckets.iter().rposition(|&c| c > 0).unwrap_or(0);
    Some(Stats {
        min: sorted[0],
        median: sorted[sorted.len() / 2],
        mean: sizes.iter().map(|&s| s as f64).sum::<f64>() / sizes.len() as f64,
        max: sorted[sorted.len() - 1],
        histogram: (lo..=hi).map(|b| (1u64 << b, buckets[b])).collect(),
    })
}

fn digest_hex(d: &[u8; 32]) -> String {
    if d.iter().all(|&b| b == 0) { "none".into() } else { d.iter().map(|b| format!("{b:02x}")).collect() }
}

fn print_text(path: &std::path::Path, reader: &FileReader, s: &Summary, verify: bool) {
    let h = reader.header();
    let (ma, mi, pa) = h.writer_version_parts();
    println!("{}", path.display());
    println!(
        "  run {}, file {}, created {}, written by daqflow {ma}.{mi}.{pa}",
        h.run_number,
        h.file_sequence,
        format::utc(h.creation_time_ns)
    );
    println!("  config digest: {}", digest_hex(&h.config_digest));
    let r = &s.report;
    match (s.first, s.last, s.min, s.max) {
        (Some(a), Some(b), Some(lo), Some(hi)) => println!(
            "  events: {} (event ids {lo} … {hi}; first {a}, last {b} in file order), {} of event data, file {}",
            r.records,
            format::bytes(r.payload_bytes as f64),
            format::bytes(reader.size() as f64)
        ),
        _ => println!("  events: 0"),
    }
    if let Some(st) = stats(&s.sizes) {
        println!(
            "  event size: min {}, median {}, mean {}, max {}",
            format::bytes(st.min as f64),
            format::bytes(st.median as f64),
            format::bytes(st.mean),
            format::bytes(st.max as f64)
        );
        let peak = st.histogram.iter().map(|&(_, c)| c).max().unwrap_or(1).max(1);
        for (upper, count) in &st.histogram {
            let bar = "#".repeat(((*count as f64 / peak as f64) * 40.0).ceil() as usize);
            println!("    ≤ {:>9}  {:>10}  {bar}", format::bytes(*upper as f64), count);
        }
    }
    match reader.trailer_problem() {
        None => println!(
            "  closed properly: trailer with an index of {} events",
            reader.footer().map_or(0, |f| f.event_count)
        ),
        // Damage is listed with the other problems below.
        Some(p) if p.is_damage() => println!("  closed, but its trailer is DAMAGED (the records were scanned instead)"),
        Some(p) => println!("  NOT closed properly: {p}"),
    }
    if let Some((offset, len, needed)) = r.cut_short {
        println!(
            "  CUT SHORT: the file ends inside a record at offset {offset} ({len} of {} bytes present); \
             every whole event before it was read",
            if needed > 0 { needed.to_string() } else { "its header's".into() }
        );
    }
    for p in &r.problems {
        println!("  DAMAGED: {p}");
    }
    if verify {
        if r.problems.is_empty() {
            println!(
                "  verified: every record CRC matches{}",
                if r.events_checked > 0 {
                    format!("; {} events checked fragment by fragment", r.events_checked)
                } else {
                    String::new()
                }
            );
        } else {
            let first = &r.problems[0];
            let what = match first {
                Problem::RecordCrc { index, event_id, .. } | Problem::BadEvent { index, event_id, .. } => {
                    format!("first bad record: {index} (event {event_id})")
                }
                other => format!("first problem: {other}"),
            };
            println!("  verification FAILED: {} problem(s); {what}", r.problems.len());
        }
    }
}

fn to_json(path: &std::path::Path, reader: &FileReader, s: &Summary, verify: bool) -> serde_json::Value {
    let h = reader.header();
    let (ma, mi, pa) = h.writer_version_parts();
    let st = stats(&s.sizes);
    let r = &s.report;
    json!({
        "file": path,
        "run": h.run_number,
        "sequence": h.file_sequence,
        "created_ns": h.creation_time_ns,
        "writer_version": format!("{ma}.{mi}.{pa}"),
        "config_digest": digest_hex(&h.config_digest),
        "complete": reader.is_complete(),
        "trailer_problem": reader.trailer_problem().map(ToString::to_string),
        "events": r.records,
        "payload_bytes": r.payload_bytes,
        "file_bytes": reader.size(),
        "first_event": s.first,
        "last_event": s.last,
        "min_event": s.min,
        "max_event": s.max,
        "size_bytes": st.as_ref().map(|st| json!({"min": st.min, "median": st.median, "mean": st.mean, "max": st.max})),
        "histogram": st.as_ref().map(|st| st.histogram.iter().map(|(u, c)| json!({"upper_bytes": u, "count": c})).collect::<Vec<_>>()),
        "cut_short": r.cut_short.map(|(offset, len, needed)| json!({"offset": offset, "bytes": len, "needed": needed})),
        "verified": verify,
        "events_checked": r.events_checked,
        "problems": r.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
    })
}
