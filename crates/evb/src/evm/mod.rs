//! The event manager (EVM, CMS paper section 3): receives the triggers, keeps the builder units
//! and their credits, assigns events to BUs, tells every RU (grouped assignments) and sends the
//! BU the trigger data. It is also the run's accountant: every triggered event ends built,
//! rejected, or lost with a reason.
//!
//! Its [`Stats`] count the events triggered (`events`) and carry the run's accounting in
//! `trigger` ([`TriggerCounts`]: triggered, rejected, built, lost with the reasons, and the
//! error when the run was aborted); the [`EvmDetail`] adds assignments, re-assignments, the
//! events pending and in flight, and each BU's credits.
//!
//! ```no_run
//! use daqflow_component::Component;
//! use daqflow_evb::evm::{Evm, EvmConfig, EvmDetail};
//! let mut evm = Evm::new("evm", EvmConfig { rus: 2, reject_fraction: 0.1, ..Default::default() });
//! let addr = evm.configure()?["listen"].as_str().unwrap().to_owned(); // RUs and BUs connect here
//! evm.start(7)?;
//! // … RUs, BUs and sources run …
//! let summary = evm.stop(None)?;
//! let trigger = summary.trigger.clone().unwrap();
//! assert_eq!(trigger.lost, 0);
//! assert_eq!(summary.detail_as::<EvmDetail>().unwrap().last_event, Some(trigger.triggered));
//! # let _ = addr;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```
//!
//! In the `daqflow` binary it is the kind [`kind()`] makes: `daqflow component evm`.

mod config;
mod core;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_component::{
    Component, ComponentError, Info, Kind, Role as KindRole, Stats, TriggerCounts, Verb, parse_config,
};
use daqflow_engine::messages::{ControlMessage, GroupSizes, Grouper};
use daqflow_engine::{BoxError, Module, Running, Scheduler, StopHandle};
use daqflow_transport::Listener;
use daqflow_wire::Fragment;

pub use self::config::{EvmConfig, TriggerMode, schema};
pub use self::core::{Accounting, CoreConfig, EvmCore, Out};
use crate::EvbError;
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{Peer, bind, control_options, unix_ns};
use crate::protocol::{KIND_FRAGMENT, Message, Role, Trigger};
pub use crate::stats::{EvmBu, EvmDetail};

/// The `evm` kind: the event manager, the run's trigger and accountant. It starts first of the
/// event builder (stage 4: the BUs and RUs connect to it) and stops first of all (stage 0):
/// triggering stops, then the run drains.
pub fn kind() -> Kind {
    Kind::new(
        "evm",
        "the event manager: triggers, assigns events to builder units, accounts for every event",
        KindRole::Trigger,
        |name, t| {
            let config = checked(name, parse_config::<EvmConfig>(name, t)?, EvmConfig::validate)?;
            Ok(Box::new(Evm::new(name, config)))
        },
    )
    .schema(config::schema())
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    paused: AtomicBool,
    live: Mutex<Stats>,
    failure: Mutex<Option<String>>,
    last_event: Mutex<Option<u64>>,
    summary: Mutex<Option<Stats>>,
}

/// The EVM component.
pub struct Evm {
    name: String,
    config: EvmConfig,
    /// Bound at configure and kept until reset: the next run listens on the same address.
    listener: Option<Arc<Listener>>,
    shared: Arc<Shared>,
    running: Option<Running>,
    /// Time-stamp profiling (`profile = PATH`), set up at configure.
    profiling: Option<crate::common::Profiling>,
    /// The run under way.
    run: u32,
}

impl Evm {
    /// An EVM named `name`.
    pub fn new(name: &str, config: EvmConfig) -> Evm {
        Evm {
            name: name.into(),
            config,
            listener: None,
            shared: Arc::default(),
            running: None,
            profiling: None,
            run: 0,
        }
    }

