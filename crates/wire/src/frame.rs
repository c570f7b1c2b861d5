//! Control frames: the framing of every daqflow TCP protocol.
//!
//! A frame is a 16-byte header followed by `len` payload bytes:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 2 | magic: the bytes `D` `Q` (0x44, 0x51) |
//! | 2 | 1 | version (1) |
//! | 3 | 1 | flags (defined by the protocol) |
//! | 4 | 2 | kind (defined by the protocol) |
//! | 6 | 2 | reserved, zero |
//! | 8 | 4 | channel (defined by the protocol: a service id, a stream id, …) |
//! | 12 | 4 | payload length |
//!
//! [`FrameCodec`] refuses a frame longer than its configured maximum ([`FrameLimits`]: one
//! maximum, or a maximum per kind) as soon as the header has arrived, before any memory is
//! reserved for it, and never panics on any input.
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use daqflow_wire::frame::{Frame, FrameCodec};
//! let codec = FrameCodec::new(1 << 20);
//! let mut buf = BytesMut::new();
//! codec.encode(&Frame::new(7, Bytes::from_static(b"hello")), &mut buf);
//! codec.encode(&Frame::new(8, Bytes::new()).with_channel(3), &mut buf);
//! let first = codec.decode(&mut buf).unwrap().unwrap();
//! assert_eq!((first.kind, &first.payload[..]), (7, &b"hello"[..]));
//! let second = codec.decode(&mut buf).unwrap().unwrap();
//! assert_eq!((second.kind, second.channel), (8, 3));
//! assert!(codec.decode(&mut buf).unwrap().is_none());
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::le::{head, put_u16, put_u32, u16_at, u32_at};

/// Magic number of a frame header: the bytes `DQ`.
pub const FRAME_MAGIC: u16 = u16::from_le_bytes(*b"DQ");
/// Frame format version written and read by this build.
pub const FRAME_VERSION: u8 = 1;
/// Size of a frame header in bytes.
pub const FRAME_HEADER_LEN: usize = 16;
/// Default largest payload a [`FrameCodec`] accepts: 64 MiB.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 64 << 20;

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// Message kind, defined by the protocol that uses the frame.
    pub kind: u16,
    /// Flags, defined by the protocol.
    pub flags: u8,
    /// Channel, defined by the protocol (a service id, a stream id, a sequence number…).
    pub channel: u32,
    /// Payload length in bytes.
    pub len: u32,
}

/// A frame could not be decoded. The connection it came from cannot be trusted any more and is
/// closed by the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header does not start with the frame magic: the peer does not speak daqflow framing
    /// or the stream lost alignment.
    #[error("frame header: bad magic {found:#06x}, expected {expected:#06x} (the peer does not speak daqflow framing)", expected = FRAME_MAGIC)]
    BadMagic {
        /// What was found.
        found: u16,
    },
    /// The peer uses another version of the framing.
    #[error("frame header: version {found} is not supported (this build speaks version {FRAME_VERSION})")]
    UnsupportedVersion {
        /// What was found.
        found: u8,
    },
    /// Reserved bits are set.
    #[error("frame header: reserved field is {found:#06x}, must be zero")]
    ReservedNotZero {
        /// What was found.
        found: u16,
    },
    /// The frame is longer than this end accepts; nothing was allocated for it.
    #[error("frame of kind {kind} announces {len} payload bytes, more than the configured maximum of {max}")]
    TooLarge {
        /// The frame's kind.
        kind: u16,
        /// Announced payload length.
        len: u32,
        /// The configured maximum.
        max: u32,
    },
}

impl FrameHeader {
    /// The bytes of this header.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        put_u16(&mut h, 0, FRAME_MAGIC);
        h[2] = FRAME_VERSION;
        h[3] = self.flags;
        put_u16(&mut h, 4, self.kind);
        // 6..8 reserved
        put_u32(&mut h, 8, self.channel);
        put_u32(&mut h, 12, self.len);
        h
    }

    /// Decodes a header, refusing payloads longer than `max_len`.
    pub fn decode(h: &[u8; FRAME_HEADER_LEN], max_len: u32) -> Result<Self, FrameError> {
        Self::decode_limited(h, &FrameLimits::uniform(max_len))
    }

    /// Decodes a header, refusing payloads longer than `limits` allows for its kind.
    pub fn decode_limited(h: &[u8; FRAME_HEADER_LEN], limits: &FrameLimits) -> Result<Self, FrameError> {
        let magic = u16_at(h, 0);
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if h[2] != FRAME_VERSION {
            return Err(FrameError::UnsupportedVersion { found: h[2] });
        }
        let reserved = u16_at(h, 6);
        if reserved != 0 {
            return Err(FrameError::ReservedNotZero { found: reserved });
        }
        let header = FrameHeader { flags: h[3], kind: u16_at(h, 4), channel: u32_at(h, 8), len: u32_at(h, 12) };
        let max = limits.max_for(header.kind);
        if header.len > max {
            return Err(FrameError::TooLarge { kind: header.kind, len: header.len, max });
        }
        Ok(header)
    }
}

