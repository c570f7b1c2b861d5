//! Fragments: the data of one event from one source (a front-end readout stream).
//!
//! A fragment is a 48-byte header followed by the payload and zero padding up to a multiple of
//! 8 bytes, so that the next header in a super-fragment is 8-byte aligned. See
//! `docs/formats.md` for the byte layout.

use bytes::{BufMut, Bytes, BytesMut};

use crate::EventId;
use crate::crc::crc32c;
use crate::error::{CrcMismatch, DecodeError};
use crate::header::checked_header;
use crate::le::{pad8, put_u16, put_u32, put_u64, u32_at, u64_at};

/// Magic number of a fragment header: the bytes `DFRG`.
pub const FRAGMENT_MAGIC: u32 = u32::from_le_bytes(*b"DFRG");
/// Fragment format version written and read by this build.
pub const FRAGMENT_VERSION: u16 = 1;
/// Size of a fragment header in bytes.
pub const FRAGMENT_HEADER_LEN: usize = 48;
/// Largest payload a fragment may carry (the length field is 32 bits; we keep 1 GiB of headroom
/// below it so that padded lengths cannot overflow).
pub const MAX_FRAGMENT_PAYLOAD: u32 = 3 << 30;

const WHAT: &str = "fragment header";

/// Flags of a fragment, set by the source or by a unit that forwards a fragment it found damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FragmentFlags(pub u32);

impl FragmentFlags {
    /// The front end cut the payload short (e.g. a buffer overflow in the electronics).
    pub const TRUNCATED: FragmentFlags = FragmentFlags(1);
    /// The front end reported an error for this event.
    pub const DATA_ERROR: FragmentFlags = FragmentFlags(2);
    /// A unit downstream found that the payload CRC did not match and forwarded it anyway.
    pub const CRC_ERROR: FragmentFlags = FragmentFlags(4);

    /// No flag set.
    pub const fn empty() -> Self {
        FragmentFlags(0)
    }
    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: FragmentFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// These flags with `other` set too.
    pub const fn with(self, other: FragmentFlags) -> Self {
        FragmentFlags(self.0 | other.0)
    }
}

/// The header of a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragmentHeader {
    /// Flags, see [`FragmentFlags`].
    pub flags: FragmentFlags,
    /// The source (front-end stream) that produced the fragment; unique in the system.
    pub source_id: u32,
    /// The event the fragment belongs to.
    pub event_id: EventId,
    /// The run the event was taken in.
    pub run_number: u32,
    /// Trigger type as given by the trigger system.
    pub trigger_type: u32,
    /// Time stamp of the trigger (ns since the Unix epoch, or a bunch-crossing counter).
    pub timestamp: u64,
    /// Length of the payload in bytes (without padding).
    pub payload_len: u32,
    /// CRC32C of the payload.
    pub payload_crc: u32,
}

impl FragmentHeader {
    /// The bytes of this header.
    pub fn encode(&self) -> [u8; FRAGMENT_HEADER_LEN] {
        let mut h = [0u8; FRAGMENT_HEADER_LEN];
        put_u32(&mut h, 0, FRAGMENT_MAGIC);
        put_u16(&mut h, 4, FRAGMENT_VERSION);
        put_u16(&mut h, 6, FRAGMENT_HEADER_LEN as u16);
        put_u32(&mut h, 8, self.flags.0);
        put_u32(&mut h, 12, self.source_id);
        put_u64(&mut h, 16, self.event_id.0);
        put_u32(&mut h, 24, self.run_number);
        put_u32(&mut h, 28, self.trigger_type);
        put_u64(&mut h, 32, self.timestamp);
        put_u32(&mut h, 40, self.payload_len);
        put_u32(&mut h, 44, self.payload_crc);
        h
    }