    /// The listening address, once configured.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.local_addr())
    }

    /// The last event of the run, once triggering has stopped.
    pub fn last_event(&self) -> Option<u64> {
        read(&self.shared.last_event)
    }

    fn set_paused(&mut self, command: Verb, paused: bool) -> Result<(), ComponentError> {
        if self.running.is_none() {
            return Err(ComponentError::out_of_order(command, "no run is taken"));
        }
        self.shared.paused.store(paused, Ordering::SeqCst);
        Ok(())
    }
}

impl Component for Evm {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        self.config.validate()?;
        self.profiling =
            crate::common::Profiling::new(&self.name, self.config.profile.as_deref(), self.config.profile_stamps);
        // Configured again: the old socket is closed first, so that a fixed port is free.
        self.listener = None;
        let listener = bind(&self.config.listen, control_options())?;
        let addr = listener.local_addr();
        self.listener = Some(Arc::new(listener));
        let advertised = daqflow_transport::advertise::advertised(addr, self.config.advertise.as_deref())
            .map_err(|e| ComponentError::Config(format!("{}: {e}", self.name)))?;
        let mut info = Info::new();
        info.insert("listen".into(), advertised.into());
        Ok(info)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let Some(listener) = self.listener.clone() else {
            return Err(ComponentError::out_of_order(Verb::Start, "not configured"));
        };
        self.shared = Arc::default();
        let mut s = Scheduler::new(format!("{}-evm", self.name))
            .with_idle(self.config.idle.strategy())
            .pinned_to_cpus(crate::common::cpu_set(&self.config.io_cpus)?);
        if let Some(p) = &self.profiling {
            s = p.scheduler(s);
        }
        self.run = run;
        let io =
            EvmIo::new(self.name.clone(), self.config.clone(), run, listener, self.shared.clone(), s.stop_handle());
        s.add_module(io);
        self.running = Some(s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?);
        Ok(())
    }

    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        let Some(running) = self.running.take() else {
            return Err(ComponentError::out_of_order(Verb::Stop, "no run is taken"));
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        // The listener stays bound: the EVM is ready for the next run on the same address.
        let report = running.join().map_err(|e| EvbError::Failed(e.to_string()))?;
        if let Some(p) = &self.profiling {
            p.write(self.run, report.stamps.into_iter().collect())?;
        }
        let summary = read(&self.shared.summary);
        Ok(summary.ok_or_else(|| EvbError::Failed("the EVM ended without a summary".into()))?)
    }

    fn pause(&mut self) -> Result<(), ComponentError> {
        self.set_paused(Verb::Pause, true)
    }

    fn resume(&mut self) -> Result<(), ComponentError> {
        self.set_paused(Verb::Resume, false)
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        if let Some(r) = self.running.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = r.join();
        }
        self.listener = None;
        Ok(())
    }

    fn stats(&self) -> Stats {
        let live = read(&self.shared.live);
        // Before the first publication too, the trigger's accounting is there (all zero).
        if live.trigger.is_none() { live.with_trigger(TriggerCounts::default()) } else { live }
    }

    fn failure(&self) -> Option<String> {
        read(&self.shared.failure)
    }
}

struct EvmIo {
    name: String,
    config: EvmConfig,
    run: u32,
    listener: Arc<Listener>,
    peers: Vec<Peer>,
    core: EvmCore,
    ready: bool,
    rus: Vec<(u32, String)>,
    shared: Arc<Shared>,
    out: Vec<Out>,
    grouper: Grouper,
    started: Instant,
    next_tick: Instant,
    next_accept: Instant,
    /// (start, first event id) of the current paced stretch of emulated triggers.
    paced_from: Option<(Instant, u64)>,
    stop_at: Option<Instant>,
    done: bool,
    trigger_ended: bool,
    failure: Option<String>,
    last_publish: Instant,
    /// Rates of (triggered, built).
    rates: Rates<2>,
    /// (built + rejected, when it last changed or nothing was in flight): the stall watchdog.
    progress: (u64, Instant),
    stopper: StopHandle,
}

