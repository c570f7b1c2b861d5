//! Property tests of every codec: round trips, and random bytes never panic.

use bytes::{Bytes, BytesMut};
use daqflow_wire::file::{FileHeader, FileReader, ScanItem};
use daqflow_wire::frame::{Frame, FrameCodec, FrameHeader};
use daqflow_wire::*;
use proptest::prelude::*;

fn fragment_info() -> impl Strategy<Value = FragmentInfo> {
    (any::<u32>(), any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
        |(flags, source_id, event, run_number, trigger_type, timestamp)| FragmentInfo {
            flags: FragmentFlags(flags),
            source_id,
            event_id: EventId(event),
            run_number,
            trigger_type,
            timestamp,
        },
    )
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u16>(), any::<u8>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..300)).prop_map(
        |(kind, flags, channel, payload)| {
            Frame::new(kind, Bytes::from(payload)).with_flags(flags).with_channel(channel)
        },
    )
}

proptest! {
    #[test]
    fn fragment_round_trips(info in fragment_info(), payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let bytes = Fragment::encode(&info, &payload);
        prop_assert_eq!(bytes.len() % 8, 0);
        let f = Fragment::parse(bytes).unwrap();
        prop_assert_eq!(f.header(), &info.header_for(&payload));
        prop_assert_eq!(f.payload_slice(), &payload[..]);
        prop_assert!(f.verify_crc().is_ok());
        prop_assert_eq!(FragmentHeader::decode(&f.header().encode()).unwrap(), *f.header());
    }

    #[test]
    fn super_fragment_and_event_round_trip(
        event in any::<u64>(),
        rus in proptest::collection::vec(proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 0..5), 0..5),
        bu in any::<u32>(),
        flags in any::<u32>(),
    ) {
        let id = EventId(event);
        let mut sfs = Vec::new();
        for (ru, payloads) in rus.iter().enumerate() {
            let fragments: Vec<Fragment> = payloads.iter().enumerate().map(|(s, p)| {
                let info = FragmentInfo { source_id: (ru * 100 + s) as u32, event_id: id, ..Default::default() };
                Fragment::parse(Fragment::encode(&info, p)).unwrap()
            }).collect();
            let bytes = SuperFragment::assemble(ru as u32, id, SuperFragmentFlags::default(), &fragments);
            let sf = SuperFragment::parse(bytes).unwrap();
            let back: Vec<Fragment> = sf.fragments().collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(&back, &fragments);
            prop_assert_eq!(SuperFragmentHeader::decode(&sf.header().encode()).unwrap(), *sf.header());
            sfs.push(sf);
        }
        let info = EventInfo { flags: EventFlags(flags), bu_id: bu, event_id: id, run_number: 1, trigger_type: 2 };
        let event = Event::parse(Event::assemble(&info, &sfs)).unwrap();
        prop_assert_eq!(EventHeader::decode(&event.header().encode()).unwrap(), *event.header());
        let back: Vec<SuperFragment> = event.super_fragments().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&back, &sfs);
        let check = event.check().unwrap();
        prop_assert!(check.crc_errors.is_empty() && check.id_mismatches.is_empty());
        prop_assert_eq!(check.fragments as usize, rus.iter().map(|r| r.len()).sum::<usize>());
    }

    #[test]
    fn frame_stream_round_trips_whatever_the_read_sizes(
        frames in proptest::collection::vec(frame(), 0..20),
        chunks in proptest::collection::vec(1usize..97, 1..50),
    ) {
        let codec = FrameCodec::new(1 << 16);
        let mut wire = BytesMut::new();
        for f in &frames {
            codec.encode(f, &mut wire);
            prop_assert_eq!(FrameHeader::decode(&f.header().encode(), 1 << 16).unwrap(), f.header());
        }
        let wire = wire.freeze();
        // Feed the stream in pieces of the given sizes, as reads from a socket would.
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < wire.len() {
            let n = chunks[i % chunks.len()].min(wire.len() - pos);
            buf.extend_from_slice(&wire[pos..pos + n]);
            pos += n;
            i += 1;
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn random_bytes_never_panic_any_decoder(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let bytes = Bytes::from(data.clone());
        let _ = FragmentHeader::decode(&data);
        if let Ok(f) = Fragment::parse(bytes.clone()) {
            let _ = f.verify_crc();
        }
        if let Ok(sf) = SuperFragment::parse(bytes.clone()) {
            for f in sf.fragments() { let _ = f.map(|f| f.verify_crc()); }
        }
        if let Ok(e) = Event::parse(bytes.clone()) {
            let _ = e.check();
        }
        let codec = FrameCodec::new(1000);
        let mut buf = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = codec.decode(&mut buf) {}
        let _ = FileHeader::decode(&data);
        if let Ok(mut r) = FileReader::from_source(bytes, "<random>") {
            for item in r.scan() { let _ = item; }
            let _ = r.verify(true);
            if let Ok(n) = r.len() {
                for i in 0..n { let _ = r.read_record(i); }
            }
        }
    }

    #[test]
    fn valid_prefix_with_random_tail_never_panics(
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        cut in any::<proptest::sample::Index>(),
    ) {
        // Structures that start right (good magic and version) but go wrong later are the
        // dangerous ones: lengths and counts are then read from garbage.
        let info = FragmentInfo { source_id: 1, event_id: EventId(1), ..Default::default() };
        let frag = Fragment::parse(Fragment::encode(&info, &payload)).unwrap();
        let sf = SuperFragment::assemble(0, EventId(1), SuperFragmentFlags::default(), std::slice::from_ref(&frag));
        let ev = Event::assemble(&EventInfo { event_id: EventId(1), ..Default::default() }, &[SuperFragment::parse(sf.clone()).unwrap()]);
        for good in [frag.as_bytes().clone(), sf, ev] {
            let at = cut.index(good.len() + 1);
            let mut mixed = good[..at].to_vec();
            mixed.extend_from_slice(&tail);
            let b = Bytes::from(mixed);
            if let Ok(f) = Fragment::parse(b.clone()) { let _ = f.verify_crc(); }
            if let Ok(s) = SuperFragment::parse(b.clone()) { for f in s.fragments() { let _ = f; } }
            if let Ok(e) = Event::parse(b) { let _ = e.check(); }
        }
    }
}

/// Random bytes behind a valid file header: the scanner must skip or stop, never panic, and
/// random records with a valid header inside still come out.
#[test]
fn scan_of_a_valid_header_and_random_body_never_panics() {
    let header = FileHeader {
        flags: 0,
        run_number: 1,
        file_sequence: 1,
        creation_time_ns: 0,
        config_digest: [0; 32],
        writer_version: 1,
    };
    proptest!(|(body in proptest::collection::vec(any::<u8>(), 0..2000))| {
        let mut data = header.encode().to_vec();
        data.extend_from_slice(&body);
        let r = FileReader::from_source(data, "<random>").unwrap();
        let mut covered = 0u64;
        for item in r.scan() {
            match item.unwrap() {
                ScanItem::Garbage { len, .. } => covered += len,
                ScanItem::CutShort { len, .. } => covered += len,
                ScanItem::Record(rec) | ScanItem::CrcMismatch { record: rec, .. } => covered += daqflow_wire::file::record_len(rec.payload.len()),
            }
        }
        // Every byte after the header is accounted for, once.
        prop_assert_eq!(covered, body.len() as u64);
    });
}
