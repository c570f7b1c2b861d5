//! Entry points for the fuzz targets in `fuzz/` and for tests that feed the remote protocol's
//! decoders hostile input: not part of the API (hidden from the documentation), no stability
//! promised. Each function decodes a sequence of frames as one end of a connection receives
//! them, with the code that end runs, and never touches a system or a socket.

use bytes::{Bytes, BytesMut};
use daqflow_wire::frame::Frame;

use super::protocol::*;
use crate::error::EtError;
use crate::monitor::Snapshot;

/// Decodes `frames` as the server decodes a client's requests, with a pool of `max_events`
/// events: each request in turn (a `PUT` takes its `DATA` frames from the ones after it) until
/// one does not decode, which ends the connection. Returns how many requests decoded, or the
/// error that would close the connection.
///
/// # Panics
/// If a decoded `PUT` batch does not decode to the same events once encoded again.
pub fn server_requests(frames: &[Frame], max_events: usize) -> Result<usize, EtError> {
    let mut frames = frames.iter().cloned();
    let mut n = 0;
    while let Some(frame) = frames.next() {
        let request = Request::decode(&frame, max_events, || {
            frames.next().ok_or_else(|| EtError::Protocol("the event data did not come".into()))
        })?;
        if let Request::Put { events } = request {
            assert_eq!(reencode(&events, max_events), events, "a PUT batch round-trips");
        }
        n += 1;
    }
    Ok(n)
}

/// Decodes `frames` as the client decodes the answers of its server, which has `max_events`
/// events in its pool: each answer by its kind (an `EVENTS` batch takes its `DATA` frames from
/// the ones after it). Returns how many answers decoded, or the first error.
pub fn client_answers(frames: &[Frame], max_events: usize) -> Result<usize, EtError> {
    let mut frames = frames.iter().cloned();
    let mut n = 0;
    while let Some(frame) = frames.next() {
        match frame.kind {
            WELCOME => {
                answer::welcome(&frame)?;
            }
            ATTACHED => {
                answer::attached(&frame)?;
            }
            SNAPSHOT => {
                serde_json::from_slice::<Snapshot>(&frame.payload).map_err(|e| EtError::Protocol(e.to_string()))?;
            }
            ERROR => {
                let _ = answer::error(&frame.payload);
            }
            OK => {}
            _ => {
                let events = answer::events(frame, max_events, || {
                    frames.next().ok_or_else(|| EtError::Protocol("the event data did not come".into()))
                })?;
                for e in &events {
                    assert!(e.len <= e.cap, "an event the client accepted is longer than its capacity");
                    if let Some(d) = &e.data {
                        assert_eq!(d.len(), e.len as usize, "an event's data is its length");
                    }
                }
            }
        }
        n += 1;
    }
    Ok(n)
}

/// `events` encoded as a batch (data inline) and decoded again.
fn reencode(events: &[WireEvent], max_events: usize) -> Vec<WireEvent> {
    let mut out = BytesMut::new();
    begin_batch(&mut out, events.len());
    for e in events {
        let data = match &e.data {
            Some(d) => DataMode::Inline(d),
            None => DataMode::None,
        };
        put_event(&mut out, e.idx, e.len, e.cap, e.flags, e.control, data);
    }
    decode_batch(out.freeze(), max_events, || Ok(Bytes::new())).expect("an encoded batch decodes")
}

/// The frame kinds of the remote protocol, for seed corpora: `(name, kind)`.
pub fn kinds() -> Vec<(&'static str, u16)> {
    vec![
        ("hello", HELLO),
        ("welcome", WELCOME),
        ("attach", ATTACH),
        ("attached", ATTACHED),
        ("detach", DETACH),
        ("new", NEW),
        ("events", EVENTS),
        ("get", GET),
        ("put", PUT),
        ("dump", DUMP),
        ("station", STATION),
        ("status", STATUS),
        ("snapshot", SNAPSHOT),
        ("ping", PING),
        ("data", DATA),
        ("unget", UNGET),
        ("ok", OK),
        ("error", ERROR),
    ]
}

