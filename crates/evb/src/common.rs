//! What the event builder's components share: the range checks of their configurations, the
//! factory's error, live rates, and reading what a thread left under a lock.
//!
//! The state machine is not here: the component contract's `Driver` is the one state machine,
//! and refuses an illegal transition before any of the components' hooks runs.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use daqflow_component::ComponentError;

use crate::EvbError;

pub(crate) use daqflow_component::sync::{read, set};

/// A configuration that passed its range checks, or the framework's configuration error naming
/// the component: `NAME: KIND: `key` … ; `key` …`.
pub(crate) fn checked<T>(
    name: &str,
    config: T,
    validate: impl Fn(&T) -> Result<(), EvbError>,
) -> Result<T, ComponentError> {
    match validate(&config) {
        Ok(()) => Ok(config),
        Err(EvbError::Config(e)) => Err(ComponentError::Config(format!("{name}: {e}"))),
        Err(e) => Err(ComponentError::Config(format!("{name}: {e}"))),
    }
}

/// The window live rates are measured over.
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(1);

/// Rates of `N` counters over the last second ([`RATE_WINDOW`]), from samples taken now and
/// then (each publication of the live counters).
#[derive(Debug)]
pub(crate) struct Rates<const N: usize> {
    samples: VecDeque<(Instant, [u64; N])>,
}

impl<const N: usize> Rates<N> {
    /// Rates from counters that were all 0 at `start`.
    pub(crate) fn new(start: Instant) -> Rates<N> {
        Rates { samples: VecDeque::from([(start, [0; N])]) }
    }

    /// Takes a sample of the counters and returns each one's increase per second since the
    /// newest earlier sample at least a second old (or since the first, during the first
    /// second).
    pub(crate) fn sample(&mut self, now: Instant, counters: [u64; N]) -> [f64; N] {
        while self.samples.len() >= 2 && now.duration_since(self.samples[1].0) >= RATE_WINDOW {
            self.samples.pop_front();
        }
        let mut rates = [0.0; N];
        if let Some((t0, c0)) = self.samples.front() {
            let dt = now.duration_since(*t0).as_secs_f64();
            if dt > 0.0 {
                for (r, (c, c0)) in rates.iter_mut().zip(counters.iter().zip(c0)) {
                    *r = c.saturating_sub(*c0) as f64 / dt;
                }
            }
        }
        self.samples.push_back((now, counters));
        rates
    }
}

/// `count` per second over `seconds` (0 for no time): the mean rate of a run.
pub(crate) fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

/// Range checks of a component's configuration: every problem at once, each naming its key
/// in backquotes (`` `streams` = 0 is out of range: 1 … 4096 ``), as one [`EvbError::Config`].
/// The schema's `advertise` key of a kind that listens.
pub(crate) fn advertise_key() -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::text(
        "advertise",
        "The address answered at configure, `HOST` or `HOST:PORT`; default: the bound address, or for a wildcard `listen` this host's address towards the control server.",
    )
}

/// The schema's `idle` key: how `what` idles.
pub(crate) fn idle_key(what: &str) -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::choice(
        "idle",
        &["busy", "default", "lazy"],
        &format!(
            "Idle strategy of {what}: never sleep (a core of its own), spin then park, or sleep soon (many components sharing few cores)."
        ),
    )
}

/// A thread role's `*_cpus` key: the CPUs the threads of `role` are pinned to.
pub(crate) fn cpus_key(name: &str, role: &str) -> daqflow_component::schema::Key {
    daqflow_component::schema::Key::cpus(
        name,
        &format!(
            "CPUs {role} is pinned to, inside the component's `cpus`; default: not pinned (it runs where the process may)."
        ),
    )
}

/// A validated `*_cpus` value as the set a scheduler is pinned to (`None`: not pinned).
pub(crate) fn cpu_set(cpus: &Option<Vec<usize>>) -> Result<Option<daqflow_wire::affinity::CpuSet>, EvbError> {
    cpus.as_ref()
        .map(|c| daqflow_wire::affinity::CpuSet::new(c.iter().copied()))
        .transpose()
        .map_err(|e| EvbError::Config(format!("cpus {e}")))
}