impl EvmIo {
    fn new(
        name: String,
        config: EvmConfig,
        run: u32,
        listener: Arc<Listener>,
        shared: Arc<Shared>,
        stopper: StopHandle,
    ) -> EvmIo {
        let core = EvmCore::new(
            CoreConfig {
                reject_fraction: config.reject_fraction,
                assign_batch: config.assign_batch,
                assign_timeout: Duration::from_millis(config.assign_timeout_ms),
                seed: config.seed,
            },
            Vec::new(),
        );
        let grouper = Grouper::new(GroupSizes {
            reject: config.reject_group.max(1),
            discard: config.release_group.max(1),
            ..GroupSizes::default()
        });
        let now = Instant::now();
        EvmIo {
            name,
            config,
            run,
            listener,
            peers: Vec::new(),
            core,
            ready: false,
            rus: Vec::new(),
            shared,
            out: Vec::new(),
            grouper,
            started: now,
            next_tick: now,
            next_accept: now,
            paced_from: None,
            stop_at: None,
            done: false,
            trigger_ended: false,
            failure: None,
            last_publish: now,
            rates: Rates::new(now),
            progress: (0, now),
            stopper,
        }
    }

    fn accept(&mut self) {
        while let Ok(Some(conn)) = self.listener.accept_timeout(Duration::ZERO) {
            self.peers.push(Peer::new(conn));
        }
    }

    fn abort(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        tracing::error!(evm = %self.name, "run aborted: {reason}");
        self.failure = Some(reason.clone());
        set(&self.shared.failure, Some(reason.clone()));
        for p in &mut self.peers {
            p.send(Message::Abort { reason: reason.clone() }.to_frame());
            p.try_flush();
        }
    }

