//! `--metrics ADDR` of `daqflow et start`, `daqflow control-server` and `daqflow component`:
//! what each process exports to Prometheus, in the names of `docs/operator-guide.md`
//! ("Monitoring with Prometheus"). The listener and the text format are `daqflow_metrics`'s; the
//! components' families are the operator's own (`daqflow_api::component_metrics`), so that a
//! component scraped by itself and through the operator's web server reads the same.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use daqflow_api::{ComponentMetrics, State, Stats};
use daqflow_dialog::ServerView;
use daqflow_et::Snapshot;
use daqflow_metrics::{Exposition, Limits, MetricType, MetricsServer};

/// Serves `render` at `http://ADDR/metrics` until the returned server is dropped, and says so on
/// standard error. An address in use is an error that names it.
pub fn serve(
    addr: SocketAddr,
    what: &str,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> anyhow::Result<MetricsServer> {
    let server = MetricsServer::bind(addr, Limits::default(), render)?;
    tracing::info!("{what}: Prometheus metrics on http://{}/metrics", server.local_addr());
    Ok(server)
}

/// An ET system's figures: the pool, every station and every attachment, labelled `system`.
pub fn et(s: &Snapshot) -> String {
    let mut e = Exposition::new();
    let sys = [("system", s.name.as_str())];
    e.family("daqflow_et_events", "Events in the pool.", MetricType::Gauge).sample(&sys, s.events);
    e.family("daqflow_et_event_size_bytes", "The size of each event of the pool.", MetricType::Gauge)
        .sample(&sys, s.event_size);
    e.family("daqflow_et_free_events", "Events in GrandCentral (unused).", MetricType::Gauge)
        .sample(&sys, s.free_events);
    e.family(
        "daqflow_et_in_transit_events",
        "Events the ET process holds, moving between stations.",
        MetricType::Gauge,
    )
    .sample(&sys, s.in_transit);
    e.family("daqflow_et_temp_events", "Temporary buffers of large events in use.", MetricType::Gauge)
        .sample(&sys, s.temp_events);
    e.family("daqflow_et_temp_bytes", "Bytes those buffers may take.", MetricType::Gauge).sample(&sys, s.temp_bytes);
    e.family("daqflow_et_attachments", "Attachments, local and remote.", MetricType::Gauge)
        .sample(&sys, s.attachments.len());
    let mut per = |name: &'static str, help: &str, kind: MetricType, f: &dyn Fn(&daqflow_et::StationStatus) -> u64| {
        let mut family = e.family(name, help, kind);
        for st in &s.stations {
            family.sample(&[("system", s.name.as_str()), ("station", st.name.as_str())], f(st));
        }
    };
    per(
        "daqflow_et_station_queued",
        "Events in the station's input list (its queue depth).",
        MetricType::Gauge,
        &|st| u64::from(st.queued),
    );
    per(
        "daqflow_et_station_events_in_total",
        "Events that entered the station's input list.",
        MetricType::Counter,
        &|st| st.events_in,
    );
    per(
        "daqflow_et_station_events_out_total",
        "Events the station's attachments took out.",
        MetricType::Counter,
        &|st| st.events_out,
    );
    per("daqflow_et_station_attachments", "Attachments to the station.", MetricType::Gauge, &|st| {
        u64::from(st.attachments)
    });
    let ids: Vec<(String, String)> = s.attachments.iter().map(|a| (a.id.to_string(), a.pid.to_string())).collect();
    let mut per = |name: &'static str,
                   help: &str,
                   kind: MetricType,
                   f: &dyn Fn(&daqflow_et::AttachmentStatus) -> u64| {
        let mut family = e.family(name, help, kind);
        for (a, (id, pid)) in s.attachments.iter().zip(&ids) {
            let remote = if a.remote { "true" } else { "false" };
            family.sample(
                &[("system", &s.name), ("station", &a.station), ("attachment", id), ("pid", pid), ("remote", remote)],
                f(a),
            );
        }
    };
    per("daqflow_et_attachment_held_events", "Events the attachment holds now.", MetricType::Gauge, &|a| a.held);
    per(
        "daqflow_et_attachment_got_total",
        "Events the attachment got (new or from its station).",
        MetricType::Counter,
        &|a| a.got,
    );
    per("daqflow_et_attachment_put_total", "Events the attachment put.", MetricType::Counter, &|a| a.put);
    per("daqflow_et_attachment_dumped_total", "Events the attachment dumped.", MetricType::Counter, &|a| a.dumped);
    e.into_string()
}