pub(crate) struct Checks {
    kind: &'static str,
    problems: Vec<String>,
}

impl Checks {
    pub(crate) fn new(kind: &'static str) -> Checks {
        Checks { kind, problems: Vec::new() }
    }

    pub(crate) fn problem(&mut self, key: &str, what: impl std::fmt::Display) {
        self.problems.push(format!("`{key}` {what}"));
    }

    /// Every problem of `config` (serialized) against the kind's typed schema: each key's
    /// type and range.
    pub(crate) fn schema(&mut self, schema: &daqflow_component::schema::Schema, config: &impl serde::Serialize) {
        match toml::Table::try_from(config) {
            Ok(table) => self.problems.extend(schema.check(&table)),
            Err(e) => self.problems.push(format!("the configuration does not serialize: {e}")),
        }
    }

    /// An optional `advertise` value: `HOST` or `HOST:PORT`, not a wildcard.
    pub(crate) fn advertise(&mut self, value: Option<&str>) {
        if let Some(Err(e)) = value.map(daqflow_transport::advertise::check) {
            self.problem("advertise", e.to_string().trim_start_matches("advertise "));
        }
    }

    pub(crate) fn finish(self) -> Result<(), EvbError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(EvbError::Config(format!("{}: {}", self.kind, self.problems.join("; "))))
        }
    }
}

/// The schema's profiling keys of `what` (`profile`, `profile_stamps`).
pub(crate) fn profile_keys(what: &str) -> [daqflow_component::schema::Key; 2] {
    use daqflow_component::schema::Key;
    [
        Key::path(
            "profile",
            &format!(
                "Time-stamp {what}'s scheduler tasks and the event builder's probes (receive, assemble, request, build, write) and write the profile here at each stop (`{{run}}` is replaced by the run number, `{{name}}` by the component's name); read it with `daqflow profile FILE`. Empty: no profiling."
            ),
        ),
        Key::integer(
            "profile_stamps",
            2,
            1 << 28,
            "With `profile`: time stamps kept per thread (the latest; 16 bytes each).",
        )
        .unit("stamps"),
    ]
}

/// The event builder's probes: where an event's time goes through the builder, stamped only in
/// threads that record (`profile = PATH`); one relaxed load and a branch otherwise.
pub(crate) struct Probes {
    /// RU: reading a source stream's fragments.
    pub(crate) ru_receive: daqflow_engine::profile::Probe,
    /// RU: assembling a super-fragment for a BU.
    pub(crate) ru_assemble: daqflow_engine::profile::Probe,
    /// RU: handing a super-fragment to a BU's connection.
    pub(crate) ru_send: daqflow_engine::profile::Probe,
    /// EVM: triggering (taking events in).
    pub(crate) evm_trigger: daqflow_engine::profile::Probe,
    /// EVM: assigning events to BUs.
    pub(crate) evm_assign: daqflow_engine::profile::Probe,
    /// BU: asking the EVM for events (credits and confirmations).
    pub(crate) bu_request: daqflow_engine::profile::Probe,
    /// BU: receiving super-fragments from the RUs.
    pub(crate) bu_receive: daqflow_engine::profile::Probe,
    /// BU: building an event from its super-fragments (checks included).
    pub(crate) bu_build: daqflow_engine::profile::Probe,
    /// BU: writing a built event to its output (file or ET).
    pub(crate) bu_write: daqflow_engine::profile::Probe,
}

/// The probes, registered once per process.
pub(crate) static PROBES: std::sync::LazyLock<Probes> = std::sync::LazyLock::new(|| {
    use daqflow_engine::profile::Probe;
    Probes {
        ru_receive: Probe::new("ru.receive"),
        ru_assemble: Probe::new("ru.assemble"),
        ru_send: Probe::new("ru.send"),
        evm_trigger: Probe::new("evm.trigger"),
        evm_assign: Probe::new("evm.assign"),
        bu_request: Probe::new("bu.request"),
        bu_receive: Probe::new("bu.receive"),
        bu_build: Probe::new("bu.build"),
        bu_write: Probe::new("bu.write"),
    }
});

