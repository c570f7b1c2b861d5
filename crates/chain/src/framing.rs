//! Framing of a raw readout link: how a gatherer cuts the byte stream of a TCP connection from
//! front-end electronics into events, by a length field in each event's header. Pure logic, no
//! I/O: bytes go in with [`Deframer::push`], whole events come out of [`Deframer::next_frame`].
//!
//! A frame is a header of `header_bytes` bytes, then its body. The header holds the length at
//! `length_offset`, `length_width` bytes (1, 2, 4 or 8) in `length_endian` order. The length
//! counts the body, or with `length_includes_header` the whole frame, header included.
//!
//! ```
//! use daqflow_chain::framing::{Deframer, Endian, Framing};
//! // A 4-byte big-endian length at offset 2 of an 8-byte header, counting the body only.
//! let f = Framing { header_bytes: 8, length_offset: 2, length_width: 4, length_endian: Endian::Big, ..Default::default() };
//! let mut d = Deframer::new(f)?;
//! let frame = f.encode(b"hello").unwrap();
//! d.push(&frame[..3]);
//! assert_eq!(d.next_frame(), Ok(None)); // not all there yet
//! d.push(&frame[3..]);
//! assert_eq!(d.next_frame().unwrap().unwrap().as_ref(), &frame[..]);
//! # Ok::<(), daqflow_chain::framing::FramingError>(())
//! ```

use bytes::{Buf, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Byte order of a length field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Endian {
    /// Least significant byte first.
    #[default]
    Little,
    /// Most significant byte first (network order).
    Big,
}

/// Where a frame's length is in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Framing {
    /// Bytes of each frame's header (the length field is in it).
    pub header_bytes: usize,
    /// Offset of the length field in the header.
    pub length_offset: usize,
    /// Bytes of the length field: 1, 2, 4 or 8.
    pub length_width: usize,
    /// Byte order of the length field.
    pub length_endian: Endian,
    /// Whether the length counts the whole frame (header included) rather than the body.
    pub length_includes_header: bool,
    /// Largest frame taken, header included; a longer one is an error (the stream is lost).
    pub max_frame_bytes: usize,
}

impl Default for Framing {
    fn default() -> Self {
        Framing {
            header_bytes: 4,
            length_offset: 0,
            length_width: 4,
            length_endian: Endian::Little,
            length_includes_header: false,
            max_frame_bytes: crate::MAX_CHUNK_BYTES,
        }
    }
}

/// A framing that cannot be, or a stream that breaks it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// `length_width` is not 1, 2, 4 or 8.
    #[error("length_width = {0}: must be 1, 2, 4 or 8")]
    Width(usize),
    /// The length field does not fit in the header.
    #[error("the length field (offset {offset}, {width} bytes) does not fit in a header of {header} bytes")]
    FieldOutsideHeader {
        /// `length_offset`.
        offset: usize,
        /// `length_width`.
        width: usize,
        /// `header_bytes`.
        header: usize,
    },
    /// `max_frame_bytes` is smaller than a header.
    #[error("max_frame_bytes = {max} is smaller than a header ({header} bytes)")]
    MaxBelowHeader {
        /// `max_frame_bytes`.
        max: usize,
        /// `header_bytes`.
        header: usize,
    },
    /// A frame's length counts the header and is shorter than it.
    #[error("a frame's length field says {length} bytes, less than its own header ({header} bytes)")]
    ShorterThanHeader {
        /// The length found.
        length: u64,
        /// `header_bytes`.
        header: usize,
    },
    /// A frame longer than `max_frame_bytes`.
    #[error("a frame of {length} bytes, more than max_frame_bytes = {max}: wrong framing, or a broken link")]
    TooLong {
        /// The frame's length, header included.
        length: u64,
        /// `max_frame_bytes`.
        max: usize,
    },
}

impl Framing {
    /// Checks that the framing can be.
    pub fn check(&self) -> Result<(), FramingError> {
        if ![1, 2, 4, 8].contains(&self.length_width) {
            return Err(FramingError::Width(self.length_width));
        }
        if self.length_offset.checked_add(self.length_width).is_none_or(|end| end > self.header_bytes) {
            return Err(FramingError::FieldOutsideHeader {
                offset: self.length_offset,
                width: self.length_width,
                header: self.header_bytes,
            });
        }
        if self.max_frame_bytes < self.header_bytes {
            return Err(FramingError::MaxBelowHeader { max: self.max_frame_bytes, header: self.header_bytes });
        }
        Ok(())
    }

    /// The whole frame's length (header included) given its header, if it is allowed.
    pub fn frame_len(&self, header: &[u8]) -> Result<usize, FramingError> {
        let field = &header[self.length_offset..self.length_offset + self.length_width];
        let mut b = [0u8; 8];
        let length = match self.length_endian {
            Endian::Little => {
                b[..field.len()].copy_from_slice(field);
                u64::from_le_bytes(b)
            }
            Endian::Big => {
                b[8 - field.len()..].copy_from_slice(field);
                u64::from_be_bytes(b)
            }
        };
        let total = if self.length_includes_header {
            if length < self.header_bytes as u64 {
                return Err(FramingError::ShorterThanHeader { length, header: self.header_bytes });
            }
            length
        } else {
            length.saturating_add(self.header_bytes as u64)
        };
        if total > self.max_frame_bytes as u64 {
            return Err(FramingError::TooLong { length: total, max: self.max_frame_bytes });
        }
        Ok(total as usize)
    }

