//! Built events: the builder unit's 48-byte header followed by the super-fragments of every RU.

use bytes::{BufMut, Bytes, BytesMut};

use crate::EventId;
use crate::error::{CrcMismatch, DecodeError};
use crate::header::{Counted, checked_header};
use crate::le::{put_u16, put_u32, put_u64, u32_at, u64_at};
use crate::super_fragment::{SuperFragment, SuperFragmentFlags};

/// Magic number of an event header: the bytes `DEVT`.
pub const EVENT_MAGIC: u32 = u32::from_le_bytes(*b"DEVT");
/// Event format version written and read by this build.
pub const EVENT_VERSION: u16 = 1;
/// Size of an event header in bytes.
pub const EVENT_HEADER_LEN: usize = 48;

const WHAT: &str = "event header";

/// Flags of a built event, set by the builder unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventFlags(pub u32);

impl EventFlags {
    /// Super-fragments (or fragments within them) are missing.
    pub const INCOMPLETE: EventFlags = EventFlags(1);
    /// At least one fragment failed its CRC check.
    pub const CRC_ERROR: EventFlags = EventFlags(2);
    /// At least one fragment was cut short by its front end.
    pub const TRUNCATED: EventFlags = EventFlags(4);
    /// A super-fragment or fragment carries a different event id than the event.
    pub const EVENT_ID_MISMATCH: EventFlags = EventFlags(8);

    /// No flag set.
    pub const fn empty() -> Self {
        EventFlags(0)
    }
    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: EventFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// These flags with `other` set too.
    pub const fn with(self, other: EventFlags) -> Self {
        EventFlags(self.0 | other.0)
    }
}

/// The header of a built event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHeader {
    /// Flags, see [`EventFlags`].
    pub flags: EventFlags,
    /// The builder unit that built it.
    pub bu_id: u32,
    /// The event.
    pub event_id: EventId,
    /// The run.
    pub run_number: u32,
    /// Trigger type, from the trigger data the EVM sent with the assignment.
    pub trigger_type: u32,
    /// Number of super-fragments that follow.
    pub super_fragment_count: u32,
    /// Length of the whole event, header included, in bytes.
    pub total_len: u64,
}

impl EventHeader {
    /// The bytes of this header.
    pub fn encode(&self) -> [u8; EVENT_HEADER_LEN] {
        let mut h = [0u8; EVENT_HEADER_LEN];
        put_u32(&mut h, 0, EVENT_MAGIC);
        put_u16(&mut h, 4, EVENT_VERSION);
        put_u16(&mut h, 6, EVENT_HEADER_LEN as u16);
        put_u32(&mut h, 8, self.flags.0);
        put_u32(&mut h, 12, self.bu_id);
        put_u64(&mut h, 16, self.event_id.0);
        put_u32(&mut h, 24, self.run_number);
        put_u32(&mut h, 28, self.trigger_type);
        put_u32(&mut h, 32, self.super_fragment_count);
        // bytes 36..40 are reserved and zero
        put_u64(&mut h, 40, self.total_len);
        h
    }

    /// Decodes the header at the start of `data`.
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let h: &[u8; EVENT_HEADER_LEN] = checked_header(data, WHAT, EVENT_MAGIC, EVENT_VERSION)?;
        let header = EventHeader {
            flags: EventFlags(u32_at(h, 8)),
            bu_id: u32_at(h, 12),
            event_id: EventId(u64_at(h, 16)),
            run_number: u32_at(h, 24),
            trigger_type: u32_at(h, 28),
            super_fragment_count: u32_at(h, 32),
            total_len: u64_at(h, 40),
        };
        if header.total_len < EVENT_HEADER_LEN as u64 {
            return Err(DecodeError::Inconsistent {
                what: WHAT,
                detail: format!("total length {} is shorter than the header", header.total_len),
            });
        }
        Ok(header)
    }
}

/// What the builder unit says about an event it assembles; counts and length are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventInfo {
    /// See [`EventHeader::flags`].
    pub flags: EventFlags,
    /// See [`EventHeader::bu_id`].
    pub bu_id: u32,
    /// See [`EventHeader::event_id`].
    pub event_id: EventId,
    /// See [`EventHeader::run_number`].
    pub run_number: u32,
    /// See [`EventHeader::trigger_type`].
    pub trigger_type: u32,
}

impl EventInfo {
    /// The header of an event made of super-fragments of these lengths.
    pub fn header_for(&self, super_fragment_lens: impl IntoIterator<Item = usize>) -> EventHeader {
        let mut count = 0u32;
        let mut total = EVENT_HEADER_LEN as u64;
        for len in super_fragment_lens {
            count += 1;
            total += len as u64;
        }
        EventHeader {
            flags: self.flags,
            bu_id: self.bu_id,
            event_id: self.event_id,
            run_number: self.run_number,
            trigger_type: self.trigger_type,
            super_fragment_count: count,
            total_len: total,
        }
    }
}

