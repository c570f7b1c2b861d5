//! The control server: the I/O layer around the [`Directory`].
//!
//! One task per connection reads messages and feeds them to the directory; a ticker declares
//! silent processes lost and publishes the directory services. What the directory answers is
//! queued on the connections without ever waiting: a process that does not read its control
//! connection is disconnected rather than allowed to block the server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use daqflow_transport::{AsyncConnection, AsyncListener, ConnectionOptions, FrameSender, WhenFull};
use daqflow_wire::frame::FrameLimits;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::ServerConfig;
use crate::directory::{ConnId, Directory, DirectoryConfig, LostCounts, Now, Output, ProcessInfo, ServiceInfo};
use crate::error::ServerError;
use crate::protocol::Message;

struct ConnHandle {
    sender: FrameSender,
    kill: Arc<Notify>,
}

struct Shared {
    directory: Mutex<Directory>,
    conns: Mutex<HashMap<ConnId, ConnHandle>>,
    max_command_bytes: u32,
    /// Why the server ended by itself ([`ServerError::Superseded`], [`ServerError::Split`]),
    /// once it did.
    ended: Mutex<Option<ServerError>>,
    ending: Notify,
    /// When it started (ns since the epoch): on a split with as many processes on both sides,
    /// the server started later ends.
    started_ns: u64,
}

impl Shared {
    fn directory(&self) -> std::sync::MutexGuard<'_, Directory> {
        self.directory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<ConnId, ConnHandle>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the server by itself: every connection is cut (its processes move to another
    /// server of their list) and [`ServerHandle::wait`] returns `why`.
    fn end(&self, why: ServerError) {
        tracing::error!("{why}");
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        for (_, h) in self.conns().drain() {
            h.sender.abort();
            h.kill.notify_one();
        }
        self.ending.notify_one();
    }

    fn apply(self: &Arc<Self>, outputs: Vec<Output>) {
        let mut overloaded = Vec::new();
        {
            let conns = self.conns();
            for o in outputs {
                match o {
                    Output::Send { conn, msg } => {
                        if let Some(h) = conns.get(&conn)
                            && let Err(e) = h.sender.try_send(msg.to_frame())
                            && matches!(e, daqflow_transport::SendError::Full { .. })
                        {
                            tracing::warn!(conn, "a process does not read its control connection; disconnecting it");
                            overloaded.push(conn);
                        }
                    }
                    Output::Stalled { .. } => {}
                    Output::Close { conn, reason } => {
                        tracing::debug!(conn, %reason, "closing control connection");
                        if let Some(h) = conns.get(&conn) {
                            let sender = h.sender.clone();
                            let kill = h.kill.clone();
                            tokio::spawn(async move {
                                // Deliver what was queued for it (the refusal, the "lost" notice), then cut.
                                let _ = tokio::time::timeout(std::time::Duration::from_secs(2), sender.close()).await;
                                sender.abort();
                                kill.notify_one();
                            });
                        }
                    }
                }
            }
        }
        for conn in overloaded {
            if let Some(h) = self.conns().get(&conn) {
                h.sender.abort();
                h.kill.notify_one();
            }
        }
    }
}

/// A running control server. Dropping the handle stops it (its connections close, as if it
/// had died); [`ServerHandle::wait`] runs it until then.
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connected processes, as `dialog/processes` publishes them.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.shared.directory().processes()
    }

    /// A view of the directory for monitoring, usable from any thread while
    /// [`ServerHandle::wait`] runs the server (the control server's `--metrics`).
    pub fn view(&self) -> ServerView {
        ServerView { shared: self.shared.clone() }
    }

    /// Runs until the server ends by itself: with
    /// [`ServerConfig::end_after_stall`](crate::ServerConfig::end_after_stall), when it finds
    /// that its processes have moved to another control server while it did not run
    /// ([`ServerError::Superseded`]); else never (unless its listener fails: `Ok`).
    pub async fn wait(mut self) -> Result<(), ServerError> {
        let shared = self.shared.clone();
        let ending = shared.ending.notified();
        tokio::pin!(ending);
        ending.as_mut().enable();
        if let Some(e) = shared.ended.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        match self.tasks.first_mut() {
            Some(accept) => {
                tokio::select! {
                    _ = accept => Ok(()),
                    _ = ending => Err(shared.ended.lock().unwrap_or_else(|p| p.into_inner()).take()
                        .unwrap_or(ServerError::Superseded { stalled_ms: 0 })),
                }
            }
            None => Ok(()),
        }
    }
}

