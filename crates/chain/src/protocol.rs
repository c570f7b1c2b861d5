//! The chain's data protocol: three frame kinds on a [`daqflow_transport`] connection, and
//! [`StreamCheck`], the pure state machine every receiving component runs over them. No I/O
//! happens here.
//!
//! | frame kind | payload (little-endian) |
//! | --- | --- |
//! | [`KIND_BEGIN`] `0x0D01` | run number `u32`, data type `u32` (0: untyped; else [`data_type_tag`] of the sending port's type) |
//! | [`KIND_CHUNK`] `0x0D02` | [`ChunkHeader`] (sequence `u64`, data length `u32`, CRC32C `u32`), then the data |
//! | [`KIND_END`] `0x0D03` | last sequence number `u64`, data bytes sent `u64` |
//!
//! The kinds are the chain's range of the registry ([`daqflow_wire::kinds::CHAIN`]).
//!
//! A stream is one begin, chunks with sequence numbers 1, 2, 3, …, and one end marker that says
//! how many chunks and bytes were sent, so that a receiver accounts for every chunk. A chunk's
//! frame flags carry [`FLAG_CRC`] when its header holds the CRC32C of its data (generator
//! `check = true`); without it the CRC field is zero. A repeater forwards every frame as it came.
//!
//! ```
//! use bytes::Bytes;
//! use daqflow_chain::protocol::{ChunkHeader, StreamCheck, StreamEvent, begin_frame, chunk_frame, end_frame};
//! let data = Bytes::from_static(b"payload");
//! let mut check = StreamCheck::new(7, true);
//! check.on_frame(&begin_frame(7))?;
//! let header = ChunkHeader::for_data(1, &data, true);
//! check.on_frame(&chunk_frame(&header, true, &data))?;
//! assert_eq!(check.on_frame(&end_frame(1, data.len() as u64))?, StreamEvent::End);
//! assert_eq!((check.chunks(), check.sequence_errors(), check.crc_errors()), (1, 0, 0));
//! # Ok::<(), daqflow_chain::protocol::StreamError>(())
//! ```

use bytes::{BufMut, BytesMut};
use daqflow_wire::codec::{Reader, Writer};
use daqflow_wire::crc::crc32c;
use daqflow_wire::frame::Frame;

/// The chain's protocol name in the transport's handshake (`docs/security.md`).
pub const PROTOCOL: &str = "chain";

/// Frame kind of the begin marker: the run number. It is also the chain's hello: a repeater
/// or sink takes as its upstream only a connection whose first frame is the begin marker of
/// its run.
pub const KIND_BEGIN: u16 = daqflow_wire::kinds::CHAIN.at(1);
/// Frame kind of a data chunk: a [`ChunkHeader`] and the data.
pub const KIND_CHUNK: u16 = daqflow_wire::kinds::CHAIN.at(2);
/// Frame kind of the end marker: last sequence number and bytes sent.
pub const KIND_END: u16 = daqflow_wire::kinds::CHAIN.at(3);
/// Chunk frame flag: the header's CRC field holds the CRC32C of the data.
pub const FLAG_CRC: u8 = 0x01;
/// Bytes of a [`ChunkHeader`].
pub const CHUNK_HEADER_LEN: usize = 16;
/// Bytes of a begin marker's payload.
pub const BEGIN_LEN: usize = 8;
/// Bytes of an end marker's payload.
pub const END_LEN: usize = 16;

/// The header in front of every chunk's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkHeader {
    /// Sequence number: 1 for the first chunk of a run, then one more for each.
    pub sequence: u64,
    /// Bytes of data after the header.
    pub len: u32,
    /// CRC32C of the data when the frame has [`FLAG_CRC`], else zero.
    pub crc: u32,
}

