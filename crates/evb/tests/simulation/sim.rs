//! A whole event builder in memory: one EVM, N RUs, M BUs, their sources, no sockets and no
//! threads, stepped by a seeded scheduler on virtual time.
//!
//! The three cores ([`EvmCore`], [`RuCore`], [`BuCore`]) exchange the frames their I/O layers
//! exchange, encoded and decoded as on the wire: hellos, RU lists, requests (credits and
//! confirmations), triggers, assignments, super-fragments, BU gone, run end, and the engine's
//! grouped releases and level-2 rejects. What the I/O layers add around the cores is done here
//! the way they do it: the EVM admits a BU whose id is still on its books only once the
//! predecessor is removed, re-assigns on a closed link or a timeout, triggers on demand or
//! paced, groups rejects and releases and flushes them every millisecond, drains and ends the
//! run, and gives each BU its generation in the RU list; an RU takes a BU's connection by the
//! generation in its hello as [`RuCore::bu_admission`] says (held until the EVM's BU gone for
//! every earlier generation of its id has come, refused when its own is gone), drops a
//! connection on the BU gone of its generation only, and reads a stream only when
//! [`RuCore::may_read`] says so; a BU asks for credits as `BuIo::confirm` does, builds after a
//! random delay and confirms at its flush interval.
//!
//! Every connection is a FIFO with random delays (TCP keeps order on one connection, not across
//! connections); at each step the scheduler picks one of the actions that can happen now
//! (deliver the head of a link, read a stream, send super-fragments, a timer, the plan's next
//! failure) at random, and moves the clock to the next timer only when none can.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use daqflow_engine::messages::{self, ControlMessage, GroupSizes, Grouper, MessageKind};
use daqflow_evb::bu::{BuCore, CheckLevel, ReadyEvent, build};
use daqflow_evb::evm::{Accounting, CoreConfig, EvmCore, Out};
use daqflow_evb::model::{Rng, SizeModel, check_pattern, fill_pattern};
use daqflow_evb::protocol::{KIND_SUPER_FRAGMENT, Message, Role, Trigger};
use daqflow_evb::ru::{BuAdmission, RuConfig, RuCore, RuCounters};
use daqflow_wire::frame::Frame;
use daqflow_wire::{EventFlags, EventId, Fragment, FragmentInfo, SuperFragment};

/// The run number of every simulated run.
pub const RUN: u32 = 7;

/// Most steps of one simulation: a run that does not end by then is a violation (a livelock).
const MAX_STEPS: u64 = 2_000_000;

/// One builder unit's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuSpec {
    /// Its id (reused ids are given by [`Chaos::Join`]).
    pub id: u32,
    /// Most events in flight.
    pub credits: u32,
    /// Credits are handed back in groups of this many.
    pub request_batch: u32,
    /// Built events are confirmed at least this often.
    pub flush_interval: Duration,
    /// Fewer credits when the mean event size says `credits` would be more bytes than this.
    pub max_bytes_in_flight: u64,
}

impl BuSpec {
    /// A BU with `credits` credits, handing them back in groups of `request_batch`.
    pub fn new(id: u32, credits: u32, request_batch: u32) -> BuSpec {
        BuSpec {
            id,
            credits,
            request_batch: request_batch.clamp(1, credits.max(1)),
            flush_interval: Duration::from_millis(2),
            max_bytes_in_flight: 16 << 20,
        }
    }
}

/// How the EVM triggers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Triggering {
    /// As many as the BUs' credits can take ([`EvmCore::trigger_on_demand`]).
    OnDemand,
    /// This many triggers every millisecond, whatever the credits.
    Paced(u32),
}

/// A simulated builder.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seed of the scheduler, the delays, the sizes and the level-2 emulation.
    pub seed: u64,
    /// Readout units.
    pub rus: u32,
    /// Streams (sources) per RU.
    pub streams: usize,
    /// Fragment payload sizes (each stream draws from its own seeded generator).
    pub sizes: SizeModel,
    /// Largest fragment payload.
    pub max_payload: usize,
    /// A source produces a fragment every 0 to this long (and keeps up to 1 ms of them when
    /// its RU does not read).
    pub max_source_period: Duration,
    /// The RUs' `buffer_bytes`.
    pub ru_buffer_bytes: usize,
    /// The RUs' `read_ahead_bytes`.
    pub ru_read_ahead_bytes: usize,
    /// The RUs' `max_fragments`.
    pub ru_max_fragments: usize,
    /// Level-2 reject fraction.
    pub reject_fraction: f64,
    /// Most events per assignment.
    pub assign_batch: u32,
    /// A smaller assignment goes out once its oldest event waited this long.
    pub assign_timeout: Duration,
    /// Rejects per grouped message.
    pub reject_group: usize,
    /// Releases per grouped message.
    pub release_group: usize,
    /// How the EVM triggers.
    pub triggering: Triggering,
    /// The trigger stops by itself after this many events (keeps a case small).
    pub max_triggers: u64,
    /// Every message takes between 0 and this long.
    pub max_link_delay: Duration,
    /// Building an event takes between 0 and this long.
    pub max_build_delay: Duration,
    /// After the stop, how long the EVM waits for every event.
    pub drain_timeout: Duration,
    /// The BUs there from the start.
    pub bus: Vec<BuSpec>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            rus: 2,
            streams: 2,
            sizes: SizeModel::Uniform { min: 0, max: 300 },
            max_payload: 1024,
            max_source_period: Duration::from_micros(20),
            ru_buffer_bytes: 1 << 20,
            ru_read_ahead_bytes: 8 << 10,
            ru_max_fragments: 4096,
            reject_fraction: 0.0,
            assign_batch: 4,
            assign_timeout: Duration::from_millis(1),
            reject_group: 4,
            release_group: 4,
            triggering: Triggering::OnDemand,
            max_triggers: 300,
            max_link_delay: Duration::from_micros(500),
            max_build_delay: Duration::from_micros(500),
            drain_timeout: Duration::from_secs(10),
            bus: vec![BuSpec::new(0, 8, 2), BuSpec::new(1, 8, 2)],
        }
    }
}

/// Something that happens to the builder at a planned time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chaos {
    /// The process of the `n`-th live BU (modulo their number) dies: what it sent arrives,
    /// then the EVM sees its link close.
    Crash(usize),
    /// The `n`-th live BU freezes: the EVM declares it dead (silent too long) once what it sent
    /// has arrived, up to 3 ms later; its process lingers, frozen, for up to 20 ms more with its
    /// connections open, then dies.
    Hang(usize),
    /// A BU joins with these settings: a fresh id, or with `reuse: Some(n)` the id of the
    /// `n`-th BU that died (modulo their number; a fresh id if none died).
    Join {
        /// Whose id to reuse.
        reuse: Option<usize>,
        /// Credits.
        credits: u32,
        /// Request batch.
        request_batch: u32,
    },
    /// The `n`-th live BU is stopped while the run goes on (`BuIo`'s leaving): it asks for
    /// nothing more, confirms what it built, and closes its links once nothing is left to
    /// confirm; the EVM re-assigns what it had not received whole.
    Leave(usize),
    /// The `n`-th live BU dies (crashes, or hangs with `hang`) and is restarted at once with
    /// the same id and settings: the successor says hello while its predecessor may still be on
    /// the EVM's and the RUs' books.
    Restart {
        /// Which live BU.
        n: usize,
        /// It hangs rather than crashes.
        hang: bool,
    },
    /// The operator stops the run: the EVM stops triggering and drains.
    Stop,
}

/// A rule the simulation saw broken, with what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which property.
    pub kind: Kind,
    /// What happened.
    pub what: String,
}

/// The properties checked while the simulation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A BU got a super-fragment of an event not assigned to it, or twice.
    SuperFragment,
    /// A built event is not one super-fragment per RU with the right fragments.
    BuiltEvent,
    /// A core refused a message the other cores sent, an RU dropped the connection of a live BU,
    /// or the run did not end.
    Protocol,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Node {
    Evm,
    Ru(usize),
    Bu(usize),
}

