//! `monitor`: an ET consumer that fills online histograms from the events it sees and
//! publishes them with its statistics (`<name>/stats`, key `detail.histograms`, a
//! [`MonitorDetail`]; the web UI draws them). Its `events` are the events it looked at, its
//! `bytes` theirs.
//!
//! Its station is non-blocking: it takes events only while fewer than `cue` wait for it, so
//! a slow monitor never slows the data flow; the others flow past it. Histograms, reset at each
//! start:
//! - `event_size`: bytes per built event;
//! - `fragment_size_src<N>`: payload bytes of source N's fragments;
//! - `rate`: events seen in each of the run's last `rate_window_s` whole seconds (a time
//!   series: the second under way is not shown until it is over).
//!
//! A monitor of a user's own ([`user_kind`]) is the same ET consumer with the user's code in
//! place of these histograms: a function that decodes each built event and fills a
//! [`HistogramSet`] (one- and two-dimensional histograms, counters), emptied at each start and
//! published as `detail.histograms`. The demo's `detector` monitor is one
//! (`daqflow_kinds::adc_monitor`).
//!
//! Each histogram is `{"name","title","x_label","low","high","bins":[…],"underflow",
//! "overflow","entries","sum","min","max","mean","unit"}`: `sum`, `min`, `max` and `mean` are
//! of the values filled themselves (under- and overflow included), not of the bins' centres, so
//! that fragments of a fixed 512 bytes have the mean 512 whatever the binning. The `rate`
//! series has `"series": true`: its `entries` and `sum` are the events of the seconds shown,
//! its `mean`, `min` and `max` the events per second over those seconds (never negative).
//!
//! ```
//! use daqflow_et::components::monitor::Histogram;
//! let mut h = Histogram::new("event_size", "Event size", "bytes", 0.0, 100.0, 10);
//! h.fill(5.0);
//! h.fill(250.0);
//! let json = h.to_json();
//! assert_eq!((json["bins"][0].as_u64(), json["overflow"].as_u64()), (Some(1), Some(1)));
//! assert_eq!((json["mean"].as_f64(), json["max"].as_f64()), (Some(127.5), Some(250.0)));
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Attachment, EtClient, StationConfig, Wait};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::components::recorder::ensure_station;
use crate::components::{Recent, per_second, read, set};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

mod config;
pub use config::{MonitorConfig, schema};

/// Builds a `monitor` component named `name` from its configuration table (the registry's entry
/// for the kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: MonitorConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Monitor::new(name, c)))
}

/// The `monitor` kind: outside the event accounting (it samples, and never slows the data); it
/// starts with the recorders, before the producers, and stops with them.
pub fn kind() -> Kind {
    Kind::new("monitor", "an ET consumer filling online histograms from the events it sees", Role::Other, factory)
        .stages(2, 5)
        .schema(config::schema())
}

/// The monitor's own figures, the `detail` of its [`Stats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MonitorDetail {
    /// Events that are not built events (counted in `event_size` only).
    pub bad_events: u64,
    /// Seconds since the run started (until it stopped).
    pub seconds: f64,
    /// Megabytes (10⁶ bytes) looked at per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// The histograms: `event_size`, `fragment_size_src<N>` by source, `rate`.
    pub histograms: Vec<Histogram>,
}

/// The histograms' type lives in `daqflow-component`, shared by every kind that publishes
/// histograms (the chain's monitor too).
pub use daqflow_component::histogram::Histogram;
use daqflow_component::histogram::HistogramSet;
use daqflow_component::schema::{Key, Schema};

/// A monitor's code of a user's own: called with each built event it looks at and the
/// histograms it publishes (emptied when a run starts).
pub type UserFill = Box<dyn FnMut(&daqflow_wire::Event, &mut HistogramSet) + Send>;

/// Makes a component's [`UserFill`] from its name and configuration: the keys the kind
/// declared besides the monitor's own (`et`, `station`, `cue`, `prescale`), already checked
/// against their schema; a key the system file leaves out is absent (use the default you
/// declared).
pub type MakeFill = Arc<dyn Fn(&str, &toml::Table) -> Result<UserFill, ComponentError> + Send + Sync>;

