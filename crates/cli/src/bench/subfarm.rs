//! The ATLAS DAQ-Unit paper's sub-farm roles (its sections 2.2.4, 2.2.5, 4.7 and 4.8) on the
//! engine's poll/action scheduler: the **SFI** (Sub-Farm Input), the dummy **event handler**
//! (a process of its own, over TCP) and the **SFO** (Sub-Farm Output).
//!
//! - **SFI** (tasks `sfi.receive`, `sfi.end_of_event`, `sfi.output`): `receive` takes crate
//!   fragments (from the test bed's EBIF, or generated: the paper's SFI measurement generates
//!   two crate fragments of 256 bytes per event) and buffers them in the engine's
//!   [`EventManager`], keyed by event, each with its crate as the source; when an event has one
//!   fragment from every crate it tells `end_of_event` through a software FIFO. `end_of_event`
//!   assembles the crate fragments in crate order and formats the event (a `daqflow-wire` event:
//!   header, then the crate fragments as its super-fragments), frees them, and queues the event
//!   for `output`, whose poll asks whether the event handler is ready (a credit it granted over
//!   the connection) and whose action injects the event into it.
//! - **Event handler** ([`run_handler`], `daqflow engine handler`): the paper's dummy handler:
//!   it receives each event from the SFI and forwards it, unchanged, to the SFO, then grants the
//!   SFI one more credit; it starts with `window` credits. The SFO's back-pressure (it stops
//!   reading when its buffer is full) stops the handler, hence the credits, hence the SFI.
//! - **SFO** (tasks `sfo.input`, `sfo.output`): `input` receives the filtered events from the
//!   handler and buffers them (while its buffer has room); `output` writes them to mass storage
//!   (`daqflow-wire` data files) or, as in the paper's measurement, drops them, counting.
//!
//! The stream between the three is a sequence of `daqflow-wire` events, each delimited by its
//! header's total length; the handler's credits back to the SFI are `u32` little-endian counts.
//! Every event is accounted for: [`SubfarmCounts`] (crate fragments in, events built, injected,
//! received by the SFO, written).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use daqflow_engine::fifo::{Consumer, Producer, fifo};
use daqflow_engine::{BoxError, EventManager, EventManagerConfig, Module};
use daqflow_wire::file::{FileWriter, FileWriterConfig};
use daqflow_wire::{
    EVENT_HEADER_LEN, Event, EventHeader, EventId, EventInfo, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags,
};

/// Events the SFI keeps formatted and waiting for the handler.
const READY: usize = 64;
/// Longest the SFI waits at its end for the handler to take its last event and close.
const SFI_CLOSE_WAIT: Duration = Duration::from_secs(5);
/// Largest event the SFO takes (a corrupt length ends the run rather than a huge allocation).
const MAX_EVENT: u64 = 64 << 20;

/// Where the SFI's crate fragments come from.
pub enum SfiInput {
    /// The test bed's EBIF(s): one FIFO per crate, crate fragments (`daqflow-wire`
    /// super-fragments) in event order.
    Crates(Vec<Consumer<Bytes>>),
    /// Generated, as in the paper's SFI measurement: `crates` crate fragments of `size` bytes
    /// per event, up to `limit` events.
    Generate {
        /// Crate fragments per event (the paper: 2).
        crates: u32,
        /// Bytes per crate fragment, headers included (the paper: 256).
        size: usize,
        /// Events to generate (`u64::MAX`: until stopped).
        limit: u64,
    },
}

/// What the sub-farm did, shared with whoever watches the run.
#[derive(Debug, Default)]
pub struct SubfarmShared {
    /// Crate fragments the SFI received (or generated).
    pub received: AtomicU64,
    /// Events the SFI assembled and formatted.
    pub built: AtomicU64,
    /// Events the SFI injected into the event handler.
    pub sent: AtomicU64,
    /// Events the SFO received from the handler.
    pub sfo_received: AtomicU64,
    /// Events the SFO wrote to mass storage (or dropped, without a directory).
    pub sfo_done: AtomicU64,
    /// Bytes of events the SFO received.
    pub sfo_bytes: AtomicU64,
}

