//! Data control messages (ATLAS DAQ-Unit, section 2): accept (L2A: build this event), reject
//! (L2R: discard it), region of interest (ROI: send part of it to a level-2 consumer) and discard
//! (after data collection).
//!
//! Messages are small (8 to 24 bytes) and grouped: a [`Grouper`] collects messages of one kind
//! until its group is full (the paper's TRG sends ten L2Rs as one message) and hands out one
//! `daqflow-wire` [`Frame`] per group. A group's payload is a count and fixed-size entries, all
//! little-endian:
//!
//! | kind | frame kind | entry | entry bytes |
//! | --- | --- | --- | --- |
//! | accept (L2A) | `0x0C01` | event id u64, trigger type u32, destination u32 | 16 |
//! | reject (L2R) | `0x0C02` | event id u64 | 8 |
//! | ROI | `0x0C03` | event id u64, destination u32, source base u32, source mask u64 | 24 |
//! | discard | `0x0C04` | event id u64 | 8 |
//!
//! Payload: `count: u32`, then `count` entries. A ROI names the sources (ROBs) whose data the
//! level-2 consumer `destination` wants: source `base + i` for every bit `i` set in `mask`.
//! [`decode`] checks the kind and that the length matches the count exactly before anything is
//! read, and never panics.
//!
//! ```
//! use daqflow_engine::messages::{self, ControlMessage, Grouper, GroupSizes};
//! let mut g = Grouper::new(GroupSizes::default()); // ten rejects per message
//! let mut frames = Vec::new();
//! for id in 0..25 {
//!     frames.extend(g.push(ControlMessage::Reject { event_id: id }));
//! }
//! frames.extend(g.flush());
//! assert_eq!(frames.len(), 3);
//! let ids: Vec<u64> = frames.iter().flat_map(|f| messages::decode(f).unwrap().event_ids().collect::<Vec<_>>()).collect();
//! assert_eq!(ids, (0..25).collect::<Vec<_>>());
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_wire::frame::Frame;

use crate::error::MessageError;

/// Frame kind of grouped accepts (L2A).
pub const KIND_ACCEPT: u16 = daqflow_wire::kinds::DATA_CONTROL.at(1);
/// Frame kind of grouped rejects (L2R).
pub const KIND_REJECT: u16 = daqflow_wire::kinds::DATA_CONTROL.at(2);
/// Frame kind of grouped ROIs.
pub const KIND_ROI: u16 = daqflow_wire::kinds::DATA_CONTROL.at(3);
/// Frame kind of grouped discards.
pub const KIND_DISCARD: u16 = daqflow_wire::kinds::DATA_CONTROL.at(4);

/// The kinds of data control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// L2A: the event is accepted; its data is to be collected.
    Accept,
    /// L2R: the event is rejected; its fragments are to be freed.
    Reject,
    /// Region of interest: part of the event goes to a level-2 consumer.
    Roi,
    /// The event was collected; its fragments are to be freed.
    Discard,
}

impl MessageKind {
    const ALL: [MessageKind; 4] = [MessageKind::Accept, MessageKind::Reject, MessageKind::Roi, MessageKind::Discard];

    /// The frame kind.
    pub fn frame_kind(self) -> u16 {
        match self {
            MessageKind::Accept => KIND_ACCEPT,
            MessageKind::Reject => KIND_REJECT,
            MessageKind::Roi => KIND_ROI,
            MessageKind::Discard => KIND_DISCARD,
        }
    }

    /// Bytes per entry.
    pub fn entry_len(self) -> usize {
        match self {
            MessageKind::Accept => 16,
            MessageKind::Reject | MessageKind::Discard => 8,
            MessageKind::Roi => 24,
        }
    }