    /// A frame of `body` under this framing: the header zero but for the length field (tests,
    /// simulators of a front end). `None` if the length does not fit in the field or the frame
    /// would be longer than `max_frame_bytes`.
    pub fn encode(&self, body: &[u8]) -> Option<Vec<u8>> {
        self.check().ok()?;
        let total = self.header_bytes.checked_add(body.len())?;
        if total > self.max_frame_bytes {
            return None;
        }
        let length = if self.length_includes_header { total } else { body.len() } as u64;
        if self.length_width < 8 && length >> (8 * self.length_width) != 0 {
            return None;
        }
        let mut frame = vec![0u8; self.header_bytes];
        let field = &mut frame[self.length_offset..self.length_offset + self.length_width];
        match self.length_endian {
            Endian::Little => field.copy_from_slice(&length.to_le_bytes()[..self.length_width]),
            Endian::Big => field.copy_from_slice(&length.to_be_bytes()[8 - self.length_width..]),
        }
        frame.extend_from_slice(body);
        Some(frame)
    }
}

/// Cuts a byte stream into frames by a [`Framing`].
#[derive(Debug)]
pub struct Deframer {
    framing: Framing,
    buffer: BytesMut,
    broken: Option<FramingError>,
}

impl Deframer {
    /// A deframer for `framing`, if it can be.
    pub fn new(framing: Framing) -> Result<Deframer, FramingError> {
        framing.check()?;
        Ok(Deframer { framing, buffer: BytesMut::new(), broken: None })
    }

    /// Adds bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame (header and body), `None` until one is all there. After an error
    /// the stream cannot be cut any further: every later call gives the same error.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FramingError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if self.buffer.len() < self.framing.header_bytes {
            return Ok(None);
        }
        let total = match self.framing.frame_len(&self.buffer[..self.framing.header_bytes]) {
            Ok(t) => t,
            Err(e) => {
                self.broken = Some(e.clone());
                return Err(e);
            }
        };
        if self.buffer.len() < total {
            self.buffer.reserve(total - self.buffer.len());
            return Ok(None);
        }
        Ok(Some(self.buffer.split_to(total).freeze()))
    }

    /// Bytes received and not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.buffer.remaining()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn impossible_framings_and_broken_streams_are_named() {
        let f = |w, o, h| Framing { header_bytes: h, length_offset: o, length_width: w, ..Default::default() };
        assert_eq!(f(3, 0, 4).check(), Err(FramingError::Width(3)));
        assert_eq!(f(4, 2, 4).check(), Err(FramingError::FieldOutsideHeader { offset: 2, width: 4, header: 4 }));
        assert!(f(8, usize::MAX, 4).check().unwrap_err().to_string().contains("does not fit"));
        let inc = Framing { length_includes_header: true, ..Default::default() };
        let mut d = Deframer::new(inc).unwrap();
        d.push(&2u32.to_le_bytes());
        assert_eq!(d.next_frame(), Err(FramingError::ShorterThanHeader { length: 2, header: 4 }));
        assert!(d.next_frame().is_err(), "stays broken");
        let mut d = Deframer::new(Framing { max_frame_bytes: 100, ..Default::default() }).unwrap();
        d.push(&97u32.to_le_bytes());
        assert_eq!(d.next_frame(), Err(FramingError::TooLong { length: 101, max: 100 }));
    }

    #[test]
    fn a_zero_length_body_is_a_frame_of_its_header() {
        let f = Framing { header_bytes: 2, length_width: 1, length_offset: 1, ..Default::default() };
        let mut d = Deframer::new(f).unwrap();
        d.push(&[0xAA, 0, 0xBB, 1, 0xCC]);
        assert_eq!(d.next_frame().unwrap().unwrap().as_ref(), &[0xAA, 0]);
        assert_eq!(d.next_frame().unwrap().unwrap().as_ref(), &[0xBB, 1, 0xCC]);
        assert_eq!((d.next_frame(), d.pending()), (Ok(None), 0));
    }

    fn framing() -> impl Strategy<Value = Framing> {
        (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], 0usize..6, 0usize..6, any::<bool>(), any::<bool>())
            .prop_map(|(width, offset, extra, big, includes)| Framing {
                header_bytes: offset + width + extra,
                length_offset: offset,
                length_width: width,
                length_endian: if big { Endian::Big } else { Endian::Little },
                length_includes_header: includes,
                max_frame_bytes: 1 << 16,
            })
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(f in framing(), bytes in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..512) {
            let mut d = Deframer::new(f).unwrap();
            let cut = cut.min(bytes.len());
            d.push(&bytes[..cut]);
            while let Ok(Some(_)) = d.next_frame() {}
            d.push(&bytes[cut..]);
            while let Ok(Some(_)) = d.next_frame() {}
        }

        #[test]
        fn frames_round_trip_cut_anywhere(f in framing(),
                                          bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
                                          piece in 1usize..97) {
            // Bodies too long for a 1-byte length are cut to fit.
            let limit = if f.length_width == 1 { 255 - if f.length_includes_header { f.header_bytes } else { 0 } } else { usize::MAX };
            let frames: Vec<Vec<u8>> = bodies.iter().map(|b| f.encode(&b[..b.len().min(limit)]).unwrap()).collect();
            let wire: Vec<u8> = frames.concat();
            let mut d = Deframer::new(f).unwrap();
            let mut got = Vec::new();
            for p in wire.chunks(piece) {
                d.push(p);
                while let Some(frame) = d.next_frame().unwrap() {
                    got.push(frame.to_vec());
                }
            }
            prop_assert_eq!(got, frames);
            prop_assert_eq!(d.pending(), 0);
        }
    }
}
