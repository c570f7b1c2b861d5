//! The builder unit's protocol as a state machine without I/O: every decision a BU makes, and
//! nothing else. [`BuMachine`] is told what arrived (a message of the EVM, a super-fragment of
//! an RU, a closed connection, the ids its builder threads put into the output, a reading of
//! its disk) and what time it is; it answers with what to send, whom to connect to, which
//! events are complete, and when the run is over for it. The component's I/O layer (`BuIo`)
//! only moves bytes and time between it and the sockets, the builder threads and `statvfs`;
//! the simulation (`crates/evb/tests/simulation`) drives the same machine on virtual time.
//!
//! What it decides:
//! - **credits**: how many events it wants in flight (`credits`, fewer when the mean size of
//!   the events built says that many would exceed `max_bytes_in_flight`; one request batch
//!   before any is built), handed to the EVM in groups of `request_batch` (or at once when
//!   nothing is in flight);
//! - **confirmations**: the events in the output are confirmed at least every 2 ms;
//! - **heartbeat**: a request at least every `heartbeat_ms`, even an empty one;
//! - **disk throttling** (with a [`DiskWatcher`]): no credits above the high mark, nor more than
//!   the room left by the estimate (the last reading less what was written since and what is in
//!   flight), until a reading below the low mark;
//! - **the end**: the EVM's run end, a stop while the run goes on (the BU leaves: it confirms
//!   what it built and goes), the end timeout, a lost EVM or RU, a failed output.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use daqflow_evb::bu::{BuMachine, BuOutput, BuSettings, Step};
//! use daqflow_evb::protocol::Message;
//!
//! let now = Instant::now();
//! let mut bu = BuMachine::new(BuSettings { credits: 8, request_batch: 2, ..BuSettings::new(0, 7, "bu-0") }, None, now);
//! bu.on_evm(Ok(Message::RuList { run: 7, generation: 0, rus: vec![(0, "127.0.0.1:7200".into())] }));
//! let Some(BuOutput::ConnectRus { rus, .. }) = bu.next_output() else { panic!() };
//! bu.rus_connected(&rus.iter().map(|r| r.0).collect::<Vec<_>>(), now);
//! // Before any event is built: one request batch of credits.
//! assert!(matches!(bu.next_output(), Some(BuOutput::ToEvm(Message::Request { credits: 2, .. }))));
//! assert_eq!(bu.tick(now, false, true), Step::Continue);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::file::{DiskChange, DiskError, DiskReport, DiskSpace, DiskWatcher};

use super::core::{BuCore, ReadyEvent};
use crate::protocol::{KIND_SUPER_FRAGMENT, Message, ProtocolError, Role};

/// Confirmations wait at most this long for a request to carry them.
pub const CONFIRM_EVERY: Duration = Duration::from_millis(2);

/// When a builder thread flushes its output, and so confirms the events it put there (files:
/// the writer's buffer pushed to the operating system; an output that holds an event as soon
/// as it is put confirms at once instead): at least every `flush_interval_ms`, and as soon as
/// what waits is half of the thread's share of the BU's window, in events (`credits`) **or in
/// bytes** (`max_bytes_in_flight`). Events waiting for a flush hold credits, so a rule that
/// counted only events let large events take the whole byte window and then wait for the
/// interval: 128 KiB events, 16 MiB in flight (128 events) against a batch of 512, one flush per
/// 20 ms: 16 MiB per 20 ms, 0.8 GB/s whatever the disk (issue 29's file row).
///
/// ```
/// use std::time::Duration;
/// use daqflow_evb::bu::FlushRule;
///
/// let rule = FlushRule::new(1024, 16 << 20, 1, Duration::from_millis(20));
/// assert!(!rule.due(0, 0, Duration::from_secs(1)), "nothing to flush");
/// assert!(rule.due(1, 100, Duration::from_millis(20)), "the interval");
/// assert!(rule.due(512, 512 * 100, Duration::ZERO), "half the credits");
/// assert!(rule.due(64, 64 * 131_072, Duration::ZERO), "half the bytes: 8 MiB of 128 KiB events");
/// assert!(!rule.due(63, 63 * 131_072, Duration::ZERO));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushRule {
    /// Flush at least this often.
    pub every: Duration,
    /// Flush once this many events wait.
    pub events: usize,
    /// Flush once this many bytes of events wait.
    pub bytes: u64,
}

impl FlushRule {
    /// The rule of one of `threads` builder threads of a BU with `credits` and
    /// `max_bytes_in_flight`, flushing at least `every`.
    pub fn new(credits: u32, max_bytes_in_flight: u64, threads: usize, every: Duration) -> FlushRule {
        let threads = threads.max(1);
        FlushRule {
            every,
            events: (credits as usize / (2 * threads)).max(1),
            bytes: (max_bytes_in_flight / (2 * threads as u64)).max(1),
        }
    }

