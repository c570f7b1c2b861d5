//! `recorder`: an ET consumer that writes every event it gets into data files
//! (`daqflow-wire`'s file format, `docs/formats.md`), rotating by size, with a run metadata
//! file beside them.
//!
//! The recorder has its own station (blocking, so it gets every event the selection takes;
//! events of a recorder that dies go back to the station's input, and the station keeps the
//! events that come while no recorder is attached, so a restarted recorder writes them all).
//! Recorders naming one `group` form a farm: their stations are a parallel group (ET's
//! `Position::ParallelWith`) after a first station named after the group, each event goes to
//! one of them (`group_policy`), and the events of a member that dies go to the others
//! (`RestoreMode::Redistribute`); those it had written but not given back are then in two
//! files, counted as `duplicates` in the run's accounting. At `stop` it goes on reading until its station stayed empty for `drain_ms`
//! (the operator stops the producers first), then closes the files and writes
//! `runNNNNNN_NAME.meta.json`: run, start and stop time, events, bytes and every file with
//! its events, size and first and last event id.
//!
//! Disk throttling: the recorder watches the filesystem of its `directory`
//! ([`DiskWatcher`]); above `throttle_high_pct` of it used it takes no events from its station
//! (they wait in ET, whose back-pressure holds the builder) until usage falls below
//! `throttle_low_pct`. A write that fails anyway (a full disk) puts it in Error with a message
//! naming the disk; its file is left as `.part` with whole events only, and the events it had
//! not written go back to its station. The space above `throttle_high_pct` is the disk's
//! reserve for the end of a run: from its stop, or from the live `drain_into_reserve` (the
//! operator sets it when a run stops while the recorder is throttled, before the producers'
//! stop), the recorder writes into half of it, throttled or not; the other half stays free
//! (the floor).
//!
//! Its statistics: `events` recorded and their `bytes`, and a [`RecorderDetail`]; the summary
//! of a run adds every file (`detail.files`: `path`, `events`, `bytes`, `first_event`,
//! `last_event`) and the metadata file's path (`detail.metadata`).
//!
//! ```
//! use std::path::PathBuf;
//! let kind = daqflow_et::components::recorder::kind();
//! let config: toml::Table = "et = 'daq'\ndirectory = '/data/run'".parse().unwrap();
//! assert_eq!((kind.data_files.unwrap())(&config), Some(PathBuf::from("/data/run")));
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Attachment, EtClient, StationConfig, Wait};
use daqflow_wire::EventHeader;
use daqflow_wire::EventId;
use daqflow_wire::file::{
    ClosedFile, DiskChange, DiskReport, DiskSpace, DiskWatcher, FileWriteError, FileWriter, FileWriterConfig,
    remove_empty_part_files,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::components::now_ms;
use crate::components::{Recent, per_second, read, set};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

mod config;
pub use config::{RecorderConfig, schema};

/// Builds a `recorder` component named `name` from its configuration table (the registry's entry
/// for the kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: RecorderConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    if c.drain_into_reserve {
        return Err(ComponentError::Config(format!(
            "{name}: `drain_into_reserve` is set live in a run (the operator sets it when a run stops while the \
             recorder is throttled by its disk), not in the configuration: the reserve above throttle_high_pct is \
             for the end of a run"
        )));
    }
    Ok(Box::new(Recorder::new(name, c)))
}

/// The `recorder` kind: records the events of the run ([`Role::Recorder`]: it starts before
/// the producers and stops after them), into its configured `directory`.
pub fn kind() -> Kind {
    Kind::new("recorder", "an ET consumer writing every event it gets into data files", Role::Recorder, factory)
        .data_files(data_directory)
        .takes_system_digest()
        .schema(config::schema())
}

/// Where a recorder configured with `config` writes its files: its `directory` (a required key,
/// without default).
fn data_directory(config: &toml::Table) -> Option<PathBuf> {
    config.get("directory").and_then(|d| d.as_str()).map(PathBuf::from)
}

