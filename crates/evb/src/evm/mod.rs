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
mod machine;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_component::{
    Component, ComponentError, Info, Kind, Role as KindRole, Stats, TriggerCounts, Verb, parse_config,
};
use daqflow_engine::{BoxError, Module, StopHandle};
use daqflow_transport::Listener;

pub use self::config::{EvmConfig, TriggerMode, schema};
pub use self::core::{Accounting, CoreConfig, EvmCore, Out};
pub use self::machine::{ConnId, EvmMachine, EvmOutput, EvmSettings, FLUSH_EVERY};
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{Peer, bind, control_options, unix_ns};
pub use crate::stats::{EvmBu, EvmDetail};
use crate::unit::{RunShared, Unit};

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

/// What a run of the EVM shares beyond every unit's: the run's last event, once it stopped.
type Shared = RunShared<Mutex<Option<u64>>>;

/// The EVM component.
pub struct Evm {
    config: EvmConfig,
    /// Bound at configure and kept until reset: the next run listens on the same address.
    listener: Option<Arc<Listener>>,
    unit: Unit<Mutex<Option<u64>>>,
}

impl Evm {
    /// An EVM named `name`.
    pub fn new(name: &str, config: EvmConfig) -> Evm {
        Evm { config, listener: None, unit: Unit::new(name) }
    }

    /// The listening address, once configured.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().map(|l| l.local_addr())
    }

    /// The last event of the run, once triggering has stopped.
    pub fn last_event(&self) -> Option<u64> {
        read(&self.unit.shared.extra)
    }

    fn name(&self) -> &str {
        self.unit.name()
    }
}

impl Component for Evm {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        self.config.validate()?;
        self.unit.profile(self.config.profile.as_deref(), self.config.profile_stamps);
        // Configured again: the old socket is closed first, so that a fixed port is free.
        self.listener = None;
        let listener = bind(&self.config.listen, control_options())?;
        let addr = listener.local_addr();
        self.listener = Some(Arc::new(listener));
        let advertised = daqflow_transport::advertise::advertised(addr, self.config.advertise.as_deref())
            .map_err(|e| ComponentError::Config(format!("{}: {e}", self.name())))?;
        let mut info = Info::new();
        info.insert("listen".into(), advertised.into());
        Ok(info)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let Some(listener) = self.listener.clone() else {
            return Err(ComponentError::out_of_order(Verb::Start, "not configured"));
        };
        let shared = self.unit.begin(run, Mutex::new(None));
        let mut s = self.unit.scheduler("evm", self.config.idle.strategy(), &self.config.io_cpus)?;
        let io = EvmIo::new(self.name().to_owned(), self.config.clone(), run, listener, shared, s.stop_handle());
        s.add_module(io);
        self.unit.spawn(s)
    }

    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        // The listener stays bound: the EVM is ready for the next run on the same address.
        self.unit.stop(|_| Vec::new())
    }

    fn pause(&mut self) -> Result<(), ComponentError> {
        self.unit.pause(Verb::Pause, true)
    }

    fn resume(&mut self) -> Result<(), ComponentError> {
        self.unit.pause(Verb::Resume, false)
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        // The EVM ends the run its way: everyone is told.
        self.unit.reset(true);
        self.listener = None;
        Ok(())
    }

    fn stats(&self) -> Stats {
        let live = self.unit.live();
        // Before the first publication too, the trigger's accounting is there (all zero).
        if live.trigger.is_none() { live.with_trigger(TriggerCounts::default()) } else { live }
    }

    fn failure(&self) -> Option<String> {
        self.unit.failure()
    }
}

