//! The event manager (EVM, CMS paper section 3): receives the triggers, keeps the builder units
//! and their credits, assigns events to BUs, tells every RU (grouped assignments) and sends the
//! BU the trigger data. It is also the run's accountant: every triggered event ends built,
//! rejected, or lost with a reason.
//!
//! ```no_run
//! use daqflow_evb::component::Component;
//! use daqflow_evb::evm::{Evm, EvmConfig};
//! let mut evm = Evm::new("evm", EvmConfig { rus: 2, reject_fraction: 0.1, ..Default::default() });
//! let addr = evm.configure()?["listen"].as_str().unwrap().to_owned(); // RUs and BUs connect here
//! evm.start(7)?;
//! // … RUs, BUs and sources run …
//! let summary = evm.stop(None)?;
//! assert_eq!(summary["lost"], 0);
//! # let _ = addr;
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

mod core;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_engine::messages::{ControlMessage, GroupSizes, Grouper};
use daqflow_engine::{BoxError, Module, Running, Scheduler, StopHandle};
use daqflow_transport::Listener;
use daqflow_wire::Fragment;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use self::core::{Accounting, CoreConfig, EvmCore, Out};
use crate::component::{Component, State, expect_run, expect_state, live_stats, read, reported, set_paused};
use crate::link::{Peer, bind, control_options, unix_ns};
use crate::protocol::{KIND_FRAGMENT, Message, Role, Trigger};
use crate::{EvbError, Idle};

/// Where the EVM's triggers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TriggerMode {
    /// Emulated level-1 accepts: on demand (as fast as the BUs ask) or at `rate_hz`.
    #[default]
    Emulated,
    /// Trigger fragments from a source process connected with role `trigger`.
    Source,
}

/// Configuration of the EVM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvmConfig {
    /// Address RUs, BUs and a trigger source connect to (port 0: any free port).
    pub listen: String,
    /// Number of RUs in the run; assignments start once all have connected.
    pub rus: usize,
    /// Where triggers come from.
    pub trigger: TriggerMode,
    /// Emulated trigger rate in Hz; 0: as fast as the BUs ask (free-running).
    pub rate_hz: f64,
    /// Fraction of events the level-2 emulation rejects.
    pub reject_fraction: f64,
    /// Rejects per grouped reject message to the RUs (ATLAS: 10).
    pub reject_group: usize,
    /// Releases (built events) per grouped discard message to the RUs.
    pub release_group: usize,
    /// Most events in one assignment.
    pub assign_batch: u32,
    /// A smaller assignment goes out when its oldest trigger waited this long (ms).
    pub assign_timeout_ms: u64,
    /// A BU silent this long (ms) is taken for dead and its events re-assigned.
    pub bu_timeout_ms: u64,
    /// After stop, how long (ms) to wait for every event to be built.
    pub drain_timeout_ms: u64,
    /// The builder is stalled when events are in flight and none has been built (or rejected)
    /// for this long (ms) while the run is not paused: the run then fails with the reason
    /// (which BUs wait for which events). 0: never. Default 30 s.
    pub stall_timeout_ms: u64,
    /// Most triggers waiting for a BU; a trigger source is not read beyond it.
    pub max_pending: usize,
    /// Seed of the level-2 emulation.
    pub seed: u64,
    /// Idle strategy of the EVM's scheduler.
    pub idle: Idle,
}

impl Default for EvmConfig {
    fn default() -> Self {
        EvmConfig {
            listen: "127.0.0.1:0".into(),
            rus: 1,
            trigger: TriggerMode::Emulated,
            rate_hz: 0.0,
            reject_fraction: 0.0,
            reject_group: 10,
            release_group: 64,
            assign_batch: 32,
            assign_timeout_ms: 5,
            bu_timeout_ms: 3000,
            drain_timeout_ms: 10_000,
            stall_timeout_ms: 30_000,
            max_pending: 1 << 20,
            seed: 1,
            idle: Idle::Lazy,
        }
    }
}

