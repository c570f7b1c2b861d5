//! `daqflow bench et`: the ET paper's figures 2, 3 and 4, and remote attachments.
//!
//! Every measurement runs an ET system process (`daqflow et start`), one producer process and
//! the consumer processes (`daqflow bench-helper et-producer|et-consumer`). The producer puts
//! events for the measurement time; each consumer gets and puts until the flow stops and
//! reports how many events it saw and the wall-clock window in which it saw them. The rate is
//! the number of distinct events that went through the system divided by the union of the
//! consumers' windows. Every event produced must reach every station (separate stations) or
//! exactly one consumer (a shared station): otherwise the measurement fails.
//!
//! - (a) `size`: events/s and MB/s vs event size, 8 B … 1 MiB, batches of 100, the producer
//!   writing the event's bytes into each event (fig. 2). Reference in the same run: memcpy of
//!   the same size, cycling over a working set as large as the pool.
//! - (b) `batch`: events/s vs events per call, 1 … 1000, at 64 B (fig. 4).
//! - (c) `consumers`: 1, 2, 4, 8 consumers on one shared station vs one station each (fig. 3).
//! - (d) `remote`: a consumer attached over TCP on 127.0.0.1, the producer writing the data.
//! - (e) `recorder`: 1, 2, 4 (8 on 8 cores or more) `recorder` components (the real one,
//!   writing data files to a RAM disk or `--dir`; more than one form a farm, `group`) against
//!   as many consumers that get and put the same events and compute their CRC32C without
//!   writing them (one shared station), 1 KiB … 1 MiB events that begin with a builder's event
//!   header: what writing the files costs the recorder (issue 29).

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use daqflow_et::{Attachment, EtClient, EtError, Position, RemoteClient, StationConfig, Wait};
use serde::{Deserialize, Serialize};

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};
use super::helper::{Helper, helper_args};

/// `bench-helper et-producer`.
#[derive(clap::Args, Debug)]
pub struct ProducerArgs {
    /// The ET system.
    #[arg(long)]
    name: String,
    /// Events per call.
    #[arg(long)]
    batch: usize,
    /// Event size.
    #[arg(long)]
    size: usize,
    /// Write the event's bytes into each event.
    #[arg(long)]
    write: bool,
    /// How long to produce.
    #[arg(long)]
    seconds: f64,
    /// Begin each event with a builder's event header (event ids 1, 2, …), as a recorder
    /// expects; with `--write`.
    #[arg(long)]
    header: bool,
}

/// `bench-helper et-consumer`.
#[derive(clap::Args, Debug)]
pub struct ConsumerArgs {
    /// The ET system.
    #[arg(long)]
    name: String,
    /// Attach over TCP to this address.
    #[arg(long)]
    remote: Option<SocketAddr>,
    /// The station (created blocking, selecting all, at the end of the chain, if missing).
    #[arg(long)]
    station: String,
    /// Events per call.
    #[arg(long)]
    batch: usize,
    /// Compute the CRC32C of every event's data (what a recorder computes for its files).
    #[arg(long)]
    crc: bool,
}

