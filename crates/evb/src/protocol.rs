//! The event builder's messages: frame kinds and payload codecs.
//!
//! Every message is one `daqflow-wire` control frame (16-byte header: magic, version, flags,
//! kind, channel, length) whose payload is laid out here, little-endian throughout. Fragments
//! travel as frames whose payload is one encoded [`daqflow_wire::Fragment`]; super-fragments as
//! frames whose payload is one encoded [`daqflow_wire::SuperFragment`], which a readout unit
//! gathers from the memory it received the fragments into (no copy for fragments above the
//! transport's copy threshold; small ones are packed with other frames into 128 KiB writes).
//! Releases (events built: free their fragments) and level-2
//! rejects are the engine's grouped data control messages
//! ([`daqflow_engine::messages::KIND_DISCARD`] and [`daqflow_engine::messages::KIND_REJECT`]).
//!
//! `docs/evb.md` describes the protocol step by step. Every hello carries the
//! [`PROTOCOL_VERSION`]; a hello of another version is refused ([`ProtocolError::Version`]).
//! [`Message::decode`] checks every length before reading and never panics:
//!
//! ```
//! use daqflow_evb::protocol::{Message, Trigger};
//! let m = Message::Request { credits: 16, done: vec![1, 2, 3] };
//! assert_eq!(Message::decode(&m.to_frame()).unwrap(), m);
//! let t = Message::Triggers { rus: vec![0, 1], triggers: vec![Trigger { event_id: 7, trigger_type: 1, flags: 0, timestamp: 99 }] };
//! assert_eq!(Message::decode(&t.to_frame()).unwrap(), t);
//! ```

use bytes::Bytes;
use daqflow_wire::codec::{CodecError, Reader, Writer};
use daqflow_wire::frame::Frame;

/// The version of the event builder's protocol this build speaks, in every hello. Version 2:
/// builder units have generations (the hello's `generation`, the RU list's and BU gone's), so
/// that an RU knows which admission of a BU id a connection and a BU gone belong to. Version 1
/// (no version in the hello) knew BUs by id only.
///
/// The fields of the hello up to and including the version keep their place in every
/// version, so that any version can tell another's hello and refuse it by name.
pub const PROTOCOL_VERSION: u32 = 2;

/// The event builder's protocol name in the transport's handshake (`docs/security.md`): every
/// connection to an EVM or an RU proves the system token, if one is set, before its hello.
pub const PROTOCOL: &str = "evb";

/// A peer introduces itself: the first frame on every connection.
pub const KIND_HELLO: u16 = 0x0E01;
/// Source → RU: one encoded fragment.
pub const KIND_FRAGMENT: u16 = 0x0E02;
/// Source → RU: the stream ends cleanly after event `last_event`.
pub const KIND_END: u16 = 0x0E03;
/// EVM → BU: the run number, the BU's generation, and the readout units with their addresses.
pub const KIND_RU_LIST: u16 = 0x0E04;
/// BU → EVM: new credits and the events now in the BU's output.
pub const KIND_REQUEST: u16 = 0x0E05;
/// EVM → BU: the events assigned to it, with their trigger data.
pub const KIND_TRIGGERS: u16 = 0x0E06;
/// EVM → RU: events assigned to a BU.
pub const KIND_ASSIGN: u16 = 0x0E07;
/// RU → BU: one encoded super-fragment.
pub const KIND_SUPER_FRAGMENT: u16 = 0x0E08;
/// EVM → RU: a BU (one generation of a BU id) is gone; drop what is queued for it (its events
/// are re-assigned).
pub const KIND_BU_GONE: u16 = 0x0E0A;
/// EVM → RU, BU: the run is over; every event up to `last_event` is accounted for.
pub const KIND_RUN_END: u16 = 0x0E0B;
/// Any → EVM, EVM → any: the run cannot go on, with the reason.
pub const KIND_ABORT: u16 = 0x0E0C;

/// Role of a peer in [`Message::Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A front-end readout stream (FEROL emulator or a user's program).
    Source,
    /// A readout unit.
    Ru,
    /// A builder unit.
    Bu,
    /// A trigger source feeding the EVM.
    Trigger,
}

impl Role {
    fn code(self) -> u32 {
        match self {
            Role::Source => 1,
            Role::Ru => 2,
            Role::Bu => 3,
            Role::Trigger => 4,
        }
    }
    fn from_code(c: u32) -> Option<Role> {
        Some(match c {
            1 => Role::Source,
            2 => Role::Ru,
            3 => Role::Bu,
            4 => Role::Trigger,
            _ => return None,
        })
    }
}