/// The monitor's keys a monitor of a user's own has too.
const USER_MONITOR_KEYS: [&str; 4] = ["et", "station", "cue", "prescale"];

/// A kind of a user's own: an ET monitor (a non-blocking station of its own, `et`, `station`,
/// `cue` and `prescale` as the `monitor` kind's) whose histograms are those `make`'s function
/// fills, with the configuration keys `keys` besides. Register it in a program's
/// [`Registry`](daqflow_component::Registry) (`docs/histograms.md`):
///
/// ```
/// use daqflow_component::histogram::HistogramSet;
/// use daqflow_component::schema::Key;
/// use daqflow_et::components::monitor::{UserFill, user_kind};
///
/// let kind = user_kind(
///     "size_monitor",
///     "event sizes, in kB",
///     vec![Key::float("max_kb", 1.0, 1e6, "The histogram's upper edge.").unit("kB").default_value(64.0)],
///     |_name, config| {
///         let max = config.get("max_kb").and_then(|v| v.as_float()).unwrap_or(64.0);
///         let fill: UserFill = Box::new(move |event, h: &mut HistogramSet| {
///             h.h1("size_kb", "Event size", "kB", 0.0, max, 64).fill(event.as_bytes().len() as f64 / 1e3);
///         });
///         Ok(fill)
///     },
/// );
/// assert_eq!(kind.name, "size_monitor");
/// ```
pub fn user_kind(
    name: &'static str,
    about: &'static str,
    keys: Vec<Key>,
    make: impl Fn(&str, &toml::Table) -> Result<UserFill, ComponentError> + Send + Sync + 'static,
) -> Kind {
    let make: MakeFill = Arc::new(make);
    let base = config::schema();
    let schema = Schema {
        keys: base.keys.into_iter().filter(|k| USER_MONITOR_KEYS.contains(&k.name.as_str())).chain(keys).collect(),
        ..base
    };
    Kind::new(name, about, Role::Other, move |component, mut table| {
        let own: toml::Table =
            USER_MONITOR_KEYS.iter().filter_map(|k| table.remove(*k).map(|v| ((*k).to_owned(), v))).collect();
        let c: MonitorConfig = daqflow_component::parse_config(component, own)?;
        c.check(component)?;
        let fill = make(component, &table)?;
        Ok(Box::new(Monitor::with_user(component, c, fill)) as Box<dyn Component>)
    })
    .stages(2, 5)
    .schema(schema)
}

/// A user's code and what it fills.
struct User {
    fill: UserFill,
    histograms: HistogramSet,
}

/// What the monitor has filled.
struct Plots {
    /// A monitor of a user's own: its code and histograms, in place of those below.
    user: Option<User>,
    event_size: Histogram,
    fragment_size: BTreeMap<u32, Histogram>,
    /// Events seen in each second, oldest first: the window's whole seconds, then the second
    /// under way (`rate_second`, counted from the run's start).
    rate: Vec<u64>,
    rate_second: u64,
    /// The binning of the fragment-size histograms made as sources appear.
    bins: usize,
    fragment_size_max: f64,
}

impl Plots {
    fn new(c: &MonitorConfig) -> Plots {
        Plots {
            user: None,
            bins: c.bins,
            fragment_size_max: c.fragment_size_max,
            event_size: Histogram::new("event_size", "Event size", "bytes", 0.0, c.event_size_max, c.bins),
            fragment_size: BTreeMap::new(),
            rate: vec![0; c.rate_window_s.max(1) + 1],
            rate_second: 0,
        }
    }

    /// Empty plots for `c`, keeping a user's code and what it booked (emptied).
    fn renew(&mut self, c: &MonitorConfig) {
        let mut user = self.user.take();
        if let Some(u) = user.as_mut() {
            u.histograms.reset();
        }
        *self = Plots::new(c);
        self.user = user;
    }

