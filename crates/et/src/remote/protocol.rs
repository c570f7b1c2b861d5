//! The remote protocol: daqflow frames whose kind is the message (the ET range of the registry,
//! [`daqflow_wire::kinds::ET_REMOTE`]: `0x0100` + the message number); station and status
//! messages carry JSON, event batches a compact binary layout (see `docs/et.md`).

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_wire::codec::{CodecError, Reader};
use serde::{Deserialize, Serialize};

use daqflow_wire::kinds::ET_REMOTE;

use crate::config::{Position, StationConfig, Wait};
use crate::error::EtError;

pub(crate) const HELLO: u16 = ET_REMOTE.at(1);
pub(crate) const WELCOME: u16 = ET_REMOTE.at(2);
pub(crate) const ATTACH: u16 = ET_REMOTE.at(3);
pub(crate) const ATTACHED: u16 = ET_REMOTE.at(4);
pub(crate) const DETACH: u16 = ET_REMOTE.at(5);
pub(crate) const NEW: u16 = ET_REMOTE.at(6);
pub(crate) const EVENTS: u16 = ET_REMOTE.at(7);
pub(crate) const GET: u16 = ET_REMOTE.at(8);
pub(crate) const PUT: u16 = ET_REMOTE.at(9);
pub(crate) const DUMP: u16 = ET_REMOTE.at(10);
pub(crate) const STATION: u16 = ET_REMOTE.at(11);
pub(crate) const STATUS: u16 = ET_REMOTE.at(12);
pub(crate) const SNAPSHOT: u16 = ET_REMOTE.at(13);
/// Keeps an idle client's attachments alive.
pub(crate) const PING: u16 = ET_REMOTE.at(14);
/// The data of one event of the batch before it (events of at least [`INLINE_MAX`] bytes).
pub(crate) const DATA: u16 = ET_REMOTE.at(15);
/// Gives events got and never used back to the front of the station's input list.
pub(crate) const UNGET: u16 = ET_REMOTE.at(16);
pub(crate) const OK: u16 = ET_REMOTE.at(100);
pub(crate) const ERROR: u16 = ET_REMOTE.at(101);

/// The longest a server waits inside one GET before answering with no event (the client asks
/// again): keeps the connection responsive and lets both ends notice a dead peer.
pub(crate) const MAX_SERVER_WAIT_MS: u64 = 500;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Welcome {
    pub name: String,
    pub events: u32,
    pub event_size: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum StationOp {
    Create { name: String, config: StationConfig, position: Position },
    Remove { name: String },
    Configure { name: String, config: StationConfig },
}

/// Event header flags on the wire.
pub(crate) const EV_CORRUPT: u8 = 1;
pub(crate) const EV_LARGE: u8 = 2;
pub(crate) const EV_HIGH: u8 = 4;
/// The event's data follows its header in the batch.
pub(crate) const EV_DATA: u8 = 8;
/// The event's data follows the batch in a DATA frame of its own.
pub(crate) const EV_FRAME: u8 = 16;

/// Events with less data than this travel inside the batch (one copy, cheap); larger ones in
/// DATA frames of their own, which both ends send from the event's memory without a copy.
pub(crate) const INLINE_MAX: usize = 2048;

/// One event on the wire: its header and, if sent, its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireEvent {
    pub idx: u32,
    pub len: u32,
    pub cap: u32,
    pub flags: u8,
    pub control: [i32; 4],
    pub data: Option<Bytes>,
}

pub(crate) const WIRE_HEADER: usize = 4 + 4 + 4 + 1 + 3 + 16;

pub(crate) fn encode_wait(w: Wait, out: &mut BytesMut) {
    match w {
        Wait::NoWait => out.put_u64_le(0),
        Wait::Timed(d) => out.put_u64_le((d.as_millis() as u64).clamp(1, u64::MAX - 1)),
        Wait::Sleep => out.put_u64_le(u64::MAX),
    }
}

pub(crate) fn decode_wait(r: &mut Reader<'_>) -> Result<Wait, EtError> {
    Ok(match r.u64("wait").map_err(codec)? {
        0 => Wait::NoWait,
        u64::MAX => Wait::Sleep,
        ms => Wait::Timed(std::time::Duration::from_millis(ms)),
    })
}

/// A payload that does not decode: the connection's stream cannot be trusted any more.
pub(crate) fn codec(e: CodecError) -> EtError {
    EtError::Protocol(e.to_string())
}

/// Appends a batch header (event count).
pub(crate) fn begin_batch(out: &mut BytesMut, n: usize) {
    out.put_u32_le(n as u32);
}

