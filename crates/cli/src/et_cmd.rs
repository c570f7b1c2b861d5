//! `daqflow et …`: an ET system and its test clients (like ET's example programs).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use daqflow_et::{
    Attachment, EtClient, EtError, EtSystem, GroupPolicy, Position, Priority, RemoteClient, RestoreMode, Selection,
    Snapshot, StationConfig, SystemConfig, Wait,
};

use crate::dialog_cmd::parse_duration;
use crate::format;

/// Arguments of `daqflow et`.
#[derive(clap::Args, Debug)]
pub struct EtArgs {
    #[command(subcommand)]
    pub command: EtCommand,
}

/// How a client reaches the system.
#[derive(clap::Args, Debug, Clone)]
pub struct Reach {
    /// The ET system's name.
    #[arg(long)]
    pub name: String,
    /// Attach over TCP to the system's remote server at this address instead of locally.
    #[arg(long, value_name = "HOST:PORT")]
    pub remote: Option<SocketAddr>,
    /// Attach over TCP, finding the system by name with UDP discovery on this port.
    #[arg(long, value_name = "PORT", conflicts_with = "remote")]
    pub discover: Option<u16>,
}

#[derive(clap::Subcommand, Debug)]
pub enum EtCommand {
    /// Run an ET system: the event pool in shared memory, GrandCentral and the stations.
    Start {
        /// The system's name (clients find it by this name).
        #[arg(long)]
        name: String,
        /// Number of events in the pool.
        #[arg(long, default_value_t = 3000)]
        events: u32,
        /// Size of each event in bytes (larger events get temporary buffers).
        #[arg(long, default_value_t = 65536)]
        event_size: usize,
        /// Serve remote clients on this TCP address.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Answer discovery queries for the name on this UDP port.
        #[arg(long, value_name = "PORT")]
        discovery_port: Option<u16>,
        /// Most temporary buffers for large events (larger than --event-size) at a time.
        #[arg(long, default_value_t = 64)]
        max_temp: u32,
        /// The largest event a producer may ask for (e.g. 64MiB, 1GiB, or bytes).
        #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
        max_event_bytes: u64,
        /// Most bytes the temporary buffers of large events may take, in all.
        #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
        max_temp_bytes: u64,
        /// Most large events one attachment may hold at a time.
        #[arg(long, default_value_t = 16)]
        max_temp_per_attachment: u32,
        /// Most attachments one client connection (local or remote) may have.
        #[arg(long, default_value_t = 32)]
        max_attachments_per_connection: u32,
        /// Also accept local processes of this user id (repeat, or separate with commas); the
        /// user running the system and root are always accepted.
        #[arg(long = "allow-uid", value_name = "UID", value_delimiter = ',')]
        allow_uid: Vec<u32>,
        /// An attachment silent for this long is declared dead (a local one is killed).
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        heartbeat_timeout: Duration,
        /// Serve Prometheus metrics at http://ADDR/metrics (the pool, every station's queue and
        /// counts, every attachment: docs/operator-guide.md, "Monitoring with Prometheus").
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
    },
    /// Produce events: fill and put batches from GrandCentral.
    Produce {
        #[command(flatten)]
        reach: Reach,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
        /// Event size in bytes.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Events per call.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Events per second at most.
        #[arg(long)]
        rate: Option<f64>,
        /// Control integers of every event, comma-separated (up to 4).
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        control: Vec<i32>,
        /// Give the events high priority.
        #[arg(long)]
        high: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Consume events from a station, and put them on (or hold them).
    Consume {
        #[command(flatten)]
        reach: Reach,
        /// The station to attach to.
        #[arg(long)]
        station: String,
        /// Create the station if it does not exist.
        #[arg(long, value_name = "blocking|nonblocking")]
        create: Option<String>,
        /// Selection of a created station: all, high, match:A,B,C,D (* for any), range:I:LO:HI,
        /// mask-any:I:MASK, mask-all:I:MASK.
        #[arg(long, default_value = "all")]
        select: String,
        /// Prescale of a created station.
        #[arg(long, default_value_t = 1)]
        prescale: u32,
        /// Cue of a created non-blocking station.
        #[arg(long, default_value_t = 100)]
        cue: u32,
        /// Restore mode of a created station: output, input, grand-central, redistribute.
        #[arg(long, default_value = "output")]
        restore: String,
        /// A created station keeps the events it selects while nobody is attached (instead of
        /// letting them flow past), for the next consumer.
        #[arg(long)]
        keep_when_idle: bool,
        /// Events per call.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
        /// Keep the events got (up to --count) without putting them back, until killed (for
        /// testing recovery).
        #[arg(long)]
        hold: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the stations, their queues and rates, and the attachments.
    Monitor {
        /// The ET system's name.
        name: String,
        /// Reach it over TCP at this address.
        #[arg(long, value_name = "HOST:PORT")]
        remote: Option<SocketAddr>,
        /// Print one snapshot and exit.
        #[arg(long)]
        once: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Refresh interval.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
    },
    /// Create or remove a station: at a place in the chain, or in a parallel group with another.
    Station {
        #[command(subcommand)]
        command: StationCommand,
    },
    /// Move events from a station of one ET system into another ET system.
    Bridge {
        /// The source system (local).
        #[arg(long)]
        from: String,
        /// The source station (created, blocking, at the end of the chain if missing).
        #[arg(long)]
        station: String,
        /// The destination system, local by name…
        #[arg(long, required_unless_present = "to_remote")]
        to: Option<String>,
        /// …or remote at this address.
        #[arg(long, value_name = "HOST:PORT")]
        to_remote: Option<SocketAddr>,
        /// Events per batch.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
}

/// `daqflow et station …`.
#[derive(clap::Subcommand, Debug)]
pub enum StationCommand {
    /// Create a station (at the end of the chain unless told otherwise).
    Add {
        #[command(flatten)]
        reach: Reach,
        /// The new station's name.
        station: String,
        /// Non-blocking: it takes events only while fewer than --cue wait in it.
        #[arg(long)]
        nonblocking: bool,
        /// Cue of a non-blocking station.
        #[arg(long, default_value_t = 100)]
        cue: u32,
        /// Selection: all, high, match:A,B,C,D (* for any), range:I:LO:HI, mask-any:I:MASK,
        /// mask-all:I:MASK.
        #[arg(long, default_value = "all")]
        select: String,
        /// Take one selected event in this many.
        #[arg(long, default_value_t = 1)]
        prescale: u32,
        /// Where the events of an attachment that ends go: output, input, grand-central,
        /// redistribute (default: redistribute in a parallel group, else output).
        #[arg(long)]
        restore: Option<String>,
        /// Keep the events it selects while nobody is attached, for the next consumer.
        #[arg(long)]
        keep_when_idle: bool,
        /// Refuse a second attachment.
        #[arg(long)]
        single_user: bool,
        /// Right after GrandCentral.
        #[arg(long, conflicts_with_all = ["after", "parallel_with"])]
        first: bool,
        /// Right after this station (after its whole group).
        #[arg(long, value_name = "STATION", conflicts_with = "parallel_with")]
        after: Option<String>,
        /// In a parallel group with this station (a new group if it was alone): each event goes to
        /// one member.
        #[arg(long, value_name = "STATION")]
        parallel_with: Option<String>,
        /// How the group picks the member of each event: round-robin or shortest-queue; set on
        /// every member (default: the group's, round-robin for a new group).
        #[arg(long, requires = "parallel_with")]
        policy: Option<String>,
    },
    /// Remove a station (refused while it has attachments).
    Remove {
        #[command(flatten)]
        reach: Reach,
        /// The station's name.
        station: String,
    },
}

pub const AFTER_HELP: &str = "\
Examples:
  daqflow et start --name daq --events 3000 --event-size 65536 --listen 127.0.0.1:11111
  daqflow et start --name daq --metrics 127.0.0.1:9101   (Prometheus: http://127.0.0.1:9101/metrics)
  daqflow et start --name daq --max-event-bytes 256MiB --max-temp-bytes 2GiB --allow-uid 1001,1002
  daqflow et consume --name daq --station mon --create nonblocking --cue 50 --select match:1,*,*,*
  daqflow et produce --name daq --size 4096 --batch 100 --count 1000000 --control 1
  daqflow et monitor daq
  daqflow et station add --name daq ana-1 --keep-when-idle
  daqflow et station add --name daq ana-2 --parallel-with ana-1 --policy shortest-queue --keep-when-idle
  daqflow et consume --name daq --remote 10.0.0.5:11111 --station mon --count 1000
  daqflow et bridge --from daq --station export --to-remote monitor-host:11111";

enum Conn {
    Local(EtClient),
    Remote(RemoteClient),
}

impl Conn {
    fn open(r: &Reach) -> anyhow::Result<Conn> {
        if let Some(addr) = r.remote {
            return Ok(Conn::Remote(RemoteClient::connect(addr)?));
        }
        if let Some(port) = r.discover {
            return Ok(Conn::Remote(RemoteClient::discover(&r.name, port, Duration::from_secs(3))?));
        }
        Ok(Conn::Local(EtClient::connect(&r.name)?))
    }

    fn attach(&self, station: &str) -> Result<Box<dyn Attachment>, EtError> {
        Ok(match self {
            Conn::Local(c) => Box::new(c.attach(station)?),
            Conn::Remote(c) => Box::new(c.attach(station)?),
        })
    }

    fn create_station(&self, name: &str, config: StationConfig) -> Result<(), EtError> {
        self.create_station_at(name, config, Position::End)
    }

    fn create_station_at(&self, name: &str, config: StationConfig, position: Position) -> Result<(), EtError> {
        match self {
            Conn::Local(c) => c.create_station(name, config, position),
            Conn::Remote(c) => c.create_station(name, config, position),
        }
    }

    fn configure_station(&self, name: &str, config: StationConfig) -> Result<(), EtError> {
        match self {
            Conn::Local(c) => c.configure_station(name, config),
            Conn::Remote(c) => c.configure_station(name, config),
        }
    }

    fn remove_station(&self, name: &str) -> Result<(), EtError> {
        match self {
            Conn::Local(c) => c.remove_station(name),
            Conn::Remote(c) => c.remove_station(name),
        }
    }

    fn snapshot(&self) -> Result<Snapshot, EtError> {
        match self {
            Conn::Local(c) => c.snapshot(),
            Conn::Remote(c) => c.snapshot(),
        }
    }
}

/// A number of bytes: `65536`, or with a binary unit: `64KiB`, `64MiB`, `1GiB` (also `K`, `M`,
/// `G`, `KB`, `MB`, `GB`, all powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?}: expected a number of bytes, e.g. 65536 or 64MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("{s:?}: unknown unit {other:?} (B, KiB, MiB or GiB)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?}: too large"))
}

fn out_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(rt) = rt {
            rt.block_on(async {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
                }
            });
            s.store(true, Ordering::Release);
        }
    });
    stop
}