/// A snapshot of [`SubfarmShared`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubfarmCounts {
    /// Crate fragments the SFI received (or generated).
    pub received: u64,
    /// Events the SFI assembled and formatted.
    pub built: u64,
    /// Events the SFI injected into the event handler.
    pub sent: u64,
    /// Events the SFO received.
    pub sfo_received: u64,
    /// Events the SFO wrote (or dropped).
    pub sfo_done: u64,
    /// Bytes the SFO received.
    pub sfo_bytes: u64,
}

impl SubfarmShared {
    /// The counts now.
    pub fn counts(&self) -> SubfarmCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Acquire);
        SubfarmCounts {
            received: l(&self.received),
            built: l(&self.built),
            sent: l(&self.sent),
            sfo_received: l(&self.sfo_received),
            sfo_done: l(&self.sfo_done),
            sfo_bytes: l(&self.sfo_bytes),
        }
    }
}

impl SubfarmCounts {
    /// Whether nothing is in flight: every event built was injected, arrived at the SFO and was
    /// written; `crates` crate fragments make an event.
    pub fn is_drained(&self, crates: u32) -> bool {
        self.received == self.built * u64::from(crates)
            && self.built == self.sent
            && self.sent == self.sfo_received
            && self.sfo_received == self.sfo_done
    }
}

/// The SFI: three tasks on one module.
pub struct Sfi {
    input: SfiInput,
    crates: u32,
    run_number: u32,
    em: EventManager,
    /// The next event to generate, and its next crate (generated input).
    next: u64,
    next_crate: u32,
    /// Events with every crate fragment, for `end_of_event` (the paper's software FIFO).
    complete: (Producer<u64>, Consumer<u64>),
    /// Formatted events waiting for the handler.
    ready: std::collections::VecDeque<Bytes>,
    handler: TcpStream,
    /// Credits the handler granted and the SFI did not use.
    credits: u64,
    /// Bytes of partly read credit counts.
    credit_buf: Vec<u8>,
    /// The event being written and how much of it went.
    writing: Option<(Bytes, usize)>,
    shared: Arc<SubfarmShared>,
    counts: [u64; 3],
}

impl Sfi {
    /// An SFI reading `input`, buffering in an event manager of `em`, injecting into the event
    /// handler at `handler` (connected here).
    pub fn new(
        input: SfiInput,
        em: EventManagerConfig,
        run_number: u32,
        handler: SocketAddr,
        shared: Arc<SubfarmShared>,
    ) -> Result<Sfi, BoxError> {
        let crates = match &input {
            SfiInput::Crates(c) => c.len() as u32,
            SfiInput::Generate { crates, .. } => *crates,
        };
        if crates == 0 {
            return Err("the SFI needs at least one crate".into());
        }
        let stream = TcpStream::connect_timeout(&handler, Duration::from_secs(10))
            .map_err(|e| format!("SFI: connecting to the event handler at {handler}: {e}"))?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Sfi {
            input,
            crates,
            run_number,
            em: EventManager::new(em)?,
            next: 0,
            next_crate: 0,
            complete: fifo(4096),
            ready: std::collections::VecDeque::with_capacity(READY),
            handler: stream,
            credits: 0,
            credit_buf: Vec::with_capacity(4),
            writing: None,
            shared,
            counts: [0; 3],
        })
    }

    fn store(&mut self, crate_index: u32, data: Bytes) -> Result<(), BoxError> {
        let sf = SuperFragment::parse(data.clone())?;
        let id = sf.header().event_id.0;
        self.em.insert_shared(id, crate_index, data).map_err(|e| format!("SFI: event manager: {e}"))?;
        self.counts[0] += 1;
        self.shared.received.store(self.counts[0], Ordering::Release);
        if self.em.get(id).is_some_and(|f| f.fragment_count() == self.crates as usize) {
            self.complete.0.push(id).map_err(|_| "SFI: the end-of-event FIFO is full")?;
        }
        Ok(())
    }

    /// Reads the credits the handler granted (never waits).
    fn read_credits(&mut self) -> Result<(), BoxError> {
        let mut buf = [0u8; 256];
        loop {
            match self.handler.read(&mut buf) {
                Ok(0) => return Err("SFI: the event handler closed its connection".into()),
                Ok(n) => {
                    self.credit_buf.extend_from_slice(&buf[..n]);
                    let whole = self.credit_buf.len() / 4 * 4;
                    for c in self.credit_buf[..whole].chunks_exact(4) {
                        self.credits += u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                    self.credit_buf.drain(..whole);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("SFI: reading the event handler's credits: {e}").into()),
            }
        }
    }

    /// Writes what it can of the event under way; whether it went whole.
    fn write_some(&mut self) -> Result<bool, BoxError> {
        let Some((event, done)) = self.writing.as_mut() else { return Ok(true) };
        while *done < event.len() {
            match self.handler.write(&event[*done..]) {
                Ok(0) => return Err("SFI: the event handler's connection closed".into()),
                Ok(n) => *done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("SFI: injecting into the event handler: {e}").into()),
            }
        }
        self.writing = None;
        self.counts[2] += 1;
        self.shared.sent.store(self.counts[2], Ordering::Release);
        Ok(true)
    }
}