    fn handle(&mut self, i: usize, frame: daqflow_wire::frame::Frame) {
        let now = Instant::now();
        self.peers[i].last_heard = now;
        let role = self.peers[i].role;
        if role.is_none() {
            match Message::decode(&frame) {
                Ok(Message::Hello { run, .. }) if run != self.run => {
                    let why = format!("said hello for run {run}; this is run {}", self.run);
                    tracing::warn!(evm = %self.name, "closing {}: {why}", self.peers[i].label());
                    self.peers[i].closed = Some(why);
                }
                // The EVM gives a BU its generation (in the RU list): the one in its hello is 0.
                Ok(Message::Hello { role, id, name, addr, .. }) => self.hello(i, role, id, name, addr),
                Ok(m) => self.peers[i].closed = Some(format!("sent {m:?} before hello")),
                Err(e @ crate::protocol::ProtocolError::Version { .. }) => {
                    tracing::warn!(evm = %self.name, "refusing {}: {e}", self.peers[i].conn.peer_addr());
                    self.peers[i].closed = Some(e.to_string());
                }
                Err(e) => self.peers[i].closed = Some(format!("garbage before hello: {e}")),
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
                        && let Err(e) = self.core.trigger(t, now, &mut self.out)
                    {
                        self.abort(format!("trigger source: {e}"));
                    }
                }
                Err(e) => self.abort(format!("trigger source sent a malformed fragment: {e}")),
            }
            return;
        }
        let id = self.peers[i].id;
        match (role, Message::decode(&frame)) {
            (Some(Role::Bu), Ok(Message::Request { credits, done })) => {
                self.core.request(id, credits, &done, &mut self.out);
            }
            (Some(Role::Trigger), Ok(Message::End { .. })) => self.trigger_ended = true,
            (_, Ok(Message::Abort { reason })) => {
                let label = self.peers[i].label();
                self.abort(format!("{label}: {reason}"));
            }
            (_, Ok(m)) => tracing::warn!(evm = %self.name, "ignoring {:?} from {}", m.kind(), self.peers[i].label()),
            (_, Err(e)) => {
                let label = self.peers[i].label();
                self.peers[i].closed = Some(format!("sent garbage: {e}"));
                tracing::warn!(evm = %self.name, "{label} sent garbage: {e}");
            }
        }
    }

    fn hello(&mut self, i: usize, role: Role, id: u32, name: String, addr: String) {
        let p = &mut self.peers[i];
        p.role = Some(role);
        p.id = id;
        p.name = name;
        p.addr = addr.clone();
        tracing::info!(evm = %self.name, "{} connected", p.label());
        match role {
            Role::Ru => {
                if self.rus.iter().any(|(r, _)| *r == id) || self.ready {
                    // Refused as a nobody: a second claimant, or one after the run's RU list
                    // was made, never disturbs the run.
                    let reason = if self.ready {
                        format!("the run's {} RUs are all connected; RU {id} is refused", self.config.rus)
                    } else {
                        format!("RU {id} is already connected")
                    };
                    tracing::warn!(evm = %self.name, "refusing {}: {reason}", self.peers[i].conn.peer_addr());
                    self.peers[i].role = None;
                    self.peers[i].closed = Some(reason);
                    return;
                }
                self.peers[i].conn.set_frame_limits(crate::link::limits(&[]));
                self.rus.push((id, addr));
                if self.rus.len() == self.config.rus {
                    self.rus.sort();
                    self.ready = true;
                    let ids: Vec<u32> = self.rus.iter().map(|r| r.0).collect();
                    let fresh = EvmCore::new(self.core_config(), ids);
                    let old = std::mem::replace(&mut self.core, fresh);
                    // BUs that joined before the RUs keep their place, as generation 0: none of
                    // them had the RU list, so no RU knows of them or of any that left before.
                    for (bu, ..) in old.bus() {
                        self.core.add_bu(bu);
                    }
                    for p in self.peers.iter_mut().filter(|p| p.role == Some(Role::Bu)) {
                        let generation = self.core.generation(p.id).unwrap_or(0);
                        p.send(Message::RuList { run: self.run, generation, rus: self.rus.clone() }.to_frame());
                    }
                }
            }
            Role::Bu => {
                // Taken until the predecessor is gone from the books (a closed connection is
                // removed, and its events re-assigned, by the links task).
                if self.peers.iter().enumerate().any(|(j, p)| j != i && p.role == Some(Role::Bu) && p.id == id) {
                    // Never replaces the live BU. A successor racing its predecessor's
                    // departure waits (as a nobody: nothing of it is read, its leaving is not the
                    // live BU leaving) until the id is free, at most `bu_timeout_ms`.
                    let p = &mut self.peers[i];
                    p.role = None;
                    if p.waiting.is_none() {
                        tracing::info!(evm = %self.name, "BU {id} ({}) waits: BU {id} is still connected", p.conn.peer_addr());
                        p.waiting = Some(Instant::now());
                    }
                    return;
                }
                self.peers[i].waiting = None;
                // Requests carry the events a BU confirms: as many as its credits allow.
                self.peers[i].conn.set_frame_limits(crate::link::limits(&[(crate::protocol::KIND_REQUEST, 64 << 20)]));
                let generation = self.core.add_bu(id);
                if self.ready {
                    let list = Message::RuList { run: self.run, generation, rus: self.rus.clone() }.to_frame();
                    self.peers[i].send(list);
                }
            }
            Role::Trigger => {
                if self.config.trigger != TriggerMode::Source {
                    self.peers[i].role = None;
                    self.peers[i].closed = Some("this EVM emulates its triggers; no trigger source wanted".into());
                } else if self.peers.iter().enumerate().any(|(j, p)| j != i && p.role == Some(Role::Trigger)) {
                    self.peers[i].role = None;
                    self.peers[i].closed = Some("a trigger source is already connected".into());
                } else {
                    self.peers[i].conn.set_frame_limits(crate::link::limits(&[]));
                }
            }
            Role::Source => {
                self.peers[i].role = None;
                self.peers[i].closed = Some("sources connect to RUs, not to the EVM".into());
            }
        }
    }

    /// BU hellos that waited for their id: admitted once it is free, refused after
    /// `bu_timeout_ms`.
    fn admit_waiting(&mut self, now: Instant) {
        for i in 0..self.peers.len() {
            let Some(since) = self.peers[i].waiting else { continue };
            let id = self.peers[i].id;
            let taken = self.peers.iter().any(|p| p.role == Some(Role::Bu) && p.id == id);
            if !taken {
                let (name, addr) = (self.peers[i].name.clone(), self.peers[i].addr.clone());
                self.hello(i, Role::Bu, id, name, addr);
            } else if now.duration_since(since) > Duration::from_millis(self.config.bu_timeout_ms) {
                tracing::warn!(evm = %self.name, "refusing a second BU {id} ({})", self.peers[i].conn.peer_addr());
                self.peers[i].waiting = None;
                self.peers[i].closed = Some(format!("BU {id} is already connected"));
            }
        }
    }

    fn core_config(&self) -> CoreConfig {
        CoreConfig {
            reject_fraction: self.config.reject_fraction,
            assign_batch: self.config.assign_batch,
            assign_timeout: Duration::from_millis(self.config.assign_timeout_ms),
            seed: self.config.seed,
        }
    }

    fn closed(&mut self, i: usize) {
        let p = self.peers.remove(i);
        let why = p.closed.clone().unwrap_or_default();
        match p.role {
            Some(Role::Bu) if !self.ready => {
                // Before the RU list no BU has it, and no RU has heard of any BU: nobody is told
                // (a BU gone now would reach only the RUs connected so far, and put their count
                // of the id's generations out of step with the others'). The core is replaced
                // once every RU is there; the generations start then.
                tracing::warn!(evm = %self.name, "{} lost before the run's RUs were all there ({why})", p.label());
                self.core.remove_bu(p.id, Instant::now(), &mut Vec::new());
            }
            Some(Role::Bu) => {
                tracing::warn!(evm = %self.name, "{} lost ({why}): re-assigning its events", p.label());
                self.core.remove_bu(p.id, Instant::now(), &mut self.out);
            }
            Some(Role::Ru) if !self.done => self.abort(format!("{} lost: {why}", p.label())),
            Some(Role::Trigger) if !self.trigger_ended && !self.done => {
                self.abort(format!("trigger source lost: {why}"));
            }
            _ => tracing::debug!(evm = %self.name, "{} went away ({why})", p.label()),
        }
    }

    fn send_out(&mut self) {
        for o in std::mem::take(&mut self.out) {
            match o {
                Out::Bu(bu, m) => {
                    let frame = m.to_frame();
                    if let Some(p) = self.peers.iter_mut().find(|p| p.role == Some(Role::Bu) && p.id == bu) {
                        p.send(frame);
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

    fn send_to_rus(&mut self, frame: daqflow_wire::frame::Frame) {
        for p in self.peers.iter_mut().filter(|p| p.role == Some(Role::Ru)) {
            p.send(frame.clone());
        }
    }

    fn tick(&mut self, now: Instant) {
        self.admit_waiting(now);
        // Stuck BUs: silent too long.
        let timeout = Duration::from_millis(self.config.bu_timeout_ms);
        for p in &mut self.peers {
            if p.role == Some(Role::Bu) && p.closed.is_none() && now.duration_since(p.last_heard) > timeout {
                p.closed = Some(format!("silent for {} ms", now.duration_since(p.last_heard).as_millis()));
            }
        }
        // Emulated triggers.
        let paused = self.shared.paused.load(Ordering::Relaxed);
        if paused {
            self.paced_from = None;
        }
        self.watch_progress(now, paused);
        let probes = &*crate::common::PROBES;
        probes.evm_trigger.enter();
        if self.ready && self.config.trigger == TriggerMode::Emulated && self.core.stopped_at().is_none() && !paused {
            let ts = unix_ns();
            if self.config.rate_hz > 0.0 {
                // Paced from when triggering (re)started: no burst after a pause or a late RU.
                let (t0, id0) = *self.paced_from.get_or_insert((now, self.core.next_event_id()));
                let due = id0 - 1 + (now.duration_since(t0).as_secs_f64() * self.config.rate_hz) as u64;
                while self.core.next_event_id() <= due && self.core.pending() < self.config.max_pending {
                    let t = Trigger { event_id: self.core.next_event_id(), trigger_type: 1, flags: 0, timestamp: ts };
                    let _ = self.core.trigger(t, now, &mut self.out);
                }
            } else {
                self.core.trigger_on_demand(now, ts, self.config.max_pending, &mut self.out);
            }
        }
        probes.evm_trigger.exit();
        if self.ready {
            crate::common::stamped(&probes.evm_assign, || self.core.assign(now, &mut self.out));
        }
        // Stop: freeze triggering, then drain.
        if self.shared.stop.load(Ordering::Relaxed) && self.stop_at.is_none() {
            let last = self.core.stop();
            set(&self.shared.last_event, Some(last));
            self.stop_at = Some(now);
            tracing::info!(evm = %self.name, "stopping: last event {last}, draining");
        }
        // The drain ends when every event is built, or when none has been built for the drain
        // timeout: paced sources may still be producing the events triggered ahead of them (up
        // to the BUs' credits), which takes as long as it takes at their rate.
        if let Some(t) = self.stop_at
            && !self.done
            && (self.core.is_drained()
                || self.failure.is_some()
                || now.duration_since(t.max(self.progress.1)) > Duration::from_millis(self.config.drain_timeout_ms))
        {
            self.finish(now);
        }
        self.send_out();
        if now >= self.next_tick {
            for f in self.grouper.flush() {
                self.send_to_rus(f);
            }
            self.publish(now);
            self.next_tick = now + Duration::from_millis(1);
        }
        for p in &mut self.peers {
            p.try_flush();
        }
    }

    /// Fails the run when events are in flight and none was built or rejected for the stall
    /// timeout while running: a builder that stopped making progress says so instead of
    /// looking busy for ever.
    fn watch_progress(&mut self, now: Instant, paused: bool) {
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
        if moved != self.progress.0 || paused || self.core.in_flight() == 0 {
            self.progress = (moved, now);
            return;
        }
        let limit = self.config.stall_timeout_ms;
        if limit == 0 || now.duration_since(self.progress.1) < Duration::from_millis(limit) || self.failure.is_some() {
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
            limit as f64 / 1000.0,
            self.core.in_flight(),
            waiting.join(", ")
        ));
    }

    fn finish(&mut self, now: Instant) {
        self.done = true;
        let acc = self.core.finish();
        let last = self.core.stopped_at().unwrap_or(0);
        self.send_out();
        for f in self.grouper.flush() {
            self.send_to_rus(f);
        }
        let end = Message::RunEnd { last_event: last }.to_frame();
        for p in &mut self.peers {
            if matches!(p.role, Some(Role::Ru | Role::Bu)) {
                p.send(end.clone());
            }
        }
        for p in &mut self.peers {
            let deadline = Instant::now() + Duration::from_secs(2);
            while p.closed.is_none() && p.conn.queued_bytes() > 0 && Instant::now() < deadline {
                p.try_flush();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let seconds = now.duration_since(self.started).as_secs_f64();
        let detail = self.detail(seconds, per_second(acc.built, seconds));
        let summary = Stats::counted(acc.triggered, 0)
            .with_rates(per_second(acc.triggered, seconds), 0.0)
            .with_trigger(self.trigger_counts(&acc))
            .with_detail(&detail);
        set(&self.shared.summary, Some(summary));
        // Nothing moves any more: the live counters are the run's last, their rates 0 (not the
        // last second's, for ever).
        let live = Stats::counted(acc.triggered, 0)
            .with_trigger(self.trigger_counts(&acc))
            .with_detail(&self.detail(seconds, 0.0));
        set(&self.shared.live, live);
    }

    /// The run's accounting so far (at the end: final, with what was lost).
    fn trigger_counts(&self, acc: &Accounting) -> TriggerCounts {
        TriggerCounts {
            triggered: acc.triggered,
            rejected: acc.rejected,
            built: acc.built,
            lost: acc.lost_total(),
            lost_reasons: acc.lost.clone(),
            error: self.failure.clone(),
        }
    }

    fn detail(&self, seconds: f64, built_per_s: f64) -> EvmDetail {
        let acc = self.core.accounting();
        EvmDetail {
            run: self.run,
            seconds,
            last_event: self.core.stopped_at(),
            assignments: acc.assignments,
            reassigned: acc.reassigned,
            unexpected_confirmations: acc.unexpected_confirmations,
            pending: self.core.pending(),
            in_flight: self.core.in_flight(),
            built_per_s,
            rus_connected: self.rus.len(),
            rus_expected: self.config.rus,
            bus: self
                .core
                .bus()
                .map(|(id, credits, in_flight, built)| EvmBu { id, credits, in_flight, built })
                .collect(),
        }
    }

    fn publish(&mut self, now: Instant) {
        if now.duration_since(self.last_publish) < PUBLISH_EVERY {
            return;
        }
        self.last_publish = now;
        let acc = self.core.accounting().clone();
        let [triggers_per_s, built_per_s] = self.rates.sample(now, [acc.triggered, acc.built]);
        let detail = self.detail(now.duration_since(self.started).as_secs_f64(), built_per_s);
        let live = Stats::counted(acc.triggered, 0)
            .with_rates(triggers_per_s, 0.0)
            .with_trigger(self.trigger_counts(&acc))
            .with_detail(&detail);
        set(&self.shared.live, live);
    }
}

/// The live counters are published at most this often.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

const TASK_ACCEPT: usize = 0;
const TASK_LINKS: usize = 1;
const TASK_TICK: usize = 2;

impl Module for EvmIo {
    fn tasks(&self) -> usize {
        3
    }
    fn task_name(&self, task: usize) -> String {
        ["accept", "links", "tick"][task].into()
    }
    fn poll(&mut self, task: usize) -> bool {
        match task {
            TASK_ACCEPT => !self.done && Instant::now() >= self.next_accept,
            TASK_LINKS => {
                let max_pending = self.config.max_pending;
                let pending = self.core.pending();
                self.peers.iter_mut().any(|p| {
                    if p.waiting.is_some()
                        || p.role == Some(Role::Trigger)
                            && (pending >= max_pending || self.shared.paused.load(Ordering::Relaxed))
                    {
                        return false;
                    }
                    p.poll()
                })
            }
            _ => self.done || Instant::now() >= self.next_tick || !self.out.is_empty(),
        }
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        let held = self.core.pending() >= self.config.max_pending || self.shared.paused.load(Ordering::Relaxed);
        for p in &self.peers {
            // Triggers held back and hellos waiting stay unread: waiting on them would end every
            // park at once.
            if !(p.role == Some(Role::Trigger) && held) && p.waiting.is_none() {
                p.wait_fd(out);
            }
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            TASK_ACCEPT => {
                self.accept();
                self.next_accept = Instant::now() + Duration::from_millis(2);
                Ok(())
            }
            TASK_LINKS => {
                for _ in 0..64 {
                    let mut any = false;
                    for i in 0..self.peers.len() {
                        // Triggers wait until every RU is there (the run's RU list is known).
                        let hold = self.peers[i].role == Some(Role::Trigger)
                            && (!self.ready || self.core.pending() >= self.config.max_pending);
                        if (hold || self.peers[i].waiting.is_some()) && self.peers[i].stash.is_none() {
                            continue;
                        }
                        if let Some(f) = self.peers[i].next() {
                            any = true;
                            self.handle(i, f);
                        }
                    }
                    if !any {
                        break;
                    }
                }
                let mut i = 0;
                while i < self.peers.len() {
                    if self.peers[i].closed.is_some() && self.peers[i].stash.is_none() {
                        self.closed(i);
                    } else {
                        i += 1;
                    }
                }
                self.tick(Instant::now());
                Ok(())
            }
            TASK_TICK => {
                if self.done {
                    self.stopper.stop();
                    return Ok(());
                }
                self.tick(Instant::now());
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