impl ChunkHeader {
    /// The header of chunk `sequence` carrying `data`, with its CRC if `crc`.
    ///
    /// # Panics
    /// If `data` is 4 GiB or longer, which no frame can carry.
    pub fn for_data(sequence: u64, data: &[u8], crc: bool) -> ChunkHeader {
        let len = u32::try_from(data.len()).expect("chunk of 4 GiB or more");
        ChunkHeader { sequence, len, crc: if crc { crc32c(data) } else { 0 } }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[0..8].copy_from_slice(&self.sequence.to_le_bytes());
        h[8..12].copy_from_slice(&self.len.to_le_bytes());
        h[12..16].copy_from_slice(&self.crc.to_le_bytes());
        h
    }

    /// The header at the front of `payload`, if it is long enough.
    pub fn decode(payload: &[u8]) -> Option<ChunkHeader> {
        let h: &[u8; CHUNK_HEADER_LEN] = payload.get(..CHUNK_HEADER_LEN)?.try_into().ok()?;
        Some(ChunkHeader {
            sequence: u64::from_le_bytes(h[0..8].try_into().ok()?),
            len: u32::from_le_bytes(h[8..12].try_into().ok()?),
            crc: u32::from_le_bytes(h[12..16].try_into().ok()?),
        })
    }
}

/// A frame that is not a chunk-protocol message. The connection it came from is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame's kind is none of the chain's (another protocol on this port?).
    #[error("frame of kind {kind:#06x} is not a chain message (begin 0x0d01, chunk 0x0d02, end 0x0d03)")]
    UnknownKind {
        /// The kind found.
        kind: u16,
    },
    /// Flags this version does not define are set.
    #[error("frame of kind {kind:#06x} has unknown flags {flags:#04x}")]
    UnknownFlags {
        /// The frame's kind.
        kind: u16,
        /// The flags found.
        flags: u8,
    },
    /// A marker's payload has the wrong size.
    #[error("{what} marker of {len} bytes, expected {expected}")]
    BadMarker {
        /// `begin` or `end`.
        what: &'static str,
        /// Bytes found.
        len: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// A chunk too short to hold its header.
    #[error("chunk frame of {len} bytes is shorter than a chunk header ({CHUNK_HEADER_LEN} bytes)")]
    ShortChunk {
        /// Bytes found.
        len: usize,
    },
    /// The header's length disagrees with the data the frame carries.
    #[error("chunk {sequence} announces {announced} bytes of data and carries {carried}")]
    LengthMismatch {
        /// The chunk's sequence number.
        sequence: u64,
        /// Length in the chunk header.
        announced: u32,
        /// Data bytes in the frame.
        carried: usize,
    },
}

/// A decoded chain message; a chunk's data is `frame.payload[CHUNK_HEADER_LEN..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// The stream of run `run` begins.
    Begin {
        /// Run number.
        run: u32,
        /// The data type of the stream ([`data_type_tag`]; 0: untyped).
        data_type: u32,
    },
    /// A chunk.
    Chunk {
        /// Its header.
        header: ChunkHeader,
        /// Whether the header carries the data's CRC.
        has_crc: bool,
    },
    /// The stream ends.
    End {
        /// Sequence number of the last chunk sent (the number of chunks).
        last_sequence: u64,
        /// Data bytes sent.
        bytes: u64,
    },
}

impl Message {
    /// Decodes `frame`; never panics.
    pub fn decode(frame: &Frame) -> Result<Message, ProtocolError> {
        Message::decode_head(frame.kind, frame.flags, &frame.payload, frame.payload.len())
    }