pub fn run(args: &EtArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        EtCommand::Start {
            name,
            events,
            event_size,
            listen,
            discovery_port,
            max_temp,
            max_event_bytes,
            max_temp_bytes,
            max_temp_per_attachment,
            max_attachments_per_connection,
            allow_uid,
            heartbeat_timeout,
            metrics,
        } => {
            let mut config = SystemConfig::new(name, *events, *event_size);
            config.listen = *listen;
            config.discovery_port = *discovery_port;
            config.max_temp_events = *max_temp;
            config.max_event_bytes = usize::try_from(*max_event_bytes).unwrap_or(usize::MAX);
            config.max_temp_bytes = *max_temp_bytes;
            config.max_temp_per_attachment = *max_temp_per_attachment;
            config.max_attachments_per_connection = *max_attachments_per_connection;
            config.allowed_uids = allow_uid.clone();
            config.heartbeat_timeout = *heartbeat_timeout;
            let stop = stop_flag();
            let system = Arc::new(EtSystem::create(config)?);
            let _metrics = match metrics {
                Some(addr) => {
                    let s = system.clone();
                    Some(crate::metrics::serve(*addr, &format!("ET system {name}"), move || {
                        crate::metrics::et(&s.snapshot())
                    })?)
                }
                None => None,
            };
            match system.remote_addr() {
                Some(a) => out_line(&format!("ready {name} remote {a}")),
                None => out_line(&format!("ready {name}")),
            }
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(system);
            Ok(ExitCode::SUCCESS)
        }
        EtCommand::Produce { reach, count, seconds, size, batch, rate, control, high, json } => {
            let conn = Conn::open(reach)?;
            let att = conn.attach(daqflow_et::GRAND_CENTRAL)?;
            let mut ctl = [0i32; 4];
            for (i, c) in control.iter().take(4).enumerate() {
                ctl[i] = *c;
            }
            let stop = stop_flag();
            let start = Instant::now();
            let deadline = seconds.map(|s| start + Duration::from_secs_f64(s));
            let mut produced = 0u64;
            let mut events = Vec::with_capacity(*batch);
            let fill: Vec<u8> = (0..*size).map(|i| i as u8).collect();
            while !stop.load(Ordering::Acquire)
                && count.is_none_or(|c| produced < c)
                && deadline.is_none_or(|d| Instant::now() < d)
            {
                let n = count.map_or(*batch, |c| (*batch as u64).min(c - produced) as usize);
                // Short waits, so that Ctrl-C is seen while the system has no free event.
                match att.new_events_into(n, *size, Wait::Timed(Duration::from_millis(200)), &mut events) {
                    Ok(_) => {}
                    Err(daqflow_et::EtError::Timeout) => continue,
                    Err(e) => return Err(e.into()),
                }
                for e in events.iter_mut() {
                    e.write(&fill)?;
                    e.set_control(ctl);
                    if *high {
                        e.set_priority(Priority::High);
                    }
                }
                produced += events.len() as u64;
                att.put_events(&mut events)?;
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64(produced as f64 / r);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
            }
            summary("produced", produced, produced * *size as u64, 0, start.elapsed(), *json);
            Ok(ExitCode::SUCCESS)
        }
        EtCommand::Consume {
            reach,
            station,
            create,
            select,
            prescale,
            cue,
            restore,
            keep_when_idle,
            batch,
            count,
            seconds,
            hold,
            json,
        } => {
            let conn = Conn::open(reach)?;
            if let Some(kind) = create {
                let blocking = match kind.as_str() {
                    "blocking" => true,
                    "nonblocking" | "non-blocking" => false,
                    other => anyhow::bail!("--create takes blocking or nonblocking, not {other:?}"),
                };
                let restore = parse_restore(restore)?;
                let config = StationConfig {
                    blocking,
                    cue: *cue,
                    prescale: *prescale,
                    selection: Selection::parse(select).map_err(anyhow::Error::msg)?,
                    restore,
                    keep_when_idle: *keep_when_idle,
                    ..StationConfig::default()
                };
                match conn.create_station(station, config) {
                    Ok(()) | Err(EtError::StationExists(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let att = conn.attach(station)?;
            let stop = stop_flag();
            let start = Instant::now();
            let deadline = seconds.map(|s| start + Duration::from_secs_f64(s));
            let mut consumed = 0u64;
            let mut bytes = 0u64;
            let mut corrupt = 0u64;
            let mut events = Vec::with_capacity(*batch);
            let mut held = Vec::new();
            out_line(&format!("attached to {station}"));
            while !stop.load(Ordering::Acquire)
                && count.is_none_or(|c| consumed < c)
                && deadline.is_none_or(|d| Instant::now() < d)
            {
                let n = count.map_or(*batch, |c| (*batch as u64).min(c - consumed) as usize);
                match att.get_events_into(n, Wait::Timed(Duration::from_millis(200)), &mut events) {
                    Ok(_) | Err(EtError::Timeout) => {}
                    Err(e) => return Err(e.into()),
                }
                consumed += events.len() as u64;
                for e in &events {
                    bytes += e.len() as u64;
                    corrupt += u64::from(e.is_possibly_corrupt());
                }
                if *hold {
                    held.append(&mut events);
                } else {
                    att.put_events(&mut events)?;
                }
            }
            if *hold {
                out_line(&format!("holding {} events", held.len()));
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                att.put_events(&mut held)?;
            }
            summary("consumed", consumed, bytes, corrupt, start.elapsed(), *json);
            Ok(ExitCode::SUCCESS)
        }
        EtCommand::Monitor { name, remote, once, json, interval } => {
            let conn = match remote {
                Some(a) => Conn::Remote(RemoteClient::connect(*a)?),
                None => Conn::Local(EtClient::connect(name)?),
            };
            let mut last: Option<(Snapshot, Instant)> = None;
            loop {
                let snap = conn.snapshot()?;
                if *json {
                    out_line(&serde_json::to_string(&snap)?);
                } else {
                    if !once {
                        print!("\x1b[2J\x1b[H");
                    }
                    print_snapshot(&snap, last.as_ref());
                }
                if *once {
                    return Ok(ExitCode::SUCCESS);
                }
                last = Some((snap, Instant::now()));
                std::thread::sleep(*interval);
            }
        }
        EtCommand::Station { command } => station_command(command),
        EtCommand::Bridge { from, station, to, to_remote, batch, count } => {
            let src_client = EtClient::connect(from)?;
            // The bridge's station is an ordinary blocking one at the end of the chain, made if
            // missing (everything reaching it is moved).
            match src_client.create_station(station, StationConfig::default(), Position::End) {
                Ok(()) | Err(EtError::StationExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            let src = src_client.attach(station)?;
            let stop = stop_flag();
            let stats = match (to, to_remote) {
                (_, Some(addr)) => {
                    let dst_client = RemoteClient::connect(*addr)?;
                    let dst = dst_client.attach(daqflow_et::GRAND_CENTRAL)?;
                    daqflow_et::bridge(&src, &dst, *batch, *count, &stop)?
                }
                (Some(name), None) => {
                    let dst_client = EtClient::connect(name).with_context(|| format!("destination {name}"))?;
                    let dst = dst_client.attach(daqflow_et::GRAND_CENTRAL)?;
                    daqflow_et::bridge(&src, &dst, *batch, *count, &stop)?
                }
                (None, None) => anyhow::bail!("give --to NAME or --to-remote ADDR"),
            };
            out_line(&format!("bridged {} events, {}", stats.events, format::bytes(stats.bytes as f64)));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A restore mode as the command line writes it.
fn parse_restore(s: &str) -> anyhow::Result<RestoreMode> {
    Ok(match s {
        "output" => RestoreMode::Output,
        "input" => RestoreMode::Input,
        "grand-central" | "gc" => RestoreMode::GrandCentral,
        "redistribute" => RestoreMode::Redistribute,
        other => anyhow::bail!("--restore takes output, input, grand-central or redistribute, not {other:?}"),
    })
}

/// A group policy as the command line writes it.
fn parse_policy(s: &str) -> anyhow::Result<GroupPolicy> {
    Ok(match s {
        "round-robin" | "round_robin" => GroupPolicy::RoundRobin,
        "shortest-queue" | "shortest_queue" => GroupPolicy::ShortestQueue,
        other => anyhow::bail!("--policy takes round-robin or shortest-queue, not {other:?}"),
    })
}

fn policy_text(p: GroupPolicy) -> &'static str {
    match p {
        GroupPolicy::RoundRobin => "round-robin",
        GroupPolicy::ShortestQueue => "shortest-queue",
    }
}

/// `daqflow et station add|remove`.
fn station_command(command: &StationCommand) -> anyhow::Result<ExitCode> {
    match command {
        StationCommand::Remove { reach, station } => {
            Conn::open(reach)?.remove_station(station)?;
            out_line(&format!("removed station {station}"));
            Ok(ExitCode::SUCCESS)
        }
        StationCommand::Add {
            reach,
            station,
            nonblocking,
            cue,
            select,
            prescale,
            restore,
            keep_when_idle,
            single_user,
            first,
            after,
            parallel_with,
            policy,
        } => {
            let conn = Conn::open(reach)?;
            let position = match (first, after, parallel_with) {
                (true, _, _) => Position::First,
                (_, Some(a), _) => Position::After(a.clone()),
                (_, _, Some(p)) => Position::ParallelWith(p.clone()),
                _ => Position::End,
            };
            let default_restore = if parallel_with.is_some() { RestoreMode::Redistribute } else { RestoreMode::Output };
            let restore = restore.as_deref().map(parse_restore).transpose()?.unwrap_or(default_restore);
            let policy = policy.as_deref().map(parse_policy).transpose()?;
            // A new member takes the group's policy unless told another, which then becomes
            // every member's (the group follows its first member's).
            let before = conn.snapshot()?;
            let group_policy = match (policy, parallel_with) {
                (Some(p), _) => p,
                (None, Some(other)) => before
                    .stations
                    .iter()
                    .find(|s| &s.name == other)
                    .filter(|s| s.group.is_some())
                    .map_or(GroupPolicy::RoundRobin, |s| s.config.group_policy),
                (None, None) => GroupPolicy::RoundRobin,
            };
            let config = StationConfig {
                blocking: !nonblocking,
                cue: *cue,
                prescale: *prescale,
                selection: Selection::parse(select).map_err(anyhow::Error::msg)?,
                single_user: *single_user,
                restore,
                keep_when_idle: *keep_when_idle,
                group_policy,
            };
            conn.create_station_at(station, config, position)?;
            let snap = conn.snapshot()?;
            let group = snap.stations.iter().find(|s| &s.name == station).and_then(|s| s.group);
            let Some(g) = group else {
                out_line(&format!("created station {station}"));
                return Ok(ExitCode::SUCCESS);
            };
            let members: Vec<&daqflow_et::StationStatus> =
                snap.stations.iter().filter(|s| s.group == Some(g)).collect();
            for m in &members {
                // A closure station's selection lives in the ET process: a client cannot give it
                // back, so its settings are left as they are.
                if m.config.group_policy != group_policy && !m.closure {
                    let config = StationConfig { group_policy, ..m.config.clone() };
                    conn.configure_station(&m.name, config)?;
                }
            }
            let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
            out_line(&format!(
                "created station {station} in parallel group g{g} ({}; {})",
                names.join(", "),
                policy_text(group_policy)
            ));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn summary(what: &str, events: u64, bytes: u64, corrupt: u64, elapsed: Duration, json: bool) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    if json {
        out_line(
            &serde_json::json!({
                what: events, "bytes": bytes, "possibly_corrupt": corrupt, "seconds": secs,
                "events_per_s": events as f64 / secs, "mb_per_s": bytes as f64 / secs / 1e6
            })
            .to_string(),
        );
    } else {
        out_line(&format!(
            "{what} {events} events ({} events/s, {:.1} MB/s){}",
            format::si(events as f64 / secs),
            bytes as f64 / secs / 1e6,
            if corrupt > 0 { format!(", {corrupt} possibly corrupt") } else { String::new() }
        ));
    }
}

fn print_snapshot(s: &Snapshot, last: Option<&(Snapshot, Instant)>) {
    let dt = last.map(|(_, t)| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    let rate = |name: &str, now: u64, f: fn(&daqflow_et::StationStatus) -> u64| -> String {
        match last.and_then(|(l, _)| l.stations.iter().find(|x| x.name == name)) {
            Some(prev) if dt > 0.0 => format!("{}/s", format::si(now.saturating_sub(f(prev)) as f64 / dt)),
            _ => "-".into(),
        }
    };
    out_line(&format!(
        "ET system {} (pid {}): {} events of {}, {} free, {} large in use{}",
        s.name,
        s.pid,
        s.events,
        format::bytes(s.event_size as f64),
        s.free_events,
        s.temp_events,
        s.remote.as_ref().map(|r| format!(", remote {r}")).unwrap_or_default()
    ));
    out_line("");
    out_line(&format!(
        "{:<3} {:<20} {:<12} {:>6} {:>9} {:<16} {:>8} {:>12} {:>12} {:>11} {:>4}",
        "#", "STATION", "MODE", "CUE", "PRESCALE", "SELECT", "QUEUED", "IN", "OUT", "OUT RATE", "ATT"
    ));
    for (i, st) in s.stations.iter().enumerate() {
        let mode = if i == 0 {
            "-".to_string()
        } else {
            format!(
                "{}{}",
                if st.config.blocking { "blocking" } else { "nonblock" },
                st.group.map(|g| format!(" g{g}")).unwrap_or_default()
            )
        };
        let select = if st.closure { "closure".to_string() } else { st.config.selection.to_string() };
        out_line(&format!(
            "{:<3} {:<20} {:<12} {:>6} {:>9} {:<16} {:>8} {:>12} {:>12} {:>11} {:>4}",
            i,
            st.name,
            mode,
            if st.config.blocking { "-".into() } else { st.config.cue.to_string() },
            st.config.prescale,
            select.chars().take(16).collect::<String>(),
            st.queued,
            st.events_in,
            st.events_out,
            rate(&st.name, st.events_out, |x| x.events_out),
            st.attachments
        ));
    }
    out_line("");
    out_line(&format!(
        "{:<4} {:<20} {:>8} {:<7} {:>8} {:>12} {:>12}",
        "ID", "STATION", "PID", "WHERE", "HELD", "GOT", "PUT"
    ));
    for a in &s.attachments {
        out_line(&format!(
            "{:<4} {:<20} {:>8} {:<7} {:>8} {:>12} {:>12}",
            a.id,
            a.station,
            a.pid,
            if a.remote { "remote" } else { "local" },
            a.held,
            a.got,
            a.put
        ));
    }
    out_line(&format!("\nevents accounted for: {} of {}", s.accounted(), s.events));
}

impl EtArgs {
    /// Whether this runs a long-lived server (which logs at info level).
    pub fn is_server(&self) -> bool {
        matches!(self.command, EtCommand::Start { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1gib"), Ok(1 << 30));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("64XB").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999999999GiB").is_err());
    }
}
