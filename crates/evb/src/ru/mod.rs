//! The readout unit (RU): one input task per source stream storing fragments in the engine's
//! event manager (without copying them), a task for the EVM's assignments, releases and
//! rejects, and a task that sends each BU the super-fragments of its events, from the memory the
//! fragments were received into. Runs on one engine scheduler.
//!
//! ```no_run
//! use daqflow_evb::component::Component;
//! use daqflow_evb::ru::{Ru, RuConfig};
//! let mut ru = Ru::new("ru-0", RuConfig { id: 0, evm: "127.0.0.1:7100".into(), streams: 8, ..Default::default() });
//! let addr = ru.configure()?["listen"].as_str().unwrap().to_owned(); // sources and BUs connect here
//! ru.start(1)?;
//! # let _ = addr;
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

mod core;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_engine::messages::{self, MessageKind};
use daqflow_engine::{BoxError, Module, Running, Scheduler, StopHandle};
use daqflow_transport::{Connection, Listener};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use self::core::{OutgoingSf, RuCore, RuCounters};
use crate::component::{Component, State, expect_run, expect_state, live_stats, read, reported, set_paused};
use crate::link::{Peer, bind, connect, control_options, ru_data_options};
use crate::protocol::{KIND_END, KIND_FRAGMENT, KIND_SUPER_FRAGMENT, Message, Role};
use crate::{EvbError, Idle};

/// Configuration of a readout unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuConfig {
    /// The RU's id, unique in the run.
    pub id: u32,
    /// The EVM's address.
    pub evm: String,
    /// Address sources and BUs connect to (port 0: any free port).
    pub listen: String,
    /// Number of source streams.
    pub streams: usize,
    /// Check each fragment's payload CRC on arrival.
    pub check_crc: bool,
    /// Most bytes of fragments stored: the read-ahead, the events assigned to BUs and not yet
    /// confirmed, and those waiting for their last fragments. Full, no stream is read.
    pub buffer_bytes: usize,
    /// Bytes of fragments of events not yet assigned (or rejected) stored before the streams
    /// that are past every assigned event stop being read (back-pressure to the sources). Small
    /// keeps fragments in the cache until they are sent.
    pub read_ahead_bytes: usize,
    /// Most fragments stored; events read ahead take at most half of them.
    pub max_fragments: usize,
    /// Largest fragment expected; the streams are read only while this much room is left.
    pub max_fragment_bytes: usize,
    /// Most bytes queued towards one BU before its super-fragments wait.
    pub send_queue_bytes: usize,
    /// How long (ms) `stop` waits for the EVM's end of run.
    pub end_timeout_ms: u64,
    /// How long (ms) `start` retries connecting to the EVM.
    pub connect_timeout_ms: u64,
    /// Idle strategy of the RU's scheduler.
    pub idle: Idle,
}

impl RuConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::component::Checks::new("ru");
        c.address("evm", &self.evm);
        c.address("listen", &self.listen);
        c.int("streams", self.streams as u64, 1, 4096);
        c.int("max_fragment_bytes", self.max_fragment_bytes as u64, 64, 1 << 30);
        c.int("buffer_bytes", self.buffer_bytes as u64, self.max_fragment_bytes as u64 + 1, 1 << 40);
        c.int("read_ahead_bytes", self.read_ahead_bytes as u64, 1, self.buffer_bytes as u64);
        c.int("max_fragments", self.max_fragments as u64, 1, 1 << 26);
        c.int("send_queue_bytes", self.send_queue_bytes as u64, 4096, 16 << 20);
        c.int("end_timeout_ms", self.end_timeout_ms, 1, 3_600_000);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000);
        c.finish()
    }
}

impl Default for RuConfig {
    fn default() -> Self {
        RuConfig {
            id: 0,
            evm: "127.0.0.1:7100".into(),
            listen: "127.0.0.1:0".into(),
            streams: 1,
            check_crc: true,
            buffer_bytes: 128 << 20,
            read_ahead_bytes: 4 << 20,
            max_fragments: 1 << 18,
            max_fragment_bytes: 1 << 20,
            send_queue_bytes: 8 << 20,
            end_timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            idle: Idle::Lazy,
        }
    }
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    live: Mutex<Value>,
    failure: Mutex<Option<String>>,
    summary: Mutex<Option<Value>>,
}