/// A running control server's directory as it is now ([`ServerHandle::view`]). It keeps
/// nothing running: once the server is dropped, it shows the directory as the server left it.
#[derive(Clone)]
pub struct ServerView {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerView").finish_non_exhaustive()
    }
}

impl ServerView {
    /// The connected processes, as `dialog/processes` publishes them.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        self.shared.directory().processes()
    }

    /// The services, provided or requested, as `dialog/services` publishes them.
    pub fn services(&self) -> Vec<ServiceInfo> {
        self.shared.directory().services()
    }

    /// How many processes were lost so far, by why.
    pub fn lost(&self) -> LostCounts {
        self.shared.directory().lost()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for (_, h) in self.shared.conns().drain() {
            h.sender.abort();
            h.kill.notify_one();
        }
    }
}

/// The control server (paper section IV.D.3).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use daqflow_dialog::{ControlServer, ServerConfig};
/// let server = ControlServer::start(ServerConfig::default()).await?;
/// println!("control server on {}", server.local_addr());
/// server.wait().await?;
/// # Ok(()) }
/// ```
pub struct ControlServer;

impl ControlServer {
    /// Binds and starts serving on the current tokio runtime.
    pub async fn start(config: ServerConfig) -> Result<ServerHandle, ServerError> {
        let opts = ConnectionOptions {
            protocol: crate::protocol::CONTROL_PROTOCOL,
            token: config.token.clone(),
            max_frame_bytes: config.max_command_bytes.max(64 << 10),
            send_queue_bytes: 32 << 20,
            when_full: WhenFull::Fail,
            ..ConnectionOptions::default()
        };
        let listener = AsyncListener::bind(config.listen, opts)
            .await
            .map_err(|source| ServerError::Bind { addr: config.listen, source })?;
        let addr = listener.local_addr();
        let directory = Directory::new(DirectoryConfig {
            heartbeat_interval: config.heartbeat_interval,
            lost_after: config.lost_after,
            server_name: addr.to_string(),
            ..DirectoryConfig::default()
        });
        let shared = Arc::new(Shared {
            directory: Mutex::new(directory),
            conns: Mutex::new(HashMap::new()),
            max_command_bytes: config.max_command_bytes,
            ended: Mutex::new(None),
            ending: Notify::new(),
            started_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        });
        tracing::info!(%addr, token = config.token.is_some(), "control server listening");
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        let ticker = {
            let shared = shared.clone();
            let tick = config.tick;
            // With spares, a stall this long means the processes have moved on (they wait
            // `lost_after` from the last answer, which came up to one heartbeat interval before).
            let superseded_after =
                config.end_after_stall.then(|| config.lost_after.saturating_sub(config.heartbeat_interval));
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(tick);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    interval.tick().await;
                    let out = shared.directory().tick(Now::current());
                    let stalled = out.iter().find_map(|o| match o {
                        Output::Stalled { gap } => Some(*gap),
                        _ => None,
                    });
                    if let (Some(gap), Some(limit)) = (stalled, superseded_after)
                        && gap >= limit
                    {
                        shared.end(ServerError::Superseded { stalled_ms: gap.as_millis() as u64 });
                        return;
                    }
                    shared.apply(out);
                }
            })
        };
        let mut tasks = vec![accept, ticker];
        if !config.siblings.is_empty() {
            let opts = ConnectionOptions {
                protocol: crate::protocol::CONTROL_PROTOCOL,
                token: config.token.clone(),
                ..ConnectionOptions::default()
            };
            tasks.push(tokio::spawn(watch_siblings(shared.clone(), config.siblings.clone(), opts)));
        }
        Ok(ServerHandle { addr, shared, tasks })
    }
}

