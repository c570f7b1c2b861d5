//! The builder unit (BU): asks the EVM for events with credits, collects the super-fragments of
//! every RU, and builds each complete event on one of its builder threads (each on its own
//! engine scheduler), which checks it and hands it to the output: discard, data files (the wire
//! `FileWriter`, e.g. on a RAM disk), or an ET system (through the [`EtOpener`] the BU is given,
//! `daqflow_et::sink::EtSink` in the `daqflow` binary). An event is confirmed to the EVM only once
//! it is in the output: written to the file and flushed to the operating system, or put into the
//! ET system.
//!
//! With `output = "files"` the BU throttles on its disk (CMS DAQ2's BU does): above
//! `throttle_high_pct` of the filesystem of `directory` used it sends the EVM no more credits
//! (the events already assigned are still built and written) until usage falls below
//! `throttle_low_pct` ([`DiskWatcher`]).
//!
//! Its [`Stats`] count the events built (`events`) and their bytes; the [`BuDetail`] adds the
//! events flagged, CRC errors, the events in progress, disk throttling (`throttled`,
//! `throttle_count`, `throttled_s`, `disk_free_bytes`, `disk_used_pct`) and, in the summary, the
//! files written.
//!
//! ```no_run
//! use daqflow_component::Component;
//! use daqflow_evb::bu::{Bu, BuConfig, BuDetail, Output};
//! let mut bu = Bu::new("bu-0", BuConfig {
//!     id: 0,
//!     evm: "127.0.0.1:7100".into(),
//!     threads: 2,
//!     output: Output::Files,
//!     directory: "/dev/shm/daqflow".into(),
//!     ..Default::default()
//! });
//! bu.configure()?;
//! bu.start(1)?;
//! // … the run …
//! let summary = bu.stop(None)?;
//! for file in summary.detail_as::<BuDetail>().unwrap().files {
//!     println!("{}: {} events", file.path.display(), file.events);
//! }
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```
//!
//! In the `daqflow` binary it is the kind [`kind()`] makes: `daqflow component bu`.

mod config;
mod core;
mod machine;
pub mod replay;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_component::{Component, ComponentError, Info, Kind, Role as KindRole, Stats, Verb, parse_config};
use daqflow_engine::fifo::{Consumer, Producer};
use daqflow_engine::{BoxError, Module, Running, StopHandle, Task, fifo};
use daqflow_wire::file::{ClosedFile, DiskSpace, DiskWatcher, FileWriter, FileWriterConfig, remove_empty_part_files};
use daqflow_wire::sink::{Discard, EventSink};
use daqflow_wire::{EventFlags, EventId};

pub use self::config::{BuConfig, EtConfirm, Output, schema};
pub use self::core::{BuCore, BuiltEvent, CheckLevel, ReadyEvent, SfParts, build};
pub use self::machine::{BuMachine, BuOutput, BuSettings, CONFIRM_EVERY, FlushRule, Step};
use crate::EvbError;
use crate::common::{Rates, checked, per_second, read, set};
use crate::link::{Peer, connect, control_options, data_options};
use crate::protocol::{Message, Role};
pub use crate::stats::{BuDetail, BuFile};
use crate::unit::{RunShared, Unit};

/// The `bu` kind: a builder unit, with `et` the way to open an ET system as its output
/// (`output = "et"`; without it, such a configuration is refused at configure). It starts
/// after the EVM (stage 5) and stops after the RUs (stage 3); with `output = "files"` its data
/// files are in `directory`.
pub fn kind(et: Option<EtOpener>) -> Kind {
    Kind::new(
        "bu",
        "a builder unit: builds events from the readout units' super-fragments, writes them out",
        KindRole::Builder,
        move |name, t| {
            let config = checked(name, parse_config::<BuConfig>(name, t)?, BuConfig::validate)?;
            let bu = Bu::new(name, config);
            Ok(Box::new(match &et {
                Some(et) => bu.with_et(et.clone()),
                None => bu,
            }))
        },
    )
    .schema(config::schema())
    .data_files(|t| {
        let directory = t.get("directory").and_then(|d| d.as_str()).map(std::path::PathBuf::from);
        (t.get("output").and_then(|o| o.as_str()) == Some("files"))
            .then(|| directory.unwrap_or_else(|| BuConfig::default().directory))
    })
    .takes_system_digest()
}

/// One builder thread's counters, on cache lines of their own: each thread adds to its own for
/// every event, and two threads' counters on one line would take it from each other's core.
#[derive(Default)]
#[repr(align(128))]
struct BuilderCounters {
    events: AtomicU64,
    bytes: AtomicU64,
    flagged: AtomicU64,
    crc_errors: AtomicU64,
}

/// What a run of the BU shares beyond every unit's: its builder threads' counters and what
/// they leave.
#[derive(Default)]
struct BuShared {
    builders: Vec<BuilderCounters>,
    /// Why a builder thread's output failed (the first one), naming the disk when it is full.
    output_failed: Mutex<Option<String>>,
    /// The builder threads' time stamps, once joined (`profile = PATH`).
    builder_stamps: Mutex<Vec<daqflow_engine::profile::ThreadStamps>>,
}

/// A run of the BU's shared state.
type Shared = RunShared<BuShared>;

/// The builder unit component.
pub struct Bu {
    config: BuConfig,
    configured: bool,
    et: Option<EtOpener>,
    unit: Unit<BuShared>,
}

/// Opens the output of a builder thread on the ET system of the given name (`output = "et"`).
/// The event builder does not depend on the ET system: whoever makes the BU passes this.
pub type EtOpener = Arc<dyn Fn(&str) -> Result<Box<dyn EventSink>, String> + Send + Sync>;

/// The builder threads of a run, as the BU's link scheduler holds them.
struct Builders {
    to: Vec<Producer<ReadyEvent>>,
    from: Vec<Consumer<u64>>,
    running: Vec<(StopHandle, Running)>,
    outputs: Vec<Closed>,
}

/// One builder thread: where its events go in, where their ids come back once in the output,
/// its scheduler, and where it leaves its output's closing result.
struct BuilderThread {
    to: Producer<ReadyEvent>,
    from: Consumer<u64>,
    running: (StopHandle, Running),
    output: Closed,
}

impl Bu {
    /// A builder unit named `name`; with `output = "et"` it also needs [`Bu::with_et`].
    pub fn new(name: &str, config: BuConfig) -> Bu {
        Bu { config, configured: false, et: None, unit: Unit::new(name) }
    }

    /// Gives the BU the way to open an ET system as its output.
    pub fn with_et(mut self, opener: EtOpener) -> Bu {
        self.et = Some(opener);
        self
    }

    /// Starts the builder threads of run `run`, each with its output, opened now so that errors
    /// show at start; if one cannot start, those already started are stopped.
    fn spawn_builders(&self, run: u32) -> Result<Builders, EvbError> {
        let mut b = Builders { to: Vec::new(), from: Vec::new(), running: Vec::new(), outputs: Vec::new() };
        for t in 0..self.config.threads {
            match self.spawn_builder(t, run) {
                Ok(thread) => {
                    b.to.push(thread.to);
                    b.from.push(thread.from);
                    b.running.push(thread.running);
                    b.outputs.push(thread.output);
                }
                Err(e) => {
                    // Their files were just opened and hold no event: closed, then removed (a
                    // start that failed made no run, and leaves no empty data file of one
                    // behind); the start fails with the first error.
                    let (_, files, errors) = stop_builders(&mut b.running, &b.outputs);
                    let mut kept = Vec::new();
                    for f in files {
                        if f.events > 0 {
                            kept.push(f);
                            continue;
                        }
                        match std::fs::remove_file(&f.path) {
                            Ok(()) => {
                                tracing::info!(run, file = %f.path.display(), "empty data file removed: the BU's start failed")
                            }
                            Err(err) => {
                                tracing::warn!(run, file = %f.path.display(), error = %err, "an empty data file of the BU's failed start could not be removed");
                            }
                        }
                    }
                    log_stopped(run, &kept, &errors, "the BU's start failed");
                    return Err(e);
                }
            }
        }
        Ok(b)
    }

    fn spawn_builder(&self, t: usize, run: u32) -> Result<BuilderThread, EvbError> {
        let closed: Closed = Arc::default();
        let (tx, rx) = fifo::<ReadyEvent>(4096);
        let (done_tx, done_rx) = fifo::<u64>(1 << 16);
        let sink = open_sink(&self.config, self.et.as_ref(), self.unit.name(), t, run)?;
        let durable_at_once = sink.durable_at_once();
        let mut s = self.unit.scheduler(&format!("build{t}"), self.config.idle.strategy(), &self.config.build_cpus)?;
        s.add(Builder {
            name: format!("build-{t}"),
            rx,
            done: done_tx,
            unconfirmed: Vec::new(),
            confirmable: VecDeque::new(),
            sink: Some(sink),
            bu_id: self.config.id,
            run,
            level: CheckLevel { crc: self.config.check_crc },
            flush: FlushRule::new(
                self.config.credits,
                self.config.max_bytes_in_flight,
                self.config.threads,
                Duration::from_millis(self.config.flush_interval_ms),
            ),
            unconfirmed_bytes: 0,
            durable_at_once,
            last_flush: Instant::now(),
            shared: self.unit.shared.clone(),
            index: t,
            closed: closed.clone(),
            directory: (self.config.output == Output::Files).then(|| self.config.directory.clone()),
        });
        let stop = s.stop_handle();
        let running = s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?;
        Ok(BuilderThread { to: tx, from: done_rx, running: (stop, running), output: closed })
    }
}

impl Component for Bu {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let c = &self.config;
        c.validate()?;
        match c.output {
            Output::Files => std::fs::create_dir_all(&c.directory)
                .map_err(|e| EvbError::io(format!("creating {}", c.directory.display()), e))?,
            Output::Et if c.et.is_empty() => {
                return Err(EvbError::Config("bu: output = \"et\" needs et = NAME".into()).into());
            }
            Output::Et if self.et.is_none() => {
                return Err(
                    EvbError::Config("bu: output = \"et\": this program cannot open an ET system".into()).into()
                );
            }
            _ => {}
        }
        self.unit.profile(self.config.profile.as_deref(), self.config.profile_stamps);
        self.configured = true;
        Ok(Info::new())
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        if !self.configured {
            return Err(ComponentError::out_of_order(Verb::Start, "not configured"));
        }
        // The EVM gives the BU its generation, in the RU list.
        let hello = Message::Hello {
            role: Role::Bu,
            id: self.config.id,
            run,
            name: self.unit.name().to_owned(),
            addr: String::new(),
            generation: 0,
        };
        let patience = Duration::from_millis(self.config.connect_timeout_ms);
        let evm = connect(&self.config.evm, &control_options(), patience, &hello)?;
        let builders = (0..self.config.threads).map(|_| BuilderCounters::default()).collect();
        self.unit.begin(run, BuShared { builders, ..Default::default() });
        // Builder threads first, then the links.
        let builders = self.spawn_builders(run)?;
        let mut s = self.unit.scheduler("bu", self.config.idle.strategy(), &self.config.io_cpus)?;
        let io = BuIo::new(self, run, evm, builders, s.stop_handle());
        s.add_module(io);
        self.unit.spawn(s)
    }

    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        // The profile holds the builder threads too.
        self.unit.stop(|x| std::mem::take(&mut *x.builder_stamps.lock().unwrap_or_else(|p| p.into_inner())))
    }

    // Pause and resume: RUs and BUs follow the data, nothing to hold back.

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.unit.reset(false);
        self.configured = false;
        Ok(())
    }

    /// The live counters: the events and bytes built as of now (read from the builder threads'
    /// counters, so that the time the Driver stamps on them is theirs and an operator never
    /// puts more events recorded beside them than were built), the rest as last published (at
    /// most 100 ms old). After the run: its last counters, rates 0.
    fn stats(&self) -> Stats {
        let mut live = self.unit.live();
        (live.events, live.bytes) = self
            .unit
            .shared
            .extra
            .builders
            .iter()
            .fold((0, 0), |(e, b), c| (e + c.events.load(Ordering::Relaxed), b + c.bytes.load(Ordering::Relaxed)));
        live
    }

    fn failure(&self) -> Option<String> {
        self.unit.failure()
    }
}

/// Opens a builder thread's output.
fn open_sink(
    config: &BuConfig,
    et: Option<&EtOpener>,
    name: &str,
    thread: usize,
    run: u32,
) -> Result<Box<dyn EventSink>, EvbError> {
    Ok(match config.output {
        Output::Discard => Box::new(Discard),
        Output::Files => {
            let stream = if config.threads > 1 { format!("{name}-t{thread}") } else { name.to_owned() };
            let stream: String =
                stream.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
            // A builder unit restarted within the run takes its stream over: the `.part` files
            // its predecessor left holding no whole event are removed (every file left is a
            // readable data file, and an empty one does not block the name).
            let removed = remove_empty_part_files(&config.directory, run, Some(&stream))
                .map_err(|e| EvbError::Output(format!("{}: {e}", config.directory.display())))?;
            for path in &removed {
                tracing::warn!(
                    "removed {}: a file of an earlier {name} of this run that holds no whole event",
                    path.display()
                );
            }
            let mut fc = FileWriterConfig::new(&config.directory, run);
            fc.stream = Some(stream);
            fc.max_file_bytes = config.max_file_bytes;
            fc.config_digest = config.system_digest.unwrap_or_default().0;
            Box::new(FileWriter::new(fc).map_err(|e| EvbError::Output(e.to_string()))?)
        }
        Output::Et => {
            let open = et.ok_or_else(|| EvbError::Output("this program cannot open an ET system".into()))?;
            let mut sink = open(&config.et).map_err(|e| EvbError::Output(format!("ET system {}: {e}", config.et)))?;
            if config.et_confirm == EtConfirm::Consumed {
                sink.confirm_when_consumed().map_err(|e| EvbError::Output(format!("ET system {}: {e}", config.et)))?;
            }
            sink
        }
    })
}

/// A builder thread's task: builds, checks and outputs events, confirms them once durable.
struct Builder {
    name: String,
    rx: Consumer<ReadyEvent>,
    done: Producer<u64>,
    /// Put into the output, not yet flushed.
    unconfirmed: Vec<u64>,
    /// Flushed, waiting for room in the done FIFO.
    confirmable: VecDeque<u64>,
    sink: Option<Box<dyn EventSink>>,
    bu_id: u32,
    run: u32,
    level: CheckLevel,
    /// When to flush (and confirm) what was put.
    flush: FlushRule,
    /// Bytes of the events in `unconfirmed`.
    unconfirmed_bytes: u64,
    /// The output holds an event as soon as it is put (discard, ET): confirm at once.
    durable_at_once: bool,
    last_flush: Instant,
    shared: Arc<Shared>,
    index: usize,
    closed: Closed,
    /// The directory of the data files (`output = "files"`), named when the output fails.
    directory: Option<std::path::PathBuf>,
}

/// Where a builder leaves its output's closing result when its thread ends.
type Closed = Arc<Mutex<Option<Result<Vec<ClosedFile>, String>>>>;

impl Builder {
    /// The output failed doing `doing`: the error, with the disk's space when the output is
    /// files, kept for the BU's failure.
    fn output_failed(&self, doing: &str, e: daqflow_wire::sink::SinkError) -> BoxError {
        let text = match &self.directory {
            Some(dir) => {
                let space = DiskSpace::of(dir);
                let full = space.as_ref().is_ok_and(|s| s.free_bytes == 0)
                    || e.to_string().contains(&std::io::Error::from_raw_os_error(libc::ENOSPC).to_string());
                let space = space.map(|s| s.describe()).unwrap_or_else(|e| e.to_string());
                let what = if full { "disk full: " } else { "" };
                format!("{what}{doing} into {} ({space}): {e}", dir.display())
            }
            None => format!("{doing}: {e}"),
        };
        let mut slot = self.shared.extra.output_failed.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| text.clone());
        text.into()
    }

    fn flush(&mut self) -> Result<(), BoxError> {
        if let Some(s) = self.sink.as_mut()
            && let Err(e) = s.flush()
        {
            return Err(self.output_failed("flushing", e));
        }
        self.last_flush = Instant::now();
        self.unconfirmed_bytes = 0;
        self.confirmable.extend(self.unconfirmed.drain(..));
        while let Some(&id) = self.confirmable.front() {
            if self.done.push(id).is_err() {
                break;
            }
            self.confirmable.pop_front();
        }
        Ok(())
    }
}

impl Task for Builder {
    fn name(&self) -> &str {
        &self.name
    }
    fn poll(&mut self) -> bool {
        !self.rx.is_empty()
            || (!self.unconfirmed.is_empty() && self.last_flush.elapsed() >= self.flush.every)
            || (!self.confirmable.is_empty() && !self.done.is_full())
    }
    fn action(&mut self) -> Result<(), BoxError> {
        let c = &self.shared.extra.builders[self.index];
        for _ in 0..64 {
            let Ok(ev) = self.rx.pop() else { break };
            let trigger_type = ev.trigger.trigger_type;
            let probes = &*crate::common::PROBES;
            let built = crate::common::stamped(&probes.bu_build, || build(ev, self.bu_id, self.run, self.level));
            if built.flags != EventFlags::empty() {
                c.flagged.fetch_add(1, Ordering::Relaxed);
                c.crc_errors.fetch_add(u64::from(built.crc_errors), Ordering::Relaxed);
                tracing::warn!(builder = %self.name, "event {} built with flags {:#x}", built.event_id, built.flags.0);
            }
            let control = [trigger_type as i32, built.flags.0 as i32, 0, 0];
            let sink = self.sink.as_mut().expect("open until the end");
            let stop = &self.shared.stop;
            let put = crate::common::stamped(&probes.bu_write, || {
                sink.put(EventId(built.event_id), &built.parts, built.len, control, stop)
            });
            if let Err(e) = put {
                return Err(self.output_failed(&format!("writing event {}", built.event_id), e));
            }
            c.events.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(built.len as u64, Ordering::Relaxed);
            self.unconfirmed.push(built.event_id);
            self.unconfirmed_bytes += built.len as u64;
        }
        if self.durable_at_once
            || self.flush.due(self.unconfirmed.len(), self.unconfirmed_bytes, self.last_flush.elapsed())
            || !self.confirmable.is_empty()
        {
            self.flush()?;
        }
        Ok(())
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        if let Some(s) = self.sink.take() {
            *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.finish().map_err(|e| e.to_string()));
        }
    }
}

/// Hands `ev` to the next builder thread with room, round-robin from `next` (which moves on
/// past the one that took it); gives it back if every builder's FIFO is full.
fn hand_out(to: &mut [Producer<ReadyEvent>], next: &mut usize, ev: ReadyEvent) -> Result<(), ReadyEvent> {
    let n = to.len();
    let mut ev = ev;
    for k in 0..n {
        let b = (*next + k) % n;
        match to[b].push(ev) {
            Ok(()) => {
                *next = (b + 1) % n;
                return Ok(());
            }
            Err(daqflow_engine::fifo::PushError::Full(e)) => ev = e,
        }
    }
    Err(ev)
}

/// Stops every builder thread, then waits for each (so that none builds on while another is
/// joined): their time stamps (when profiled), the files their outputs closed (the outputs
/// were finished when their tasks were dropped) and what failed.
fn stop_builders(
    builders: &mut Vec<(StopHandle, Running)>,
    outputs: &[Closed],
) -> (Vec<daqflow_engine::profile::ThreadStamps>, Vec<ClosedFile>, Vec<String>) {
    let (mut stamps, mut files, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for (stop, _) in builders.iter() {
        stop.stop();
    }
    for (_, running) in builders.drain(..) {
        match running.join() {
            Ok(report) => stamps.extend(report.stamps),
            Err(e) => errors.push(e.to_string()),
        }
    }
    for o in outputs {
        match o.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(Ok(closed)) => files.extend(closed),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
    }
    (stamps, files, errors)
}

/// Logs what [`stop_builders`] closed and what failed where no report carries it (a reset, a
/// failed start): `why` says which.
fn log_stopped(run: u32, files: &[ClosedFile], errors: &[String], why: &str) {
    for f in files {
        tracing::info!(run, file = %f.path.display(), events = f.events, "data file closed: {why}");
    }
    for e in errors {
        tracing::warn!(run, error = %e, "a builder thread failed as it was stopped: {why}");
    }
}

/// The BU's I/O: the link to the EVM, the links to the RUs, the builder threads' queues and
/// the disk's `statvfs`, around the [`BuMachine`] that makes every decision.
struct BuIo {
    config: BuConfig,
    run: u32,
    evm: Peer,
    rus: Vec<Peer>,
    machine: BuMachine,
    backlog: VecDeque<ReadyEvent>,
    to_builders: Vec<Producer<ReadyEvent>>,
    from_builders: Vec<Consumer<u64>>,
    builders: Vec<(StopHandle, Running)>,
    outputs: Vec<Closed>,
    next_builder: usize,
    shared: Arc<Shared>,
    stopper: StopHandle,
    started: Instant,
    next_tick: Instant,
    last_publish: Instant,
    /// Rates of (events built, their bytes).
    rates: Rates<2>,
}

impl BuIo {
    fn new(bu: &Bu, run: u32, evm: daqflow_transport::Connection, builders: Builders, stopper: StopHandle) -> BuIo {
        let now = Instant::now();
        let mut evm = Peer::new(evm);
        evm.role = Some(Role::Bu);
        let disk = (bu.config.output == Output::Files).then(|| {
            DiskWatcher::new(
                &bu.config.directory,
                bu.config.disk_marks(),
                Duration::from_millis(bu.config.throttle_check_ms),
            )
        });
        let mut io = BuIo {
            config: bu.config.clone(),
            run,
            evm,
            rus: Vec::new(),
            machine: BuMachine::new(BuSettings::of(&bu.config, run, bu.unit.name()), disk, now),
            backlog: VecDeque::new(),
            to_builders: builders.to,
            from_builders: builders.from,
            builders: builders.running,
            outputs: builders.outputs,
            next_builder: 0,
            shared: bu.unit.shared.clone(),
            stopper,
            started: now,
            next_tick: now,
            last_publish: now,
            rates: Rates::new(now),
        };
        // Read the disk now, so that the first request already knows.
        io.read_disk(now);
        io
    }

    /// Does what the machine asks, in order.
    fn act(&mut self) {
        while let Some(o) = self.machine.next_output() {
            match o {
                BuOutput::ToEvm(m) => {
                    let evm = &mut self.evm;
                    crate::common::stamped(&crate::common::PROBES.bu_request, || evm.send(m.to_frame()));
                }
                BuOutput::ConnectRus { hello, rus } => self.connect_rus(&hello, rus),
                BuOutput::CloseEvm => {
                    let _ = self.evm.conn.close();
                    self.evm.closed = Some("left the run".into());
                }
            }
        }
        self.evm.try_flush();
        if let Some(f) = self.machine.failure()
            && read(&self.shared.failure).is_none()
        {
            set(&self.shared.failure, Some(f.to_owned()));
        }
        self.machine.take_ready(&mut self.backlog);
        self.dispatch();
    }

    fn read_evm(&mut self) {
        while let Some(frame) = self.evm.next() {
            self.machine.on_evm(Message::decode(&frame));
        }
        if let Some(why) = self.evm.closed.clone() {
            self.machine.evm_closed(&why);
        }
        self.act();
    }

    fn connect_rus(&mut self, hello: &Message, rus: Vec<(u32, String)>) {
        let patience = Duration::from_millis(self.config.connect_timeout_ms);
        let mut ids = Vec::new();
        for (id, addr) in rus {
            if self.rus.iter().any(|p| p.id == id) {
                continue;
            }
            match connect(&addr, &data_options(), patience, hello) {
                Ok(conn) => {
                    let mut p = Peer::new(conn);
                    p.role = Some(Role::Ru);
                    p.id = id;
                    self.rus.push(p);
                    ids.push(id);
                }
                Err(e) => {
                    self.machine.fail(format!("RU {id} at {addr}: {e}"));
                    return;
                }
            }
        }
        self.machine.rus_connected(&ids, Instant::now());
    }

    fn read_rus(&mut self) {
        for i in 0..self.rus.len() {
            let ru = self.rus[i].id;
            for _ in 0..1024 {
                let Some(frame) = self.rus[i].next() else { break };
                self.machine.on_ru_frame(ru, frame.kind, frame.payload);
            }
            if let Some(why) = self.rus[i].closed.clone()
                && self.rus[i].stash.is_none()
            {
                self.machine.ru_closed(ru, &why, self.rus[i].frames);
            }
            if self.machine.failure().is_some() {
                break;
            }
        }
        self.act();
    }

    fn dispatch(&mut self) {
        while let Some(ev) = self.backlog.pop_front() {
            if let Err(ev) = hand_out(&mut self.to_builders, &mut self.next_builder, ev) {
                self.backlog.push_front(ev);
                break;
            }
        }
    }

    /// Reads the disk's space when the machine says a reading is due.
    fn read_disk(&mut self, now: Instant) {
        let (events, bytes, ..) = self.totals();
        self.machine.built(events, bytes);
        if let Some(dir) = self.machine.disk_reading_due(now) {
            let space = DiskSpace::of(dir);
            self.machine.disk_space(space, now);
        }
    }

    fn tick(&mut self, now: Instant) {
        self.next_tick = now + Duration::from_millis(1);
        // A builder whose output failed has ended its thread: the BU cannot confirm any more.
        if self.machine.failure().is_none()
            && let Some(t) = self.builders.iter().position(|(_, r)| r.is_finished())
        {
            let why = read(&self.shared.extra.output_failed).unwrap_or_else(|| "its output failed; see the log".into());
            self.machine.leave(format!("builder thread {t} stopped ({why}); leaving the run"));
        }
        for rx in &mut self.from_builders {
            while let Ok(id) = rx.pop() {
                self.machine.confirmed(id);
            }
        }
        self.read_disk(now);
        let stop = self.shared.stop.load(Ordering::Relaxed);
        let step = self.machine.tick(now, stop, self.evm.conn.queued_bytes() == 0);
        self.act();
        if let Step::Finish { .. } = step {
            self.finish(now);
            self.stopper.stop();
            return;
        }
        self.publish(now);
    }

    fn totals(&self) -> (u64, u64, u64, u64) {
        self.shared.extra.builders.iter().fold((0, 0, 0, 0), |a, c| {
            (
                a.0 + c.events.load(Ordering::Relaxed),
                a.1 + c.bytes.load(Ordering::Relaxed),
                a.2 + c.flagged.load(Ordering::Relaxed),
                a.3 + c.crc_errors.load(Ordering::Relaxed),
            )
        })
    }

    fn finish(&mut self, now: Instant) {
        let (stamps, files, errors) = stop_builders(&mut self.builders, &self.outputs);
        self.shared.extra.builder_stamps.lock().unwrap_or_else(|p| p.into_inner()).extend(stamps);
        let files = files
            .iter()
            .map(|f| BuFile {
                path: f.path.clone(),
                events: f.events,
                bytes: f.file_bytes,
                first_event: f.first_event.map(|e| e.0),
                last_event: f.last_event.map(|e| e.0),
            })
            .collect();
        let incomplete = self.machine.clear();
        let (events, bytes, ..) = self.totals();
        let seconds = now.duration_since(self.started).as_secs_f64();
        let detail = BuDetail { incomplete_at_end: Some(incomplete.len()), files, errors, ..self.detail(seconds) };
        let summary = Stats::counted(events, bytes)
            .with_rates(per_second(events, seconds), per_second(bytes, seconds) / 1e6)
            .with_detail(&detail);
        set(&self.shared.summary, Some(summary));
        // Nothing moves any more: the live counters are the run's last, their rates 0 (not the
        // last second's, for ever).
        set(&self.shared.live, Stats::counted(events, bytes).with_detail(&self.detail(seconds)));
    }

    fn detail(&self, seconds: f64) -> BuDetail {
        let (_, _, flagged, crc_errors) = self.totals();
        let disk = self.machine.disk_report(Instant::now());
        BuDetail {
            throttled: disk.is_some_and(|d| d.throttled),
            throttle_count: disk.map_or(0, |d| d.throttle_count),
            throttled_s: disk.map_or(0.0, |d| d.throttled_s),
            throttled_for_s: disk.map_or(0.0, |d| d.throttled_for_s),
            disk_free_bytes: disk.map(|d| d.free_bytes),
            disk_used_pct: disk.map(|d| d.used_pct),
            id: self.config.id,
            run: self.run,
            seconds,
            events_flagged: flagged,
            crc_errors,
            in_progress: self.machine.in_progress(),
            rus_connected: self.rus.len(),
            threads: self.config.threads,
            output: self.config.output,
            incomplete_at_end: None,
            left_during_run: self.machine.left_during_run(),
            files: Vec::new(),
            errors: Vec::new(),
            error: self.machine.failure().map(str::to_owned),
        }
    }

    fn publish(&mut self, now: Instant) {
        if now.duration_since(self.last_publish) < PUBLISH_EVERY {
            return;
        }
        self.last_publish = now;
        let (events, bytes, ..) = self.totals();
        let [events_per_s, bytes_per_s] = self.rates.sample(now, [events, bytes]);
        let detail = self.detail(now.duration_since(self.started).as_secs_f64());
        let live = Stats::counted(events, bytes).with_rates(events_per_s, bytes_per_s / 1e6).with_detail(&detail);
        set(&self.shared.live, live);
    }
}

/// The live counters are published at most this often.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

impl Drop for BuIo {
    /// A BU reset (or failing) during a run: its builder threads are stopped and joined, so
    /// that their outputs close (files finished, ET attachments detached).
    fn drop(&mut self) {
        // After `finish` there is nothing left to stop. A reset mid-run has no report to give:
        // what its builders closed and what failed goes to the log.
        let (_, files, errors) = stop_builders(&mut self.builders, &self.outputs);
        log_stopped(self.run, &files, &errors, "the BU was reset");
    }
}

const TASK_EVM: usize = 0;
const TASK_RUS: usize = 1;
const TASK_TICK: usize = 2;

impl Module for BuIo {
    fn tasks(&self) -> usize {
        3
    }
    fn task_name(&self, task: usize) -> String {
        ["evm", "rus", "tick"][task].into()
    }
    fn poll(&mut self, task: usize) -> bool {
        match task {
            TASK_EVM => self.evm.poll(),
            TASK_RUS => self.rus.iter_mut().any(|p| p.poll()),
            TASK_TICK => Instant::now() >= self.next_tick || self.from_builders.iter().any(|r| !r.is_empty()),
            _ => false,
        }
    }
    fn wait_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        self.evm.wait_fd(out);
        for p in &self.rus {
            p.wait_fd(out);
        }
    }
    fn action(&mut self, task: usize) -> Result<(), BoxError> {
        match task {
            TASK_EVM => self.read_evm(),
            TASK_RUS => crate::common::stamped(&crate::common::PROBES.bu_receive, || self.read_rus()),
            _ => self.tick(Instant::now()),
        }
        Ok(())
    }
}
