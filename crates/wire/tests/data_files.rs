//! The data file: round trips, rotation, truncation recovery and corruption detection on real files.

use std::fs;

use daqflow_wire::EventId;
use daqflow_wire::file::*;
use proptest::prelude::*;

fn event_payload(id: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (id as usize * 31 + i * 7) as u8).collect()
}

fn write_file(dir: &std::path::Path, sizes: &[usize]) -> ClosedFile {
    let mut cfg = FileWriterConfig::new(dir, 123);
    cfg.sync_on_close = false;
    let mut w = FileWriter::new(cfg).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        w.write_event(EventId(i as u64 + 1000), &event_payload(i as u64, len)).unwrap();
    }
    let mut files = w.finish().unwrap();
    assert_eq!(files.len(), 1);
    files.remove(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn file_round_trips(sizes in proptest::collection::vec(0usize..3000, 0..40)) {
        let dir = tempfile::tempdir().unwrap();
        let closed = write_file(dir.path(), &sizes);
        prop_assert_eq!(closed.events, sizes.len() as u64);
        prop_assert_eq!(closed.file_bytes, fs::metadata(&closed.path).unwrap().len());
        let mut r = FileReader::open(&closed.path).unwrap();
        prop_assert!(r.is_complete());
        prop_assert_eq!(r.header().run_number, 123);
        prop_assert_eq!(r.header().file_sequence, 1);
        let scanned: Vec<Record> = r.scan().map(|i| match i.unwrap() {
            ScanItem::Record(rec) => rec,
            other => panic!("unexpected {other:?}"),
        }).collect();
        prop_assert_eq!(scanned.len(), sizes.len());
        for (i, rec) in scanned.iter().enumerate() {
            prop_assert_eq!(rec.event_id, EventId(i as u64 + 1000));
            prop_assert_eq!(&rec.payload[..], &event_payload(i as u64, sizes[i])[..]);
        }
        // Random access through the trailer's index, in reverse order.
        for i in (0..sizes.len()).rev() {
            prop_assert_eq!(&r.read_record(i as u64).unwrap(), &scanned[i]);
        }
        prop_assert!(r.verify(true).unwrap().is_clean());
    }

    /// Records small and larger than the write buffer, in any number of parts, with any buffer
    /// size, flushed at any point and rotated by size, read back record for record.
    #[test]
    fn records_of_any_size_in_any_parts_round_trip(
        events in proptest::collection::vec(
            (prop_oneof![0usize..200, 1000usize..5000, 30_000usize..140_000], 1usize..12, any::<bool>()),
            1..30,
        ),
        buffer in prop_oneof![Just(4096usize), 5000usize..70_000, Just(1 << 20)],
        max_file in prop_oneof![Just(1u64 << 30), 100_000u64..600_000],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FileWriterConfig::new(dir.path(), 7);
        cfg.sync_on_close = false;
        cfg.buffer_bytes = buffer;
        cfg.max_file_bytes = max_file;
        let mut w = FileWriter::new(cfg).unwrap();
        for (i, &(len, parts, flush)) in events.iter().enumerate() {
            let payload = event_payload(i as u64, len);
            let chunk = len.div_ceil(parts).max(1);
            let slices: Vec<&[u8]> = payload.chunks(chunk).collect();
            w.write_event_parts(EventId(i as u64), &slices).unwrap();
            if flush {
                w.flush().unwrap();
            }
        }
        let files = w.finish().unwrap();
        let mut read = Vec::new();
        for f in &files {
            prop_assert_eq!(f.file_bytes, fs::metadata(&f.path).unwrap().len());
            let mut r = FileReader::open(&f.path).unwrap();
            prop_assert!(r.is_complete());
            prop_assert!(r.verify(true).unwrap().is_clean());
            for k in 0..r.len().unwrap() {
                read.push(r.read_record(k).unwrap());
            }
        }
        prop_assert_eq!(read.len(), events.len());
        for (i, rec) in read.iter().enumerate() {
            prop_assert_eq!(rec.event_id, EventId(i as u64));
            prop_assert_eq!(&rec.payload[..], &event_payload(i as u64, events[i].0)[..]);
        }
    }

    #[test]
    fn a_truncated_file_yields_exactly_its_whole_records(
        sizes in proptest::collection::vec(0usize..500, 1..20),
        cut in any::<proptest::sample::Index>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let closed = write_file(dir.path(), &sizes);
        let full = fs::read(&closed.path).unwrap();
        let cut = cut.index(full.len());
        let data = full[..cut].to_vec();
        let Ok(mut r) = FileReader::from_source(data, "<cut>") else {
            prop_assert!(cut < FILE_HEADER_LEN, "only a cut inside the header may fail to open");
            return Ok(());
        };
        // Where each record starts, where its payload ends and where it ends (padding included).
        // A record whose payload is complete is returned even if its padding was cut off: its
        // data is all there and its CRC is checked.
        let (mut starts, mut payload_ends, mut ends) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = FILE_HEADER_LEN as u64;
        for &s in &sizes {
            starts.push(at);
            payload_ends.push(at + RECORD_HEADER_LEN as u64 + s as u64);
            at += record_len(s);
            ends.push(at);
        }
        let cut64 = cut as u64;
        let whole = payload_ends.iter().filter(|&&e| e <= cut64).count();
        let items: Vec<ScanItem> = r.scan().map(|i| i.unwrap()).collect();
        let records: Vec<&Record> = items.iter().filter_map(|i| match i { ScanItem::Record(r) => Some(r), _ => None }).collect();
        if r.is_complete() {
            prop_assert_eq!(cut, full.len());
        }
        prop_assert_eq!(records.len(), whole, "items: {:?}", items);
        for (i, rec) in records.iter().enumerate() {
            prop_assert_eq!(&rec.payload[..], &event_payload(i as u64, sizes[i])[..]);
        }
        // Cut inside a record's header or payload, or inside the first bytes of the index marker
        // (which cannot be told from the start of a record header): the scan says so.
        let last = *ends.last().unwrap();
        let inside_a_record = starts.iter().zip(&payload_ends).any(|(&s, &e)| s < cut64 && cut64 < e);
        let cut_inside_records = inside_a_record || (cut64 > last && cut64 < last + 8);
        let reported_cut = items.iter().any(|i| matches!(i, ScanItem::CutShort { .. }));
        prop_assert_eq!(reported_cut, cut_inside_records);
        prop_assert_eq!(r.len().unwrap(), whole as u64);
        let report = r.verify(true).unwrap();
        prop_assert_eq!(report.records, whole as u64);
        prop_assert!(report.problems.iter().all(|p| matches!(p, Problem::Garbage { .. })), "{:?}", report.problems);
    }
}

