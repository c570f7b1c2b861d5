//! The remote client: the attachment API over TCP to an ET system on another host (or this one).

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_transport::{Connection, RetryPolicy};
use daqflow_wire::frame::Frame;

use super::protocol::*;
use crate::config::{Position, Priority, StationConfig, Wait};
use crate::error::EtError;
use crate::event::{Attachment, Data, Event};
use crate::monitor::Snapshot;

/// An answer the server still owes, in the order the requests went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// A pipelined PUT, DUMP or UNGET: `OK` or `ERROR`.
    Ack,
    /// A prefetch GET of this attachment: a batch kept for its next `get_events`.
    Batch(u32),
}

/// An attachment's prefetched batch.
#[derive(Debug, Default)]
struct Prefetch {
    /// A GET was sent ahead and its answer not read yet.
    in_flight: bool,
    /// Events read ahead and not handed to the user yet.
    events: VecDeque<WireEvent>,
    /// The prefetch's error, for the next `get_events`.
    error: Option<EtError>,
}

/// The connection and what is in flight on it.
struct Link {
    conn: Connection,
    /// Answers due, in order: puts are pipelined (a put returns once sent, and its answer is
    /// read before the next call's), and a consumer's next GET goes out ahead of time.
    due: VecDeque<Due>,
    /// The first error a pipelined put's answer carried; the next call returns it.
    deferred: Option<EtError>,
    /// Per attachment: the batch read ahead.
    prefetch: HashMap<u32, Prefetch>,
}

pub(crate) struct RemoteInner {
    link: Mutex<Link>,
    addr: SocketAddr,
    name: String,
    events: u32,
    event_size: usize,
    dead: AtomicBool,
}

/// The server answers every request within its wait cap; allow generously for load.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

impl RemoteInner {
    fn dead(&self) -> EtError {
        self.dead.store(true, Ordering::Release);
        EtError::SystemDead(self.name.clone())
    }