/// The readout unit component.
pub struct Ru {
    name: String,
    config: RuConfig,
    state: State,
    listener: Option<Listener>,
    shared: Arc<Shared>,
    running: Option<Running>,
    run: u32,
    bound: Option<std::net::SocketAddr>,
}

impl Ru {
    /// A readout unit named `name`.
    pub fn new(name: &str, config: RuConfig) -> Ru {
        Ru {
            name: name.into(),
            config,
            state: State::Initial,
            listener: None,
            shared: Arc::default(),
            running: None,
            run: 0,
            bound: None,
        }
    }
}

impl Component for Ru {
    fn kind(&self) -> &'static str {
        "ru"
    }
    fn state(&self) -> State {
        reported(self.state, self.failure().is_some())
    }

    fn configure(&mut self) -> Result<Value, EvbError> {
        expect_state("configure", self.state, State::Initial)?;
        // send_queue_bytes at most 16 MiB: above the data link's own queue, a send could wait
        // inside the RU's only thread.
        self.config.validate()?;
        // After a run, the same address again (with port 0 configured, the port it got), so
        // that sources and BUs configured with it reach the next run too.
        let want = self.bound.map_or_else(|| self.config.listen.clone(), |a| a.to_string());
        let listener = bind(&want, ru_data_options())?;
        let addr = listener.local_addr();
        self.bound = Some(addr);
        self.listener = Some(listener);
        self.state = State::Configured;
        Ok(json!({ "listen": addr.to_string() }))
    }

    fn start(&mut self, run: u32) -> Result<(), EvbError> {
        expect_state("start", self.state, State::Configured)?;
        let listener = self.listener.take().expect("configured");
        let hello = Message::Hello {
            role: Role::Ru,
            id: self.config.id,
            run,
            name: self.name.clone(),
            addr: listener.local_addr().to_string(),
        };
        let evm = connect(
            &self.config.evm,
            &control_options(),
            Duration::from_millis(self.config.connect_timeout_ms),
            &hello,
        )
        .inspect_err(|_| self.listener = None)?;
        self.shared = Arc::default();
        self.run = run;
        let mut s = Scheduler::new(format!("{}-ru", self.name)).with_idle(self.config.idle.strategy());
        let io =
            RuIo::new(self.name.clone(), self.config.clone(), run, listener, evm, self.shared.clone(), s.stop_handle());
        s.add_module(io);
        self.running = Some(s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?);
        self.state = State::Running;
        Ok(())
    }

    fn stop(&mut self, _arg: Option<u64>) -> Result<Value, EvbError> {
        expect_run("stop", self.state)?;
        self.shared.stop.store(true, Ordering::SeqCst);
        let joined = self.running.take().expect("running").join();
        self.state = State::Initial;
        if let Err(e) = joined {
            self.state = State::Error;
            return Err(EvbError::Failed(e.to_string()));
        }
        let summary = self.shared.summary.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Ready for the next run on the same address; if it cannot be bound now (taken), the
        // RU stays in Initial and `configure` tells why.
        if let Err(e) = self.configure() {
            tracing::warn!(ru = %self.name, "not configured for another run: {e}");
        }
        summary.ok_or_else(|| EvbError::Failed("the RU ended without a summary".into()))
    }

    fn pause(&mut self) -> Result<(), EvbError> {
        // RUs and BUs follow the data: nothing to hold back.
        set_paused(&mut self.state, true, None)
    }

    fn resume(&mut self) -> Result<(), EvbError> {
        set_paused(&mut self.state, false, None)
    }

    fn reset(&mut self) -> Result<(), EvbError> {
        if let Some(r) = self.running.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = r.stop();
        }
        self.listener = None;
        self.state = State::Initial;
        Ok(())
    }

    fn stats(&self) -> Value {
        live_stats(&self.shared.live, self.state(), self.run)
    }

    fn failure(&self) -> Option<String> {
        read(&self.shared.failure)
    }
}