/// The recorder's own figures, the `detail` of its [`Stats`]; its `events` are the events
/// recorded, its `bytes` theirs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecorderDetail {
    /// Seconds since the run started (until it stopped).
    pub seconds: f64,
    /// Megabytes (10⁶ bytes) recorded per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Events without a builder's header, recorded under event id 0.
    pub bad_events: u64,
    /// Events the ET system marked possibly corrupt (held by a consumer that died).
    pub possibly_corrupt: u64,
    /// Files closed so far (the file being written not counted).
    pub files_closed: u64,
    /// When the run started (Unix ms; none before the first run).
    pub started_ms: Option<u64>,
    /// When it stopped (Unix ms; in the summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_ms: Option<u64>,
    /// Every file of the run (in the summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<RecordedFile>>,
    /// The run's metadata file, `runNNNNNN_NAME.meta.json` (in the summary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PathBuf>,
    /// Disk throttling: the recorder takes no events now, its disk being above
    /// `throttle_high_pct` (until it is below `throttle_low_pct`).
    pub throttled: bool,
    /// How many times it throttled in the run.
    pub throttle_count: u64,
    /// Seconds spent throttled in the run.
    pub throttled_s: f64,
    /// Seconds of the current throttled period (0 when not throttled): the operator stops the
    /// run once it passes `[system] disk_full_stop_s`.
    pub throttled_for_s: f64,
    /// Free bytes on the filesystem of `directory`, at the last reading.
    pub disk_free_bytes: u64,
    /// Usage of that filesystem (percent), at the last reading.
    pub disk_used_pct: f64,
}

/// One data file of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordedFile {
    /// Where it is.
    pub path: PathBuf,
    /// Events in it.
    pub events: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its first event id, if any.
    pub first_event: Option<u64>,
    /// Its last event id, if any.
    pub last_event: Option<u64>,
}

impl From<&ClosedFile> for RecordedFile {
    fn from(f: &ClosedFile) -> Self {
        RecordedFile {
            path: f.path.clone(),
            events: f.events,
            bytes: f.file_bytes,
            first_event: f.first_event.map(|e| e.0),
            last_event: f.last_event.map(|e| e.0),
        }
    }
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    bytes: AtomicU64,
    bad_events: AtomicU64,
    possibly_corrupt: AtomicU64,
    files: AtomicU64,
    /// Disk throttling, as the writer thread last saw it.
    disk: Mutex<DiskReport>,
}

/// The recorder component.
pub struct Recorder {
    name: String,
    config: RecorderConfig,
    station: String,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    /// `drain_into_reserve` was set in the run: the writer thread drains into the disk's
    /// reserve.
    reserve: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    worker: Option<JoinHandle<Result<Vec<ClosedFile>, String>>>,
    run: u32,
    started_ms: Option<u64>,
    t0: Instant,
    /// When the run stopped.
    stopped: Option<Instant>,
    recent: Recent,
}

impl Recorder {
    /// A recorder; nothing is opened before configure.
    pub fn new(name: &str, config: RecorderConfig) -> Recorder {
        let station = config.station.clone().unwrap_or_else(|| name.to_owned());
        Recorder {
            name: name.to_owned(),
            config,
            station,
            counters: Arc::default(),
            stop: Arc::default(),
            reserve: Arc::default(),
            failure: Arc::default(),
            worker: None,
            run: 0,
            started_ms: None,
            t0: Instant::now(),
            stopped: None,
            recent: Recent::new(),
        }
    }

    /// Seconds since the run started, until it stopped.
    fn seconds(&self) -> f64 {
        match self.started_ms {
            Some(_) => self.stopped.unwrap_or_else(Instant::now).duration_since(self.t0).as_secs_f64(),
            None => 0.0,
        }
    }