enum Item {
    Frame(Frame),
    /// The sender's end of the connection closed (its process died).
    Closed,
}

struct Link {
    from: Node,
    to: Node,
    queue: VecDeque<(Instant, Item)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Alive,
    /// Frozen: not declared dead yet (`None`), or declared dead by the EVM with its process
    /// still there (connections open) until then.
    Frozen(Option<Instant>),
    Dead,
}

/// One BU process (a reused id is a new process).
struct BuProc {
    spec: BuSpec,
    life: Life,
    core: BuCore,
    evm_in: usize,
    evm_out: usize,
    /// Per RU: RU → this BU, this BU → RU.
    ru_in: Vec<usize>,
    ru_out: Vec<usize>,
    requested_first: bool,
    granted: u64,
    confirmed: u64,
    built_bytes: u64,
    building: Vec<(Instant, ReadyEvent)>,
    unflushed: Vec<u64>,
    last_flush: Instant,
    done: Vec<u64>,
    last_request: Instant,
    run_end: Option<u64>,
    /// Stopped while the run goes on: leaves once everything built is confirmed.
    leaving: bool,
    /// Its generation, from the EVM's RU list (the EVM's count of earlier BUs with its id).
    generation: u32,
    /// Frozen: the EVM declares it dead once everything it sent has arrived, not before this.
    declare_after: Instant,
    /// Frozen: how long its process lingers after the EVM declared it dead.
    linger: Duration,
    /// Events the EVM assigned to this process (as it sent the triggers).
    assigned: BTreeSet<u64>,
    /// (event, RU) of every super-fragment received.
    received: BTreeSet<(u64, u32)>,
    /// Events in this process's output (built, whether confirmed or not).
    output: Vec<u64>,
    /// Events it confirmed (sent in a request).
    confirmations: Vec<u64>,
    admitted: bool,
}

struct Source {
    source_id: u32,
    next: u64,
    /// When the next fragment exists.
    ready_at: Instant,
    stop_at: Option<u64>,
    ended: bool,
    rng: Rng,
}

struct RuNode {
    id: u32,
    core: RuCore,
    /// BU id → the process connected under it, with the generation of its hello.
    conns: BTreeMap<u32, (usize, u32)>,
    /// Processes whose connection is held (as `RuIo` holds them), with their hello's
    /// generation.
    waiting: Vec<(usize, u32)>,
    sources: Vec<Source>,
    from_evm: usize,
}

struct EvmNode {
    core: EvmCore,
    registered: BTreeMap<u32, usize>,
    waiting: Vec<usize>,
    grouper: Grouper,
    next_flush: Instant,
    next_paced: Instant,
    stop_time: Option<Instant>,
    finished: Option<Accounting>,
    out: Vec<Out>,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Deliver(usize),
    Read(usize, usize),
    Send(usize),
    EvmTimer,
    BuTimer(usize),
    Thaw(usize),
    Declare(usize),
    Plan,
    StopSources,
}

/// What one BU process did, for the checks.
#[derive(Debug, Clone)]
pub struct BuReport {
    /// Its id.
    pub id: u32,
    /// Registered at the EVM at some point.
    pub admitted: bool,
    /// Alive and registered at the EVM when the run ended.
    pub survived: bool,
    /// Events the EVM assigned to it.
    pub assigned: BTreeSet<u64>,
    /// Events in its output.
    pub output: Vec<u64>,
    /// Events it confirmed.
    pub confirmations: Vec<u64>,
}

/// What a simulated run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run's last event (0: the EVM never stopped).
    pub last_event: u64,
    /// The EVM's accounting at the end (none: the run never ended).
    pub accounting: Option<Accounting>,
    /// Events the EVM released (counted built), in order.
    pub released: Vec<u64>,
    /// Events the EVM rejected, in order.
    pub rejected: Vec<u64>,
    /// Events the EVM assigned (to any BU, re-assignments included).
    pub assigned: BTreeSet<u64>,
    /// Per RU: the events still stored at the end, and its counters.
    pub rus: Vec<(Vec<u64>, RuCounters)>,
    /// Every BU process, in the order they started.
    pub bus: Vec<BuReport>,
    /// Rules broken during the run.
    pub violations: Vec<Violation>,
    /// Live BUs that an RU disconnected (each then left the run).
    pub dropped_by_ru: Vec<String>,
    /// BU connections an RU held because their predecessor's BU gone had not come yet: the
    /// race the generations are for.
    pub held_by_ru: Vec<String>,
    /// BU connections an RU refused (their generation was gone).
    pub refused_by_ru: Vec<String>,
    /// Virtual time at the end.
    pub elapsed: Duration,
    /// Scheduler steps.
    pub steps: u64,
    /// The last lines of the trace (with `SIM_TRACE` set).
    pub trace: Vec<String>,
}

/// The simulation.
pub struct Sim {
    cfg: SimConfig,
    rng: Rng,
    origin: Instant,
    now: Instant,
    links: Vec<Link>,
    evm: EvmNode,
    rus: Vec<RuNode>,
    procs: Vec<BuProc>,
    plan: VecDeque<(Duration, Chaos)>,
    stop_sources_at: Option<Instant>,
    released: Vec<u64>,
    rejected: Vec<u64>,
    assigned: BTreeSet<u64>,
    violations: Vec<Violation>,
    dropped_by_ru: Vec<String>,
    held_by_ru: Vec<String>,
    refused_by_ru: Vec<String>,
    survivors: BTreeSet<usize>,
    steps: u64,
    trace: Option<VecDeque<String>>,
}

impl Sim {
    /// A builder as `cfg` says, with failures at the planned times (from the start of the run).
    pub fn new(cfg: SimConfig, mut plan: Vec<(Duration, Chaos)>) -> Sim {
        plan.sort_by_key(|(t, _)| *t);
        let origin = Instant::now();
        let rus: Vec<u32> = (0..cfg.rus).collect();
        let core = EvmCore::new(
            CoreConfig {
                reject_fraction: cfg.reject_fraction,
                assign_batch: cfg.assign_batch,
                assign_timeout: cfg.assign_timeout,
                seed: cfg.seed ^ 0x1234,
            },
            rus,
        );
        let grouper = Grouper::new(GroupSizes {
            reject: cfg.reject_group.max(1),
            discard: cfg.release_group.max(1),
            ..GroupSizes::default()
        });
        let mut sim = Sim {
            rng: Rng::new(cfg.seed),
            origin,
            now: origin,
            links: Vec::new(),
            evm: EvmNode {
                core,
                registered: BTreeMap::new(),
                waiting: Vec::new(),
                grouper,
                next_flush: origin,
                next_paced: origin,
                stop_time: None,
                finished: None,
                out: Vec::new(),
            },
            rus: Vec::new(),
            procs: Vec::new(),
            plan: plan.into(),
            stop_sources_at: None,
            released: Vec::new(),
            rejected: Vec::new(),
            assigned: BTreeSet::new(),
            violations: Vec::new(),
            dropped_by_ru: Vec::new(),
            held_by_ru: Vec::new(),
            refused_by_ru: Vec::new(),
            survivors: BTreeSet::new(),
            steps: 0,
            trace: std::env::var_os("SIM_TRACE").map(|_| VecDeque::new()),
            cfg,
        };
        for r in 0..sim.cfg.rus {
            let config = RuConfig {
                id: r,
                streams: sim.cfg.streams,
                check_crc: true,
                buffer_bytes: sim.cfg.ru_buffer_bytes,
                read_ahead_bytes: sim.cfg.ru_read_ahead_bytes,
                max_fragments: sim.cfg.ru_max_fragments,
                max_fragment_bytes: sim.cfg.max_payload + 64,
                ..Default::default()
            };
            let mut core = RuCore::new(&config);
            let sources = (0..sim.cfg.streams)
                .map(|s| {
                    let source_id = r * 100 + s as u32;
                    core.bind_stream(s, source_id);
                    Source {
                        source_id,
                        next: 1,
                        ready_at: origin,
                        stop_at: None,
                        ended: false,
                        rng: Rng::new(sim.cfg.seed ^ (u64::from(source_id + 1) << 20)),
                    }
                })
                .collect();
            let from_evm = sim.link(Node::Evm, Node::Ru(r as usize));
            sim.rus.push(RuNode { id: r, core, conns: BTreeMap::new(), waiting: Vec::new(), sources, from_evm });
        }
        for spec in sim.cfg.bus.clone() {
            sim.start_bu(spec);
        }
        sim
    }

