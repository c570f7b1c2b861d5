//! The readout unit's protocol as a state machine without I/O: every decision an RU makes, and
//! nothing else. [`RuMachine`] is told of hellos (each connection named by a [`ConnId`] the I/O
//! layer chooses), the EVM's messages, the frames of its streams, connections that closed, and
//! the time; it answers with the connections to take (as a stream, as a BU) or close and what to
//! tell the EVM. The component's I/O layer (`RuIo`) only moves bytes and time between it and
//! the sockets; the simulation (`crates/evb/tests/simulation`) drives the same machine on
//! virtual time.
//!
//! What it decides, around the [`RuCore`]'s store:
//! - **admission**: a source takes the first free stream (never a second one with a live
//!   source's id); a BU connection is taken, held or refused by the generation rule
//!   ([`RuCore::bu_admission`], `docs/evb.md`, "Builder unit generations"), held at most
//!   `connect_timeout_ms`, and a second live connection with the same id and generation waits;
//! - **the EVM's messages**: assignments, grouped releases and rejects, a BU gone (which drops
//!   the connection of that generation only, then admits a successor it held), the run end, an
//!   abort;
//! - **the streams**: what each reads ([`RuMachine::may_read`]), their ends, a source lost
//!   before the run's end (the run fails);
//! - **the buffer watchdog**: assigned events stuck in a full buffer for 2 s fail the run;
//! - **the end**: the EVM's run end once everything is sent, the end timeout, a failure.
//!
//! ```
//! use std::time::Instant;
//! use daqflow_evb::ru::{ConnId, RuConfig, RuMachine, RuOutput};
//! use daqflow_evb::protocol::{Message, Role};
//!
//! let now = Instant::now();
//! let mut ru = RuMachine::new(&RuConfig { id: 0, streams: 1, ..Default::default() }, 7, "ru-0", now);
//! let hello = Message::Hello { role: Role::Source, id: 3, run: 7, name: "src-3".into(), addr: String::new(), generation: 0 };
//! ru.on_hello(ConnId(1), Ok(hello), now);
//! assert!(matches!(ru.next_output(), Some(RuOutput::TakeStream { slot: 0, .. })));
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use daqflow_engine::messages::{self, MessageKind};
use daqflow_wire::frame::{Frame, FrameLimits};

use super::config::RuConfig;
use super::core::{BuAdmission, RuCore};
pub use crate::evm::ConnId;
use crate::protocol::{KIND_END, KIND_FRAGMENT, Message, ProtocolError, Role};

/// Assigned events stuck in a full buffer this long fail the run.
pub const STUCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Something the I/O layer does for the machine, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum RuOutput {
    /// Send this message to the EVM.
    ToEvm(Message),
    /// The connection is stream `slot`'s source from now on, with these frame limits.
    TakeStream {
        /// The connection.
        conn: ConnId,
        /// Its stream.
        slot: usize,
        /// Its frame limits.
        limits: FrameLimits,
    },
    /// The connection is BU `bu`'s from now on (the super-fragments of its events go there).
    TakeBu {
        /// The connection.
        conn: ConnId,
        /// The BU's id.
        bu: u32,
        /// Its frame limits.
        limits: FrameLimits,
    },
    /// Close the connection (refused, replaced, dropped, or ended) for this reason; nothing more
    /// of it is taken.
    Close(ConnId, String),
}

/// What the run is for the machine after a [`RuMachine::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuStep {
    /// Go on.
    Continue,
    /// The run is over for this RU: write the summary and end.
    Finish,
}

#[derive(Debug)]
struct HeldBu {
    conn: ConnId,
    id: u32,
    generation: u32,
    name: String,
    since: Instant,
}

#[derive(Debug, Default)]
struct Stream {
    conn: Option<ConnId>,
    source: u32,
    ended: Option<u64>,
}

/// The readout unit's decisions (see the module's documentation).
#[derive(Debug)]
pub struct RuMachine {
    name: String,
    run: u32,
    connect_timeout: Duration,
    end_timeout: Duration,
    max_fragment_bytes: usize,
    core: RuCore,
    out: VecDeque<RuOutput>,
    streams: Vec<Stream>,
    /// (BU id, generation, connection) of the BUs taken.
    bus: Vec<(u32, u32, ConnId)>,
    held: Vec<HeldBu>,
    stop_requested: Option<Instant>,
    stuck_since: Option<Instant>,
    failure: Option<String>,
}

