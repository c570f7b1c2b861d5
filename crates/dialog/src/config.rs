//! Configuration of a dialog process and of the control server.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use daqflow_transport::auth::Token;
use daqflow_transport::{ConnectionOptions, RetryPolicy, WhenFull};

use crate::protocol::{CONTROL_PROTOCOL, PEER_PROTOCOL};

use crate::error::DialogError;

/// The control server's address when nothing else is configured.
pub const DEFAULT_CONTROL: &str = "127.0.0.1:7000";
/// The environment variable with the control server address(es).
pub const CONTROL_ENV: &str = "DAQFLOW_CONTROL";

/// Parses `host:port[,host:port…]` (a primary control server and its spares), resolving names.
///
/// ```
/// let addrs = daqflow_dialog::parse_control_addrs("127.0.0.1:7000,127.0.0.1:7001").unwrap();
/// assert_eq!(addrs.len(), 2);
/// ```
pub fn parse_control_addrs(text: &str) -> Result<Vec<SocketAddr>, DialogError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let resolved =
            part.to_socket_addrs().map_err(|e| DialogError::Config(format!("control server address {part:?}: {e}")))?;
        let first = resolved
            .into_iter()
            .next()
            .ok_or_else(|| DialogError::Config(format!("control server address {part:?} resolves to nothing")))?;
        out.push(first);
    }
    if out.is_empty() {
        return Err(DialogError::Config("no control server address given".into()));
    }
    Ok(out)
}

/// The control server address(es) from `DAQFLOW_CONTROL`, else `127.0.0.1:7000`.
pub fn control_addrs_from_env() -> Result<Vec<SocketAddr>, DialogError> {
    match std::env::var(CONTROL_ENV) {
        Ok(v) if !v.trim().is_empty() => parse_control_addrs(&v),
        _ => parse_control_addrs(DEFAULT_CONTROL),
    }
}

/// How a dialog process behaves. [`DialogConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct DialogConfig {
    /// The process name, unique in the system.
    pub name: String,
    /// Control server addresses: the primary first, then spares, tried in turn.
    pub control: Vec<SocketAddr>,
    /// Where this process listens for its peers (subscribers sending requests, providers
    /// sending updates). Default ([`default_listen`]): a free port on the loopback interface
    /// when every control server is on this host (a loopback address), else a free port on
    /// every interface, so that processes on other hosts reach it.
    pub listen: SocketAddr,
    /// The host published for the listening socket. Default: its IP, or, when listening on all
    /// interfaces, the local IP of the connection to the control server.
    pub advertise_host: Option<String>,
    /// The system token, proven in the transport's handshake on every connection (to the
    /// control server, to peers, and by peers to us); a connection that cannot prove it is
    /// refused. Default: the process's token (`daqflow --token-file`), if any.
    pub token: Option<Token>,
    /// Heartbeat interval until the control server says otherwise. Default 1 s.
    pub heartbeat_interval: Duration,
    /// The control server is considered gone if it answers nothing for this long; the process
    /// then connects to the next address. Default 3 s.
    pub lost_after: Duration,
    /// Back-off between attempts to reach a control server. Default 50 ms doubling to 2 s.
    pub retry: RetryPolicy,
    /// A connection to a peer unused for this long is closed; it is opened again when needed.
    /// Default 60 s.
    pub idle_timeout: Duration,
    /// How long `send_command` waits for a control server. Default 5 s.
    pub command_timeout: Duration,
    /// Threads of the runtime the synchronous [`Dialog`](crate::Dialog) creates. Default 2.
    pub worker_threads: usize,
    /// Options of every connection (queue bounds, buffer sizes). Their `token` and `protocol`
    /// are set from [`DialogConfig::token`] and the kind of connection.
    pub connection: ConnectionOptions,
}

