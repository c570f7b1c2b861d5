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
use daqflow_engine::messages::{self, MessageKind};
use daqflow_evb::bu::{BuMachine, BuOutput, BuSettings, CheckLevel, FlushRule, ReadyEvent, Step, build};
use daqflow_evb::evm::{Accounting, ConnId, CoreConfig, EvmMachine, EvmOutput, EvmSettings, TriggerMode};
use daqflow_evb::model::{Rng, SizeModel, check_pattern, fill_pattern};
use daqflow_evb::protocol::{KIND_FRAGMENT, KIND_SUPER_FRAGMENT, Message, Role};
use daqflow_evb::ru::{RuConfig, RuCounters, RuMachine, RuOutput, RuStep};
use daqflow_wire::file::{DiskMarks, DiskSpace, DiskWatcher};
use daqflow_wire::frame::Frame;
use daqflow_wire::{EventFlags, EventId, Fragment, FragmentInfo, SuperFragment};

/// The run number of every simulated run.
pub const RUN: u32 = 7;

/// Most steps of one simulation: a run that does not end by then is a violation (a livelock).
const MAX_STEPS: u64 = 500_000;

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
    /// A request goes to the EVM at least this often.
    pub heartbeat: Duration,
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
            heartbeat: Duration::from_millis(5),
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
    /// After the stop, how long the EVM waits for an event to be built before it gives up.
    pub drain_timeout: Duration,
    /// The EVM's `bu_timeout_ms`: a BU silent this long is taken for dead.
    pub bu_timeout: Duration,
    /// The BUs there from the start.
    pub bus: Vec<BuSpec>,
    /// The BUs write files, each BU id on a disk of its own, throttled by these marks.
    pub disk: Option<SimDisk>,
}

/// The disk of each BU id (its host's), when the BUs write files.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimDisk {
    /// Its size.
    pub total_bytes: u64,
    /// The BUs' `throttle_high_pct` and `throttle_low_pct`.
    pub marks: DiskMarks,
    /// The BUs' `throttle_check_ms`.
    pub check_interval: Duration,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk { total_bytes: 16 << 20, marks: DiskMarks::DEFAULT, check_interval: Duration::from_millis(1) }
    }
}

/// A simulated disk.
#[derive(Debug, Clone, Copy)]
struct VDisk {
    total: u64,
    /// Written by the BUs.
    used: u64,
    /// Written by someone else.
    ballast: u64,
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
            bu_timeout: Duration::from_millis(30),
            bus: vec![BuSpec::new(0, 8, 2), BuSpec::new(1, 8, 2)],
            disk: None,
        }
    }
}

/// Something that happens to the builder at a planned time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chaos {
    /// The process of the `n`-th live BU (modulo their number) dies: what it sent arrives,
    /// then the EVM sees its link close.
    Crash(usize),
    /// The `n`-th live BU freezes: the EVM's BU timeout declares it dead (silent too long); its
    /// process lingers, frozen, for up to 20 ms more with its connections open, then dies.
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
    /// Someone else fills every BU's disk: to this per cent of the way from 5 % below the low
    /// mark to half way into the reserve above the high mark (never taking back what the BUs
    /// wrote).
    FillDisk(u8),
    /// The other writer's files are removed from every BU's disk.
    FreeDisk,
    /// Writing (and building) takes up to this many times longer (1: normal).
    DiskSpeed(u32),
    /// RU `n` (modulo their number) dies: its connections close. The EVM aborts the run (an
    /// RU is not replaceable within a run); every component says why.
    KillRu(usize),
    /// The source of stream `s` of RU `n` dies before the run's end: the RU fails the run.
    KillSource {
        /// Which RU.
        n: usize,
        /// Which stream.
        s: usize,
    },
    /// The EVM dies: every RU and BU loses it and fails; nobody hangs.
    KillEvm,
    /// The connection between the `n`-th live BU and the EVM drops, both alive: the EVM takes
    /// the BU for gone (its events re-assigned), the BU fails.
    DropEvmLink(usize),
    /// The connection between the `n`-th live BU and RU `r` drops, both alive: the BU leaves
    /// the run, the EVM re-assigns its events, the run goes on.
    DropRuLink {
        /// Which live BU.
        n: usize,
        /// Which RU.
        r: usize,
    },
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
    /// A BU wrote more than its disk could take.
    Disk,
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

