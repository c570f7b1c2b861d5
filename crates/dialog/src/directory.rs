//! The control server's directory: processes, services, commands and requests, as a pure state
//! machine. It is fed the messages of each connection, connection closures and clock ticks,
//! and answers with what to send and which connections to close; the I/O layer
//! ([`ControlServer`](crate::ControlServer)) does the sending. Deterministic and tested without
//! sockets.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;

use crate::protocol::{
    LostReason, Message, PROTOCOL_VERSION, RefuseReason, ServiceLocation, reserved_name, valid_name,
};

/// A connection, numbered by the I/O layer.
pub type ConnId = u64;

/// The services the control server provides itself.
pub const DIRECTORY_SERVICES: [&str; 3] = ["dialog/processes", "dialog/services", "dialog/commands"];

/// A point in time, monotonic and wall-clock.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic time, for timeouts.
    pub mono: Instant,
    /// Wall-clock time in ns since the Unix epoch, for the directory.
    pub wall_ns: u64,
}

impl Now {
    /// The current time.
    pub fn current() -> Now {
        Now { mono: Instant::now(), wall_ns: wall_ns() }
    }

    /// This time plus `d`.
    pub fn after(self, d: Duration) -> Now {
        Now { mono: self.mono + d, wall_ns: self.wall_ns + d.as_nanos() as u64 }
    }
}

pub(crate) fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Settings of the directory.
#[derive(Debug, Clone)]
pub struct DirectoryConfig {
    /// How often processes send heartbeats (told to them in the handshake).
    pub heartbeat_interval: Duration,
    /// A process silent for this long is declared lost.
    pub lost_after: Duration,
    /// A connection that has not completed its handshake after this long is closed.
    pub handshake_timeout: Duration,
    /// Identifies this control server in handshakes and logs (`host:port`).
    pub server_name: String,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            heartbeat_interval: Duration::from_secs(1),
            lost_after: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(10),
            server_name: "control-server".into(),
        }
    }
}

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a message on a connection.
    Send {
        /// The connection.
        conn: ConnId,
        /// The message.
        msg: Message,
    },
    /// Close a connection (after sending what was queued for it).
    Close {
        /// The connection.
        conn: ConnId,
        /// Why, for the log.
        reason: String,
    },
    /// The server found that it did not run for `gap` (its ticks that far apart): nobody was
    /// declared lost for it, and every process got a new grace period.
    Stalled {
        /// How long it did not run.
        gap: Duration,
    },
}

#[derive(Debug)]
struct Process {
    conn: ConnId,
    host: String,
    port: u16,
    pid: u32,
    start_time_ns: u64,
    connected_ns: u64,
    last_heartbeat: Instant,
    last_heartbeat_ns: u64,
    provides: BTreeSet<String>,
    commands: BTreeSet<String>,
    /// Subscription id → service name.
    requests: BTreeMap<u32, String>,
}

#[derive(Debug)]
enum Conn {
    Pending { since: Instant, peer: String },
    Connected { name: String },
}

/// One process as the directory services publish it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process name.
    pub name: String,
    /// Host of its listening socket.
    pub host: String,
    /// Port of its listening socket.
    pub port: u16,
    /// Operating-system process id.
    pub pid: u32,
    /// When the process started (ns since the Unix epoch).
    pub start_time_ns: u64,
    /// When it connected to this control server.
    pub connected_ns: u64,
    /// Its last heartbeat.
    pub last_heartbeat_ns: u64,
    /// Services it provides.
    pub provides: Vec<String>,
    /// Services it subscribes to.
    pub subscribes: Vec<String>,
    /// Commands it accepts.
    pub commands: Vec<String>,
}

/// One service as `dialog/services` publishes it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Service name.
    pub name: String,
    /// Its provider, or `None` while it is only requested.
    pub provider: Option<String>,
    /// The provider's listening address.
    pub address: Option<String>,
    /// Processes subscribed (or waiting) for it.
    pub subscribers: Vec<String>,
}

/// One command as `dialog/commands` publishes it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CommandInfo {
    /// Command name.
    pub name: String,
    /// Processes that accept it.
    pub registrants: Vec<String>,
}

/// The message of a `CONNECT_REFUSED` for protocol version `version`.
fn version_refusal(version: u16) -> String {
    format!("protocol version {version} is not supported (this server speaks {PROTOCOL_VERSION})")
}