#[test]
fn a_flipped_payload_byte_is_reported_with_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let closed = write_file(dir.path(), &[100, 200, 300, 400]);
    let mut data = fs::read(&closed.path).unwrap();
    // Record 2 starts after the header and records 0 and 1.
    let rec2 = FILE_HEADER_LEN as u64 + record_len(100) + record_len(200);
    data[(rec2 + RECORD_HEADER_LEN as u64 + 17) as usize] ^= 0x40;
    let mut r = FileReader::from_source(data, "<flipped>").unwrap();
    let report = r.verify(false).unwrap();
    assert_eq!(report.records, 4);
    assert_eq!(report.problems.len(), 1);
    match &report.problems[0] {
        Problem::RecordCrc { index, offset, event_id, .. } => {
            assert_eq!((*index, *offset, *event_id), (2, rec2, EventId(1002)));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(report.problems[0].to_string().starts_with("record 2 (event 1002) at offset"));
    let err = r.read_record(2).unwrap_err();
    assert!(err.to_string().contains("CRC32C"), "{err}");
    assert!(r.read_record(3).is_ok(), "the record after the bad one is still readable");
}

#[test]
fn a_damaged_record_header_is_skipped_and_the_rest_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let closed = write_file(dir.path(), &[64, 64, 64, 64]);
    let mut data = fs::read(&closed.path).unwrap();
    let rec1 = FILE_HEADER_LEN as u64 + record_len(64);
    data[rec1 as usize + 5] ^= 0xff; // the length field of record 1; its header CRC now fails
    let r = FileReader::from_source(data, "<damaged>").unwrap();
    let items: Vec<ScanItem> = r.scan().map(|i| i.unwrap()).collect();
    let ids: Vec<u64> = items
        .iter()
        .filter_map(|i| match i {
            ScanItem::Record(r) => Some(r.event_id.0),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [1000, 1002, 1003]);
    assert!(matches!(items[1], ScanItem::Garbage { offset, len } if offset == rec1 && len == record_len(64)));
}

#[test]
fn files_rotate_by_size_and_keep_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileWriterConfig::new(dir.path(), 7);
    cfg.max_file_bytes = 10_000;
    cfg.stream = Some("bu-1".into());
    cfg.config_digest = [0xab; 32];
    let mut w = FileWriter::new(cfg).unwrap();
    for i in 0..100u64 {
        w.write_event(EventId(i), &event_payload(i, 1000)).unwrap();
        if i == 0 {
            let part = w.current_path().unwrap().to_path_buf();
            assert!(part.to_string_lossy().ends_with("run000007_bu-1_0001.daq.part"));
            assert!(part.exists());
        }
    }
    let files = w.finish().unwrap();
    assert!(files.len() >= 10, "{} files", files.len());
    let mut next = 0u64;
    for (i, f) in files.iter().enumerate() {
        assert_eq!(f.sequence, i as u32 + 1);
        assert_eq!(f.path.file_name().unwrap().to_string_lossy(), format!("run000007_bu-1_{:04}.daq", i + 1));
        assert!(f.file_bytes <= 10_000);
        let r = FileReader::open(&f.path).unwrap();
        assert_eq!(r.header().config_digest, [0xab; 32]);
        assert_eq!(r.header().file_sequence, f.sequence);
        for item in r.scan() {
            let ScanItem::Record(rec) = item.unwrap() else { panic!("bad record") };
            assert_eq!(rec.event_id, EventId(next));
            next += 1;
        }
    }
    assert_eq!(next, 100);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), files.len(), "no .part file left behind");
}