    /// The counters, with the rates over the last interval (live) or over the run (`summary`),
    /// and the detail of the live statistics.
    fn counted(&self, summary: bool) -> (Stats, RecorderDetail) {
        let c = &self.counters;
        let events = c.events.load(Ordering::Relaxed);
        let bytes = c.bytes.load(Ordering::Relaxed);
        let seconds = self.seconds();
        let mean_mb_per_s = per_second(bytes, seconds) / 1e6;
        let disk = *c.disk.lock().unwrap_or_else(|p| p.into_inner());
        let (events_per_s, mb_per_s) =
            if summary { (per_second(events, seconds), mean_mb_per_s) } else { self.recent.rates(events, bytes) };
        let detail = RecorderDetail {
            seconds,
            mean_mb_per_s,
            bad_events: c.bad_events.load(Ordering::Relaxed),
            possibly_corrupt: c.possibly_corrupt.load(Ordering::Relaxed),
            files_closed: c.files.load(Ordering::Relaxed),
            started_ms: self.started_ms,
            throttled: disk.throttled,
            throttle_count: disk.throttle_count,
            throttled_s: disk.throttled_s,
            throttled_for_s: disk.throttled_for_s,
            disk_free_bytes: disk.free_bytes,
            disk_used_pct: disk.used_pct,
            ..RecorderDetail::default()
        };
        (Stats::counted(events, bytes).with_rates(events_per_s, mb_per_s), detail)
    }

    /// The live `drain_into_reserve`: `true` lets the writer thread use the disk's reserve
    /// (the space above `throttle_high_pct`, half of it) from now until the run ends; `false`
    /// is refused once it drains (the reserve's bytes are written).
    fn drain_into_reserve(&mut self, value: &toml::Value) -> Result<(), ComponentError> {
        let Some(on) = value.as_bool() else {
            return Err(ComponentError::Refused(format!("`drain_into_reserve` = {value} is not true or false")));
        };
        if on {
            if !self.reserve.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    recorder = %self.name,
                    "drain_into_reserve: writing into the reserve of the filesystem of {} (up to half the space above \
                     throttle_high_pct) until the run ends",
                    self.config.directory.display()
                );
            }
        } else if self.reserve.load(Ordering::SeqCst) {
            return Err(ComponentError::Refused(
                "`drain_into_reserve` cannot be taken back in the run: the recorder drains into its reserve until \
                 the run ends"
                    .into(),
            ));
        }
        Ok(())
    }

    fn station_config(&self) -> Result<StationConfig, ComponentError> {
        let selection = crate::Selection::parse(&self.config.select)
            .map_err(|e| ComponentError::Config(format!("select = {:?}: {e}", self.config.select)))?;
        Ok(StationConfig {
            blocking: true,
            prescale: self.config.prescale.max(1),
            selection,
            // In a farm, the events of a member that dies go to the others; alone, they wait
            // in its station for its next life.
            restore: if self.config.group.is_some() {
                crate::RestoreMode::Redistribute
            } else {
                crate::RestoreMode::Input
            },
            // Across its own restart too: the events wait in its station, none flows past (in
            // a farm: only those no other member takes).
            keep_when_idle: true,
            group_policy: self.config.group_policy(),
            ..StationConfig::default()
        })
    }

    /// Creates its station (in its group, if it has one) or, when it exists, gives it its
    /// settings.
    fn ensure_stations(&self, client: &EtClient) -> Result<(), ComponentError> {
        let config = self.station_config()?;
        let Some(group) = &self.config.group else {
            return ensure_station(client, &self.station, config, crate::Position::End);
        };
        // The group's first station: named after the group, it holds the group's policy and
        // round-robin counter, and takes no events (nobody attaches to it, it keeps none).
        let head = StationConfig {
            blocking: true,
            restore: crate::RestoreMode::Redistribute,
            group_policy: config.group_policy,
            ..StationConfig::default()
        };
        ensure_station(client, group, head.clone(), crate::Position::End)?;
        ensure_station(client, &self.station, config, crate::Position::ParallelWith(group.clone()))?;
        // Once more now that it is in a group: a station alone keeps round-robin whatever it is
        // given, so another member configuring it before it had a member could have reset it.
        client.configure_station(group, head)?;
        let snapshot = client.snapshot()?;
        let group_of = |n: &str| snapshot.stations.iter().find(|s| s.name == n).and_then(|s| s.group);
        if group_of(group).is_none() || group_of(group) != group_of(&self.station) {
            return Err(ComponentError::Config(format!(
                "group = {group:?}: station `{}` exists in the ET system `{}` outside the group (made before it joined \
                 one): remove it (`daqflow et station remove --name {} {}`) or restart the ET system",
                self.station, self.config.et, self.config.et, self.station
            )));
        }
        Ok(())
    }
}