/// Runs `f` between `probe`'s entry and exit stamps.
#[inline]
pub(crate) fn stamped<T>(probe: &daqflow_engine::profile::Probe, f: impl FnOnce() -> T) -> T {
    probe.enter();
    let r = f();
    probe.exit();
    r
}

/// Time-stamp profiling of a component's schedulers (`profile = PATH`).
pub(crate) struct Profiling {
    name: String,
    path: std::path::PathBuf,
    stamps: usize,
    calibration: daqflow_engine::profile::Calibration,
}

impl Profiling {
    /// Profiling to `path` with rings of `stamps`, or None without a path. Calibrates the
    /// time-stamp counter (50 ms): call it at configure, not in the run.
    pub(crate) fn new(name: &str, path: Option<&std::path::Path>, stamps: usize) -> Option<Profiling> {
        let path = path.filter(|p| !p.as_os_str().is_empty())?;
        std::sync::LazyLock::force(&PROBES);
        Some(Profiling {
            name: name.to_owned(),
            path: path.to_path_buf(),
            stamps,
            calibration: daqflow_engine::profile::calibrate(Duration::from_millis(50), 10_000),
        })
    }

    /// `scheduler`, recording its stamps.
    pub(crate) fn scheduler(&self, scheduler: daqflow_engine::Scheduler) -> daqflow_engine::Scheduler {
        scheduler.with_profiling(self.stamps)
    }

    /// Writes the stamps of run `run`'s threads; the file written.
    pub(crate) fn write(
        &self,
        run: u32,
        threads: Vec<daqflow_engine::profile::ThreadStamps>,
    ) -> Result<std::path::PathBuf, EvbError> {
        let path = std::path::PathBuf::from(
            self.path.to_string_lossy().replace("{run}", &run.to_string()).replace("{name}", &self.name),
        );
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| EvbError::io(format!("creating {}", dir.display()), e))?;
        }
        daqflow_engine::profile::ProfileDump::new(self.calibration.clone(), threads)
            .write(&path)
            .map_err(|e| EvbError::Failed(format!("writing the profile {}: {e}", path.display())))?;
        tracing::info!("profile of run {run} written to {} (read it with `daqflow profile`)", path.display());
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_over_the_last_second() {
        let t0 = Instant::now();
        let mut r = Rates::<2>::new(t0);
        // The first half second: since the start.
        assert_eq!(r.sample(t0 + Duration::from_millis(500), [50, 5_000]), [100.0, 10_000.0]);
        // Samples every half second: from the newest one at least a second old.
        r.sample(t0 + Duration::from_millis(1000), [100, 10_000]);
        r.sample(t0 + Duration::from_millis(1500), [1_100, 10_000]);
        let [events, bytes] = r.sample(t0 + Duration::from_millis(2000), [1_100, 10_000]);
        assert_eq!((events, bytes), (1_000.0, 0.0), "from t = 1 s to t = 2 s");
        // Asked again at once: the same window.
        assert_eq!(r.sample(t0 + Duration::from_millis(2000), [1_100, 10_000]), [1_000.0, 0.0]);
        assert_eq!(per_second(10, 0.0), 0.0);
        assert_eq!(per_second(10, 2.0), 5.0);
    }

    #[test]
    fn a_configuration_error_names_the_component_and_the_kind() {
        let e = checked("ru-7", 0u64, |_| {
            let mut c = Checks::new("ru");
            c.schema(
                &crate::ru::schema(),
                &crate::ru::RuConfig { streams: 0, evm: "no port".into(), ..Default::default() },
            );
            c.finish()
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "configuration: ru-7: ru: `evm` = \"no port\" is not an address: HOST:PORT expected; \
             `streams` = 0 is out of range: 1 … 4096"
        );
    }
}
