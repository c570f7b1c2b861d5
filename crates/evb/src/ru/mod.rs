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
mod machine;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use daqflow_component::{Component, ComponentError, Info, Kind, Role as KindRole, Stats, Verb, parse_config};
use daqflow_engine::{BoxError, Module, StopHandle};
use daqflow_transport::{Connection, Listener};

pub use self::config::{RuConfig, schema};
pub use self::core::{BuAdmission, OutgoingSf, RuCore, RuCounters};
pub use self::machine::{ConnId, RuMachine, RuOutput, RuStep, STUCK_TIMEOUT};
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{Peer, bind, connect, control_options, ru_data_options};
use crate::protocol::{KIND_SUPER_FRAGMENT, Message, Role};
pub use crate::stats::RuDetail;
use crate::unit::{RunShared, Unit};

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

/// What a run of the RU shares: every unit's (nothing of its own).
type Shared = RunShared<()>;

/// The readout unit component.
pub struct Ru {
    config: RuConfig,
    /// Bound at configure and kept until reset: the next run listens on the same address.
    listener: Option<Arc<Listener>>,
    /// Where it listened: configured again, it listens there again (with port 0 configured,
    /// on the port it got), so that sources and BUs configured with it reach it.
    bound: Option<std::net::SocketAddr>,
    /// The address told to the EVM (and through it the BUs) and answered at configure.
    advertised: Option<String>,
    unit: Unit<()>,
}

impl Ru {
    /// A readout unit named `name`.
    pub fn new(name: &str, config: RuConfig) -> Ru {
        Ru { config, listener: None, bound: None, advertised: None, unit: Unit::new(name) }
    }

    /// The listening address, once configured.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.local_addr())
    }

    fn name(&self) -> &str {
        self.unit.name()
    }
}

impl Component for Ru {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        // send_queue_bytes at most 16 MiB: above the data link's own queue, a send could wait
        // inside the RU's only thread.
        self.config.validate()?;
        self.unit.profile(self.config.profile.as_deref(), self.config.profile_stamps);
        self.listener = None;
        let want = self.bound.map_or_else(|| self.config.listen.clone(), |a| a.to_string());
        let listener = bind(&want, ru_data_options())?;
        let addr = listener.local_addr();
        self.bound = Some(addr);
        self.listener = Some(Arc::new(listener));
        let advertised = daqflow_transport::advertise::advertised(addr, self.config.advertise.as_deref())
            .map_err(|e| ComponentError::Config(format!("{}: {e}", self.name())))?;
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
            name: self.name().to_owned(),
            addr: self.advertised.clone().unwrap_or_else(|| listener.local_addr().to_string()),
            generation: 0,
        };
        let evm = connect(
            &self.config.evm,
            &control_options(),
            Duration::from_millis(self.config.connect_timeout_ms),
            &hello,
        )?;
        let shared = self.unit.begin(run, ());
        let mut s = self.unit.scheduler("ru", self.config.idle.strategy(), &self.config.io_cpus)?;
        let io = RuIo::new(self.name().to_owned(), self.config.clone(), run, listener, evm, shared, s.stop_handle());
        s.add_module(io);
        self.unit.spawn(s)
    }

    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        // The listener stays bound: the RU is ready for the next run on the same address.
        self.unit.stop(|_| Vec::new())
    }

    // Pause and resume: RUs and BUs follow the data, nothing to hold back.

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.unit.reset(false);
        self.listener = None;
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.unit.live()
    }

    fn failure(&self) -> Option<String> {
        self.unit.failure()
    }
}