    /// Decodes a frame from its kind, flags, payload length and the start of its payload: at
    /// least the chunk header of a chunk, the whole payload of a marker (a forwarder that does
    /// not hold the chunk's data decodes it this way). Never panics.
    pub fn decode_head(kind: u16, flags: u8, head: &[u8], payload_len: usize) -> Result<Message, ProtocolError> {
        let flags_allowed = if kind == KIND_CHUNK { FLAG_CRC } else { 0 };
        if flags & !flags_allowed != 0 && matches!(kind, KIND_BEGIN | KIND_CHUNK | KIND_END) {
            return Err(ProtocolError::UnknownFlags { kind, flags });
        }
        let whole = |what: &'static str, expected: usize| -> Result<&[u8], ProtocolError> {
            if payload_len == expected && head.len() >= expected {
                Ok(&head[..expected])
            } else {
                Err(ProtocolError::BadMarker { what, len: payload_len, expected })
            }
        };
        match kind {
            KIND_BEGIN => {
                // The exact length is checked first: the reads cannot fail.
                let mut r = Reader::new("begin", whole("begin", BEGIN_LEN)?);
                let run = r.u32("run").unwrap_or_default();
                Ok(Message::Begin { run, data_type: r.u32("data type").unwrap_or_default() })
            }
            KIND_CHUNK => {
                let header = ChunkHeader::decode(head)
                    .filter(|_| payload_len >= CHUNK_HEADER_LEN)
                    .ok_or(ProtocolError::ShortChunk { len: payload_len.min(head.len()) })?;
                let carried = payload_len - CHUNK_HEADER_LEN;
                if header.len as usize != carried {
                    return Err(ProtocolError::LengthMismatch {
                        sequence: header.sequence,
                        announced: header.len,
                        carried,
                    });
                }
                Ok(Message::Chunk { header, has_crc: flags & FLAG_CRC != 0 })
            }
            KIND_END => {
                let mut r = Reader::new("end", whole("end", END_LEN)?);
                Ok(Message::End {
                    last_sequence: r.u64("last sequence").unwrap_or_default(),
                    bytes: r.u64("bytes").unwrap_or_default(),
                })
            }
            kind => Err(ProtocolError::UnknownKind { kind }),
        }
    }
}

/// The begin marker of run `run`, untyped.
pub fn begin_frame(run: u32) -> Frame {
    begin_frame_typed(run, 0)
}

/// The begin marker of run `run` for a stream of data type `data_type` ([`data_type_tag`]).
pub fn begin_frame_typed(run: u32, data_type: u32) -> Frame {
    let mut w = Writer::with_capacity(BEGIN_LEN);
    w.u32(run);
    w.u32(data_type);
    Frame::new(KIND_BEGIN, w.finish())
}

/// The tag of a named data type in a begin marker: the CRC32C of the name, never 0 (0 is an
/// untyped stream, as the generator sends). A typed input port refuses a stream of another
/// type ([`crate::ports`]).
pub fn data_type_tag(name: &str) -> u32 {
    match crc32c(name.as_bytes()) {
        0 => 1,
        t => t,
    }
}

/// The end marker after `last_sequence` chunks holding `bytes` bytes of data.
pub fn end_frame(last_sequence: u64, bytes: u64) -> Frame {
    let mut w = Writer::with_capacity(END_LEN);
    w.u64(last_sequence);
    w.u64(bytes);
    Frame::new(KIND_END, w.finish())
}

/// A chunk frame with its data copied behind the header (tests and tools; the generator sends
/// the header and its cached data without copying them together).
pub fn chunk_frame(header: &ChunkHeader, has_crc: bool, data: &[u8]) -> Frame {
    let mut b = BytesMut::with_capacity(CHUNK_HEADER_LEN + data.len());
    b.put_slice(&header.encode());
    b.put_slice(data);
    Frame::new(KIND_CHUNK, b.freeze()).with_flags(if has_crc { FLAG_CRC } else { 0 })
}

/// The stream broke the protocol; the connection is closed and the component fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A frame that is not a chain message.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The begin marker names another run than the component takes.
    #[error("the stream is of run {found}, this component takes run {expected}")]
    WrongRun {
        /// Run in the begin marker.
        found: u32,
        /// Run the component was started with.
        expected: u32,
    },
    /// A chunk or end marker came before the begin marker.
    #[error("{what} before the begin marker")]
    NotBegun {
        /// `a chunk` or `the end marker`.
        what: &'static str,
    },
    /// A second begin marker.
    #[error("a second begin marker (run {run}) in the stream")]
    BegunTwice {
        /// Its run.
        run: u32,
    },
    /// Anything after the end marker.
    #[error("a frame of kind {kind:#06x} after the end marker")]
    AfterEnd {
        /// Its kind.
        kind: u16,
    },
}

