//! The event manager's protocol as a state machine without I/O: every decision the EVM makes,
//! and nothing else. [`EvmMachine`] is told of connections (each named by a [`ConnId`] the I/O
//! layer chooses), the frames that arrive on them, their closing, pause and stop, and the time;
//! it answers with frames to send, connections to close and the frame limits of each. The
//! component's I/O layer (`EvmIo`) only moves bytes and time between it and the sockets; the
//! simulation (`crates/evb/tests/simulation`) drives the same machine on virtual time.
//!
//! What it decides, around the [`EvmCore`]'s books:
//! - **admission**: who a hello is (one RU per id, all before the RU list; a BU whose id is
//!   still on the books waits for it, at most `bu_timeout_ms`; one trigger source, only with
//!   `trigger = "source"`), the run number, the protocol version;
//! - **the BU timeout**: a BU silent for `bu_timeout_ms` is closed and its events re-assigned;
//! - **triggers**: emulated at `rate_hz` (paced from when triggering started, no burst after a
//!   pause) or as the BUs' credits ask, or read from the trigger source only while fewer than
//!   `max_pending` wait;
//! - **grouping**: releases and level-2 rejects go to the RUs in groups, flushed every
//!   millisecond;
//! - **the stall watchdog** (`stall_timeout_ms`) and **the drain** (`drain_timeout_ms` without an
//!   event built after the stop), then the run end to every RU and BU;
//! - **aborts**: a lost RU or trigger source, a peer's abort, a bad trigger.
//!
//! ```
//! use std::time::Instant;
//! use daqflow_evb::evm::{ConnId, EvmMachine, EvmOutput, EvmSettings};
//! use daqflow_evb::protocol::{Message, Role};
//!
//! let now = Instant::now();
//! let mut evm = EvmMachine::new(EvmSettings { rus: 1, ..EvmSettings::new(7, "evm") }, now);
//! evm.connected(ConnId(1), "127.0.0.1:40000".into(), now);
//! let hello = Message::Hello { role: Role::Ru, id: 0, run: 7, name: "ru-0".into(), addr: "127.0.0.1:7200".into(), generation: 0 };
//! evm.on_frame(ConnId(1), hello.to_frame(), now);
//! assert!(evm.ready(), "every RU is there: the run's RU list is made");
//! while let Some(o) = evm.next_output() {
//!     assert!(matches!(o, EvmOutput::Limits(..) | EvmOutput::Send(..)));
//! }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use daqflow_engine::messages::{ControlMessage, GroupSizes, Grouper};
use daqflow_wire::Fragment;
use daqflow_wire::frame::{Frame, FrameLimits};

use super::config::{EvmConfig, TriggerMode};
use super::core::{Accounting, CoreConfig, EvmCore, Out};
use crate::protocol::{KIND_FRAGMENT, KIND_REQUEST, Message, ProtocolError, Role, Trigger};

/// A connection, as the I/O layer names it (unique within a run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// Groups of releases and rejects wait at most this long for the RUs.
pub const FLUSH_EVERY: Duration = Duration::from_millis(1);

/// What an [`EvmMachine`] needs to know of its configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EvmSettings {
    /// The run.
    pub run: u32,
    /// Its name, in messages.
    pub name: String,
    /// RUs in the run.
    pub rus: usize,
    /// Where the triggers come from.
    pub trigger: TriggerMode,
    /// Emulated trigger rate; 0: as the BUs' credits ask.
    pub rate_hz: f64,
    /// The books' settings (level-2 rejects, assignments).
    pub core: CoreConfig,
    /// Rejects per grouped message.
    pub reject_group: usize,
    /// Releases per grouped message.
    pub release_group: usize,
    /// A BU silent this long is closed, its events re-assigned.
    pub bu_timeout: Duration,
    /// After the stop, how long the drain may go without an event built.
    pub drain_timeout: Duration,
    /// Events in flight and none built for this long while running: the run fails (zero: never).
    pub stall_timeout: Duration,
    /// Most triggers waiting for a BU.
    pub max_pending: usize,
    /// Emulated triggering stops by itself after this event (none: only at the stop).
    pub last_trigger: Option<u64>,
}

impl EvmSettings {
    /// The configuration's defaults, for run `run`.
    pub fn new(run: u32, name: &str) -> EvmSettings {
        EvmSettings::of(&EvmConfig::default(), run, name)
    }