    /// Whether `events` events of `bytes` bytes, put since the last flush `since` ago, are to
    /// be flushed now.
    pub fn due(&self, events: usize, bytes: u64, since: Duration) -> bool {
        events > 0 && (since >= self.every || events >= self.events || bytes >= self.bytes)
    }
}

/// What a [`BuMachine`] needs to know of its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuSettings {
    /// The BU's id.
    pub id: u32,
    /// The run.
    pub run: u32,
    /// Its name (in hellos and messages).
    pub name: String,
    /// Most events in flight.
    pub credits: u32,
    /// Credits are handed back in groups of this many.
    pub request_batch: u32,
    /// Fewer credits when the mean event size says `credits` would be more bytes than this.
    pub max_bytes_in_flight: u64,
    /// A request goes to the EVM at least this often.
    pub heartbeat: Duration,
    /// How long a stop waits for the EVM's end of run.
    pub end_timeout: Duration,
}

impl BuSettings {
    /// The configuration's defaults for BU `id` of run `run`.
    pub fn new(id: u32, run: u32, name: &str) -> BuSettings {
        BuSettings::of(&super::BuConfig { id, ..Default::default() }, run, name)
    }

    /// The settings of a configured BU.
    pub fn of(config: &super::BuConfig, run: u32, name: &str) -> BuSettings {
        BuSettings {
            id: config.id,
            run,
            name: name.to_owned(),
            credits: config.credits,
            request_batch: config.request_batch.clamp(1, config.credits.max(1)),
            max_bytes_in_flight: config.max_bytes_in_flight,
            heartbeat: Duration::from_millis(config.heartbeat_ms),
            end_timeout: Duration::from_millis(config.end_timeout_ms),
        }
    }
}

/// Something the I/O layer does for the machine, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum BuOutput {
    /// Send this message to the EVM.
    ToEvm(Message),
    /// Connect to these RUs (skipping any already connected) and say this hello on each; then
    /// [`BuMachine::rus_connected`], or [`BuMachine::fail`] when one cannot be reached.
    ConnectRus {
        /// The hello, with the generation the EVM gave.
        hello: Message,
        /// (RU id, address).
        rus: Vec<(u32, String)>,
    },
    /// Close the link to the EVM: the BU leaves the run (its output failed), and the EVM
    /// re-assigns what it had not confirmed.
    CloseEvm,
}

/// What the run is for the machine after a [`BuMachine::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on.
    Continue,
    /// The run is over for this BU: stop the builders and write the summary.
    Finish {
        /// It was stopped while the run went on, and left in order.
        left_during_run: bool,
    },
}

/// The builder unit's decisions (see the module's documentation).
#[derive(Debug)]
pub struct BuMachine {
    s: BuSettings,
    core: BuCore,
    ready: Vec<ReadyEvent>,
    out: VecDeque<BuOutput>,
    generation: u32,
    rus: Vec<u32>,
    requested_first: bool,
    /// Credits given to the EVM so far.
    granted: u64,
    /// Events the builders put into the output.
    confirmed: u64,
    /// Events handed to the I/O layer for the builders.
    handed_out: u64,
    done: Vec<u64>,
    last_request: Instant,
    run_end: Option<u64>,
    stop_requested: Option<Instant>,
    failure: Option<String>,
    left_during_run: bool,
    /// (events, bytes) in the output, as the builders count them.
    built: (u64, u64),
    disk: Option<DiskWatcher>,
    /// `built` as already counted into the disk's estimate.
    disk_counted: (u64, u64),
}

impl BuMachine {
    /// A BU that has said hello to the EVM at `now`, writing files under `disk`'s watch (none:
    /// it does not throttle).
    pub fn new(settings: BuSettings, disk: Option<DiskWatcher>, now: Instant) -> BuMachine {
        BuMachine {
            s: settings,
            core: BuCore::new(),
            ready: Vec::new(),
            out: VecDeque::new(),
            generation: 0,
            rus: Vec::new(),
            requested_first: false,
            granted: 0,
            confirmed: 0,
            handed_out: 0,
            done: Vec::new(),
            last_request: now,
            run_end: None,
            stop_requested: None,
            failure: None,
            left_during_run: false,
            built: (0, 0),
            disk,
            disk_counted: (0, 0),
        }
    }

    /// The next thing to do, in order.
    pub fn next_output(&mut self) -> Option<BuOutput> {
        self.out.pop_front()
    }

