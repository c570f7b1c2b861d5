//! Helpers shared by daqflow's fuzz targets (`fuzz_targets/`) and the seed generator
//! (`examples/seeds.rs`): the input of every protocol target is what a socket delivers, a
//! stream of daqflow frames (`docs/formats.md`), so that a seed is a recorded conversation and
//! every mutation is one a peer could send.

use bytes::{Bytes, BytesMut};
use daqflow_wire::frame::{Frame, FrameCodec};

/// The largest frame payload the targets take from an input (larger ones end the stream, as
/// a frame over its limit ends a connection).
pub const MAX_FRAME: u32 = 1 << 20;

/// The frames at the start of `data`, in order, up to the first that does not decode or is
/// not whole (where a connection would be closed, or would wait for more bytes).
pub fn frames(data: &[u8]) -> Vec<Frame> {
    let codec = FrameCodec::new(MAX_FRAME);
    let mut buf = BytesMut::from(data);
    let mut out = Vec::new();
    while let Ok(Some(f)) = codec.decode(&mut buf) {
        out.push(f);
    }
    out
}

/// `frames` as bytes on the wire: the inverse of [`frames`].
pub fn wire(frames: &[Frame]) -> Vec<u8> {
    let codec = FrameCodec::new(MAX_FRAME);
    let mut buf = BytesMut::new();
    for f in frames {
        codec.encode(f, &mut buf);
    }
    buf.to_vec()
}

/// `data` as [`Bytes`].
pub fn bytes(data: &[u8]) -> Bytes {
    Bytes::copy_from_slice(data)
}

/// The kinds of the `daqflow` binary: its one registry (`crates/kinds`).
pub fn registry() -> daqflow_component::Registry {
    daqflow_kinds::standard()
}