impl Drop for Sfi {
    /// The SFI's end (its scheduler stopped): the event under way is finished, then the
    /// connection is closed gracefully, so that every event counted as injected reaches the
    /// handler. A socket closed with unread bytes (credits the handler granted after the SFI's
    /// last read) is reset by the kernel, which discards what it had not yet sent and makes the
    /// handler's next credit a broken pipe; so the SFI half-closes (the handler reads its end of
    /// stream, forwards the rest and closes) and reads credits until the handler has closed,
    /// for at most [`SFI_CLOSE_WAIT`].
    fn drop(&mut self) {
        let deadline = Instant::now() + SFI_CLOSE_WAIT;
        let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        if let Err(e) = self.handler.set_nonblocking(false) {
            tracing::warn!("SFI: closing the event handler's connection: {e}");
            return;
        }
        if let Some((event, done)) = self.writing.take() {
            // Written in pieces, each bounded by what is left of the wait (a write timeout is
            // per call: one `write_all` could take it many times over).
            let mut rest = &event[done..];
            let mut failed = None;
            while !rest.is_empty() && failed.is_none() {
                if Instant::now() >= deadline {
                    failed = Some(format!("the handler took nothing more for {SFI_CLOSE_WAIT:?}"));
                    break;
                }
                match self.handler.set_write_timeout(Some(left())).and_then(|()| self.handler.write(rest)) {
                    Ok(0) => failed = Some("the connection closed".to_owned()),
                    Ok(n) => rest = &rest[n..],
                    Err(e)
                        if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    }
                    Err(e) => failed = Some(e.to_string()),
                }
            }
            match failed {
                None => {
                    self.counts[2] += 1;
                    self.shared.sent.store(self.counts[2], Ordering::Release);
                }
                Some(e) => tracing::warn!("SFI: the event under way at the end did not reach the handler: {e}"),
            }
        }
        if let Err(e) = self.handler.shutdown(std::net::Shutdown::Write) {
            tracing::warn!("SFI: ending the stream to the event handler: {e}");
            return;
        }
        let mut buf = [0u8; 256];
        loop {
            if Instant::now() >= deadline {
                // Closed now with credits unread, the connection is reset: what the kernel had
                // not yet sent is lost, and the sub-farm's counts (injected against received by
                // the SFO) show it.
                tracing::error!(
                    "SFI: the event handler did not close its connection in {SFI_CLOSE_WAIT:?}: events counted as \
                     injected may not have reached it"
                );
                return;
            }
            if let Err(e) = self.handler.set_read_timeout(Some(left())) {
                tracing::warn!("SFI: closing the event handler's connection: {e}");
                return;
            }
            match self.handler.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => {
                    tracing::warn!("SFI: draining the event handler's credits: {e}");
                    return;
                }
            }
        }
    }
}

