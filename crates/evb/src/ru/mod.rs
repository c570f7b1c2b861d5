//! The readout unit (RU): one input task per source stream storing fragments in the engine's
//! event manager (without copying them), a task for the EVM's assignments, releases and
//! rejects, and a task that sends each BU the super-fragments of its events, from the memory the
//! fragments were received into. Runs on one engine scheduler.
//!
//! Its [`Stats`] count the super-fragments sent to BUs (`events`: one per event built) and
//! their bytes; the [`RuDetail`] adds the fragments received, the stream checks (sequence and
//! CRC errors), what is stored, and at the end the events left over.
//!
//! ```no_run
//! use daqflow_component::Component;
//! use daqflow_evb::ru::{Ru, RuConfig, RuDetail};
//! let mut ru = Ru::new("ru-0", RuConfig { id: 0, evm: "127.0.0.1:7100".into(), streams: 8, ..Default::default() });
//! let addr = ru.configure()?["listen"].as_str().unwrap().to_owned(); // sources and BUs connect here
//! ru.start(1)?;
//! // … the run …
//! let summary = ru.stop(None)?;
//! let detail: RuDetail = summary.detail_as().unwrap();
//! assert_eq!((detail.leftover_events, detail.counters.sequence_errors), (Some(0), 0));
//! # let _ = addr;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```
//!
//! In the `daqflow` binary it is the kind [`kind()`] makes: `daqflow component ru`.

mod config;
mod core;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_component::{Component, ComponentError, Info, Kind, Role as KindRole, Stats, Verb, parse_config};
use daqflow_engine::messages::{self, MessageKind};
use daqflow_engine::{BoxError, Module, Running, Scheduler, StopHandle};
use daqflow_transport::{Connection, Listener};

pub use self::config::{RuConfig, schema};
pub use self::core::{BuAdmission, OutgoingSf, RuCore, RuCounters};
use crate::EvbError;
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{Peer, bind, connect, control_options, ru_data_options};
use crate::protocol::{KIND_END, KIND_FRAGMENT, KIND_SUPER_FRAGMENT, Message, Role};
pub use crate::stats::RuDetail;

/// The `ru` kind: a readout unit. It starts after the EVM and the BUs (stage 6), before its
/// sources, and stops after the sources (stage 2).
pub fn kind() -> Kind {
    Kind::new(
        "ru",
        "a readout unit: stores its streams' fragments, sends builder units the super-fragments",
        KindRole::Readout,
        |name, t| {
            let config = checked(name, parse_config::<RuConfig>(name, t)?, RuConfig::validate)?;
            Ok(Box::new(Ru::new(name, config)))
        },
    )
    .schema(config::schema())
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    live: Mutex<Stats>,
    failure: Mutex<Option<String>>,
    summary: Mutex<Option<Stats>>,
}

/// The readout unit component.
pub struct Ru {
    name: String,
    config: RuConfig,
    /// Bound at configure and kept until reset: the next run listens on the same address.
    listener: Option<Arc<Listener>>,
    shared: Arc<Shared>,
    running: Option<Running>,
    /// Where it listened: configured again, it listens there again (with port 0 configured,
    /// on the port it got), so that sources and BUs configured with it reach it.
    bound: Option<std::net::SocketAddr>,
    /// The address told to the EVM (and through it the BUs) and answered at configure.
    advertised: Option<String>,
    /// Time-stamp profiling (`profile = PATH`), set up at configure.
    profiling: Option<crate::common::Profiling>,
    /// The run under way.
    run: u32,
}

impl Ru {
    /// A readout unit named `name`.
    pub fn new(name: &str, config: RuConfig) -> Ru {
        Ru {
            name: name.into(),
            config,
            listener: None,
            shared: Arc::default(),
            running: None,
            bound: None,
            advertised: None,
            profiling: None,
            run: 0,
        }
    }

    /// The listening address, once configured.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.local_addr())
    }
}

