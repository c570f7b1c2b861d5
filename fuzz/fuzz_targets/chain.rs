//! The chain's messages (`crates/chain/src/protocol.rs`) as a repeater and a sink decode them,
//! and the stream checks a sink makes (from whole frames, and from heads as a forwarder does).
//! Each decoded message round-trips.
#![no_main]

use daqflow_chain::protocol::{CHUNK_HEADER_LEN, Message, StreamCheck, begin_frame_typed, chunk_frame, end_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frames = daqflow_fuzz::frames(data);
    let mut whole = StreamCheck::new(1, true);
    let mut heads = StreamCheck::new(1, false);
    for frame in &frames {
        if let Ok(m) = Message::decode(frame) {
            let again = match m {
                Message::Begin { run, data_type } => begin_frame_typed(run, data_type),
                Message::Chunk { header, has_crc } => chunk_frame(&header, has_crc, &frame.payload[CHUNK_HEADER_LEN..]),
                Message::End { last_sequence, bytes } => end_frame(last_sequence, bytes),
            };
            assert_eq!(Message::decode(&again), Ok(m), "a message round-trips");
        }
        let head = &frame.payload[..frame.payload.len().min(CHUNK_HEADER_LEN)];
        let a = whole.on_frame(frame).is_ok();
        let b = heads.on_head(frame.kind, frame.flags, head, frame.payload.len()).is_ok();
        assert_eq!(a, b, "a head decides as its whole frame does");
    }
    let _ = (whole.missing(), whole.crc_errors(), heads.sequence_errors());
});