/// A control server's directory: processes, services, subscriptions, commands, heartbeat ages
/// and the processes lost, labelled `server` (its address).
pub fn control_server(server: &str, view: &ServerView) -> String {
    let processes = view.processes();
    let services = view.services();
    let lost = view.lost();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut e = Exposition::new();
    let srv = [("server", server)];
    e.family("daqflow_dialog_processes", "Processes connected to the control server.", MetricType::Gauge)
        .sample(&srv, processes.len());
    e.family("daqflow_dialog_services", "Services provided.", MetricType::Gauge)
        .sample(&srv, services.iter().filter(|s| s.provider.is_some()).count());
    e.family("daqflow_dialog_services_waiting", "Services subscribed to that nobody provides.", MetricType::Gauge)
        .sample(&srv, services.iter().filter(|s| s.provider.is_none()).count());
    e.family("daqflow_dialog_subscriptions", "Subscriptions (a process subscribed to a service).", MetricType::Gauge)
        .sample(&srv, services.iter().map(|s| s.subscribers.len()).sum::<usize>());
    e.family("daqflow_dialog_commands", "Commands registered (a process registered a command).", MetricType::Gauge)
        .sample(&srv, processes.iter().map(|p| p.commands.len()).sum::<usize>());
    let mut lost_family = e.family(
        "daqflow_dialog_processes_lost_total",
        "Processes the control server lost, by why.",
        MetricType::Counter,
    );
    for (reason, n) in [
        ("heartbeat", lost.heartbeat),
        ("connection_closed", lost.connection_closed),
        ("disconnected", lost.disconnected),
    ] {
        lost_family.sample(&[("server", server), ("reason", reason)], n);
    }
    let mut age = e.family(
        "daqflow_dialog_heartbeat_age_seconds",
        "Seconds since the process's last heartbeat.",
        MetricType::Gauge,
    );
    for p in &processes {
        let seconds = now_ns.saturating_sub(p.last_heartbeat_ns) as f64 / 1e9;
        age.sample(&[("server", server), ("process", &p.name)], seconds);
    }
    e.into_string()
}

/// What a component process last showed of itself ([`observe`]).
#[derive(Debug, Clone)]
pub struct ComponentSeen {
    name: String,
    kind: String,
    state: State,
    run: Option<u32>,
    stats: Stats,
}

/// A component's figures, in the operator's names (`daqflow_api::component_metrics`).
pub fn component(seen: &ComponentSeen) -> String {
    let mut e = Exposition::new();
    daqflow_api::component_metrics(
        &mut e,
        &[ComponentMetrics {
            name: &seen.name,
            kind: &seen.kind,
            state: seen.state.name(),
            up: true,
            run: seen.run,
            stats: &seen.stats,
        }],
    );
    e.into_string()
}

/// The place where the run loop leaves what it shows, and the observer that fills it (what
/// `daqflow_component::process::run_observed` takes).
pub fn observe(name: &str, kind: &str) -> (Arc<Mutex<ComponentSeen>>, impl FnMut(&daqflow_component::Driver) + use<>) {
    let seen = Arc::new(Mutex::new(ComponentSeen {
        name: name.to_owned(),
        kind: kind.to_owned(),
        state: State::Initial,
        run: None,
        stats: Stats::default(),
    }));
    let fill = seen.clone();
    let observer = move |driver: &daqflow_component::Driver| {
        let (state, run, stats) = (driver.state(), driver.run(), driver.stats());
        let mut s = fill.lock().unwrap_or_else(|p| p.into_inner());
        s.state = state;
        s.run = run;
        s.stats = stats;
    };
    (seen, observer)
}
