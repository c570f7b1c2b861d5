//! The ATLAS DAQ-Unit paper's measurement set-up (prototype −1, its section 4) in one process,
//! built from `daqflow-engine`'s parts: ROBs generating fragments into their event managers, a
//! TRG generating accept / reject / ROI messages in a configured ratio (default 1:100:10 as in
//! the paper), an EBIF-like collector, and a level-2 consumer for ROI data. They talk through
//! [`fifo`]s exactly as separate processes would talk through links; the event builder
//! (`daqflow-evb`) makes them real processes. `daqflow bench engine` measures it (its `rob`
//! case and the ROB loop of fig. 11) and `daqflow engine testbed` runs it, profiled if asked.
//!
//! - **ROB** (tasks `in`, `trg`, `dc`): `in` formats a fragment (a `daqflow-wire` fragment header
//!   with the payload's CRC32C, and a few data words) straight into an event-manager page, while
//!   the manager has room; `trg` handles grouped rejects (frees the events) and ROIs (copies the
//!   wanted fragment to the level-2 consumer); `dc` answers the collector's data requests with a
//!   copy of the fragment and frees events on grouped discards. Each ROB publishes how far it has
//!   generated: the TRG's synchronisation (it never decides an event a ROB does not hold yet).
//! - **TRG** (tasks `input`, `dispatch`): `input` decides the next event (accept, reject, with an
//!   ROI first for some rejected events) into an internal buffer; `dispatch` groups the messages
//!   ([`Grouper`]) and sends rejects and ROIs to every ROB, accepts to the collector.
//! - **EBIF** (tasks `input`, `collect`, `flush`): on an accept, asks every ROB for its fragment;
//!   when all have answered, checks each fragment's CRC, assembles the crate fragment (a
//!   `daqflow-wire` super-fragment) and sends a discard to every ROB.
//!
//! Every event ends rejected or built, at every ROB: [`TestbedReport`] counts them.
//!
//! ```ignore
//! use crate::bench::testbed::{Layout, Testbed, TestbedConfig};
//! let report = Testbed::new(TestbedConfig { events: Some(5_000), ..Default::default() })
//!     .unwrap()
//!     .run(Layout::OneScheduler, None)
//!     .unwrap();
//! assert_eq!(report.decided(), 5_000);
//! assert!(report.is_consistent(), "{report:?}");
//! ```
//!
//! (A binary's examples are not doc-tested; the tests at the end of this file run the same.)

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use daqflow_engine::fifo::{Consumer, Producer, fifo};
use daqflow_engine::messages::{self, ControlMessage, GroupSizes, Grouper, MessageKind};
use daqflow_engine::profile::ThreadStamps;
use daqflow_engine::{
    BoxError, ConfigError, EventManager, EventManagerConfig, IdleStrategy, Module, Report, Scheduler, SchedulerError,
    StopHandle,
};
use daqflow_wire::FRAGMENT_HEADER_LEN;
use daqflow_wire::crc::crc32c;
use daqflow_wire::frame::Frame;
use daqflow_wire::{EventId, Fragment, FragmentFlags, FragmentHeader, SuperFragment, SuperFragmentFlags};

use super::subfarm::{Handler, HandlerMode, Sfi, SfiInput, Sfo, SubfarmCounts, SubfarmShared};

/// Decisions per block of the TRG: accepts, rejects, and ROIs (sent before the reject of as many
/// rejected events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ratio {
    /// Accepted events per block (L2A).
    pub accept: u32,
    /// Rejected events per block (L2R).
    pub reject: u32,
    /// ROI messages per block, each for one of the rejected events (at most `reject`).
    pub roi: u32,
}

impl Default for Ratio {
    /// The paper's 1:100:10.
    fn default() -> Self {
        Ratio { accept: 1, reject: 100, roi: 10 }
    }
}

/// The set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestbedConfig {
    /// ROBs (the paper measured with two).
    pub robs: u32,
    /// Fragment sizes (bytes including the 48-byte header) and their weights; the paper: 512 and
    /// 768 bytes in the ratio 1:3.
    pub fragment_sizes: Vec<(usize, u32)>,
    /// Each ROB's event manager; the paper: 200 pages of 1024 bytes.
    pub event_manager: EventManagerConfig,
    /// The TRG's decisions.
    pub ratio: Ratio,
    /// Messages per group; the paper: ten rejects per message.
    pub groups: GroupSizes,
    /// Slots of every FIFO between modules.
    pub fifo_capacity: usize,
    /// Stop after this many events are decided and freed everywhere (`None`: run until stopped).
    pub events: Option<u64>,
    /// The run number written into fragment headers.
    pub run_number: u32,
    /// The sub-farm after the collector (the paper's SFI → event handler → SFO), if any.
    pub subfarm: Option<SubfarmConfig>,
}