    /// Moves the rate window to second `now_s`.
    fn advance(&mut self, now_s: u64) {
        let shift = now_s.saturating_sub(self.rate_second).min(self.rate.len() as u64) as usize;
        if shift > 0 {
            self.rate.rotate_left(shift);
            let n = self.rate.len();
            self.rate[n - shift..].iter_mut().for_each(|x| *x = 0);
        }
        self.rate_second = self.rate_second.max(now_s);
    }

    /// Every histogram: `event_size`, the fragment sizes by source, `rate` (`ended`: the run
    /// ended this many seconds after its start).
    fn histograms(&self, ended: Option<f64>) -> Vec<Histogram> {
        let mut v = vec![self.event_size.clone()];
        v.extend(self.fragment_size.values().cloned());
        v.push(self.rate_series(ended));
        v
    }

    /// The `rate` series, oldest first: the events seen in each whole second of the run in the
    /// window (not the second under way, nor seconds before the start), and once the run has
    /// ended (`ended`: its length in seconds) its last second too, whole or not. Its mean is
    /// the events per second over the time the bins cover; its lowest and highest, of the
    /// whole seconds.
    fn rate_series(&self, ended: Option<f64>) -> Histogram {
        let window = self.rate.len() - 1;
        let whole = (self.rate_second as usize).min(window);
        let (bins, seconds) = match ended {
            None => (self.rate[window - whole..window].to_vec(), whole as f64),
            Some(length) => {
                let last = (length - self.rate_second as f64).clamp(0.0, 1.0);
                (self.rate[window - whole..].to_vec(), whole as f64 + last)
            }
        };
        let sum: u64 = bins.iter().sum();
        let per_s = |x: Option<&u64>| x.map(|&n| n as f64);
        let (min, max) = (per_s(bins[..whole].iter().min()), per_s(bins[..whole].iter().max()));
        Histogram {
            name: "rate".into(),
            title: "Events seen per second".into(),
            x_label: "seconds ago".into(),
            low: -(bins.len() as f64),
            high: 0.0,
            underflow: 0,
            overflow: 0,
            entries: sum,
            sum: sum as f64,
            min,
            max,
            mean: (seconds > 0.0).then(|| sum as f64 / seconds),
            unit: "events/s".into(),
            series: true,
            bins,
        }
    }
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    bytes: AtomicU64,
    bad_events: AtomicU64,
}

/// The monitor component.
pub struct Monitor {
    name: String,
    config: MonitorConfig,
    station: String,
    plots: Arc<Mutex<Plots>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    worker: Option<JoinHandle<()>>,
    t0: Instant,
    /// When the run stopped.
    stopped: Option<Instant>,
    recent: Recent,
}

impl Monitor {
    /// A monitor; nothing is opened before configure.
    pub fn new(name: &str, config: MonitorConfig) -> Monitor {
        let station = config.station.clone().unwrap_or_else(|| name.to_owned());
        let plots = Arc::new(Mutex::new(Plots::new(&config)));
        Monitor {
            name: name.to_owned(),
            config,
            station,
            plots,
            counters: Arc::default(),
            stop: Arc::default(),
            failure: Arc::default(),
            worker: None,
            t0: Instant::now(),
            stopped: None,
            recent: Recent::new(),
        }
    }

    /// A monitor of a user's own: `fill` fills its histograms.
    pub fn with_user(name: &str, config: MonitorConfig, fill: UserFill) -> Monitor {
        let m = Monitor::new(name, config);
        m.plots.lock().unwrap_or_else(|p| p.into_inner()).user =
            Some(User { fill, histograms: HistogramSet::default() });
        m
    }