/// The directory. See the [module docs](self).
#[derive(Debug)]
pub struct Directory {
    config: DirectoryConfig,
    conns: HashMap<ConnId, Conn>,
    processes: BTreeMap<String, Process>,
    /// Service → provider.
    services: BTreeMap<String, String>,
    /// Subscriptions to the directory services: (process, subscription id, service).
    directory_subs: Vec<(String, u32, &'static str)>,
    dirty: bool,
    published: [Option<Bytes>; 3],
    /// When [`Directory::tick`] last ran: a longer gap than [`Directory::stall_after`] means
    /// the server itself did not run.
    last_tick: Option<Instant>,
    /// Processes lost so far ([`Directory::lost`]).
    lost: LostCounts,
}

/// How many processes the directory lost since it started, by why (the control server's
/// `--metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LostCounts {
    /// Declared lost for want of a heartbeat ([`LostReason::Heartbeat`]).
    pub heartbeat: u64,
    /// Their connection closed without a goodbye ([`LostReason::ConnectionClosed`]).
    pub connection_closed: u64,
    /// They said goodbye ([`LostReason::Disconnected`]).
    pub disconnected: u64,
}

impl Directory {
    /// An empty directory.
    pub fn new(config: DirectoryConfig) -> Self {
        Directory {
            config,
            conns: HashMap::new(),
            processes: BTreeMap::new(),
            services: BTreeMap::new(),
            directory_subs: Vec::new(),
            dirty: false,
            published: [None, None, None],
            last_tick: None,
            lost: LostCounts::default(),
        }
    }

    /// A gap between two ticks longer than this (the heartbeat interval) means that the
    /// server itself did not run (a stopped process, an overloaded host): it read no heartbeat
    /// meanwhile, so its silence is its own, not its processes'.
    pub fn stall_after(&self) -> Duration {
        self.config.heartbeat_interval
    }