/// What a frame was, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEvent {
    /// The begin marker.
    Begin,
    /// A chunk of `len` data bytes.
    Chunk {
        /// Data bytes.
        len: usize,
    },
    /// The end marker: the stream is complete.
    End,
}

/// The checks a receiver runs over a stream, and its counters: order of the markers, the run,
/// sequence numbers (a chunk that is not the one after the previous counts one sequence error,
/// and the count goes on from it), and, if asked, each chunk's CRC. Pure logic, no I/O.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    run: u32,
    check_crc: bool,
    begun: bool,
    data_type: u32,
    end: Option<(u64, u64)>,
    last_sequence: u64,
    chunks: u64,
    bytes: u64,
    sequence_errors: u64,
    crc_errors: u64,
    crc_checked: u64,
}

impl StreamCheck {
    /// Checks for a stream of run `run`; `check_crc` checks the CRC of every chunk that has one.
    pub fn new(run: u32, check_crc: bool) -> StreamCheck {
        StreamCheck {
            run,
            check_crc,
            begun: false,
            data_type: 0,
            end: None,
            last_sequence: 0,
            chunks: 0,
            bytes: 0,
            sequence_errors: 0,
            crc_errors: 0,
            crc_checked: 0,
        }
    }

    /// Checks the next frame of the stream and counts it.
    pub fn on_frame(&mut self, frame: &Frame) -> Result<StreamEvent, StreamError> {
        let data = frame.payload.get(CHUNK_HEADER_LEN..);
        self.on_message(frame.kind, frame.flags, &frame.payload, frame.payload.len(), data)
    }

    /// Checks the next frame of the stream from its kind, flags, the start of its payload and
    /// its length ([`Message::decode_head`]), and counts it; CRCs are not checked (the data is
    /// not there).
    pub fn on_head(
        &mut self,
        kind: u16,
        flags: u8,
        head: &[u8],
        payload_len: usize,
    ) -> Result<StreamEvent, StreamError> {
        self.on_message(kind, flags, head, payload_len, None)
    }

    fn on_message(
        &mut self,
        kind: u16,
        flags: u8,
        head: &[u8],
        payload_len: usize,
        data: Option<&[u8]>,
    ) -> Result<StreamEvent, StreamError> {
        if self.end.is_some() {
            return Err(StreamError::AfterEnd { kind });
        }
        match Message::decode_head(kind, flags, head, payload_len)? {
            Message::Begin { run, data_type } => {
                if self.begun {
                    return Err(StreamError::BegunTwice { run });
                }
                if run != self.run {
                    return Err(StreamError::WrongRun { found: run, expected: self.run });
                }
                self.begun = true;
                self.data_type = data_type;
                Ok(StreamEvent::Begin)
            }
            Message::Chunk { header, has_crc } => {
                if !self.begun {
                    return Err(StreamError::NotBegun { what: "a chunk" });
                }
                if header.sequence != self.last_sequence.wrapping_add(1) {
                    self.sequence_errors += 1;
                }
                self.last_sequence = header.sequence;
                let len = header.len as usize;
                if let (true, true, Some(data)) = (self.check_crc, has_crc, data) {
                    self.crc_checked += 1;
                    if crc32c(data) != header.crc {
                        self.crc_errors += 1;
                    }
                }
                self.chunks += 1;
                self.bytes += len as u64;
                Ok(StreamEvent::Chunk { len })
            }
            Message::End { last_sequence, bytes } => {
                if !self.begun {
                    return Err(StreamError::NotBegun { what: "the end marker" });
                }
                self.end = Some((last_sequence, bytes));
                Ok(StreamEvent::End)
            }
        }
    }