    /// The link, once the error a pipelined put left (if any) is reported.
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Link>, EtError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(EtError::SystemDead(self.name.clone()));
        }
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        match link.deferred.take() {
            Some(e) => Err(e),
            None => Ok(link),
        }
    }

    fn send(&self, link: &mut Link, frames: Vec<Frame>) -> Result<(), EtError> {
        for f in frames {
            link.conn.send(f).map_err(|_| self.dead())?;
        }
        link.conn.flush().map_err(|_| self.dead())
    }

    fn recv(&self, link: &mut Link) -> Result<Frame, EtError> {
        match link.conn.recv_timeout(Duration::from_millis(MAX_SERVER_WAIT_MS) + ANSWER_TIMEOUT) {
            Ok(Some(f)) => Ok(f),
            _ => Err(self.dead()),
        }
    }

    /// An `EVENTS` answer: the batch and the DATA frames of its large events.
    fn read_batch(&self, link: &mut Link, reply: Frame) -> Result<Vec<WireEvent>, EtError> {
        answer::events(reply, self.events as usize, || self.recv(link))
    }

    /// Reads every answer still due: pipelined acknowledgements (the first error is kept) and
    /// prefetched batches (kept for their attachments).
    fn settle(&self, link: &mut Link) -> Result<(), EtError> {
        while let Some(due) = link.due.front().copied() {
            let answer = self.recv(link)?;
            link.due.pop_front();
            match due {
                Due::Ack => {
                    if answer.kind == ERROR && link.deferred.is_none() {
                        link.deferred = Some(answer::error(&answer.payload));
                    }
                }
                Due::Batch(att) => {
                    let got = self.read_batch(link, answer);
                    let p = link.prefetch.entry(att).or_default();
                    p.in_flight = false;
                    match got {
                        Ok(events) => p.events.extend(events),
                        Err(e @ EtError::Protocol(_)) => return Err(e),
                        Err(e) => p.error = Some(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends a request, reads the answers due before it, then its own answer.
    fn exchange(&self, link: &mut Link, frames: Vec<Frame>) -> Result<Frame, EtError> {
        self.send(link, frames)?;
        if let Err(e) = self.settle(link) {
            return Err(link.deferred.take().unwrap_or(e));
        }
        let reply = match self.recv(link) {
            Ok(r) => r,
            // A put the server refused before closing the connection says more than "gone".
            Err(e) => return Err(link.deferred.take().unwrap_or(e)),
        };
        if reply.kind == ERROR {
            return Err(answer::error(&reply.payload));
        }
        Ok(reply)
    }

    fn request(&self, frame: Frame) -> Result<Frame, EtError> {
        let mut link = self.lock()?;
        self.exchange(&mut link, vec![frame])
    }

    /// A NEW or GET request: the batch, and the DATA frames of its large events.
    fn request_events(&self, frame: Frame) -> Result<Vec<WireEvent>, EtError> {
        let mut link = self.lock()?;
        let reply = self.exchange(&mut link, vec![frame])?;
        self.read_batch(&mut link, reply)
    }

    /// Sends a PUT, DUMP or UNGET (with its DATA frames) without waiting for the answer.
    fn post(&self, frames: Vec<Frame>) -> Result<(), EtError> {
        let mut link = self.lock()?;
        self.post_locked(&mut link, frames)
    }

    fn post_locked(&self, link: &mut Link, frames: Vec<Frame>) -> Result<(), EtError> {
        self.send(link, frames)?;
        link.due.push_back(Due::Ack);
        Ok(())
    }
}

/// A connection to an ET system over TCP. Attachments made through it have the same API as
/// local ones; events are copied over the network in batches.
#[derive(Clone)]
pub struct RemoteClient {
    inner: Arc<RemoteInner>,
}

impl std::fmt::Debug for RemoteClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteClient").field("system", &self.inner.name).field("addr", &self.inner.addr).finish()
    }
}

impl RemoteClient {
    /// Connects to the ET system serving remote clients at `addr`.
    pub fn connect(addr: SocketAddr) -> Result<RemoteClient, EtError> {
        let mut conn = Connection::connect_with_retry(
            &[addr],
            &super::server::client_options(),
            &RetryPolicy::for_duration(Duration::from_secs(2)),
        )
        .map_err(|e| EtError::io(format!("connecting to the ET system at {addr}"), e))?;
        let hello = serde_json::json!({ "pid": std::process::id() });
        conn.send(Frame::new(HELLO, Bytes::from(hello.to_string()))).map_err(|e| EtError::io("hello", e))?;
        conn.flush().map_err(|e| EtError::io("hello", e))?;
        let reply = conn
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| EtError::io("hello", e))?
            .ok_or_else(|| EtError::Protocol("no answer to hello".into()))?;
        let w = answer::welcome(&reply)?;
        let inner = Arc::new(RemoteInner {
            link: Mutex::new(Link { conn, due: VecDeque::new(), deferred: None, prefetch: HashMap::new() }),
            addr,
            name: w.name,
            events: w.events,
            event_size: w.event_size,
            dead: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("et-remote-ping".into())
            .spawn(move || ping(weak))
            .map_err(|e| EtError::io("starting the ping thread", e))?;
        Ok(RemoteClient { inner })
    }

    /// Finds ET system `name` by UDP discovery on `port` and connects to it.
    pub fn discover(name: &str, port: u16, timeout: Duration) -> Result<RemoteClient, EtError> {
        let addr = super::discovery::discover(name, port, timeout, &super::discovery::default_targets())?;
        Self::connect(addr)
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Events in the system's pool, and their size.
    pub fn pool(&self) -> (u32, usize) {
        (self.inner.events, self.inner.event_size)
    }

    /// Attaches to a station.
    pub fn attach(&self, station: &str) -> Result<RemoteAttachment, EtError> {
        let body = serde_json::json!({ "station": station });
        let reply = self.inner.request(Frame::new(ATTACH, Bytes::from(body.to_string())))?;
        let att = answer::attached(&reply)?;
        Ok(RemoteAttachment {
            inner: self.inner.clone(),
            att,
            station: station.to_owned(),
            prefetch: AtomicBool::new(true),
        })
    }

    fn station_op(&self, op: StationOp) -> Result<(), EtError> {
        let body = serde_json::to_vec(&op).map_err(|e| EtError::Protocol(e.to_string()))?;
        self.inner.request(Frame::new(STATION, Bytes::from(body))).map(|_| ())
    }

    /// Creates a station.
    pub fn create_station(&self, name: &str, config: StationConfig, position: Position) -> Result<(), EtError> {
        if matches!(config.selection, crate::Selection::Closure(_)) {
            return Err(EtError::Refused(
                "a closure selection needs the station to be created in the ET system's process".into(),
            ));
        }
        self.station_op(StationOp::Create { name: name.into(), config, position })
    }

    /// Removes a station without attachments.
    pub fn remove_station(&self, name: &str) -> Result<(), EtError> {
        self.station_op(StationOp::Remove { name: name.into() })
    }

    /// Changes a station's configuration.
    pub fn configure_station(&self, name: &str, config: StationConfig) -> Result<(), EtError> {
        self.station_op(StationOp::Configure { name: name.into(), config })
    }

    /// The system's state now.
    pub fn snapshot(&self) -> Result<Snapshot, EtError> {
        let reply = self.inner.request(Frame::new(STATUS, Bytes::new()))?;
        serde_json::from_slice(&reply.payload).map_err(|e| EtError::Protocol(e.to_string()))
    }

    /// Whether the system (or the connection to it) is gone.
    pub fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }
}

/// Keeps the attachments of an idle client alive on the server.
fn ping(client: Weak<RemoteInner>) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let Some(c) = client.upgrade() else { return };
        if c.dead.load(Ordering::Acquire) {
            return;
        }
        // A request under way is a heartbeat already.
        if let Ok(mut link) = c.link.try_lock()
            && c.exchange(&mut link, vec![Frame::new(PING, Bytes::new())]).is_err()
            && c.dead.load(Ordering::Acquire)
        {
            return;
        }
    }
}

/// An attachment to a station of a remote ET system.
///
/// A consumer's `get_events` that returns a full batch sends the request for the next batch
/// (same count, no wait) before it returns, so that the next call usually finds its events
/// already here instead of paying a round trip. Prefetched events are held by the attachment
/// (the monitor shows them as held); when the attachment is dropped, those never handed out go
/// back to the front of the station's input list, unchanged (`UNGET` in `docs/et.md`). Turn it
/// off with [`RemoteAttachment::set_prefetch`].
pub struct RemoteAttachment {
    inner: Arc<RemoteInner>,
    att: u32,
    station: String,
    prefetch: AtomicBool,
}

impl std::fmt::Debug for RemoteAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAttachment").field("id", &self.att).field("station", &self.station).finish()
    }
}