    /// After a stall of the server's own (`gap` without a tick): every process and every
    /// handshake gets a new grace period, so that nobody is declared lost until a full
    /// `lost_after` has passed with the server running. Tells the I/O layer
    /// ([`Output::Stalled`]).
    fn forgive(&mut self, gap: Duration, now: Now, out: &mut Vec<Output>) {
        out.push(Output::Stalled { gap });
        tracing::warn!(
            "the control server did not run for {:.1} s (a stopped process or an overloaded host): its {} \
             process(es) get a new {:?} to be heard from before any is declared lost",
            gap.as_secs_f64(),
            self.processes.len(),
            self.config.lost_after
        );
        for p in self.processes.values_mut() {
            p.last_heartbeat = p.last_heartbeat.max(now.mono);
        }
        for c in self.conns.values_mut() {
            if let Conn::Pending { since, .. } = c {
                *since = (*since).max(now.mono);
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    /// A connection was accepted from `peer`.
    pub fn on_accept(&mut self, conn: ConnId, peer: String, now: Now) {
        self.conns.insert(conn, Conn::Pending { since: now.mono, peer });
    }

    /// A connection closed (or failed).
    pub fn on_closed(&mut self, conn: ConnId, now: Now) -> Vec<Output> {
        let mut out = Vec::new();
        if let Some(Conn::Connected { name }) = self.conns.remove(&conn) {
            self.lose(&name, LostReason::ConnectionClosed, now, &mut out);
        }
        out
    }

    /// A message arrived on a connection.
    pub fn on_message(&mut self, conn: ConnId, msg: Message, now: Now) -> Vec<Output> {
        let mut out = Vec::new();
        match self.conns.get(&conn) {
            None => {}
            Some(Conn::Pending { peer, .. }) => {
                let peer = peer.clone();
                self.handshake(conn, peer, msg, now, &mut out);
            }
            Some(Conn::Connected { name }) => {
                let name = name.clone();
                self.connected_message(conn, &name, msg, now, &mut out);
            }
        }
        out
    }

    /// A `CONNECT_TO_CONTROL_SERVER` of protocol version `version` (not this server's) that
    /// did not decode as this version's layout ([`crate::protocol::other_version`]): refused
    /// with reason 3 (version) and closed, as one that decodes is. On a connection that
    /// completed its handshake it is a malformed message: closed.
    pub fn on_other_version(&mut self, conn: ConnId, version: u16) -> Vec<Output> {
        let mut out = Vec::new();
        match self.conns.get(&conn) {
            Some(Conn::Pending { peer, .. }) => {
                tracing::warn!(%peer, version, "refused a process of another protocol version");
                self.conns.remove(&conn);
                let message = version_refusal(version);
                out.push(Output::Send {
                    conn,
                    msg: Message::ConnectRefused { reason: RefuseReason::Version, message: message.clone() },
                });
                out.push(Output::Close { conn, reason: message });
            }
            Some(Conn::Connected { name }) => {
                out.push(Output::Close { conn, reason: format!("{name}: a second CONNECT_TO_CONTROL_SERVER") });
            }
            None => {}
        }
        out
    }

    /// Clock tick: declares silent processes lost, closes stale handshakes, publishes the
    /// directory services if anything changed. A tick that comes more than
    /// [`Directory::stall_after`] after the last one finds the server itself stalled: it
    /// declares nobody lost, and every process gets a full `lost_after` from now.
    pub fn tick(&mut self, now: Now) -> Vec<Output> {
        let mut out = Vec::new();
        if let Some(last) = self.last_tick.replace(now.mono) {
            let gap = now.mono.saturating_duration_since(last);
            if gap > self.stall_after() {
                self.forgive(gap, now, &mut out);
            }
        }
        let silent: Vec<String> = self
            .processes
            .iter()
            .filter(|(_, p)| now.mono.saturating_duration_since(p.last_heartbeat) > self.config.lost_after)
            .map(|(n, _)| n.clone())
            .collect();
        for name in silent {
            if let Some(p) = self.processes.get(&name) {
                let conn = p.conn;
                tracing::warn!(process = %name, "no heartbeat for {:?}: declaring the process lost", self.config.lost_after);
                out.push(Output::Send {
                    conn,
                    msg: Message::ConnectionLost { message: "no heartbeat in time: declared lost".into() },
                });
                out.push(Output::Close { conn, reason: format!("{name}: no heartbeat") });
                self.conns.remove(&conn);
                self.lose(&name, LostReason::Heartbeat, now, &mut out);
            }
        }
        let stale: Vec<ConnId> = self
            .conns
            .iter()
            .filter_map(|(&c, s)| match s {
                Conn::Pending { since, .. }
                    if now.mono.saturating_duration_since(*since) > self.config.handshake_timeout =>
                {
                    Some(c)
                }
                _ => None,
            })
            .collect();
        for conn in stale {
            self.conns.remove(&conn);
            out.push(Output::Close { conn, reason: "no handshake in time".into() });
        }
        if self.dirty {
            self.dirty = false;
            self.publish(&mut out);
        }
        out
    }

    fn handshake(&mut self, conn: ConnId, peer: String, msg: Message, now: Now, out: &mut Vec<Output>) {
        let Message::ConnectToControlServer { version, name, pid, host, port, start_time_ns } = msg else {
            // Paper, fig. 3: messages from processes that are not connected are ignored, and the
            // sender is told it is not connected.
            tracing::debug!(%peer, kind = msg.kind(), "message before the handshake ignored");
            out.push(Output::Send {
                conn,
                msg: Message::NotConnected {
                    message: "not connected: send CONNECT_TO_CONTROL_SERVER first; the message was ignored".into(),
                },
            });
            return;
        };
        let refuse = |reason: RefuseReason, message: String, out: &mut Vec<Output>| {
            out.push(Output::Send { conn, msg: Message::ConnectRefused { reason, message: message.clone() } });
            out.push(Output::Close { conn, reason: message });
        };
        if version != PROTOCOL_VERSION {
            self.conns.remove(&conn);
            return refuse(RefuseReason::Version, version_refusal(version), out);
        }
        if !valid_name(&name) {
            self.conns.remove(&conn);
            return refuse(RefuseReason::BadName, format!("{name:?} is not a valid process name"), out);
        }
        if let Some(existing) = self.processes.get(&name) {
            self.conns.remove(&conn);
            let message = format!(
                "a process named {name} is connected already (pid {} at {}:{})",
                existing.pid, existing.host, existing.port
            );
            tracing::warn!(%peer, "handshake refused: {message}");
            return refuse(RefuseReason::NameTaken, message, out);
        }
        tracing::info!(process = %name, %host, port, pid, "process connected");
        self.processes.insert(
            name.clone(),
            Process {
                conn,
                host,
                port,
                pid,
                start_time_ns,
                connected_ns: now.wall_ns,
                last_heartbeat: now.mono,
                last_heartbeat_ns: now.wall_ns,
                provides: BTreeSet::new(),
                commands: BTreeSet::new(),
                requests: BTreeMap::new(),
            },
        );
        self.conns.insert(conn, Conn::Connected { name });
        out.push(Output::Send {
            conn,
            msg: Message::SuccessfullyConnected {
                server: self.config.server_name.clone(),
                heartbeat_interval_ms: self.config.heartbeat_interval.as_millis() as u32,
                lost_after_ms: self.config.lost_after.as_millis() as u32,
            },
        });
        self.dirty = true;
    }

    fn connected_message(&mut self, conn: ConnId, name: &str, msg: Message, now: Now, out: &mut Vec<Output>) {
        let send = |out: &mut Vec<Output>, msg| out.push(Output::Send { conn, msg });
        if let Some(p) = self.processes.get_mut(name) {
            // Any message proves the process alive.
            p.last_heartbeat = now.mono;
            p.last_heartbeat_ns = now.wall_ns;
        }
        match msg {
            Message::Heartbeat { seq } => send(out, Message::HeartbeatAck { seq }),
            Message::RegisterService { request, name: service } => {
                if !valid_name(&service) || reserved_name(&service) {
                    let owner = if valid_name(&service) { "control server" } else { "(invalid name)" };
                    return send(
                        out,
                        Message::ServiceRefused { request, owner: owner.into(), owner_addr: String::new() },
                    );
                }
                match self.services.get(&service) {
                    Some(owner) if owner != name => {
                        let addr =
                            self.processes.get(owner).map(|p| format!("{}:{}", p.host, p.port)).unwrap_or_default();
                        tracing::warn!(process = %name, %service, %owner, "service registration refused: provided already");
                        send(out, Message::ServiceRefused { request, owner: owner.clone(), owner_addr: addr });
                    }
                    Some(_) => send(out, Message::ServiceRegistered { request }),
                    None => {
                        self.services.insert(service.clone(), name.to_owned());
                        if let Some(p) = self.processes.get_mut(name) {
                            p.provides.insert(service.clone());
                        }
                        send(out, Message::ServiceRegistered { request });
                        let location = self.location_of(name);
                        for (subscriber, sub) in self.requesters(&service) {
                            if let Some(p) = self.processes.get(&subscriber) {
                                out.push(Output::Send {
                                    conn: p.conn,
                                    msg: Message::InfoService {
                                        sub,
                                        name: service.clone(),
                                        location: location.clone(),
                                    },
                                });
                            }
                        }
                        self.dirty = true;
                    }
                }
            }
            Message::UnregisterService { name: service } => {
                if self.services.get(&service).map(String::as_str) == Some(name) {
                    self.services.remove(&service);
                    if let Some(p) = self.processes.get_mut(name) {
                        p.provides.remove(&service);
                    }
                    for (subscriber, sub) in self.requesters(&service) {
                        if let Some(p) = self.processes.get(&subscriber) {
                            out.push(Output::Send {
                                conn: p.conn,
                                msg: Message::InfoService {
                                    sub,
                                    name: service.clone(),
                                    location: ServiceLocation::Withdrawn,
                                },
                            });
                        }
                    }
                    self.dirty = true;
                }
            }
            Message::RequestService { sub, name: service } => {
                if let Some(p) = self.processes.get_mut(name) {
                    p.requests.insert(sub, service.clone());
                }
                self.dirty = true;
                if let Some(which) = DIRECTORY_SERVICES.iter().find(|s| **s == service) {
                    self.directory_subs.retain(|(n, s, _)| !(n == name && *s == sub));
                    self.directory_subs.push((name.to_owned(), sub, which));
                    send(out, Message::InfoService { sub, name: service, location: ServiceLocation::ControlServer });
                    let data = self.directory_json(which);
                    send(out, Message::ServiceMessage { sub, initial: true, seq: 0, data });
                    return;
                }
                let location = match self.services.get(&service) {
                    Some(provider) => self.location_of(provider),
                    None => ServiceLocation::NotProvided,
                };
                send(out, Message::InfoService { sub, name: service, location });
            }
            Message::CancelRequest { sub } => {
                if let Some(p) = self.processes.get_mut(name) {
                    p.requests.remove(&sub);
                }
                self.directory_subs.retain(|(n, s, _)| !(n == name && *s == sub));
                self.dirty = true;
            }
            Message::RegisterCommand { name: command } => {
                if reserved_name(&command) {
                    tracing::warn!(process = %name, %command, "command registration ignored: `dialog/` names are the control server's");
                } else if valid_name(&command)
                    && let Some(p) = self.processes.get_mut(name)
                {
                    p.commands.insert(command);
                    self.dirty = true;
                }
            }
            Message::UnregisterCommand { name: command } => {
                if let Some(p) = self.processes.get_mut(name) {
                    p.commands.remove(&command);
                    self.dirty = true;
                }
            }
            Message::SendCommand { request, name: command, data } => {
                let mut delivered = 0;
                for (pname, p) in &self.processes {
                    if p.commands.contains(&command) {
                        delivered += 1;
                        out.push(Output::Send {
                            conn: p.conn,
                            msg: Message::CommandMessage {
                                name: command.clone(),
                                from: name.to_owned(),
                                data: data.clone(),
                            },
                        });
                        tracing::debug!(%command, from = %name, to = %pname, "command forwarded");
                    }
                }
                send(out, Message::CommandSent { request, delivered });
            }
            Message::Disconnect => {
                tracing::info!(process = %name, "process disconnected");
                self.conns.remove(&conn);
                self.lose(name, LostReason::Disconnected, now, out);
                out.push(Output::Close { conn, reason: format!("{name} disconnected") });
            }
            other => {
                tracing::warn!(process = %name, kind = other.kind(), "unexpected message from a process ignored");
            }
        }
    }

    fn location_of(&self, provider: &str) -> ServiceLocation {
        match self.processes.get(provider) {
            Some(p) => ServiceLocation::Process { name: provider.to_owned(), host: p.host.clone(), port: p.port },
            None => ServiceLocation::NotProvided,
        }
    }

    /// Every (process, subscription id) that requested `service`.
    fn requesters(&self, service: &str) -> Vec<(String, u32)> {
        let mut v = Vec::new();
        for (pname, p) in &self.processes {
            for (&sub, s) in &p.requests {
                if s == service {
                    v.push((pname.clone(), sub));
                }
            }
        }
        v
    }

    /// Removes a process and tells its partners: the subscribers of its services (lost
    /// sender) and the providers of the services it subscribed (lost receiver).
    fn lose(&mut self, name: &str, reason: LostReason, _now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.processes.remove(name) else { return };
        match reason {
            LostReason::Heartbeat => self.lost.heartbeat += 1,
            LostReason::ConnectionClosed => self.lost.connection_closed += 1,
            LostReason::Disconnected => self.lost.disconnected += 1,
        }
        if reason != LostReason::Disconnected {
            tracing::warn!(process = %name, %reason, "process lost");
        }
        let mut told_senders = BTreeSet::new();
        for service in &p.provides {
            self.services.remove(service);
            for (subscriber, _) in self.requesters(service) {
                if told_senders.insert(subscriber.clone())
                    && let Some(s) = self.processes.get(&subscriber)
                {
                    out.push(Output::Send {
                        conn: s.conn,
                        msg: Message::LostSender { process: name.to_owned(), reason },
                    });
                }
            }
        }
        let mut told_receivers = BTreeSet::new();
        for service in p.requests.values() {
            if let Some(provider) = self.services.get(service)
                && told_receivers.insert(provider.clone())
                && let Some(q) = self.processes.get(provider)
            {
                out.push(Output::Send {
                    conn: q.conn,
                    msg: Message::LostReceiver { process: name.to_owned(), reason },
                });
            }
        }
        self.directory_subs.retain(|(n, _, _)| n != name);
        self.dirty = true;
    }

    fn publish(&mut self, out: &mut Vec<Output>) {
        for (i, which) in DIRECTORY_SERVICES.iter().enumerate() {
            let data = self.directory_json(which);
            if self.published[i].as_ref() == Some(&data) {
                continue;
            }
            self.published[i] = Some(data.clone());
            for (pname, sub, w) in &self.directory_subs {
                if w == which
                    && let Some(p) = self.processes.get(pname)
                {
                    out.push(Output::Send {
                        conn: p.conn,
                        msg: Message::ServiceMessage { sub: *sub, initial: false, seq: 0, data: data.clone() },
                    });
                }
            }
        }
    }

    /// The processes, as `dialog/processes` publishes them.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.processes
            .iter()
            .map(|(name, p)| ProcessInfo {
                name: name.clone(),
                host: p.host.clone(),
                port: p.port,
                pid: p.pid,
                start_time_ns: p.start_time_ns,
                connected_ns: p.connected_ns,
                last_heartbeat_ns: p.last_heartbeat_ns,
                provides: p.provides.iter().cloned().collect(),
                subscribes: p.requests.values().cloned().collect::<BTreeSet<_>>().into_iter().collect(),
                commands: p.commands.iter().cloned().collect(),
            })
            .collect()
    }

    /// The services, provided or requested, as `dialog/services` publishes them.
    pub fn services(&self) -> Vec<ServiceInfo> {
        let mut all: BTreeMap<String, ServiceInfo> = BTreeMap::new();
        for (service, provider) in &self.services {
            all.insert(
                service.clone(),
                ServiceInfo {
                    name: service.clone(),
                    provider: Some(provider.clone()),
                    address: self.processes.get(provider).map(|p| format!("{}:{}", p.host, p.port)),
                    subscribers: Vec::new(),
                },
            );
        }
        for (pname, p) in &self.processes {
            for service in p.requests.values().collect::<BTreeSet<_>>() {
                let e = all.entry(service.clone()).or_insert_with(|| ServiceInfo {
                    name: service.clone(),
                    provider: DIRECTORY_SERVICES.contains(&service.as_str()).then(|| "control server".to_owned()),
                    address: None,
                    subscribers: Vec::new(),
                });
                e.subscribers.push(pname.clone());
            }
        }
        all.into_values().collect()
    }

    /// The commands, as `dialog/commands` publishes them.
    pub fn commands(&self) -> Vec<CommandInfo> {
        let mut all: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (pname, p) in &self.processes {
            for c in &p.commands {
                all.entry(c).or_default().push(pname.clone());
            }
        }
        all.into_iter().map(|(name, registrants)| CommandInfo { name: name.to_owned(), registrants }).collect()
    }

    fn directory_json(&self, which: &str) -> Bytes {
        let v = match which {
            "dialog/processes" => serde_json::to_vec(&self.processes()),
            "dialog/services" => serde_json::to_vec(&self.services()),
            _ => serde_json::to_vec(&self.commands()),
        };
        Bytes::from(v.unwrap_or_default())
    }

    /// Number of connected processes.
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    /// How many processes were lost so far, by why.
    pub fn lost(&self) -> LostCounts {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(d: &mut Directory, conn: ConnId, name: &str, now: Now) -> Vec<Output> {
        d.on_accept(conn, format!("127.0.0.1:{}", 40000 + conn), now);
        d.on_message(
            conn,
            Message::ConnectToControlServer {
                version: PROTOCOL_VERSION,
                name: name.into(),
                pid: 100 + conn as u32,
                host: "127.0.0.1".into(),
                port: 5000 + conn as u16,
                start_time_ns: 1,
            },
            now,
        )
    }

    fn sent_to(out: &[Output], conn: ConnId) -> Vec<Message> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send { conn: c, msg } if *c == conn => Some(msg.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn handshake_then_registration_and_uniqueness() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        let out = connect(&mut d, 1, "ru-1", now);
        assert!(matches!(sent_to(&out, 1)[..], [Message::SuccessfullyConnected { .. }]));
        connect(&mut d, 2, "ru-2", now);
        let out = d.on_message(1, Message::RegisterService { request: 7, name: "ru/state".into() }, now);
        assert_eq!(sent_to(&out, 1), [Message::ServiceRegistered { request: 7 }]);
        let out = d.on_message(2, Message::RegisterService { request: 9, name: "ru/state".into() }, now);
        assert_eq!(
            sent_to(&out, 2),
            [Message::ServiceRefused { request: 9, owner: "ru-1".into(), owner_addr: "127.0.0.1:5001".into() }]
        );
        assert_eq!(d.services()[0].provider.as_deref(), Some("ru-1"));
    }

    #[test]
    fn messages_before_the_handshake_are_ignored_and_answered() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        d.on_accept(1, "x".into(), now);
        let out = d.on_message(1, Message::RegisterService { request: 1, name: "s".into() }, now);
        assert!(matches!(sent_to(&out, 1)[..], [Message::NotConnected { .. }]));
        assert!(d.services().is_empty());
    }

    #[test]
    fn a_second_process_with_the_same_name_is_refused() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "p", now);
        let out = connect(&mut d, 2, "p", now);
        assert!(matches!(sent_to(&out, 2)[..], [Message::ConnectRefused { reason: RefuseReason::NameTaken, .. }]));
    }