/// One event's trigger data, as the EVM sends it to a BU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trigger {
    /// The event (level-1 trigger number).
    pub event_id: u64,
    /// Trigger type.
    pub trigger_type: u32,
    /// [`Trigger::REASSIGNED`] when the event was first assigned to a BU that died.
    pub flags: u32,
    /// Trigger time stamp (ns since the Unix epoch).
    pub timestamp: u64,
}

impl Trigger {
    /// The event was re-assigned after its first BU was lost.
    pub const REASSIGNED: u32 = 1;
}

/// A decoded event-builder message (fragments and super-fragment parts are not decoded here:
/// they are `daqflow-wire` structures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The first frame on a connection.
    Hello {
        /// What the peer is.
        role: Role,
        /// Its id: source id, RU id or BU id.
        id: u32,
        /// The run it was started for (0: not known yet).
        run: u32,
        /// Its component name, for logs.
        name: String,
        /// An RU's address for builder units (empty otherwise).
        addr: String,
        /// A BU's generation, in its hello to an RU: the one the EVM gave it in the RU list (the
        /// number of BUs with its id the EVM removed before admitting it). 0 in every other
        /// hello. (The encoded hello also carries [`PROTOCOL_VERSION`] before it.)
        generation: u32,
    },
    /// The stream (or the run, from the EVM) ends after `last_event`.
    End {
        /// Last event sent.
        last_event: u64,
    },
    /// The run, the receiving BU's generation and the run's readout units.
    RuList {
        /// Run number.
        run: u32,
        /// The BU's generation: how many BUs with its id the EVM removed (and told the RUs so
        /// with a BU gone) before it admitted this one. The BU says it in its hello to every RU.
        generation: u32,
        /// `(RU id, address for builder units)`.
        rus: Vec<(u32, String)>,
    },
    /// A BU asks for `credits` more events and confirms `done`.
    Request {
        /// Further events the BU can take.
        credits: u32,
        /// Events now in the BU's output (file written, or put into the ET system).
        done: Vec<u64>,
    },
    /// Events assigned to the receiving BU.
    Triggers {
        /// Every RU that sends a super-fragment for these events.
        rus: Vec<u32>,
        /// The events with their trigger data.
        triggers: Vec<Trigger>,
    },
    /// Events assigned to BU `bu` (to an RU).
    Assign {
        /// The builder unit.
        bu: u32,
        /// The events, in assignment order.
        events: Vec<u64>,
    },
    /// BU `bu` of generation `generation` is gone.
    BuGone {
        /// The builder unit.
        bu: u32,
        /// Which admission of the id: the generation the EVM gave that BU.
        generation: u32,
    },
    /// The run is over.
    RunEnd {
        /// Last event of the run.
        last_event: u64,
    },
    /// The run cannot go on.
    Abort {
        /// Why.
        reason: String,
    },
}

/// A message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The payload is short, long, or has a field of an undefined value.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A field has a value no valid message has.
    #[error("{what}: {detail}")]
    Invalid {
        /// The message.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The frame kind is not an event-builder message.
    #[error("frame kind {0:#06x} is not an event-builder message")]
    UnknownKind(u16),
    /// A hello of another protocol version: the peer runs another daqflow-evb (every component
    /// of a builder must speak the same version). Nothing after the version is read.
    #[error(
        "{} {id} ({name:?}) speaks evb protocol version {version}{}; this component speaks version {PROTOCOL_VERSION}: \
         run the same daqflow version on every host of the builder",
        role.map_or("a peer with id", crate::link::role_name),
        if *version == 1 { " (its hello has no version)" } else { "" }
    )]
    Version {
        /// What the peer says it is (none: a role this version does not know).
        role: Option<Role>,
        /// Its id.
        id: u32,
        /// Its name.
        name: String,
        /// The version it speaks (1: a hello without a version, from before versions).
        version: u32,
    },
}

impl Message {
    /// The frame kind of this message.
    pub fn kind(&self) -> u16 {
        match self {
            Message::Hello { .. } => KIND_HELLO,
            Message::End { .. } => KIND_END,
            Message::RuList { .. } => KIND_RU_LIST,
            Message::Request { .. } => KIND_REQUEST,
            Message::Triggers { .. } => KIND_TRIGGERS,
            Message::Assign { .. } => KIND_ASSIGN,
            Message::BuGone { .. } => KIND_BU_GONE,
            Message::RunEnd { .. } => KIND_RUN_END,
            Message::Abort { .. } => KIND_ABORT,
        }
    }