    /// The settings of a configured EVM.
    pub fn of(config: &EvmConfig, run: u32, name: &str) -> EvmSettings {
        EvmSettings {
            run,
            name: name.to_owned(),
            rus: config.rus,
            trigger: config.trigger,
            rate_hz: config.rate_hz,
            core: CoreConfig {
                reject_fraction: config.reject_fraction,
                assign_batch: config.assign_batch,
                assign_timeout: Duration::from_millis(config.assign_timeout_ms),
                seed: config.seed,
            },
            reject_group: config.reject_group,
            release_group: config.release_group,
            bu_timeout: Duration::from_millis(config.bu_timeout_ms),
            drain_timeout: Duration::from_millis(config.drain_timeout_ms),
            stall_timeout: Duration::from_millis(config.stall_timeout_ms),
            max_pending: config.max_pending,
            last_trigger: None,
        }
    }
}

/// Something the I/O layer does for the machine, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum EvmOutput {
    /// Send this frame on the connection.
    Send(ConnId, Frame),
    /// Close the connection for this reason; once it is closed (what it still had was read),
    /// the I/O layer calls [`EvmMachine::closed`].
    Close(ConnId, String),
    /// The connection's frame limits from now on (set once its peer said who it is).
    Limits(ConnId, FrameLimits),
}

#[derive(Debug)]
struct PeerState {
    /// Its address, as the socket says (for messages).
    from: String,
    role: Option<Role>,
    id: u32,
    name: String,
    addr: String,
    last_heard: Instant,
    /// A BU hello waiting for its id since then.
    waiting: Option<Instant>,
    /// When its hello was taken.
    admitted: Instant,
    /// Closed by the machine: nothing more of it is taken.
    closing: bool,
}

impl PeerState {
    fn label(&self) -> String {
        match self.role {
            Some(r) => format!("{} {} ({}, {})", crate::link::role_name(r), self.id, self.name, self.from),
            None => format!("unidentified peer {}", self.from),
        }
    }
}

/// The event manager's decisions (see the module's documentation).
#[derive(Debug)]
pub struct EvmMachine {
    s: EvmSettings,
    core: EvmCore,
    peers: BTreeMap<ConnId, PeerState>,
    rus: Vec<(u32, String)>,
    ready: bool,
    out: VecDeque<EvmOutput>,
    core_out: Vec<Out>,
    grouper: Grouper,
    next_flush: Instant,
    /// (start, first event id) of the current paced stretch of emulated triggers.
    paced_from: Option<(Instant, u64)>,
    paused: bool,
    stop_at: Option<Instant>,
    done: bool,
    trigger_ended: bool,
    failure: Option<String>,
    /// (built + rejected, when it last changed or nothing was in flight): the stall watchdog.
    progress: (u64, Instant),
    /// The books' last word, once the run ended.
    final_accounting: Option<Accounting>,
}

impl EvmMachine {
    /// An EVM whose run starts at `now`.
    pub fn new(settings: EvmSettings, now: Instant) -> EvmMachine {
        let grouper = Grouper::new(GroupSizes {
            reject: settings.reject_group.max(1),
            discard: settings.release_group.max(1),
            ..GroupSizes::default()
        });
        EvmMachine {
            core: EvmCore::new(settings.core.clone(), Vec::new()),
            s: settings,
            peers: BTreeMap::new(),
            rus: Vec::new(),
            ready: false,
            out: VecDeque::new(),
            core_out: Vec::new(),
            grouper,
            next_flush: now,
            paced_from: None,
            paused: false,
            stop_at: None,
            done: false,
            trigger_ended: false,
            failure: None,
            progress: (0, now),
            final_accounting: None,
        }
    }

    /// The next thing to do, in order.
    pub fn next_output(&mut self) -> Option<EvmOutput> {
        self.out.pop_front()
    }

    /// The books.
    pub fn core(&self) -> &EvmCore {
        &self.core
    }

    /// Every RU is there: the run's RU list is made and events are assigned.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// The RUs connected so far, (id, address).
    pub fn rus(&self) -> &[(u32, String)] {
        &self.rus
    }

    /// Why the run was aborted, if it was.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The run is over: the run end went out (the I/O layer sends what is queued and ends).
    pub fn done(&self) -> bool {
        self.done
    }