struct StreamSlot {
    peer: Option<Peer>,
    ended: Option<u64>,
}

struct RuIo {
    name: String,
    config: RuConfig,
    run: u32,
    listener: Listener,
    evm: Peer,
    /// Accepted connections that have not said hello yet.
    newcomers: Vec<Peer>,
    /// BUs whose hello waits for their id to be free.
    waiting_bus: Vec<Peer>,
    streams: Vec<StreamSlot>,
    bus: Vec<Peer>,
    core: RuCore,
    shared: Arc<Shared>,
    stopper: StopHandle,
    started: Instant,
    next_tick: Instant,
    stop_requested: Option<Instant>,
    stuck_since: Option<Instant>,
    /// The fragments of the super-fragment being sent (reused).
    scratch: Vec<bytes::Bytes>,
    failure: Option<String>,
    last_rate: (Instant, u64, u64),
}

impl RuIo {
    fn new(
        name: String,
        config: RuConfig,
        run: u32,
        listener: Listener,
        evm: Connection,
        shared: Arc<Shared>,
        stopper: StopHandle,
    ) -> RuIo {
        let core = RuCore::new(&config);
        let now = Instant::now();
        let mut evm = Peer::new(evm);
        evm.role = Some(Role::Ru);
        RuIo {
            streams: (0..config.streams).map(|_| StreamSlot { peer: None, ended: None }).collect(),
            name,
            config,
            run,
            listener,
            evm,
            newcomers: Vec::new(),
            waiting_bus: Vec::new(),
            bus: Vec::new(),
            core,
            shared,
            stopper,
            started: now,
            next_tick: now,
            stop_requested: None,
            stuck_since: None,
            scratch: Vec::with_capacity(64),
            failure: None,
            last_rate: (now, 0, 0),
        }
    }

    fn fail(&mut self, reason: String) {
        crate::link::fail_run(&self.name, &mut self.failure, &self.shared.failure, &mut self.evm, reason);
    }