    /// Encodes the payload.
    pub fn encode(&self) -> Bytes {
        let mut b = Writer::new();
        match self {
            Message::Hello { role, id, run, name, addr, generation } => {
                b.u32(role.code());
                b.u32(*id);
                b.u32(*run);
                b.text(name);
                b.text(addr);
                b.u32(PROTOCOL_VERSION);
                b.u32(*generation);
            }
            Message::End { last_event } | Message::RunEnd { last_event } => b.u64(*last_event),
            Message::RuList { run, generation, rus } => {
                b.u32(*run);
                b.u32(*generation);
                b.count(rus.len());
                for (id, addr) in rus {
                    b.u32(*id);
                    b.text(addr);
                }
            }
            Message::Request { credits, done } => {
                b.u32(*credits);
                b.count(done.len());
                for id in done {
                    b.u64(*id);
                }
            }
            Message::Triggers { rus, triggers } => {
                b.count(rus.len());
                for r in rus {
                    b.u32(*r);
                }
                b.count(triggers.len());
                for t in triggers {
                    b.u64(t.event_id);
                    b.u32(t.trigger_type);
                    b.u32(t.flags);
                    b.u64(t.timestamp);
                }
            }
            Message::Assign { bu, events } => {
                b.u32(*bu);
                b.count(events.len());
                for id in events {
                    b.u64(*id);
                }
            }
            Message::BuGone { bu, generation } => {
                b.u32(*bu);
                b.u32(*generation);
            }
            Message::Abort { reason } => b.text(reason),
        }
        b.finish()
    }

    /// The message as a frame.
    pub fn to_frame(&self) -> Frame {
        Frame::new(self.kind(), self.encode())
    }