    /// Whether the stop came, and when.
    pub fn stopped(&self) -> Option<Instant> {
        self.stop_at
    }

    /// Whether the connection is open on the machine's books (connected, not yet closed).
    pub fn knows(&self, conn: ConnId) -> bool {
        self.peers.contains_key(&conn)
    }

    /// Who the connection's peer is, once its hello was taken (none before, for a BU hello
    /// waiting for its id, and for one refused).
    pub fn role_of(&self, conn: ConnId) -> Option<Role> {
        self.peers.get(&conn).and_then(|p| p.role)
    }

    /// A new connection from `from` (its peer's address) at `now`.
    pub fn connected(&mut self, conn: ConnId, from: String, now: Instant) {
        let peer = PeerState {
            from,
            role: None,
            id: 0,
            name: String::new(),
            addr: String::new(),
            last_heard: now,
            waiting: None,
            admitted: now,
            closing: false,
        };
        self.peers.insert(conn, peer);
    }

    /// Whether the I/O layer should read the connection now: triggers wait until every RU is
    /// there and while `max_pending` wait or the run is paused; a BU hello waiting for its id
    /// is not read further.
    pub fn reads(&self, conn: ConnId) -> bool {
        let Some(p) = self.peers.get(&conn) else { return false };
        if p.closing || p.waiting.is_some() {
            return false;
        }
        !(p.role == Some(Role::Trigger) && (!self.ready || self.core.pending() >= self.s.max_pending || self.paused))
    }

    /// The run is paused (no triggers) or goes on.
    pub fn set_paused(&mut self, paused: bool) {
        if paused {
            self.paced_from = None;
        }
        self.paused = paused;
    }

    fn close(&mut self, conn: ConnId, why: String) {
        if let Some(p) = self.peers.get_mut(&conn)
            && !p.closing
        {
            p.closing = true;
            self.out.push_back(EvmOutput::Close(conn, why));
        }
    }

    fn send(&mut self, conn: ConnId, frame: Frame) {
        self.out.push_back(EvmOutput::Send(conn, frame));
    }

    /// The run fails for `reason` (the first is kept): every peer is told.
    pub fn abort(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        tracing::error!(evm = %self.s.name, "run aborted: {reason}");
        self.failure = Some(reason.clone());
        let frame = Message::Abort { reason }.to_frame();
        let conns: Vec<ConnId> = self.peers.iter().filter(|(_, p)| !p.closing).map(|(c, _)| *c).collect();
        for c in conns {
            self.send(c, frame.clone());
        }
    }

    /// A frame on `conn` at `now`.
    pub fn on_frame(&mut self, conn: ConnId, frame: Frame, now: Instant) {
        let Some(p) = self.peers.get_mut(&conn) else { return };
        if p.closing {
            return;
        }
        p.last_heard = now;
        let role = p.role;
        if role.is_none() {
            match Message::decode(&frame) {
                Ok(Message::Hello { run, .. }) if run != self.s.run => {
                    let why = format!("said hello for run {run}; this is run {}", self.s.run);
                    tracing::warn!(evm = %self.s.name, "closing {}: {why}", p.label());
                    self.close(conn, why);
                }
                // The EVM gives a BU its generation (in the RU list): the one in its hello is 0.
                Ok(Message::Hello { role, id, name, addr, .. }) => self.hello(conn, role, id, name, addr, now),
                Ok(m) => self.close(conn, format!("sent {m:?} before hello")),
                Err(e @ ProtocolError::Version { .. }) => {
                    tracing::warn!(evm = %self.s.name, "refusing {}: {e}", p.from);
                    self.close(conn, e.to_string());
                }
                Err(e) => self.close(conn, format!("garbage before hello: {e}")),
            }
            return;
        }
        if role == Some(Role::Trigger) && frame.kind == KIND_FRAGMENT {
            match Fragment::parse(frame.payload) {
                Ok(f) => {
                    let h = f.header();
                    let t = Trigger {
                        event_id: h.event_id.0,
                        trigger_type: h.trigger_type,
                        flags: 0,
                        timestamp: h.timestamp,
                    };
                    if self.core.stopped_at().is_none()
                        && let Err(e) = self.core.trigger(t, now, &mut self.core_out)
                    {
                        self.abort(format!("trigger source: {e}"));
                    }
                }
                Err(e) => self.abort(format!("trigger source sent a malformed fragment: {e}")),
            }
            return;
        }
        let id = p.id;
        match (role, Message::decode(&frame)) {
            (Some(Role::Bu), Ok(Message::Request { credits, done })) => {
                self.core.request(id, credits, &done, &mut self.core_out);
            }
            (Some(Role::Trigger), Ok(Message::End { .. })) => self.trigger_ended = true,
            (_, Ok(Message::Abort { reason })) => {
                let label = p.label();
                self.abort(format!("{label}: {reason}"));
            }
            (_, Ok(m)) => tracing::warn!(evm = %self.s.name, "ignoring {:?} from {}", m.kind(), p.label()),
            (_, Err(e)) => {
                tracing::warn!(evm = %self.s.name, "{} sent garbage: {e}", p.label());
                self.close(conn, format!("sent garbage: {e}"));
            }
        }
    }