/// One generated crate fragment of `size` bytes (headers included) of event `id` from `crate`.
fn generated_crate_fragment(id: u64, crate_index: u32, size: usize) -> Result<Bytes, BoxError> {
    let overhead = daqflow_wire::SUPER_FRAGMENT_HEADER_LEN + daqflow_wire::FRAGMENT_HEADER_LEN;
    let payload = vec![(id as u8) ^ (crate_index as u8); size.saturating_sub(overhead)];
    let info = FragmentInfo { source_id: crate_index, event_id: EventId(id), ..Default::default() };
    let fragment = Fragment::parse(Fragment::encode(&info, &payload))?;
    Ok(SuperFragment::assemble(crate_index, EventId(id), SuperFragmentFlags::default(), &[fragment]))
}

impl Module for Sfi {
    fn tasks(&self) -> usize {
        3
    }
    fn task_name(&self, task: usize) -> String {
        ["sfi.receive", "sfi.end_of_event", "sfi.output"][task.min(2)].to_owned()
    }
    fn poll(&mut self, task: usize) -> bool {
        match task {
            // One crate fragment per action, while the event manager has room for it.
            0 => {
                if self.complete.0.slots() == 0 {
                    return false;
                }
                match &self.input {
                    SfiInput::Crates(inputs) => {
                        inputs.iter().any(|c| c.peek().is_ok_and(|d| self.em.has_room_shared(d.len())))
                    }
                    SfiInput::Generate { limit, size, .. } => self.next < *limit && self.em.has_room_shared(*size),
                }
            }
            1 => !self.complete.1.is_empty() && self.ready.len() < READY,
            _ => {
                // The paper's poll asks the handler whether it is ready: here, whether it granted
                // a credit (read without waiting).
                if self.writing.is_some() {
                    return true;
                }
                if self.ready.is_empty() {
                    return false;
                }
                if self.credits == 0 && self.read_credits().is_err() {
                    return true; // the action reports the error
                }
                self.credits > 0
            }
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            0 => match &mut self.input {
                SfiInput::Crates(inputs) => {
                    let em = &self.em;
                    let Some(i) = inputs.iter().position(|c| c.peek().is_ok_and(|d| em.has_room_shared(d.len())))
                    else {
                        return Ok(());
                    };
                    let data = inputs[i].pop()?;
                    self.store(i as u32, data)?;
                }
                SfiInput::Generate { crates, size, .. } => {
                    // The paper's Receive Fragment task: one crate fragment per action.
                    let (crates, size, id, c) = (*crates, *size, self.next, self.next_crate);
                    self.store(c, generated_crate_fragment(id, c, size)?)?;
                    self.next_crate += 1;
                    if self.next_crate == crates {
                        self.next_crate = 0;
                        self.next += 1;
                    }
                }
            },
            1 => {
                let id = self.complete.1.pop()?;
                let fragments = self.em.get(id).ok_or_else(|| format!("SFI: event {id} vanished"))?;
                // In crate order, whatever order they came in.
                let mut parts: Vec<(u32, Bytes)> = fragments
                    .fragments()
                    .map(|f| (f.source, f.shared.cloned().unwrap_or_else(|| Bytes::copy_from_slice(f.data))))
                    .collect();
                parts.sort_by_key(|p| p.0);
                let sfs = parts.into_iter().map(|(_, b)| SuperFragment::parse(b)).collect::<Result<Vec<_>, _>>()?;
                let info = EventInfo { event_id: EventId(id), run_number: self.run_number, ..Default::default() };
                self.ready.push_back(Event::assemble(&info, &sfs));
                self.em.remove(id);
                self.counts[1] += 1;
                self.shared.built.store(self.counts[1], Ordering::Release);
            }
            _ => {
                if self.writing.is_none() {
                    self.read_credits()?;
                    if self.credits == 0 {
                        return Ok(());
                    }
                    let Some(event) = self.ready.pop_front() else { return Ok(()) };
                    self.credits -= 1;
                    self.writing = Some((event, 0));
                }
                self.write_some()?;
            }
        }
        Ok(())
    }
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        out.push(self.handler.as_raw_fd());
    }
}