    fn link(&mut self, from: Node, to: Node) -> usize {
        self.links.push(Link { from, to, queue: VecDeque::new() });
        self.links.len() - 1
    }

    fn at(&self) -> Duration {
        self.now.duration_since(self.origin)
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            let at = self.now.duration_since(self.origin);
            t.push_back(format!("{:>9.3} ms  {}", at.as_secs_f64() * 1e3, line()));
            if t.len() > 400 {
                t.pop_front();
            }
        }
    }

    fn violation(&mut self, kind: Kind, what: String) {
        self.note(|| format!("VIOLATION {what}"));
        if self.violations.len() < 50 {
            self.violations.push(Violation { kind, what });
        }
    }

    fn delay(&mut self, max: Duration) -> Duration {
        let max = max.as_nanos() as u64;
        Duration::from_nanos(if max == 0 { 0 } else { self.rng.next_u64() % (max + 1) })
    }

    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn send(&mut self, link: usize, item: Item) {
        let delay = self.delay(self.cfg.max_link_delay);
        let mut at = self.now + delay;
        if let Some((last, _)) = self.links[link].queue.back() {
            at = at.max(*last);
        }
        self.links[link].queue.push_back((at, item));
    }

    fn send_frame(&mut self, link: usize, frame: Frame) {
        self.send(link, Item::Frame(frame));
    }

    // ---------------------------------------------------------------- BUs

    /// A new BU process: it says hello to the EVM. Returns its index.
    pub fn start_bu(&mut self, spec: BuSpec) -> usize {
        let p = self.procs.len();
        let evm_in = self.link(Node::Evm, Node::Bu(p));
        let evm_out = self.link(Node::Bu(p), Node::Evm);
        let ru_in = (0..self.rus.len()).map(|r| self.link(Node::Ru(r), Node::Bu(p))).collect();
        let ru_out = (0..self.rus.len()).map(|r| self.link(Node::Bu(p), Node::Ru(r))).collect();
        self.procs.push(BuProc {
            spec,
            life: Life::Alive,
            core: BuCore::new(),
            evm_in,
            evm_out,
            ru_in,
            ru_out,
            requested_first: false,
            granted: 0,
            confirmed: 0,
            built_bytes: 0,
            building: Vec::new(),
            unflushed: Vec::new(),
            last_flush: self.now,
            done: Vec::new(),
            last_request: self.now,
            run_end: None,
            leaving: false,
            generation: 0,
            declare_after: self.now,
            linger: Duration::ZERO,
            assigned: BTreeSet::new(),
            received: BTreeSet::new(),
            output: Vec::new(),
            confirmations: Vec::new(),
            admitted: false,
        });
        let hello = Message::Hello {
            role: Role::Bu,
            id: spec.id,
            run: RUN,
            name: format!("bu-{p}"),
            addr: String::new(),
            generation: 0,
        };
        self.send_frame(evm_out, hello.to_frame());
        self.note(|| format!("BU process {p} (id {}) starts", spec.id));
        p
    }

    /// The process of BU `p` dies: what it sent still arrives, then its links close.
    pub fn crash(&mut self, p: usize) {
        if self.procs[p].life == Life::Dead {
            return;
        }
        let was_alive = self.procs[p].life == Life::Alive;
        self.procs[p].life = Life::Dead;
        self.procs[p].building.clear();
        if was_alive {
            let out = self.procs[p].evm_out;
            self.send(out, Item::Closed);
        }
        self.note(|| format!("BU process {p} dies"));
    }

    /// BU `p` freezes. The EVM declares it dead once it has been silent long enough: after
    /// everything it sent has arrived (`bu_timeout_ms` is far longer than a message takes), and
    /// not before `after`. Its process dies `linger` after that, its connections open until
    /// then.
    pub fn hang(&mut self, p: usize, after: Duration, linger: Duration) {
        if self.procs[p].life != Life::Alive {
            return;
        }
        let id = self.procs[p].spec.id;
        let b = &mut self.procs[p];
        b.life = Life::Frozen(None);
        b.building.clear();
        b.declare_after = self.now + after;
        b.linger = linger;
        self.note(|| format!("BU process {p} (id {id}) hangs"));
    }

    fn may_declare(&self, p: usize) -> bool {
        let b = &self.procs[p];
        b.life == Life::Frozen(None)
            && b.declare_after <= self.now
            && self.links[b.evm_out].queue.is_empty()
            && b.ru_out.iter().all(|&l| self.links[l].queue.is_empty())
    }

    /// The EVM declares the frozen BU `p` dead (silent too long): it closes the link.
    fn declare_dead(&mut self, p: usize) {
        let id = self.procs[p].spec.id;
        self.procs[p].life = Life::Frozen(Some(self.now + self.procs[p].linger));
        self.note(|| format!("EVM: BU process {p} (id {id}) silent too long: declared dead"));
        self.evm_bu_closed(p);
        self.evm_tick();
    }

    /// The BUs alive now.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&p| self.procs[p].life == Life::Alive).collect()
    }

    /// Events the EVM holds as assigned to BU id `id` and not yet confirmed.
    pub fn in_flight_at(&self, id: u32) -> usize {
        self.evm.core.bus().find(|b| b.0 == id).map_or(0, |b| b.2)
    }

    /// The EVM's accounting so far.
    pub fn accounting(&self) -> &Accounting {
        self.evm.core.accounting()
    }

    /// The operator stops the run.
    pub fn stop(&mut self) {
        if self.evm.stop_time.is_none() {
            let last = self.evm.core.stop();
            self.evm.stop_time = Some(self.now);
            self.note(|| format!("stop: last event {last}"));
            self.evm_tick();
        }
    }

    fn credit_target(&self, p: usize) -> u64 {
        let b = &self.procs[p];
        let credits = u64::from(b.spec.credits);
        let events = b.output.len() as u64;
        match b.built_bytes.checked_div(events) {
            Some(mean) if mean > 0 => credits.min(b.spec.max_bytes_in_flight / mean).max(1),
            _ => credits.min(u64::from(b.spec.request_batch)),
        }
    }

    fn bu_receive(&mut self, p: usize, from: Option<usize>, frame: Frame) {
        if self.procs[p].life != Life::Alive {
            return;
        }
        let mut ready = Vec::new();
        if let Some(r) = from {
            let ru = self.rus[r].id;
            if frame.kind != KIND_SUPER_FRAGMENT {
                self.violation(Kind::Protocol, format!("BU process {p}: frame kind {:#x} from RU {ru}", frame.kind));
                return;
            }
            let header = match SuperFragment::parse(frame.payload.clone()) {
                Ok(sf) => *sf.header(),
                Err(e) => {
                    self.violation(
                        Kind::Protocol,
                        format!("BU process {p}: RU {ru} sent a malformed super-fragment: {e}"),
                    );
                    return;
                }
            };
            let id = header.event_id.0;
            self.note(|| format!("BU process {p} gets event {id} from RU {ru}"));
            if !self.procs[p].assigned.contains(&id) {
                let holder: Vec<usize> =
                    (0..self.procs.len()).filter(|&q| self.procs[q].assigned.contains(&id)).collect();
                self.violation(
                    Kind::SuperFragment,
                    format!(
                        "BU process {p} (id {}) got event {id} from RU {ru}, not assigned to it (assigned to processes \
                         {holder:?})",
                        self.procs[p].spec.id
                    ),
                );
            }
            if !self.procs[p].received.insert((id, ru)) {
                self.violation(
                    Kind::SuperFragment,
                    format!("BU process {p} (id {}) got event {id} from RU {ru} twice", self.procs[p].spec.id),
                );
            }
            if let Err(e) = self.procs[p].core.on_super_fragment(ru, frame.payload, &mut ready) {
                self.violation(Kind::Protocol, format!("BU process {p}: {e}"));
            }
        } else {
            match Message::decode(&frame) {
                Ok(Message::RuList { generation, rus, .. }) => {
                    self.note(|| format!("BU process {p} gets the RU list (generation {generation}), connects"));
                    self.procs[p].generation = generation;
                    let hello = Message::Hello {
                        role: Role::Bu,
                        id: self.procs[p].spec.id,
                        run: RUN,
                        name: format!("bu-{p}"),
                        addr: String::new(),
                        generation,
                    };
                    for (ru, _) in rus {
                        let out = self.procs[p].ru_out[ru as usize];
                        self.send_frame(out, hello.to_frame());
                    }
                    // Connected to every RU (a synchronous connect in the I/O layer): the first
                    // request.
                    let credits = self.credit_target(p) as u32;
                    let b = &mut self.procs[p];
                    b.requested_first = true;
                    b.granted = u64::from(credits);
                    b.last_request = self.now;
                    let out = b.evm_out;
                    self.send_frame(out, Message::Request { credits, done: Vec::new() }.to_frame());
                }
                Ok(Message::Triggers { rus, triggers }) => {
                    self.note(|| {
                        format!(
                            "BU process {p} gets triggers {:?}",
                            triggers.iter().map(|t| t.event_id).collect::<Vec<_>>()
                        )
                    });
                    self.procs[p].core.on_triggers(&rus, &triggers, &mut ready);
                }
                Ok(Message::RunEnd { last_event }) => self.procs[p].run_end = Some(last_event),
                Ok(m) => self.violation(Kind::Protocol, format!("BU process {p}: unexpected {m:?} from the EVM")),
                Err(e) => self.violation(Kind::Protocol, format!("BU process {p}: malformed frame from the EVM: {e}")),
            }
        }
        for ev in ready {
            let at = self.now + self.delay(self.cfg.max_build_delay);
            self.procs[p].building.push((at, ev));
        }
        self.bu_work(p);
    }

    /// Builds what is due, flushes, and asks as `BuIo::confirm` does.
    fn bu_work(&mut self, p: usize) {
        if self.procs[p].life != Life::Alive {
            return;
        }
        let now = self.now;
        let mut k = 0;
        while k < self.procs[p].building.len() {
            if self.procs[p].building[k].0 > now {
                k += 1;
                continue;
            }
            let (_, ev) = self.procs[p].building.swap_remove(k);
            self.build_one(p, ev);
        }
        let b = &mut self.procs[p];
        let flush_batch = (b.spec.credits as usize / 2).max(1);
        if !b.unflushed.is_empty() && (now >= b.last_flush + b.spec.flush_interval || b.unflushed.len() >= flush_batch)
        {
            b.confirmed += b.unflushed.len() as u64;
            let flushed = std::mem::take(&mut b.unflushed);
            b.done.extend(flushed);
            b.last_flush = now;
        }
        if !b.requested_first {
            return;
        }
        let done_asking = b.run_end.is_some() || b.leaving;
        let in_flight = b.granted.saturating_sub(b.confirmed);
        let grant = if done_asking { 0 } else { self.credit_target(p).saturating_sub(in_flight) };
        let b = &mut self.procs[p];
        let since = now.duration_since(b.last_request);
        let confirm_due = !b.done.is_empty() && since >= Duration::from_millis(2);
        let grant_due = grant >= u64::from(b.spec.request_batch) || (grant > 0 && in_flight == 0);
        if grant_due || confirm_due {
            let credits = grant.min(u64::from(u32::MAX)) as u32;
            let done = std::mem::take(&mut b.done);
            b.confirmations.extend(&done);
            b.granted += u64::from(credits);
            b.last_request = now;
            let out = b.evm_out;
            self.note(|| format!("BU process {p} asks for {credits}, confirms {done:?}"));
            self.send_frame(out, Message::Request { credits, done }.to_frame());
        }
        let b = &self.procs[p];
        if b.leaving && b.building.is_empty() && b.unflushed.is_empty() && b.done.is_empty() {
            // Idle: it goes (its events still in progress are re-assigned by the EVM).
            self.note(|| format!("BU process {p} has left"));
            self.crash(p);
        }
    }

    fn build_one(&mut self, p: usize, ev: ReadyEvent) {
        let id = ev.trigger.event_id;
        let bu_id = self.procs[p].spec.id;
        let rus = self.cfg.rus;
        let streams = self.cfg.streams;
        let built = build(ev, bu_id, RUN, CheckLevel { crc: true });
        let mut problems = String::new();
        if built.flags != EventFlags::empty() || built.crc_errors > 0 || built.id_mismatches > 0 {
            let _ = write!(
                problems,
                " flags {:#x}, {} CRC errors, {} id mismatches;",
                built.flags.0, built.crc_errors, built.id_mismatches
            );
        }
        if built.parts.len() != 1 + rus as usize {
            let _ = write!(problems, " {} super-fragments for {rus} RUs;", built.parts.len() - 1);
        }
        let mut seen_rus = Vec::new();
        for part in &built.parts[1..] {
            let sf = match SuperFragment::parse(part.clone()) {
                Ok(sf) => sf,
                Err(e) => {
                    let _ = write!(problems, " a super-fragment does not parse: {e};");
                    continue;
                }
            };
            let h = *sf.header();
            seen_rus.push(h.ru_id);
            if h.event_id != EventId(id) {
                let _ = write!(problems, " RU {}'s super-fragment is of event {};", h.ru_id, h.event_id.0);
            }
            let mut sources = Vec::new();
            for f in sf.fragments() {
                let Ok(f) = f else {
                    let _ = write!(problems, " RU {}: a fragment does not parse;", h.ru_id);
                    break;
                };
                let fh = *f.header();
                sources.push(fh.source_id);
                if fh.event_id != EventId(id) {
                    let _ = write!(problems, " RU {}: a fragment of event {};", h.ru_id, fh.event_id.0);
                }
                if check_pattern(f.payload_slice(), id, fh.source_id).is_err() {
                    let _ = write!(problems, " RU {}: source {}'s payload is not its pattern;", h.ru_id, fh.source_id);
                }
            }
            sources.sort_unstable();
            let want: Vec<u32> = (0..streams as u32).map(|s| h.ru_id * 100 + s).collect();
            if sources != want {
                let _ = write!(problems, " RU {}: fragments of sources {sources:?}, expected {want:?};", h.ru_id);
            }
        }
        seen_rus.sort_unstable();
        if seen_rus != (0..rus).collect::<Vec<_>>() {
            let _ = write!(problems, " super-fragments of RUs {seen_rus:?};");
        }
        if !problems.is_empty() {
            self.violation(Kind::BuiltEvent, format!("BU process {p} built event {id}:{problems}"));
        }
        self.note(|| format!("BU process {p} built event {id}"));
        let b = &mut self.procs[p];
        b.output.push(id);
        b.built_bytes += built.len as u64;
        b.unflushed.push(id);
    }

    fn bu_wake(&self, p: usize) -> Option<Instant> {
        let b = &self.procs[p];
        match b.life {
            Life::Dead => return None,
            Life::Frozen(Some(until)) => return Some(until),
            Life::Frozen(None) => return Some(b.declare_after),
            Life::Alive => {}
        }
        let mut t = b.building.iter().map(|(at, _)| *at).min();
        if !b.unflushed.is_empty() {
            t = min(t, Some(b.last_flush + b.spec.flush_interval));
        }
        if b.requested_first && !b.done.is_empty() {
            t = min(t, Some(b.last_request + Duration::from_millis(2)));
        }
        t
    }

    // ---------------------------------------------------------------- RUs

    fn ru_receive(&mut self, r: usize, from_bu: Option<usize>, frame: Frame) {
        if let Some(p) = from_bu {
            match Message::decode(&frame) {
                Ok(Message::Hello { role: Role::Bu, id, generation, .. }) => {
                    self.note(|| format!("RU {r}: hello from BU process {p} (id {id}, generation {generation})"));
                    self.rus[r].waiting.push((p, generation));
                    self.ru_admit(r);
                    if self.rus[r].waiting.contains(&(p, generation)) {
                        self.held_by_ru.push(format!(
                            "RU {r} held BU process {p} (id {id}, generation {generation}): generation {} of id \
                             {id} not gone yet",
                            self.rus[r].core.bu_generations_gone(id)
                        ));
                    }
                }
                other => self.violation(Kind::Protocol, format!("RU {r}: {other:?} from BU process {p}")),
            }
            return;
        }
        match frame.kind {
            messages::KIND_DISCARD | messages::KIND_REJECT => match messages::decode(&frame) {
                Ok(g) if g.kind() == MessageKind::Discard => {
                    let ids: Vec<u64> = g.event_ids().collect();
                    self.rus[r].core.release(ids.iter().copied());
                    self.note(|| format!("RU {r}: release {ids:?}"));
                }
                Ok(g) => {
                    let ids: Vec<u64> = g.event_ids().collect();
                    self.rus[r].core.reject(ids.iter().copied());
                    self.note(|| format!("RU {r}: reject {ids:?}"));
                }
                Err(e) => self.violation(Kind::Protocol, format!("RU {r}: malformed group: {e}")),
            },
            _ => match Message::decode(&frame) {
                Ok(Message::Assign { bu, events }) => {
                    self.note(|| format!("RU {r}: assign {events:?} to BU {bu}"));
                    self.rus[r].core.assign(bu, events);
                }
                Ok(Message::BuGone { bu, generation }) => {
                    if !self.rus[r].core.bu_gone(bu, generation) {
                        self.violation(
                            Kind::Protocol,
                            format!("RU {r}: BU gone for BU {bu} generation {generation} twice"),
                        );
                    }
                    // As `RuIo::read_evm`: the connection of that generation goes, no other.
                    let of_it = self.rus[r].conns.get(&bu).is_some_and(|&(_, g)| g <= generation);
                    if let Some((q, _)) = of_it.then(|| self.rus[r].conns.remove(&bu)).flatten() {
                        self.note(|| format!("RU {r}: BU {bu} generation {generation} gone, drops process {q}"));
                        if self.procs[q].life == Life::Alive {
                            // A live BU loses its link to this RU: it fails and leaves the run.
                            // The generations make sure a BU gone names only a BU that left.
                            let what = format!(
                                "RU {r} dropped live BU process {q} (id {bu}) on BU gone for generation {generation}"
                            );
                            self.dropped_by_ru.push(what.clone());
                            self.violation(Kind::Protocol, what);
                            self.crash(q);
                        }
                    } else {
                        self.note(|| format!("RU {r}: BU {bu} generation {generation} gone"));
                    }
                }
                Ok(Message::RunEnd { last_event }) => {
                    self.note(|| format!("RU {r}: run end at {last_event}"));
                    self.rus[r].core.run_end(last_event);
                }
                other => self.violation(Kind::Protocol, format!("RU {r}: {other:?} from the EVM")),
            },
        }
        self.ru_admit(r);
    }

    /// As `RuIo::admit_waiting_bus`: each held connection is taken, refused, or held on, as
    /// [`RuCore::bu_admission`] says (a BU gone from the EVM always comes within the link's
    /// delays here, so the RU's `connect_timeout_ms` never runs out); one whose process died
    /// is forgotten.
    fn ru_admit(&mut self, r: usize) {
        for (p, g) in std::mem::take(&mut self.rus[r].waiting) {
            let id = self.procs[p].spec.id;
            if self.procs[p].life == Life::Dead {
                self.note(|| format!("RU {r}: BU process {p} (id {id}, generation {g}) went away while held"));
                continue;
            }
            match self.rus[r].core.bu_admission(id, g) {
                BuAdmission::Wait { .. } => self.rus[r].waiting.push((p, g)),
                BuAdmission::Refuse { gone } => {
                    self.note(|| format!("RU {r}: BU process {p} (id {id}, generation {g}) refused: gone"));
                    self.refused_by_ru.push(format!(
                        "RU {r} refused BU process {p} (id {id}, generation {g}): {gone} generations gone"
                    ));
                }
                BuAdmission::Take => {
                    // A live connection with the id has the same generation: the second
                    // claimant waits (never in the simulation: each admission is one process).
                    let live = self.rus[r].conns.get(&id).is_some_and(|&(q, _)| self.procs[q].life != Life::Dead);
                    if live {
                        self.rus[r].waiting.push((p, g));
                    } else {
                        self.rus[r].conns.insert(id, (p, g));
                        self.note(|| format!("RU {r}: BU process {p} (id {id}, generation {g}) connected"));
                    }
                }
            }
        }
    }

    /// Whether stream `s` of RU `r` can be read now: the source has a fragment (or its end),
    /// and the RU reads it.
    fn may_read(&self, r: usize, s: usize) -> bool {
        let src = &self.rus[r].sources[s];
        !src.ended && src.ready_at <= self.now && self.rus[r].core.may_read(s, self.cfg.max_payload + 64)
    }

    /// When a stream the RU reads has its next fragment.
    fn source_wake(&self) -> Option<Instant> {
        let mut t = None;
        for ru in &self.rus {
            for (s, src) in ru.sources.iter().enumerate() {
                if !src.ended && ru.core.may_read(s, self.cfg.max_payload + 64) {
                    t = min(t, Some(src.ready_at));
                }
            }
        }
        t
    }

    fn read(&mut self, r: usize, s: usize) {
        let n = 1 + self.below(8);
        for _ in 0..n {
            if !self.may_read(r, s) {
                return;
            }
            let max = self.cfg.max_payload;
            let sizes = self.cfg.sizes;
            let src = &mut self.rus[r].sources[s];
            if src.stop_at.is_some_and(|last| src.next > last) {
                src.ended = true;
                let last = src.next - 1;
                self.rus[r].core.stream_ended(s, last);
                return;
            }
            let id = src.next;
            src.next += 1;
            let period = self.cfg.max_source_period.as_nanos() as u64;
            let period = Duration::from_nanos(if period == 0 { 0 } else { src.rng.next_u64() % (period + 1) });
            // A source blocked by its RU keeps at most 1 ms of fragments ready.
            src.ready_at =
                src.ready_at.max(self.now.checked_sub(Duration::from_millis(1)).unwrap_or(self.origin)) + period;
            let size = sizes.sample(&mut src.rng, max);
            let mut payload = vec![0u8; size];
            fill_pattern(&mut payload, id, src.source_id);
            let info = FragmentInfo {
                source_id: src.source_id,
                event_id: EventId(id),
                run_number: RUN,
                trigger_type: 1,
                ..Default::default()
            };
            let bytes = Fragment::encode(&info, &payload);
            if let Err(e) = self.rus[r].core.on_fragment(s, bytes) {
                self.violation(Kind::Protocol, format!("RU {r}: {e}"));
                self.rus[r].sources[s].ended = true;
                return;
            }
        }
    }

    fn can_send(&self, r: usize) -> bool {
        let ru = &self.rus[r];
        ru.core.rejects_waiting()
            || ru.core.waiting_bus().any(|bu| ru.conns.contains_key(&bu) && ru.core.next_ready(bu).is_some())
    }

    fn ru_send(&mut self, r: usize) {
        self.rus[r].core.process_rejects();
        let bus: Vec<u32> = self.rus[r].core.waiting_bus().collect();
        let mut fragments = Vec::new();
        for bu in bus {
            let Some(&(p, _)) = self.rus[r].conns.get(&bu) else { continue };
            let n = 1 + self.below(16);
            for _ in 0..n {
                let Some(header) = self.rus[r].core.next_into(bu, &mut fragments) else { break };
                let mut payload = BytesMut::from(&header.encode()[..]);
                for f in &fragments {
                    payload.extend_from_slice(f);
                }
                let link = self.procs[p].ru_in[r];
                self.note(|| format!("RU {r}: sends event {} to BU {bu} (process {p})", header.event_id.0));
                self.send_frame(link, Frame::new(KIND_SUPER_FRAGMENT, payload.freeze()));
            }
        }
        // As `RuIo::send`: connections that broke are dropped.
        let procs = &self.procs;
        self.rus[r].conns.retain(|_, (p, _)| procs[*p].life != Life::Dead);
        self.ru_admit(r);
    }

    // ---------------------------------------------------------------- EVM

    fn evm_receive(&mut self, p: usize, item: Item) {
        if self.evm.finished.is_some() {
            // The EVM ended with the run.
            return;
        }
        let id = self.procs[p].spec.id;
        let frame = match item {
            Item::Closed => {
                self.note(|| format!("EVM: link of BU process {p} (id {id}) closed"));
                self.evm_bu_closed(p);
                self.evm_tick();
                return;
            }
            Item::Frame(f) => f,
        };
        match Message::decode(&frame) {
            Ok(Message::Hello { role: Role::Bu, id, .. }) => {
                if self.evm.registered.contains_key(&id) {
                    self.note(|| format!("EVM: BU process {p} (id {id}) waits for its id"));
                    self.evm.waiting.push(p);
                } else {
                    self.evm_admit(p);
                }
            }
            Ok(Message::Request { credits, done }) => {
                if self.evm.registered.get(&id) == Some(&p) {
                    self.note(|| format!("EVM: BU {id} asks for {credits}, confirms {done:?}"));
                    self.evm.core.request(id, credits, &done, &mut self.evm.out);
                } else {
                    self.violation(Kind::Protocol, format!("EVM: a request from BU process {p}, not registered"));
                }
            }
            other => self.violation(Kind::Protocol, format!("EVM: {other:?} from BU process {p}")),
        }
        self.evm_tick();
    }

    fn evm_admit(&mut self, p: usize) {
        let id = self.procs[p].spec.id;
        self.evm.registered.insert(id, p);
        let generation = self.evm.core.add_bu(id);
        self.procs[p].admitted = true;
        self.note(|| format!("EVM: BU process {p} (id {id}) admitted, generation {generation}"));
        if self.evm.finished.is_none() {
            let rus = (0..self.cfg.rus).map(|r| (r, format!("ru-{r}"))).collect();
            let list = Message::RuList { run: RUN, generation, rus };
            let link = self.procs[p].evm_in;
            self.send_frame(link, list.to_frame());
        }
    }

    /// BU process `p`'s link to the EVM is gone (closed, or declared dead).
    fn evm_bu_closed(&mut self, p: usize) {
        let id = self.procs[p].spec.id;
        self.evm.waiting.retain(|&q| q != p);
        if self.evm.registered.get(&id) == Some(&p) {
            self.evm.registered.remove(&id);
            self.evm.core.remove_bu(id, self.now, &mut self.evm.out);
            if let Some(k) = self.evm.waiting.iter().position(|&q| self.procs[q].spec.id == id) {
                let q = self.evm.waiting.remove(k);
                self.evm_admit(q);
            }
        }
    }

    /// What `EvmIo::tick` does after every message and every millisecond.
    fn evm_tick(&mut self) {
        if self.evm.finished.is_some() {
            return;
        }
        let now = self.now;
        let ts = self.at().as_nanos() as u64;
        if self.evm.core.stopped_at().is_none() && self.evm.core.next_event_id() <= self.cfg.max_triggers {
            match self.cfg.triggering {
                Triggering::OnDemand => self.evm.core.trigger_on_demand(now, ts, 1 << 16, &mut self.evm.out),
                Triggering::Paced(n) => {
                    while now >= self.evm.next_paced {
                        self.evm.next_paced += Duration::from_millis(1);
                        for _ in 0..n {
                            let t = Trigger {
                                event_id: self.evm.core.next_event_id(),
                                trigger_type: 1,
                                flags: 0,
                                timestamp: ts,
                            };
                            if t.event_id > self.cfg.max_triggers {
                                break;
                            }
                            if let Err(e) = self.evm.core.trigger(t, now, &mut self.evm.out) {
                                self.violation(Kind::Protocol, format!("EVM: {e}"));
                            }
                        }
                    }
                }
            }
        }
        self.evm.core.assign(now, &mut self.evm.out);
        if let Some(t) = self.evm.stop_time
            && (self.evm.core.is_drained() || now.duration_since(t) > self.cfg.drain_timeout)
        {
            self.evm_finish();
            return;
        }
        self.evm_send_out();
        if now >= self.evm.next_flush {
            for f in self.evm.grouper.flush() {
                self.send_to_rus(f);
            }
            self.evm.next_flush = now + Duration::from_millis(1);
        }
    }

    fn evm_send_out(&mut self) {
        for o in std::mem::take(&mut self.evm.out) {
            match o {
                Out::Bu(bu, m) => {
                    let Some(&p) = self.evm.registered.get(&bu) else { continue };
                    if let Message::Triggers { triggers, .. } = &m {
                        self.procs[p].assigned.extend(triggers.iter().map(|t| t.event_id));
                    }
                    let link = self.procs[p].evm_in;
                    self.send_frame(link, m.to_frame());
                }
                Out::Rus(m) => {
                    if let Message::Assign { events, .. } = &m {
                        self.assigned.extend(events);
                    }
                    self.send_to_rus(m.to_frame());
                }
                Out::Reject(ids) => {
                    self.rejected.extend(&ids);
                    for id in ids {
                        if let Some(f) = self.evm.grouper.push(ControlMessage::Reject { event_id: id }) {
                            self.send_to_rus(f);
                        }
                    }
                }
                Out::Release(ids) => {
                    self.released.extend(&ids);
                    for id in ids {
                        if let Some(f) = self.evm.grouper.push(ControlMessage::Discard { event_id: id }) {
                            self.send_to_rus(f);
                        }
                    }
                }
            }
        }
    }

    fn send_to_rus(&mut self, frame: Frame) {
        for r in 0..self.rus.len() {
            let link = self.rus[r].from_evm;
            self.send_frame(link, frame.clone());
        }
    }

    fn evm_finish(&mut self) {
        let acc = self.evm.core.finish();
        let last = self.evm.core.stopped_at().unwrap_or(0);
        self.evm_send_out();
        for f in self.evm.grouper.flush() {
            self.send_to_rus(f);
        }
        let end = Message::RunEnd { last_event: last }.to_frame();
        self.send_to_rus(end.clone());
        for (_, &p) in self.evm.registered.clone().iter() {
            let link = self.procs[p].evm_in;
            self.send_frame(link, end.clone());
            if self.procs[p].life == Life::Alive {
                self.survivors.insert(p);
            }
        }
        self.note(|| format!("EVM: run end at {last}: {acc:?}"));
        self.evm.finished = Some(acc);
        self.plan.clear();
        // The operator stops the sources with the last event once the EVM is done.
        let later = self.delay(Duration::from_millis(2));
        self.stop_sources_at = Some(self.now + later);
    }

    fn evm_wake(&self) -> Option<Instant> {
        if self.evm.finished.is_some() {
            return None;
        }
        // The 1 ms tick matters while groups wait to be flushed, assignments wait for their
        // timeout, or paced triggers are due; the drain has its own deadline.
        let paced = matches!(self.cfg.triggering, Triggering::Paced(_))
            && self.evm.stop_time.is_none()
            && self.evm.core.next_event_id() <= self.cfg.max_triggers;
        let busy = self.evm.grouper.pending() > 0
            || (self.evm.core.pending() > 0 && self.evm.core.total_credits() > 0)
            || paced;
        let tick = busy.then_some(self.evm.next_flush);
        let drain = self.evm.stop_time.map(|stop| stop + self.cfg.drain_timeout + Duration::from_nanos(1));
        min(tick, drain)
    }

    // ---------------------------------------------------------------- the scheduler

    fn deliver(&mut self, link: usize) {
        let Some((_, item)) = self.links[link].queue.pop_front() else { return };
        let from = |n: Node| match n {
            Node::Ru(r) => Some(r),
            Node::Bu(p) => Some(p),
            Node::Evm => None,
        };
        let (sender, to) = (from(self.links[link].from), self.links[link].to);
        match (to, item) {
            (Node::Evm, item) => self.evm_receive(sender.expect("only BUs send to the EVM"), item),
            (Node::Ru(r), Item::Frame(frame)) => self.ru_receive(r, sender, frame),
            (Node::Bu(p), Item::Frame(frame)) => self.bu_receive(p, sender, frame),
            (_, Item::Closed) => {}
        }
    }

    fn enabled(&self, out: &mut Vec<Action>) {
        out.clear();
        let now = self.now;
        for (i, l) in self.links.iter().enumerate() {
            if l.queue.front().is_some_and(|(at, _)| *at <= now) {
                out.push(Action::Deliver(i));
            }
        }
        for r in 0..self.rus.len() {
            for s in 0..self.cfg.streams {
                if self.may_read(r, s) {
                    out.push(Action::Read(r, s));
                }
            }
            if self.can_send(r) {
                out.push(Action::Send(r));
            }
        }
        if self.evm_wake().is_some_and(|t| t <= now) {
            out.push(Action::EvmTimer);
        }
        for p in 0..self.procs.len() {
            match self.procs[p].life {
                Life::Frozen(Some(until)) if until <= now => out.push(Action::Thaw(p)),
                Life::Frozen(None) if self.may_declare(p) => out.push(Action::Declare(p)),
                Life::Alive if self.bu_wake(p).is_some_and(|t| t <= now) => out.push(Action::BuTimer(p)),
                _ => {}
            }
        }
        if self.plan.front().is_some_and(|(t, _)| self.origin + *t <= now) {
            out.push(Action::Plan);
        }
        if self.stop_sources_at.is_some_and(|t| t <= now) {
            out.push(Action::StopSources);
        }
    }

    /// The next time something can happen (every wake-up in the past is one that waits for
    /// something else, which has a wake-up of its own).
    fn next_time(&self) -> Option<Instant> {
        let now = self.now;
        let mut t = None;
        let mut consider = |w: Option<Instant>| {
            if let Some(w) = w.filter(|&w| w > now) {
                t = min(t, Some(w));
            }
        };
        for l in &self.links {
            consider(l.queue.front().map(|(at, _)| *at));
        }
        consider(self.evm_wake());
        consider(self.source_wake());
        for p in 0..self.procs.len() {
            consider(self.bu_wake(p));
        }
        consider(self.plan.front().map(|(at, _)| self.origin + *at));
        consider(self.stop_sources_at);
        t
    }

    fn perform(&mut self, a: Action) {
        match a {
            Action::Deliver(l) => self.deliver(l),
            Action::Read(r, s) => self.read(r, s),
            Action::Send(r) => self.ru_send(r),
            Action::EvmTimer => self.evm_tick(),
            Action::BuTimer(p) => self.bu_work(p),
            Action::Declare(p) => self.declare_dead(p),
            Action::Thaw(p) => {
                self.procs[p].life = Life::Dead;
                self.note(|| format!("BU process {p} (frozen) dies"));
            }
            Action::Plan => {
                let (_, chaos) = self.plan.pop_front().expect("enabled");
                self.chaos(chaos);
            }
            Action::StopSources => {
                self.stop_sources_at = None;
                let last = self.evm.core.stopped_at().unwrap_or(0);
                for ru in &mut self.rus {
                    for s in &mut ru.sources {
                        s.stop_at = Some(last);
                    }
                }
                self.note(|| format!("sources stop at {last}"));
            }
        }
    }

    fn chaos(&mut self, c: Chaos) {
        self.note(|| format!("plan: {c:?}"));
        match c {
            Chaos::Crash(n) => {
                let alive = self.alive();
                if !alive.is_empty() {
                    self.crash(alive[n % alive.len()]);
                }
            }
            Chaos::Hang(n) => {
                let alive = self.alive();
                if !alive.is_empty() {
                    let after = self.delay(Duration::from_millis(3));
                    let linger = self.delay(Duration::from_millis(20));
                    self.hang(alive[n % alive.len()], after, linger);
                }
            }
            Chaos::Join { reuse, credits, request_batch } => {
                let used: BTreeSet<u32> =
                    self.procs.iter().filter(|b| b.life == Life::Alive).map(|b| b.spec.id).collect();
                let dead: Vec<u32> = self
                    .procs
                    .iter()
                    .map(|b| b.spec.id)
                    .filter(|id| !used.contains(id))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let fresh = self.procs.iter().map(|b| b.spec.id).max().map_or(0, |m| m + 1);
                let id = match reuse {
                    Some(n) if !dead.is_empty() => dead[n % dead.len()],
                    _ => fresh,
                };
                self.start_bu(BuSpec::new(id, credits, request_batch));
            }
            Chaos::Restart { n, hang } => {
                let alive = self.alive();
                if !alive.is_empty() {
                    let p = alive[n % alive.len()];
                    if hang {
                        let after = self.delay(Duration::from_millis(3));
                        let linger = self.delay(Duration::from_millis(20));
                        self.hang(p, after, linger);
                    } else {
                        self.crash(p);
                    }
                    let spec = self.procs[p].spec;
                    self.start_bu(spec);
                }
            }
            Chaos::Leave(n) => {
                let alive = self.alive();
                if !alive.is_empty() {
                    let p = alive[n % alive.len()];
                    self.procs[p].leaving = true;
                    self.note(|| format!("BU process {p} leaves the run"));
                    self.bu_work(p);
                }
            }
            Chaos::Stop => self.stop(),
        }
    }

    /// One step: an action that can happen now, or the clock moves on. False once nothing can
    /// happen any more.
    fn step(&mut self, actions: &mut Vec<Action>) -> bool {
        self.steps += 1;
        self.enabled(actions);
        if actions.is_empty() {
            return match self.next_time() {
                Some(t) => {
                    self.now = t;
                    true
                }
                None => false,
            };
        }
        let a = actions[self.below(actions.len())];
        self.perform(a);
        true
    }

    /// Runs until `until` holds or nothing can happen any more; whether `until` holds.
    pub fn run_until(&mut self, mut until: impl FnMut(&Sim) -> bool) -> bool {
        let mut actions = Vec::new();
        while !until(self) {
            if self.steps > MAX_STEPS || !self.step(&mut actions) {
                return until(self);
            }
        }
        true
    }

    /// Runs to the end (the plan should stop the run, or [`Sim::stop`] was called) and reports.
    pub fn run(mut self) -> Report {
        let mut actions = Vec::new();
        while self.step(&mut actions) {
            if self.steps > MAX_STEPS {
                self.violation(Kind::Protocol, format!("the simulation did not end after {MAX_STEPS} steps"));
                break;
            }
        }
        if self.evm.finished.is_none() {
            self.violation(Kind::Protocol, "the run never ended (nothing left to happen before the run end)".into());
        }
        let rus = self.rus.iter_mut().map(|r| (r.core.leftover(), r.core.counters().clone())).collect();
        let bus = (0..self.procs.len())
            .map(|p| {
                let b = &self.procs[p];
                BuReport {
                    id: b.spec.id,
                    admitted: b.admitted,
                    survived: self.survivors.contains(&p),
                    assigned: b.assigned.clone(),
                    output: b.output.clone(),
                    confirmations: b.confirmations.clone(),
                }
            })
            .collect();
        Report {
            last_event: self.evm.core.stopped_at().unwrap_or(0),
            accounting: self.evm.finished.clone(),
            released: self.released,
            rejected: self.rejected,
            assigned: self.assigned,
            rus,
            bus,
            violations: self.violations,
            dropped_by_ru: self.dropped_by_ru,
            held_by_ru: self.held_by_ru,
            refused_by_ru: self.refused_by_ru,
            elapsed: self.now.duration_since(self.origin),
            steps: self.steps,
            trace: self.trace.map(Vec::from).unwrap_or_default(),
        }
    }
}