#[test]
fn an_existing_file_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), &[10]);
    let mut cfg = FileWriterConfig::new(dir.path(), 123);
    cfg.sync_on_close = false;
    let err = FileWriter::new(cfg).err().expect("the writer must refuse the existing file");
    assert!(matches!(err, FileWriteError::FileExists { .. }), "{err}");
    assert!(err.to_string().contains("run000123_0001.daq exists already"), "{err}");
}

#[test]
fn a_run_without_events_leaves_a_valid_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let closed = write_file(dir.path(), &[]);
    assert_eq!((closed.events, closed.first_event), (0, None));
    let mut r = FileReader::open(&closed.path).unwrap();
    assert!(r.is_complete());
    assert_eq!(r.len().unwrap(), 0);
    assert!(r.verify(true).unwrap().is_clean());
}

#[test]
fn a_failed_writer_refuses_further_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileWriterConfig::new(dir.path(), 1);
    cfg.sync_on_close = false;
    let mut w = FileWriter::new(cfg).unwrap();
    let huge = vec![0u8; MAX_RECORD_LEN as usize + 1];
    assert!(matches!(w.write_event(EventId(1), &huge), Err(FileWriteError::RecordTooLarge { .. })));
    assert!(matches!(w.write_event(EventId(2), b"y"), Err(FileWriteError::Failed)));
}

#[test]
fn an_unclosed_part_file_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = FileWriterConfig::new(dir.path(), 5);
    cfg.buffer_bytes = 4096;
    let mut w = FileWriter::new(cfg).unwrap();
    for i in 0..50u64 {
        w.write_event(EventId(i), &event_payload(i, 333)).unwrap();
    }
    w.flush().unwrap();
    let part = w.current_path().unwrap().to_path_buf();
    std::mem::forget(w); // as if the process died: no trailer, no rename
    let mut r = FileReader::open(&part).unwrap();
    assert!(!r.is_complete());
    assert_eq!(r.trailer_problem(), Some(&TrailerProblem::NotClosed));
    assert!(r.trailer_problem().unwrap().to_string().contains("not closed"));
    assert_eq!(r.len().unwrap(), 50);
    assert_eq!(&r.read_record(49).unwrap().payload[..], &event_payload(49, 333)[..]);
    let report = r.verify(false).unwrap();
    assert_eq!((report.records, report.cut_short, report.problems.len()), (50, None, 0));
    assert!(!report.is_clean(), "an unclosed file is not clean");
}

#[test]
fn a_writer_killed_before_its_first_flush_leaves_a_readable_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = FileWriter::new(FileWriterConfig::new(dir.path(), 6)).unwrap();
    w.write_event(EventId(1), b"still in the buffer").unwrap();
    let part = w.current_path().unwrap().to_path_buf();
    std::mem::forget(w); // as if the process died: nothing flushed
    // The header reached the file when it was created: a data file, not an empty one.
    let mut r = FileReader::open(&part).unwrap_or_else(|e| panic!("{}: {e}", part.display()));
    assert_eq!(r.header().run_number, 6);
    assert_eq!(r.len().unwrap(), 0);
}

/// A writer of run 9, stream `rec`, that dies (no trailer) after `events` whole records
/// reached its file; the `.part` path.
fn dead_writer(dir: &std::path::Path, stream: &str, events: u64) -> std::path::PathBuf {
    let mut cfg = FileWriterConfig::new(dir, 9);
    cfg.stream = Some(stream.into());
    let mut w = FileWriter::new(cfg).unwrap();
    for i in 0..events {
        w.write_event(EventId(i), &event_payload(i, 100)).unwrap();
    }
    w.flush().unwrap();
    let part = w.current_path().unwrap().to_path_buf();
    std::mem::forget(w);
    part
}