    /// The kind's short name (L2A, L2R, ROI, discard).
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Accept => "L2A",
            MessageKind::Reject => "L2R",
            MessageKind::Roi => "ROI",
            MessageKind::Discard => "discard",
        }
    }

    fn from_frame_kind(kind: u16) -> Option<MessageKind> {
        MessageKind::ALL.into_iter().find(|k| k.frame_kind() == kind)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One data control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlMessage {
    /// L2A: collect event `event_id` for `destination`.
    Accept {
        /// The event.
        event_id: u64,
        /// Its trigger type.
        trigger_type: u32,
        /// Who collects it (an EBIF, a builder unit).
        destination: u32,
    },
    /// L2R: free event `event_id`.
    Reject {
        /// The event.
        event_id: u64,
    },
    /// ROI: send the data of sources `base + i` (bit `i` of `mask`) of event `event_id` to the
    /// level-2 consumer `destination`.
    Roi {
        /// The event.
        event_id: u64,
        /// The level-2 consumer.
        destination: u32,
        /// First source of the mask.
        base: u32,
        /// Sources wanted, relative to `base`.
        mask: u64,
    },
    /// Free event `event_id`: it has been collected.
    Discard {
        /// The event.
        event_id: u64,
    },
}

impl ControlMessage {
    /// The message's kind.
    pub fn kind(&self) -> MessageKind {
        match self {
            ControlMessage::Accept { .. } => MessageKind::Accept,
            ControlMessage::Reject { .. } => MessageKind::Reject,
            ControlMessage::Roi { .. } => MessageKind::Roi,
            ControlMessage::Discard { .. } => MessageKind::Discard,
        }
    }

    /// The event it is about.
    pub fn event_id(&self) -> u64 {
        match *self {
            ControlMessage::Accept { event_id, .. }
            | ControlMessage::Reject { event_id }
            | ControlMessage::Roi { event_id, .. }
            | ControlMessage::Discard { event_id } => event_id,
        }
    }

    fn put(&self, out: &mut BytesMut) {
        match *self {
            ControlMessage::Accept { event_id, trigger_type, destination } => {
                out.put_u64_le(event_id);
                out.put_u32_le(trigger_type);
                out.put_u32_le(destination);
            }
            ControlMessage::Reject { event_id } | ControlMessage::Discard { event_id } => out.put_u64_le(event_id),
            ControlMessage::Roi { event_id, destination, base, mask } => {
                out.put_u64_le(event_id);
                out.put_u32_le(destination);
                out.put_u32_le(base);
                out.put_u64_le(mask);
            }
        }
    }
}

/// Messages per group, per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupSizes {
    /// Accepts per message (default 1: an accept starts data collection, do not delay it).
    pub accept: usize,
    /// Rejects per message (default 10, as the paper's TRG).
    pub reject: usize,
    /// ROIs per message (default 1).
    pub roi: usize,
    /// Discards per message (default 10).
    pub discard: usize,
}

impl Default for GroupSizes {
    fn default() -> Self {
        GroupSizes { accept: 1, reject: 10, roi: 1, discard: 10 }
    }
}

impl GroupSizes {
    /// `n` messages per group for every kind.
    pub fn all(n: usize) -> GroupSizes {
        GroupSizes { accept: n, reject: n, roi: n, discard: n }
    }

    fn get(&self, kind: MessageKind) -> usize {
        match kind {
            MessageKind::Accept => self.accept,
            MessageKind::Reject => self.reject,
            MessageKind::Roi => self.roi,
            MessageKind::Discard => self.discard,
        }
        .max(1)
    }
}

/// Collects messages into groups of one kind and hands out a frame per full group.
#[derive(Debug)]
pub struct Grouper {
    sizes: GroupSizes,
    pending: [(BytesMut, u32); 4],
}

impl Grouper {
    /// A grouper with these group sizes.
    pub fn new(sizes: GroupSizes) -> Grouper {
        Grouper { sizes, pending: Default::default() }
    }

    /// Adds a message; returns the frame of its group if this message filled it.
    pub fn push(&mut self, message: ControlMessage) -> Option<Frame> {
        let kind = message.kind();
        let n = self.sizes.get(kind);
        let (buf, count) = &mut self.pending[kind.index()];
        if *count == 0 {
            buf.reserve(4 + n * kind.entry_len());
            buf.put_u32_le(0);
        }
        message.put(buf);
        *count += 1;
        if *count as usize >= n { Some(self.take(kind)) } else { None }
    }

    /// Messages waiting in unfinished groups.
    pub fn pending(&self) -> usize {
        self.pending.iter().map(|p| p.1 as usize).sum()
    }

    /// The frames of every unfinished group (at a timeout, or at the end of a run).
    pub fn flush(&mut self) -> Vec<Frame> {
        let kinds: Vec<MessageKind> = MessageKind::ALL.into_iter().filter(|k| self.pending[k.index()].1 > 0).collect();
        kinds.into_iter().map(|k| self.take(k)).collect()
    }

    fn take(&mut self, kind: MessageKind) -> Frame {
        let (buf, count) = &mut self.pending[kind.index()];
        buf[..4].copy_from_slice(&count.to_le_bytes());
        *count = 0;
        Frame::new(kind.frame_kind(), buf.split().freeze())
    }
}

/// A decoded, checked group of messages of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageGroup {
    kind: MessageKind,
    count: usize,
    entries: Bytes,
}