struct EvmIo {
    config: EvmConfig,
    run: u32,
    listener: Arc<Listener>,
    peers: Vec<(ConnId, Peer)>,
    next_conn: u64,
    machine: EvmMachine,
    shared: Arc<Shared>,
    started: Instant,
    next_tick: Instant,
    next_accept: Instant,
    last_publish: Instant,
    /// Rates of (triggered, built).
    rates: Rates<2>,
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
        let now = Instant::now();
        EvmIo {
            machine: EvmMachine::new(EvmSettings::of(&config, run, &name), now),
            config,
            run,
            listener,
            peers: Vec::new(),
            next_conn: 0,
            shared,
            started: now,
            next_tick: now,
            next_accept: now,
            last_publish: now,
            rates: Rates::new(now),
            stopper,
        }
    }

    fn accept(&mut self) {
        while let Ok(Some(conn)) = self.listener.accept_timeout(Duration::ZERO) {
            self.next_conn += 1;
            let id = ConnId(self.next_conn);
            self.machine.connected(id, conn.peer_addr().to_string(), Instant::now());
            self.peers.push((id, Peer::new(conn)));
        }
    }

    /// Does what the machine asks, in order.
    fn act(&mut self) {
        while let Some(o) = self.machine.next_output() {
            let conn = match &o {
                EvmOutput::Send(c, _) | EvmOutput::Close(c, _) | EvmOutput::Limits(c, _) => *c,
            };
            let Some((_, p)) = self.peers.iter_mut().find(|(c, _)| *c == conn) else { continue };
            match o {
                EvmOutput::Send(_, frame) => {
                    p.send(frame);
                }
                EvmOutput::Close(_, why) => {
                    if p.closed.is_none() {
                        p.closed = Some(why);
                    }
                }
                EvmOutput::Limits(_, limits) => p.conn.set_frame_limits(limits),
            }
        }
        if let Some(f) = self.machine.failure()
            && read(&self.shared.failure).is_none()
        {
            set(&self.shared.failure, Some(f.to_owned()));
        }
        if let Some(last) = self.machine.core().stopped_at()
            && read(&self.shared.extra).is_none()
        {
            set(&self.shared.extra, Some(last));
        }
    }

    /// Connections that closed (by their peer, or as the machine asked) and hold nothing more
    /// to read: the machine is told, the socket dropped.
    fn reap(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.peers.len() {
            if self.peers[i].1.closed.is_some() && self.peers[i].1.stash.is_none() {
                let (c, p) = self.peers.remove(i);
                self.machine.closed(c, p.closed.as_deref().unwrap_or_default(), now);
            } else {
                i += 1;
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        self.reap(now);
        self.machine.set_paused(self.shared.paused.load(Ordering::Relaxed));
        let stop = self.shared.stop.load(Ordering::Relaxed);
        self.machine.tick(now, unix_ns(), stop);
        self.act();
        if self.machine.done() {
            self.finish(now);
            return;
        }
        if now >= self.next_tick {
            self.publish(now);
            self.next_tick = now + Duration::from_millis(1);
        }
        for (_, p) in &mut self.peers {
            p.try_flush();
        }
    }

    fn finish(&mut self, now: Instant) {
        for (_, p) in &mut self.peers {
            let deadline = Instant::now() + Duration::from_secs(2);
            while p.closed.is_none() && p.conn.queued_bytes() > 0 && Instant::now() < deadline {
                p.try_flush();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let acc = self.machine.accounting().clone();
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
            error: self.machine.failure().map(str::to_owned),
        }
    }

    fn detail(&self, seconds: f64, built_per_s: f64) -> EvmDetail {
        let core = self.machine.core();
        let acc = self.machine.accounting();
        EvmDetail {
            run: self.run,
            seconds,
            last_event: core.stopped_at(),
            assignments: acc.assignments,
            reassigned: acc.reassigned,
            unexpected_confirmations: acc.unexpected_confirmations,
            pending: core.pending(),
            in_flight: core.in_flight(),
            built_per_s,
            rus_connected: self.machine.rus().len(),
            rus_expected: self.config.rus,
            bus: core.bus().map(|(id, credits, in_flight, built)| EvmBu { id, credits, in_flight, built }).collect(),
        }
    }

    fn publish(&mut self, now: Instant) {
        if now.duration_since(self.last_publish) < PUBLISH_EVERY {
            return;
        }
        self.last_publish = now;
        let acc = self.machine.accounting().clone();
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
            TASK_ACCEPT => !self.machine.done() && Instant::now() >= self.next_accept,
            TASK_LINKS => {
                self.machine.set_paused(self.shared.paused.load(Ordering::Relaxed));
                let machine = &self.machine;
                self.peers.iter_mut().any(|(c, p)| (machine.reads(*c) || p.closed.is_some()) && p.poll())
            }
            _ => self.machine.done() || Instant::now() >= self.next_tick,
        }
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        for (c, p) in &self.peers {
            // Triggers held back and hellos waiting stay unread: waiting on them would end every
            // park at once.
            if self.machine.reads(*c) {
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
                self.machine.set_paused(self.shared.paused.load(Ordering::Relaxed));
                for _ in 0..64 {
                    let mut any = false;
                    for i in 0..self.peers.len() {
                        let c = self.peers[i].0;
                        if !self.machine.reads(c) && self.peers[i].1.stash.is_none() {
                            continue;
                        }
                        if let Some(f) = self.peers[i].1.next() {
                            any = true;
                            self.machine.on_frame(c, f, Instant::now());
                        }
                    }
                    self.act();
                    if !any {
                        break;
                    }
                }
                self.tick(Instant::now());
                Ok(())
            }
            TASK_TICK => {
                if self.machine.done() {
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