    /// Decodes the header at the start of `data` (which may hold more bytes after it).
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let h: &[u8; FRAGMENT_HEADER_LEN] = checked_header(data, WHAT, FRAGMENT_MAGIC, FRAGMENT_VERSION)?;
        let payload_len = u32_at(h, 40);
        if payload_len > MAX_FRAGMENT_PAYLOAD {
            return Err(DecodeError::Inconsistent {
                what: WHAT,
                detail: format!("payload length {payload_len} exceeds the maximum {MAX_FRAGMENT_PAYLOAD}"),
            });
        }
        Ok(FragmentHeader {
            flags: FragmentFlags(u32_at(h, 8)),
            source_id: u32_at(h, 12),
            event_id: EventId(u64_at(h, 16)),
            run_number: u32_at(h, 24),
            trigger_type: u32_at(h, 28),
            timestamp: u64_at(h, 32),
            payload_len,
            payload_crc: u32_at(h, 44),
        })
    }

    /// Bytes the whole fragment occupies: header, payload and padding.
    pub fn encoded_len(&self) -> usize {
        FRAGMENT_HEADER_LEN + pad8(self.payload_len as usize)
    }
}

/// A fragment: a zero-copy view of its encoded bytes.
///
/// ```
/// use daqflow_wire::{EventId, Fragment, FragmentInfo};
/// let info = FragmentInfo { source_id: 7, event_id: EventId(42), run_number: 1, ..Default::default() };
/// let bytes = Fragment::encode(&info, b"detector data");
/// let fragment = Fragment::parse(bytes).unwrap();
/// assert_eq!(fragment.header().event_id, EventId(42));
/// assert_eq!(&fragment.payload()[..], b"detector data");
/// fragment.verify_crc().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    header: FragmentHeader,
    /// Header, payload and padding.
    bytes: Bytes,
}

/// What a producer says about a fragment; the lengths and CRC are filled in by [`Fragment::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FragmentInfo {
    /// See [`FragmentHeader::flags`].
    pub flags: FragmentFlags,
    /// See [`FragmentHeader::source_id`].
    pub source_id: u32,
    /// See [`FragmentHeader::event_id`].
    pub event_id: EventId,
    /// See [`FragmentHeader::run_number`].
    pub run_number: u32,
    /// See [`FragmentHeader::trigger_type`].
    pub trigger_type: u32,
    /// See [`FragmentHeader::timestamp`].
    pub timestamp: u64,
}

impl FragmentInfo {
    /// The header of a fragment with this description and `payload`.
    ///
    /// # Panics
    /// If the payload is longer than [`MAX_FRAGMENT_PAYLOAD`]; a producer's own bug, not input.
    pub fn header_for(&self, payload: &[u8]) -> FragmentHeader {
        assert!(
            payload.len() <= MAX_FRAGMENT_PAYLOAD as usize,
            "fragment payload of {} bytes is too large",
            payload.len()
        );
        FragmentHeader {
            flags: self.flags,
            source_id: self.source_id,
            event_id: self.event_id,
            run_number: self.run_number,
            trigger_type: self.trigger_type,
            timestamp: self.timestamp,
            payload_len: payload.len() as u32,
            payload_crc: crc32c(payload),
        }
    }
}

impl Fragment {
    /// Encodes a fragment with `payload` into new bytes, computing its length and CRC.
    pub fn encode(info: &FragmentInfo, payload: &[u8]) -> Bytes {
        let header = info.header_for(payload);
        let mut buf = BytesMut::with_capacity(header.encoded_len());
        Self::encode_with_header(&header, payload, &mut buf);
        buf.freeze()
    }

    /// Appends a fragment with a ready header to `out` (the header's length and CRC must describe
    /// `payload`; use [`FragmentInfo::header_for`]). Lets a source write many fragments into one
    /// buffer without an allocation each.
    pub fn encode_with_header(header: &FragmentHeader, payload: &[u8], out: &mut BytesMut) {
        debug_assert_eq!(header.payload_len as usize, payload.len());
        out.reserve(header.encoded_len());
        out.put_slice(&header.encode());
        out.put_slice(payload);
        out.put_bytes(0, pad8(payload.len()) - payload.len());
    }

    /// Parses the fragment at the start of `bytes`, which must hold exactly one encoded fragment
    /// (use [`Fragment::parse_prefix`] to take one off a longer buffer).
    pub fn parse(bytes: Bytes) -> Result<Fragment, DecodeError> {
        let (fragment, rest) = Self::parse_prefix(bytes)?;
        if !rest.is_empty() {
            return Err(DecodeError::Inconsistent {
                what: WHAT,
                detail: format!("{} bytes follow the fragment", rest.len()),
            });
        }
        Ok(fragment)
    }