    /// Chunks received.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }
    /// Data bytes received.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Chunks whose sequence number was not the one after the previous chunk's.
    pub fn sequence_errors(&self) -> u64 {
        self.sequence_errors
    }
    /// Chunks whose data did not match their CRC.
    pub fn crc_errors(&self) -> u64 {
        self.crc_errors
    }
    /// Chunks whose CRC was checked.
    pub fn crc_checked(&self) -> u64 {
        self.crc_checked
    }
    /// Whether the begin marker came.
    pub fn begun(&self) -> bool {
        self.begun
    }
    /// The stream's data type from its begin marker (0: untyped, or no begin marker yet).
    pub fn data_type(&self) -> u32 {
        self.data_type
    }
    /// The end marker's (last sequence number, bytes), once it came.
    pub fn end(&self) -> Option<(u64, u64)> {
        self.end
    }
    /// Chunks the end marker announced and that did not arrive (0 before the end marker).
    pub fn missing(&self) -> u64 {
        self.end.map_or(0, |(last, _)| last.saturating_sub(self.chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn chunk(seq: u64, data: &[u8], crc: bool) -> Frame {
        chunk_frame(&ChunkHeader::for_data(seq, data, crc), crc, data)
    }

    #[test]
    fn messages_round_trip() {
        assert_eq!(Message::decode(&begin_frame(42)), Ok(Message::Begin { run: 42, data_type: 0 }));
        let typed = begin_frame_typed(42, data_type_tag("adc"));
        assert_eq!(Message::decode(&typed), Ok(Message::Begin { run: 42, data_type: crc32c(b"adc") }));
        let mut c = StreamCheck::new(42, false);
        c.on_frame(&typed).unwrap();
        assert_eq!(c.data_type(), data_type_tag("adc"));
        assert_eq!(Message::decode(&end_frame(9, 1 << 40)), Ok(Message::End { last_sequence: 9, bytes: 1 << 40 }));
        let f = chunk(5, b"abc", true);
        let Ok(Message::Chunk { header, has_crc: true }) = Message::decode(&f) else { panic!("{f:?}") };
        assert_eq!((header.sequence, header.len, header.crc), (5, 3, crc32c(b"abc")));
        let Ok(Message::Chunk { header, has_crc: false }) = Message::decode(&chunk(6, b"", false)) else { panic!() };
        assert_eq!((header.sequence, header.len, header.crc), (6, 0, 0));
    }

    #[test]
    fn malformed_frames_are_named() {
        let e = |f: Frame| Message::decode(&f).unwrap_err().to_string();
        assert!(e(Frame::new(0x0E02, Bytes::new())).contains("kind 0x0e02 is not a chain message"));
        assert!(e(Frame::new(KIND_CHUNK, Bytes::from_static(b"short"))).contains("shorter than a chunk header"));
        let mut bad = BytesMut::new();
        bad.put_slice(&ChunkHeader { sequence: 3, len: 10, crc: 0 }.encode());
        bad.put_slice(b"four");
        assert!(e(Frame::new(KIND_CHUNK, bad.freeze())).contains("chunk 3 announces 10 bytes of data and carries 4"));
        assert!(e(Frame::new(KIND_BEGIN, Bytes::from_static(b"x"))).contains("begin marker of 1 bytes, expected 8"));
        assert!(e(Frame::new(KIND_END, Bytes::new())).contains("end marker of 0 bytes, expected 16"));
        assert!(e(begin_frame(1).with_flags(FLAG_CRC)).contains("unknown flags"));
        assert!(e(chunk(1, b"a", true).with_flags(0x81)).contains("unknown flags 0x81"));
    }

    #[test]
    fn a_chunk_is_checked_from_its_head_alone() {
        let f = chunk(7, &[5u8; 100], true);
        let head = &f.payload[..CHUNK_HEADER_LEN];
        let Ok(Message::Chunk { header, has_crc: true }) = Message::decode_head(KIND_CHUNK, FLAG_CRC, head, 116) else {
            panic!()
        };
        assert_eq!((header.sequence, header.len), (7, 100));
        let e = Message::decode_head(KIND_CHUNK, 0, head, 50).unwrap_err();
        assert_eq!(e, ProtocolError::LengthMismatch { sequence: 7, announced: 100, carried: 34 });
        assert_eq!(Message::decode_head(KIND_CHUNK, 0, &head[..8], 8), Err(ProtocolError::ShortChunk { len: 8 }));
        let mut c = StreamCheck::new(1, true);
        c.on_frame(&begin_frame(1)).unwrap();
        assert_eq!(c.on_head(KIND_CHUNK, FLAG_CRC, head, 116), Ok(StreamEvent::Chunk { len: 100 }));
        assert_eq!((c.chunks(), c.bytes(), c.crc_checked()), (1, 100, 0));
    }

    #[test]
    fn a_stream_is_counted_and_its_errors_found() {
        let mut c = StreamCheck::new(3, true);
        assert_eq!(c.on_frame(&chunk(1, b"a", true)), Err(StreamError::NotBegun { what: "a chunk" }));
        assert_eq!(c.on_frame(&begin_frame(4)), Err(StreamError::WrongRun { found: 4, expected: 3 }));
        assert_eq!(c.on_frame(&begin_frame(3)), Ok(StreamEvent::Begin));
        assert_eq!(c.on_frame(&begin_frame(3)), Err(StreamError::BegunTwice { run: 3 }));
        assert_eq!(c.on_frame(&chunk(1, b"abcd", true)), Ok(StreamEvent::Chunk { len: 4 }));
        c.on_frame(&chunk(2, b"ef", false)).unwrap();
        c.on_frame(&chunk(4, b"gh", true)).unwrap(); // 3 skipped
        let mut corrupt = BytesMut::new();
        corrupt.put_slice(&ChunkHeader { sequence: 5, len: 2, crc: crc32c(b"ij") ^ 1 }.encode());
        corrupt.put_slice(b"ij");
        c.on_frame(&Frame::new(KIND_CHUNK, corrupt.freeze()).with_flags(FLAG_CRC)).unwrap();
        assert_eq!(c.on_frame(&end_frame(5, 10)), Ok(StreamEvent::End));
        assert_eq!(c.on_frame(&chunk(6, b"k", true)), Err(StreamError::AfterEnd { kind: KIND_CHUNK }));
        assert_eq!((c.chunks(), c.bytes(), c.sequence_errors(), c.crc_errors(), c.crc_checked()), (4, 10, 1, 1, 3));
        assert_eq!((c.end(), c.missing()), (Some((5, 10)), 1));
    }

    #[test]
    fn crcs_are_not_checked_unless_asked() {
        let mut c = StreamCheck::new(1, false);
        c.on_frame(&begin_frame(1)).unwrap();
        let mut corrupt = BytesMut::new();
        corrupt.put_slice(&ChunkHeader { sequence: 1, len: 1, crc: 0xdead }.encode());
        corrupt.put_slice(b"x");
        c.on_frame(&Frame::new(KIND_CHUNK, corrupt.freeze()).with_flags(FLAG_CRC)).unwrap();
        assert_eq!((c.crc_errors(), c.crc_checked()), (0, 0));
    }

    proptest! {
        #[test]
        fn random_frames_never_panic(kind in prop_oneof![Just(KIND_BEGIN), Just(KIND_CHUNK), Just(KIND_END), any::<u16>()],
                                     flags in any::<u8>(),
                                     payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let f = Frame::new(kind, Bytes::from(payload)).with_flags(flags);
            let _ = Message::decode(&f);
            let mut c = StreamCheck::new(0, true);
            let _ = c.on_frame(&begin_frame(0));
            let _ = c.on_frame(&f);
            let _ = c.on_frame(&f);
            let n = f.payload.len();
            let _ = c.on_head(kind, flags, &f.payload[..n.min(CHUNK_HEADER_LEN)], n);
            let _ = c.on_head(kind, flags, &f.payload[..n.min(3)], n + 1000);
        }

        #[test]
        fn chunk_headers_round_trip(sequence in any::<u64>(), len in any::<u32>(), crc in any::<u32>()) {
            let h = ChunkHeader { sequence, len, crc };
            prop_assert_eq!(ChunkHeader::decode(&h.encode()), Some(h));
        }
    }
}
