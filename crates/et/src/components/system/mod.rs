//! `et`: an ET system (`daqflow-et`) as a component. `configure` creates the system (shared
//! memory named after it), `reset` stops it; runs do not change it.
//!
//! Its statistics count the events put through the system in the run: `events` are the new
//! events GrandCentral handed out to producers since the run started (since configure before
//! the first run), `bytes` stay 0 (the system does not count bytes). Its detail
//! ([`EtDetail`]) is the system's snapshot: stations, queue depths, events in and out,
//! attachments.
//!
//! ```
//! use daqflow_component::Component;
//! use daqflow_et::components::system::{EtComponent, EtConfig, EtDetail};
//! let mut et = EtComponent::new("et-doc", EtConfig { name: Some(format!("doc-{}", std::process::id())), events: 64, event_size: 1024, ..Default::default() });
//! let info = et.configure()?;
//! assert!(info["et"].as_str().unwrap().starts_with("doc-"));
//! let detail: EtDetail = et.stats().detail_as().unwrap();
//! assert_eq!(detail.snapshot.unwrap().stations[0].name, daqflow_et::GRAND_CENTRAL);
//! et.reset()?;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::Snapshot;
use crate::components::{Recent, per_second};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

mod config;
pub use config::{EtConfig, schema};

/// Builds a `et` component named `name` from its configuration table (the registry's entry
/// for the kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: EtConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(EtComponent::new(name, c)))
}

/// The `et` kind: the buffer between the builders and the recorders; it starts before its
/// consumers and producers and stops after them (the stages of [`Role::Buffer`]).
pub fn kind() -> Kind {
    Kind::new("et", "an ET system: built events in shared memory on their way to the consumers", Role::Buffer, factory)
        .schema(config::schema())
}

/// The ET system's own figures, the `detail` of its [`Stats`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EtDetail {
    /// The system's snapshot (`docs/et.md`, "Monitoring"); none before configure.
    pub snapshot: Option<Snapshot>,
}

/// An ET system component.
pub struct EtComponent {
    name: String,
    config: EtConfig,
    system: Option<crate::EtSystem>,
    /// GrandCentral's events out when the run started (or at configure), and when.
    since: (u64, Instant),
    /// When the run stopped (its summary's time), if it did.
    stopped: Option<Instant>,
    recent: Recent,
}

impl EtComponent {
    /// A component that will create the system on configure.
    pub fn new(name: &str, config: EtConfig) -> EtComponent {
        EtComponent {
            name: name.to_owned(),
            config,
            system: None,
            since: (0, Instant::now()),
            stopped: None,
            recent: Recent::new(),
        }
    }

    /// Events GrandCentral handed out to producers since the system was created.
    fn handed_out(snapshot: Option<&Snapshot>) -> u64 {
        snapshot.and_then(|s| s.stations.first()).map_or(0, |gc| gc.events_out)
    }

    /// Counts from now on.
    fn count_from_now(&mut self) {
        let snapshot = self.system.as_ref().map(|s| s.snapshot());
        self.since = (Self::handed_out(snapshot.as_ref()), Instant::now());
        self.stopped = None;
        self.recent = Recent::new();
    }

    /// The counters: live (rates over the last interval) or as a summary (the mean over the run).
    fn report(&self, summary: bool) -> Stats {
        let snapshot = self.system.as_ref().map(|s| s.snapshot());
        let events = Self::handed_out(snapshot.as_ref()).saturating_sub(self.since.0);
        let events_per_s = if summary {
            let until = self.stopped.unwrap_or_else(Instant::now);
            per_second(events, until.duration_since(self.since.1).as_secs_f64())
        } else {
            self.recent.rates(events, 0).0
        };
        Stats::counted(events, 0).with_rates(events_per_s, 0.0).with_detail(&EtDetail { snapshot })
    }
}