    fn hello(&mut self, conn: ConnId, role: Role, id: u32, name: String, addr: String, now: Instant) {
        let p = self.peers.get_mut(&conn).expect("checked by the caller");
        p.role = Some(role);
        p.id = id;
        p.name = name;
        p.addr = addr.clone();
        tracing::info!(evm = %self.s.name, "{} connected", p.label());
        match role {
            Role::Ru => {
                if self.rus.iter().any(|(r, _)| *r == id) || self.ready {
                    // Refused as a nobody: a second claimant, or one after the run's RU list
                    // was made, never disturbs the run.
                    let reason = if self.ready {
                        format!("the run's {} RUs are all connected; RU {id} is refused", self.s.rus)
                    } else {
                        format!("RU {id} is already connected")
                    };
                    tracing::warn!(evm = %self.s.name, "refusing {}: {reason}", p.from);
                    p.role = None;
                    self.close(conn, reason);
                    return;
                }
                self.out.push_back(EvmOutput::Limits(conn, crate::link::limits(&[])));
                self.rus.push((id, addr));
                if self.rus.len() == self.s.rus {
                    self.rus.sort();
                    self.ready = true;
                    let ids: Vec<u32> = self.rus.iter().map(|r| r.0).collect();
                    let fresh = EvmCore::new(self.s.core.clone(), ids);
                    let old = std::mem::replace(&mut self.core, fresh);
                    // BUs that joined before the RUs keep their place, as generation 0: none of
                    // them had the RU list, so no RU knows of them or of any that left before.
                    for (bu, ..) in old.bus() {
                        self.core.add_bu(bu);
                    }
                    if self.stop_at.is_some() {
                        // Stopped before the last RU came (nothing was triggered): the run ends
                        // now that every RU can be told.
                        self.core.stop();
                    }
                    let bus: Vec<(ConnId, u32)> = self
                        .peers
                        .iter()
                        .filter(|(_, p)| p.role == Some(Role::Bu) && !p.closing)
                        .map(|(c, p)| (*c, p.id))
                        .collect();
                    for (c, bu) in bus {
                        let generation = self.core.generation(bu).unwrap_or(0);
                        let list = Message::RuList { run: self.s.run, generation, rus: self.rus.clone() };
                        self.send(c, list.to_frame());
                    }
                }
            }
            Role::Bu => {
                // Taken until the predecessor is gone from the books (a closed connection is
                // removed, and its events re-assigned, when the I/O layer says it closed).
                let taken = self.peers.iter().any(|(c, q)| *c != conn && q.role == Some(Role::Bu) && q.id == id);
                let p = self.peers.get_mut(&conn).expect("present");
                if taken {
                    // Never replaces the live BU. A successor racing its predecessor's
                    // departure waits (as a nobody: nothing of it is read, its leaving is not the
                    // live BU leaving) until the id is free, at most twice `bu_timeout_ms`.
                    p.role = None;
                    if p.waiting.is_none() {
                        tracing::info!(evm = %self.s.name, "BU {id} ({}) waits: BU {id} is still connected", p.from);
                        p.waiting = Some(now);
                    }
                    return;
                }
                // A BU held while its id was taken was not read meanwhile: its silence counts
                // from its admission (its heartbeats wait in the socket), or a successor admitted
                // a little after its predecessor's timeout would be timed out at once.
                if p.waiting.take().is_some() {
                    p.last_heard = now;
                }
                p.admitted = now;
                // Requests carry the events a BU confirms: as many as its credits allow.
                self.out.push_back(EvmOutput::Limits(conn, crate::link::limits(&[(KIND_REQUEST, 64 << 20)])));
                let generation = self.core.add_bu(id);
                if self.ready {
                    let list = Message::RuList { run: self.s.run, generation, rus: self.rus.clone() };
                    self.send(conn, list.to_frame());
                }
            }
            Role::Trigger => {
                let other = self.peers.iter().any(|(c, q)| *c != conn && q.role == Some(Role::Trigger));
                let p = self.peers.get_mut(&conn).expect("present");
                if self.s.trigger != TriggerMode::Source {
                    p.role = None;
                    self.close(conn, "this EVM emulates its triggers; no trigger source wanted".into());
                } else if other {
                    p.role = None;
                    self.close(conn, "a trigger source is already connected".into());
                } else {
                    self.out.push_back(EvmOutput::Limits(conn, crate::link::limits(&[])));
                }
            }
            Role::Source => {
                p.role = None;
                self.close(conn, "sources connect to RUs, not to the EVM".into());
            }
        }
    }