/// One BU process (a reused id is a new process): the real [`BuMachine`], with builder
/// threads emulated (each event takes a random time to build and write, and is confirmed to
/// the machine once flushed, as `Builder` does).
struct BuProc {
    spec: BuSpec,
    life: Life,
    machine: BuMachine,
    evm_in: usize,
    evm_out: usize,
    /// Per RU: RU → this BU, this BU → RU.
    ru_in: Vec<usize>,
    ru_out: Vec<usize>,
    /// Frames received from each RU.
    ru_frames: Vec<u64>,
    /// Its connection to the EVM dropped: what it sends there is lost.
    evm_link_dropped: bool,
    /// When its machine last ticked.
    ticked: Option<Instant>,
    built_bytes: u64,
    building: Vec<(Instant, ReadyEvent)>,
    unflushed: Vec<u64>,
    /// Bytes of the events in `unflushed`.
    unflushed_bytes: u64,
    /// The builder thread's rule ([`FlushRule`]: the real code's), from the spec.
    flush: FlushRule,
    last_flush: Instant,
    /// Stopped while the run goes on: leaves once everything built is confirmed.
    leaving: bool,
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

/// One RU process: the real [`RuMachine`], its sources emulated.
struct RuNode {
    id: u32,
    alive: bool,
    /// Its run loop ended (stopped).
    finished: bool,
    /// When it last ticked.
    ticked: Option<Instant>,
    machine: RuMachine,
    /// BU connections the machine took.
    taken: BTreeSet<ConnId>,
    sources: Vec<Source>,
    from_evm: usize,
    to_evm: usize,
}

/// An RU's connection of BU process `p`.
fn bu_at_ru(p: usize) -> ConnId {
    ConnId(p as u64)
}

/// An RU's connection of the source of stream `s`.
fn source_conn(s: usize) -> ConnId {
    ConnId((1 << 40) | s as u64)
}

/// The EVM's connection of RU `r`.
fn ru_conn(r: usize) -> ConnId {
    ConnId(r as u64)
}

/// The EVM's connection of BU process `p`.
fn bu_conn(p: usize) -> ConnId {
    ConnId((1 << 32) | p as u64)
}

/// The real [`EvmMachine`], and what the simulation keeps of it.
struct EvmNode {
    alive: bool,
    /// When it last ticked.
    ticked: Option<Instant>,
    machine: EvmMachine,
    /// The operator said stop.
    stop_requested: bool,
    /// The accounting at the run end.
    finished: Option<Accounting>,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Deliver(usize),
    Read(usize, usize),
    Send(usize),
    EvmTimer,
    RuTimer(usize),
    BuTimer(usize),
    Thaw(usize),
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
    /// The highest usage any BU's disk reached (percent).
    pub disk_peak_pct: f64,
    /// How many times a BU throttled on its disk, all BUs together.
    pub throttles: u64,
    /// BUs the EVM timed out (silent too long).
    pub timed_out: u64,
    /// Every abort a component sent, with its reason.
    pub aborts: Vec<String>,
    /// A fault that ends the run happened (an RU, a source or the EVM died).
    pub fatal: bool,
    /// The EVM died.
    pub evm_died: bool,
    /// An RU's death or abort reached the EVM before the run's end.
    pub fatal_reached_evm: bool,
    /// The EVM's reason for aborting the run.
    pub evm_failure: Option<String>,
    /// Components alive at the end that did not fail although the EVM died.
    pub unaware_of_evm_death: Vec<String>,
    /// BU processes whose connection to the EVM dropped.
    pub evm_link_dropped: BTreeSet<usize>,
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
    /// How many lines of the trace are kept (`SIM_TRACE=N`; 400 by default).
    trace_lines: usize,
    /// Each BU id's disk.
    disks: BTreeMap<u32, VDisk>,
    /// How many times longer writing takes than `max_build_delay`.
    disk_speed: u32,
    /// The highest usage of any disk (percent).
    disk_peak: f64,
    /// BUs the EVM timed out.
    timed_out: u64,
    /// Every component's abort, with its reason.
    aborts: Vec<String>,
    /// A fault that ends the run happened (an RU, a source or the EVM died).
    fatal: bool,
    /// BU processes whose connection to the EVM was dropped (they fail, rightly).
    evm_link_dropped: BTreeSet<usize>,
    /// The operator stopped every component (the EVM being dead).
    operator_stopped: bool,
    /// An RU's death or abort reached the EVM before the run's end.
    fatal_reached_evm: bool,
}

impl Sim {
    /// A builder as `cfg` says, with failures at the planned times (from the start of the run).
    pub fn new(cfg: SimConfig, mut plan: Vec<(Duration, Chaos)>) -> Sim {
        plan.sort_by_key(|(t, _)| *t);
        let origin = Instant::now();
        let settings = EvmSettings {
            rus: cfg.rus as usize,
            trigger: TriggerMode::Emulated,
            rate_hz: match cfg.triggering {
                Triggering::OnDemand => 0.0,
                Triggering::Paced(n) => f64::from(n) * 1000.0,
            },
            core: CoreConfig {
                reject_fraction: cfg.reject_fraction,
                assign_batch: cfg.assign_batch,
                assign_timeout: cfg.assign_timeout,
                seed: cfg.seed ^ 0x1234,
            },
            reject_group: cfg.reject_group.max(1),
            release_group: cfg.release_group.max(1),
            bu_timeout: cfg.bu_timeout,
            drain_timeout: cfg.drain_timeout,
            stall_timeout: Duration::ZERO,
            max_pending: 1 << 16,
            last_trigger: Some(cfg.max_triggers),
            ..EvmSettings::new(RUN, "evm")
        };
        let mut sim = Sim {
            rng: Rng::new(cfg.seed),
            origin,
            now: origin,
            links: Vec::new(),
            evm: EvmNode {
                alive: true,
                ticked: None,
                machine: EvmMachine::new(settings, origin),
                stop_requested: false,
                finished: None,
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
            trace_lines: std::env::var("SIM_TRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(400),
            disks: BTreeMap::new(),
            disk_speed: 1,
            disk_peak: 0.0,
            timed_out: 0,
            aborts: Vec::new(),
            fatal: false,
            evm_link_dropped: BTreeSet::new(),
            operator_stopped: false,
            fatal_reached_evm: false,
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
            let mut machine = RuMachine::new(&config, RUN, &format!("ru-{r}"), origin);
            let sources = (0..sim.cfg.streams)
                .map(|s| {
                    let source_id = r * 100 + s as u32;
                    // Each source connects and says hello: it takes stream `s`.
                    let hello = Message::Hello {
                        role: Role::Source,
                        id: source_id,
                        run: RUN,
                        name: format!("src-{source_id}"),
                        addr: String::new(),
                        generation: 0,
                    };
                    machine.on_hello(source_conn(s), Ok(hello), origin);
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
            while let Some(o) = machine.next_output() {
                assert!(matches!(o, RuOutput::TakeStream { .. }), "a source is taken: {o:?}");
            }
            let from_evm = sim.link(Node::Evm, Node::Ru(r as usize));
            let to_evm = sim.link(Node::Ru(r as usize), Node::Evm);
            sim.rus.push(RuNode {
                id: r,
                alive: true,
                finished: false,
                ticked: None,
                machine,
                taken: BTreeSet::new(),
                sources,
                from_evm,
                to_evm,
            });
            // The RU connects to the EVM and says hello.
            sim.evm.machine.connected(ru_conn(r as usize), format!("ru-{r}"), origin);
            let hello = Message::Hello {
                role: Role::Ru,
                id: r,
                run: RUN,
                name: format!("ru-{r}"),
                addr: format!("ru-{r}:7200"),
                generation: 0,
            };
            sim.send_frame(to_evm, hello.to_frame());
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
            if t.len() > self.trace_lines {
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
        let settings = BuSettings {
            credits: spec.credits,
            request_batch: spec.request_batch,
            max_bytes_in_flight: spec.max_bytes_in_flight,
            heartbeat: spec.heartbeat,
            ..BuSettings::new(spec.id, RUN, &format!("bu-{p}"))
        };
        // Each BU id writes to the disk of its host (a restarted BU finds what its predecessor
        // wrote there).
        let disk = self.cfg.disk.map(|d| {
            self.disks.entry(spec.id).or_insert(VDisk { total: d.total_bytes, used: 0, ballast: 0 });
            DiskWatcher::new(std::path::Path::new("/sim"), d.marks, d.check_interval)
        });
        let machine = BuMachine::new(settings, disk, self.now);
        self.procs.push(BuProc {
            spec,
            life: Life::Alive,
            machine,
            evm_in,
            evm_out,
            ru_frames: vec![0; self.rus.len()],
            evm_link_dropped: false,
            ticked: None,
            ru_in,
            ru_out,
            built_bytes: 0,
            building: Vec::new(),
            unflushed: Vec::new(),
            unflushed_bytes: 0,
            flush: FlushRule::new(spec.credits, spec.max_bytes_in_flight, 1, spec.flush_interval),
            last_flush: self.now,
            leaving: false,
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
        let now = self.now;
        if !self.evm.alive {
            // Nobody listens: its connection fails.
            self.send(evm_in, Item::Closed);
            return p;
        }
        self.evm.machine.connected(bu_conn(p), format!("bu-{p}"), now);
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
        if was_alive && !self.procs[p].evm_link_dropped {
            let out = self.procs[p].evm_out;
            self.send(out, Item::Closed);
        }
        // Its connections to the RUs close.
        for l in self.procs[p].ru_out.clone() {
            self.send(l, Item::Closed);
        }
        self.note(|| format!("BU process {p} dies"));
    }

    /// BU `p` freezes: it sends nothing more (the EVM's BU timeout declares it dead), and its
    /// process dies `linger` after the EVM closed its connection, its connections open until
    /// then.
    pub fn hang(&mut self, p: usize, linger: Duration) {
        if self.procs[p].life != Life::Alive {
            return;
        }
        let id = self.procs[p].spec.id;
        let b = &mut self.procs[p];
        b.life = Life::Frozen(None);
        b.building.clear();
        b.linger = linger;
        self.note(|| format!("BU process {p} (id {id}) hangs"));
    }

    /// The BUs alive now.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|&p| self.procs[p].life == Life::Alive).collect()
    }

    /// The operator, without an EVM, stops every component.
    fn stop_everyone(&mut self) {
        if std::mem::replace(&mut self.operator_stopped, true) {
            return;
        }
        self.note(|| "stop: the EVM is dead, every component is stopped".to_string());
        for p in self.alive() {
            self.bu_work(p);
        }
        for r in 0..self.rus.len() {
            if self.rus[r].alive {
                self.ru_tick(r);
            }
        }
    }

    /// Events BU process `p` confirmed so far.
    pub fn confirmed_by(&self, p: usize) -> usize {
        self.procs[p].confirmations.len()
    }

    /// Events the EVM holds as assigned to BU id `id` and not yet confirmed.
    pub fn in_flight_at(&self, id: u32) -> usize {
        self.evm.machine.core().bus().find(|b| b.0 == id).map_or(0, |b| b.2)
    }

    /// The EVM's accounting so far.
    pub fn accounting(&self) -> &Accounting {
        self.evm.machine.accounting()
    }

    /// The operator stops the run: the EVM first (it drains, then tells everyone the run's
    /// end); with the EVM dead, every component at once.
    pub fn stop(&mut self) {
        if !self.evm.alive {
            self.stop_everyone();
        }
        if !self.evm.stop_requested {
            self.evm.stop_requested = true;
            self.note(|| "stop".to_string());
            self.evm_tick();
        }
    }

    fn bu_receive(&mut self, p: usize, from: Option<usize>, frame: Frame) {
        if self.procs[p].life != Life::Alive {
            return;
        }
        if let Some(r) = from {
            let ru = self.rus[r].id;
            self.procs[p].ru_frames[r] += 1;
            if frame.kind == KIND_SUPER_FRAGMENT {
                self.check_super_fragment(p, ru, &frame);
            }
            self.procs[p].machine.on_ru_frame(ru, frame.kind, frame.payload);
        } else {
            let m = Message::decode(&frame);
            if let Ok(Message::Triggers { triggers, .. }) = &m {
                self.note(|| {
                    format!(
                        "BU process {p} gets triggers {:?}",
                        triggers.iter().map(|t| t.event_id).collect::<Vec<_>>()
                    )
                });
            }
            self.procs[p].machine.on_evm(m);
        }
        self.bu_act(p);
        self.bu_work(p);
    }

    /// What the simulation checks of a super-fragment a BU receives (before its machine does).
    fn check_super_fragment(&mut self, p: usize, ru: u32, frame: &Frame) {
        let header = match SuperFragment::parse(frame.payload.clone()) {
            Ok(sf) => *sf.header(),
            Err(e) => {
                self.violation(Kind::Protocol, format!("BU process {p}: RU {ru} sent a malformed super-fragment: {e}"));
                return;
            }
        };
        let id = header.event_id.0;
        self.note(|| format!("BU process {p} gets event {id} from RU {ru}"));
        if !self.procs[p].assigned.contains(&id) {
            let holder: Vec<usize> = (0..self.procs.len()).filter(|&q| self.procs[q].assigned.contains(&id)).collect();
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
    }

    /// Does what BU `p`'s machine asks, as `BuIo::act` does: messages to the EVM, hellos to the
    /// RUs (a synchronous connect in the I/O layer, so connected at once), complete events to
    /// the emulated builders.
    fn bu_act(&mut self, p: usize) {
        while let Some(o) = self.procs[p].machine.next_output() {
            match o {
                BuOutput::ToEvm(m) => {
                    match &m {
                        Message::Request { credits, done } => {
                            self.note(|| format!("BU process {p} asks for {credits}, confirms {done:?}"));
                            self.procs[p].confirmations.extend(done);
                            let now = self.now;
                            if *credits > 0 && self.procs[p].machine.disk_report(now).is_some_and(|d| d.throttled) {
                                let what =
                                    format!("BU process {p} asks for {credits} events while its disk throttles it");
                                self.violation(Kind::Disk, what);
                            }
                        }
                        Message::Abort { reason } => self.aborts.push(format!("BU process {p}: {reason}")),
                        _ => {}
                    }
                    let out = self.procs[p].evm_out;
                    if !self.procs[p].evm_link_dropped {
                        self.send_frame(out, m.to_frame());
                    }
                }
                BuOutput::ConnectRus { hello, rus } => {
                    self.note(|| format!("BU process {p} gets the RU list, connects: {hello:?}"));
                    let ids: Vec<u32> = rus.iter().map(|r| r.0).collect();
                    for &ru in &ids {
                        let out = self.procs[p].ru_out[ru as usize];
                        self.send_frame(out, hello.to_frame());
                    }
                    let now = self.now;
                    self.procs[p].machine.rus_connected(&ids, now);
                }
                BuOutput::CloseEvm => {
                    let out = self.procs[p].evm_out;
                    if !std::mem::replace(&mut self.procs[p].evm_link_dropped, true) {
                        self.send(out, Item::Closed);
                    }
                }
            }
        }
        let mut ready = VecDeque::new();
        self.procs[p].machine.take_ready(&mut ready);
        let factor = self.disk_speed;
        for ev in ready {
            let at = self.now + self.delay(self.cfg.max_build_delay * factor);
            self.procs[p].building.push((at, ev));
        }
    }

    /// Builds what is due, flushes as a builder thread does, and ticks the machine.
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
            if self.procs[p].life != Life::Alive {
                return;
            }
        }
        let b = &mut self.procs[p];
        if b.flush.due(b.unflushed.len(), b.unflushed_bytes, now - b.last_flush) {
            for id in std::mem::take(&mut b.unflushed) {
                b.machine.confirmed(id);
            }
            b.unflushed_bytes = 0;
            b.last_flush = now;
        }
        let (events, bytes) = (b.output.len() as u64, b.built_bytes);
        b.machine.built(events, bytes);
        if b.machine.disk_reading_due(now).is_some() {
            let d = &self.disks[&b.spec.id];
            let space = DiskSpace { total_bytes: d.total, free_bytes: d.total.saturating_sub(d.used + d.ballast) };
            b.machine.disk_space(Ok(space), now);
        }
        let stop = b.leaving || self.operator_stopped;
        b.ticked = Some(now);
        let step = b.machine.tick(now, stop, true);
        self.bu_act(p);
        if let Step::Finish { left_during_run } = step {
            // Idle: it goes (its events still in progress are re-assigned by the EVM).
            self.note(|| format!("BU process {p} has ended (left during the run: {left_during_run})"));
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
        if self.cfg.disk.is_some() {
            let bytes = DiskWatcher::record_bytes(built.len);
            let bu_id = self.procs[p].spec.id;
            let d = self.disks.get_mut(&bu_id).expect("made with the BU");
            if d.used + d.ballast + bytes > d.total {
                let what = format!(
                    "BU process {p} (id {bu_id}) writes event {id} ({bytes} bytes) on a disk with {} bytes free: no \
                     space left on device",
                    d.total.saturating_sub(d.used + d.ballast)
                );
                self.violation(Kind::Disk, what);
                self.crash(p);
                return;
            }
            d.used += bytes;
            self.disk_peak = self.disk_peak.max(100.0 * (d.used + d.ballast) as f64 / d.total as f64);
        }
        let b = &mut self.procs[p];
        b.output.push(id);
        b.built_bytes += built.len as u64;
        b.unflushed.push(id);
        b.unflushed_bytes += built.len as u64;
    }

    fn bu_wake(&self, p: usize) -> Option<Instant> {
        let b = &self.procs[p];
        match b.life {
            Life::Dead => return None,
            Life::Frozen(Some(until)) => return Some(until),
            Life::Frozen(None) => return None,
            Life::Alive => {}
        }
        let mut t = b.building.iter().map(|(at, _)| *at).min();
        if !b.unflushed.is_empty() {
            t = min(t, Some(b.last_flush + b.spec.flush_interval));
        }
        // Once the run is over, heartbeats and disk readings change nothing any more.
        if self.evm.finished.is_none() {
            t = min(t, cadence(b.machine.next_timer(), b.ticked));
        }
        t
    }

    // ---------------------------------------------------------------- RUs

    fn ru_receive(&mut self, r: usize, from_bu: Option<usize>, item: Item) {
        let now = self.now;
        match (from_bu, item) {
            (Some(p), Item::Frame(frame)) => {
                let conn = bu_at_ru(p);
                let m = Message::decode(&frame);
                let (id, generation) = match &m {
                    Ok(Message::Hello { id, generation, .. }) => (*id, *generation),
                    _ => (u32::MAX, 0),
                };
                self.note(|| format!("RU {r}: hello from BU process {p} (id {id}, generation {generation})"));
                self.rus[r].machine.on_hello(conn, m, now);
                if self.rus[r].machine.is_held(conn) {
                    let gone = self.rus[r].machine.core().bu_generations_gone(id);
                    self.held_by_ru.push(format!(
                        "RU {r} held BU process {p} (id {id}, generation {generation}): generation {gone} of id {id} \
                         not gone yet"
                    ));
                }
            }
            (Some(p), Item::Closed) => {
                self.note(|| format!("RU {r}: the connection of BU process {p} closed"));
                self.rus[r].taken.remove(&bu_at_ru(p));
                self.rus[r].machine.bu_closed(bu_at_ru(p), "closed the connection", now);
            }
            (None, Item::Frame(frame)) => {
                if let Ok(m) = Message::decode(&frame) {
                    self.note(|| format!("RU {r}: {m:?} from the EVM"));
                }
                self.rus[r].machine.on_evm(&frame, now);
            }
            (None, Item::Closed) => self.rus[r].machine.evm_closed("closed the connection"),
        }
        self.ru_act(r);
    }

    /// Does what RU `r`'s machine asks, as `RuIo::act` does.
    fn ru_act(&mut self, r: usize) {
        while let Some(o) = self.rus[r].machine.next_output() {
            match o {
                RuOutput::ToEvm(m) => {
                    if let Message::Abort { reason } = &m {
                        self.aborts.push(format!("RU {r}: {reason}"));
                    }
                    let link = self.rus[r].to_evm;
                    self.send_frame(link, m.to_frame());
                }
                RuOutput::TakeStream { .. } => {}
                RuOutput::TakeBu { conn, bu, .. } => {
                    self.note(|| format!("RU {r}: BU {bu} ({conn:?}) connected"));
                    self.rus[r].taken.insert(conn);
                }
                RuOutput::Close(conn, why) => {
                    let Some(p) = (0..self.procs.len()).find(|&p| bu_at_ru(p) == conn) else { continue };
                    let was_taken = self.rus[r].taken.remove(&conn);
                    self.note(|| format!("RU {r}: closes the connection of BU process {p}: {why}"));
                    if !was_taken {
                        self.refused_by_ru.push(format!("RU {r} refused BU process {p}: {why}"));
                    } else if self.procs[p].life == Life::Alive
                        && self.evm.machine.role_of(bu_conn(p)) == Some(Role::Bu)
                    {
                        // The EVM counts it in the run, yet an RU dropped it: the generations
                        // make sure a BU gone names only a BU that left.
                        let what = format!("RU {r} dropped live BU process {p}: {why}");
                        self.dropped_by_ru.push(what.clone());
                        self.violation(Kind::Protocol, what);
                    }
                    let link = self.procs[p].ru_in[r];
                    self.send(link, Item::Closed);
                }
            }
        }
    }

    /// When RU `r`'s machine wants a tick.
    fn ru_wake(&self, r: usize) -> Option<Instant> {
        cadence(self.rus[r].machine.next_timer(), self.rus[r].ticked)
    }

    /// RU `r`'s clock.
    fn ru_tick(&mut self, r: usize) {
        let now = self.now;
        self.rus[r].ticked = Some(now);
        let step = self.rus[r].machine.tick(now, self.operator_stopped, false);
        self.ru_act(r);
        if step == RuStep::Finish {
            self.note(|| format!("RU {r} has ended"));
            self.rus[r].finished = true;
        }
    }

    /// Whether stream `s` of RU `r` can be read now: the source has a fragment (or its end),
    /// and the RU reads it.
    fn may_read(&self, r: usize, s: usize) -> bool {
        let src = &self.rus[r].sources[s];
        !src.ended && src.ready_at <= self.now && self.rus[r].machine.may_read(s)
    }

    /// When a stream the RU reads has its next fragment.
    fn source_wake(&self) -> Option<Instant> {
        let mut t = None;
        for ru in &self.rus {
            for (s, src) in ru.sources.iter().enumerate() {
                if ru.alive && !src.ended && ru.machine.may_read(s) {
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
                self.rus[r].machine.on_stream_frame(s, Message::End { last_event: last }.to_frame());
                self.ru_act(r);
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
            self.rus[r].machine.on_stream_frame(s, Frame::new(KIND_FRAGMENT, bytes));
            if self.rus[r].machine.failure().is_some() {
                self.rus[r].sources[s].ended = true;
                self.ru_act(r);
                return;
            }
        }
    }

    fn can_send(&self, r: usize) -> bool {
        let m = &self.rus[r].machine;
        m.core().rejects_waiting() || m.bus().any(|(bu, _)| m.core().next_ready(bu).is_some())
    }

    fn ru_send(&mut self, r: usize) {
        self.rus[r].machine.core_mut().process_rejects();
        let bus: Vec<(u32, ConnId)> = self.rus[r].machine.bus().collect();
        let mut fragments = Vec::new();
        for (bu, conn) in bus {
            let Some(p) = (0..self.procs.len()).find(|&p| bu_at_ru(p) == conn) else { continue };
            let n = 1 + self.below(16);
            for _ in 0..n {
                let Some(header) = self.rus[r].machine.core_mut().next_into(bu, &mut fragments) else { break };
                let mut payload = BytesMut::from(&header.encode()[..]);
                for f in &fragments {
                    payload.extend_from_slice(f);
                }
                let link = self.procs[p].ru_in[r];
                self.note(|| format!("RU {r}: sends event {} to BU {bu} (process {p})", header.event_id.0));
                self.send_frame(link, Frame::new(KIND_SUPER_FRAGMENT, payload.freeze()));
            }
        }
    }

    // ---------------------------------------------------------------- EVM

    /// What reaches the EVM from a connection: a frame, or its end.
    fn evm_receive(&mut self, conn: ConnId, item: Item) {
        let now = self.now;
        if self.evm.finished.is_none() && self.evm.machine.role_of(conn) == Some(Role::Ru) {
            let abort = matches!(&item, Item::Frame(f) if matches!(Message::decode(f), Ok(Message::Abort { .. })));
            if abort || matches!(item, Item::Closed) {
                self.fatal_reached_evm = true;
            }
        }
        match item {
            Item::Closed => {
                self.note(|| format!("EVM: connection {conn:?} closed"));
                self.evm.machine.closed(conn, "closed the connection", now);
            }
            Item::Frame(f) => {
                if let Ok(Message::Request { credits, done }) = Message::decode(&f) {
                    self.note(|| format!("EVM: {conn:?} asks for {credits}, confirms {done:?}"));
                }
                self.evm.machine.on_frame(conn, f, now);
            }
        }
        self.evm_tick();
    }

    /// What `EvmIo::tick` does after every message and every millisecond.
    fn evm_tick(&mut self) {
        if self.evm.finished.is_some() || !self.evm.alive {
            return;
        }
        let ns = self.at().as_nanos() as u64;
        let now = self.now;
        self.evm.ticked = Some(now);
        self.evm.machine.tick(now, ns, self.evm.stop_requested);
        self.evm_act();
        if self.evm.machine.done() {
            self.evm_finish();
        }
    }

    /// Does what the EVM's machine asks, as `EvmIo::act` does.
    fn evm_act(&mut self) {
        while let Some(o) = self.evm.machine.next_output() {
            match o {
                EvmOutput::Send(conn, frame) => {
                    if let Some(r) = (0..self.rus.len()).find(|&r| ru_conn(r) == conn) {
                        // The EVM sends one frame to every RU it knows, in the order of their
                        // connections: recorded once, at the first.
                        let first =
                            (0..self.rus.len()).find(|&q| self.evm.machine.role_of(ru_conn(q)) == Some(Role::Ru));
                        if first == Some(r) {
                            self.record_to_rus(&frame);
                        }
                        let link = self.rus[r].from_evm;
                        self.send_frame(link, frame);
                    } else if let Some(p) = (0..self.procs.len()).find(|&p| bu_conn(p) == conn) {
                        match Message::decode(&frame) {
                            Ok(Message::Triggers { triggers, .. }) => {
                                self.procs[p].assigned.extend(triggers.iter().map(|t| t.event_id));
                            }
                            Ok(Message::RuList { generation, .. }) => {
                                self.procs[p].admitted = true;
                                self.note(|| format!("EVM: BU process {p} admitted, generation {generation}"));
                            }
                            _ => {}
                        }
                        if !self.evm_link_dropped.contains(&p) {
                            let link = self.procs[p].evm_in;
                            self.send_frame(link, frame);
                        }
                    }
                }
                EvmOutput::Close(conn, why) => {
                    self.note(|| format!("EVM: closes {conn:?}: {why}"));
                    self.timed_out += u64::from(why.starts_with("silent"));
                    let now = self.now;
                    self.evm.machine.closed(conn, &why, now);
                    if let Some(p) = (0..self.procs.len()).find(|&p| bu_conn(p) == conn) {
                        let link = self.procs[p].evm_in;
                        self.send(link, Item::Closed);
                        if self.procs[p].life == Life::Frozen(None) {
                            self.procs[p].life = Life::Frozen(Some(self.now + self.procs[p].linger));
                        }
                    } else {
                        self.violation(Kind::Protocol, format!("the EVM closed RU connection {conn:?}: {why}"));
                    }
                }
                EvmOutput::Limits(..) => {}
            }
        }
    }

    /// What the EVM tells every RU, recorded once: assignments, releases (built) and rejects.
    fn record_to_rus(&mut self, frame: &Frame) {
        match frame.kind {
            messages::KIND_DISCARD | messages::KIND_REJECT => match messages::decode(frame) {
                Ok(g) if g.kind() == MessageKind::Discard => self.released.extend(g.event_ids()),
                Ok(g) => self.rejected.extend(g.event_ids()),
                Err(_) => {}
            },
            _ => {
                if let Ok(Message::Assign { events, .. }) = Message::decode(frame) {
                    self.assigned.extend(events);
                }
            }
        }
    }

    /// The EVM ended the run.
    fn evm_finish(&mut self) {
        let acc = self.evm.machine.accounting().clone();
        let last = self.evm.machine.core().stopped_at().unwrap_or(0);
        for p in 0..self.procs.len() {
            if self.procs[p].life == Life::Alive && self.evm.machine.role_of(bu_conn(p)) == Some(Role::Bu) {
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
        if self.evm.finished.is_some() || !self.evm.alive {
            return None;
        }
        cadence(self.evm.machine.next_timer(), self.evm.ticked)
    }

    /// Whether the EVM reads what `link` brings now (it holds back a BU hello waiting for its id).
    fn evm_reads(&self, link: usize) -> bool {
        let conn = match self.links[link].from {
            Node::Ru(r) => ru_conn(r),
            Node::Bu(p) => bu_conn(p),
            Node::Evm => return false,
        };
        !self.evm.machine.knows(conn) || self.evm.machine.reads(conn)
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
        let dead = match to {
            Node::Evm => !self.evm.alive,
            Node::Ru(r) => !self.rus[r].alive,
            Node::Bu(_) => false,
        };
        if dead {
            return;
        }
        match (to, item) {
            (Node::Evm, item) => {
                let conn = match self.links[link].from {
                    Node::Ru(r) => ru_conn(r),
                    Node::Bu(p) => bu_conn(p),
                    Node::Evm => unreachable!("the EVM does not send to itself"),
                };
                self.evm_receive(conn, item);
            }
            (Node::Ru(r), item) => self.ru_receive(r, sender, item),
            (Node::Bu(p), Item::Frame(frame)) => self.bu_receive(p, sender, frame),
            (Node::Bu(p), Item::Closed) if self.procs[p].life == Life::Alive => {
                match sender {
                    // The EVM closed the connection.
                    None => self.procs[p].machine.evm_closed("closed the connection"),
                    Some(r) => {
                        let ru = self.rus[r].id;
                        let frames = self.procs[p].ru_frames[r];
                        self.procs[p].machine.ru_closed(ru, "closed the connection", frames);
                    }
                }
                self.bu_act(p);
                self.bu_work(p);
            }
            (_, Item::Closed) => {}
        }
    }

    fn enabled(&self, out: &mut Vec<Action>) {
        out.clear();
        let now = self.now;
        for (i, l) in self.links.iter().enumerate() {
            if l.queue.front().is_some_and(|(at, _)| *at <= now) && (l.to != Node::Evm || self.evm_reads(i)) {
                out.push(Action::Deliver(i));
            }
        }
        for r in 0..self.rus.len() {
            if !self.rus[r].alive {
                continue;
            }
            for s in 0..self.cfg.streams {
                if self.may_read(r, s) {
                    out.push(Action::Read(r, s));
                }
            }
            if self.can_send(r) {
                out.push(Action::Send(r));
            }
            if !self.rus[r].finished && self.ru_wake(r).is_some_and(|t| t <= now) {
                out.push(Action::RuTimer(r));
            }
        }
        if self.evm_wake().is_some_and(|t| t <= now) {
            out.push(Action::EvmTimer);
        }
        for p in 0..self.procs.len() {
            match self.procs[p].life {
                Life::Frozen(Some(until)) if until <= now => out.push(Action::Thaw(p)),
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
        for r in (0..self.rus.len()).filter(|&r| self.rus[r].alive && !self.rus[r].finished) {
            consider(self.ru_wake(r));
        }
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
            Action::RuTimer(r) => self.ru_tick(r),
            Action::BuTimer(p) => self.bu_work(p),
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
                let last = self.evm.machine.core().stopped_at().unwrap_or(0);
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
                    let linger = self.delay(Duration::from_millis(20));
                    self.hang(alive[n % alive.len()], linger);
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
                        let linger = self.delay(Duration::from_millis(20));
                        self.hang(p, linger);
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
            Chaos::FillDisk(f) => {
                if let Some(spec) = self.cfg.disk {
                    let from = (spec.marks.low_pct - 5.0).max(0.0);
                    let to = (spec.marks.high_pct + 100.0) / 2.0;
                    let pct = from + (to - from) * f64::from(f.min(100)) / 100.0;
                    for d in self.disks.values_mut() {
                        d.ballast = ((d.total as f64 * pct / 100.0) as u64).saturating_sub(d.used);
                    }
                    self.note(|| format!("the disks are filled to {pct:.1} %"));
                }
            }
            Chaos::FreeDisk => {
                for d in self.disks.values_mut() {
                    d.ballast = 0;
                }
            }
            Chaos::DiskSpeed(factor) => self.disk_speed = factor.max(1),
            Chaos::KillRu(n) => {
                let r = n % self.rus.len();
                if self.rus[r].alive {
                    self.fatal = true;
                    self.rus[r].alive = false;
                    let to_evm = self.rus[r].to_evm;
                    self.send(to_evm, Item::Closed);
                    for p in 0..self.procs.len() {
                        let link = self.procs[p].ru_in[r];
                        self.send(link, Item::Closed);
                    }
                    self.note(|| format!("RU {r} dies"));
                }
            }
            Chaos::KillSource { n, s } => {
                let r = n % self.rus.len();
                let s = s % self.cfg.streams;
                if self.rus[r].alive && !self.rus[r].sources[s].ended {
                    self.fatal = true;
                    self.rus[r].sources[s].ended = true;
                    self.rus[r].machine.stream_closed(s, "closed the connection");
                    self.ru_act(r);
                    self.note(|| format!("the source of stream {s} of RU {r} dies"));
                }
            }
            Chaos::KillEvm => {
                if self.evm.alive && self.evm.finished.is_none() {
                    self.fatal = true;
                    self.evm.alive = false;
                    for r in 0..self.rus.len() {
                        let link = self.rus[r].from_evm;
                        self.send(link, Item::Closed);
                    }
                    for p in 0..self.procs.len() {
                        let link = self.procs[p].evm_in;
                        self.send(link, Item::Closed);
                    }
                    self.note(|| "the EVM dies".to_string());
                    if self.evm.stop_requested {
                        // The operator was stopping the run: it stops everyone now.
                        self.stop_everyone();
                    }
                }
            }
            Chaos::DropEvmLink(n) => {
                let alive = self.alive();
                if !alive.is_empty() && self.evm.alive {
                    let p = alive[n % alive.len()];
                    self.evm_link_dropped.insert(p);
                    let (to_evm, from_evm) = (self.procs[p].evm_out, self.procs[p].evm_in);
                    // What was on its way is lost with the connection; each end sees it close.
                    self.links[to_evm].queue.clear();
                    self.links[from_evm].queue.clear();
                    self.send(to_evm, Item::Closed);
                    self.send(from_evm, Item::Closed);
                    self.procs[p].evm_link_dropped = true;
                    self.note(|| format!("the connection of BU process {p} to the EVM drops"));
                }
            }
            Chaos::DropRuLink { n, r } => {
                let alive = self.alive();
                let r = r % self.rus.len();
                if !alive.is_empty() && self.rus[r].alive {
                    let p = alive[n % alive.len()];
                    let (to_ru, from_ru) = (self.procs[p].ru_out[r], self.procs[p].ru_in[r]);
                    self.links[to_ru].queue.clear();
                    self.links[from_ru].queue.clear();
                    self.send(to_ru, Item::Closed);
                    self.send(from_ru, Item::Closed);
                    self.note(|| format!("the connection of BU process {p} to RU {r} drops"));
                }
            }
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
        // The EVM's books balance after every step: each event triggered is built, rejected,
        // lost, waiting for a BU or in flight at one.
        if self.evm.alive
            && let Err(e) = self.evm.machine.core().check_books()
        {
            self.violation(Kind::Protocol, format!("after {a:?}: {e}"));
        }
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
        if self.evm.finished.is_none() && self.evm.alive {
            self.violation(Kind::Protocol, "the run never ended (nothing left to happen before the run end)".into());
        }
        let mut unaware_of_evm_death = Vec::new();
        if !self.evm.alive {
            for (r, ru) in self.rus.iter().enumerate() {
                if ru.alive && ru.machine.failure().is_none() && ru.machine.core().ended().is_none() {
                    unaware_of_evm_death.push(format!("RU {r}"));
                }
            }
            for (p, b) in self.procs.iter().enumerate() {
                if b.life == Life::Alive && b.machine.failure().is_none() {
                    unaware_of_evm_death.push(format!("BU process {p}"));
                }
            }
        }
        let rus = self
            .rus
            .iter_mut()
            .map(|r| (r.machine.core_mut().leftover(), r.machine.core().counters().clone()))
            .collect();
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
            last_event: self.evm.machine.core().stopped_at().unwrap_or(0),
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
            disk_peak_pct: self.disk_peak,
            throttles: self
                .procs
                .iter()
                .filter_map(|b| b.machine.disk_report(self.now))
                .map(|d| d.throttle_count)
                .sum(),
            timed_out: self.timed_out,
            aborts: self.aborts,
            fatal: self.fatal,
            evm_died: !self.evm.alive,
            fatal_reached_evm: self.fatal_reached_evm,
            evm_failure: self.evm.machine.failure().map(str::to_owned),
            unaware_of_evm_death,
            evm_link_dropped: self.evm_link_dropped,
        }
    }
}

/// A machine's next timer as its I/O layer keeps it: one that is due and was ticked at already
/// waits for the layer's next millisecond tick, as `*Io::tick` runs every millisecond (a timer
/// that stays due is one the machine keeps for itself).
fn cadence(wake: Option<Instant>, ticked: Option<Instant>) -> Option<Instant> {
    match (wake, ticked) {
        (Some(w), Some(t)) if w <= t => Some(t + Duration::from_millis(1)),
        (w, _) => w,
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
        if self.evm_died {
            // Nobody keeps the books any more: every component must have noticed.
            if !self.unaware_of_evm_death.is_empty() {
                return Err(format!("the EVM died, and {:?} did not notice", self.unaware_of_evm_death));
            }
            return Ok(());
        }
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
        // Releases and rejects are what reached the RUs: none reaches a dead one.
        if acc.built != released.len() as u64 && !self.fatal {
            e.push(format!("built {} but {} events released", acc.built, released.len()));
        }
        if acc.rejected != rejected.len() as u64 && !self.fatal {
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
        if missing != acc.lost_total() && !self.fatal {
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

    /// Nothing is lost when a BU was there to the end (unless the run was aborted).
    pub fn check_no_loss_with_a_survivor(&self) -> Result<(), String> {
        self.violations_of(Kind::Protocol)?;
        if self.evm_died || self.evm_failure.is_some() {
            return Ok(());
        }
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
        if self.fatal {
            return Ok(());
        }
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

    /// Every abort has its cause: without an RU, a source or the EVM dying, no component
    /// aborts but a BU whose connection to the EVM dropped (it lost the EVM); with one, the EVM
    /// (if it lives, and heard of it before the run's end) aborted the run naming an RU.
    pub fn check_aborts(&self) -> Result<(), String> {
        self.violations_of(Kind::Disk)?;
        if !self.fatal {
            let dropped: Vec<String> = self.evm_link_dropped.iter().map(|p| format!("BU process {p}: ")).collect();
            let unexplained: Vec<&String> = self
                .aborts
                .iter()
                .filter(|a| !(dropped.iter().any(|d| a.starts_with(d)) && a.contains("lost the EVM")))
                .collect();
            if !unexplained.is_empty() || self.evm_failure.is_some() {
                return Err(format!(
                    "aborts without a fatal fault: {unexplained:?}; the EVM's: {:?}",
                    self.evm_failure
                ));
            }
        } else if !self.evm_died && self.fatal_reached_evm {
            match &self.evm_failure {
                Some(why) if why.contains("RU ") => {}
                other => return Err(format!("an RU or a source died, yet the EVM's abort is {other:?}")),
            }
        }
        Ok(())
    }

    /// All five.
    pub fn check_all(&self) -> Result<(), String> {
        self.check_accounting()?;
        self.check_no_loss_with_a_survivor()?;
        self.check_rus_free_everything()?;
        self.check_super_fragments()?;
        self.check_aborts()
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