/// The SFO: two tasks on one module.
pub struct Sfo {
    handler: TcpStream,
    /// Bytes read and not yet split into events.
    buf: BytesMut,
    /// Most bytes of events held (received, not yet written).
    capacity: usize,
    held: std::collections::VecDeque<Bytes>,
    held_bytes: usize,
    writer: Option<FileWriter>,
    shared: Arc<SubfarmShared>,
    counts: [u64; 3],
    closed: bool,
}

impl Sfo {
    /// An SFO taking the handler's connection from `listener` (waiting up to 20 s), buffering up
    /// to `capacity` bytes, writing data files into `directory` (or dropping the events).
    pub fn accept(
        listener: &TcpListener,
        capacity: usize,
        directory: Option<PathBuf>,
        run_number: u32,
        shared: Arc<SubfarmShared>,
    ) -> Result<Sfo, BoxError> {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(format!("SFO: the event handler did not connect: {e}").into()),
            }
        };
        stream.set_nonblocking(true)?;
        let writer = match directory {
            Some(d) => Some(FileWriter::new(FileWriterConfig::new(d, run_number))?),
            None => None,
        };
        Ok(Sfo {
            handler: stream,
            buf: BytesMut::with_capacity(1 << 20),
            capacity: capacity.max(1 << 16),
            held: std::collections::VecDeque::new(),
            held_bytes: 0,
            writer,
            shared,
            counts: [0; 3],
            closed: false,
        })
    }

    /// Splits whole events off the buffer.
    fn split(&mut self) -> Result<(), BoxError> {
        while self.buf.len() >= EVENT_HEADER_LEN {
            let header = EventHeader::decode(&self.buf[..EVENT_HEADER_LEN])?;
            if header.total_len > MAX_EVENT {
                return Err(format!("SFO: an event of {} bytes from the handler", header.total_len).into());
            }
            let len = header.total_len as usize;
            if self.buf.len() < len {
                break;
            }
            let event = self.buf.split_to(len).freeze();
            self.counts[0] += 1;
            self.counts[2] += len as u64;
            self.held_bytes += len;
            self.held.push_back(event);
        }
        self.shared.sfo_received.store(self.counts[0], Ordering::Release);
        self.shared.sfo_bytes.store(self.counts[2], Ordering::Release);
        Ok(())
    }
}

impl Drop for Sfo {
    /// The run's end (its scheduler ended): its data files are closed.
    fn drop(&mut self) {
        if let Some(w) = self.writer.take()
            && let Err(e) = w.finish()
        {
            tracing::error!("SFO: closing its data files: {e}");
        }
    }
}

impl Module for Sfo {
    fn tasks(&self) -> usize {
        2
    }
    fn task_name(&self, task: usize) -> String {
        ["sfo.input", "sfo.output"][task.min(1)].to_owned()
    }
    fn poll(&mut self, task: usize) -> bool {
        match task {
            // Events are there (a read that does not wait) and the buffer has room.
            0 => {
                if self.closed || self.held_bytes >= self.capacity {
                    return false;
                }
                let mut probe = [0u8; 1];
                matches!(self.handler.peek(&mut probe), Ok(n) if n > 0)
            }
            _ => !self.held.is_empty(),
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            0 => {
                let mut chunk = [0u8; 64 << 10];
                match self.handler.read(&mut chunk) {
                    Ok(0) => self.closed = true,
                    Ok(n) => {
                        self.buf.extend_from_slice(&chunk[..n]);
                        self.split()?;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                    Err(e) => return Err(format!("SFO: reading from the event handler: {e}").into()),
                }
            }
            _ => {
                while let Some(event) = self.held.pop_front() {
                    self.held_bytes -= event.len();
                    if let Some(w) = self.writer.as_mut() {
                        let parsed = Event::parse(event.clone())?;
                        w.write_event(parsed.header().event_id, &event)?;
                    }
                    self.counts[1] += 1;
                }
                self.shared.sfo_done.store(self.counts[1], Ordering::Release);
            }
        }
        Ok(())
    }
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        out.push(self.handler.as_raw_fd());
    }
}