impl DialogConfig {
    /// Defaults for process `name` talking to the control server(s) at `control`.
    pub fn new(name: impl Into<String>, control: Vec<SocketAddr>) -> Self {
        let listen = default_listen(&control);
        DialogConfig {
            name: name.into(),
            control,
            listen,
            advertise_host: None,
            token: daqflow_transport::auth::process_token(),
            heartbeat_interval: Duration::from_secs(1),
            lost_after: Duration::from_secs(3),
            retry: RetryPolicy { max: Duration::from_secs(2), ..RetryPolicy::default() },
            idle_timeout: Duration::from_secs(60),
            command_timeout: Duration::from_secs(5),
            worker_threads: 2,
            connection: ConnectionOptions {
                max_frame_bytes: 256 << 20,
                send_queue_bytes: 8 << 20,
                when_full: WhenFull::Block,
                ..ConnectionOptions::default()
            },
        }
    }
}

/// Where a process listens for its peers by default, given its control servers: port 0 (a free
/// one) on `127.0.0.1` when they are all on this host's loopback, else (a wildcard control
/// server serves other hosts too) on every interface (`0.0.0.0`, or `::` when a control server has an IPv6 address); the
/// address then published is the one the control server sees the process at.
///
/// ```
/// use daqflow_dialog::default_listen;
/// assert_eq!(default_listen(&["127.0.0.1:7000".parse().unwrap()]).to_string(), "127.0.0.1:0");
/// assert_eq!(default_listen(&["10.1.2.3:7000".parse().unwrap()]).to_string(), "0.0.0.0:0");
/// assert_eq!(default_listen(&["0.0.0.0:7000".parse().unwrap()]).to_string(), "0.0.0.0:0");
/// ```
pub fn default_listen(control: &[SocketAddr]) -> SocketAddr {
    let local = |a: &SocketAddr| a.ip().is_loopback();
    if control.iter().all(local) {
        SocketAddr::from(([127, 0, 0, 1], 0))
    } else if control.iter().any(SocketAddr::is_ipv6) {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    }
}

impl DialogConfig {
    /// Options of the connection to the control server.
    pub(crate) fn control_options(&self) -> ConnectionOptions {
        ConnectionOptions { protocol: CONTROL_PROTOCOL, token: self.token.clone(), ..self.connection.clone() }
    }

    /// Options of connections between processes.
    pub(crate) fn peer_options(&self) -> ConnectionOptions {
        ConnectionOptions { protocol: PEER_PROTOCOL, token: self.token.clone(), ..self.connection.clone() }
    }
}

/// How the control server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where it listens. Default `127.0.0.1:7000`.
    pub listen: SocketAddr,
    /// Heartbeat interval told to processes. Default 1 s.
    pub heartbeat_interval: Duration,
    /// A process silent for this long is lost. Default 3 s.
    pub lost_after: Duration,
    /// The system token every connection must prove in the transport's handshake. Default: the
    /// process's token (`daqflow --token-file`), if any.
    pub token: Option<Token>,
    /// Largest command (`SEND_COMMAND` payload) accepted from a process. Default 16 MiB.
    pub max_command_bytes: u32,
    /// How often the directory checks heartbeats and publishes changes. Default 100 ms.
    pub tick: Duration,
    /// This server is one of several its processes know (a primary and spares): when it finds
    /// that it did not run for about as long as they wait for it (`lost_after` less one
    /// heartbeat interval), they have moved to another, and it ends
    /// ([`ServerError::Superseded`](crate::ServerError::Superseded)) rather than serve a second
    /// directory beside theirs. Default false: a lone server gives its processes a new grace
    /// period and goes on.
    pub end_after_stall: bool,
    /// The other control servers of the same system (its spares, or its primary): each second
    /// this server asks each how many processes it serves (`SERVER_PROBE`); when both serve
    /// some — the system's processes are split between two directories, after a network
    /// partition healed — the one serving fewer (on a tie, the one with the higher address)
    /// ends ([`ServerError::Split`](crate::ServerError::Split)), so that its processes move to
    /// the other. Default: none.
    pub siblings: Vec<SocketAddr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7000)),
            heartbeat_interval: Duration::from_secs(1),
            lost_after: Duration::from_secs(3),
            token: daqflow_transport::auth::process_token(),
            max_command_bytes: 16 << 20,
            tick: Duration::from_millis(100),
            end_after_stall: false,
            siblings: Vec::new(),
        }
    }
}