impl EvmConfig {
    /// Range-checks every key (`docs/evb.md`, "Configuration keys"); every problem names its key.
    pub fn validate(&self) -> Result<(), EvbError> {
        let mut c = crate::component::Checks::new("evm");
        c.address("listen", &self.listen);
        c.int("rus", self.rus as u64, 1, 4096);
        c.float("rate_hz", self.rate_hz, 0.0, 1e9);
        c.float("reject_fraction", self.reject_fraction, 0.0, 1.0);
        if self.reject_fraction >= 1.0 && self.rate_hz == 0.0 && self.trigger == TriggerMode::Emulated {
            c.problem("reject_fraction", "= 1 with on-demand triggers would trigger forever");
        }
        c.int("reject_group", self.reject_group as u64, 1, 1_000_000);
        c.int("release_group", self.release_group as u64, 1, 1_000_000);
        c.int("assign_batch", self.assign_batch.into(), 1, 65_536);
        c.int("assign_timeout_ms", self.assign_timeout_ms, 0, 60_000);
        c.int("bu_timeout_ms", self.bu_timeout_ms, 1, 3_600_000);
        c.int("drain_timeout_ms", self.drain_timeout_ms, 0, 3_600_000);
        c.int("stall_timeout_ms", self.stall_timeout_ms, 0, 86_400_000);
        c.int("max_pending", self.max_pending as u64, 1, 1 << 26);
        c.finish()
    }
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    paused: AtomicBool,
    live: Mutex<Value>,
    failure: Mutex<Option<String>>,
    last_event: Mutex<Option<u64>>,
    summary: Mutex<Option<Value>>,
}

/// The EVM component.
pub struct Evm {
    name: String,
    config: EvmConfig,
    state: State,
    listener: Option<Listener>,
    shared: Arc<Shared>,
    running: Option<Running>,
    run: u32,
    bound: Option<std::net::SocketAddr>,
}

impl Evm {
    /// An EVM named `name`.
    pub fn new(name: &str, config: EvmConfig) -> Evm {
        Evm {
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

    /// The listening address, once configured.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.local_addr())
    }
}

impl Component for Evm {
    fn kind(&self) -> &'static str {
        "evm"
    }
    fn state(&self) -> State {
        reported(self.state, self.failure().is_some())
    }

    fn configure(&mut self) -> Result<Value, EvbError> {
        expect_state("configure", self.state, State::Initial)?;
        self.config.validate()?;
        let listener = bind(&self.config.listen, control_options())?;
        let addr = listener.local_addr();
        self.bound = Some(addr);
        self.listener = Some(listener);
        self.state = State::Configured;
        Ok(json!({ "listen": addr.to_string() }))
    }

    fn start(&mut self, run: u32) -> Result<(), EvbError> {
        expect_state("start", self.state, State::Configured)?;
        let listener = self.listener.take().expect("configured");
        self.shared = Arc::default();
        self.run = run;
        let mut s = Scheduler::new(format!("{}-evm", self.name)).with_idle(self.config.idle.strategy());
        let io =
            EvmIo::new(self.name.clone(), self.config.clone(), run, listener, self.shared.clone(), s.stop_handle());
        s.add_module(io);
        self.running = Some(s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?);
        self.state = State::Running;
        Ok(())
    }

    fn stop(&mut self, _arg: Option<u64>) -> Result<Value, EvbError> {
        expect_run("stop", self.state)?;
        self.shared.stop.store(true, Ordering::SeqCst);
        let running = self.running.take().expect("running");
        let joined = running.join();
        let summary = self.shared.summary.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.state = State::Initial;
        if let Err(e) = joined {
            self.state = State::Error;
            return Err(EvbError::Failed(e.to_string()));
        }
        // Rebind so that the component can be started again on the same address.
        self.configure_again()?;
        summary.ok_or_else(|| EvbError::Failed("the EVM ended without a summary".into()))
    }

    fn pause(&mut self) -> Result<(), EvbError> {
        set_paused(&mut self.state, true, Some(&self.shared.paused))
    }

    fn resume(&mut self) -> Result<(), EvbError> {
        set_paused(&mut self.state, false, Some(&self.shared.paused))
    }