    #[test]
    fn a_request_before_the_provider_is_answered_when_it_registers() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "monitor", now);
        let out = d.on_message(1, Message::RequestService { sub: 3, name: "evm/state".into() }, now);
        assert_eq!(
            sent_to(&out, 1),
            [Message::InfoService { sub: 3, name: "evm/state".into(), location: ServiceLocation::NotProvided }]
        );
        connect(&mut d, 2, "evm", now);
        let out = d.on_message(2, Message::RegisterService { request: 1, name: "evm/state".into() }, now);
        assert_eq!(
            sent_to(&out, 1),
            [Message::InfoService {
                sub: 3,
                name: "evm/state".into(),
                location: ServiceLocation::Process { name: "evm".into(), host: "127.0.0.1".into(), port: 5002 }
            }]
        );
    }

    /// Ticks every 100 ms from `from` (exclusive) to `to` (inclusive); every output.
    fn tick_through(d: &mut Directory, from: Now, to: Duration) -> Vec<Output> {
        let mut out = Vec::new();
        let mut t = Duration::from_millis(100);
        while t <= to {
            out.extend(d.tick(from.after(t)));
            t += Duration::from_millis(100);
        }
        out
    }

    #[test]
    fn a_server_that_did_not_run_declares_nobody_lost_until_a_full_timeout_passed_with_it_running() {
        let t0 = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "a", t0);
        connect(&mut d, 2, "b", t0);
        assert!(tick_through(&mut d, t0, Duration::from_millis(500)).is_empty());
        // The server is stopped for 5 s (lost after 3 s): its first tick after that declares
        // nobody lost, nor do the next ones for a full 3 s.
        let resumed = t0.after(Duration::from_millis(5500));
        let out = d.tick(resumed);
        assert!(out.iter().all(|o| !matches!(o, Output::Close { .. })), "{out:?}");
        // `b` is heard from again (its heartbeats waited in the socket); `a` never is.
        d.on_message(2, Message::Heartbeat { seq: 9 }, resumed.after(Duration::from_millis(50)));
        let out = tick_through(&mut d, resumed, Duration::from_millis(2900));
        assert!(out.iter().all(|o| !matches!(o, Output::Close { .. })), "{out:?}");
        d.on_message(2, Message::Heartbeat { seq: 10 }, resumed.after(Duration::from_millis(2950)));
        let later = resumed.after(Duration::from_millis(2900));
        let out = tick_through(&mut d, later, Duration::from_millis(300));
        assert!(out.contains(&Output::Close { conn: 1, reason: "a: no heartbeat".into() }), "{out:?}");
        assert!(!out.iter().any(|o| matches!(o, Output::Close { conn: 2, .. })), "{out:?}");
    }

    #[test]
    fn heartbeat_loss_tells_both_sides_and_frees_the_service() {
        let t0 = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "provider", t0);
        connect(&mut d, 2, "subscriber", t0);
        connect(&mut d, 3, "upstream", t0);
        d.on_message(1, Message::RegisterService { request: 1, name: "a".into() }, t0);
        d.on_message(3, Message::RegisterService { request: 1, name: "b".into() }, t0);
        d.on_message(2, Message::RequestService { sub: 1, name: "a".into() }, t0);
        d.on_message(1, Message::RequestService { sub: 1, name: "b".into() }, t0);
        // 2 and 3 keep sending heartbeats; 1 goes silent.
        let t = t0.after(Duration::from_millis(2500));
        d.on_message(2, Message::Heartbeat { seq: 1 }, t);
        d.on_message(3, Message::Heartbeat { seq: 1 }, t);
        assert!(d.tick(t).iter().all(|o| !matches!(o, Output::Close { .. })), "not lost yet");
        assert_eq!(d.lost(), LostCounts::default());
        let t = t0.after(Duration::from_millis(3100));
        let out = d.tick(t);
        assert_eq!(d.lost(), LostCounts { heartbeat: 1, ..LostCounts::default() }, "counted as lost");
        assert!(sent_to(&out, 1).iter().any(|m| matches!(m, Message::ConnectionLost { .. })));
        assert!(out.contains(&Output::Close { conn: 1, reason: "provider: no heartbeat".into() }));
        assert!(
            sent_to(&out, 2)
                .contains(&Message::LostSender { process: "provider".into(), reason: LostReason::Heartbeat })
        );
        assert!(
            sent_to(&out, 3)
                .contains(&Message::LostReceiver { process: "provider".into(), reason: LostReason::Heartbeat })
        );
        // The service is free again and the subscriber's request waits for the next provider.
        connect(&mut d, 4, "spare", t);
        let out = d.on_message(4, Message::RegisterService { request: 1, name: "a".into() }, t);
        assert!(matches!(
            &sent_to(&out, 2)[..],
            [Message::InfoService { location: ServiceLocation::Process { name, .. }, .. }] if name == "spare"
        ));
    }

    #[test]
    fn commands_go_to_every_registrant_and_the_sender_learns_how_many() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        for (c, n) in [(1, "a"), (2, "b"), (3, "c")] {
            connect(&mut d, c, n, now);
        }
        d.on_message(1, Message::RegisterCommand { name: "all/stop".into() }, now);
        d.on_message(2, Message::RegisterCommand { name: "all/stop".into() }, now);
        let out = d.on_message(
            3,
            Message::SendCommand { request: 5, name: "all/stop".into(), data: Bytes::from_static(b"now") },
            now,
        );
        for c in [1, 2] {
            assert_eq!(
                sent_to(&out, c),
                [Message::CommandMessage {
                    name: "all/stop".into(),
                    from: "c".into(),
                    data: Bytes::from_static(b"now")
                }]
            );
        }
        assert_eq!(sent_to(&out, 3), [Message::CommandSent { request: 5, delivered: 2 }]);
    }

    #[test]
    fn directory_services_publish_on_change() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "gui", now);
        let out = d.on_message(1, Message::RequestService { sub: 1, name: "dialog/processes".into() }, now);
        let msgs = sent_to(&out, 1);
        assert!(matches!(msgs[0], Message::InfoService { location: ServiceLocation::ControlServer, .. }));
        let Message::ServiceMessage { data, initial: true, .. } = &msgs[1] else { panic!("{msgs:?}") };
        let procs: Vec<ProcessInfo> = serde_json::from_slice(data).unwrap();
        assert_eq!(procs[0].name, "gui");
        d.tick(now);
        assert!(sent_to(&d.tick(now), 1).is_empty(), "no change, no update");
        connect(&mut d, 2, "ru-1", now);
        let out = d.tick(now);
        let Message::ServiceMessage { data, .. } = &sent_to(&out, 1)[0] else { panic!() };
        let procs: Vec<ProcessInfo> = serde_json::from_slice(data).unwrap();
        assert_eq!(procs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["gui", "ru-1"]);
    }

    #[test]
    fn reserved_names_cannot_be_registered() {
        let now = Now::current();
        let mut d = Directory::new(DirectoryConfig::default());
        connect(&mut d, 1, "p", now);
        let out = d.on_message(1, Message::RegisterService { request: 1, name: "dialog/processes".into() }, now);
        assert!(matches!(&sent_to(&out, 1)[..], [Message::ServiceRefused { owner, .. }] if owner == "control server"));
        // Not only the directory's own services: the whole `dialog/` prefix.
        let out = d.on_message(1, Message::RegisterService { request: 2, name: "dialog/mine".into() }, now);
        assert!(
            matches!(&sent_to(&out, 1)[..], [Message::ServiceRefused { request: 2, owner, .. }] if owner == "control server")
        );
        d.on_message(1, Message::RegisterCommand { name: "dialog/mine".into() }, now);
        d.on_message(1, Message::RegisterCommand { name: "p/mine".into() }, now);
        let p = d.processes().into_iter().find(|p| p.name == "p").unwrap();
        assert!(p.provides.is_empty(), "{:?}", p.provides);
        assert_eq!(p.commands, ["p/mine"]);
    }
}