/// The sub-farm behind the collector ([`super::subfarm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubfarmConfig {
    /// How the dummy event handler runs.
    pub handler: HandlerMode,
    /// Events the handler lets the SFI inject ahead of what it forwarded.
    pub window: u32,
    /// The SFO's buffer, bytes.
    pub sfo_buffer: usize,
    /// Where the SFO writes data files (`None`: it drops the events, as in the paper's
    /// measurement).
    pub sfo_directory: Option<std::path::PathBuf>,
}

impl Default for SubfarmConfig {
    fn default() -> Self {
        SubfarmConfig { handler: HandlerMode::Thread, window: 16, sfo_buffer: 4 << 20, sfo_directory: None }
    }
}

impl Default for TestbedConfig {
    fn default() -> Self {
        TestbedConfig {
            robs: 2,
            fragment_sizes: vec![(512, 1), (768, 3)],
            event_manager: EventManagerConfig {
                page_size: 1024,
                pages: 200,
                large_bytes: Some(0),
                max_fragments: None,
            },
            ratio: Ratio::default(),
            groups: GroupSizes::default(),
            fifo_capacity: 256,
            events: None,
            run_number: 1,
            subfarm: None,
        }
    }
}

/// How the modules are spread over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Everything on one scheduler (one thread): the cost of the whole set-up per event.
    OneScheduler,
    /// The ROBs on one scheduler, the TRG, the collector and the level-2 consumer on another (the
    /// paper's set-up: the ROB on a processor of its own). Optionally pinned: (ROB core, others).
    RobsApart(Option<(usize, usize)>),
}

/// Counters shared by a ROB with the TRG (its synchronisation) and the report.
#[derive(Debug, Default)]
struct RobShared {
    generated: AtomicU64,
    freed: AtomicU64,
    rejected: AtomicU64,
    discarded: AtomicU64,
    roi_sent: AtomicU64,
    collected: AtomicU64,
}

fn publish(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Release);
}

#[derive(Debug, Clone, Copy)]
struct Collected {
    rob: u32,
    event_id: u64,
}

struct Rob {
    id: u32,
    run_number: u32,
    em: EventManager,
    sizes: Vec<usize>,
    next: u64,
    limit: u64,
    from_trg: Consumer<Frame>,
    from_ebif: Consumer<Frame>,
    to_ebif: Producer<(Collected, Bytes)>,
    to_l2: Producer<Bytes>,
    shared: Arc<RobShared>,
    counts: [u64; 5],
}

const GENERATED: usize = 0;
const REJECTED: usize = 1;
const DISCARDED: usize = 2;
const ROI_SENT: usize = 3;
const COLLECTED: usize = 4;

impl Rob {
    fn free(&mut self, id: u64, what: usize) -> bool {
        if self.em.remove(id).is_some() {
            self.counts[what] += 1;
            publish(&self.shared.freed, self.counts[REJECTED] + self.counts[DISCARDED]);
            true
        } else {
            false
        }
    }

    fn copy_of(&self, event_id: u64) -> Option<Bytes> {
        let event = self.em.get(event_id)?;
        let f = event.fragments().next()?;
        Some(Bytes::copy_from_slice(f.data))
    }
}