/// How an event's data travels with its header.
pub(crate) enum DataMode<'a> {
    /// Not at all.
    None,
    /// Inside the batch, after the header.
    Inline(&'a [u8]),
    /// In a DATA frame after the batch (`len` bytes).
    Frame,
}

/// Appends one event's header, and its data if inline.
pub(crate) fn put_event(
    out: &mut BytesMut,
    idx: u32,
    len: u32,
    cap: u32,
    flags: u8,
    control: [i32; 4],
    data: DataMode<'_>,
) {
    out.put_u32_le(idx);
    out.put_u32_le(len);
    out.put_u32_le(cap);
    out.put_u8(
        flags
            | match data {
                DataMode::None => 0,
                DataMode::Inline(_) => EV_DATA,
                DataMode::Frame => EV_FRAME,
            },
    );
    out.put_bytes(0, 3);
    for c in control {
        out.put_i32_le(c);
    }
    if let DataMode::Inline(d) = data {
        out.put_slice(d);
    }
}

/// Decodes a batch; inline data are slices of `b`, not copies. Events flagged [`EV_FRAME`] get
/// their data from the DATA frames that follow, in order: `frame_data` reads the next one.
pub(crate) fn decode_batch(
    b: Bytes,
    max_events: usize,
    mut frame_data: impl FnMut() -> Result<Bytes, EtError>,
) -> Result<Vec<WireEvent>, EtError> {
    let mut r = Reader::new("batch", &b);
    let n = r.count(WIRE_HEADER, "events").map_err(codec)?;
    if n > max_events {
        return Err(EtError::Protocol(format!("batch of {n} events, more than the system's {max_events}")));
    }
    let mut out = Vec::with_capacity(n);
    let mut in_frames = Vec::new();
    for _ in 0..n {
        let (idx, len, cap, flags, control) = (|| {
            let h = (r.u32("index")?, r.u32("length")?, r.u32("capacity")?, r.u8("flags")?);
            r.take(3, "reserved")?;
            let control = [r.i32("control")?, r.i32("control")?, r.i32("control")?, r.i32("control")?];
            Ok::<_, CodecError>((h.0, h.1, h.2, h.3, control))
        })()
        .map_err(codec)?;
        let (inline, framed) = (flags & EV_DATA != 0, flags & EV_FRAME != 0);
        if inline && framed {
            return Err(EtError::Protocol("an event's data both inline and in a frame".into()));
        }
        let data = if inline {
            let at = r.position();
            r.take(len as usize, "data").map_err(codec)?;
            Some(b.slice(at..at + len as usize))
        } else {
            None
        };
        if framed {
            in_frames.push(out.len());
        }
        out.push(WireEvent { idx, len, cap, flags: flags & !(EV_DATA | EV_FRAME), control, data });
    }
    r.finish().map_err(codec)?;
    for i in in_frames {
        let e = &mut out[i];
        let d = frame_data()?;
        if d.len() != e.len as usize {
            return Err(EtError::Protocol(format!(
                "event {}: {} bytes of data for a length of {}",
                e.idx,
                d.len(),
                e.len
            )));
        }
        e.data = Some(d);
    }
    Ok(out)
}

/// A client's request, decoded by the server before it is served.
#[derive(Debug)]
pub(crate) enum Request {
    /// The first request of a connection (its payload is not read).
    Hello,
    /// Attach to a station.
    Attach { station: String },
    /// Detach the attachment of the frame's channel.
    Detach,
    /// Up to `count` new events of at least `size` bytes (0 is served as 1, `docs/et.md`).
    New { count: u32, size: u64, wait: Wait },
    /// Up to `count` events from the station (0 is served as 1).
    Get { count: u32, wait: Wait },
    /// Events put back, with their data.
    Put { events: Vec<WireEvent> },
    /// Events dumped.
    Dump { events: Vec<u32> },
    /// Events given back to the front of the station's input list.
    Unget { events: Vec<u32> },
    /// A station created, removed or configured.
    Station(StationOp),
    /// The system's state.
    Status,
    /// Keeps the connection's attachments alive.
    Ping,
}