impl Component for Ru {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        // send_queue_bytes at most 16 MiB: above the data link's own queue, a send could wait
        // inside the RU's only thread.
        self.config.validate()?;
        self.profiling =
            crate::common::Profiling::new(&self.name, self.config.profile.as_deref(), self.config.profile_stamps);
        self.listener = None;
        let want = self.bound.map_or_else(|| self.config.listen.clone(), |a| a.to_string());
        let listener = bind(&want, ru_data_options())?;
        let addr = listener.local_addr();
        self.bound = Some(addr);
        self.listener = Some(Arc::new(listener));
        let advertised = daqflow_transport::advertise::advertised(addr, self.config.advertise.as_deref())
            .map_err(|e| ComponentError::Config(format!("{}: {e}", self.name)))?;
        self.advertised = Some(advertised.clone());
        let mut info = Info::new();
        info.insert("listen".into(), advertised.into());
        Ok(info)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let Some(listener) = self.listener.clone() else {
            return Err(ComponentError::out_of_order(Verb::Start, "not configured"));
        };
        let hello = Message::Hello {
            role: Role::Ru,
            id: self.config.id,
            run,
            name: self.name.clone(),
            addr: self.advertised.clone().unwrap_or_else(|| listener.local_addr().to_string()),
            generation: 0,
        };
        let evm = connect(
            &self.config.evm,
            &control_options(),
            Duration::from_millis(self.config.connect_timeout_ms),
            &hello,
        )?;
        self.shared = Arc::default();
        let mut s = Scheduler::new(format!("{}-ru", self.name))
            .with_idle(self.config.idle.strategy())
            .pinned_to_cpus(crate::common::cpu_set(&self.config.io_cpus)?);
        if let Some(p) = &self.profiling {
            s = p.scheduler(s);
        }
        self.run = run;
        let io =
            RuIo::new(self.name.clone(), self.config.clone(), run, listener, evm, self.shared.clone(), s.stop_handle());
        s.add_module(io);
        self.running = Some(s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?);
        Ok(())
    }

    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        let Some(running) = self.running.take() else {
            return Err(ComponentError::out_of_order(Verb::Stop, "no run is taken"));
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        // The listener stays bound: the RU is ready for the next run on the same address.
        let report = running.join().map_err(|e| EvbError::Failed(e.to_string()))?;
        if let Some(p) = &self.profiling {
            p.write(self.run, report.stamps.into_iter().collect())?;
        }
        let summary = read(&self.shared.summary);
        Ok(summary.ok_or_else(|| EvbError::Failed("the RU ended without a summary".into()))?)
    }

    // Pause and resume: RUs and BUs follow the data, nothing to hold back.

    fn reset(&mut self) -> Result<(), ComponentError> {
        if let Some(r) = self.running.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = r.stop();
        }
        self.listener = None;
        Ok(())
    }

    fn stats(&self) -> Stats {
        read(&self.shared.live)
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
    listener: Arc<Listener>,
    evm: Peer,
    /// Accepted connections that have not said hello yet.
    newcomers: Vec<Peer>,
    /// BUs whose connection is held: an earlier generation of their id is not gone yet, or a
    /// live connection has their id and generation.
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
    last_publish: Instant,
    /// Rates of (super-fragments, their bytes, fragments, their bytes).
    rates: Rates<4>,
}