/// `bench-helper et-recorder`: a `recorder` component run in this process.
#[derive(clap::Args, Debug)]
pub struct RecorderArgs {
    /// The ET system.
    #[arg(long)]
    name: String,
    /// The component's name (its station's and its files').
    #[arg(long)]
    component: String,
    /// Where its files go.
    #[arg(long)]
    directory: std::path::PathBuf,
    /// Events per call.
    #[arg(long)]
    batch: usize,
    /// The farm it is a member of (its `group`), if any.
    #[arg(long)]
    group: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ProducerReport {
    events: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct ConsumerReport {
    events: u64,
    bytes: u64,
    /// Wall clock (ns since the epoch) of the first and the last batch.
    first_ns: u64,
    last_ns: u64,
}

fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn say(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The producer: new events, filled if asked, put, for the measurement time.
pub fn producer(a: &ProducerArgs) -> anyhow::Result<()> {
    let client = EtClient::connect(&a.name)?;
    let att = client.attach(daqflow_et::GRAND_CENTRAL)?;
    let source: Vec<u8> = (0..a.size).map(|i| (i * 7) as u8).collect();
    let mut events = Vec::with_capacity(a.batch);
    let stop = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut produced = 0u64;
    let header_len = daqflow_wire::EVENT_HEADER_LEN;
    anyhow::ensure!(!a.header || a.size >= header_len, "events with a header need at least {header_len} bytes");
    while Instant::now() < stop {
        att.new_events_into(a.batch, a.size, Wait::Sleep, &mut events)?;
        if a.write {
            for (k, e) in events.iter_mut().enumerate() {
                e.write(&source)?;
                if a.header {
                    let h = daqflow_wire::EventHeader {
                        flags: daqflow_wire::EventFlags::default(),
                        bu_id: 0,
                        event_id: daqflow_wire::EventId(produced + k as u64 + 1),
                        run_number: 1,
                        trigger_type: 0,
                        super_fragment_count: 0,
                        total_len: a.size as u64,
                    };
                    e.buffer_mut()[..header_len].copy_from_slice(&h.encode());
                }
            }
        }
        produced += events.len() as u64;
        att.put_events(&mut events)?;
    }
    say(&serde_json::to_string(&ProducerReport { events: produced })?)
}

/// A consumer: get and put until no event came for half a second after the first.
pub fn consumer(a: &ConsumerArgs) -> anyhow::Result<()> {
    let station = StationConfig::default();
    let (local, remote);
    let att: Box<dyn Attachment> = match a.remote {
        Some(addr) => {
            remote = RemoteClient::connect(addr)?;
            match remote.create_station(&a.station, station, Position::End) {
                Ok(()) | Err(EtError::StationExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            Box::new(remote.attach(&a.station)?)
        }
        None => {
            local = EtClient::connect(&a.name)?;
            match local.create_station(&a.station, station, Position::End) {
                Ok(()) | Err(EtError::StationExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            Box::new(local.attach(&a.station)?)
        }
    };
    say("ready")?;
    let mut events = Vec::with_capacity(a.batch);
    // One clock reading per batch, as Jefferson Lab's consumer (it is on the measured path).
    let (mut n, mut bytes, mut first_ns, mut last_ns) = (0u64, 0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        match att.get_events_into(a.batch, Wait::Timed(Duration::from_millis(100)), &mut events) {
            Ok(k) => {
                let now = wall_ns();
                if n == 0 {
                    first_ns = now;
                }
                last_ns = now;
                n += k as u64;
                bytes += events.iter().map(|e| e.len() as u64).sum::<u64>();
                if a.crc {
                    for e in &events {
                        std::hint::black_box(daqflow_wire::crc::crc32c(e.data()));
                    }
                }
                att.put_events(&mut events)?;
            }
            Err(EtError::Timeout) => {
                if n > 0 && wall_ns().saturating_sub(last_ns) > 500_000_000 {
                    break;
                }
                anyhow::ensure!(Instant::now() < deadline, "no events came");
            }
            Err(e) => return Err(e.into()),
        }
    }
    say(&serde_json::to_string(&ConsumerReport { events: n, bytes, first_ns, last_ns })?)
}

/// A recorder: the `recorder` component, configured, started, watched until no event came for
/// half a second after the first, stopped; reports what it recorded and the window in which its
/// count grew (read every 5 ms).
pub fn recorder(a: &RecorderArgs) -> anyhow::Result<()> {
    let mut config = toml::Table::new();
    config.insert("et".into(), a.name.clone().into());
    config.insert("directory".into(), a.directory.to_string_lossy().into_owned().into());
    config.insert("batch".into(), (a.batch as i64).into());
    if let Some(g) = &a.group {
        config.insert("group".into(), g.clone().into());
    }
    // Disk throttling off: this measures writing (a full disk fails the point, named).
    config.insert("throttle_high_pct".into(), 100.0.into());
    let mut rec = daqflow_et::components::recorder::factory(&a.component, config)?;
    rec.configure()?;
    rec.start(1)?;
    say("ready")?;
    let (mut seen, mut first_ns, mut last_ns) = (0u64, 0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        std::thread::sleep(Duration::from_millis(5));
        if let Some(why) = rec.failure() {
            bail!("the recorder failed: {why}");
        }
        let now = wall_ns();
        let events = rec.stats().events;
        if events != seen {
            if seen == 0 {
                first_ns = now;
            }
            (seen, last_ns) = (events, now);
        } else if seen > 0 && now.saturating_sub(last_ns) > 500_000_000 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no events came");
    }
    let summary = rec.stop(None)?;
    let bad = summary.detail.get("bad_events").and_then(serde_json::Value::as_u64).unwrap_or(0);
    anyhow::ensure!(bad == 0, "{bad} event(s) without a builder's header");
    say(&serde_json::to_string(&ConsumerReport { events: summary.events, bytes: summary.bytes, first_ns, last_ns })?)
}

/// One measurement's setup.
#[derive(Debug, Clone, Copy)]
struct Setup {
    size: usize,
    batch: usize,
    consumers: usize,
    separate: bool,
    remote: bool,
    write: bool,
    /// The consumers are `recorder` components writing files (the producer writes a builder's
    /// event header into every event).
    record: bool,
    /// The consumers compute the CRC32C of every event's data.
    crc: bool,
}

struct Measured {
    events_per_s: f64,
    mb_per_s: f64,
    /// Share of the samples (every 10 ms while the producer ran) in which the producer and the
    /// first consumer were on the same core, in %.
    same_core_pct: f64,
    /// CPU time taken meanwhile by processes outside the measurement, in % of the machine's.
    others_cpu_pct: f64,
}

/// Where the measured processes run and who else takes the CPU, sampled from `/proc` while the
/// producer runs: the two explanations of a low measurement (`docs/performance.md`, "Why a
/// measurement is low").
struct Placement {
    ours: Vec<u32>,
    samples: u64,
    same_core: u64,
    first: Option<(u64, u64, u64)>,
    last: Option<(u64, u64, u64)>,
}

impl Placement {
    fn new(ours: Vec<u32>) -> Placement {
        Placement { ours, samples: 0, same_core: 0, first: None, last: None }
    }

    /// The core process `pid` last ran on, and its CPU time (ticks).
    fn stat(pid: u32) -> Option<(u32, u64)> {
        daqflow_wire::affinity::TaskStat::of_process(pid).map(|s| (s.last_cpu, s.cpu_ticks))
    }

    /// The machine's busy and total CPU time (ticks, every core) from `/proc/stat`.
    fn machine() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = text.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        let total: u64 = v.iter().take(8).sum();
        let idle = v.get(3)? + v.get(4)?;
        Some((total - idle, total))
    }

    /// One sample; `producer` and `consumer` are the pids compared for the core.
    fn sample(&mut self, producer: u32, consumer: u32) {
        if let (Some((a, _)), Some((b, _))) = (Placement::stat(producer), Placement::stat(consumer)) {
            self.samples += 1;
            self.same_core += u64::from(a == b);
        }
        let ours: u64 = self.ours.iter().filter_map(|p| Placement::stat(*p)).map(|(_, t)| t).sum();
        if let Some((busy, total)) = Placement::machine() {
            let now = (busy, total, ours);
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }

    fn same_core_pct(&self) -> f64 {
        if self.samples == 0 { 0.0 } else { 100.0 * self.same_core as f64 / self.samples as f64 }
    }

    fn others_cpu_pct(&self) -> f64 {
        match (self.first, self.last) {
            (Some((b0, t0, o0)), Some((b1, t1, o1))) if t1 > t0 => {
                let others = (b1 - b0).saturating_sub(o1.saturating_sub(o0));
                100.0 * others as f64 / (t1 - t0) as f64
            }
            _ => 0.0,
        }
    }
}

/// Pool size: the paper's 3000 events, fewer for large events (at most 256 MiB).
fn pool_events(size: usize) -> usize {
    (256usize << 20).checked_div(size.max(1)).unwrap_or(3000).clamp(64, 3000)
}

fn point(n: u64, s: Setup, seconds: f64, dir: &std::path::Path) -> anyhow::Result<Measured> {
    let name = format!("bench-et-{}-{n}", std::process::id());
    let mut args: Vec<String> =
        ["et", "start", "--name", &name, "--events", &pool_events(s.size).to_string(), "--event-size"]
            .iter()
            .map(|x| x.to_string())
            .collect();
    args.push(s.size.max(8).to_string());
    if s.remote {
        args.extend(["--listen".into(), "127.0.0.1:0".into()]);
    }
    let system = Helper::spawn(&args)?;
    let ready = system.line(Duration::from_secs(30))?;
    let remote_addr = ready.split(" remote ").nth(1).map(str::to_owned);
    if s.remote && remote_addr.is_none() {
        bail!("the ET system did not say its remote address: {ready}");
    }
    // The recorders' files, removed after the point.
    let files = if s.record { Some(super::TempDir::new(dir, "et", &format!("rec-{n}"))?) } else { None };
    let mut consumers = Vec::new();
    for i in 0..s.consumers {
        let station = if s.separate { format!("c{i}") } else { "c".into() };
        let batch = s.batch.to_string();
        let (component, directory);
        let mut a = match &files {
            Some(dir) => {
                component = format!("rec-{i}");
                directory = dir.0.to_string_lossy().into_owned();
                let mut a = vec!["et-recorder", "--name", &name, "--component", &component, "--directory", &directory];
                if s.consumers > 1 {
                    a.extend(["--group", "rec"]);
                }
                a
            }
            None => vec!["et-consumer", "--name", &name, "--station", &station],
        };
        if s.crc {
            a.push("--crc");
        }
        a.extend(["--batch", &batch]);
        if let Some(addr) = &remote_addr {
            a.extend(["--remote", addr]);
        }
        consumers.push(Helper::spawn(&helper_args(&a))?);
    }
    for c in &consumers {
        let l = c.line(Duration::from_secs(30))?;
        anyhow::ensure!(l == "ready", "consumer said {l}");
    }
    let (size, batch, secs) = (s.size.to_string(), s.batch.to_string(), seconds.to_string());
    let mut p = vec!["et-producer", "--name", &name, "--size", &size, "--batch", &batch, "--seconds", &secs];
    if s.write {
        p.push("--write");
    }
    if s.record {
        p.push("--header");
    }
    let mut producer = Helper::spawn(&helper_args(&p))?;
    let mut ours: Vec<u32> = consumers.iter().map(Helper::pid).collect();
    ours.extend([system.pid(), producer.pid(), std::process::id()]);
    let mut placement = Placement::new(ours);
    let (producer_pid, consumer_pid) = (producer.pid(), consumers[0].pid());
    let sampling = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < sampling {
        placement.sample(producer_pid, consumer_pid);
        std::thread::sleep(Duration::from_millis(10));
    }
    let produced: ProducerReport = producer.json(Duration::from_secs_f64(seconds + 60.0))?;
    let mut reports = Vec::new();
    for c in &mut consumers {
        reports.push(c.json::<ConsumerReport>(Duration::from_secs(60))?);
    }
    drop(system);
    drop(files);
    let total: u64 = reports.iter().map(|r| r.events).sum();
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    if s.separate {
        for r in &reports {
            anyhow::ensure!(
                r.events == produced.events,
                "produced {} events, a station saw {}",
                produced.events,
                r.events
            );
        }
    } else {
        anyhow::ensure!(total == produced.events, "produced {} events, the consumers got {total}", produced.events);
    }
    anyhow::ensure!(bytes == total * s.size as u64, "consumers saw {bytes} bytes in {total} events of {} B", s.size);
    let first = reports.iter().map(|r| r.first_ns).min().unwrap_or(0);
    let last = reports.iter().map(|r| r.last_ns).max().unwrap_or(0);
    let window = (last.saturating_sub(first) as f64 / 1e9).max(1e-6);
    let events = produced.events as f64;
    Ok(Measured {
        events_per_s: events / window,
        mb_per_s: events * s.size as f64 / window / 1e6,
        same_core_pct: placement.same_core_pct(),
        others_cpu_pct: placement.others_cpu_pct(),
    })
}

/// What writing files costs the recorders: each `recorder` point of task `record` against the
/// `consume` point of the same event size and count (consumers that get the same events,
/// compute their CRC32C as the recorder does, and put them back, without writing them).
/// Issue 29's goal: ≤ 10 % on a machine of 8 cores or more.
pub(super) fn record_notes(suite: &mut Suite) {
    super::writing_cost_note(
        suite,
        "recorder",
        ("record", "consume"),
        ("consumers", ""),
        "writing files (recorder: record against consume, as many consumers getting the same events, computing \
         their CRC32C and putting them back, without files; the cost is 1 − record/consume)",
    );
}

/// Copies of `size` bytes from one buffer into successive slots of a working set of
/// `working_set` bytes, for `seconds`, with `copy`: MB/s.
fn copy_mb_per_s(size: usize, working_set: usize, seconds: f64, copy: fn(&mut [u8], &[u8])) -> f64 {
    let size = size.max(1);
    let slots = (working_set / size).max(1);
    let src: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![1u8; slots * size];
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut copied = 0u64;
    let mut slot = 0;
    while Instant::now() < stop {
        for _ in 0..256 {
            let d = &mut dst[slot * size..(slot + 1) * size];
            copy(d, std::hint::black_box(&src));
            std::hint::black_box(d);
            slot += 1;
            if slot == slots {
                slot = 0;
            }
        }
        copied += 256 * size as u64;
    }
    copied as f64 / start.elapsed().as_secs_f64() / 1e6
}

/// The platform memcpy.
fn memcpy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// Options of the ET suite.
#[derive(Debug, Clone)]
pub struct EtOptions {
    /// Event sizes of (a).
    pub sizes: Vec<usize>,
    /// Jefferson Lab's ET, to run beside daqflow's at (b)'s settings (case `jlab`).
    pub jlab: Option<super::jlab_et::JlabEt>,
    /// Only these cases (`None`: all); each one of [`CASES`].
    pub cases: Option<Vec<String>>,
    /// Where the recorders write (case `recorder`).
    pub dir: std::path::PathBuf,
}

/// The suite's cases, in the order it runs them.
pub const CASES: [&str; 6] = ["size", "batch", "consumers", "jlab", "remote", "recorder"];

pub fn run(config: BenchConfig, opts: EtOptions) -> anyhow::Result<Suite> {
    let mut suite =
        Suite::new("et", "the Event Transfer system (ET figs. 2, 3 and 4; remote attachments)", config.clone());
    let seconds = config.measure_time.as_secs_f64();
    let quick = config.quick;
    let mut n = 0u64;
    let wants = |case: &str| opts.cases.as_ref().is_none_or(|c| c.iter().any(|c| c == case));
    let mut measure =
        |suite: &mut Suite, case: &str, params: Vec<(&'static str, Param)>, s: Setup, references: bool| {
            if !wants(case) {
                return Ok(());
            }
            suite
                .measure(case, params, || {
                    n += 1;
                    let m = point(n, s, seconds, &opts.dir).with_context(|| format!("{s:?}"))?;
                    let mut metrics = Metrics::new()
                        .with("events_per_s", m.events_per_s)
                        .with("mb_per_s", m.mb_per_s)
                        .with("same_core_pct", m.same_core_pct)
                        .with("others_cpu_pct", m.others_cpu_pct);
                    if references {
                        let ws = pool_events(s.size) * s.size;
                        let t = seconds.min(0.5);
                        metrics = metrics
                            .with("memcpy_mb_per_s", copy_mb_per_s(s.size, ws, t, memcpy))
                            .with("copy_into_mb_per_s", copy_mb_per_s(s.size, ws, t, daqflow_et::copy_into));
                    }
                    Ok(metrics)
                })
                .map(|_| ())
        };
    let base = Setup {
        size: 64,
        batch: 100,
        consumers: 1,
        separate: false,
        remote: false,
        write: false,
        record: false,
        crc: false,
    };
    let params = |s: &Setup| -> Vec<(&'static str, Param)> {
        vec![
            ("event_bytes", s.size.into()),
            ("batch", s.batch.into()),
            ("consumers", s.consumers.into()),
            ("stations", if s.separate { "separate" } else { "shared" }.into()),
            ("remote", s.remote.into()),
        ]
    };
    for &size in &opts.sizes {
        let s = Setup { size, write: true, ..base };
        measure(&mut suite, "size", params(&s), s, true)?;
    }
    let batches: &[usize] = if quick { &[1, 100] } else { &[1, 10, 100, 1000] };
    for &batch in batches {
        let s = Setup { batch, ..base };
        measure(&mut suite, "batch", params(&s), s, false)?;
    }
    let counts: &[usize] = if quick { &[1, 4] } else { &[1, 2, 4, 8] };
    for separate in [false, true] {
        for &consumers in counts {
            let s = Setup { consumers, separate, ..base };
            measure(&mut suite, "consumers", params(&s), s, false)?;
        }
    }
    // Jefferson Lab's ET and daqflow's at the same settings, one after the other in every
    // repetition, so that both see the machine's load alike.
    if let Some(jlab) = opts.jlab.as_ref().filter(|_| wants("jlab")) {
        // Names of their own: `measure` holds the other counter.
        let mut n = 1_000_000u64;
        for batch in [1usize, 100] {
            let s = Setup { batch, ..base };
            suite.measure("jlab", params(&s), || {
                n += 1;
                let theirs = jlab.measure(batch, n).context("Jefferson Lab's ET")?;
                let m = point(n, s, seconds, &opts.dir).with_context(|| format!("{s:?}"))?;
                Ok(Metrics::new()
                    .with("events_per_s", m.events_per_s)
                    .with("jlab_events_per_s", theirs)
                    .with("ratio_to_jlab", m.events_per_s / theirs.max(1e-9))
                    .with("same_core_pct", m.same_core_pct)
                    .with("others_cpu_pct", m.others_cpu_pct))
            })?;
        }
    }
    let remote_sizes: &[usize] = if quick { &[64, 65536] } else { &[64, 5120, 65536] };
    for &size in remote_sizes {
        let s = Setup { size, remote: true, write: true, ..base };
        measure(&mut suite, "remote", params(&s), s, false)?;
    }
    // (e) What writing files costs a recorder: the recorders against as many plain consumers.
    let record_sizes: &[usize] = if quick { &[16384] } else { &[1024, 16384, 131072, 1 << 20] };
    // Eight recorders where the machine has the cores for them (issue 29's goal is for 8 or more).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let record_counts: &[usize] = match (quick, cpus >= 8) {
        (true, _) => &[1, 2],
        (false, false) => &[1, 2, 4],
        (false, true) => &[1, 2, 4, 8],
    };
    for &size in record_sizes {
        for &consumers in record_counts {
            for record in [false, true] {
                let s = Setup { size, consumers, write: true, record, crc: !record, ..base };
                let params = vec![
                    ("event_bytes", size.into()),
                    ("batch", s.batch.into()),
                    ("consumers", consumers.into()),
                    ("task", if record { "record" } else { "consume" }.into()),
                ];
                measure(&mut suite, "recorder", params, s, false)?;
            }
        }
    }
    record_notes(&mut suite);

    let series = |label: &str, case: &'static str, metric: &'static str, filter: Vec<(&'static str, Param)>| Series {
        label: label.into(),
        case,
        metric,
        filter,
    };
    suite.plots = vec![
        Plot {
            title: "(a) events/s vs event size, producer writing the data (fig. 2)".into(),
            x: "event_bytes",
            x_label: "event size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "events per second".into(),
            y_log: true,
            series: vec![
                series("daqflow ET, local", "size", "events_per_s", vec![]),
                series("daqflow ET, remote consumer", "remote", "events_per_s", vec![]),
            ],
        },
        Plot {
            title: "(a) MB/s vs event size, next to memcpy".into(),
            x: "event_bytes",
            x_label: "event size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "MB/s".into(),
            y_log: true,
            series: vec![
                series("daqflow ET, local", "size", "mb_per_s", vec![]),
                series("memcpy, pool-sized working set", "size", "memcpy_mb_per_s", vec![]),
                series("copy_into (streaming stores ≥ 32 KiB), same", "size", "copy_into_mb_per_s", vec![]),
                series("daqflow ET, remote consumer", "remote", "mb_per_s", vec![]),
            ],
        },
        Plot {
            title: "(b) events/s vs events per call, 64 B (fig. 4)".into(),
            x: "batch",
            x_label: "events per get/put call".into(),
            x_log: true,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: true,
            series: vec![
                series("daqflow ET", "batch", "events_per_s", vec![]),
                series("daqflow ET, beside Jefferson Lab's (--jlab-et)", "jlab", "events_per_s", vec![]),
                series("Jefferson Lab's ET, same run (--jlab-et)", "jlab", "jlab_events_per_s", vec![]),
            ],
        },
        Plot {
            title: "(c) events/s vs consumers, 64 B, batches of 100 (fig. 3)".into(),
            x: "consumers",
            x_label: "consumer processes".into(),
            x_log: false,
            x_bytes: false,
            y_label: "events per second".into(),
            y_log: true,
            series: vec![
                series("one shared station", "consumers", "events_per_s", vec![("stations", "shared".into())]),
                series("a station each", "consumers", "events_per_s", vec![("stations", "separate".into())]),
            ],
        },
    ];
    let recorder_series = [(1usize, "consume"), (1, "record"), (4, "consume"), (4, "record")]
        .into_iter()
        .map(|(k, t)| {
            let what = if t == "record" { "recorder writing files" } else { "consumer, no files" };
            series(&format!("{k} × {what}"), "recorder", "mb_per_s", vec![("consumers", k.into()), ("task", t.into())])
        })
        .collect();
    suite.plots.push(Plot {
        title: "(e) a recorder's MB/s vs event size, with and without its files".into(),
        x: "event_bytes",
        x_label: "event size (bytes)".into(),
        x_log: true,
        x_bytes: true,
        y_label: "MB/s".into(),
        y_log: false,
        series: recorder_series,
    });
    suite.note(super::machine_note());
    let ram = opts.dir.display().to_string();
    suite.note(format!(
        "Separate processes: the ET system (`daqflow et start`), one producer, the consumers; {seconds} s of production \
         per point. Pool: 3000 events (the paper's), fewer above 85 KiB (at most 256 MiB). events_per_s: distinct \
         events through the system per second of the consumers' window; every produced event is checked to arrive \
         (once per station). (a) and remote: the producer writes the event's bytes into each event; (b) and (c): \
         only the length is set (the paper's fig. 3 conditions). recorder: the producer writes every event, \
         beginning with a builder's event header; task record: that many `recorder` components (the real one, \
         each in a `bench-helper et-recorder` process; more than one form a farm, `group`) write the events \
         into data files in a fresh directory of {ram} (disk throttling off), removed after each repetition; \
         task consume: as many consumers on one shared station get the same events, compute their CRC32C (as \
         the recorder does) and put them back, without writing them; batches of 100 both. memcpy_mb_per_s: \
         one thread copying the same size with the platform memcpy over a working set as large as the pool, \
         in the same run; copy_into_mb_per_s: the same with the copy `Event::write` does (streaming stores \
         from 32 KiB up, which skip reading each destination line into the cache first). MB = 10^6 bytes."
    ));
    suite.note(if opts.jlab.is_some() {
        "jlab: Jefferson Lab's ET (its et_start, et_producer and et_consumer, --jlab-et) and daqflow's, one after the \
         other in every repetition, at the batch case's settings: 64 B events, only the length set, the same batch on \
         both sides, a pool of 3000 events, one consumer on a blocking station; Jefferson Lab's rate is its \
         consumer's own for its second 5 s interval (the first starts before the producer). ratio_to_jlab: daqflow's \
         events/s over Jefferson Lab's, per repetition."
            .to_string()
    } else {
        "Jefferson Lab's ET was not measured in this run (--jlab-et DIR runs it beside daqflow's): its figures \
         elsewhere are from other runs and machines, and not comparable with these (docs/performance.md)."
            .to_string()
    });
    Ok(suite)
}