/// The RU's I/O: the listener, the link to the EVM, the streams' and the BUs' connections,
/// around the [`RuMachine`] that makes every decision.
struct RuIo {
    name: String,
    config: RuConfig,
    run: u32,
    listener: Arc<Listener>,
    evm: Peer,
    next_conn: u64,
    /// Accepted connections that have not said hello yet.
    newcomers: Vec<(ConnId, Peer)>,
    /// BU connections the machine holds.
    held: Vec<(ConnId, Peer)>,
    /// Each stream's source connection.
    streams: Vec<Option<(ConnId, Peer)>>,
    /// The BUs' connections: (BU id, connection).
    bus: Vec<(u32, ConnId, Peer)>,
    machine: RuMachine,
    shared: Arc<Shared>,
    stopper: StopHandle,
    started: Instant,
    next_tick: Instant,
    /// The fragments of the super-fragment being sent (reused).
    scratch: Vec<bytes::Bytes>,
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
        let now = Instant::now();
        let mut evm = Peer::new(evm);
        evm.role = Some(Role::Ru);
        RuIo {
            machine: RuMachine::new(&config, run, &name, now),
            streams: (0..config.streams).map(|_| None).collect(),
            name,
            config,
            run,
            listener,
            evm,
            next_conn: 0,
            newcomers: Vec::new(),
            held: Vec::new(),
            bus: Vec::new(),
            shared,
            stopper,
            started: now,
            next_tick: now,
            scratch: Vec::with_capacity(64),
            last_publish: now,
            rates: Rates::new(now),
        }
    }

    /// Does what the machine asks, in order; `pool` holds connections that said hello and
    /// wait for the machine's word (those it holds go to `held`, the rest are dropped).
    fn act(&mut self, mut pool: Vec<(ConnId, Peer)>) {
        while let Some(o) = self.machine.next_output() {
            match o {
                RuOutput::ToEvm(m) => {
                    self.evm.send(m.to_frame());
                    self.evm.try_flush();
                }
                RuOutput::TakeStream { conn, slot, limits } => {
                    if let Some(mut p) = take(&mut pool, conn) {
                        p.role = Some(Role::Source);
                        p.conn.set_frame_limits(limits);
                        self.streams[slot] = Some((conn, p));
                    }
                }
                RuOutput::TakeBu { conn, bu, limits } => {
                    if let Some(mut p) = take(&mut pool, conn).or_else(|| take(&mut self.held, conn)) {
                        p.role = Some(Role::Bu);
                        p.id = bu;
                        p.conn.set_frame_limits(limits);
                        self.bus.push((bu, conn, p));
                    }
                }
                RuOutput::Close(conn, why) => {
                    let gone = take(&mut pool, conn)
                        .or_else(|| take(&mut self.held, conn))
                        .or_else(|| self.bus.iter().position(|b| b.1 == conn).map(|k| self.bus.remove(k).2))
                        .or_else(|| {
                            let slot = self.streams.iter().position(|s| s.as_ref().is_some_and(|(c, _)| *c == conn))?;
                            self.streams[slot].take().map(|(_, p)| p)
                        });
                    if let Some(p) = gone {
                        tracing::debug!(ru = %self.name, "closing {}: {why}", p.label());
                    }
                }
            }
        }
        for (conn, p) in pool {
            if self.machine.is_held(conn) {
                self.held.push((conn, p));
            }
        }
        if let Some(f) = self.machine.failure()
            && read(&self.shared.failure).is_none()
        {
            set(&self.shared.failure, Some(f.to_owned()));
        }
    }

    fn accept(&mut self) {
        while let Ok(Some(conn)) = self.listener.accept_timeout(Duration::ZERO) {
            self.next_conn += 1;
            self.newcomers.push((ConnId(self.next_conn), Peer::new(conn)));
        }
        let now = Instant::now();
        // Connections that went away: a BU's (taken or held) is forgotten; a dead BU
        // connection with an id never keeps its successor out.
        let mut k = 0;
        while k < self.held.len() {
            if self.held[k].1.alive() {
                k += 1;
            } else {
                let (conn, p) = self.held.remove(k);
                self.machine.bu_closed(conn, p.closed.as_deref().unwrap_or_default(), now);
            }
        }
        let mut k = 0;
        while k < self.bus.len() {
            if self.bus[k].2.alive() {
                k += 1;
            } else {
                let (_, conn, p) = self.bus.remove(k);
                self.machine.bu_closed(conn, p.closed.as_deref().unwrap_or_default(), now);
            }
        }
        let mut pool = Vec::new();
        let mut i = 0;
        while i < self.newcomers.len() {
            let p = &mut self.newcomers[i].1;
            let Some(frame) = p.next() else {
                if p.closed.is_some() || p.since.elapsed() > Duration::from_secs(10) {
                    self.newcomers.remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let (conn, p) = self.newcomers.remove(i);
            self.machine.on_hello(conn, Message::decode(&frame), now);
            pool.push((conn, p));
        }
        self.act(pool);
    }

    fn read_evm(&mut self) {
        while let Some(frame) = self.evm.next() {
            self.machine.on_evm(&frame, Instant::now());
        }
        if let Some(why) = self.evm.closed.clone() {
            self.machine.evm_closed(&why);
        }
        self.act(Vec::new());
    }

    fn read_stream(&mut self, slot: usize) {
        for _ in 0..256 {
            if !self.machine.may_read(slot) {
                break;
            }
            let Some((_, peer)) = self.streams[slot].as_mut() else { return };
            let Some(frame) = peer.next() else { break };
            self.machine.on_stream_frame(slot, frame);
            if self.machine.failure().is_some() || self.streams[slot].is_none() {
                break;
            }
        }
        if let Some((conn, p)) = &self.streams[slot]
            && let Some(why) = p.closed.clone()
            && p.stash.is_none()
            && self.machine.stream(slot) == Some(*conn)
        {
            self.machine.stream_closed(slot, &why);
            self.streams[slot] = None;
        }
        self.act(Vec::new());
    }

    fn send(&mut self) {
        self.machine.core_mut().process_rejects();
        let limit = self.config.send_queue_bytes;
        let waiting: Vec<u32> = self.machine.core().waiting_bus().collect();
        for bu in waiting {
            let Some((_, _, peer)) = self.bus.iter_mut().find(|b| b.0 == bu) else { continue };
            for _ in 0..256 {
                let Some(size) = self.machine.core().next_ready(bu) else { break };
                let queued = peer.conn.queued_bytes();
                if queued > 0 && queued + size > limit {
                    break;
                }
                let probes = &*crate::common::PROBES;
                let (core, scratch) = (self.machine.core_mut(), &mut self.scratch);
                let header = crate::common::stamped(&probes.ru_assemble, || core.next_into(bu, scratch))
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
            b.2.try_flush();
        }
        // A BU whose connection broke: its events come back from the EVM as re-assignments.
        let now = Instant::now();
        let mut k = 0;
        while k < self.bus.len() {
            if self.bus[k].2.closed.is_some() {
                let (_, conn, p) = self.bus.remove(k);
                self.machine.bu_closed(conn, p.closed.as_deref().unwrap_or_default(), now);
            } else {
                k += 1;
            }
        }
        self.act(Vec::new());
    }

    fn tick(&mut self, now: Instant) {
        self.next_tick = now + Duration::from_millis(1);
        self.evm.try_flush();
        let stop = self.shared.stop.load(Ordering::Relaxed);
        let sending = self.bus.iter().any(|b| b.2.closed.is_none() && b.2.conn.queued_bytes() > 0);
        let step = self.machine.tick(now, stop, sending);
        self.act(Vec::new());
        if step == RuStep::Finish {
            self.finish(now);
            self.stopper.stop();
            return;
        }
        self.publish(now);
    }

    fn finish(&mut self, now: Instant) {
        for (_, _, b) in &mut self.bus {
            let deadline = Instant::now() + Duration::from_secs(2);
            while b.closed.is_none() && b.conn.queued_bytes() > 0 && Instant::now() < deadline {
                b.try_flush();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let c = self.machine.core().counters().clone();
        let seconds = now.duration_since(self.started).as_secs_f64();
        // What is stored at the end (before it is freed), and how many events that is.
        let mut detail =
            self.detail(seconds, per_second(c.fragments, seconds), per_second(c.fragment_bytes, seconds) / 1e6);
        detail.leftover_events = Some(self.machine.core_mut().leftover().len());
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
        let core = self.machine.core();
        RuDetail {
            id: self.config.id,
            run: self.run,
            seconds,
            last_event: core.ended(),
            counters: core.counters().clone(),
            fragments_per_s,
            fragment_mb_per_s,
            events_stored: core.events_stored(),
            bytes_stored: core.bytes_stored(),
            read_ahead_bytes: core.read_ahead_bytes(),
            streams_connected: self.machine.streams_connected(),
            bus_connected: self.bus.len(),
            bus_held: self.held.len(),
            leftover_events: None,
            problems: core.problems().to_vec(),
            error: self.machine.failure().map(str::to_owned),
        }
    }

    fn publish(&mut self, now: Instant) {
        if now.duration_since(self.last_publish) < PUBLISH_EVERY {
            return;
        }
        self.last_publish = now;
        let c = self.machine.core().counters();
        let counts = [c.super_fragments, c.super_fragment_bytes, c.fragments, c.fragment_bytes];
        let [sf_per_s, sf_bytes_per_s, fragments_per_s, fragment_bytes_per_s] = self.rates.sample(now, counts);
        let detail =
            self.detail(now.duration_since(self.started).as_secs_f64(), fragments_per_s, fragment_bytes_per_s / 1e6);
        let live = Stats::counted(counts[0], counts[1]).with_rates(sf_per_s, sf_bytes_per_s / 1e6).with_detail(&detail);
        set(&self.shared.live, live);
    }
}

/// Takes the peer of connection `conn` out of `from`.
fn take(from: &mut Vec<(ConnId, Peer)>, conn: ConnId) -> Option<Peer> {
    let k = from.iter().position(|(c, _)| *c == conn)?;
    Some(from.remove(k).1)
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
                let core = self.machine.core();
                core.waiting_bus().any(|bu| core.next_ready(bu).is_some() && self.bus.iter().any(|b| b.0 == bu))
                    || self.bus.iter().any(|b| b.2.conn.queued_bytes() > 0)
                    || core.rejects_waiting()
            }
            s => {
                self.machine.may_read(s - FIRST_STREAM)
                    && self.streams[s - FIRST_STREAM].as_mut().is_some_and(|(_, p)| p.poll())
            }
        }
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        // The sockets the tasks read (not the BUs': nothing is read from them).
        self.evm.wait_fd(out);
        for (_, p) in &self.newcomers {
            p.wait_fd(out);
        }
        for (slot, s) in self.streams.iter().enumerate() {
            if let Some((_, p)) = s
                && self.machine.may_read(slot)
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
        if self.machine.failure().is_some() && !self.shared.stop.load(Ordering::Relaxed) {
            // Keep answering `stop` with the error; the EVM was told.
            self.publish(Instant::now());
        }
        Ok(())
    }
}