    /// Moves the complete events into `into` (for the builder threads).
    pub fn take_ready(&mut self, into: &mut VecDeque<ReadyEvent>) {
        self.handed_out += self.ready.len() as u64;
        into.extend(self.ready.drain(..));
    }

    /// The run failed here for `reason` (the first reason is kept): the EVM is told.
    pub fn fail(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        tracing::error!(component = %self.s.name, "{reason}");
        self.failure = Some(reason.clone());
        self.out.push_back(BuOutput::ToEvm(Message::Abort { reason }));
    }

    /// Why the run failed here, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// A message of the EVM (or why it could not be decoded).
    pub fn on_evm(&mut self, message: Result<Message, ProtocolError>) {
        match message {
            Ok(Message::RuList { generation, rus, .. }) => {
                self.generation = generation;
                // The generation tells each RU which admission of this id the connection is: an
                // RU takes it only once the EVM told it every earlier one is gone.
                let hello = Message::Hello {
                    role: Role::Bu,
                    id: self.s.id,
                    run: self.s.run,
                    name: self.s.name.clone(),
                    addr: String::new(),
                    generation,
                };
                let rus = rus.into_iter().filter(|(id, _)| !self.rus.contains(id)).collect();
                self.out.push_back(BuOutput::ConnectRus { hello, rus });
            }
            Ok(Message::Triggers { rus, triggers }) => self.core.on_triggers(&rus, &triggers, &mut self.ready),
            Ok(Message::RunEnd { last_event }) => self.run_end = Some(last_event),
            Ok(Message::Abort { reason }) => self.fail(format!("the EVM aborted the run: {reason}")),
            Ok(m) => tracing::warn!(bu = %self.s.name, "ignoring {:?} from the EVM", m.kind()),
            Err(e) => self.fail(format!("the EVM sent a malformed message: {e}")),
        }
    }

    /// The link to the EVM closed.
    pub fn evm_closed(&mut self, why: &str) {
        if self.run_end.is_none() {
            self.fail(format!("lost the EVM: {why}"));
        }
    }

    /// The I/O layer connected to RUs `ids` at `now` (after a [`BuOutput::ConnectRus`]): the
    /// first request goes, unless the disk is above its high mark from the start.
    pub fn rus_connected(&mut self, ids: &[u32], now: Instant) {
        for id in ids {
            if !self.rus.contains(id) {
                self.rus.push(*id);
            }
        }
        if self.requested_first || self.failure.is_some() {
            return;
        }
        self.requested_first = true;
        let throttled = self.disk.as_ref().is_some_and(|d| d.throttled());
        let credits = if throttled { 0 } else { self.credit_target() as u32 };
        self.out.push_back(BuOutput::ToEvm(Message::Request { credits, done: Vec::new() }));
        self.granted = u64::from(credits);
        self.last_request = now;
    }

    /// The RUs connected.
    pub fn rus(&self) -> &[u32] {
        &self.rus
    }

    /// A frame from RU `ru`: a super-fragment, or a violation that fails the run.
    pub fn on_ru_frame(&mut self, ru: u32, kind: u16, payload: Bytes) {
        let r = match kind {
            KIND_SUPER_FRAGMENT => self.core.on_super_fragment(ru, payload, &mut self.ready),
            k => Err(format!("frame kind {k:#06x} on a super-fragment link")),
        };
        if let Err(e) = r {
            self.fail(format!("RU {ru}: {e}"));
        }
    }

    /// The link to RU `ru` closed, with `frames` received on it. Without it the BU cannot build
    /// any more: it leaves the run (as when its output fails), and the EVM re-assigns what it
    /// had not confirmed to the other BUs; a lost RU itself is the EVM's to see (it aborts).
    pub fn ru_closed(&mut self, ru: u32, why: &str, frames: u64) {
        if self.run_end.is_some() {
            return;
        }
        if frames == 0 {
            // Nothing came: the RU did not take the connection (it holds a BU's connection until
            // the EVM's BU gone for every earlier generation of its id, at most its
            // `connect_timeout_ms`, and refuses an older generation).
            let (id, generation) = (self.s.id, self.generation);
            self.leave(format!(
                "RU {ru} closed the connection before sending anything ({why}): it did not take BU {id} generation \
                 {generation} (the RU's log says why); leaving the run"
            ));
        } else {
            self.leave(format!("lost RU {ru}: {why}; leaving the run"));
        }
    }

    /// The builders put event `id` into the output (written and flushed, or in ET).
    pub fn confirmed(&mut self, id: u64) {
        self.done.push(id);
        self.confirmed += 1;
    }