    /// Decodes a frame of one of this module's kinds (not [`KIND_FRAGMENT`] or
    /// [`KIND_SUPER_FRAGMENT`], whose payloads are `daqflow-wire` structures).
    pub fn decode(frame: &Frame) -> Result<Message, ProtocolError> {
        let p = &frame.payload[..];
        let m = match frame.kind {
            KIND_HELLO => {
                let mut r = Reader::new("hello", p);
                let code = r.u32("role")?;
                let id = r.u32("id")?;
                let run = r.u32("run")?;
                let name = r.text("name")?;
                let addr = r.text("addr")?;
                // Version 1 ended here; later versions keep everything up to the version in place.
                let version = if r.remaining() == 0 { 1 } else { r.u32("version")? };
                let role = Role::from_code(code);
                if version != PROTOCOL_VERSION {
                    return Err(ProtocolError::Version { role, id, name, version });
                }
                let role = role
                    .ok_or_else(|| ProtocolError::Invalid { what: "hello", detail: format!("unknown role {code}") })?;
                let generation = r.u32("generation")?;
                r.finish()?;
                Message::Hello { role, id, run, name, addr, generation }
            }
            KIND_END | KIND_RUN_END => {
                let mut r = Reader::new("end", p);
                let last_event = r.u64("last event")?;
                r.finish()?;
                if frame.kind == KIND_END { Message::End { last_event } } else { Message::RunEnd { last_event } }
            }
            KIND_RU_LIST => {
                let mut r = Reader::new("RU list", p);
                let run = r.u32("run")?;
                let generation = r.u32("generation")?;
                let n = r.count(6, "RUs")?;
                let mut rus = Vec::with_capacity(n);
                for _ in 0..n {
                    rus.push((r.u32("RU id")?, r.text("RU address")?));
                }
                r.finish()?;
                Message::RuList { run, generation, rus }
            }
            KIND_REQUEST => {
                let mut r = Reader::new("request", p);
                let credits = r.u32("credits")?;
                let n = r.count(8, "done")?;
                let done = (0..n).map(|_| r.u64("done")).collect::<Result<_, _>>()?;
                r.finish()?;
                Message::Request { credits, done }
            }
            KIND_TRIGGERS => {
                let mut r = Reader::new("triggers", p);
                let n = r.count(4, "RUs")?;
                let rus = (0..n).map(|_| r.u32("RU id")).collect::<Result<_, _>>()?;
                let n = r.count(24, "triggers")?;
                let mut triggers = Vec::with_capacity(n);
                for _ in 0..n {
                    triggers.push(Trigger {
                        event_id: r.u64("event id")?,
                        trigger_type: r.u32("trigger type")?,
                        flags: r.u32("flags")?,
                        timestamp: r.u64("timestamp")?,
                    });
                }
                r.finish()?;
                Message::Triggers { rus, triggers }
            }
            KIND_ASSIGN => {
                let mut r = Reader::new("assign", p);
                let bu = r.u32("BU")?;
                let n = r.count(8, "events")?;
                let events = (0..n).map(|_| r.u64("event")).collect::<Result<_, _>>()?;
                r.finish()?;
                Message::Assign { bu, events }
            }
            KIND_BU_GONE => {
                let mut r = Reader::new("BU gone", p);
                let bu = r.u32("BU")?;
                let generation = r.u32("generation")?;
                r.finish()?;
                Message::BuGone { bu, generation }
            }
            KIND_ABORT => {
                let mut r = Reader::new("abort", p);
                let reason = r.text("reason")?;
                r.finish()?;
                Message::Abort { reason }
            }
            k => return Err(ProtocolError::UnknownKind(k)),
        };
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message() -> impl Strategy<Value = Message> {
        let text = "[a-z0-9:._-]{0,20}";
        prop_oneof![
            (0u32..4, any::<u32>(), any::<u32>(), text, text, any::<u32>()).prop_map(
                |(r, id, run, name, addr, generation)| Message::Hello {
                    role: Role::from_code(r + 1).unwrap(),
                    id,
                    run,
                    name,
                    addr,
                    generation
                }
            ),
            any::<u64>().prop_map(|last_event| Message::End { last_event }),
            (any::<u32>(), any::<u32>(), proptest::collection::vec((any::<u32>(), text), 0..5))
                .prop_map(|(run, generation, rus)| Message::RuList { run, generation, rus }),
            (any::<u32>(), proptest::collection::vec(any::<u64>(), 0..50))
                .prop_map(|(credits, done)| Message::Request { credits, done }),
            (
                proptest::collection::vec(any::<u32>(), 0..5),
                proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()), 0..20)
            )
                .prop_map(|(rus, t)| Message::Triggers {
                    rus,
                    triggers: t
                        .into_iter()
                        .map(|(event_id, trigger_type, flags, timestamp)| Trigger {
                            event_id,
                            trigger_type,
                            flags,
                            timestamp
                        })
                        .collect()
                }),
            (any::<u32>(), proptest::collection::vec(any::<u64>(), 0..50))
                .prop_map(|(bu, events)| Message::Assign { bu, events }),
            (any::<u32>(), any::<u32>()).prop_map(|(bu, generation)| Message::BuGone { bu, generation }),
            any::<u64>().prop_map(|last_event| Message::RunEnd { last_event }),
            text.prop_map(|reason| Message::Abort { reason }),
        ]
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in message()) {
            prop_assert_eq!(Message::decode(&m.to_frame()).unwrap(), m);
        }

        #[test]
        fn random_payloads_give_errors_not_panics(kind in 0x0E00u16..0x0E10, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode(&Frame::new(kind, Bytes::from(payload)));
        }

        /// Valid messages with bytes overwritten at random: an error or a message, never a
        /// panic; and what decodes encodes to what decodes to the same message.
        #[test]
        fn corrupted_messages_give_errors_or_messages_not_panics(
            m in message(),
            hits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let mut bytes = m.encode().to_vec();
            if !bytes.is_empty() {
                for (at, v) in hits {
                    let i = at.index(bytes.len());
                    bytes[i] = v;
                }
            }
            if let Ok(d) = Message::decode(&Frame::new(m.kind(), Bytes::from(bytes))) {
                prop_assert_eq!(Message::decode(&d.to_frame()).unwrap(), d);
            }
        }

        /// A hello whose first five fields are well formed and whose rest is anything: accepted
        /// only as this version's hello (version, generation, nothing more); any other version is
        /// refused by name, with the peer it says it is; never a panic.
        #[test]
        fn a_hello_of_any_other_version_is_refused_by_name(
            role in 1u32..=4,
            id in any::<u32>(),
            name in "[a-z0-9-]{0,12}",
            tail in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut w = Writer::new();
            w.u32(role);
            w.u32(id);
            w.u32(5);
            w.text(&name);
            w.text("");
            w.bytes(&tail);
            let got = Message::decode(&Frame::new(KIND_HELLO, w.finish()));
            let version = match tail.get(..4) {
                None if tail.is_empty() => Some(1),
                None => None,
                Some(v) => Some(u32::from_le_bytes(v.try_into().unwrap())),
            };
            match (version, got) {
                (Some(v), Err(ProtocolError::Version { role: r, id: i, name: n, version }))
                    if v != PROTOCOL_VERSION =>
                {
                    prop_assert_eq!((r, i, n, version), (Role::from_code(role), id, name, v));
                }
                (Some(PROTOCOL_VERSION), Ok(Message::Hello { generation, .. })) => {
                    prop_assert_eq!(tail.len(), 8);
                    prop_assert_eq!(generation, u32::from_le_bytes(tail[4..8].try_into().unwrap()));
                }
                (Some(PROTOCOL_VERSION), Err(ProtocolError::Codec(_))) => prop_assert_ne!(tail.len(), 8),
                (None, Err(ProtocolError::Codec(_))) => {}
                (v, got) => prop_assert!(false, "version {v:?}: {got:?}"),
            }
        }

        #[test]
        fn a_cut_or_extended_message_is_refused(m in message(), cut in any::<prop::sample::Index>(), extra in 1usize..9) {
            let full = m.encode();
            if !full.is_empty() {
                let at = cut.index(full.len());
                prop_assert!(Message::decode(&Frame::new(m.kind(), full.slice(..at))).is_err());
            }
            let mut longer = full.to_vec();
            longer.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(Message::decode(&Frame::new(m.kind(), Bytes::from(longer))).is_err());
        }
    }

    #[test]
    fn every_kind_is_in_the_evb_range_of_the_registry() {
        for k in [
            KIND_HELLO,
            KIND_FRAGMENT,
            KIND_END,
            KIND_RU_LIST,
            KIND_REQUEST,
            KIND_TRIGGERS,
            KIND_ASSIGN,
            KIND_SUPER_FRAGMENT,
            KIND_BU_GONE,
            KIND_RUN_END,
            KIND_ABORT,
        ] {
            assert!(daqflow_wire::kinds::EVB.contains(k), "{k:#06x}");
        }
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary() {
        let reason = "é".repeat(40_000); // 80 000 bytes
        let m = Message::Abort { reason };
        match Message::decode(&m.to_frame()).unwrap() {
            Message::Abort { reason } => assert!(reason.len() <= 65535 && reason.chars().all(|c| c == 'é')),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_hello_of_version_1_is_refused_with_a_message_that_says_so() {
        // Version 1's hello: role, id, run, name, address, nothing more.
        let mut w = Writer::new();
        w.u32(3);
        w.u32(4);
        w.u32(12);
        w.text("bu-4");
        w.text("");
        let err = Message::decode(&Frame::new(KIND_HELLO, w.finish())).unwrap_err();
        assert_eq!(err, ProtocolError::Version { role: Some(Role::Bu), id: 4, name: "bu-4".into(), version: 1 });
        assert_eq!(
            err.to_string(),
            "BU 4 (\"bu-4\") speaks evb protocol version 1 (its hello has no version); this component speaks \
             version 2: run the same daqflow version on every host of the builder"
        );
    }

    #[test]
    fn the_generations_are_where_the_documentation_says() {
        let hello =
            Message::Hello { role: Role::Bu, id: 1, run: 2, name: "b".into(), addr: String::new(), generation: 7 };
        assert_eq!(
            &hello.encode()[..],
            [&[3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, b'b', 0, 0][..], &[2, 0, 0, 0, 7, 0, 0, 0]].concat()
        );
        let list = Message::RuList { run: 2, generation: 7, rus: vec![(0, "a".into())] };
        assert_eq!(&list.encode()[..], [2, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, b'a']);
        let gone = Message::BuGone { bu: 1, generation: 7 };
        assert_eq!(&gone.encode()[..], [1, 0, 0, 0, 7, 0, 0, 0]);
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut b = Writer::new();
        b.u32(1);
        b.u32(u32::MAX);
        let err = Message::decode(&Frame::new(KIND_REQUEST, b.finish())).unwrap_err();
        assert!(matches!(err, ProtocolError::Codec(CodecError::Short { .. })), "{err}");
    }
}