#[test]
fn a_writer_taking_over_a_stream_removes_the_part_files_that_hold_no_event_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let header_only = dead_writer(d, "rec", 0);
    let with_events = dead_writer(d, "rec.r1", 3);
    let other_stream = dead_writer(d, "other", 0);
    // What an older writer left: an empty file and a header cut short; a partial first record.
    let empty = d.join("run000009_rec_0002.daq.part");
    fs::write(&empty, b"").unwrap();
    let short = d.join("run000009_rec_0003.daq.part");
    fs::write(&short, &fs::read(&header_only).unwrap()[..40]).unwrap();
    let partial = d.join("run000009_rec_0004.daq.part");
    let mut bytes = fs::read(&with_events).unwrap();
    bytes.truncate(FILE_HEADER_LEN + 30);
    fs::write(&partial, &bytes).unwrap();
    // Not a daqflow file, a closed file, another run: never touched.
    let foreign = d.join("run000009_rec_0005.daq.part");
    fs::write(&foreign, vec![7u8; 200]).unwrap();
    let mut cfg = FileWriterConfig::new(d, 9);
    cfg.stream = Some("rec.r2".into());
    let closed = FileWriter::new(cfg).unwrap().finish().unwrap()[0].path.clone();
    let other_run = d.join("run000010_rec_0001.daq.part");
    fs::write(&other_run, b"").unwrap();

    let removed = remove_empty_part_files(d, 9, Some("rec")).unwrap();
    assert_eq!(removed, vec![header_only.clone(), empty.clone(), short.clone(), partial.clone()]);
    for gone in [&header_only, &empty, &short, &partial] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    for kept in [&with_events, &other_stream, &foreign, &closed, &other_run] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
    assert_eq!(remove_empty_part_files(d, 9, Some("rec.r1")).unwrap(), Vec::<std::path::PathBuf>::new());
    assert_eq!(FileReader::open(&with_events).unwrap().len().unwrap(), 3);
    // The stream's name is free again.
    let mut cfg = FileWriterConfig::new(d, 9);
    cfg.stream = Some("rec".into());
    assert!(FileWriter::new(cfg).is_ok());
    assert!(remove_empty_part_files(&d.join("missing"), 9, None).unwrap().is_empty());
}

#[test]
fn bad_stream_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["", "../x", "a/b", ".hidden", "sp ace"] {
        let mut cfg = FileWriterConfig::new(dir.path(), 1);
        cfg.stream = Some(bad.into());
        assert!(matches!(FileWriter::new(cfg), Err(FileWriteError::BadStreamName(_))), "{bad:?}");
    }
}

#[test]
fn a_closed_file_whose_footer_crc_is_bad_is_reported_as_damaged_not_as_unclosed() {
    let dir = tempfile::tempdir().unwrap();
    let closed = write_file(dir.path(), &[100, 200, 300]);
    let mut data = fs::read(&closed.path).unwrap();
    // A bit of the footer's payload-byte count (footer offset 24): its magic numbers stay.
    let at = data.len() - FOOTER_LEN + 24;
    data[at] ^= 0x01;
    let r = FileReader::from_source(data, "<footer>").unwrap();
    assert!(!r.is_complete());
    let problem = *r.trailer_problem().unwrap();
    assert!(matches!(problem, TrailerProblem::FooterCrc { stored, computed } if stored != computed), "{problem:?}");
    assert!(problem.is_damage());
    let text = problem.to_string();
    assert!(text.contains("footer is damaged") && text.contains("CRC32C"), "{text}");
    assert!(!text.contains("not closed"), "{text}");
    // Every record is still read (by a scan that stops at the index); the damage is a problem.
    let report = r.verify(true).unwrap();
    assert_eq!(report.records, 3);
    assert_eq!(report.problems, [Problem::Trailer(problem)]);
    assert!(!report.is_clean());
}

#[test]
fn a_file_magic_that_differs_after_byte_four_is_shown_as_the_eight_bytes_compared() {
    let dir = tempfile::tempdir().unwrap();
    let closed = write_file(dir.path(), &[10]);
    let mut data = fs::read(&closed.path).unwrap();
    data[7] = b'X'; // DQFLFILE → DQFLFILX: the first four bytes still match
    let Err(err) = FileReader::from_source(data, "<magic>") else { panic!("a bad magic was accepted") };
    let err = err.to_string();
    assert!(err.contains(r#"44 51 46 4c 46 49 4c 58 ("DQFLFILX")"#), "{err}");
    assert!(err.contains(r#"expected 44 51 46 4c 46 49 4c 45 ("DQFLFILE")"#), "{err}");
}
