//! The remote-access server in the ET process: one thread per client connection, serving the
//! attachment API with events copied over TCP in batches.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use daqflow_transport::{Connection, ConnectionOptions, Listener};
use daqflow_wire::frame::{Frame, FrameLimits};

use super::protocol::*;
use crate::config::{SystemConfig, Wait};
use crate::error::EtError;
use crate::local::LocalAttachment;
use crate::pool::{FLAG_CORRUPT, FLAG_TEMP, Layout};
use crate::system::{Holder, InProcess, SystemInner};

/// The remote protocol's name in the transport's handshake (`docs/security.md`).
pub(crate) const PROTOCOL: &str = "et";

/// A client's connection options: it takes any frame the protocol allows from its server.
pub(crate) fn client_options() -> ConnectionOptions {
    ConnectionOptions { max_frame_bytes: MAX_REMOTE_EVENT as u32, ..ConnectionOptions::for_protocol(PROTOCOL) }
}

/// What a client may send once it said HELLO: `PUT` batches and `DATA` frames up to
/// [`max_frame`], every other request small (its JSON or its ids).
fn admitted_limits(config: &SystemConfig, layout: &Layout) -> FrameLimits {
    let max = max_frame(config, layout) as u32;
    FrameLimits::uniform(64 << 10).with_kind(PUT, max).with_kind(DATA, max)
}

/// The largest frame a client may send to the system: the data of its largest event (the
/// capacity of a temporary buffer of `max_event_bytes`, or the pool's event size), or a `PUT` of
/// the whole pool with data inline, whichever is larger. A client announcing a longer frame is
/// disconnected before any memory is reserved for it.
pub(crate) fn max_frame(config: &SystemConfig, layout: &Layout) -> usize {
    let event = config.max_event_bytes.max(layout.event_size).saturating_add(4095) / 4096 * 4096;
    let batch = (layout.events as usize).saturating_mul(WIRE_HEADER + INLINE_MAX).saturating_add(4);
    event.max(batch).clamp(64 << 10, MAX_REMOTE_EVENT)
}

pub(crate) fn bind(addr: SocketAddr, config: &SystemConfig, layout: &Layout) -> Result<Listener, EtError> {
    let options = ConnectionOptions {
        max_frame_bytes: max_frame(config, layout) as u32,
        ..ConnectionOptions::for_protocol(PROTOCOL)
    };
    Listener::bind(addr, options).map_err(|e| EtError::io(format!("listening for remote clients on {addr}"), e))
}