fn min(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

impl Report {
    /// The violations of one kind, one per line.
    pub fn violations_of(&self, kind: Kind) -> Result<(), String> {
        let v: Vec<&str> = self.violations.iter().filter(|v| v.kind == kind).map(|v| v.what.as_str()).collect();
        if v.is_empty() { Ok(()) } else { Err(v.join("\n")) }
    }

    /// Every triggered event ends built (confirmed once), rejected, or lost with a reason, and
    /// the EVM's accounting says what the simulation saw.
    pub fn check_accounting(&self) -> Result<(), String> {
        self.violations_of(Kind::Protocol)?;
        let acc = self.accounting.as_ref().ok_or("the run never ended")?;
        let last = self.last_event;
        let mut e = Vec::new();
        if acc.triggered != last {
            e.push(format!("triggered {} but the last event is {last}", acc.triggered));
        }
        if acc.triggered != acc.built + acc.rejected + acc.lost_total() {
            e.push(format!("triggered {} != built + rejected + lost ({acc:?})", acc.triggered));
        }
        let released: BTreeSet<u64> = self.released.iter().copied().collect();
        if released.len() != self.released.len() {
            e.push("an event was counted built twice".into());
        }
        let rejected: BTreeSet<u64> = self.rejected.iter().copied().collect();
        if rejected.len() != self.rejected.len() {
            e.push("an event was rejected twice".into());
        }
        if acc.built != released.len() as u64 {
            e.push(format!("built {} but {} events released", acc.built, released.len()));
        }
        if acc.rejected != rejected.len() as u64 {
            e.push(format!("rejected {} but {} events rejected", acc.rejected, rejected.len()));
        }
        if let Some(id) = released.intersection(&rejected).next() {
            e.push(format!("event {id} both built and rejected"));
        }
        if let Some(id) = rejected.intersection(&self.assigned).next() {
            e.push(format!("rejected event {id} was assigned"));
        }
        if let Some(id) = released.iter().chain(&rejected).find(|&&id| id == 0 || id > last) {
            e.push(format!("event {id} is not an event of the run (1..={last})"));
        }
        let missing = (1..=last).filter(|id| !released.contains(id) && !rejected.contains(id)).count() as u64;
        if missing != acc.lost_total() {
            e.push(format!("{missing} events neither built nor rejected, {} counted lost", acc.lost_total()));
        }
        if acc.lost.iter().any(|(why, n)| why.is_empty() || *n == 0) {
            e.push(format!("a loss without a reason: {:?}", acc.lost));
        }
        if acc.unexpected_confirmations != 0 {
            e.push(format!("{} unexpected confirmations", acc.unexpected_confirmations));
        }
        // Every event counted built was built and confirmed by a process it was assigned to.
        for id in &released {
            let ok = self
                .bus
                .iter()
                .any(|b| b.assigned.contains(id) && b.output.contains(id) && b.confirmations.contains(id));
            if !ok {
                e.push(format!("event {id} counted built, but no BU it was assigned to built and confirmed it"));
            }
        }
        // A BU confirms only what it built, each event once.
        for (p, b) in self.bus.iter().enumerate() {
            let confirmed: BTreeSet<u64> = b.confirmations.iter().copied().collect();
            if confirmed.len() != b.confirmations.len() {
                e.push(format!("BU process {p} confirmed an event twice"));
            }
            if let Some(id) = confirmed.iter().find(|id| !b.output.contains(id)) {
                e.push(format!("BU process {p} confirmed event {id} it did not build"));
            }
        }
        if e.is_empty() { Ok(()) } else { Err(e.join("\n")) }
    }

    /// Nothing is lost when a BU was there to the end.
    pub fn check_no_loss_with_a_survivor(&self) -> Result<(), String> {
        self.violations_of(Kind::Protocol)?;
        let acc = self.accounting.as_ref().ok_or("the run never ended")?;
        let survivors: Vec<u32> = self.bus.iter().filter(|b| b.survived).map(|b| b.id).collect();
        if !survivors.is_empty() && acc.lost_total() > 0 {
            return Err(format!("BUs {survivors:?} were there to the end, yet lost: {:?}", acc.lost));
        }
        Ok(())
    }

    /// Once the run ended with every event built or rejected, the RUs hold nothing, and each
    /// freed every event once.
    pub fn check_rus_free_everything(&self) -> Result<(), String> {
        self.violations_of(Kind::Protocol)?;
        let acc = self.accounting.as_ref().ok_or("the run never ended")?;
        if acc.lost_total() > 0 {
            return Ok(());
        }
        let mut e = Vec::new();
        for (r, (leftover, c)) in self.rus.iter().enumerate() {
            if !leftover.is_empty() {
                e.push(format!("RU {r} still holds events {leftover:?}"));
            }
            if c.released != acc.built || c.rejected != acc.rejected {
                e.push(format!(
                    "RU {r} freed {} built and {} rejected events; the EVM counted {} and {}",
                    c.released, c.rejected, acc.built, acc.rejected
                ));
            }
            if c.sequence_errors + c.crc_errors + c.incomplete > 0 {
                e.push(format!("RU {r}: {c:?}"));
            }
        }
        if e.is_empty() { Ok(()) } else { Err(e.join("\n")) }
    }

    /// Super-fragments go to the BU their event is assigned to, once, and each built event is one
    /// super-fragment per RU with every stream's fragment of that event.
    pub fn check_super_fragments(&self) -> Result<(), String> {
        self.violations_of(Kind::Protocol)?;
        self.violations_of(Kind::SuperFragment)?;
        self.violations_of(Kind::BuiltEvent)?;
        for (p, b) in self.bus.iter().enumerate() {
            let out: BTreeSet<u64> = b.output.iter().copied().collect();
            if out.len() != b.output.len() {
                return Err(format!("BU process {p} built an event twice"));
            }
            if let Some(id) = out.iter().find(|id| !b.assigned.contains(id)) {
                return Err(format!("BU process {p} built event {id}, not assigned to it"));
            }
        }
        Ok(())
    }

    /// All four.
    pub fn check_all(&self) -> Result<(), String> {
        self.check_accounting()?;
        self.check_no_loss_with_a_survivor()?;
        self.check_rus_free_everything()?;
        self.check_super_fragments()
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        format!(
            "last event {}, {:?}, {} BU processes ({} survived), {} dropped by RUs, {} held, {} refused, {:.1} ms \
             virtual, {} steps",
            self.last_event,
            self.accounting,
            self.bus.len(),
            self.bus.iter().filter(|b| b.survived).count(),
            self.dropped_by_ru.len(),
            self.held_by_ru.len(),
            self.refused_by_ru.len(),
            self.elapsed.as_secs_f64() * 1e3,
            self.steps
        )
    }
}

/// The ids of the events a report's BUs built, with how many processes built each.
pub fn builds(report: &Report) -> HashMap<u64, usize> {
    let mut n = HashMap::new();
    for b in &report.bus {
        for id in &b.output {
            *n.entry(*id).or_default() += 1;
        }
    }
    n
}
