//! The framing core without sockets: whatever the write and read sizes, frames come out as
//! they went in.

use bytes::{BufMut, Bytes};
use daqflow_transport::{RecvBuffer, SendQueue};
use daqflow_wire::frame::{Frame, FrameCodec};
use proptest::prelude::*;

fn frames() -> impl Strategy<Value = Vec<Frame>> {
    proptest::collection::vec(
        (any::<u16>(), any::<u32>(), prop_oneof![0usize..100, 1900usize..2200, 60_000usize..70_000]).prop_map(
            |(kind, channel, len)| Frame::new(kind, Bytes::from(vec![(kind % 251) as u8; len])).with_channel(channel),
        ),
        0..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn queue_to_buffer_pipeline_preserves_frames(
        frames in frames(),
        writes in proptest::collection::vec(1usize..200_000, 1..20),
        reads in proptest::collection::vec(1usize..100_000, 1..20),
        coalesce in 64usize..300_000,
    ) {
        let mut q = SendQueue::new(usize::MAX, coalesce, 2048);
        for f in &frames {
            q.push(f.clone()).unwrap();
        }
        // The "socket": bytes written, not yet read.
        let mut wire: Vec<u8> = Vec::new();
        let mut i = 0;
        while !q.is_empty() {
            let mut slices = Vec::new();
            let avail = q.gather(&mut slices);
            let mut n = writes[i % writes.len()].min(avail);
            i += 1;
            let written = n;
            for s in &slices {
                let take = n.min(s.len());
                wire.extend_from_slice(&s[..take]);
                n -= take;
                if n == 0 { break; }
            }
            q.advance(written);
        }
        let mut rb = RecvBuffer::new(FrameCodec::new(1 << 20), 4096);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut j = 0;
        while pos < wire.len() {
            let mut buf = rb.read_buf().unwrap();
            let room = bytes::buf::Limit::limit(&buf).min(buf.get_ref().capacity() - buf.get_ref().len());
            prop_assert!(room > 0);
            let n = reads[j % reads.len()].min(room).min(wire.len() - pos);
            j += 1;
            buf.put_slice(&wire[pos..pos + n]);
            pos += n;
            while let Some(f) = rb.next_frame().unwrap() {
                out.push(f);
            }
        }
        prop_assert_eq!(rb.buffered(), 0);
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn random_bytes_into_the_receive_buffer_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let mut rb = RecvBuffer::new(FrameCodec::new(512), 4096);
        for chunk in data.chunks(37) {
            let Ok(mut buf) = rb.read_buf() else { break };
            let n = chunk.len().min(bytes::buf::Limit::limit(&buf));
            buf.put_slice(&chunk[..n]);
            while let Ok(Some(_)) = rb.next_frame() {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn prefixed_frames_arrive_as_one_payload(
        items in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..16), prop_oneof![0usize..64, 3000usize..5000], any::<bool>()), 1..30),
    ) {
        let mut q = SendQueue::new(usize::MAX, 128 << 10, 2048);
        let mut expected = Vec::new();
        for (i, (prefix, len, plain)) in items.iter().enumerate() {
            let payload = Bytes::from(vec![i as u8; *len]);
            if *plain {
                let mut whole = prefix.clone();
                whole.extend_from_slice(&payload);
                let f = Frame::new(1, Bytes::from(whole)).with_channel(i as u32);
                q.push(f.clone()).unwrap();
                expected.push(f);
            } else {
                q.push_prefixed_unbounded(2, 1, i as u32, prefix, payload.clone());
                let mut whole = prefix.clone();
                whole.extend_from_slice(&payload);
                expected.push(Frame::new(2, Bytes::from(whole)).with_channel(i as u32).with_flags(1));
            }
        }
        let mut wire = Vec::new();
        while !q.is_empty() {
            let mut slices = Vec::new();
            let n = q.gather(&mut slices);
            for s in &slices {
                wire.extend_from_slice(s);
            }
            drop(slices);
            q.advance(n);
        }
        let codec = FrameCodec::new(1 << 20);
        let mut buf = bytes::BytesMut::from(&wire[..]);
        let mut out = Vec::new();
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(f);
        }
        prop_assert_eq!(out, expected);
    }
}
