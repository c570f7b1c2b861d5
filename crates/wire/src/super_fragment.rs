//! Super-fragments: a readout unit's fragments of one event, behind a 32-byte header that names
//! the RU and counts the fragments.

use bytes::{BufMut, Bytes, BytesMut};

use crate::EventId;
use crate::error::DecodeError;
use crate::fragment::Fragment;
use crate::header::{Counted, checked_header};
use crate::le::{put_u16, put_u32, put_u64, u32_at, u64_at};

/// Magic number of a super-fragment header: the bytes `DSFR`.
pub const SUPER_FRAGMENT_MAGIC: u32 = u32::from_le_bytes(*b"DSFR");
/// Super-fragment format version written and read by this build.
pub const SUPER_FRAGMENT_VERSION: u16 = 1;
/// Size of a super-fragment header in bytes.
pub const SUPER_FRAGMENT_HEADER_LEN: usize = 32;

const WHAT: &str = "super-fragment header";

/// Flags of a super-fragment, set by the readout unit that built it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SuperFragmentFlags(pub u32);

impl SuperFragmentFlags {
    /// At least one of the RU's streams had no fragment for this event.
    pub const INCOMPLETE: SuperFragmentFlags = SuperFragmentFlags(1);
    /// At least one fragment failed the RU's CRC check.
    pub const CRC_ERROR: SuperFragmentFlags = SuperFragmentFlags(2);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: SuperFragmentFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// These flags with `other` set too.
    pub const fn with(self, other: SuperFragmentFlags) -> Self {
        SuperFragmentFlags(self.0 | other.0)
    }
}

/// The header of a super-fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SuperFragmentHeader {
    /// Flags, see [`SuperFragmentFlags`].
    pub flags: SuperFragmentFlags,
    /// The readout unit that built it.
    pub ru_id: u32,
    /// The event.
    pub event_id: EventId,
    /// Number of fragments that follow.
    pub fragment_count: u32,
    /// Length of the whole super-fragment, header included, in bytes.
    pub total_len: u32,
}

impl SuperFragmentHeader {
    /// The header for `fragments`, computing count and length.
    pub fn for_fragments(ru_id: u32, event_id: EventId, flags: SuperFragmentFlags, fragments: &[Fragment]) -> Self {
        let body: usize = fragments.iter().map(|f| f.as_bytes().len()).sum();
        SuperFragmentHeader {
            flags,
            ru_id,
            event_id,
            fragment_count: fragments.len() as u32,
            total_len: (SUPER_FRAGMENT_HEADER_LEN + body) as u32,
        }
    }

    /// The bytes of this header.
    pub fn encode(&self) -> [u8; SUPER_FRAGMENT_HEADER_LEN] {
        let mut h = [0u8; SUPER_FRAGMENT_HEADER_LEN];
        put_u32(&mut h, 0, SUPER_FRAGMENT_MAGIC);
        put_u16(&mut h, 4, SUPER_FRAGMENT_VERSION);
        put_u16(&mut h, 6, SUPER_FRAGMENT_HEADER_LEN as u16);
        put_u32(&mut h, 8, self.flags.0);
        put_u32(&mut h, 12, self.ru_id);
        put_u64(&mut h, 16, self.event_id.0);
        put_u32(&mut h, 24, self.fragment_count);
        put_u32(&mut h, 28, self.total_len);
        h
    }

    /// Decodes the header at the start of `data`.
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let h: &[u8; SUPER_FRAGMENT_HEADER_LEN] =
            checked_header(data, WHAT, SUPER_FRAGMENT_MAGIC, SUPER_FRAGMENT_VERSION)?;
        let header = SuperFragmentHeader {
            flags: SuperFragmentFlags(u32_at(h, 8)),
            ru_id: u32_at(h, 12),
            event_id: EventId(u64_at(h, 16)),
            fragment_count: u32_at(h, 24),
            total_len: u32_at(h, 28),
        };
        if (header.total_len as usize) < SUPER_FRAGMENT_HEADER_LEN {
            return Err(DecodeError::Inconsistent {
                what: WHAT,
                detail: format!("total length {} is shorter than the header", header.total_len),
            });
        }
        Ok(header)
    }
}

/// A super-fragment: a zero-copy view over its bytes, iterating its fragments without copying.
///
/// ```
/// use daqflow_wire::*;
/// let fragments: Vec<Fragment> = (0..3)
///     .map(|s| {
///         let info = FragmentInfo { source_id: s, event_id: EventId(9), ..Default::default() };
///         Fragment::parse(Fragment::encode(&info, &[s as u8; 10])).unwrap()
///     })
///     .collect();
/// let bytes = SuperFragment::assemble(1, EventId(9), SuperFragmentFlags::default(), &fragments);
/// let sf = SuperFragment::parse(bytes).unwrap();
/// assert_eq!(sf.header().fragment_count, 3);
/// let sources: Vec<u32> = sf.fragments().map(|f| f.unwrap().header().source_id).collect();
/// assert_eq!(sources, [0, 1, 2]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperFragment {
    header: SuperFragmentHeader,
    bytes: Bytes,
}

impl SuperFragment {
    /// Builds a super-fragment from `fragments`, copying them behind a new header.
    pub fn assemble(ru_id: u32, event_id: EventId, flags: SuperFragmentFlags, fragments: &[Fragment]) -> Bytes {
        let header = SuperFragmentHeader::for_fragments(ru_id, event_id, flags, fragments);
        let mut buf = BytesMut::with_capacity(header.total_len as usize);
        buf.put_slice(&header.encode());
        for f in fragments {
            buf.put_slice(f.as_bytes());
        }
        buf.freeze()
    }

    /// Parses a buffer holding exactly one super-fragment.
    pub fn parse(bytes: Bytes) -> Result<SuperFragment, DecodeError> {
        let (sf, rest) = Self::parse_prefix(bytes)?;
        if !rest.is_empty() {
            return Err(DecodeError::Inconsistent {
                what: "super-fragment",
                detail: format!("{} bytes follow the super-fragment", rest.len()),
            });
        }
        Ok(sf)
    }

    /// Parses the super-fragment at the start of `bytes`; returns it and the bytes after it.
    /// Only the header is checked here; [`SuperFragment::fragments`] checks each fragment.
    pub fn parse_prefix(mut bytes: Bytes) -> Result<(SuperFragment, Bytes), DecodeError> {
        let header = SuperFragmentHeader::decode(&bytes)?;
        let len = header.total_len as usize;
        if bytes.len() < len {
            return Err(DecodeError::Short { what: "super-fragment", need: len as u64, have: bytes.len() as u64 });
        }
        let sf = bytes.split_to(len);
        Ok((SuperFragment { header, bytes: sf }, bytes))
    }

    /// The header.
    pub fn header(&self) -> &SuperFragmentHeader {
        &self.header
    }

    /// The encoded super-fragment.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The fragments, in order, without copying. The iterator yields an error (and then ends) if
    /// a fragment is malformed, if there are fewer or more fragments than the header counts, or
    /// if bytes are left over.
    pub fn fragments(&self) -> Fragments {
        Counted::new(
            self.bytes.slice(SUPER_FRAGMENT_HEADER_LEN..),
            self.header.fragment_count,
            "super-fragment",
            Fragment::parse_prefix,
        )
    }
}

/// Iterator over the fragments of a super-fragment; see [`SuperFragment::fragments`].
pub type Fragments = Counted<Fragment>;
