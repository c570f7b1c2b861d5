//! The transport's receive path: frame headers and payloads split off a byte stream by
//! `RecvBuffer` (reads of any size, limits per kind), checked against `FrameCodec::decode` on
//! the whole stream, and every frame re-encoded to the bytes it came from.
#![no_main]

use bytes::BufMut;
use daqflow_fuzz::MAX_FRAME;
use daqflow_transport::RecvBuffer;
use daqflow_wire::frame::{FrameCodec, FrameLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shape, stream)) = data.split_first() else { return };
    // Per-kind limits as the protocols set them: small by default, one kind large.
    let limits = FrameLimits::uniform(512).with_kind(u16::from(shape & 0x0f), MAX_FRAME);
    let codec = FrameCodec::with_limits(limits);

    // The whole stream at once.
    let mut whole = bytes::BytesMut::from(stream);
    let mut expected = Vec::new();
    let expected_error = loop {
        match codec.decode(&mut whole) {
            Ok(Some(f)) => expected.push(f),
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    let mut again = bytes::BytesMut::new();
    for f in &expected {
        codec.encode(f, &mut again);
    }
    assert_eq!(&again[..], &stream[..again.len()], "frames re-encode to the bytes they came from");

    // The same stream through a receive buffer, read by reads of at most `step` bytes.
    let step = usize::from(shape >> 4) * 97 + 1;
    let mut rb = RecvBuffer::new(codec, 4096);
    let (mut pos, mut got) = (0, Vec::new());
    let error = 'read: loop {
        loop {
            match rb.next_frame() {
                Ok(Some(f)) => got.push(f),
                Ok(None) => break,
                Err(e) => break 'read Some(e),
            }
        }
        if pos == stream.len() {
            break None;
        }
        let mut b = match rb.read_buf() {
            Ok(b) => b,
            Err(e) => break Some(e),
        };
        let n = b.remaining_mut().min(step).min(stream.len() - pos);
        assert!(n > 0, "a read buffer always has room");
        b.put_slice(&stream[pos..pos + n]);
        pos += n;
    };
    assert_eq!(got, expected, "the receive buffer hands out the frames the codec decodes");
    assert_eq!(error, expected_error, "and stops at the same error");
});