pub(crate) fn serve(system: Weak<SystemInner>, listener: Listener) {
    loop {
        let Some(s) = system.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        drop(s);
        match listener.accept_timeout(Duration::from_millis(200)) {
            Ok(Some(conn)) => {
                let w = system.clone();
                let _ = std::thread::Builder::new().name("et-remote-client".into()).spawn(move || serve_conn(w, conn));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "accepting a remote client failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn error_frame(e: &EtError) -> Frame {
    Frame::new(ERROR, Bytes::from(serde_json::to_vec(e).unwrap_or_default()))
}

fn json_frame(kind: u16, v: &impl serde::Serialize) -> Frame {
    Frame::new(kind, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

/// A server-side wait never exceeds `MAX_SERVER_WAIT_MS`; the client repeats.
fn server_wait(w: Wait) -> Wait {
    let max = Duration::from_millis(MAX_SERVER_WAIT_MS);
    match w {
        Wait::NoWait => Wait::NoWait,
        Wait::Sleep => Wait::Timed(max),
        Wait::Timed(d) => Wait::Timed(d.min(max)),
    }
}

fn serve_conn(system: Weak<SystemInner>, mut conn: Connection) {
    let peer = conn.peer_addr();
    let Some(id) = system.upgrade().map(|s| s.next_conn.fetch_add(1, Ordering::Relaxed)) else { return };
    let mut atts: HashMap<u32, LocalAttachment> = HashMap::new();
    let mut next: Option<Frame> = None;
    let mut extra = Vec::new();
    let mut said_hello = false;
    loop {
        let frame = match next.take() {
            Some(f) => f,
            None => match conn.recv_timeout(Duration::from_millis(500)) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    if system.upgrade().is_none_or(|s| s.stop.load(Ordering::Acquire)) {
                        break;
                    }
                    continue;
                }
                Err(e) => {
                    if !e.is_clean_close() {
                        tracing::debug!(%peer, error = %e, "remote client connection ended");
                    }
                    break;
                }
            },
        };
        let Some(s) = system.upgrade() else { break };
        for a in atts.values() {
            a.beat();
        }
        extra.clear();
        if !said_hello {
            // The first request must be HELLO: until then the connection takes small frames
            // only, and nothing else is served.
            if frame.kind != HELLO {
                tracing::warn!(%peer, kind = frame.kind, "closing a remote client's connection: a request before HELLO");
                let e = EtError::Protocol(format!("request kind {} before HELLO", frame.kind));
                let _ = conn.send(error_frame(&e));
                let _ = conn.close();
                break;
            }
            said_hello = true;
            conn.set_frame_limits(admitted_limits(&s.config, &s.pool.layout));
        }
        let (reply, fatal) = match handle(&s, id, &mut atts, frame, &mut conn, &mut extra) {
            Ok(f) => (f, false),
            Err(e) => {
                extra.clear();
                // A malformed message leaves the stream in an unknown state: answer and close.
                let fatal = matches!(e, EtError::Protocol(_));
                if fatal {
                    tracing::warn!(%peer, error = %e, "closing a remote client's connection");
                }
                (error_frame(&e), fatal)
            }
        };
        if conn.send(reply).is_err() || extra.drain(..).any(|f| conn.send(f).is_err()) {
            break;
        }
        if fatal {
            let _ = conn.close();
            break;
        }
        // Answer pipelined requests before flushing: their answers travel together.
        match conn.try_recv() {
            Ok(Some(f)) => next = Some(f),
            Ok(None) => {
                if conn.flush().is_err() {
                    break;
                }
            }
            Err(_) => {
                let _ = conn.flush();
                break;
            }
        }
    }
    // The connection goes first: its send queue may still refer to events' memory.
    drop(extra);
    drop(conn);
    // A client that leaves without detaching died: its events come back, possibly corrupt.
    if let Some(s) = system.upgrade() {
        for (_, att) in atts.drain() {
            att.end_dead(&s);
        }
    }
}

/// Event data sent straight from the pool (no copy): keeps the system, and so its memory,
/// alive while the transport holds it.
struct PoolBytes {
    _system: Arc<SystemInner>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes belong to an event the remote attachment holds until its client puts it
// back, which it can only do after receiving them; nothing writes them meanwhile, and the
// mapping outlives this value (it holds the system).
unsafe impl Send for PoolBytes {}

impl AsRef<[u8]> for PoolBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl: `len` bytes at `ptr` stay mapped and unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

fn att(atts: &HashMap<u32, LocalAttachment>, id: u32) -> Result<&LocalAttachment, EtError> {
    atts.get(&id).ok_or_else(|| EtError::Protocol(format!("no attachment {id} on this connection")))
}

/// Handles one request: its answer, and DATA frames to send after it in `extra`. A PUT's DATA
/// frames are read from `conn`.
fn handle(
    s: &Arc<SystemInner>,
    conn_id: u64,
    atts: &mut HashMap<u32, LocalAttachment>,
    frame: Frame,
    conn: &mut Connection,
    extra: &mut Vec<Frame>,
) -> Result<Frame, EtError> {
    let request =
        Request::decode(&frame, s.pool.layout.events as usize, || match conn.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(f)) => Ok(f),
            _ => Err(EtError::Protocol("the event data did not come".into())),
        })?;
    match request {
        Request::Hello => Ok(json_frame(
            WELCOME,
            &Welcome {
                name: s.config.name.clone(),
                events: s.pool.layout.events,
                event_size: s.pool.layout.event_size,
            },
        )),
        Request::Attach { station } => {
            let (id, slot, _) = s.attach(&station, Holder::Remote { conn: conn_id })?;
            atts.insert(id, LocalAttachment::new(Arc::new(InProcess { system: s.clone() }), id, slot, station));
            Ok(json_frame(ATTACHED, &serde_json::json!({ "attachment": id })))
        }
        Request::Detach => {
            atts.remove(&frame.channel);
            Ok(Frame::new(OK, Bytes::new()))
        }
        Request::New { count, size, wait } => fetch(s, atts, frame.channel, count, Some(size), wait, extra),
        Request::Get { count, wait } => fetch(s, atts, frame.channel, count, None, wait, extra),
        Request::Put { events } => {
            let a = att(atts, frame.channel)?;
            let idx: Vec<u32> = events.iter().map(|e| e.idx).collect();
            a.check_held(&idx)?;
            for e in &events {
                let (ptr, cap) = a.raw_data(e.idx);
                if e.len as usize > cap {
                    return Err(EtError::Refused(format!(
                        "event {}: length {} exceeds its capacity {cap}",
                        e.idx, e.len
                    )));
                }
                if let Some(d) = &e.data {
                    // SAFETY: held by this attachment (checked), so no one else touches its
                    // `cap` bytes while this slice lives.
                    let dst = unsafe { std::slice::from_raw_parts_mut(ptr, cap) };
                    crate::copy::copy_into(dst, &d[..d.len().min(cap)]);
                }
                // SAFETY: held by this attachment (checked).
                unsafe { &mut *s.pool.desc(e.idx) }.set_header(e.len, e.control, u8::from(e.flags & EV_HIGH != 0));
            }
            a.raw_put(&idx)?;
            Ok(Frame::new(OK, Bytes::new()))
        }
        Request::Dump { events } => {
            att(atts, frame.channel)?.raw_dump(&events)?;
            Ok(Frame::new(OK, Bytes::new()))
        }
        Request::Unget { events } => {
            att(atts, frame.channel)?.raw_unget(&events)?;
            Ok(Frame::new(OK, Bytes::new()))
        }
        Request::Station(op) => {
            match op {
                StationOp::Create { name, config, position } => {
                    s.create_station(&name, config, position).map(|_| ())?
                }
                StationOp::Remove { name } => s.remove_station(&name)?,
                StationOp::Configure { name, config } => s.configure_station(&name, config)?,
            }
            Ok(Frame::new(OK, Bytes::new()))
        }
        Request::Status => Ok(json_frame(SNAPSHOT, &s.snapshot())),
        Request::Ping => Ok(Frame::new(OK, Bytes::new())),
    }
}

/// Serves a NEW (`size` given) or a GET on attachment `channel`: the `EVENTS` answer, and the
/// DATA frames of its large events in `extra`.
fn fetch(
    s: &Arc<SystemInner>,
    atts: &HashMap<u32, LocalAttachment>,
    channel: u32,
    count: u32,
    size: Option<u64>,
    wait: Wait,
    extra: &mut Vec<Frame>,
) -> Result<Frame, EtError> {
    // Up to `count` events, at most the pool's size; 0 is served as 1 (`docs/et.md`).
    let n = (count as usize).clamp(1, (s.pool.layout.events as usize).max(1));
    if size.is_some_and(|size| size > MAX_REMOTE_EVENT as u64) {
        return Err(EtError::Refused(format!("events larger than {MAX_REMOTE_EVENT} bytes cannot travel remotely")));
    }
    let wait = server_wait(wait);
    let a = att(atts, channel)?;
    let mut idx = Vec::with_capacity(n);
    let got = match size {
        Some(size) => a.raw_new(n, size as usize, wait, &mut idx),
        None => a.raw_get(n, wait, &mut idx),
    };
    match got {
        Ok(_) | Err(EtError::Timeout) => {}
        Err(e) => return Err(e),
    }
    let pool = &s.pool;
    let mut out = BytesMut::with_capacity(4 + idx.len() * WIRE_HEADER);
    begin_batch(&mut out, idx.len());
    for &i in &idx {
        // SAFETY: the attachment holds the event (just taken).
        let d = unsafe { *pool.desc(i) };
        let (ptr, cap) = a.raw_data(i);
        let mut flags = 0u8;
        if d.flags & FLAG_CORRUPT != 0 {
            flags |= EV_CORRUPT;
        }
        if d.flags & FLAG_TEMP != 0 {
            flags |= EV_LARGE;
        }
        if d.priority == 1 {
            flags |= EV_HIGH;
        }
        let len = (d.len as usize).min(cap);
        let data = if size.is_some() {
            DataMode::None
        } else if len < INLINE_MAX {
            // SAFETY: the attachment holds the event; its buffer has `cap >= len` bytes.
            DataMode::Inline(unsafe { std::slice::from_raw_parts(ptr, len) })
        } else {
            let bytes = Bytes::from_owner(PoolBytes { _system: s.clone(), ptr, len });
            extra.push(Frame::new(DATA, bytes).with_channel(channel));
            DataMode::Frame
        };
        put_event(&mut out, i, len as u32, cap.min(u32::MAX as usize) as u32, flags, d.control, data);
    }
    Ok(Frame::new(EVENTS, out.freeze()).with_channel(channel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EtSystem, SystemConfig};

    #[test]
    fn a_new_or_get_for_zero_events_is_served_one() {
        use crate::{Attachment, Position, StationConfig, Wait};
        let mut c = SystemConfig::new(format!("count0-{}", std::process::id()), 10, 1024);
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        let system = EtSystem::create(c).unwrap();
        system.create_station("mon", StationConfig::default(), Position::End).unwrap();
        let addr = system.remote_addr().unwrap();
        // A connection after HELLO, as a function that sends a request and returns its answer.
        let connect = || {
            let mut conn = Connection::connect(addr, &client_options()).unwrap();
            let mut ask = move |f: Frame| {
                conn.send(f).unwrap();
                let _ = conn.flush();
                conn.recv_timeout(Duration::from_secs(10)).unwrap().expect("an answer")
            };
            assert_eq!(ask(Frame::new(HELLO, Bytes::from_static(b"{}"))).kind, WELCOME);
            ask
        };
        let mut ask = connect();
        let attach = |ask: &mut dyn FnMut(Frame) -> Frame, station: &str| -> u32 {
            let a = ask(Frame::new(ATTACH, Bytes::from(format!(r#"{{"station": "{station}"}}"#))));
            assert_eq!(a.kind, ATTACHED, "{:?}", a.payload);
            serde_json::from_slice::<serde_json::Value>(&a.payload).unwrap()["attachment"].as_u64().unwrap() as u32
        };
        let count_of = |f: &Frame| {
            assert_eq!(f.kind, EVENTS, "{:?}", f.payload);
            u32::from_le_bytes(f.payload[..4].try_into().unwrap())
        };
        // NEW: u32 count, u64 size, u64 wait (20 bytes).
        let producer = attach(&mut ask, "GRAND_CENTRAL");
        let mut new = Vec::new();
        new.extend_from_slice(&0u32.to_le_bytes());
        new.extend_from_slice(&100u64.to_le_bytes());
        new.extend_from_slice(&0u64.to_le_bytes());
        assert_eq!(new.len(), 20);
        assert_eq!(count_of(&ask(Frame::new(NEW, Bytes::from(new)).with_channel(producer))), 1, "NEW 0 is served as 1");
        // A 12-byte NEW (no wait) does not decode.
        let short = [0u8; 12];
        assert_eq!(ask(Frame::new(NEW, Bytes::copy_from_slice(&short)).with_channel(producer)).kind, ERROR);

        // GET: u32 count, u64 wait (12 bytes), with events waiting in the station (which has
        // an attachment, so that events stop there).
        let mut ask = connect();
        let consumer = attach(&mut ask, "mon");
        let local = system.attach("GRAND_CENTRAL").unwrap();
        let mut events = local.new_events(3, 10, Wait::NoWait).unwrap();
        assert_eq!(events.len(), 3);
        local.put_events(&mut events).unwrap();
        let mut get = Vec::new();
        get.extend_from_slice(&0u32.to_le_bytes());
        get.extend_from_slice(&5000u64.to_le_bytes());
        assert_eq!(get.len(), 12);
        assert_eq!(count_of(&ask(Frame::new(GET, Bytes::from(get)).with_channel(consumer))), 1, "GET 0 is served as 1");
    }

    #[test]
    fn the_largest_frame_a_client_may_send_follows_the_limits() {
        let c = SystemConfig::new("frames", 3000, 65536);
        assert_eq!(max_frame(&c, &Layout::new(3000, 65536, 32, 128)), 64 << 20, "the default largest event");
        let mut c = SystemConfig::new("frames", 3000, 1024);
        c.max_event_bytes = 100_000;
        assert_eq!(max_frame(&c, &Layout::new(3000, 1024, 32, 128)), 3000 * (WIRE_HEADER + INLINE_MAX) + 4, "a put");
        assert_eq!(max_frame(&c, &Layout::new(10, 1024, 32, 128)), 102_400, "a large event's capacity");
        c.max_event_bytes = usize::MAX;
        assert_eq!(max_frame(&c, &Layout::new(10, 1024, 32, 128)), MAX_REMOTE_EVENT);
    }

    #[test]
    fn a_client_may_send_large_frames_only_of_the_kinds_that_carry_events_and_only_after_hello() {
        let mut c = SystemConfig::new(format!("frames-{}", std::process::id()), 10, 1024);
        c.max_event_bytes = 100_000;
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        let system = EtSystem::create(c).unwrap();
        let addr = system.remote_addr().unwrap();
        let connect = || Connection::connect(addr, &client_options()).unwrap();
        let ask = |conn: &mut Connection, f: Frame| {
            conn.send(f).unwrap();
            let _ = conn.flush();
            conn.recv_timeout(Duration::from_secs(10))
        };
        let hello = || Frame::new(HELLO, Bytes::from_static(b"{}"));
        // Nothing before HELLO.
        let mut conn = connect();
        let answer = ask(&mut conn, Frame::new(PING, Bytes::new())).unwrap().expect("an answer");
        assert_eq!(answer.kind, ERROR);
        assert!(conn.recv_timeout(Duration::from_secs(10)).is_err(), "disconnected");
        // After HELLO: small requests, …
        let mut conn = connect();
        assert_eq!(ask(&mut conn, hello()).unwrap().unwrap().kind, WELCOME);
        assert_eq!(ask(&mut conn, Frame::new(PING, Bytes::from(vec![0u8; 64 << 10]))).unwrap().unwrap().kind, OK);
        // … one byte more closes the connection, unanswered.
        assert!(ask(&mut conn, Frame::new(PING, Bytes::from(vec![0u8; (64 << 10) + 1]))).is_err(), "disconnected");
        // Event data up to the largest event is read (this one is no valid PUT, so it is
        // answered with an error); one byte more is refused from its header.
        let mut conn = connect();
        assert_eq!(ask(&mut conn, hello()).unwrap().unwrap().kind, WELCOME);
        let answer =
            ask(&mut conn, Frame::new(PUT, Bytes::from(vec![0u8; 102_400]))).unwrap().expect("read and answered");
        assert_eq!(answer.kind, ERROR);
        let mut conn = connect();
        assert_eq!(ask(&mut conn, hello()).unwrap().unwrap().kind, WELCOME);
        assert!(ask(&mut conn, Frame::new(PUT, Bytes::from(vec![0u8; 102_401]))).is_err(), "disconnected");
    }
}