/// Creates station `name` at `position` or, when it exists, gives it `config`.
pub(crate) fn ensure_station(
    client: &EtClient,
    name: &str,
    config: StationConfig,
    position: crate::Position,
) -> Result<(), ComponentError> {
    match client.create_station(name, config.clone(), position) {
        Ok(()) => Ok(()),
        Err(crate::EtError::StationExists(_)) => Ok(client.configure_station(name, config)?),
        Err(e) => Err(e.into()),
    }
}

impl Component for Recorder {
    // Called for the keys its schema declares live, in their states, with a value in range.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        let mut c = self.config.clone();
        let bad = || ComponentError::Refused(format!("`{key}` = {value} is not a whole number"));
        if key == daqflow_component::schema::DRAIN_INTO_RESERVE_KEY {
            return self.drain_into_reserve(value);
        }
        match key {
            "max_file_bytes" => {
                c.max_file_bytes = value.as_integer().and_then(|v| u64::try_from(v).ok()).ok_or_else(bad)?
            }
            "prescale" => c.prescale = value.as_integer().and_then(|v| u32::try_from(v).ok()).ok_or_else(bad)?,
            _ => return Err(ComponentError::Refused(format!("`{key}` cannot change after configure"))),
        }
        c.check(&self.name)?;
        let old = std::mem::replace(&mut self.config, c);
        if key == "prescale" {
            let station = self.station_config();
            let r = station.and_then(|s| Ok(EtClient::connect(&self.config.et)?.configure_station(&self.station, s)?));
            if let Err(e) = r {
                self.config = old;
                return Err(e);
            }
        }
        tracing::info!("{key} is now {value}");
        Ok(())
    }

    /// Creates the directory and the station; answers `{"station": NAME, "directory": PATH}`.
    fn configure(&mut self) -> Result<Info, ComponentError> {
        self.config.check(&self.name)?;
        std::fs::create_dir_all(&self.config.directory)
            .map_err(|e| ComponentError::Config(format!("directory {}: {e}", self.config.directory.display())))?;
        let client = EtClient::connect(&self.config.et)?;
        self.ensure_stations(&client)?;
        let mut info = Info::new();
        info.insert("station".into(), self.station.clone().into());
        info.insert("directory".into(), self.config.directory.to_string_lossy().into_owned().into());
        Ok(info)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        // A recorder restarted within a run (operator policy `restart`) finds its own files:
        // it goes on in a new stream, `NAME.r1`, `NAME.r2`, … and never overwrites data. The
        // `.part` files of a predecessor that hold no whole event (it died before its first
        // event reached the disk) are removed first, so that every file left is a readable
        // data file; a stream left with no file is taken again.
        let mut restart = 0;
        let mut swept = false;
        let writer = loop {
            let stream = if restart == 0 { self.name.clone() } else { format!("{}.r{restart}", self.name) };
            let mut wc = FileWriterConfig::new(&self.config.directory, run);
            wc.stream = Some(stream.clone());
            wc.max_file_bytes = self.config.max_file_bytes;
            wc.sync_on_close = self.config.sync_on_close;
            wc.config_digest = self.config.system_digest.unwrap_or_default().0;
            match FileWriter::new(wc) {
                Ok(w) => break w,
                Err(FileWriteError::FileExists { .. }) if !swept && restart < 1000 => {
                    swept = true;
                    let removed = remove_empty_part_files(&self.config.directory, run, Some(&stream))
                        .map_err(|e| ComponentError::Failed(format!("{}: {e}", self.config.directory.display())))?;
                    for path in &removed {
                        tracing::warn!(
                            recorder = %self.name,
                            "removed {}: a file of an earlier recorder of this run that holds no whole event",
                            path.display()
                        );
                    }
                    if removed.is_empty() {
                        swept = false;
                        restart += 1;
                    }
                }
                Err(FileWriteError::FileExists { .. }) if restart < 1000 => {
                    swept = false;
                    restart += 1;
                }
                Err(e) if e.is_disk_full() => {
                    return Err(ComponentError::Failed(format!(
                        "disk full: {e} ({})",
                        DiskSpace::of(&self.config.directory).map(|s| s.describe()).unwrap_or_else(|e| e.to_string())
                    )));
                }
                Err(e) => return Err(ComponentError::Failed(e.to_string())),
            }
        };
        let client = EtClient::connect(&self.config.et)?;
        let attachment = client.attach(&self.station)?;
        self.counters = Arc::default();
        self.stop = Arc::default();
        self.reserve = Arc::default();
        set(&self.failure, None);
        self.run = run;
        self.started_ms = Some(now_ms());
        self.t0 = Instant::now();
        self.stopped = None;
        self.recent = Recent::new();
        let (counters, stop, failure) = (self.counters.clone(), self.stop.clone(), self.failure.clone());
        let reserve = self.reserve.clone();
        let (batch, drain, timeout) = (
            self.config.batch,
            Duration::from_millis(self.config.drain_ms),
            Duration::from_millis(self.config.stop_timeout_ms),
        );
        let mut disk = DiskWatcher::new(
            &self.config.directory,
            self.config.disk_marks(),
            Duration::from_millis(self.config.throttle_check_ms),
        );
        // The disk is read once now, so that a directory whose space cannot be read fails the
        // start, not the run.
        if let Some(DiskChange::Throttled(space)) =
            disk.check(Instant::now()).map_err(|e| ComponentError::Failed(e.to_string()))?
        {
            tracing::warn!(
                recorder = %self.name,
                "disk throttling from the start: the filesystem of {} has {}, above throttle_high_pct: taking no \
                 events until it is below throttle_low_pct",
                self.config.directory.display(),
                space.describe()
            );
        }
        let name = self.name.clone();
        let worker = std::thread::Builder::new().name(format!("{}-write", self.name)).spawn(move || {
            let _client = client;
            let w = Writer { attachment: &attachment, writer, counters: &counters, disk, reserve: &reserve, name };
            let r = record(w, &stop, batch, drain, timeout);
            if let Err(e) = &r {
                set(&failure, Some(e.clone()));
            }
            r
        })?;
        self.worker = Some(worker);
        Ok(())
    }

    /// Drains the station, closes the files and writes the run's metadata file; the summary's
    /// detail lists every file and the metadata file.
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        self.stop.store(true, Ordering::SeqCst);
        let Some(worker) = self.worker.take() else {
            // No run is being recorded (its start failed): nothing to close, and no metadata
            // file to write, lest an earlier run's be overwritten.
            let (stats, detail) = self.counted(true);
            return Ok(stats.with_detail(&detail));
        };
        let files = match worker.join() {
            Ok(Ok(files)) => files,
            Ok(Err(e)) => return Err(ComponentError::Failed(e)),
            Err(_) => return Err(ComponentError::Failed("the writer thread panicked".into())),
        };
        self.stopped = Some(Instant::now());
        let stopped_ms = now_ms();
        let files: Vec<RecordedFile> = files.iter().map(RecordedFile::from).collect();
        let c = &self.counters;
        // The metadata file (`docs/operator-guide.md`, "Files"), beside the data files.
        let metadata = json!({
            "run": self.run,
            "component": self.name,
            "started_ms": self.started_ms,
            "stopped_ms": stopped_ms,
            "events": c.events.load(Ordering::Relaxed),
            "bytes": c.bytes.load(Ordering::Relaxed),
            "bad_events": c.bad_events.load(Ordering::Relaxed),
            "possibly_corrupt": c.possibly_corrupt.load(Ordering::Relaxed),
            "files": files,
        });
        let meta = self.config.directory.join(format!("run{:06}_{}.meta.json", self.run, self.name));
        let text = serde_json::to_string_pretty(&metadata).unwrap_or_default();
        std::fs::write(&meta, text).map_err(|e| ComponentError::Failed(format!("{}: {e}", meta.display())))?;
        let (stats, detail) = self.counted(true);
        let detail =
            RecorderDetail { stopped_ms: Some(stopped_ms), files: Some(files), metadata: Some(meta), ..detail };
        Ok(stats.with_detail(&detail))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        if self.worker.is_some() {
            self.stop(None)?;
        }
        Ok(())
    }

    /// Events and bytes recorded in the run, their rates over the last interval; a
    /// [`RecorderDetail`].
    fn stats(&self) -> Stats {
        let (stats, detail) = self.counted(false);
        stats.with_detail(&detail)
    }

    fn failure(&self) -> Option<String> {
        read(&self.failure)
    }
}