impl RuMachine {
    /// The RU of `config` for run `run`, started at `now` (connected to the EVM).
    pub fn new(config: &RuConfig, run: u32, name: &str, _now: Instant) -> RuMachine {
        RuMachine {
            name: name.to_owned(),
            run,
            connect_timeout: Duration::from_millis(config.connect_timeout_ms),
            end_timeout: Duration::from_millis(config.end_timeout_ms),
            max_fragment_bytes: config.max_fragment_bytes,
            core: RuCore::new(config),
            out: VecDeque::new(),
            streams: (0..config.streams).map(|_| Stream::default()).collect(),
            bus: Vec::new(),
            held: Vec::new(),
            stop_requested: None,
            stuck_since: None,
            failure: None,
        }
    }

    /// The next thing to do, in order.
    pub fn next_output(&mut self) -> Option<RuOutput> {
        self.out.pop_front()
    }

    /// The store (for the statistics).
    pub fn core(&self) -> &RuCore {
        &self.core
    }

    /// The store, for sending: the I/O layer takes each BU's next super-fragment from it.
    pub fn core_mut(&mut self) -> &mut RuCore {
        &mut self.core
    }

    /// Why the run failed here, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The BUs taken: (id, connection).
    pub fn bus(&self) -> impl Iterator<Item = (u32, ConnId)> + '_ {
        self.bus.iter().map(|&(id, _, c)| (id, c))
    }

    /// BU connections held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether the connection is a BU's held (waiting for its admission).
    pub fn is_held(&self, conn: ConnId) -> bool {
        self.held.iter().any(|h| h.conn == conn)
    }

    /// Streams with a source connected.
    pub fn streams_connected(&self) -> usize {
        self.streams.iter().filter(|s| s.conn.is_some()).count()
    }

    /// The connection of stream `slot`'s source, if one is connected.
    pub fn stream(&self, slot: usize) -> Option<ConnId> {
        self.streams.get(slot).and_then(|s| s.conn)
    }

    /// Whether stream `slot` may be read now (its fragments have room in the store).
    pub fn may_read(&self, slot: usize) -> bool {
        self.core.may_read(slot, self.max_fragment_bytes)
    }

    /// The run failed here for `reason` (the first is kept): the EVM is told.
    pub fn fail(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        tracing::error!(component = %self.name, "{reason}");
        self.failure = Some(reason.clone());
        self.out.push_back(RuOutput::ToEvm(Message::Abort { reason }));
    }

    /// The first frame of a new connection, its hello (or why it could not be decoded).
    pub fn on_hello(&mut self, conn: ConnId, hello: Result<Message, ProtocolError>, now: Instant) {
        let close = |why: String| RuOutput::Close(conn, why);
        match hello {
            Ok(Message::Hello { run, .. }) if run != self.run => {
                let why = format!("it said hello for run {run}; this is run {}", self.run);
                tracing::warn!(ru = %self.name, "closing {conn:?}: {why}");
                self.out.push_back(close(why));
            }
            Ok(Message::Hello { role: Role::Source, id, name, .. }) => {
                if self.streams.iter().any(|s| s.conn.is_some() && s.source == id) {
                    // Never replaces: the stream that has it keeps it.
                    tracing::warn!(ru = %self.name, "refusing a second source {id} ({name}): it already sends");
                    self.out.push_back(close(format!("source {id} already sends")));
                    return;
                }
                match self.streams.iter().position(|s| s.conn.is_none() && s.ended.is_none()) {
                    Some(slot) => {
                        tracing::info!(ru = %self.name, "source {id} on stream {slot}");
                        self.core.bind_stream(slot, id);
                        self.streams[slot].conn = Some(conn);
                        self.streams[slot].source = id;
                        // Fragments up to the largest expected (with their header), ends small.
                        let max = u32::try_from(self.max_fragment_bytes + 4096).unwrap_or(u32::MAX);
                        let limits = crate::link::limits(&[(KIND_FRAGMENT, max)]);
                        self.out.push_back(RuOutput::TakeStream { conn, slot, limits });
                    }
                    None => {
                        let why = format!("all {} streams taken", self.streams.len());
                        tracing::warn!(ru = %self.name, "refusing source {id}: {why}");
                        self.out.push_back(close(why));
                    }
                }
            }
            Ok(Message::Hello { role: Role::Bu, id, name, generation, .. }) => {
                let held = HeldBu { conn, id, generation, name, since: now };
                self.admit(held, now);
            }
            Ok(m) => self.out.push_back(close(format!("{:?} instead of hello", m.kind()))),
            Err(e) => {
                tracing::warn!(ru = %self.name, "closing {conn:?}: {e}");
                self.out.push_back(close(e.to_string()));
            }
        }
    }

    /// What to do with BU connection `h` now, by the generation rule: take it once every
    /// earlier generation of its id is gone, refuse a generation that is gone; hold it while an
    /// earlier one is not gone yet (its BU gone is on its way from the EVM) or while a live
    /// connection has its id (a second claimant never takes the live one's super-fragments) —
    /// held at most `connect_timeout_ms`, then closed.
    fn admit(&mut self, h: HeldBu, now: Instant) {
        let (id, generation) = (h.id, h.generation);
        let waited = now.saturating_duration_since(h.since);
        let keep = |why: String| {
            if waited > self.connect_timeout {
                Err(format!("{why}, still after {} ms (ru.connect_timeout_ms)", self.connect_timeout.as_millis()))
            } else {
                Ok(why)
            }
        };
        let admission = match self.core.bu_admission(id, generation) {
            BuAdmission::Wait { .. } if mutated!(NoGenerations) => BuAdmission::Take,
            a => a,
        };
        let verdict = match admission {
            BuAdmission::Refuse { gone } => Err(format!(
                "the EVM said BU {id} generation {} is gone: a connection of a BU that left is never taken",
                gone - 1
            )),
            BuAdmission::Wait { gone } if u64::from(generation) == gone + 1 => {
                keep(format!("the EVM's BU gone for its predecessor (BU {id} generation {gone}) has not come yet"))
            }
            BuAdmission::Wait { gone } => keep(format!(
                "the EVM's BU gone for its predecessors (BU {id} generations {gone} to {}) have not come yet",
                generation - 1
            )),
            BuAdmission::Take if self.bus.iter().any(|b| b.0 == id) => {
                keep(format!("BU {id} generation {generation} is connected"))
            }
            BuAdmission::Take => {
                tracing::info!(ru = %self.name, "BU {id} generation {generation} connected");
                self.bus.push((id, generation, h.conn));
                self.out.push_back(RuOutput::TakeBu { conn: h.conn, bu: id, limits: crate::link::limits(&[]) });
                return;
            }
        };
        match verdict {
            Ok(why) => {
                if !self.held.iter().any(|x| x.conn == h.conn) {
                    tracing::info!(ru = %self.name, "BU {id} generation {generation} ({}) waits: {why}", h.name);
                }
                self.held.push(h);
            }
            Err(why) => {
                tracing::warn!(ru = %self.name, "refusing BU {id} generation {generation} ({}): {why}", h.name);
                self.out.push_back(RuOutput::Close(h.conn, why));
            }
        }
    }

    /// Held BU connections: taken, refused, or held on.
    fn admit_held(&mut self, now: Instant) {
        for h in std::mem::take(&mut self.held) {
            self.admit(h, now);
        }
    }

    /// A BU connection (taken or held) closed at its end, or broke: a taken BU's events come
    /// back from the EVM as re-assignments; a held one is forgotten.
    pub fn bu_closed(&mut self, conn: ConnId, why: &str, now: Instant) {
        if let Some(k) = self.held.iter().position(|h| h.conn == conn) {
            let h = self.held.remove(k);
            tracing::info!(ru = %self.name, "BU {} generation {} ({}) went away while held ({why})", h.id, h.generation, h.name);
            return;
        }
        if let Some(k) = self.bus.iter().position(|b| b.2 == conn) {
            let (id, generation, _) = self.bus.remove(k);
            tracing::warn!(ru = %self.name, "BU {id} generation {generation} connection closed ({why})");
            // A second claimant held behind it may be taken now.
            self.admit_held(now);
        }
    }

    /// A frame of the EVM.
    pub fn on_evm(&mut self, frame: &Frame, now: Instant) {
        match frame.kind {
            messages::KIND_DISCARD | messages::KIND_REJECT => match messages::decode(frame) {
                Ok(g) if g.kind() == MessageKind::Discard => self.core.release(g.event_ids()),
                Ok(g) => self.core.reject(g.event_ids()),
                Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
            },
            _ => match Message::decode(frame) {
                Ok(Message::Assign { bu, events }) => self.core.assign(bu, events),
                Ok(Message::BuGone { bu, generation }) => {
                    if self.core.bu_gone(bu, generation) {
                        // Only that generation's connection (a successor is taken only after
                        // this); a successor held meanwhile may be taken now.
                        let (gone, kept): (Vec<_>, Vec<_>) =
                            self.bus.iter().partition(|b| b.0 == bu && b.1 <= generation);
                        self.bus = kept;
                        for (_, g, conn) in gone {
                            self.out.push_back(RuOutput::Close(conn, format!("BU {bu} generation {g} is gone")));
                        }
                        self.admit_held(now);
                    } else {
                        tracing::warn!(
                            ru = %self.name,
                            "ignoring the EVM's BU gone for BU {bu} generation {generation}: already gone"
                        );
                    }
                }
                Ok(Message::RunEnd { last_event }) => self.core.run_end(last_event),
                Ok(Message::Abort { reason }) => self.fail(format!("the EVM aborted the run: {reason}")),
                Ok(m) => tracing::warn!(ru = %self.name, "ignoring {:?} from the EVM", m.kind()),
                Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
            },
        }
    }

    /// The link to the EVM closed.
    pub fn evm_closed(&mut self, why: &str) {
        if self.core.ended().is_none() {
            self.fail(format!("lost the EVM: {why}"));
        }
    }

    /// A frame of stream `slot`'s source.
    pub fn on_stream_frame(&mut self, slot: usize, frame: Frame) {
        let Some(conn) = self.stream(slot) else { return };
        match frame.kind {
            KIND_FRAGMENT => {
                if let Err(e) = self.core.on_fragment(slot, frame.payload) {
                    self.fail(e);
                }
            }
            KIND_END => {
                let last = match Message::decode(&frame) {
                    Ok(Message::End { last_event }) => last_event,
                    _ => 0,
                };
                self.streams[slot].ended = Some(last);
                self.streams[slot].conn = None;
                self.core.stream_ended(slot, last);
                self.out.push_back(RuOutput::Close(conn, format!("its stream ended after event {last}")));
            }
            k => {
                let source = self.streams[slot].source;
                self.fail(format!("source {source} sent frame kind {k:#06x} on a fragment stream"));
            }
        }
    }

    /// Stream `slot`'s connection closed (what it sent was read): fine after the run's end,
    /// else the run fails.
    pub fn stream_closed(&mut self, slot: usize, why: &str) {
        if self.streams[slot].conn.take().is_none() {
            return;
        }
        let source = self.streams[slot].source;
        let last = self.core.stream_last(slot);
        match self.core.ended() {
            Some(end) if last >= end => {}
            _ => self.fail(format!("source {source} on stream {slot} disconnected after event {last} ({why})")),
        }
    }

    /// The machine's clock at `now`: `stop` says the component was told to stop, `sending`
    /// that super-fragments still wait in a BU connection's queue.
    pub fn tick(&mut self, now: Instant, stop: bool, sending: bool) -> RuStep {
        if !self.held.is_empty() {
            self.admit_held(now);
        }
        if self.core.is_stuck(self.max_fragment_bytes) {
            let since = *self.stuck_since.get_or_insert(now);
            if now.saturating_duration_since(since) > STUCK_TIMEOUT && self.failure.is_none() {
                let (bytes, size) = self.core.buffer();
                self.fail(format!(
                    "buffer full ({bytes} bytes stored, buffer_bytes {size}) with assigned events still waiting for \
                     fragments: the events in flight need more memory than the RU has; raise ru.buffer_bytes or \
                     lower bu.max_bytes_in_flight / bu.credits"
                ));
            }
        } else {
            self.stuck_since = None;
        }
        if stop && self.stop_requested.is_none() {
            self.stop_requested = Some(now);
        }
        let Some(t) = self.stop_requested else { return RuStep::Continue };
        let timed_out = now.saturating_duration_since(t) > self.end_timeout;
        if (self.core.ended().is_some() && !sending) || self.failure.is_some() || timed_out {
            if timed_out && self.core.ended().is_none() {
                self.fail("no end of run from the EVM before the timeout".into());
            }
            return RuStep::Finish;
        }
        RuStep::Continue
    }

    /// The next time [`RuMachine::tick`] has something to do by itself (a held BU's patience, the
    /// buffer watchdog, the end timeout). The real RU ticks every millisecond; the simulation
    /// sleeps until then.
    pub fn next_timer(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |w: Instant| t = Some(t.map_or(w, |t: Instant| t.min(w)));
        for h in &self.held {
            at(h.since + self.connect_timeout + Duration::from_nanos(1));
        }
        if let Some(s) = self.stuck_since {
            at(s + STUCK_TIMEOUT + Duration::from_nanos(1));
        }
        if let Some(s) = self.stop_requested {
            at(s + self.end_timeout + Duration::from_nanos(1));
        }
        t
    }
}