    /// The BU cannot go on (a builder thread's output failed, an RU's link was lost): it
    /// leaves the run, closing its link to the EVM, so that the EVM re-assigns its unconfirmed
    /// events to the other BUs; `reason` is this BU's error.
    pub fn leave(&mut self, reason: String) {
        if self.failure.is_some() {
            return;
        }
        tracing::error!(bu = %self.s.name, "{reason}");
        self.failure = Some(reason);
        self.out.push_back(BuOutput::CloseEvm);
    }

    /// Credits the BU wants in flight now: `credits`, less when the events built so far say
    /// that many would exceed `max_bytes_in_flight`; before any event is built, one request
    /// batch (the size of the events is not known yet).
    pub fn credit_target(&self) -> u64 {
        let (events, bytes) = self.built;
        let credits = u64::from(self.s.credits);
        match bytes.checked_div(events) {
            Some(mean) if mean > 0 => credits.min(self.s.max_bytes_in_flight / mean).max(1),
            _ => credits.min(u64::from(self.s.request_batch)),
        }
    }

    /// When a reading of the disk is due, the directory to read (and `now` counts as its time):
    /// the I/O layer gives the reading to [`BuMachine::disk_space`].
    pub fn disk_reading_due(&mut self, now: Instant) -> Option<&std::path::Path> {
        let disk = self.disk.as_mut()?;
        disk.take_reading(now).then(|| disk.directory())
    }

    /// A reading of the disk's space, taken at `now`; an error fails the run.
    pub fn disk_space(&mut self, space: Result<DiskSpace, DiskError>, now: Instant) {
        let Some(disk) = self.disk.as_mut() else { return };
        let space = match space {
            Ok(space) => space,
            Err(e) => return self.fail(e.to_string()),
        };
        // The bytes written before the reading are in it.
        self.disk_counted = self.built;
        match disk.apply(space, now) {
            Some(DiskChange::Throttled(space)) => tracing::warn!(
                bu = %self.s.name,
                "disk throttling: the filesystem of {} has {}, above throttle_high_pct: asking the EVM for no \
                 events until it is below throttle_low_pct",
                disk.directory().display(),
                space.describe()
            ),
            Some(DiskChange::Resumed(space)) => tracing::warn!(
                bu = %self.s.name,
                "disk throttling ended: the filesystem of {} has {}, below throttle_low_pct: asking for events again",
                disk.directory().display(),
                space.describe()
            ),
            None => {}
        }
    }