impl RemoteAttachment {
    /// Sends NEW or GET until events come or the wait is over (the server caps each wait).
    fn fetch(&self, kind: u16, n: usize, size: usize, wait: Wait) -> Result<Vec<WireEvent>, EtError> {
        let deadline = match wait {
            Wait::Timed(d) => Some(Instant::now() + d),
            _ => None,
        };
        loop {
            let this_wait = match (wait, deadline) {
                (Wait::Timed(_), Some(dl)) => {
                    Wait::Timed(dl.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
                }
                (w, _) => w,
            };
            let mut req = BytesMut::with_capacity(20);
            req.put_u32_le(n.min(u32::MAX as usize) as u32);
            if kind == NEW {
                req.put_u64_le(size as u64);
            }
            encode_wait(this_wait, &mut req);
            let events = self.inner.request_events(Frame::new(kind, req.freeze()).with_channel(self.att))?;
            if !events.is_empty() || wait == Wait::NoWait {
                return Ok(events);
            }
            if deadline.is_some_and(|dl| Instant::now() >= dl) {
                return Err(EtError::Timeout);
            }
        }
    }

    /// Whether `get_events` asks for the next batch ahead of time (on by default). Turning it
    /// off leaves a batch already asked for to the next call.
    pub fn set_prefetch(&self, on: bool) {
        self.prefetch.store(on, Ordering::Relaxed);
    }

    /// The link, without reporting a pipelined put's error: for steps that must not be cut
    /// short by it (the answer stays for the next call).
    fn link(&self) -> Result<std::sync::MutexGuard<'_, Link>, EtError> {
        if self.inner.dead.load(Ordering::Acquire) {
            return Err(EtError::SystemDead(self.inner.name.clone()));
        }
        Ok(self.inner.link.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sends a GET for up to `n` events, without waiting, whose answer is kept for later.
    fn send_prefetch(&self, link: &mut Link, n: usize) -> Result<(), EtError> {
        let mut req = BytesMut::with_capacity(12);
        req.put_u32_le(n.min(u32::MAX as usize) as u32);
        encode_wait(Wait::NoWait, &mut req);
        self.inner.send(link, vec![Frame::new(GET, req.freeze()).with_channel(self.att)])?;
        link.due.push_back(Due::Batch(self.att));
        link.prefetch.entry(self.att).or_default().in_flight = true;
        Ok(())
    }

    /// Up to `n` prefetched events, if any came; asks for the next batch when these empty it.
    fn take_prefetched(&self, n: usize) -> Result<Option<Vec<WireEvent>>, EtError> {
        let mut link = self.inner.lock()?;
        let Some(p) = link.prefetch.get(&self.att) else { return Ok(None) };
        if p.in_flight
            && let Err(e) = self.inner.settle(&mut link)
        {
            return Err(link.deferred.take().unwrap_or(e));
        }
        let Some(p) = link.prefetch.get_mut(&self.att) else { return Ok(None) };
        if let Some(e) = p.error.take() {
            return Err(e);
        }
        if p.events.is_empty() {
            return Ok(None);
        }
        let k = n.min(p.events.len());
        let out: Vec<WireEvent> = p.events.drain(..k).collect();
        if p.events.is_empty() && k == n && self.prefetch.load(Ordering::Relaxed) {
            self.send_prefetch(&mut link, n)?;
        }
        Ok(Some(out))
    }

    fn to_event<'a>(&'a self, w: WireEvent, fresh: bool) -> Event<'a> {
        Event {
            idx: w.idx,
            len: w.len as usize,
            cap: w.cap as usize,
            control: w.control,
            priority: if w.flags & EV_HIGH != 0 { Priority::High } else { Priority::Low },
            corrupt: w.flags & EV_CORRUPT != 0,
            temp_id: u32::from(w.flags & EV_LARGE != 0),
            data: Data::Remote { received: w.data.unwrap_or_default(), owned: None },
            dirty_header: false,
            dirty_data: fresh,
            att: self.att,
            _life: PhantomData,
        }
    }
}