/// A batch of `events` (index, length, data inline or in a `DATA` frame of its own): the frame
/// and the `DATA` frames after it, as the protocol's encoders make them.
fn batch(kind: u16, events: &[(u32, &[u8], bool)]) -> Vec<Frame> {
    let mut out = BytesMut::new();
    let mut data = Vec::new();
    begin_batch(&mut out, events.len());
    for &(idx, d, in_frame) in events {
        let mode = if in_frame {
            data.push(Frame::new(DATA, Bytes::copy_from_slice(d)).with_channel(1));
            DataMode::Frame
        } else {
            DataMode::Inline(d)
        };
        put_event(&mut out, idx, d.len() as u32, 4096, EV_HIGH, [1, 2, 3, 4], mode);
    }
    let mut frames = vec![Frame::new(kind, out.freeze()).with_channel(1)];
    frames.append(&mut data);
    frames
}

fn json(kind: u16, v: &impl serde::Serialize) -> Frame {
    Frame::new(kind, Bytes::from(serde_json::to_vec(v).expect("serializable")))
}

/// Valid request sequences, as a client sends them: seeds for a fuzzer of
/// [`server_requests`].
pub fn seed_requests() -> Vec<Vec<Frame>> {
    use crate::config::{Position, Selection, StationConfig, Wait};
    let fetch = |kind: u16, size: Option<u64>, wait: Wait| {
        let mut b = BytesMut::new();
        bytes::BufMut::put_u32_le(&mut b, 10);
        if let Some(size) = size {
            bytes::BufMut::put_u64_le(&mut b, size);
        }
        encode_wait(wait, &mut b);
        Frame::new(kind, b.freeze()).with_channel(1)
    };
    let ids = |kind: u16| {
        let mut b = BytesMut::new();
        for v in [2u32, 3, 5] {
            bytes::BufMut::put_u32_le(&mut b, v);
        }
        Frame::new(kind, b.freeze()).with_channel(1)
    };
    let config = StationConfig { selection: Selection::Match([Some(1), None, None, None]), ..Default::default() };
    let hello = json(HELLO, &serde_json::json!({ "pid": 1 }));
    let attach = json(ATTACH, &serde_json::json!({ "station": "mon" }));
    let big = vec![7u8; INLINE_MAX];
    let mut put = vec![hello.clone(), attach.clone()];
    put.extend(batch(PUT, &[(0, b"abc", false), (1, &big, true), (2, b"", false)]));
    vec![
        vec![hello.clone(), attach.clone(), fetch(NEW, Some(100), Wait::NoWait), fetch(GET, None, Wait::Sleep)],
        put,
        vec![hello.clone(), attach, ids(DUMP), ids(UNGET), Frame::new(DETACH, Bytes::new()).with_channel(1)],
        vec![
            hello,
            json(STATION, &StationOp::Create { name: "mon".into(), config: config.clone(), position: Position::End }),
            json(STATION, &StationOp::Configure { name: "mon".into(), config }),
            json(STATION, &StationOp::Remove { name: "mon".into() }),
            Frame::new(STATUS, Bytes::new()),
            Frame::new(PING, Bytes::new()),
        ],
    ]
}

/// Valid answer sequences, as a server sends them (with `snapshot` for a `STATUS`): seeds for a
/// fuzzer of [`client_answers`].
pub fn seed_answers(snapshot: &Snapshot) -> Vec<Vec<Frame>> {
    let welcome = json(WELCOME, &Welcome { name: "fuzz".into(), events: 10, event_size: 1024 });
    let attached = json(ATTACHED, &serde_json::json!({ "attachment": 1 }));
    let big = vec![9u8; INLINE_MAX + 1];
    let mut events = vec![welcome.clone(), attached.clone()];
    events.extend(batch(EVENTS, &[(0, b"event", false), (1, &big, true)]));
    events.push(Frame::new(OK, Bytes::new()));
    vec![
        events,
        vec![
            welcome,
            attached,
            json(SNAPSHOT, snapshot),
            json(ERROR, &EtError::Refused("no such station".into())),
            Frame::new(EVENTS, Bytes::from_static(&[0, 0, 0, 0])),
        ],
    ]
}