    /// Whether the disk throttles the BU now.
    pub fn throttled(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| d.throttled()) && !mutated!(NoDiskThrottling)
    }

    /// The disk's figures, at `now` (none without files).
    pub fn disk_report(&self, now: Instant) -> Option<DiskReport> {
        self.disk.as_ref().map(|d| d.report(now))
    }

    /// Events assigned or partly received, not complete yet.
    pub fn in_progress(&self) -> usize {
        self.core.in_progress()
    }

    /// Forgets every event in progress (end of run); returns their ids.
    pub fn clear(&mut self) -> Vec<u64> {
        self.core.clear()
    }

    /// Stopped while the run went on, and left in order.
    pub fn left_during_run(&self) -> bool {
        self.left_during_run
    }

    /// Events asked for (credits given) and not yet confirmed.
    pub fn in_flight(&self) -> u64 {
        self.granted.saturating_sub(self.confirmed)
    }

    /// The credits the disk has room for, with `in_flight` events asked for and not yet
    /// confirmed (each counted at the mean size of the events built, as the file takes it): by
    /// the watcher's estimate, the events built since its last reading counted. 0: the BU
    /// throttles now, before the next reading.
    fn disk_allows(&mut self, in_flight: u64, now: Instant) -> u64 {
        let (events, bytes) = self.built;
        let Some(disk) = self.disk.as_mut().filter(|_| !mutated!(NoDiskThrottling)) else { return u64::MAX };
        // Before the first event is built its size is not known: one request batch goes.
        let Some(mean) = bytes.checked_div(events) else { return u64::MAX };
        let per_event = DiskWatcher::record_bytes(mean as usize);
        let room = disk.room();
        let mut allowed = room.saturating_sub(in_flight.saturating_mul(per_event)) / per_event;
        if allowed == 0 && in_flight == 0 && disk.fits(per_event) {
            allowed = 1;
        }
        if allowed == 0
            && let Some(DiskChange::Throttled(space)) = disk.throttle(now)
        {
            tracing::warn!(
                bu = %self.s.name,
                "disk throttling: the filesystem of {} has {} by its estimate (the last reading less the events \
                 built since and those in flight): more would take it above throttle_high_pct; asking the EVM \
                 for no events until it is below throttle_low_pct",
                disk.directory().display(),
                space.describe()
            );
        }
        allowed
    }

    /// Counts the bytes the builders wrote since the last look into the disk's estimate.
    fn count_written(&mut self) {
        let Some(disk) = self.disk.as_mut() else { return };
        let (events, bytes) = self.built;
        let (e0, b0) = std::mem::replace(&mut self.disk_counted, self.built);
        let new_events = events.saturating_sub(e0);
        if new_events > 0 {
            // Each record's header, padding and index entry, at most: record_bytes(0) + 8.
            let overhead = DiskWatcher::record_bytes(0) + 8;
            disk.wrote(bytes.saturating_sub(b0) + new_events * overhead);
        }
    }

    /// What the builders have put into the output so far: `events` and their `bytes`.
    pub fn built(&mut self, events: u64, bytes: u64) {
        self.built = (events, bytes);
    }

    /// Asks the EVM for credits and confirms what was built, as due at `now`.
    fn request(&mut self, now: Instant) {
        // Disk throttling: no new credits; confirmations and heartbeats go on.
        let throttled = self.throttled();
        let done_asking = self.run_end.is_some() || self.stop_requested.is_some() || throttled;
        let in_flight = self.in_flight();
        let mut grant = if done_asking { 0 } else { self.credit_target().saturating_sub(in_flight) };
        if grant > 0 {
            grant = grant.min(self.disk_allows(in_flight, now));
        }
        let since = now.duration_since(self.last_request);
        let heartbeat_due = since >= self.s.heartbeat && !mutated!(NoHeartbeat);
        let confirm_due = !self.done.is_empty() && since >= CONFIRM_EVERY;
        let grant_due = grant >= u64::from(self.s.request_batch) || (grant > 0 && in_flight == 0);
        if !self.requested_first && heartbeat_due {
            // Still connecting to the RUs: tell the EVM this BU is alive.
            self.out.push_back(BuOutput::ToEvm(Message::Request { credits: 0, done: Vec::new() }));
            self.last_request = now;
        }
        if self.requested_first && (grant_due || confirm_due || heartbeat_due) {
            let credits = grant.min(u64::from(u32::MAX)) as u32;
            let done = std::mem::take(&mut self.done);
            self.out.push_back(BuOutput::ToEvm(Message::Request { credits, done }));
            self.granted += u64::from(credits);
            self.last_request = now;
        }
    }

    /// The machine's clock at `now`: `stop` says the component was told to stop, and
    /// `evm_flushed` that nothing waits to be sent to the EVM. Asks for credits, confirms,
    /// heartbeats, and says whether the run is over for this BU.
    pub fn tick(&mut self, now: Instant, stop: bool, evm_flushed: bool) -> Step {
        self.count_written();
        // Confirmations this tick sends must be out (`evm_flushed` at the next) before the BU
        // may go.
        let confirming = !self.done.is_empty();
        self.request(now);
        if stop && self.stop_requested.is_none() {
            self.stop_requested = Some(now);
        }
        let Some(t) = self.stop_requested else { return Step::Continue };
        let timed_out = now.duration_since(t) > self.s.end_timeout;
        let idle = self.handed_out == self.confirmed && !confirming && self.done.is_empty() && evm_flushed;
        // Stopped while the run goes on: the BU leaves. It asks for nothing more, confirms
        // everything it built, and goes; the EVM re-assigns what it had not received whole.
        let leaving = self.run_end.is_none() && self.failure.is_none();
        if (idle && (self.run_end.is_some() || leaving)) || self.failure.is_some() || timed_out {
            if timed_out && self.run_end.is_none() {
                self.fail("no end of run from the EVM before the timeout".into());
            }
            self.left_during_run = leaving && !timed_out;
            return Step::Finish { left_during_run: self.left_during_run };
        }
        Step::Continue
    }

    /// The next time [`BuMachine::tick`] has something to do by itself (a confirmation or a
    /// heartbeat due, a disk reading, the end timeout); messages and confirmations from the
    /// builders need a tick of their own.
    pub fn next_timer(&self) -> Option<Instant> {
        let mut t = self.last_request + self.s.heartbeat;
        if !self.done.is_empty() {
            t = t.min(self.last_request + CONFIRM_EVERY);
        }
        if let Some(r) = self.disk.as_ref().and_then(|d| d.next_reading()) {
            t = t.min(r);
        }
        if let Some(s) = self.stop_requested {
            t = t.min(s + self.s.end_timeout + Duration::from_nanos(1));
        }
        Some(t)
    }
}