impl Attachment for RemoteAttachment {
    fn station(&self) -> &str {
        &self.station
    }

    fn new_events_into<'a>(
        &'a self,
        n: usize,
        size: usize,
        wait: Wait,
        out: &mut Vec<Event<'a>>,
    ) -> Result<usize, EtError> {
        if size > super::protocol::MAX_REMOTE_EVENT {
            return Err(EtError::Refused(format!(
                "events larger than {} bytes cannot travel remotely",
                super::protocol::MAX_REMOTE_EVENT
            )));
        }
        let got = self.fetch(NEW, n, size, wait)?;
        let k = got.len();
        out.extend(got.into_iter().map(|w| self.to_event(w, true)));
        Ok(k)
    }

    fn get_events_into<'a>(&'a self, n: usize, wait: Wait, out: &mut Vec<Event<'a>>) -> Result<usize, EtError> {
        let got = match self.take_prefetched(n)? {
            Some(got) => got,
            None => {
                let got = self.fetch(GET, n, 0, wait)?;
                // A full batch: more are probably waiting. Ask for them now; the events got are
                // returned whatever happens to that request (its failure shows at the next call).
                if n > 0 && got.len() == n && self.prefetch.load(Ordering::Relaxed) {
                    let _ = self.link().and_then(|mut link| self.send_prefetch(&mut link, n));
                }
                got
            }
        };
        let k = got.len();
        out.extend(got.into_iter().map(|w| self.to_event(w, false)));
        Ok(k)
    }

    fn put_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), EtError> {
        if events.is_empty() {
            return Ok(());
        }
        if let Some(e) = events.iter().find(|e| e.att != self.att) {
            return Err(EtError::NotOwned { idx: e.idx });
        }
        let inline: usize = events.iter().filter(|e| e.dirty_data && e.len < INLINE_MAX).map(|e| e.len).sum();
        let mut out = BytesMut::with_capacity(4 + events.len() * WIRE_HEADER + inline);
        let mut data_frames = Vec::new();
        begin_batch(&mut out, events.len());
        for e in events.drain(..) {
            let flags = if e.priority == Priority::High { EV_HIGH } else { 0 };
            let (idx, len, cap, control) = (e.idx, e.len as u32, e.cap as u32, e.control);
            if !e.dirty_data {
                put_event(&mut out, idx, len, cap, flags, control, DataMode::None);
            } else {
                // Exactly `len` bytes (a new event never written travels as zeros).
                let data = e.into_remote_bytes();
                if data.len() < INLINE_MAX {
                    put_event(&mut out, idx, len, cap, flags, control, DataMode::Inline(&data));
                } else {
                    put_event(&mut out, idx, len, cap, flags, control, DataMode::Frame);
                    data_frames.push(Frame::new(DATA, data).with_channel(self.att));
                }
            }
        }
        let mut frames = Vec::with_capacity(1 + data_frames.len());
        frames.push(Frame::new(PUT, out.freeze()).with_channel(self.att));
        frames.append(&mut data_frames);
        self.inner.post(frames)
    }

    fn dump_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), EtError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut out = BytesMut::with_capacity(4 + 4 * events.len());
        out.put_u32_le(events.len() as u32);
        for e in events.iter() {
            if e.att != self.att {
                return Err(EtError::NotOwned { idx: e.idx });
            }
            out.put_u32_le(e.idx);
        }
        events.clear();
        self.inner.post(vec![Frame::new(DUMP, out.freeze()).with_channel(self.att)])
    }
}

impl Drop for RemoteAttachment {
    fn drop(&mut self) {
        // Prefetched events never handed out go back to the front of the station's input.
        if let Ok(mut link) = self.link() {
            let _ = self.inner.settle(&mut link);
            let back: Vec<u32> =
                link.prefetch.remove(&self.att).map(|p| p.events.iter().map(|e| e.idx).collect()).unwrap_or_default();
            if !back.is_empty() {
                let mut out = BytesMut::with_capacity(4 + 4 * back.len());
                out.put_u32_le(back.len() as u32);
                for idx in back {
                    out.put_u32_le(idx);
                }
                let _ = self.inner.post_locked(&mut link, vec![Frame::new(UNGET, out.freeze()).with_channel(self.att)]);
            }
        }
        // A pipelined put's error may be pending: it is reported by this first call and
        // swallowed (nobody is left to tell); the detach is then sent for sure.
        let detach = || self.inner.request(Frame::new(DETACH, Bytes::new()).with_channel(self.att));
        if detach().is_err() && !self.inner.dead.load(Ordering::Acquire) {
            let _ = detach();
        }
    }
}