/// Checks a frame and returns its group of messages.
pub fn decode(frame: &Frame) -> Result<MessageGroup, MessageError> {
    let kind = MessageKind::from_frame_kind(frame.kind).ok_or(MessageError::UnknownKind(frame.kind))?;
    let p = &frame.payload;
    let bad = |count: u32| MessageError::BadLength { kind: kind.name(), len: p.len(), count, entry: kind.entry_len() };
    let mut r = daqflow_wire::codec::Reader::new(kind.name(), p);
    let count = r.u32("count").map_err(|_| bad(0))?;
    if r.remaining() as u64 != u64::from(count) * kind.entry_len() as u64 {
        return Err(bad(count));
    }
    Ok(MessageGroup { kind, count: count as usize, entries: p.slice(4..) })
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl MessageGroup {
    /// The messages' kind.
    pub fn kind(&self) -> MessageKind {
        self.kind
    }
    /// Number of messages.
    pub fn len(&self) -> usize {
        self.count
    }
    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The event ids, in order (every kind starts its entry with one).
    pub fn event_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.chunks_exact(self.kind.entry_len()).map(|e| u64_at(e, 0))
    }
    /// The messages, in order.
    pub fn iter(&self) -> impl Iterator<Item = ControlMessage> + '_ {
        let kind = self.kind;
        self.entries.chunks_exact(kind.entry_len()).map(move |e| match kind {
            MessageKind::Accept => ControlMessage::Accept {
                event_id: u64_at(e, 0),
                trigger_type: u32_at(e, 8),
                destination: u32_at(e, 12),
            },
            MessageKind::Reject => ControlMessage::Reject { event_id: u64_at(e, 0) },
            MessageKind::Roi => ControlMessage::Roi {
                event_id: u64_at(e, 0),
                destination: u32_at(e, 8),
                base: u32_at(e, 12),
                mask: u64_at(e, 16),
            },
            MessageKind::Discard => ControlMessage::Discard { event_id: u64_at(e, 0) },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message() -> impl Strategy<Value = ControlMessage> {
        prop_oneof![
            (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(event_id, trigger_type, destination)| {
                ControlMessage::Accept { event_id, trigger_type, destination }
            }),
            any::<u64>().prop_map(|event_id| ControlMessage::Reject { event_id }),
            (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(event_id, destination, base, mask)| {
                ControlMessage::Roi { event_id, destination, base, mask }
            }),
            any::<u64>().prop_map(|event_id| ControlMessage::Discard { event_id }),
        ]
    }

    proptest! {
        #[test]
        fn grouped_messages_round_trip_in_order_per_kind(
            messages in proptest::collection::vec(message(), 0..200),
            n in 1usize..16,
        ) {
            let mut g = Grouper::new(GroupSizes::all(n));
            let mut frames = Vec::new();
            for m in &messages {
                frames.extend(g.push(*m));
            }
            frames.extend(g.flush());
            prop_assert_eq!(g.pending(), 0);
            let mut back = Vec::new();
            for f in &frames {
                let group = decode(f).unwrap();
                prop_assert!(group.len() <= n && !group.is_empty());
                prop_assert_eq!(group.event_ids().count(), group.len());
                back.extend(group.iter());
            }
            for kind in MessageKind::ALL {
                let sent: Vec<_> = messages.iter().filter(|m| m.kind() == kind).collect();
                let got: Vec<_> = back.iter().filter(|m| m.kind() == kind).collect();
                prop_assert_eq!(sent, got);
            }
        }

        #[test]
        fn random_frames_never_panic(kind in prop_oneof![Just(KIND_ACCEPT), Just(KIND_REJECT), Just(KIND_ROI), Just(KIND_DISCARD), any::<u16>()],
                                     payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            let frame = Frame::new(kind, Bytes::from(payload));
            if let Ok(group) = decode(&frame) {
                prop_assert_eq!(group.iter().count(), group.len());
            }
        }
    }

    #[test]
    fn a_count_that_does_not_match_the_length_is_refused() {
        let mut p = BytesMut::new();
        p.put_u32_le(3);
        p.put_u64_le(1);
        let e = decode(&Frame::new(KIND_REJECT, p.freeze())).unwrap_err();
        assert_eq!(e, MessageError::BadLength { kind: "L2R", len: 12, count: 3, entry: 8 });
        assert_eq!(decode(&Frame::new(7, Bytes::new())).unwrap_err(), MessageError::UnknownKind(7));
        let huge = Bytes::from(u32::MAX.to_le_bytes().to_vec());
        assert!(decode(&Frame::new(KIND_ROI, huge)).is_err());
    }
}