impl Module for Rob {
    fn tasks(&self) -> usize {
        3
    }
    fn task_name(&self, task: usize) -> String {
        format!("rob{}.{}", self.id, ["in", "trg", "dc"][task.min(2)])
    }
    #[inline]
    fn poll(&mut self, task: usize) -> bool {
        match task {
            0 => self.next < self.limit && self.em.has_room(self.sizes[(self.next % self.sizes.len() as u64) as usize]),
            1 => !self.from_trg.is_empty() && self.to_l2.slots() > 0,
            _ => !self.from_ebif.is_empty() && self.to_ebif.slots() > 0,
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            0 => {
                let id = self.next;
                let len = self.sizes[(id % self.sizes.len() as u64) as usize];
                let (rob, run) = (self.id, self.run_number);
                self.em.insert_with(id, rob, len, |page| {
                    let (head, payload) = page.split_at_mut(FRAGMENT_HEADER_LEN);
                    // The ROD header and a few data words; the rest of the page is what it held.
                    payload[..8].copy_from_slice(&id.to_le_bytes());
                    payload[8..12].copy_from_slice(&rob.to_le_bytes());
                    let header = FragmentHeader {
                        flags: FragmentFlags::empty(),
                        source_id: rob,
                        event_id: EventId(id),
                        run_number: run,
                        trigger_type: 0,
                        timestamp: id,
                        payload_len: payload.len() as u32,
                        payload_crc: crc32c(payload),
                    };
                    head.copy_from_slice(&header.encode());
                })?;
                self.next += 1;
                self.counts[GENERATED] += 1;
                publish(&self.shared.generated, self.next);
            }
            1 => {
                let frame = self.from_trg.pop()?;
                let group = messages::decode(&frame)?;
                match group.kind() {
                    MessageKind::Reject => {
                        for id in group.event_ids() {
                            if !self.free(id, REJECTED) {
                                return Err(
                                    format!("ROB {}: reject of event {id}, which it does not hold", self.id).into()
                                );
                            }
                        }
                        publish(&self.shared.rejected, self.counts[REJECTED]);
                    }
                    MessageKind::Roi => {
                        for m in group.iter() {
                            if let ControlMessage::Roi { event_id, base, mask, .. } = m {
                                let wanted =
                                    self.id.checked_sub(base).is_some_and(|bit| bit < 64 && mask >> bit & 1 == 1);
                                if wanted {
                                    let data = self.copy_of(event_id).ok_or_else(|| {
                                        format!("ROB {}: ROI for event {event_id}, which it does not hold", self.id)
                                    })?;
                                    self.to_l2.push(data).map_err(|_| "level-2 FIFO full")?;
                                    self.counts[ROI_SENT] += 1;
                                }
                            }
                        }
                        publish(&self.shared.roi_sent, self.counts[ROI_SENT]);
                    }
                    other => return Err(format!("ROB {}: unexpected {} from the TRG", self.id, other.name()).into()),
                }
            }
            _ => {
                let frame = self.from_ebif.pop()?;
                let group = messages::decode(&frame)?;
                match group.kind() {
                    MessageKind::Accept => {
                        for id in group.event_ids() {
                            let data = self.copy_of(id).ok_or_else(|| {
                                format!("ROB {}: data request for event {id}, which it does not hold", self.id)
                            })?;
                            self.to_ebif
                                .push((Collected { rob: self.id, event_id: id }, data))
                                .map_err(|_| "collector FIFO full")?;
                            self.counts[COLLECTED] += 1;
                        }
                        publish(&self.shared.collected, self.counts[COLLECTED]);
                    }
                    MessageKind::Discard => {
                        for id in group.event_ids() {
                            if !self.free(id, DISCARDED) {
                                return Err(
                                    format!("ROB {}: discard of event {id}, which it does not hold", self.id).into()
                                );
                            }
                        }
                        publish(&self.shared.discarded, self.counts[DISCARDED]);
                    }
                    other => {
                        return Err(format!("ROB {}: unexpected {} from the collector", self.id, other.name()).into());
                    }
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct TrgShared {
    accepts: AtomicU64,
    rejects: AtomicU64,
    rois: AtomicU64,
}

struct Trg {
    ratio: Ratio,
    next: u64,
    limit: u64,
    robs: Vec<Arc<RobShared>>,
    /// The lowest `generated` of the ROBs last time we looked.
    synced: u64,
    buffer: VecDeque<ControlMessage>,
    grouper: Grouper,
    blocked: bool,
    to_robs: Vec<Producer<Frame>>,
    to_ebif: Producer<Frame>,
    shared: Arc<TrgShared>,
    counts: [u64; 3],
}

const BUFFER: usize = 64;

impl Trg {
    fn can_decide(&mut self) -> bool {
        if self.next >= self.limit || self.buffer.len() + 2 > BUFFER {
            return false;
        }
        if self.next >= self.synced {
            self.synced = self.robs.iter().map(|r| r.generated.load(Ordering::Acquire)).min().unwrap_or(0);
        }
        self.next < self.synced
    }

    fn send(&mut self, frame: Frame) -> Result<(), BoxError> {
        if frame.kind == messages::KIND_ACCEPT {
            self.to_ebif.push(frame).map_err(|_| "collector FIFO full")?;
        } else {
            for tx in &mut self.to_robs {
                tx.push(frame.clone()).map_err(|_| "ROB FIFO full")?;
            }
        }
        Ok(())
    }

    fn outputs_have_room(&self) -> bool {
        self.to_ebif.slots() > 0 && self.to_robs.iter().all(|t| t.slots() > 0)
    }
}

impl Module for Trg {
    fn tasks(&self) -> usize {
        2
    }
    fn task_name(&self, task: usize) -> String {
        ["trg.input", "trg.dispatch"][task.min(1)].to_owned()
    }
    #[inline]
    fn poll(&mut self, task: usize) -> bool {
        if task == 0 {
            let ok = self.can_decide();
            self.blocked = !ok;
            ok
        } else {
            (!self.buffer.is_empty() || (self.blocked && self.grouper.pending() > 0)) && self.outputs_have_room()
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        if task == 0 {
            let id = self.next;
            let block = u64::from(self.ratio.accept + self.ratio.reject).max(1);
            let k = (id % block) as u32;
            if k < self.ratio.accept {
                self.buffer.push_back(ControlMessage::Accept { event_id: id, trigger_type: 1, destination: 0 });
                self.counts[0] += 1;
            } else {
                if k - self.ratio.accept < self.ratio.roi {
                    let n = self.robs.len().min(64) as u32;
                    let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
                    self.buffer.push_back(ControlMessage::Roi { event_id: id, destination: 0, base: 0, mask });
                    self.counts[2] += 1;
                }
                self.buffer.push_back(ControlMessage::Reject { event_id: id });
                self.counts[1] += 1;
            }
            self.next += 1;
            publish(&self.shared.accepts, self.counts[0]);
            publish(&self.shared.rejects, self.counts[1]);
            publish(&self.shared.rois, self.counts[2]);
        } else {
            // One message per action, so that a full output stops us between messages.
            if let Some(m) = self.buffer.pop_front() {
                if let Some(frame) = self.grouper.push(m) {
                    self.send(frame)?;
                }
            } else {
                for frame in self.grouper.flush() {
                    self.send(frame)?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct EbifShared {
    built: AtomicU64,
    bytes: AtomicU64,
}

struct Ebif {
    from_trg: Consumer<Frame>,
    from_robs: Vec<Consumer<(Collected, Bytes)>>,
    to_robs: Vec<Producer<Frame>>,
    collecting: HashMap<u64, Vec<Option<Fragment>>>,
    discards: Grouper,
    shared: Arc<EbifShared>,
    built: u64,
    bytes: u64,
    /// The crate fragments to the SFI, with a sub-farm.
    to_sfi: Option<Producer<Bytes>>,
}

impl Ebif {
    fn send_to_robs(&mut self, frame: Frame) -> Result<(), BoxError> {
        for tx in &mut self.to_robs {
            tx.push(frame.clone()).map_err(|_| "ROB FIFO full")?;
        }
        Ok(())
    }
    fn robs_have_room(&self) -> bool {
        self.to_robs.iter().all(|t| t.slots() > 1)
    }
}

impl Module for Ebif {
    fn tasks(&self) -> usize {
        3
    }
    fn task_name(&self, task: usize) -> String {
        ["ebif.input", "ebif.collect", "ebif.flush"][task.min(2)].to_owned()
    }
    #[inline]
    fn poll(&mut self, task: usize) -> bool {
        match task {
            0 => !self.from_trg.is_empty() && self.robs_have_room() && self.collecting.len() < 64,
            1 => {
                self.robs_have_room()
                    && self.to_sfi.as_ref().is_none_or(|t| t.slots() > 0)
                    && self.from_robs.iter().any(|r| !r.is_empty())
            }
            _ => {
                self.discards.pending() > 0
                    && self.from_trg.is_empty()
                    && self.from_robs.iter().all(|r| r.is_empty())
                    && self.robs_have_room()
            }
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            0 => {
                let frame = self.from_trg.pop()?;
                let group = messages::decode(&frame)?;
                if group.kind() != MessageKind::Accept {
                    return Err(format!("collector: unexpected {} from the TRG", group.kind().name()).into());
                }
                for id in group.event_ids() {
                    self.collecting.insert(id, vec![None; self.to_robs.len()]);
                }
                // The data request to every ROB is the accept itself.
                self.send_to_robs(frame)?;
            }
            1 => {
                for r in 0..self.from_robs.len() {
                    let Ok((c, data)) = self.from_robs[r].pop() else { continue };
                    let fragment = Fragment::parse(data)?;
                    fragment.verify_crc()?;
                    let slots = self
                        .collecting
                        .get_mut(&c.event_id)
                        .ok_or_else(|| format!("collector: data for event {} it did not ask for", c.event_id))?;
                    slots[c.rob as usize] = Some(fragment);
                    if slots.iter().all(Option::is_some) {
                        let fragments: Vec<Fragment> =
                            self.collecting.remove(&c.event_id).into_iter().flatten().flatten().collect();
                        let crate_fragment =
                            SuperFragment::assemble(0, EventId(c.event_id), SuperFragmentFlags::default(), &fragments);
                        self.built += 1;
                        self.bytes += crate_fragment.len() as u64;
                        if let Some(to_sfi) = self.to_sfi.as_mut() {
                            to_sfi.push(crate_fragment.clone()).map_err(|_| "collector: the SFI's FIFO is full")?;
                        }
                        publish(&self.shared.built, self.built);
                        publish(&self.shared.bytes, self.bytes);
                        if let Some(frame) = self.discards.push(ControlMessage::Discard { event_id: c.event_id }) {
                            self.send_to_robs(frame)?;
                        }
                    }
                }
            }
            _ => {
                for frame in self.discards.flush() {
                    self.send_to_robs(frame)?;
                }
            }
        }
        Ok(())
    }
}

/// Counts ROI data arriving at the level-2 consumer.
struct Level2 {
    from_robs: Vec<Consumer<Bytes>>,
    received: Arc<AtomicU64>,
    count: u64,
}

impl Module for Level2 {
    fn tasks(&self) -> usize {
        1
    }
    fn task_name(&self, _: usize) -> String {
        "l2.input".into()
    }
    fn poll(&mut self, _: usize) -> bool {
        self.from_robs.iter().any(|r| !r.is_empty())
    }
    fn action(&mut self, _: usize) -> Result<(), BoxError> {
        for r in &mut self.from_robs {
            while let Ok(data) = r.pop() {
                Fragment::parse(data)?.verify_crc()?;
                self.count += 1;
            }
        }
        publish(&self.received, self.count);
        Ok(())
    }
}

/// The ROBs, the TRG, the collector and the level-2 consumer, wired, ready to run.
pub struct Testbed {
    config: TestbedConfig,
    robs: Vec<Rob>,
    trg: Trg,
    ebif: Ebif,
    l2: Level2,
    rob_shared: Vec<Arc<RobShared>>,
    trg_shared: Arc<TrgShared>,
    ebif_shared: Arc<EbifShared>,
    l2_received: Arc<AtomicU64>,
    subfarm: Option<Subfarm>,
}

/// The sub-farm's modules, its handler and its counts.
struct Subfarm {
    sfi: Sfi,
    sfo: Sfo,
    handler: Handler,
    shared: Arc<SubfarmShared>,
}

impl std::fmt::Debug for Testbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbed").field("config", &self.config).finish_non_exhaustive()
    }
}

/// What a test-bed run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestbedReport {
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Fragments generated, per ROB.
    pub generated: Vec<u64>,
    /// Events freed by a reject, per ROB.
    pub rejected: Vec<u64>,
    /// Events freed by a discard, per ROB.
    pub discarded: Vec<u64>,
    /// Events still held, per ROB (0 after a run to a fixed count).
    pub held: Vec<u64>,
    /// ROI fragments sent to level 2, per ROB.
    pub roi_sent: Vec<u64>,
    /// ROI fragments level 2 received.
    pub roi_received: u64,
    /// Accepts, rejects and ROIs the TRG decided.
    pub accepts: u64,
    /// Rejects decided.
    pub rejects: u64,
    /// ROIs decided.
    pub rois: u64,
    /// Crate fragments built by the collector.
    pub built: u64,
    /// Bytes of crate fragments built.
    pub built_bytes: u64,
    /// Each scheduler's report (counters, stamps if profiling).
    pub schedulers: Vec<Report>,
    /// The sub-farm's counts, with one.
    pub subfarm: Option<SubfarmCounts>,
}

impl TestbedReport {
    /// Events decided and freed at every ROB.
    pub fn decided(&self) -> u64 {
        self.rejected.iter().zip(&self.discarded).map(|(r, d)| r + d).min().unwrap_or(0)
    }

    /// Whether every event is accounted for: at each ROB, generated = rejected + discarded +
    /// held; rejected ≤ the TRG's rejects, discarded ≤ built ≤ accepts; every ROI sent arrived.
    pub fn is_consistent(&self) -> bool {
        (0..self.generated.len()).all(|i| {
            self.generated[i] == self.rejected[i] + self.discarded[i] + self.held[i]
                && self.rejected[i] <= self.rejects
                && self.discarded[i] <= self.built
        }) && self.built <= self.accepts
            && self.roi_sent.iter().sum::<u64>() == self.roi_received
            && self.subfarm.is_none_or(|s| s.received == self.built && s.is_drained(1))
    }

    /// Stamps of every scheduler that profiled.
    pub fn stamps(&self) -> Vec<ThreadStamps> {
        self.schedulers.iter().filter_map(|r| r.stamps.clone()).collect()
    }
}

impl Testbed {
    /// Wires the modules.
    pub fn new(config: TestbedConfig) -> Result<Testbed, ConfigError> {
        if config.robs == 0 || config.robs > 64 {
            return Err(ConfigError::Invalid("robs must be between 1 and 64".into()));
        }
        let weight: u32 = config.fragment_sizes.iter().map(|s| s.1).sum();
        if weight == 0 || weight > 1000 {
            return Err(ConfigError::Invalid("fragment size weights must add up to between 1 and 1000".into()));
        }
        let header = FRAGMENT_HEADER_LEN;
        if let Some(&(s, _)) = config
            .fragment_sizes
            .iter()
            .find(|(s, _)| *s < header + 16 || *s > config.event_manager.page_size || s % 8 != 0)
        {
            return Err(ConfigError::Invalid(format!(
                "fragment size {s} must be a multiple of 8 between {} and the page size {}",
                header + 16,
                config.event_manager.page_size
            )));
        }
        let sizes: Vec<usize> =
            config.fragment_sizes.iter().flat_map(|&(s, w)| std::iter::repeat_n(s, w as usize)).collect();
        let limit = config.events.unwrap_or(u64::MAX);
        let cap = config.fifo_capacity.max(4);
        let n = config.robs as usize;
        let (mut trg_to_rob, mut ebif_to_rob, mut rob_to_ebif, mut rob_to_l2) = (vec![], vec![], vec![], vec![]);
        let mut robs = Vec::with_capacity(n);
        let mut rob_shared = Vec::with_capacity(n);
        for id in 0..config.robs {
            let (t_tx, t_rx) = fifo(cap);
            let (e_tx, e_rx) = fifo(cap);
            let (d_tx, d_rx) = fifo(cap);
            let (l_tx, l_rx) = fifo(cap);
            trg_to_rob.push(t_tx);
            ebif_to_rob.push(e_tx);
            rob_to_ebif.push(d_rx);
            rob_to_l2.push(l_rx);
            let shared = Arc::new(RobShared::default());
            rob_shared.push(shared.clone());
            robs.push(Rob {
                id,
                run_number: config.run_number,
                em: EventManager::new(config.event_manager.clone())?,
                sizes: sizes.clone(),
                next: 0,
                limit,
                from_trg: t_rx,
                from_ebif: e_rx,
                to_ebif: d_tx,
                to_l2: l_tx,
                shared,
                counts: [0; 5],
            });
        }
        let (a_tx, a_rx) = fifo(cap);
        let trg_shared = Arc::new(TrgShared::default());
        let trg = Trg {
            ratio: config.ratio,
            next: 0,
            limit,
            robs: rob_shared.clone(),
            synced: 0,
            buffer: VecDeque::with_capacity(BUFFER),
            grouper: Grouper::new(config.groups),
            blocked: false,
            to_robs: trg_to_rob,
            to_ebif: a_tx,
            shared: trg_shared.clone(),
            counts: [0; 3],
        };
        let ebif_shared = Arc::new(EbifShared::default());
        let (to_sfi, subfarm) = match &config.subfarm {
            None => (None, None),
            Some(sc) => {
                let (tx, rx) = fifo(cap);
                let shared = Arc::new(SubfarmShared::default());
                let listener = std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(|e| ConfigError::Invalid(format!("the SFO's listener: {e}")))?;
                let sfo_addr =
                    listener.local_addr().map_err(|e| ConfigError::Invalid(format!("the SFO's listener: {e}")))?;
                let handler = Handler::start(&sc.handler, sfo_addr, sc.window)
                    .map_err(|e| ConfigError::Invalid(format!("the event handler: {e}")))?;
                let em =
                    EventManagerConfig { page_size: 4096, pages: 512, large_bytes: Some(8 << 20), max_fragments: None };
                let sfi = Sfi::new(SfiInput::Crates(vec![rx]), em, config.run_number, handler.addr, shared.clone())
                    .map_err(|e| ConfigError::Invalid(format!("the SFI: {e}")))?;
                let sfo =
                    Sfo::accept(&listener, sc.sfo_buffer, sc.sfo_directory.clone(), config.run_number, shared.clone())
                        .map_err(|e| ConfigError::Invalid(format!("the SFO: {e}")))?;
                (Some(tx), Some(Subfarm { sfi, sfo, handler, shared }))
            }
        };
        let ebif = Ebif {
            to_sfi,
            from_trg: a_rx,
            from_robs: rob_to_ebif,
            to_robs: ebif_to_rob,
            collecting: HashMap::with_capacity(128),
            discards: Grouper::new(config.groups),
            shared: ebif_shared.clone(),
            built: 0,
            bytes: 0,
        };
        let l2_received = Arc::new(AtomicU64::new(0));
        let l2 = Level2 { from_robs: rob_to_l2, received: l2_received.clone(), count: 0 };
        Ok(Testbed { config, robs, trg, ebif, l2, rob_shared, trg_shared, ebif_shared, l2_received, subfarm })
    }

    /// Runs until `config.events` events are decided and freed at every ROB, or for `duration`
    /// (whichever comes first; one of them must be set), with `profile` stamps per scheduler if
    /// given. A failing task stops the run with its error.
    pub fn run(self, layout: Layout, duration: Option<Duration>) -> Result<TestbedReport, SchedulerError> {
        self.run_profiled(layout, duration, None, IdleStrategy::default())
    }

    /// [`Testbed::run`] with profiling (`Some(ring capacity)`) and an idle strategy.
    pub fn run_profiled(
        self,
        layout: Layout,
        duration: Option<Duration>,
        profile: Option<usize>,
        idle: IdleStrategy,
    ) -> Result<TestbedReport, SchedulerError> {
        let Testbed { config, robs, trg, ebif, l2, rob_shared, trg_shared, ebif_shared, l2_received, subfarm } = self;
        let (sfi_sfo, handler, subfarm_shared) = match subfarm {
            Some(Subfarm { sfi, sfo, handler, shared }) => (Some((sfi, sfo)), Some(handler), Some(shared)),
            None => (None, None, None),
        };
        let setup = |name: &str, core: Option<usize>| {
            let mut s = Scheduler::new(name).with_idle(idle);
            if let Some(c) = core {
                s = s.pinned_to(c);
            }
            if let Some(cap) = profile {
                s = s.with_profiling(cap);
            }
            s
        };
        let mut schedulers = Vec::new();
        match layout {
            Layout::OneScheduler => {
                let mut s = setup("testbed", None);
                for r in robs {
                    s.add_module(r);
                }
                s.add_module(trg).add_module(ebif).add_module(l2);
                if let Some((sfi, sfo)) = sfi_sfo {
                    s.add_module(sfi).add_module(sfo);
                }
                schedulers.push(s);
            }
            Layout::RobsApart(cores) => {
                let mut a = setup("robs", cores.map(|c| c.0));
                for r in robs {
                    a.add_module(r);
                }
                let mut b = setup("trg-ebif", cores.map(|c| c.1));
                b.add_module(trg).add_module(ebif).add_module(l2);
                if let Some((sfi, sfo)) = sfi_sfo {
                    b.add_module(sfi).add_module(sfo);
                }
                schedulers.extend([a, b]);
            }
        }
        let stops: Vec<StopHandle> = schedulers.iter().map(|s| s.stop_handle()).collect();
        let start = Instant::now();
        let running = schedulers.into_iter().map(Scheduler::spawn).collect::<Result<Vec<_>, _>>()?;
        let target = config.events;
        let deadline = duration.map(|d| start + d);
        loop {
            std::thread::sleep(Duration::from_micros(200));
            let freed = rob_shared.iter().map(|r| r.freed.load(Ordering::Acquire)).min().unwrap_or(0);
            let done = target.is_some_and(|t| freed >= t);
            let late = deadline.is_some_and(|d| Instant::now() >= d);
            let failed = running.iter().any(|r| r.is_finished());
            if done || late || failed || (target.is_none() && deadline.is_none()) {
                break;
            }
        }
        let elapsed = start.elapsed();
        // Stop upstream first: with the ROBs apart, their scheduler stops, then the others run
        // until the ROI data already sent has arrived (bounded), so the counts balance.
        let mut running = running;
        let mut first = Vec::new();
        if running.len() > 1 {
            stops[0].stop();
            first.push(running.remove(0));
            while !first[0].is_finished() {
                std::thread::sleep(Duration::from_micros(100));
            }
            let sent = || rob_shared.iter().map(|r| r.roi_sent.load(Ordering::Acquire)).sum::<u64>();
            let drain_until = Instant::now() + Duration::from_secs(2);
            while l2_received.load(Ordering::Acquire) < sent()
                && Instant::now() < drain_until
                && !running.iter().any(|r| r.is_finished())
            {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        // The sub-farm drains what the collector built (bounded). The SFI, dropped when its
        // scheduler ends (before the SFO where they share one), ends its stream gracefully and
        // waits for the handler to close (`Drop for Sfi`): with the sub-farm drained the kernel's
        // buffers take what little is still in flight, with no SFO reading.
        if let Some(shared) = &subfarm_shared {
            let built = || ebif_shared.built.load(Ordering::Acquire);
            let drain_until = Instant::now() + Duration::from_secs(5);
            while !(shared.counts().is_drained(1) && shared.counts().received == built())
                && Instant::now() < drain_until
                && !running.iter().any(|r| r.is_finished())
            {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for s in &stops {
            s.stop();
        }
        let mut reports = Vec::new();
        let mut first_error = None;
        for r in first.into_iter().chain(running) {
            match r.join() {
                Ok(rep) => reports.push(rep),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        // The SFI's connection closed with its scheduler: the handler ends.
        if let Some(h) = handler
            && let Err(e) = h.join()
        {
            tracing::warn!("the event handler: {e}");
        }
        let load = |c: &AtomicU64| c.load(Ordering::Acquire);
        let generated: Vec<u64> = rob_shared.iter().map(|r| load(&r.generated)).collect();
        let rejected: Vec<u64> = rob_shared.iter().map(|r| load(&r.rejected)).collect();
        let discarded: Vec<u64> = rob_shared.iter().map(|r| load(&r.discarded)).collect();
        let held = (0..generated.len()).map(|i| generated[i].saturating_sub(rejected[i] + discarded[i])).collect();
        Ok(TestbedReport {
            elapsed,
            generated,
            rejected,
            discarded,
            held,
            roi_sent: rob_shared.iter().map(|r| load(&r.roi_sent)).collect(),
            roi_received: load(&l2_received),
            accepts: load(&trg_shared.accepts),
            rejects: load(&trg_shared.rejects),
            rois: load(&trg_shared.rois),
            built: load(&ebif_shared.built),
            built_bytes: load(&ebif_shared.bytes),
            schedulers: reports,
            subfarm: subfarm_shared.map(|s| s.counts()),
        })
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<Rob>();
    is_send::<Trg>();
    is_send::<Ebif>();
    is_send::<Level2>();
    let _ = BytesMut::new();
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use daqflow_engine::IdleStrategy;
    use daqflow_engine::profile::{self, Probe, ProfileDump};

    use super::{Layout, Testbed, TestbedConfig};

    #[test]
    fn the_testbed_accounts_for_every_event_on_one_scheduler() {
        let report = Testbed::new(TestbedConfig { events: Some(20_200), ..Default::default() })
            .unwrap()
            .run(Layout::OneScheduler, Some(Duration::from_secs(120)))
            .unwrap();
        assert!(report.is_consistent(), "{report:?}");
        assert_eq!(report.decided(), 20_200, "{report:?}");
        // 1:100:10 over 200 blocks of 101 events.
        assert_eq!((report.accepts, report.rejects, report.rois), (200, 20_000, 2_000));
        assert_eq!(report.built, 200);
        assert_eq!(report.generated, vec![20_200, 20_200]);
        assert_eq!(report.rejected, vec![20_000, 20_000]);
        assert_eq!(report.discarded, vec![200, 200]);
        assert_eq!(report.held, vec![0, 0]);
        assert_eq!(report.roi_received, 4_000);
    }

    #[test]
    fn the_testbed_accounts_for_every_event_across_two_schedulers() {
        let config = TestbedConfig { robs: 3, events: Some(10_100), ..Default::default() };
        let report =
            Testbed::new(config).unwrap().run(Layout::RobsApart(None), Some(Duration::from_secs(120))).unwrap();
        assert!(report.is_consistent(), "{report:?}");
        assert_eq!(report.decided(), 10_100, "{report:?}");
        assert_eq!(report.built, 100);
        assert_eq!(report.roi_received, 3 * 1_000);
        assert_eq!(report.schedulers.len(), 2);
    }

    #[test]
    fn a_profiled_testbed_records_every_poll_and_action_and_an_unprofiled_one_nothing() {
        let config = TestbedConfig { robs: 1, events: Some(1_010), ..Default::default() };
        let off =
            Testbed::new(config.clone()).unwrap().run(Layout::OneScheduler, Some(Duration::from_secs(60))).unwrap();
        assert!(off.stamps().is_empty());
        assert!(!profile::is_recording());

        let on = Testbed::new(config)
            .unwrap()
            .run_profiled(Layout::OneScheduler, Some(Duration::from_secs(60)), Some(1 << 22), IdleStrategy::default())
            .unwrap();
        let stamps = on.stamps();
        assert_eq!(stamps.len(), 1);
        let t = &stamps[0];
        assert_eq!(t.lost, 0);
        let sched = &on.schedulers[0];
        let polls: u64 = sched.tasks.iter().map(|t| t.polls).sum();
        let actions: u64 = sched.tasks.iter().map(|t| t.actions).sum();
        assert_eq!(t.stamps.len() as u64, 2 * polls + 2 * actions);
        let dump = ProfileDump::new(profile::calibrate(Duration::from_millis(10), 1000), stamps);
        let tr = dump.transitions();
        assert_eq!(tr.poll_to_action.len() as u64, actions);
        let intervals = dump.intervals();
        // The probes are named scheduler/task.action: what `daqflow profile` and the bench look for.
        let rob_in = Probe::new("testbed/rob0.in.action").index();
        let n = intervals.iter().find(|(p, _)| *p == rob_in).map(|(_, v)| v.len());
        assert_eq!(n, Some(1_010));
    }
}