/// What the writer thread works with.
struct Writer<'a> {
    attachment: &'a crate::LocalAttachment,
    writer: FileWriter,
    counters: &'a Counters,
    disk: DiskWatcher,
    /// Set live (`drain_into_reserve`): drain into the disk's reserve before the stop.
    reserve: &'a AtomicBool,
    name: String,
}

impl Writer<'_> {
    /// Reads the disk's space when due and applies the marks; whether the recorder is
    /// throttled.
    fn throttled(&mut self) -> Result<bool, String> {
        let now = Instant::now();
        match self.disk.check(now).map_err(|e| e.to_string())? {
            Some(DiskChange::Throttled(space)) => self.warn_throttled(space, false),
            Some(DiskChange::Resumed(space)) => tracing::warn!(
                recorder = %self.name,
                "disk throttling ended: the filesystem of {} has {}, below throttle_low_pct: taking events again",
                self.disk.directory().display(),
                space.describe()
            ),
            None => {}
        }
        *self.counters.disk.lock().unwrap_or_else(|p| p.into_inner()) = self.disk.report(now);
        Ok(self.disk.throttled())
    }

    /// Says that the recorder throttles: the disk (`space`, read or, when `estimated`, the
    /// last reading less what was written since) is above `throttle_high_pct`, or would be
    /// with its next event.
    fn warn_throttled(&self, space: DiskSpace, estimated: bool) {
        let why = if estimated {
            " by its estimate (the last reading less the bytes written since): its next event would take it above \
             throttle_high_pct"
        } else {
            ", above throttle_high_pct"
        };
        tracing::warn!(
            recorder = %self.name,
            "disk throttling: the filesystem of {} has {}{why}: taking no events until it is below throttle_low_pct",
            self.disk.directory().display(),
            space.describe()
        );
        *self.counters.disk.lock().unwrap_or_else(|p| p.into_inner()) = self.disk.report(Instant::now());
    }

    /// The error of a failed write or flush, naming the disk when it is full.
    fn failed(&self, doing: &str, e: FileWriteError) -> String {
        let dir = self.disk.directory();
        let space = DiskSpace::of(dir).map(|s| s.describe()).unwrap_or_else(|e| e.to_string());
        let whole = match self.writer.abandoned().last() {
            Some(f) => format!(
                "; {} is left with its {} whole events (no partial event); the events not written stay in the \
                 station",
                f.path.display(),
                f.events
            ),
            None => String::new(),
        };
        if e.is_disk_full() {
            format!("disk full: {doing} into {} ({space}): {e}{whole}", dir.display())
        } else {
            format!("{doing}: {e} (the filesystem of {} has {space}){whole}", dir.display())
        }
    }
}