    fn accept(&mut self) {
        while let Ok(Some(conn)) = self.listener.accept_timeout(Duration::ZERO) {
            self.newcomers.push(Peer::new(conn));
        }
        self.admit_waiting_bus();
        let mut i = 0;
        while i < self.newcomers.len() {
            let p = &mut self.newcomers[i];
            let Some(frame) = p.next() else {
                if p.closed.is_some() || p.since.elapsed() > Duration::from_secs(10) {
                    self.newcomers.remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let mut p = self.newcomers.remove(i);
            match Message::decode(&frame) {
                Ok(Message::Hello { run, .. }) if run != self.run => tracing::warn!(
                    ru = %self.name,
                    "closing {}: it said hello for run {run}; this is run {}",
                    p.label(),
                    self.run
                ),
                Ok(Message::Hello { role: Role::Source, id, .. })
                    if self
                        .streams
                        .iter()
                        .any(|s| s.peer.as_ref().is_some_and(|q| q.id == id && q.closed.is_none())) =>
                {
                    // Never replaces: the stream that has it keeps it.
                    tracing::warn!(ru = %self.name, "refusing a second source {id} ({}): it already sends", p.label());
                }
                Ok(Message::Hello { role: Role::Source, id, name, .. }) => {
                    p.role = Some(Role::Source);
                    p.id = id;
                    p.name = name;
                    // Fragments up to the largest expected (with their header), ends small.
                    let max = u32::try_from(self.config.max_fragment_bytes + 4096).unwrap_or(u32::MAX);
                    p.conn.set_frame_limits(crate::link::limits(&[(KIND_FRAGMENT, max)]));
                    match self.streams.iter().position(|s| s.peer.is_none() && s.ended.is_none()) {
                        Some(slot) => {
                            tracing::info!(ru = %self.name, "source {id} on stream {slot}");
                            self.core.bind_stream(slot, id);
                            self.streams[slot].peer = Some(p);
                        }
                        None => {
                            tracing::warn!(ru = %self.name, "refusing source {id}: all {} streams taken", self.streams.len())
                        }
                    }
                }
                Ok(Message::Hello { role: Role::Bu, id, name, .. })
                    if self.bus.iter_mut().any(|b| b.id == id && b.alive()) =>
                {
                    // A second claimant never takes the live BU's super-fragments. A successor
                    // racing its predecessor's departure waits until the id is free (the EVM
                    // says BU gone, or the old connection ends); a BU whose process died is not
                    // alive, and its successor takes its place at once.
                    tracing::info!(ru = %self.name, "BU {id} ({}) waits: BU {id} is connected", p.label());
                    p.id = id;
                    p.name = name;
                    p.waiting = Some(Instant::now());
                    self.waiting_bus.push(p);
                }
                Ok(Message::Hello { role: Role::Bu, id, name, .. }) => {
                    p.role = Some(Role::Bu);
                    p.id = id;
                    p.name = name;
                    p.conn.set_frame_limits(crate::link::limits(&[]));
                    tracing::info!(ru = %self.name, "BU {id} connected");
                    // A BU that reconnects after its connection broke takes the dead one's place.
                    self.bus.retain(|b| b.id != id);
                    self.bus.push(p);
                }
                Ok(m) => tracing::warn!(ru = %self.name, "closing {}: {:?} instead of hello", p.label(), m.kind()),
                Err(e) => tracing::warn!(ru = %self.name, "closing {}: {e}", p.label()),
            }
        }
    }

    /// BU hellos that waited for their id: admitted once it is free, refused after 10 s.
    fn admit_waiting_bus(&mut self) {
        let mut i = 0;
        while i < self.waiting_bus.len() {
            let id = self.waiting_bus[i].id;
            let taken = self.bus.iter_mut().any(|b| b.id == id && b.alive());
            let since = self.waiting_bus[i].waiting.unwrap_or_else(Instant::now);
            if !taken {
                let mut p = self.waiting_bus.remove(i);
                p.waiting = None;
                p.role = Some(Role::Bu);
                p.conn.set_frame_limits(crate::link::limits(&[]));
                tracing::info!(ru = %self.name, "BU {id} connected");
                self.bus.retain(|b| b.id != id);
                self.bus.push(p);
            } else if since.elapsed() > Duration::from_secs(10) {
                let p = self.waiting_bus.remove(i);
                tracing::warn!(ru = %self.name, "refusing a second BU {id} ({}): BU {id} is connected", p.label());
            } else {
                i += 1;
            }
        }
    }

    fn read_evm(&mut self) {
        while let Some(frame) = self.evm.next() {
            match frame.kind {
                messages::KIND_DISCARD | messages::KIND_REJECT => match messages::decode(&frame) {
                    Ok(g) if g.kind() == MessageKind::Discard => self.core.release(g.event_ids()),
                    Ok(g) => self.core.reject(g.event_ids()),
                    Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
                },
                _ => match Message::decode(&frame) {
                    Ok(Message::Assign { bu, events }) => self.core.assign(bu, events),
                    Ok(Message::BuGone { bu }) => {
                        self.core.bu_gone(bu);
                        self.bus.retain(|b| b.id != bu);
                    }
                    Ok(Message::RunEnd { last_event }) => self.core.run_end(last_event),
                    Ok(Message::Abort { reason }) => self.fail(format!("the EVM aborted the run: {reason}")),
                    Ok(m) => tracing::warn!(ru = %self.name, "ignoring {:?} from the EVM", m.kind()),
                    Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
                },
            }
        }
        if let Some(why) = self.evm.closed.clone()
            && self.core.ended().is_none()
        {
            self.fail(format!("lost the EVM: {why}"));
        }
    }

    fn read_stream(&mut self, slot: usize) {
        let margin = self.config.max_fragment_bytes;
        for _ in 0..256 {
            if !self.core.may_read(slot, margin) {
                break;
            }
            let Some(peer) = self.streams[slot].peer.as_mut() else { return };
            let Some(frame) = peer.next() else { break };
            match frame.kind {
                KIND_FRAGMENT => {
                    if let Err(e) = self.core.on_fragment(slot, frame.payload) {
                        self.fail(e);
                        return;
                    }
                }
                KIND_END => {
                    let last = Message::decode(&frame).ok().and_then(|m| match m {
                        Message::End { last_event } => Some(last_event),
                        _ => None,
                    });
                    self.streams[slot].ended = Some(last.unwrap_or(0));
                    self.streams[slot].peer = None;
                    self.core.stream_ended(slot, last.unwrap_or(0));
                    return;
                }
                k => {
                    let label = peer.label();
                    self.fail(format!("{label} sent frame kind {k:#06x} on a fragment stream"));
                    return;
                }
            }
        }
        let slot_ref = &mut self.streams[slot];
        if let Some(p) = &slot_ref.peer
            && let Some(why) = p.closed.clone()
            && p.stash.is_none()
        {
            let label = p.label();
            slot_ref.peer = None;
            let last = self.core.stream_last(slot);
            match self.core.ended() {
                Some(end) if last >= end => {}
                _ => self.fail(format!("{label} on stream {slot} disconnected after event {last} ({why})")),
            }
        }
    }

    fn send(&mut self) {
        self.core.process_rejects();
        let limit = self.config.send_queue_bytes;
        let bus: Vec<u32> = self.core.waiting_bus().collect();
        for bu in bus {
            let Some(peer) = self.bus.iter_mut().find(|b| b.id == bu) else { continue };
            for _ in 0..256 {
                let Some(size) = self.core.next_ready(bu) else { break };
                let queued = peer.conn.queued_bytes();
                if queued > 0 && queued + size > limit {
                    break;
                }
                let header = self.core.next_into(bu, &mut self.scratch).expect("next_ready said so");
                if !peer.send_parts(KIND_SUPER_FRAGMENT, &header.encode(), &self.scratch) {
                    break;
                }
            }
        }
        for b in &mut self.bus {
            b.try_flush();
        }
        // A BU whose connection broke: its events come back from the EVM as re-assignments.
        self.bus.retain(|b| {
            if let Some(why) = &b.closed {
                tracing::warn!("BU {} connection closed ({why})", b.id);
                false
            } else {
                true
            }
        });
    }

    fn tick(&mut self, now: Instant) {
        self.next_tick = now + Duration::from_millis(1);
        if self.core.is_stuck(self.config.max_fragment_bytes) {
            let since = *self.stuck_since.get_or_insert(now);
            if now.duration_since(since) > Duration::from_secs(2) && self.failure.is_none() {
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
        self.evm.try_flush();
        if self.shared.stop.load(Ordering::Relaxed) && self.stop_requested.is_none() {
            self.stop_requested = Some(now);
        }
        if let Some(t) = self.stop_requested {
            let timed_out = now.duration_since(t) > Duration::from_millis(self.config.end_timeout_ms);
            let sending = self.bus.iter().any(|b| b.closed.is_none() && b.conn.queued_bytes() > 0);
            if (self.core.ended().is_some() && !sending) || self.failure.is_some() || timed_out {
                if timed_out && self.core.ended().is_none() {
                    self.fail("no end of run from the EVM before the timeout".into());
                }
                self.finish(now);
                self.stopper.stop();
                return;
            }
        }
        self.publish(now);
    }

    fn finish(&mut self, now: Instant) {
        for b in &mut self.bus {
            let deadline = Instant::now() + Duration::from_secs(2);
            while b.closed.is_none() && b.conn.queued_bytes() > 0 && Instant::now() < deadline {
                b.try_flush();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let end = self.core.ended();
        let leftover = self.core.leftover();
        let c = self.core.counters().clone();
        let secs = now.duration_since(self.started).as_secs_f64();
        let summary = json!({
            "component": self.name,
            "kind": "ru",
            "id": self.config.id,
            "run": self.run,
            "last_event": end,
            "counters": c,
            "leftover_events": leftover.len(),
            "problems": self.core.problems(),
            "seconds": secs,
            "mb_per_s": c.fragment_bytes as f64 / secs.max(1e-9) / 1e6,
            "error": self.failure,
        });
        *self.shared.summary.lock().unwrap_or_else(|p| p.into_inner()) = Some(summary);
    }

    fn publish(&mut self, now: Instant) {
        let (t, frags0, bytes0) = self.last_rate;
        let dt = now.duration_since(t).as_secs_f64();
        if dt < 0.1 {
            return;
        }
        let c = self.core.counters();
        let live = json!({
            "t": now.duration_since(self.started).as_secs_f64(),
            "fragments": c.fragments,
            "fragment_bytes": c.fragment_bytes,
            "super_fragments": c.super_fragments,
            "mb_per_s": c.fragment_bytes.saturating_sub(bytes0) as f64 / dt / 1e6,
            "fragments_per_s": c.fragments.saturating_sub(frags0) as f64 / dt,
            "events_stored": self.core.events_stored(),
            "bytes_stored": self.core.bytes_stored(),
            "read_ahead_bytes": self.core.read_ahead_bytes(),
            "sequence_errors": c.sequence_errors,
            "crc_errors": c.crc_errors,
            "streams_connected": self.streams.iter().filter(|s| s.peer.is_some()).count(),
            "bus_connected": self.bus.len(),
        });
        self.last_rate = (now, c.fragments, c.fragment_bytes);
        *self.shared.live.lock().unwrap_or_else(|p| p.into_inner()) = live;
    }
}

// Tasks: 0 EVM link, 1 accept, 2 send, 3.. one per stream.
const TASK_EVM: usize = 0;
const TASK_ACCEPT: usize = 1;
const TASK_SEND: usize = 2;
const FIRST_STREAM: usize = 3;

impl Module for RuIo {
    fn tasks(&self) -> usize {
        FIRST_STREAM + self.streams.len()
    }
    fn task_name(&self, task: usize) -> String {
        match task {
            TASK_EVM => "evm".into(),
            TASK_ACCEPT => "accept".into(),
            TASK_SEND => "send".into(),
            s => format!("stream-{}", s - FIRST_STREAM),
        }
    }
    fn poll(&mut self, task: usize) -> bool {
        match task {
            TASK_EVM => self.evm.poll(),
            TASK_ACCEPT => Instant::now() >= self.next_tick,
            TASK_SEND => {
                self.core
                    .waiting_bus()
                    .any(|bu| self.core.next_ready(bu).is_some() && self.bus.iter().any(|b| b.id == bu))
                    || self.bus.iter().any(|b| b.conn.queued_bytes() > 0)
                    || self.core.rejects_waiting()
            }
            s => {
                let margin = self.config.max_fragment_bytes;
                self.core.may_read(s - FIRST_STREAM, margin)
                    && self.streams[s - FIRST_STREAM].peer.as_mut().is_some_and(|p| p.poll())
            }
        }
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        // The sockets the tasks read (not the BUs': nothing is read from them).
        self.evm.wait_fd(out);
        for p in &self.newcomers {
            p.wait_fd(out);
        }
        for (slot, s) in self.streams.iter().enumerate() {
            if let Some(p) = &s.peer
                && self.core.may_read(slot, self.config.max_fragment_bytes)
            {
                p.wait_fd(out);
            }
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            TASK_EVM => self.read_evm(),
            TASK_ACCEPT => {
                self.accept();
                self.tick(Instant::now());
            }
            TASK_SEND => self.send(),
            s => self.read_stream(s - FIRST_STREAM),
        }
        if self.failure.is_some() && self.stop_requested.is_none() {
            // Keep answering `stop` with the error; the EVM was told.
            self.publish(Instant::now());
        }
        Ok(())
    }
}