    /// The counters and histograms: live (rates over the last interval) or as a summary (the
    /// means over the run).
    fn report(&self, summary: bool) -> Stats {
        let c = &self.counters;
        let events = c.events.load(Ordering::Relaxed);
        let bytes = c.bytes.load(Ordering::Relaxed);
        let seconds = self.stopped.unwrap_or_else(Instant::now).duration_since(self.t0).as_secs_f64();
        let mean_mb_per_s = per_second(bytes, seconds) / 1e6;
        let (events_per_s, mb_per_s) =
            if summary { (per_second(events, seconds), mean_mb_per_s) } else { self.recent.rates(events, bytes) };
        let (histograms, user) = {
            let mut p = self.plots.lock().unwrap_or_else(|p| p.into_inner());
            let ended = self.stopped.map(|t| t.duration_since(self.t0).as_secs_f64());
            if self.worker.is_some() {
                p.advance(self.t0.elapsed().as_secs());
            } else if let Some(length) = ended {
                p.advance(length as u64);
            }
            match &p.user {
                Some(u) => (Vec::new(), Some(u.histograms.to_json())),
                None => (p.histograms(ended), None),
            }
        };
        let stats = Stats::counted(events, bytes).with_rates(events_per_s, mb_per_s);
        let detail =
            MonitorDetail { bad_events: c.bad_events.load(Ordering::Relaxed), seconds, mean_mb_per_s, histograms };
        match user {
            None => stats.with_detail(&detail),
            Some(published) => {
                let mut detail = serde_json::to_value(&detail).unwrap_or_default();
                detail["histograms"] = published;
                stats.with_detail(&detail)
            }
        }
    }

    fn end_worker(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Fills the plots from one built event (`daqflow-wire` event format). Returns false when
/// the event does not parse.
fn fill(plots: &mut Plots, data: &[u8]) -> bool {
    if let Some(user) = plots.user.as_mut() {
        let Ok(event) = daqflow_wire::Event::parse(Bytes::copy_from_slice(data)) else { return false };
        (user.fill)(&event, &mut user.histograms);
        return true;
    }
    let (bins, fragment_size_max) = (plots.bins, plots.fragment_size_max);
    plots.event_size.fill(data.len() as f64);
    let Ok(event) = daqflow_wire::Event::parse(Bytes::copy_from_slice(data)) else { return false };
    let mut ok = true;
    for sf in event.super_fragments() {
        let Ok(sf) = sf else {
            ok = false;
            break;
        };
        for f in sf.fragments() {
            let Ok(f) = f else {
                ok = false;
                break;
            };
            let src = f.header().source_id;
            plots
                .fragment_size
                .entry(src)
                .or_insert_with(|| {
                    Histogram::new(
                        &format!("fragment_size_src{src}"),
                        &format!("Fragment size, source {src}"),
                        "bytes",
                        0.0,
                        fragment_size_max,
                        bins,
                    )
                })
                .fill(f.header().payload_len as f64);
        }
    }
    ok
}

impl Component for Monitor {
    // Called for the keys its schema declares live, in their states, with a value in range.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        let mut c = self.config.clone();
        let bad = || ComponentError::Refused(format!("`{key}` = {value} is not a number"));
        let number = || value.as_float().or_else(|| value.as_integer().map(|i| i as f64));
        match key {
            "prescale" => c.prescale = value.as_integer().and_then(|v| u32::try_from(v).ok()).ok_or_else(bad)?,
            "bins" => c.bins = value.as_integer().and_then(|v| usize::try_from(v).ok()).ok_or_else(bad)?,
            "event_size_max" => c.event_size_max = number().ok_or_else(bad)?,
            "fragment_size_max" => c.fragment_size_max = number().ok_or_else(bad)?,
            _ => return Err(ComponentError::Refused(format!("`{key}` cannot change after configure"))),
        }
        c.check(&self.name)?;
        if key == "prescale" {
            let client = EtClient::connect(&c.et)?;
            let station =
                StationConfig { blocking: false, cue: c.cue.max(1), prescale: c.prescale, ..StationConfig::default() };
            client.configure_station(&self.station, station)?;
        } else {
            let mut p = self.plots.lock().unwrap_or_else(|p| p.into_inner());
            let (rate, second) = (std::mem::take(&mut p.rate), p.rate_second);
            let user = p.user.take();
            *p = Plots::new(&c);
            (p.rate, p.rate_second, p.user) = (rate, second, user); // the rate plot is not binned by size
        }
        tracing::info!("{key} is now {value}");
        self.config = c;
        Ok(())
    }

    /// Creates its station; answers `{"station": NAME}`.
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let client = EtClient::connect(&self.config.et)?;
        let config = StationConfig {
            blocking: false,
            cue: self.config.cue.max(1),
            prescale: self.config.prescale.max(1),
            ..StationConfig::default()
        };
        ensure_station(&client, &self.station, config, crate::Position::End)?;
        let mut info = Info::new();
        info.insert("station".into(), self.station.clone().into());
        Ok(info)
    }

    fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
        let client = EtClient::connect(&self.config.et)?;
        let attachment = client.attach(&self.station)?;
        self.plots.lock().unwrap_or_else(|p| p.into_inner()).renew(&self.config);
        self.counters = Arc::default();
        self.stop = Arc::default();
        set(&self.failure, None);
        self.t0 = Instant::now();
        self.stopped = None;
        self.recent = Recent::new();
        let (plots, counters, stop, failure) =
            (self.plots.clone(), self.counters.clone(), self.stop.clone(), self.failure.clone());
        let t0 = self.t0;
        self.worker = Some(std::thread::Builder::new().name(format!("{}-fill", self.name)).spawn(move || {
            let _client = client;
            let mut events = Vec::with_capacity(64);
            while !stop.load(Ordering::SeqCst) {
                events.clear();
                match attachment.get_events_into(64, Wait::Timed(Duration::from_millis(100)), &mut events) {
                    Ok(_) | Err(crate::EtError::Timeout) => {}
                    Err(e) => {
                        set(&failure, Some(format!("reading ET: {e}")));
                        return;
                    }
                }
                let now_s = t0.elapsed().as_secs();
                let mut p = plots.lock().unwrap_or_else(|p| p.into_inner());
                p.advance(now_s);
                let last = p.rate.len() - 1;
                p.rate[last] += events.len() as u64;
                for e in &events {
                    counters.events.fetch_add(1, Ordering::Relaxed);
                    counters.bytes.fetch_add(e.len() as u64, Ordering::Relaxed);
                    if !fill(&mut p, e.data()) {
                        counters.bad_events.fetch_add(1, Ordering::Relaxed);
                    }
                }
                drop(p);
                if !events.is_empty()
                    && let Err(e) = attachment.put_events(&mut events)
                {
                    set(&failure, Some(format!("putting events back: {e}")));
                    return;
                }
            }
        })?);
        Ok(())
    }

    /// The run's summary: the events looked at, their mean rates over the run, the histograms.
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        self.end_worker();
        self.stopped = Some(Instant::now());
        Ok(self.report(true))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        self.end_worker();
        Ok(())
    }

    /// The events looked at in the run, their rates over the last interval; a [`MonitorDetail`]
    /// with the histograms.
    fn stats(&self) -> Stats {
        self.report(false)
    }

    fn failure(&self) -> Option<String> {
        read(&self.failure)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.end_worker();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_window_moves_with_time_and_forgets_old_seconds() {
        let c: MonitorConfig = toml::from_str("et = 'x'\nrate_window_s = 3").unwrap();
        let mut p = Plots::new(&c);
        p.rate[3] = 5;
        p.advance(1);
        assert_eq!(p.rate, vec![0, 0, 5, 0]);
        p.advance(10);
        assert_eq!(p.rate, vec![0, 0, 0, 0]);
    }

    #[test]
    fn the_rate_series_shows_the_runs_whole_seconds_and_their_mean_per_second() {
        let c: MonitorConfig = toml::from_str("et = 'x'\nrate_window_s = 4").unwrap();
        let mut p = Plots::new(&c);
        // During the first second nothing is whole yet.
        p.rate[4] = 7;
        let r = p.rate_series(None);
        assert_eq!((r.bins.len(), r.mean, r.low, r.high), (0, None, 0.0, 0.0));
        // Seconds 0 and 1 whole (7 and 9 events), second 2 under way: two bins, from -2 s.
        p.advance(1);
        p.rate[4] = 9;
        p.advance(2);
        p.rate[4] = 1000;
        let r = p.rate_series(None);
        assert_eq!((r.bins.clone(), r.low, r.high, r.entries), (vec![7, 9], -2.0, 0.0, 16));
        assert_eq!(
            (r.mean, r.min, r.max, r.unit.as_str(), r.series),
            (Some(8.0), Some(7.0), Some(9.0), "events/s", true)
        );
        // The run ended at 2.5 s: its last half second counts too, over the time it covers.
        let r = p.rate_series(Some(2.5));
        assert_eq!((r.bins.clone(), r.low, r.entries), (vec![7, 9, 1000], -3.0, 1016));
        assert_eq!((r.mean, r.min, r.max), (Some(1016.0 / 2.5), Some(7.0), Some(9.0)));
        // Long after: the window's 4 seconds, the mean over them (never negative).
        p.advance(9);
        p.rate[4] = 3;
        p.advance(10);
        let r = p.rate_series(None);
        assert_eq!((r.bins.clone(), r.low, r.mean), (vec![0, 0, 0, 3], -4.0, Some(0.75)));
    }

    #[test]
    fn the_mean_is_of_the_values_filled_not_of_the_bins_centres() {
        // Fixed 512-byte fragments in bins of 64 bytes: the centre of theirs is 544.
        let mut h = Histogram::new("fragment_size_src0", "Fragment size", "bytes", 0.0, 4096.0, 64);
        h.fill_n(512.0, 1000);
        assert_eq!((h.mean(), h.extremes()), (Some(512.0), Some((512.0, 512.0))));
        h.fill(9000.0); // an overflow counts in the mean too
        let json = h.to_json();
        assert_eq!(
            (json["overflow"].as_u64(), json["max"].as_f64(), json["unit"].as_str()),
            (Some(1), Some(9000.0), Some("bytes"))
        );
        assert!((h.mean().unwrap() - (512.0 * 1000.0 + 9000.0) / 1001.0).abs() < 1e-9);
        assert!(json.get("series").is_none(), "a distribution: {json}");
        let empty = Histogram::new("e", "E", "bytes", 0.0, 1.0, 1).to_json();
        assert!(empty["mean"].is_null() && empty["min"].is_null(), "{empty}");
    }

    #[test]
    fn events_fill_the_size_and_per_source_histograms_and_garbage_is_counted() {
        use daqflow_wire::EventId;
        use daqflow_wire::{EventFlags, EventInfo};
        use daqflow_wire::{Fragment, FragmentInfo};
        use daqflow_wire::{SuperFragment, SuperFragmentFlags};
        let c: MonitorConfig = toml::from_str("et = 'x'").unwrap();
        let mut p = Plots::new(&c);
        let frags: Vec<Fragment> = (0..2u32)
            .map(|src| {
                let info = FragmentInfo { source_id: src, event_id: EventId(1), run_number: 1, ..Default::default() };
                Fragment::parse(Fragment::encode(&info, &vec![0u8; 100 * (src as usize + 1)])).unwrap()
            })
            .collect();
        let sf = SuperFragment::parse(SuperFragment::assemble(0, EventId(1), SuperFragmentFlags::default(), &frags))
            .unwrap();
        let info = EventInfo {
            event_id: EventId(1),
            run_number: 1,
            bu_id: 0,
            flags: EventFlags::empty(),
            ..Default::default()
        };
        let ev = daqflow_wire::Event::assemble(&info, &[sf]);
        assert!(fill(&mut p, &ev));
        assert!(!fill(&mut p, b"garbage"));
        let h = p.histograms(None);
        assert_eq!(h[0].entries(), 2);
        assert_eq!(h.iter().filter(|h| h.name().starts_with("fragment_size_src")).count(), 2);
        assert_eq!(h[1].bins().iter().sum::<u64>(), 1);
        assert_eq!(h.last().map(Histogram::name), Some("rate"));
        // Published as before: every key of a histogram, `entries` counted.
        let json = serde_json::to_value(MonitorDetail { histograms: h, ..Default::default() }).unwrap();
        let keys = ["name", "title", "x_label", "low", "high", "bins", "underflow", "overflow", "entries"];
        assert!(keys.iter().all(|k| json["histograms"][0].get(k).is_some()), "{json}");
        assert_eq!(json["histograms"][0]["entries"], 2);
    }
}