    /// Parses the fragment at the start of `bytes` and returns it with the bytes after it.
    /// No payload byte is copied.
    pub fn parse_prefix(mut bytes: Bytes) -> Result<(Fragment, Bytes), DecodeError> {
        let header = FragmentHeader::decode(&bytes)?;
        let len = header.encoded_len();
        if bytes.len() < len {
            return Err(DecodeError::Short { what: "fragment", need: len as u64, have: bytes.len() as u64 });
        }
        let fragment = bytes.split_to(len);
        Ok((Fragment { header, bytes: fragment }, bytes))
    }

    /// The header.
    pub fn header(&self) -> &FragmentHeader {
        &self.header
    }

    /// The payload, without padding; shares memory with the fragment.
    pub fn payload(&self) -> Bytes {
        self.bytes.slice(FRAGMENT_HEADER_LEN..FRAGMENT_HEADER_LEN + self.header.payload_len as usize)
    }

    /// The payload as a slice.
    pub fn payload_slice(&self) -> &[u8] {
        &self.bytes[FRAGMENT_HEADER_LEN..FRAGMENT_HEADER_LEN + self.header.payload_len as usize]
    }

    /// The encoded fragment: header, payload and padding.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The encoded fragment, consuming the view.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// Checks the payload against the CRC32C in the header.
    pub fn verify_crc(&self) -> Result<(), CrcMismatch> {
        let computed = crc32c(self.payload_slice());
        if computed == self.header.payload_crc {
            Ok(())
        } else {
            Err(CrcMismatch {
                event_id: self.header.event_id,
                source_id: self.header.source_id,
                stored: self.header.payload_crc,
                computed,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> FragmentInfo {
        FragmentInfo {
            flags: FragmentFlags::DATA_ERROR,
            source_id: 3,
            event_id: EventId(0x1_0000_0001),
            run_number: 123,
            trigger_type: 2,
            timestamp: 99,
        }
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let h = info().header_for(b"abc");
        let b = h.encode();
        assert_eq!(&b[0..4], b"DFRG");
        assert_eq!(&b[4..6], &[1, 0]);
        assert_eq!(&b[6..8], &[48, 0]);
        assert_eq!(&b[8..12], &[2, 0, 0, 0]);
        assert_eq!(&b[12..16], &[3, 0, 0, 0]);
        assert_eq!(&b[16..24], &[1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[40..44], &[3, 0, 0, 0]);
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), crc32c(b"abc"));
    }

    #[test]
    fn payload_is_padded_to_eight_bytes() {
        for len in 0..20 {
            let payload = vec![0xabu8; len];
            let bytes = Fragment::encode(&info(), &payload);
            assert_eq!(bytes.len(), 48 + pad8(len));
            assert!(bytes[48 + len..].iter().all(|&b| b == 0));
            let f = Fragment::parse(bytes).unwrap();
            assert_eq!(f.payload_slice(), &payload[..]);
        }
    }

    #[test]
    fn flipped_payload_byte_fails_the_crc() {
        let bytes = Fragment::encode(&info(), b"0123456789");
        let mut raw = BytesMut::from(&bytes[..]);
        raw[50] ^= 1;
        let f = Fragment::parse(raw.freeze()).unwrap();
        let err = f.verify_crc().unwrap_err();
        assert_eq!(err.source_id, 3);
        assert!(err.to_string().contains("CRC32C"));
    }

    #[test]
    fn short_and_bad_headers_are_typed_errors() {
        let bytes = Fragment::encode(&info(), b"xyz");
        assert!(matches!(Fragment::parse(bytes.slice(..10)), Err(DecodeError::Short { .. })));
        assert!(matches!(Fragment::parse(bytes.slice(..50)), Err(DecodeError::Short { .. })));
        let mut raw = BytesMut::from(&bytes[..]);
        raw[0] = b'X';
        assert!(matches!(Fragment::parse(raw.clone().freeze()), Err(DecodeError::BadMagic { .. })));
        raw[0] = b'D';
        raw[4] = 9;
        assert!(matches!(Fragment::parse(raw.freeze()), Err(DecodeError::UnsupportedVersion { found: 9, .. })));
    }
}