/// A frame: kind, flags, channel and a payload that shares memory with the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// Message kind, defined by the protocol.
    pub kind: u16,
    /// Flags, defined by the protocol.
    pub flags: u8,
    /// Channel, defined by the protocol.
    pub channel: u32,
    /// The payload.
    pub payload: Bytes,
}

impl Frame {
    /// A frame of `kind` with `payload`, flags and channel zero.
    pub fn new(kind: u16, payload: Bytes) -> Self {
        Frame { kind, flags: 0, channel: 0, payload }
    }

    /// The same frame on `channel`.
    pub fn with_channel(mut self, channel: u32) -> Self {
        self.channel = channel;
        self
    }

    /// The same frame with `flags`.
    pub fn with_flags(mut self, flags: u8) -> Self {
        self.flags = flags;
        self
    }

    /// The frame's header.
    ///
    /// # Panics
    /// If the payload is 4 GiB or longer, which no sender may build.
    pub fn header(&self) -> FrameHeader {
        let len = u32::try_from(self.payload.len()).expect("frame payload of 4 GiB or more");
        FrameHeader { kind: self.kind, flags: self.flags, channel: self.channel, len }
    }

    /// Bytes on the wire: header and payload.
    pub fn wire_len(&self) -> usize {
        FRAME_HEADER_LEN + self.payload.len()
    }
}

/// Most kinds a [`FrameLimits`] can give a maximum of their own.
pub const MAX_KIND_LIMITS: usize = 6;

/// The largest payload accepted, for every kind or per kind: a protocol lets the one or two
/// kinds that carry data be large and keeps every other kind small, so that a peer cannot make
/// the receiver hold a large partial frame of a kind that never needs one.
///
/// ```
/// use daqflow_wire::frame::FrameLimits;
/// let limits = FrameLimits::uniform(4096).with_kind(22, 1 << 20);
/// assert_eq!(limits.max_for(22), 1 << 20);
/// assert_eq!(limits.max_for(7), 4096);
/// assert_eq!(limits.largest(), 1 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    default: u32,
    kinds: [(u16, u32); MAX_KIND_LIMITS],
    n: u8,
}

impl FrameLimits {
    /// The same maximum for every kind.
    pub const fn uniform(max: u32) -> Self {
        FrameLimits { default: max, kinds: [(0, 0); MAX_KIND_LIMITS], n: 0 }
    }

    /// The same limits, with `max` for frames of `kind` (replacing an earlier one for it).
    ///
    /// # Panics
    /// With more than [`MAX_KIND_LIMITS`] kinds: a protocol's limits are written in its code.
    pub const fn with_kind(mut self, kind: u16, max: u32) -> Self {
        let mut i = 0;
        while i < self.n as usize {
            if self.kinds[i].0 == kind {
                self.kinds[i].1 = max;
                return self;
            }
            i += 1;
        }
        assert!((self.n as usize) < MAX_KIND_LIMITS, "too many per-kind frame limits");
        self.kinds[self.n as usize] = (kind, max);
        self.n += 1;
        self
    }

    /// The largest payload accepted for a frame of `kind`.
    #[inline]
    pub fn max_for(&self, kind: u16) -> u32 {
        for &(k, max) in &self.kinds[..self.n as usize] {
            if k == kind {
                return max;
            }
        }
        self.default
    }

    /// The largest payload accepted for any kind.
    pub fn largest(&self) -> u32 {
        self.kinds[..self.n as usize].iter().map(|k| k.1).fold(self.default, u32::max)
    }
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits::uniform(DEFAULT_MAX_FRAME_LEN)
    }
}