impl Component for EtComponent {
    /// Creates the system; answers `{"et": NAME, "remote": ADDR or null}`.
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let name = self.config.name.clone().unwrap_or_else(|| self.name.clone());
        self.config.check(&self.name)?;
        let mut c = crate::SystemConfig::new(&name, self.config.events, self.config.event_size);
        c.max_temp_events = self.config.max_temp_events;
        c.max_event_bytes = self.config.max_event_bytes;
        c.max_temp_bytes = self.config.max_temp_bytes;
        c.max_temp_per_attachment = self.config.max_temp_per_attachment;
        c.max_attachments_per_connection = self.config.max_attachments_per_connection;
        c.allowed_uids = self.config.allowed_uids.clone();
        c.heartbeat_timeout = std::time::Duration::from_millis(self.config.heartbeat_timeout_ms.max(100));
        let cpu_set = |key: &str, cpus: &Option<Vec<usize>>| {
            cpus.as_ref()
                .map(|c| daqflow_wire::affinity::CpuSet::new(c.iter().copied()))
                .transpose()
                .map_err(|e| ComponentError::Config(format!("{}: `{key}` {e}", self.name)))
        };
        c.conductor_cpus = cpu_set("conductor_cpus", &self.config.conductor_cpus)?;
        c.server_cpus = cpu_set("server_cpus", &self.config.server_cpus)?;
        if let Some(l) = &self.config.listen {
            c.listen = Some(l.parse().map_err(|e| ComponentError::Config(format!("listen = {l:?}: {e}")))?);
        }
        let system = crate::EtSystem::create(c)?;
        let remote = match system.remote_addr() {
            Some(a) => Some(
                daqflow_transport::advertise::advertised(a, self.config.advertise.as_deref())
                    .map_err(|e| ComponentError::Config(format!("{}: {e}", self.name)))?,
            ),
            None => None,
        };
        self.system = Some(system);
        self.count_from_now();
        let mut info = Info::new();
        info.insert("et".into(), name.into());
        info.insert("remote".into(), remote.into());
        Ok(info)
    }

    fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
        self.count_from_now();
        Ok(())
    }

    /// The run's summary: the events put through in the run, their mean rate, the snapshot.
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        self.stopped = Some(Instant::now());
        Ok(self.report(true))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        if let Some(s) = self.system.take() {
            s.stop();
        }
        Ok(())
    }

    /// The events put through since the run started, their rate over the last interval, the
    /// snapshot.
    fn stats(&self) -> Stats {
        self.report(false)
    }
}

impl Drop for EtComponent {
    fn drop(&mut self) {
        let _ = self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Attachment, EtClient, EtError, Limit, Wait};

    #[test]
    fn the_limit_keys_reach_the_et_system() {
        let name = format!("et-keys-{}", std::process::id());
        let table: toml::Table = toml::from_str(&format!(
            "name = {name:?}\nevents = 16\nevent_size = 1024\nmax_event_bytes = 10000\n\
             max_attachments_per_connection = 1\nallowed_uids = [4242]"
        ))
        .unwrap();
        let config: EtConfig = daqflow_component::parse_config("et", table).unwrap();
        assert_eq!(config.allowed_uids, [4242]);
        let mut et = EtComponent::new("et", config);
        et.configure().unwrap();
        let client = EtClient::connect(&name).unwrap();
        let producer = client.attach(crate::GRAND_CENTRAL).unwrap();
        assert!(matches!(
            producer.new_events(1, 10_001, Wait::NoWait),
            Err(EtError::OverLimit { limit: Limit::EventBytes, max: 10_000, .. })
        ));
        assert!(matches!(
            client.attach(crate::GRAND_CENTRAL),
            Err(EtError::OverLimit { limit: Limit::AttachmentsPerConnection, .. })
        ));
        drop((producer, client));
        et.reset().unwrap();
    }

    #[test]
    fn the_events_put_through_are_counted_per_run() {
        let name = format!("et-count-{}", std::process::id());
        let config = EtConfig { name: Some(name.clone()), events: 16, event_size: 256, ..Default::default() };
        let mut et = EtComponent::new("et", config);
        et.configure().unwrap();
        let client = EtClient::connect(&name).unwrap();
        let producer = client.attach(crate::GRAND_CENTRAL).unwrap();
        let put = |n: usize| {
            let mut events = producer.new_events(n, 100, Wait::Sleep).unwrap();
            producer.put_events(&mut events).unwrap();
        };
        put(3); // before the run: not counted in it
        et.start(1).unwrap();
        put(5);
        assert_eq!(et.stats().events, 5);
        let summary = et.stop(None).unwrap();
        assert_eq!((summary.events, summary.bytes), (5, 0), "{summary:?}");
        assert!(summary.events_per_s > 0.0, "{summary:?}");
        let detail: EtDetail = summary.detail_as().unwrap();
        assert_eq!(detail.snapshot.unwrap().stations[0].events_out, 8);
        drop((producer, client));
        et.reset().unwrap();
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let table: toml::Table = toml::from_str("max_event_size = 1").unwrap();
        let e = daqflow_component::parse_config::<EtConfig>("et", table).expect_err("refused");
        assert!(e.to_string().contains("max_event_size"), "{e}");
    }
}