impl RuIo {
    fn new(
        name: String,
        config: RuConfig,
        run: u32,
        listener: Arc<Listener>,
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
            last_publish: now,
            rates: Rates::new(now),
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
                Ok(Message::Hello { role: Role::Bu, id, name, generation, .. }) => {
                    p.id = id;
                    p.name = name;
                    p.generation = generation;
                    p.waiting = Some(Instant::now());
                    match self.bu_admission(&p) {
                        Hold::Take => self.take_bu(p),
                        Hold::Keep(why) => {
                            tracing::info!(ru = %self.name, "BU {id} generation {generation} ({}) waits: {why}", bu_label(&p));
                            self.waiting_bus.push(p);
                        }
                        Hold::Close(why) => {
                            tracing::warn!(ru = %self.name, "refusing BU {id} generation {generation} ({}): {why}", bu_label(&p))
                        }
                    }
                }
                Ok(m) => tracing::warn!(ru = %self.name, "closing {}: {:?} instead of hello", p.label(), m.kind()),
                Err(e) => tracing::warn!(ru = %self.name, "closing {}: {e}", p.label()),
            }
        }
    }

    /// What to do with BU connection `p` now, by the generation rule (`docs/evb.md`, "Builder
    /// unit generations"): take it once every earlier generation of its id is gone, refuse a
    /// generation that is gone; hold it while an earlier one is not gone yet (its BU gone is on
    /// its way from the EVM) or while a live connection has its id and generation (a second
    /// claimant never takes the live one's super-fragments; a dead one is replaced) — held at
    /// most `connect_timeout_ms`, then closed.
    fn bu_admission(&mut self, p: &Peer) -> Hold {
        let (id, generation) = (p.id, p.generation);
        let held = p.waiting.map_or(Duration::ZERO, |t| t.elapsed());
        let patience = Duration::from_millis(self.config.connect_timeout_ms);
        let keep = |why: String| {
            if held > patience {
                Hold::Close(format!("{why}, still after {} ms (ru.connect_timeout_ms)", patience.as_millis()))
            } else {
                Hold::Keep(why)
            }
        };
        match self.core.bu_admission(id, generation) {
            BuAdmission::Refuse { gone } => Hold::Close(format!(
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
            BuAdmission::Take if self.bus.iter_mut().any(|b| b.id == id && b.alive()) => {
                keep(format!("BU {id} generation {generation} is connected"))
            }
            BuAdmission::Take => Hold::Take,
        }
    }

    /// Takes BU connection `p`: the RU sends it the id's queue from now on. A dead connection
    /// with its id (and generation) is replaced.
    fn take_bu(&mut self, mut p: Peer) {
        p.waiting = None;
        p.role = Some(Role::Bu);
        p.conn.set_frame_limits(crate::link::limits(&[]));
        tracing::info!(ru = %self.name, "BU {} generation {} connected", p.id, p.generation);
        let id = p.id;
        self.bus.retain(|b| b.id != id);
        self.bus.push(p);
    }

    /// Held BU connections: taken, refused, or held on by [`RuIo::bu_admission`]; forgotten
    /// when the BU closed them.
    fn admit_waiting_bus(&mut self) {
        for mut p in std::mem::take(&mut self.waiting_bus) {
            if !p.alive() {
                tracing::info!(
                    ru = %self.name,
                    "BU {} generation {} ({}) went away while held",
                    p.id,
                    p.generation,
                    bu_label(&p)
                );
                continue;
            }
            match self.bu_admission(&p) {
                Hold::Keep(_) => self.waiting_bus.push(p),
                Hold::Take => self.take_bu(p),
                Hold::Close(why) => tracing::warn!(
                    ru = %self.name,
                    "refusing BU {} generation {} ({}): {why}",
                    p.id,
                    p.generation,
                    bu_label(&p)
                ),
            }
        }
    }

    fn read_evm(&mut self) {
        let mut gone = false;
        while let Some(frame) = self.evm.next() {
            match frame.kind {
                messages::KIND_DISCARD | messages::KIND_REJECT => match messages::decode(&frame) {
                    Ok(g) if g.kind() == MessageKind::Discard => self.core.release(g.event_ids()),
                    Ok(g) => self.core.reject(g.event_ids()),
                    Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
                },
                _ => match Message::decode(&frame) {
                    Ok(Message::Assign { bu, events }) => self.core.assign(bu, events),
                    Ok(Message::BuGone { bu, generation }) => {
                        if self.core.bu_gone(bu, generation) {
                            // Only that generation's connection (a successor is taken only after
                            // this); a successor held meanwhile may be taken now.
                            self.bus.retain(|b| b.id != bu || b.generation > generation);
                            gone = true;
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
        if gone {
            self.admit_waiting_bus();
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
                let probes = &*crate::common::PROBES;
                let header = crate::common::stamped(&probes.ru_assemble, || self.core.next_into(bu, &mut self.scratch))
                    .expect("next_ready said so");
                let scratch = &self.scratch;
                if !crate::common::stamped(&probes.ru_send, || {
                    peer.send_parts(KIND_SUPER_FRAGMENT, &header.encode(), scratch)
                }) {
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
        let c = self.core.counters().clone();
        let seconds = now.duration_since(self.started).as_secs_f64();
        // What is stored at the end (before it is freed), and how many events that is.
        let mut detail =
            self.detail(seconds, per_second(c.fragments, seconds), per_second(c.fragment_bytes, seconds) / 1e6);
        detail.leftover_events = Some(self.core.leftover().len());
        let summary = Stats::counted(c.super_fragments, c.super_fragment_bytes)
            .with_rates(per_second(c.super_fragments, seconds), per_second(c.super_fragment_bytes, seconds) / 1e6)
            .with_detail(&detail);
        set(&self.shared.summary, Some(summary));
        // Nothing moves any more: the live counters are the run's last, their rates 0 (not the
        // last second's, for ever).
        let live =
            Stats::counted(c.super_fragments, c.super_fragment_bytes).with_detail(&self.detail(seconds, 0.0, 0.0));
        set(&self.shared.live, live);
    }

    fn detail(&self, seconds: f64, fragments_per_s: f64, fragment_mb_per_s: f64) -> RuDetail {
        RuDetail {
            id: self.config.id,
            run: self.run,
            seconds,
            last_event: self.core.ended(),
            counters: self.core.counters().clone(),
            fragments_per_s,
            fragment_mb_per_s,
            events_stored: self.core.events_stored(),
            bytes_stored: self.core.bytes_stored(),
            read_ahead_bytes: self.core.read_ahead_bytes(),
            streams_connected: self.streams.iter().filter(|s| s.peer.is_some()).count(),
            bus_connected: self.bus.len(),
            bus_held: self.waiting_bus.len(),
            leftover_events: None,
            problems: self.core.problems().to_vec(),
            error: self.failure.clone(),
        }
    }

    fn publish(&mut self, now: Instant) {
        if now.duration_since(self.last_publish) < PUBLISH_EVERY {
            return;
        }
        self.last_publish = now;
        let c = self.core.counters();
        let counts = [c.super_fragments, c.super_fragment_bytes, c.fragments, c.fragment_bytes];
        let [sf_per_s, sf_bytes_per_s, fragments_per_s, fragment_bytes_per_s] = self.rates.sample(now, counts);
        let detail =
            self.detail(now.duration_since(self.started).as_secs_f64(), fragments_per_s, fragment_bytes_per_s / 1e6);
        let live = Stats::counted(counts[0], counts[1]).with_rates(sf_per_s, sf_bytes_per_s / 1e6).with_detail(&detail);
        set(&self.shared.live, live);
    }
}

/// What an RU does with a BU connection now ([`RuIo::bu_admission`]).
enum Hold {
    /// Take it.
    Take,
    /// Keep holding it, for this reason.
    Keep(String),
    /// Close it, for this reason.
    Close(String),
}

/// A BU connection in the log: its name and address.
fn bu_label(p: &Peer) -> String {
    format!("{}, {}", p.name, p.conn.peer_addr())
}

/// The live counters are published at most this often.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

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
            s => crate::common::stamped(&crate::common::PROBES.ru_receive, || self.read_stream(s - FIRST_STREAM)),
        }
        if self.failure.is_some() && self.stop_requested.is_none() {
            // Keep answering `stop` with the error; the EVM was told.
            self.publish(Instant::now());
        }
        Ok(())
    }
}