impl Request {
    /// Decodes the request in `frame`. A `PUT` takes the data of its events from the `DATA`
    /// frames after it, which `next_frame` reads; `max_events` is the pool's size (no batch is
    /// larger). Every malformed request is [`EtError::Protocol`]: the connection is closed.
    pub(crate) fn decode(
        frame: &daqflow_wire::frame::Frame,
        max_events: usize,
        mut next_frame: impl FnMut() -> Result<daqflow_wire::frame::Frame, EtError>,
    ) -> Result<Request, EtError> {
        let p = &frame.payload;
        let ids = |what: &'static str| -> Result<Vec<u32>, EtError> {
            let mut r = Reader::new(what, p);
            let n = r.count(4, "events").map_err(codec)?;
            let idx = (0..n).map(|_| r.u32("event")).collect::<Result<Vec<u32>, _>>().map_err(codec)?;
            r.finish().map_err(codec)?;
            Ok(idx)
        };
        Ok(match frame.kind {
            HELLO => Request::Hello,
            ATTACH => {
                let v: serde_json::Value = serde_json::from_slice(p).map_err(|e| EtError::Protocol(e.to_string()))?;
                let station =
                    v["station"].as_str().ok_or_else(|| EtError::Protocol("attach without a station".into()))?;
                Request::Attach { station: station.to_owned() }
            }
            DETACH => Request::Detach,
            NEW => {
                let mut r = Reader::new("NEW", p);
                let count = r.u32("count").map_err(codec)?;
                let size = r.u64("size").map_err(codec)?;
                let wait = decode_wait(&mut r)?;
                r.finish().map_err(codec)?;
                Request::New { count, size, wait }
            }
            GET => {
                let mut r = Reader::new("GET", p);
                let count = r.u32("count").map_err(codec)?;
                let wait = decode_wait(&mut r)?;
                r.finish().map_err(codec)?;
                Request::Get { count, wait }
            }
            PUT => Request::Put {
                events: decode_batch(p.clone(), max_events, || {
                    let f = next_frame()?;
                    if f.kind != DATA {
                        return Err(EtError::Protocol(format!("expected event data, got message {}", f.kind)));
                    }
                    Ok(f.payload)
                })?,
            },
            DUMP => Request::Dump { events: ids("dump")? },
            UNGET => Request::Unget { events: ids("unget")? },
            STATION => Request::Station(serde_json::from_slice(p).map_err(|e| EtError::Protocol(e.to_string()))?),
            STATUS => Request::Status,
            PING => Request::Ping,
            other => return Err(EtError::Protocol(format!("unknown request kind {other}"))),
        })
    }
}

/// The server's answers, as the client decodes them.
pub(crate) mod answer {
    use super::*;
    use daqflow_wire::frame::Frame;

    /// The error an `ERROR` answer carries.
    pub(crate) fn error(payload: &[u8]) -> EtError {
        serde_json::from_slice(payload).unwrap_or_else(|e| EtError::Protocol(e.to_string()))
    }

    /// The answer to `HELLO`.
    pub(crate) fn welcome(reply: &Frame) -> Result<Welcome, EtError> {
        if reply.kind != WELCOME {
            return Err(EtError::Protocol(format!("unexpected answer {} to hello", reply.kind)));
        }
        serde_json::from_slice(&reply.payload).map_err(|e| EtError::Protocol(e.to_string()))
    }

    /// The attachment id in the answer to `ATTACH`.
    pub(crate) fn attached(reply: &Frame) -> Result<u32, EtError> {
        let v: serde_json::Value =
            serde_json::from_slice(&reply.payload).map_err(|e| EtError::Protocol(e.to_string()))?;
        let id = v["attachment"].as_u64().ok_or_else(|| EtError::Protocol("attach answer without an id".into()))?;
        u32::try_from(id).map_err(|_| EtError::Protocol(format!("attachment id {id} out of range")))
    }

    /// An `EVENTS` answer (or `ERROR`): the batch, with the data of its large events from the
    /// `DATA` frames after it, which `next_frame` reads. `max_events` is the pool's size.
    pub(crate) fn events(
        reply: Frame,
        max_events: usize,
        mut next_frame: impl FnMut() -> Result<Frame, EtError>,
    ) -> Result<Vec<WireEvent>, EtError> {
        if reply.kind == ERROR {
            return Err(error(&reply.payload));
        }
        if reply.kind != EVENTS {
            return Err(EtError::Protocol(format!("unexpected answer {}", reply.kind)));
        }
        let events = decode_batch(reply.payload, max_events, || {
            let f = next_frame()?;
            if f.kind != DATA {
                return Err(EtError::Protocol(format!("expected event data, got message {}", f.kind)));
            }
            Ok(f.payload)
        })?;
        if let Some(e) = events.iter().find(|e| e.len > e.cap) {
            return Err(EtError::Protocol(format!("event {}: length {} exceeds its capacity {}", e.idx, e.len, e.cap)));
        }
        Ok(events)
    }
}

