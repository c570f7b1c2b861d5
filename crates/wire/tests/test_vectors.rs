//! The worked examples of docs/formats.md, byte for byte. They were computed by an independent
//! implementation (a few lines of Python with a bitwise CRC32C), so a reader written from the
//! document can be checked against them.

use bytes::Bytes;
use daqflow_wire::file::{FileHeader, RecordHeader};
use daqflow_wire::frame::{Frame, FrameCodec};
use daqflow_wire::*;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
}

#[test]
fn fragment_example() {
    let info = FragmentInfo {
        flags: FragmentFlags::empty(),
        source_id: 7,
        event_id: EventId(42),
        run_number: 123,
        trigger_type: 1,
        timestamp: 1000,
    };
    let expected = hex("44 46 52 47 01 00 30 00 00 00 00 00 07 00 00 00
                        2a 00 00 00 00 00 00 00 7b 00 00 00 01 00 00 00
                        e8 03 00 00 00 00 00 00 0c 00 00 00 1f a4 99 69
                        68 65 6c 6c 6f 2c 20 77 6f 72 6c 64 00 00 00 00");
    assert_eq!(&Fragment::encode(&info, b"hello, world")[..], &expected[..]);
    assert_eq!(crc::crc32c(b"hello, world"), 0x6999_a41f);
}

#[test]
fn frame_example() {
    let mut out = bytes::BytesMut::new();
    FrameCodec::default().encode(&Frame::new(3, Bytes::from_static(b"hello")).with_channel(9), &mut out);
    assert_eq!(&out[..], &hex("44 51 01 00 03 00 00 00 09 00 00 00 05 00 00 00 68 65 6c 6c 6f")[..]);
}

#[test]
fn file_header_example() {
    let h = FileHeader {
        flags: 0,
        run_number: 123,
        file_sequence: 1,
        creation_time_ns: 1_700_000_000_000_000_000,
        config_digest: [0; 32],
        writer_version: 0x00_01_00,
    };
    let expected = hex("44 51 46 4c 46 49 4c 45 01 00 48 00 00 00 00 00
                        7b 00 00 00 01 00 00 00 00 00 2a 36 fe 9c 97 17
                        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
                        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
                        00 01 00 00 63 4b da 2d");
    assert_eq!(&h.encode()[..], &expected[..]);
    assert_eq!(FileHeader::decode(&expected).unwrap(), h);
}

#[test]
fn record_header_example() {
    let h = RecordHeader { payload_len: 5, event_id: EventId(42), payload_crc: crc::crc32c(b"event") };
    assert_eq!(&h.encode()[..], &hex("44 52 45 43 05 00 00 00 2a 00 00 00 00 00 00 00 c4 a9 86 3f a4 66 b7 52")[..]);
}