/// A built event: a zero-copy view over its bytes.
///
/// ```
/// use daqflow_wire::*;
/// let frag = |s: u32| Fragment::parse(Fragment::encode(
///     &FragmentInfo { source_id: s, event_id: EventId(5), ..Default::default() }, b"data")).unwrap();
/// let sf = |ru: u32| SuperFragment::parse(SuperFragment::assemble(
///     ru, EventId(5), SuperFragmentFlags::default(), &[frag(ru * 10), frag(ru * 10 + 1)])).unwrap();
/// let bytes = Event::assemble(&EventInfo { event_id: EventId(5), bu_id: 1, ..Default::default() }, &[sf(0), sf(1)]);
/// let event = Event::parse(bytes).unwrap();
/// let check = event.check().unwrap();
/// assert_eq!((check.super_fragments, check.fragments), (2, 4));
/// assert!(check.is_clean());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    header: EventHeader,
    bytes: Bytes,
}

/// The result of [`Event::check`]: what the event holds and what is wrong with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventCheck {
    /// Super-fragments in the event.
    pub super_fragments: u32,
    /// Fragments in the event.
    pub fragments: u32,
    /// Sum of the fragments' payload lengths.
    pub payload_bytes: u64,
    /// Fragments whose payload CRC did not match.
    pub crc_errors: Vec<CrcMismatch>,
    /// `(source id or RU id, event id found)` of parts that belong to another event.
    pub id_mismatches: Vec<(u32, EventId)>,
    /// Fragments flagged truncated by their front end.
    pub truncated_fragments: u32,
    /// Super-fragments flagged incomplete by their RU.
    pub incomplete_super_fragments: u32,
}

impl EventCheck {
    /// No CRC error, no event-id mismatch, nothing missing or truncated.
    pub fn is_clean(&self) -> bool {
        self.crc_errors.is_empty()
            && self.id_mismatches.is_empty()
            && self.truncated_fragments == 0
            && self.incomplete_super_fragments == 0
    }

    /// The event flags that describe what this check found.
    pub fn flags(&self) -> EventFlags {
        let mut f = EventFlags::empty();
        if !self.crc_errors.is_empty() {
            f = f.with(EventFlags::CRC_ERROR);
        }
        if !self.id_mismatches.is_empty() {
            f = f.with(EventFlags::EVENT_ID_MISMATCH);
        }
        if self.truncated_fragments > 0 {
            f = f.with(EventFlags::TRUNCATED);
        }
        if self.incomplete_super_fragments > 0 {
            f = f.with(EventFlags::INCOMPLETE);
        }
        f
    }
}

impl Event {
    /// Builds an event into contiguous memory: a new header followed by copies of
    /// `super_fragments`.
    pub fn assemble(info: &EventInfo, super_fragments: &[SuperFragment]) -> Bytes {
        let header = info.header_for(super_fragments.iter().map(|s| s.as_bytes().len()));
        let mut buf = BytesMut::with_capacity(header.total_len as usize);
        buf.put_slice(&header.encode());
        for sf in super_fragments {
            buf.put_slice(sf.as_bytes());
        }
        buf.freeze()
    }

    /// Parses a buffer holding exactly one event. Only the header is checked here.
    pub fn parse(bytes: Bytes) -> Result<Event, DecodeError> {
        let header = EventHeader::decode(&bytes)?;
        if bytes.len() as u64 != header.total_len {
            return Err(DecodeError::Inconsistent {
                what: "event",
                detail: format!("header says {} bytes but the buffer holds {}", header.total_len, bytes.len()),
            });
        }
        Ok(Event { header, bytes })
    }

    /// The header.
    pub fn header(&self) -> &EventHeader {
        &self.header
    }

    /// The encoded event.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The super-fragments, in order, without copying; yields an error (and ends) on malformed
    /// data or a count that disagrees with the header.
    pub fn super_fragments(&self) -> SuperFragments {
        Counted::new(
            self.bytes.slice(EVENT_HEADER_LEN..),
            self.header.super_fragment_count,
            "event",
            SuperFragment::parse_prefix,
        )
    }

    /// Walks every super-fragment and fragment, checking structure, event ids and every CRC.
    /// Structural damage is an error; CRC and id problems are listed in the result.
    pub fn check(&self) -> Result<EventCheck, DecodeError> {
        let mut check = EventCheck::default();
        let id = self.header.event_id;
        for sf in self.super_fragments() {
            let sf = sf?;
            check.super_fragments += 1;
            if sf.header().event_id != id {
                check.id_mismatches.push((sf.header().ru_id, sf.header().event_id));
            }
            if sf.header().flags.contains(SuperFragmentFlags::INCOMPLETE) {
                check.incomplete_super_fragments += 1;
            }
            for fragment in sf.fragments() {
                let fragment = fragment?;
                let h = fragment.header();
                check.fragments += 1;
                check.payload_bytes += h.payload_len as u64;
                if h.event_id != id {
                    check.id_mismatches.push((h.source_id, h.event_id));
                }
                if h.flags.contains(crate::FragmentFlags::TRUNCATED) {
                    check.truncated_fragments += 1;
                }
                if let Err(e) = fragment.verify_crc() {
                    check.crc_errors.push(e);
                }
            }
        }
        Ok(check)
    }
}

/// Iterator over the super-fragments of an event; see [`Event::super_fragments`].
pub type SuperFragments = Counted<SuperFragment>;