/// The largest event that travels over a remote connection: one frame's payload (the
/// connections accept frames up to 2 GiB − 1).
pub(crate) const MAX_REMOTE_EVENT: usize = (u32::MAX / 2) as usize;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// docs/et.md is what clients in other languages are written from: its message table and
    /// every other mention of a kind give the codes this module sends.
    #[test]
    fn the_guide_gives_every_message_its_kind() {
        let doc = include_str!("../../../../docs/et.md");
        let kinds = [
            ("HELLO", HELLO),
            ("WELCOME", WELCOME),
            ("ATTACH", ATTACH),
            ("ATTACHED", ATTACHED),
            ("DETACH", DETACH),
            ("NEW", NEW),
            ("EVENTS", EVENTS),
            ("GET", GET),
            ("PUT", PUT),
            ("DUMP", DUMP),
            ("STATION", STATION),
            ("STATUS", STATUS),
            ("SNAPSHOT", SNAPSHOT),
            ("PING", PING),
            ("DATA", DATA),
            ("UNGET", UNGET),
            ("OK", OK),
            ("ERROR", ERROR),
        ];
        for (name, kind) in kinds {
            let row = format!("| `0x{kind:04X}` | `{name}` |");
            assert!(doc.contains(&row), "docs/et.md has no row {row}");
        }
        // The batches section names the DATA frame's kind: the code, not the message number.
        assert!(doc.contains(&format!("a `DATA` frame (kind `0x{DATA:04X}`, channel = attachment)")));
        for (name, kind) in kinds {
            let number = kind - ET_REMOTE.at(0);
            assert!(!doc.contains(&format!("`{name}` frame (kind {number},")), "{name} given as kind {number}");
        }
    }

    /// Found while writing the client-side fuzz target (`fuzz/fuzz_targets/et_client.rs`): a
    /// server's answer with an event longer than its capacity made the client pad the event
    /// to that length (up to 4 GiB) when it was put back.
    #[test]
    fn a_client_refuses_an_event_longer_than_its_capacity() {
        use daqflow_wire::frame::Frame;
        let answer_of = |len: u32, cap: u32| {
            let mut out = BytesMut::new();
            begin_batch(&mut out, 1);
            put_event(&mut out, 0, len, cap, 0, [0; 4], DataMode::None);
            Frame::new(EVENTS, out.freeze())
        };
        let no_data = || -> Result<Frame, EtError> { Err(EtError::Protocol("no data".into())) };
        let ok = answer::events(answer_of(100, 100), 10, no_data).unwrap();
        assert_eq!((ok[0].len, ok[0].cap), (100, 100));
        let e = answer::events(answer_of(u32::MAX, 100), 10, no_data).unwrap_err();
        assert!(matches!(&e, EtError::Protocol(m) if m.contains("exceeds its capacity")), "{e}");
        // An attachment id is a u32 on the wire: a larger one is refused, not truncated.
        let attached = |id: u64| Frame::new(ATTACHED, Bytes::from(format!(r#"{{"attachment": {id}}}"#)));
        assert_eq!(answer::attached(&attached(7)).unwrap(), 7);
        assert!(matches!(answer::attached(&attached(1 << 32)), Err(EtError::Protocol(_))));
    }

    proptest! {
        #[test]
        fn batches_round_trip(events in proptest::collection::vec((any::<u32>(), any::<u8>(), any::<[i32; 4]>(), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..50)), any::<bool>()), 0..20)) {
            let mut out = BytesMut::new();
            let mut frames = std::collections::VecDeque::new();
            begin_batch(&mut out, events.len());
            for (idx, flags, control, data, in_frame) in &events {
                let len = data.as_ref().map_or(7, |d| d.len() as u32);
                let mode = match data {
                    None => DataMode::None,
                    Some(d) if *in_frame => {
                        frames.push_back(Bytes::from(d.clone()));
                        DataMode::Frame
                    }
                    Some(d) => DataMode::Inline(d),
                };
                put_event(&mut out, *idx, len, 100, flags & 7, *control, mode);
            }
            let back = decode_batch(out.freeze(), 1000, || frames.pop_front().ok_or_else(|| EtError::Protocol("no frame".into()))).unwrap();
            prop_assert!(frames.is_empty());
            prop_assert_eq!(back.len(), events.len());
            for (w, (idx, flags, control, data, _)) in back.iter().zip(&events) {
                prop_assert_eq!(w.idx, *idx);
                prop_assert_eq!(w.flags, flags & 7);
                prop_assert_eq!(w.control, *control);
                prop_assert_eq!(w.data.as_deref(), data.as_deref());
            }
        }

        #[test]
        fn random_batches_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200), frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4)) {
            let mut frames: std::collections::VecDeque<Bytes> = frames.into_iter().map(Bytes::from).collect();
            let _ = decode_batch(Bytes::from(data), 100, || frames.pop_front().ok_or_else(|| EtError::Protocol("no frame".into())));
        }
    }
}