/// The dummy event handler: takes one connection from the SFI on `listener`, connects to the
/// SFO at `sfo`, grants the SFI `window` credits, then forwards every event unchanged and
/// grants a credit for each, until the SFI closes its connection. Returns the events forwarded.
pub fn run_handler(listener: TcpListener, sfo: SocketAddr, window: u32) -> std::io::Result<u64> {
    let mut out = TcpStream::connect_timeout(&sfo, Duration::from_secs(10))?;
    out.set_nodelay(true)?;
    let (mut sfi, _) = listener.accept()?;
    sfi.set_nodelay(true)?;
    sfi.write_all(&window.max(1).to_le_bytes())?;
    let mut buf = BytesMut::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 256 << 10];
    let mut forwarded = 0u64;
    // Whether the SFI still takes credits: one that ended without reading the last ones reset
    // its connection, and the events it sent before are still read and forwarded.
    let mut granting = true;
    loop {
        let n = match sfi.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut whole = 0usize;
        let mut events = 0u32;
        while buf.len() - whole >= EVENT_HEADER_LEN {
            let header = EventHeader::decode(&buf[whole..whole + EVENT_HEADER_LEN])
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?;
            if header.total_len > MAX_EVENT {
                return Err(std::io::Error::new(ErrorKind::InvalidData, "an event over 64 MiB"));
            }
            if buf.len() - whole < header.total_len as usize {
                break;
            }
            whole += header.total_len as usize;
            events += 1;
        }
        if events > 0 {
            out.write_all(&buf[..whole])?;
            buf.advance(whole);
            forwarded += u64::from(events);
            // Ready for as many more.
            if granting {
                match sfi.write_all(&events.to_le_bytes()) {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                        granting = false
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    out.flush()?;
    Ok(forwarded)
}

/// How the event handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerMode {
    /// A process of its own: `BINARY engine handler --listen 127.0.0.1:0 --to SFO --window W`.
    Process(PathBuf),
    /// A thread of this process (for tests of a library without the binary).
    Thread,
}

/// A running event handler: its address, and what ends it.
pub struct Handler {
    /// Where the SFI connects.
    pub addr: SocketAddr,
    child: Option<std::process::Child>,
    thread: Option<std::thread::JoinHandle<std::io::Result<u64>>>,
}

impl Handler {
    /// Starts the handler forwarding to the SFO listening at `sfo`.
    pub fn start(mode: &HandlerMode, sfo: SocketAddr, window: u32) -> Result<Handler, BoxError> {
        match mode {
            HandlerMode::Thread => {
                let listener = TcpListener::bind("127.0.0.1:0")?;
                let addr = listener.local_addr()?;
                let thread = std::thread::Builder::new()
                    .name("event-handler".into())
                    .spawn(move || run_handler(listener, sfo, window))?;
                Ok(Handler { addr, child: None, thread: Some(thread) })
            }
            HandlerMode::Process(binary) => {
                let mut child = std::process::Command::new(binary)
                    .args(["engine", "handler", "--listen", "127.0.0.1:0", "--to", &sfo.to_string()])
                    .args(["--window", &window.to_string()])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("starting the event handler ({}): {e}", binary.display()))?;
                let stdout = child.stdout.take().expect("piped");
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
                let addr = line.trim().strip_prefix("listening on ").and_then(|a| a.parse().ok()).ok_or_else(|| {
                    let _ = child.kill();
                    format!("the event handler said {line:?}, not `listening on ADDR`")
                })?;
                Ok(Handler { addr, child: Some(child), thread: None })
            }
        }
    }

    /// Waits for the handler to end (after the SFI closed its connection).
    pub fn join(mut self) -> Result<(), BoxError> {
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| "the event handler panicked")??;
        }
        if let Some(mut c) = self.child.take() {
            let status = c.wait()?;
            if !status.success() {
                return Err(format!("the event handler ended: {status}").into());
            }
        }
        Ok(())
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use daqflow_engine::{IdleStrategy, Scheduler};

    use super::*;

    #[test]
    fn generated_events_go_through_the_sfi_the_handler_and_the_sfo_each_accounted_for() {
        let shared = Arc::new(SubfarmShared::default());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let handler = Handler::start(&HandlerMode::Thread, listener.local_addr().unwrap(), 8).unwrap();
        let em = EventManagerConfig { page_size: 1024, pages: 200, ..Default::default() };
        let input = SfiInput::Generate { crates: 2, size: 256, limit: 3000 };
        let sfi = Sfi::new(input, em, 7, handler.addr, shared.clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sfo = Sfo::accept(&listener, 1 << 20, Some(dir.path().to_path_buf()), 7, shared.clone()).unwrap();
        let mut a = Scheduler::new("sfi").with_idle(IdleStrategy::LAZY);
        a.add_module(sfi);
        let mut b = Scheduler::new("sfo").with_idle(IdleStrategy::LAZY);
        let sfo_stop = b.stop_handle();
        let sfi_stop = a.stop_handle();
        b.add_module(sfo);
        let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        while shared.counts().sfo_done < 3000 {
            assert!(Instant::now() < deadline, "{:?}", shared.counts());
            assert!(!a.is_finished() && !b.is_finished(), "a scheduler ended: {:?}", shared.counts());
            std::thread::sleep(Duration::from_millis(5));
        }
        sfi_stop.stop();
        a.join().unwrap();
        sfo_stop.stop();
        b.join().unwrap();
        // The SFI ended its stream gracefully: the handler saw its end, not a reset.
        handler.join().unwrap();
        let c = shared.counts();
        assert_eq!((c.received, c.built, c.sent, c.sfo_received, c.sfo_done), (6000, 3000, 3000, 3000, 3000));
        assert!(c.is_drained(2), "{c:?}");
        // 256-byte crate fragments, two per event, behind the event header.
        assert_eq!(c.sfo_bytes, 3000 * (EVENT_HEADER_LEN as u64 + 512));
    }

    /// Event `id` of one crate fragment of `size` bytes.
    fn event(id: u64, size: usize) -> Bytes {
        let sf = SuperFragment::parse(generated_crate_fragment(id, 0, size).unwrap()).unwrap();
        Event::assemble(&EventInfo { event_id: EventId(id), ..Default::default() }, &[sf])
    }

    fn events(n: u64) -> Vec<Bytes> {
        (0..n).map(|i| event(i, 100 + i as usize * 8)).collect()
    }

    /// The ids of the events in `bytes`, which must be whole events, back to back.
    fn whole_events(bytes: &[u8]) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            assert!(bytes.len() - at >= EVENT_HEADER_LEN, "a cut header at {at}");
            let len = EventHeader::decode(&bytes[at..at + EVENT_HEADER_LEN]).unwrap().total_len as usize;
            assert!(bytes.len() - at >= len, "a cut event at {at}");
            let event =
                Event::parse(Bytes::copy_from_slice(&bytes[at..at + len])).unwrap_or_else(|e| panic!("at {at}: {e}"));
            ids.push(event.header().event_id.0);
            at += len;
        }
        ids
    }

    /// A handler (a thread) granting `window` credits, with the test as its SFO: the handler,
    /// the SFO's end of its connection, and where an SFI connects.
    fn handler_to_test(window: u32) -> (std::thread::JoinHandle<std::io::Result<u64>>, TcpStream, SocketAddr) {
        let sfo = TcpListener::bind("127.0.0.1:0").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sfo_addr = sfo.local_addr().unwrap();
        let handler = std::thread::spawn(move || run_handler(listener, sfo_addr, window));
        let (out, _) = sfo.accept().unwrap();
        (handler, out, addr)
    }

    #[test]
    fn the_handler_forwards_what_an_sfi_sent_before_it_reset_its_connection() {
        // An SFI that resets its connection (a socket closed with unread credits is reset by the
        // kernel; SO_LINGER 0 here makes it so at once) while the handler is blocked forwarding
        // to an SFO that reads nothing yet: the handler's next credit comes after the reset, a
        // broken pipe. What it received before the reset still reaches the SFO, whole events in
        // order, and it ends well.
        let (handler, mut out, addr) = handler_to_test(1_000_000);
        let sfi = TcpStream::connect(addr).unwrap();
        sfi.set_nonblocking(true).unwrap();
        // Events of 64 KiB until the handler takes no more for 200 ms (its SFO is full).
        let mut id = 0u64;
        let mut pending = Bytes::new();
        let mut done = 0;
        let mut progress = Instant::now();
        while progress.elapsed() < Duration::from_millis(200) {
            if done == pending.len() {
                pending = event(id, 64 << 10);
                done = 0;
                id += 1;
            }
            match (&sfi).write(&pending[done..]) {
                Ok(n) => {
                    done += n;
                    progress = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("writing to the handler: {e}"),
            }
        }
        socket2::SockRef::from(&sfi).set_linger(Some(Duration::ZERO)).unwrap();
        drop(sfi);
        // Read now: the handler goes on, after the reset.
        let mut got = Vec::new();
        out.read_to_end(&mut got).unwrap();
        let forwarded = handler.join().unwrap().expect("the handler failed after the SFI's reset");
        assert!(forwarded > 0);
        // Every event forwarded arrived whole, in order.
        assert_eq!(whole_events(&got), (0..forwarded).collect::<Vec<_>>());
    }

    #[test]
    fn an_sfi_stopped_mid_stream_delivers_every_event_it_counted_as_injected() {
        // A handler of the test's own that stops reading (the SFI's socket fills, an event is
        // under way) and grants one more credit the SFI does not read. Closed as it was, the
        // SFI's socket would be reset with its unsent bytes discarded; it ends gracefully instead.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(SubfarmShared::default());
        let em = EventManagerConfig { page_size: 4096, pages: 4096, ..Default::default() };
        let input = SfiInput::Generate { crates: 2, size: 64 << 10, limit: u64::MAX };
        let sfi = Sfi::new(input, em, 1, addr, shared.clone()).unwrap();
        let (mut from_sfi, _) = listener.accept().unwrap();
        from_sfi.write_all(&1_000_000u32.to_le_bytes()).unwrap();
        let mut a = Scheduler::new("sfi").with_idle(IdleStrategy::LAZY);
        let stop = a.stop_handle();
        a.add_module(sfi);
        let a = a.spawn().unwrap();
        // Until the SFI is stalled on a full socket.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = (u64::MAX, Instant::now());
        loop {
            let sent = shared.counts().sent;
            if sent != last.0 {
                last = (sent, Instant::now());
            } else if sent > 0 && last.1.elapsed() > Duration::from_millis(200) {
                break;
            }
            assert!(Instant::now() < deadline, "the SFI never stalled: {:?}", shared.counts());
            std::thread::sleep(Duration::from_millis(10));
        }
        from_sfi.write_all(&1u32.to_le_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        stop.stop();
        // Read while the SFI ends, to its end of stream, then close.
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            from_sfi.read_to_end(&mut all).map(|_| all)
        });
        let ended = Instant::now();
        a.join().unwrap();
        assert!(
            ended.elapsed() < SFI_CLOSE_WAIT,
            "the SFI's end waited out its limit: the handler's close went unseen"
        );
        let got = reader.join().unwrap();
        let got = got.expect("the SFI's stream ended with an error, not its end");
        // Whole events only (none cut at the end), as many as were counted.
        assert_eq!(whole_events(&got).len() as u64, shared.counts().sent, "{:?}", shared.counts());
    }

    #[test]
    fn the_handler_forwards_events_split_anywhere_and_grants_a_credit_for_each() {
        let (handler, mut out, addr) = handler_to_test(3);
        let mut sfi = TcpStream::connect(addr).unwrap();
        let mut credits = [0u8; 4];
        sfi.read_exact(&mut credits).unwrap();
        assert_eq!(u32::from_le_bytes(credits), 3);
        let events = events(3);
        let all: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
        // In pieces that cut headers and events.
        for piece in all.chunks(37) {
            sfi.write_all(piece).unwrap();
            sfi.flush().unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(sfi.shutdown(std::net::Shutdown::Write));
        let mut got = Vec::new();
        out.read_to_end(&mut got).unwrap();
        assert_eq!(got, all);
        assert_eq!(handler.join().unwrap().unwrap(), 3);
    }
}