/// Encodes frames into and decodes frames out of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCodec {
    limits: FrameLimits,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl FrameCodec {
    /// A codec that refuses payloads longer than `max_frame_len` bytes.
    pub fn new(max_frame_len: u32) -> Self {
        FrameCodec { limits: FrameLimits::uniform(max_frame_len) }
    }

    /// A codec that refuses payloads longer than `limits` allows for their kind.
    pub fn with_limits(limits: FrameLimits) -> Self {
        FrameCodec { limits }
    }

    /// The largest payload accepted for any kind.
    pub fn max_frame_len(&self) -> u32 {
        self.limits.largest()
    }

    /// The limits.
    pub fn limits(&self) -> &FrameLimits {
        &self.limits
    }

    /// Appends `frame` to `out`.
    pub fn encode(&self, frame: &Frame, out: &mut BytesMut) {
        out.reserve(frame.wire_len());
        out.put_slice(&frame.header().encode());
        out.put_slice(&frame.payload);
    }

    /// The header at the front of `buf`, once all 16 bytes of it are there.
    pub fn peek_header(&self, buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
        match head::<FRAME_HEADER_LEN>(buf) {
            Some(h) => FrameHeader::decode_limited(h, &self.limits).map(Some),
            None => Ok(None),
        }
    }

    /// Takes the next whole frame off the front of `buf` without copying its payload. Returns
    /// `Ok(None)` if the frame is not complete yet; [`FrameCodec::bytes_needed`] says how much
    /// more to read.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(header) = self.peek_header(buf)? else {
            return Ok(None);
        };
        let total = FRAME_HEADER_LEN + header.len as usize;
        if buf.len() < total {
            return Ok(None);
        }
        buf.advance(FRAME_HEADER_LEN);
        let payload = buf.split_to(header.len as usize).freeze();
        Ok(Some(Frame { kind: header.kind, flags: header.flags, channel: header.channel, payload }))
    }

    /// How many bytes must be in the buffer for the frame at its front to be complete (at least
    /// a header). Lets a reader reserve room for a large frame once, after its header is checked.
    pub fn bytes_needed(&self, buf: &[u8]) -> Result<usize, FrameError> {
        Ok(match self.peek_header(buf)? {
            Some(h) => FRAME_HEADER_LEN + h.len as usize,
            None => FRAME_HEADER_LEN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_frame_is_refused_from_the_header_alone() {
        let codec = FrameCodec::new(100);
        let h = FrameHeader { kind: 1, flags: 0, channel: 0, len: 101 }.encode();
        let mut buf = BytesMut::from(&h[..]);
        assert_eq!(codec.decode(&mut buf), Err(FrameError::TooLarge { kind: 1, len: 101, max: 100 }));
    }

    #[test]
    fn a_kind_of_its_own_may_be_larger_and_the_others_stay_small() {
        let codec = FrameCodec::with_limits(FrameLimits::uniform(100).with_kind(9, 1000).with_kind(9, 2000));
        let large = FrameHeader { kind: 9, flags: 0, channel: 0, len: 2000 }.encode();
        assert!(codec.peek_header(&large).unwrap().is_some());
        let other = FrameHeader { kind: 8, flags: 0, channel: 0, len: 101 }.encode();
        assert_eq!(codec.peek_header(&other), Err(FrameError::TooLarge { kind: 8, len: 101, max: 100 }));
        assert_eq!(codec.max_frame_len(), 2000);
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let codec = FrameCodec::default();
        let mut full = BytesMut::new();
        codec.encode(&Frame::new(2, Bytes::from(vec![9u8; 40])).with_flags(5), &mut full);
        for cut in 0..full.len() {
            let mut part = BytesMut::from(&full[..cut]);
            assert_eq!(codec.decode(&mut part), Ok(None), "cut at {cut}");
            assert_eq!(part.len(), cut, "nothing consumed from a partial frame");
        }
        assert_eq!(codec.bytes_needed(&full[..3]), Ok(16));
        assert_eq!(codec.bytes_needed(&full[..20]), Ok(56));
        let f = codec.decode(&mut full).unwrap().unwrap();
        assert_eq!((f.kind, f.flags, f.payload.len()), (2, 5, 40));
    }

    #[test]
    fn garbage_is_a_typed_error() {
        let codec = FrameCodec::default();
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n"[..]);
        assert!(matches!(codec.decode(&mut buf), Err(FrameError::BadMagic { .. })));
        let mut h = FrameHeader { kind: 1, flags: 0, channel: 0, len: 0 }.encode();
        h[6] = 1;
        assert!(matches!(codec.decode(&mut BytesMut::from(&h[..])), Err(FrameError::ReservedNotZero { .. })));
        h[6] = 0;
        h[2] = 2;
        assert!(matches!(codec.decode(&mut BytesMut::from(&h[..])), Err(FrameError::UnsupportedVersion { found: 2 })));
    }
}