    /// BU hellos that waited for their id: admitted once it is free, refused after twice
    /// `bu_timeout_ms` behind the same holder. Twice: a holder that died is declared dead `bu_timeout_ms` after the
    /// last thing it sent, which may reach the EVM a little after its successor's hello; a live
    /// holder keeps its id for good.
    fn admit_waiting(&mut self, now: Instant) {
        let waiting: Vec<(ConnId, Instant)> =
            self.peers.iter().filter_map(|(c, p)| p.waiting.filter(|_| !p.closing).map(|w| (*c, w))).collect();
        for (conn, since) in waiting {
            let id = self.peers[&conn].id;
            let holder = self.peers.values().find(|p| p.role == Some(Role::Bu) && p.id == id).map(|p| p.admitted);
            let Some(holder_since) = holder else {
                let p = &self.peers[&conn];
                let (name, addr) = (p.name.clone(), p.addr.clone());
                self.hello(conn, Role::Bu, id, name, addr, now);
                continue;
            };
            // Waiting behind this holder since it came, if it came later (a successor admitted
            // meanwhile is another wait).
            if now.saturating_duration_since(since.max(holder_since)) > 2 * self.s.bu_timeout {
                tracing::warn!(evm = %self.s.name, "refusing a second BU {id} ({})", self.peers[&conn].from);
                self.peers.get_mut(&conn).expect("present").waiting = None;
                self.close(conn, format!("BU {id} is already connected"));
            }
        }
    }

    /// The connection closed (`why`): the machine forgets it, and a BU's events are
    /// re-assigned; a lost RU or trigger source aborts the run.
    pub fn closed(&mut self, conn: ConnId, why: &str, now: Instant) {
        let Some(p) = self.peers.remove(&conn) else { return };
        match p.role {
            Some(Role::Bu) if !self.ready => {
                // Before the RU list no BU has it, and no RU has heard of any BU: nobody is told
                // (a BU gone now would reach only the RUs connected so far, and put their count
                // of the id's generations out of step with the others'). The core is replaced
                // once every RU is there; the generations start then.
                tracing::warn!(evm = %self.s.name, "{} lost before the run's RUs were all there ({why})", p.label());
                self.core.remove_bu(p.id, now, &mut Vec::new());
            }
            Some(Role::Bu) => {
                tracing::warn!(evm = %self.s.name, "{} lost ({why}): re-assigning its events", p.label());
                self.core.remove_bu(p.id, now, &mut self.core_out);
                // A successor waiting for the id gets it now.
                self.admit_waiting(now);
            }
            Some(Role::Ru) if !self.done => self.abort(format!("{} lost: {why}", p.label())),
            Some(Role::Trigger) if !self.trigger_ended && !self.done => {
                self.abort(format!("trigger source lost: {why}"));
            }
            _ => tracing::debug!(evm = %self.s.name, "{} went away ({why})", p.label()),
        }
    }