    fn reset(&mut self) -> Result<(), EvbError> {
        if let Some(r) = self.running.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = r.join();
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

impl Evm {
    fn configure_again(&mut self) -> Result<(), EvbError> {
        // The same address as before (with port 0 configured, the port it got), so that peers
        // configured with it reach the next run too.
        let addr = self.bound.map_or_else(|| self.config.listen.clone(), |a| a.to_string());
        let listener = bind(&addr, control_options());
        match listener {
            Ok(l) => {
                self.listener = Some(l);
                self.state = State::Configured;
            }
            // A fixed port may still be in TIME_WAIT elsewhere; the caller can reset and retry.
            Err(_) => self.state = State::Initial,
        }
        Ok(())
    }

    /// The last event of the run, once triggering has stopped.
    pub fn last_event(&self) -> Option<u64> {
        *self.shared.last_event.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct EvmIo {
    name: String,
    config: EvmConfig,
    run: u32,
    listener: Listener,
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
    last_rate: (Instant, u64, u64),
    /// (built + rejected, when it last changed or nothing was in flight): the stall watchdog.
    progress: (u64, Instant),
    stopper: StopHandle,
}

impl EvmIo {
    fn new(
        name: String,
        config: EvmConfig,
        run: u32,
        listener: Listener,
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
            last_rate: (now, 0, 0),
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
        *self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
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
                Ok(Message::Hello { role, id, name, addr, .. }) => self.hello(i, role, id, name, addr),
                Ok(m) => self.peers[i].closed = Some(format!("sent {m:?} before hello")),
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
                    // BUs that joined before the RUs keep their place.
                    for (bu, ..) in old.bus() {
                        self.core.add_bu(bu);
                    }
                    let list = Message::RuList { run: self.run, rus: self.rus.clone() }.to_frame();
                    for p in self.peers.iter_mut().filter(|p| p.role == Some(Role::Bu)) {
                        p.send(list.clone());
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
                self.core.add_bu(id);
                if self.ready {
                    let list = Message::RuList { run: self.run, rus: self.rus.clone() }.to_frame();
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
        if self.ready {
            self.core.assign(now, &mut self.out);
        }
        // Stop: freeze triggering, then drain.
        if self.shared.stop.load(Ordering::Relaxed) && self.stop_at.is_none() {
            let last = self.core.stop();
            *self.shared.last_event.lock().unwrap_or_else(|p| p.into_inner()) = Some(last);
            self.stop_at = Some(now);
            tracing::info!(evm = %self.name, "stopping: last event {last}, draining");
        }
        if let Some(t) = self.stop_at
            && !self.done
            && (self.core.is_drained()
                || self.failure.is_some()
                || now.duration_since(t) > Duration::from_millis(self.config.drain_timeout_ms))
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
        if moved != self.progress.0 || paused || self.core.in_flight() == 0 || self.stop_at.is_some() {
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
        let secs = now.duration_since(self.started).as_secs_f64();
        let summary = json!({
            "component": self.name,
            "kind": "evm",
            "run": self.run,
            "last_event": last,
            "triggered": acc.triggered,
            "built": acc.built,
            "rejected": acc.rejected,
            "reassigned": acc.reassigned,
            "assignments": acc.assignments,
            "lost": acc.lost_total(),
            "lost_reasons": acc.lost,
            "unexpected_confirmations": acc.unexpected_confirmations,
            "seconds": secs,
            "error": self.failure,
        });
        *self.shared.summary.lock().unwrap_or_else(|p| p.into_inner()) = Some(summary);
    }

    fn publish(&mut self, now: Instant) {
        let acc = self.core.accounting();
        let (t, built0, trig0) = self.last_rate;
        let dt = now.duration_since(t).as_secs_f64();
        if dt < 0.1 {
            return;
        }
        let bus: Vec<Value> = self
            .core
            .bus()
            .map(|(id, credits, in_flight, built)| json!({"id": id, "credits": credits, "in_flight": in_flight, "built": built}))
            .collect();
        let live = json!({
            "t": now.duration_since(self.started).as_secs_f64(),
            "triggered": acc.triggered,
            "built": acc.built,
            "rejected": acc.rejected,
            "reassigned": acc.reassigned,
            "pending": self.core.pending(),
            "in_flight": self.core.in_flight(),
            "events_per_s": acc.built.saturating_sub(built0) as f64 / dt,
            "triggers_per_s": acc.triggered.saturating_sub(trig0) as f64 / dt,
            "rus_connected": self.rus.len(),
            "rus_expected": self.config.rus,
            "bus": bus,
        });
        self.last_rate = (now, acc.built, acc.triggered);
        *self.shared.live.lock().unwrap_or_else(|p| p.into_inner()) = live;
    }
}

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