/// Every second, asks each other server of the system how many processes it serves; ends this
/// one when the processes are split and the other has the better claim (more processes; as
/// many, and started earlier). A sibling that does not answer (down, or cut off) is skipped.
async fn watch_siblings(shared: Arc<Shared>, siblings: Vec<SocketAddr>, opts: ConnectionOptions) {
    let mut interval = tokio::time::interval(std::time::Duration::from_secs(1));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        for &sibling in &siblings {
            let here = shared.directory().process_count() as u32;
            if here == 0 {
                break;
            }
            let probe = Message::ServerProbe { processes: here, started_ns: shared.started_ns };
            let answer = tokio::time::timeout(std::time::Duration::from_secs(2), ask(sibling, &opts, probe)).await;
            let Ok(Some((there, their_start))) = answer else { continue };
            if there > 0 && (there > here || (there == here && their_start < shared.started_ns)) {
                shared.end(ServerError::Split { sibling, here, there });
                return;
            }
        }
    }
}

/// One `SERVER_PROBE` to `sibling`: its processes and start time, or None.
async fn ask(sibling: SocketAddr, opts: &ConnectionOptions, probe: Message) -> Option<(u32, u64)> {
    let conn = match AsyncConnection::connect(sibling, opts).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%sibling, error = %e, "the other control server does not answer");
            return None;
        }
    };
    let (tx, mut rx) = conn.split();
    tx.start_send(probe.to_frame()).ok()?;
    let frame = rx.recv().await.ok()?;
    tx.abort();
    match Message::from_frame(&frame) {
        Ok(Message::ServerStatus { processes, started_ns }) => Some((processes, started_ns)),
        other => {
            tracing::warn!(%sibling, answer = ?other.map(|m| m.kind()), "the other control server answered its probe with something else");
            None
        }
    }
}

async fn accept_loop(listener: AsyncListener, shared: Arc<Shared>) {
    let next = AtomicU64::new(1);
    loop {
        match listener.accept().await {
            Ok(conn) => {
                let id = next.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(shared.clone(), id, conn));
            }
            Err(e) => {
                // Out of file descriptors and the like: keep serving the connections we have.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve(shared: Arc<Shared>, id: ConnId, conn: AsyncConnection) {
    let peer = conn.peer_addr();
    let (sender, mut receiver) = conn.split();
    let kill = Arc::new(Notify::new());
    shared.conns().insert(id, ConnHandle { sender, kill: kill.clone() });
    shared.directory().on_accept(id, peer.to_string(), Now::current());
    loop {
        let frame = tokio::select! {
            r = receiver.recv() => r,
            _ = kill.notified() => break,
        };
        match frame {
            Ok(frame) => match Message::from_frame(&frame) {
                Ok(Message::ServerProbe { .. }) => {
                    // Another control server of the system asks how many processes we serve.
                    let status = Message::ServerStatus {
                        processes: shared.directory().process_count() as u32,
                        started_ns: shared.started_ns,
                    };
                    if let Some(h) = shared.conns().get(&id) {
                        let _ = h.sender.try_send(status.to_frame());
                    }
                }
                Ok(msg) => {
                    if matches!(msg, Message::ConnectToControlServer { .. }) {
                        // The process said who it is: commands may be large, everything else
                        // a process sends stays small.
                        receiver.set_frame_limits(
                            FrameLimits::uniform(64 << 10)
                                .with_kind(crate::protocol::kind::SEND_COMMAND, shared.max_command_bytes),
                        );
                    }
                    let out = shared.directory().on_message(id, msg, Now::current());
                    shared.apply(out);
                }
                Err(e) => {
                    if let Some(version) = crate::protocol::other_version(&frame) {
                        // Another version's layout: refused as such (reason 3), not as garbage;
                        // the refusal is delivered, then the connection closed.
                        let out = shared.directory().on_other_version(id, version);
                        shared.apply(out);
                        continue;
                    }
                    tracing::warn!(%peer, error = %e, "closing control connection: malformed message");
                    break;
                }
            },
            Err(e) => {
                if !e.is_clean_close() {
                    tracing::debug!(%peer, error = %e, "control connection ended");
                }
                break;
            }
        }
    }
    let out = shared.directory().on_closed(id, Now::current());
    shared.apply(out);
    if let Some(h) = shared.conns().remove(&id) {
        h.sender.abort();
    }
}