    fn send_out(&mut self) {
        for o in std::mem::take(&mut self.core_out) {
            match o {
                Out::Bu(bu, m) => {
                    let conn = self.peers.iter().find(|(_, p)| p.role == Some(Role::Bu) && p.id == bu && !p.closing);
                    if let Some((&c, _)) = conn {
                        self.send(c, m.to_frame());
                    }
                }
                Out::Rus(m) => self.send_to_rus(m.to_frame()),
                Out::Reject(ids) => {
                    for id in ids {
                        if let Some(f) = self.grouper.push(ControlMessage::Reject { event_id: id }) {
                            self.send_to_rus(f);
                        }
                    }
                }
                Out::Release(ids) => {
                    for id in ids {
                        if let Some(f) = self.grouper.push(ControlMessage::Discard { event_id: id }) {
                            self.send_to_rus(f);
                        }
                    }
                }
            }
        }
    }

    fn send_to_rus(&mut self, frame: Frame) {
        let rus: Vec<ConnId> =
            self.peers.iter().filter(|(_, p)| p.role == Some(Role::Ru) && !p.closing).map(|(c, _)| *c).collect();
        for c in rus {
            self.send(c, frame.clone());
        }
    }

    /// The machine's clock at `now` (`wall_ns`: the time of day, for the emulated triggers'
    /// time stamps); `stop` says the component was told to stop. Times BUs out, triggers,
    /// assigns, watches for a stall, drains, flushes the groups, and ends the run.
    pub fn tick(&mut self, now: Instant, wall_ns: u64, stop: bool) {
        if self.done {
            return;
        }
        self.admit_waiting(now);
        // Stuck BUs: silent too long.
        let silent: Vec<(ConnId, Duration)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.role == Some(Role::Bu) && !p.closing)
            .map(|(c, p)| (*c, now.saturating_duration_since(p.last_heard)))
            .filter(|(_, d)| *d > self.s.bu_timeout && !mutated!(NoBuTimeout))
            .collect();
        for (c, d) in silent {
            self.close(c, format!("silent for {} ms", d.as_millis()));
        }
        self.watch_progress(now);
        let probes = &*crate::common::PROBES;
        probes.evm_trigger.enter();
        self.trigger(now, wall_ns);
        probes.evm_trigger.exit();
        if self.ready {
            let (core, out) = (&mut self.core, &mut self.core_out);
            crate::common::stamped(&probes.evm_assign, || core.assign(now, out));
        }
        // Stop: freeze triggering, then drain.
        if stop && self.stop_at.is_none() {
            let last = self.core.stop();
            self.stop_at = Some(now);
            tracing::info!(evm = %self.s.name, "stopping: last event {last}, draining");
        }
        // The drain ends when every event is built, or when none has been built for the drain
        // timeout: paced sources may still be producing the events triggered ahead of them (up
        // to the BUs' credits), which takes as long as it takes at their rate. A stop that came
        // before every RU did waits for them (at most the drain timeout), so that each is told
        // the run's end.
        if let Some(t) = self.stop_at
            && ((self.core.is_drained() && self.ready)
                || self.failure.is_some()
                || now.saturating_duration_since(t.max(self.progress.1)) > self.s.drain_timeout)
        {
            self.finish();
            return;
        }
        self.send_out();
        if now >= self.next_flush {
            for f in self.grouper.flush() {
                self.send_to_rus(f);
            }
            self.next_flush = now + FLUSH_EVERY;
        }
    }

    fn trigger(&mut self, now: Instant, wall_ns: u64) {
        if !self.ready || self.s.trigger != TriggerMode::Emulated || self.core.stopped_at().is_some() || self.paused {
            return;
        }
        let limit = self.s.last_trigger.unwrap_or(u64::MAX);
        if self.s.rate_hz > 0.0 {
            // Paced from when triggering (re)started: no burst after a pause or a late RU.
            let (t0, id0) = *self.paced_from.get_or_insert((now, self.core.next_event_id()));
            let due = id0 - 1 + (now.duration_since(t0).as_secs_f64() * self.s.rate_hz) as u64;
            let due = due.min(limit);
            while self.core.next_event_id() <= due && self.core.pending() < self.s.max_pending {
                let t = Trigger { event_id: self.core.next_event_id(), trigger_type: 1, flags: 0, timestamp: wall_ns };
                let _ = self.core.trigger(t, now, &mut self.core_out);
            }
        } else if self.core.next_event_id() <= limit {
            self.core.trigger_on_demand(now, wall_ns, self.s.max_pending, &mut self.core_out);
        }
    }

    /// Fails the run when events are in flight and none was built or rejected for the stall
    /// timeout while running: a builder that stopped making progress says so instead of
    /// looking busy for ever.
    fn watch_progress(&mut self, now: Instant) {
        let acc = self.core.accounting();
        let moved = acc.built + acc.rejected;
        if self.stop_at.is_some() {
            // Draining: the time of the last event built (or rejected) is what the drain
            // timeout counts from.
            if moved != self.progress.0 {
                self.progress = (moved, now);
            }
            return;
        }
        if moved != self.progress.0 || self.paused || self.core.in_flight() == 0 {
            self.progress = (moved, now);
            return;
        }
        let limit = self.s.stall_timeout;
        if limit.is_zero() || now.saturating_duration_since(self.progress.1) < limit || self.failure.is_some() {
            return;
        }
        let waiting: Vec<String> = self
            .core
            .bus()
            .filter(|(.., in_flight, _)| *in_flight > 0)
            .map(|(id, _, in_flight, built)| format!("BU {id}: {in_flight} in flight, {built} built"))
            .collect();
        self.abort(format!(
            "the builder is stalled: no event built for {:.1} s with {} events in flight ({}); the oldest \
             waits for its fragments or its BU (a source that stopped sending, an RU or a BU that stopped \
             working); evm.stall_timeout_ms sets how long to wait",
            limit.as_secs_f64(),
            self.core.in_flight(),
            waiting.join(", ")
        ));
    }

    fn finish(&mut self) {
        self.done = true;
        self.final_accounting = Some(self.core.finish());
        let last = self.core.stopped_at().unwrap_or(0);
        self.send_out();
        for f in self.grouper.flush() {
            self.send_to_rus(f);
        }
        let end = Message::RunEnd { last_event: last }.to_frame();
        let to: Vec<ConnId> = self
            .peers
            .iter()
            .filter(|(_, p)| matches!(p.role, Some(Role::Ru | Role::Bu)) && !p.closing)
            .map(|(c, _)| *c)
            .collect();
        for c in to {
            self.send(c, end.clone());
        }
    }

    /// The run's accounting: final once [`EvmMachine::done`] (what was still pending or in
    /// flight counted lost, with the reason), so far before.
    pub fn accounting(&self) -> &Accounting {
        self.final_accounting.as_ref().unwrap_or_else(|| self.core.accounting())
    }

    /// The next time [`EvmMachine::tick`] has something to do by itself: a group, an
    /// assignment or paced triggers waiting, a waiting hello or a silent BU, the stall watchdog
    /// or the drain. The real EVM ticks every millisecond; the simulation sleeps until then.
    pub fn next_timer(&self) -> Option<Instant> {
        if self.done {
            return None;
        }
        let mut t: Option<Instant> = None;
        let mut at = |w: Instant| t = Some(t.map_or(w, |t: Instant| t.min(w)));
        let paced = self.ready
            && self.s.trigger == TriggerMode::Emulated
            && self.s.rate_hz > 0.0
            && self.stop_at.is_none()
            && !self.paused
            && self.core.next_event_id() <= self.s.last_trigger.unwrap_or(u64::MAX);
        if self.grouper.pending() > 0 || (self.core.pending() > 0 && self.core.total_credits() > 0) || paced {
            at(self.next_flush);
        }
        for p in self.peers.values().filter(|p| !p.closing) {
            if let Some(w) = p.waiting {
                let holder = self.peers.values().find(|q| q.role == Some(Role::Bu) && q.id == p.id);
                let from = holder.map_or(w, |h| w.max(h.admitted));
                at(from + 2 * self.s.bu_timeout + Duration::from_nanos(1));
            }
            if p.role == Some(Role::Bu) {
                at(p.last_heard + self.s.bu_timeout + Duration::from_nanos(1));
            }
        }
        if self.stop_at.is_none() && !self.s.stall_timeout.is_zero() && self.core.in_flight() > 0 {
            at(self.progress.1 + self.s.stall_timeout);
        }
        if let Some(stop) = self.stop_at {
            at(stop.max(self.progress.1) + self.s.drain_timeout + Duration::from_nanos(1));
        }
        t
    }
}