/// The writer thread: events from the station into files until the stop, then drained.
fn record(
    mut w: Writer,
    stop: &AtomicBool,
    batch: usize,
    drain: Duration,
    timeout: Duration,
) -> Result<Vec<ClosedFile>, String> {
    // On a failure the files written so far are still closed properly (trailer, final name).
    let r = record_into(&mut w, stop, batch, drain, timeout);
    let writer = w.writer;
    match r {
        Ok(()) => writer.finish().map_err(|e| format!("closing the files: {e}")),
        Err(e) => {
            let closed = writer.finish().map(|files| files.len());
            tracing::error!("recorder failed ({e}); files closed: {closed:?}");
            Err(e)
        }
    }
}

fn record_into(
    w: &mut Writer,
    stop: &AtomicBool,
    batch: usize,
    drain: Duration,
    timeout: Duration,
) -> Result<(), String> {
    // The events taken from the station and not yet written: kept across a throttle (the disk
    // had no room for them), written once it has.
    let mut held = Vec::with_capacity(batch);
    let mut quiet_since: Option<Instant> = None;
    let mut stop_seen: Option<Instant> = None;
    let mut last_flush = Instant::now();
    loop {
        if stop_seen.is_none() && stop.load(Ordering::SeqCst) {
            stop_seen = Some(Instant::now());
            // The producers have stopped: what is left goes into the space above the high
            // mark, half of it (the rest stays for closing the files).
            w.disk.drain();
        }
        if !w.disk.draining() && w.reserve.load(Ordering::SeqCst) {
            // The run is being stopped for a full disk: what is in flight (in ET, in the
            // builder units) goes into the reserve now, so that the producers' stop drains.
            w.disk.drain();
        }
        let mut throttled = w.throttled()?;
        let taking = !throttled || (w.disk.draining() && w.disk.room() > 0);
        let n = if !taking || !held.is_empty() {
            // Disk throttling: the events wait in the station (ET's back-pressure holds the
            // builder); a stop waits for room until `stop_timeout_ms`.
            0
        } else {
            match w.attachment.get_events_into(batch, Wait::Timed(Duration::from_millis(50)), &mut held) {
                Ok(n) => n,
                Err(crate::EtError::Timeout) => 0,
                Err(e) => return Err(format!("reading ET: {e}")),
            }
        };
        if taking && throttled {
            // Draining into the space above the high mark.
            throttled = false;
        }
        // Each event is written only if the disk has room for it by the watcher's estimate
        // (the bytes written since its last reading counted): the first that has none throttles
        // the recorder at once, and it and those after it stay held.
        let mut written = 0;
        for e in &held {
            let data = e.data();
            if let Err(change) = w.disk.admit(DiskWatcher::record_bytes(data.len()), Instant::now()) {
                if let Some(DiskChange::Throttled(space)) = change {
                    w.warn_throttled(space, true);
                }
                throttled = true;
                break;
            }
            // The builder's header names the event; anything else is written under id 0 and
            // counted, never dropped.
            let id = match EventHeader::decode(data) {
                Ok(h) => h.event_id,
                Err(_) => {
                    w.counters.bad_events.fetch_add(1, Ordering::Relaxed);
                    EventId(0)
                }
            };
            if e.is_possibly_corrupt() {
                w.counters.possibly_corrupt.fetch_add(1, Ordering::Relaxed);
            }
            let before = w.writer.closed_files().len();
            if let Err(e) = w.writer.write_event(id, data) {
                return Err(w.failed("writing", e));
            }
            if w.writer.closed_files().len() != before {
                w.counters.files.fetch_add(1, Ordering::Relaxed);
            }
            w.counters.events.fetch_add(1, Ordering::Relaxed);
            w.counters.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            written += 1;
        }
        if written > 0 {
            // Handed to the operating system before they are given back to ET: a recorder
            // killed after this point leaves them in its file, one killed before gives them
            // back to its station for the next recorder (never neither).
            if let Err(e) = w.writer.flush() {
                return Err(w.failed("flushing", e));
            }
            let rest = held.split_off(written);
            w.attachment.put_events(&mut held).map_err(|e| format!("putting events back: {e}"))?;
            held = rest;
            quiet_since = None;
        } else if throttled || n > 0 || !held.is_empty() {
            // Not drained: the station is not read, or events are held.
            quiet_since = None;
        } else if quiet_since.is_none() {
            quiet_since = Some(Instant::now());
        }
        if throttled {
            std::thread::sleep(Duration::from_millis(20));
        }
        if last_flush.elapsed() >= Duration::from_secs(1) {
            if let Err(e) = w.writer.flush() {
                return Err(w.failed("flushing", e));
            }
            last_flush = Instant::now();
        }
        if let Some(s) = stop_seen {
            let drained = quiet_since.is_some_and(|q| q.elapsed() >= drain);
            if drained || s.elapsed() >= timeout {
                if !drained && throttled {
                    tracing::warn!(
                        recorder = %w.name,
                        "stopped while throttled by its disk: the {} events it held and those left in its station \
                         are not recorded (they stay in the station)",
                        held.len()
                    );
                }
                break;
            }
        }
    }
    Ok(())
}
