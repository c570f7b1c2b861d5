//! The dialog client: the async core every process uses to join the control plane.

mod control;
mod peers;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use daqflow_transport::{AsyncListener, FrameSender, WhenFull};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::DialogConfig;
use crate::directory::ProcessInfo;
use crate::error::DialogError;
use crate::protocol::{LostReason, Message, reserved_name, valid_name};
use peers::{Enqueued, Outgoing, PeerKey, PeerLink};

/// What a subscription handler receives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceEvent {
    /// A value of the service: first the current one (`initial`), then every update, in order.
    Update {
        /// The value.
        data: Bytes,
        /// The provider's update counter: consecutive updates have consecutive numbers.
        seq: u64,
        /// This is the value the service had when the subscription started.
        initial: bool,
    },
    /// The provider went away. The subscription stays: when a provider appears (the same
    /// process restarted, or a spare), updates resume by themselves, starting with an
    /// `initial` value.
    Lost {
        /// The provider that went away.
        provider: String,
        /// Why.
        cause: LostCause,
    },
}

/// Why a provider was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostCause {
    /// The control server had no heartbeat from it in time: it died or is stuck.
    Heartbeat,
    /// Its connections closed without a goodbye: it crashed or was killed.
    ConnectionClosed,
    /// It left the system cleanly.
    Disconnected,
    /// It stopped providing the service.
    Withdrawn,
    /// It could not be reached at the address the control server gave.
    Unreachable,
}

impl From<LostReason> for LostCause {
    fn from(r: LostReason) -> Self {
        match r {
            LostReason::Heartbeat => LostCause::Heartbeat,
            LostReason::ConnectionClosed => LostCause::ConnectionClosed,
            LostReason::Disconnected => LostCause::Disconnected,
        }
    }
}

impl std::fmt::Display for LostCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostCause::Heartbeat => "no heartbeat",
            LostCause::ConnectionClosed => "connection closed",
            LostCause::Disconnected => "disconnected",
            LostCause::Withdrawn => "service withdrawn",
            LostCause::Unreachable => "unreachable",
        })
    }
}

/// A command delivered to a process that registered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandMessage {
    /// The command name.
    pub name: String,
    /// The process that sent it.
    pub from: String,
    /// Its payload.
    pub data: Bytes,
}

type ServiceHandler = Box<dyn FnMut(ServiceEvent) + Send>;
type CommandHandler = Box<dyn FnMut(CommandMessage) + Send>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Provider {
    /// Nobody provides the service yet (or the provider was lost).
    Waiting,
    /// The control server provides it (`dialog/…`).
    ControlServer,
    /// A process provides it.
    Process { name: String, addr: SocketAddr },
}

pub(crate) struct SubEntry {
    id: u32,
    name: String,
    /// The subscription's key: sent only to the provider the control server named, and
    /// proven by it on each connection before any of its values is taken.
    key: crate::protocol::SubscriptionKey,
    handler: Mutex<ServiceHandler>,
    provider: Mutex<Provider>,
    /// Bumped whenever `provider` changes, so that readers can cache their check.
    generation: AtomicU64,
    /// The provider left cleanly while its connection to us still carried updates: the loss
    /// is reported when that connection has delivered them.
    pending_loss: Mutex<Option<(String, LostCause)>>,
}

impl SubEntry {
    fn deliver(&self, event: ServiceEvent) {
        let mut h = self.handler.lock().unwrap_or_else(|p| p.into_inner());
        (h)(event);
    }

    fn provider(&self) -> MutexGuard<'_, Provider> {
        self.provider.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_provider(&self, p: Provider) {
        *self.provider() = p;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Whether an update from process `peer` is for this subscription: from its provider, or
    /// from the provider it just lost (updates sent before the loss are still delivered), but
    /// not from a provider it has since replaced.
    fn accepts_from(&self, peer: &str) -> bool {
        match &*self.provider() {
            Provider::Process { name, .. } => name == peer,
            Provider::Waiting => true,
            Provider::ControlServer => false,
        }
    }

    /// Records a clean departure of the provider to report once its updates are delivered.
    fn defer_loss(&self, name: &str, cause: LostCause) {
        if matches!(&*self.provider(), Provider::Process { name: n, .. } if n == name) {
            *self.pending_loss.lock().unwrap_or_else(|p| p.into_inner()) = Some((name.to_owned(), cause));
        }
    }

    /// Reports a deferred loss of provider `name`, if one waits.
    fn report_deferred_loss(&self, name: &str) {
        let pending = {
            let mut p = self.pending_loss.lock().unwrap_or_else(|p| p.into_inner());
            match &*p {
                Some((n, _)) if n == name => p.take(),
                _ => None,
            }
        };
        if let Some((n, cause)) = pending {
            self.lose_provider(&n, cause);
        }
    }

    /// If the provider is the process `name`, mark the subscription waiting and tell the
    /// handler it was lost (once per loss).
    fn lose_provider(&self, name: &str, cause: LostCause) -> bool {
        let lost = {
            let mut p = self.provider();
            match &*p {
                Provider::Process { name: n, .. } if n == name => {
                    *p = Provider::Waiting;
                    true
                }
                _ => false,
            }
        };
        if lost {
            self.generation.fetch_add(1, Ordering::Release);
            self.deliver(ServiceEvent::Lost { provider: name.to_owned(), cause });
        }
        lost
    }
}

struct CommandEntry {
    handler: Mutex<CommandHandler>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    /// Sent to the control server, no answer yet.
    Pending,
    Registered,
    /// Lost to another process while the control server was away.
    Revoked(String),
}

struct Subscriber {
    process: String,
    sub: u32,
    /// The key its `SUBSCRIBE_SERVICE` carried (proven on the link, needed to unsubscribe).
    key: crate::protocol::SubscriptionKey,
    link: Arc<PeerLink>,
}

/// How a service treats a subscriber that does not keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceOptions {
    /// [`WhenFull::Block`] (default): `update` waits for a subscriber whose queue is full, so
    /// that every subscriber gets every update. [`WhenFull::Fail`]: the update is skipped for
    /// that subscriber (counted in [`Service::dropped`]; the subscriber sees a gap in `seq`),
    /// so that a stuck subscriber never slows the provider (monitoring and statistics).
    pub when_full: WhenFull,
}

struct Provided {
    options: ServiceOptions,
    /// Updates skipped for subscribers that did not keep up.
    dropped: u64,
    status: Status,
    seq: u64,
    /// The last value and its sequence number.
    value: Option<(u64, Bytes)>,
    subscribers: Vec<Subscriber>,
    /// The `provide()` call waiting for the control server's answer.
    waiter: Option<oneshot::Sender<Result<(), DialogError>>>,
}

pub(crate) struct ServiceSlot {
    name: String,
    inner: Mutex<Provided>,
}

impl ServiceSlot {
    fn lock(&self) -> MutexGuard<'_, Provided> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct State {
    services: HashMap<String, Arc<ServiceSlot>>,
    subs: HashMap<u32, Arc<SubEntry>>,
    next_sub: u32,
    commands: HashMap<String, Arc<CommandEntry>>,
    /// Request id → service, for registrations awaiting an answer.
    registrations: HashMap<u32, String>,
    /// Request id → caller, for commands awaiting the count of deliveries.
    commands_in_flight: HashMap<u32, oneshot::Sender<u32>>,
}

pub(crate) struct Inner {
    config: DialogConfig,
    handle: Handle,
    state: Mutex<State>,
    control: Mutex<Option<FrameSender>>,
    connected: watch::Sender<bool>,
    links: Mutex<HashMap<PeerKey, Arc<PeerLink>>>,
    /// Open incoming connections per peer name.
    incoming: Mutex<HashMap<String, u32>>,
    listen_port: u16,
    listen_ip: std::net::IpAddr,
    advertised_host: Mutex<String>,
    shutdown: watch::Sender<bool>,
    next_request: AtomicU32,
    start_time_ns: u64,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Signals that the control thread has finished.
    control_done: Mutex<Option<oneshot::Receiver<()>>>,
    /// Commands to run, in order, on the command thread.
    command_queue: Mutex<Option<std::sync::mpsc::Sender<CommandMessage>>>,
    /// Why the last attempt to reach a control server failed (cleared once connected).
    problem: Mutex<Option<String>>,
    /// The control server connected to now.
    server: Mutex<Option<SocketAddr>>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = problem;
    }

    fn request_id(&self) -> u32 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a message to the control server if connected; otherwise it is dropped (the
    /// state is sent again in full on the next connection).
    fn send_control(&self, msg: &Message) -> bool {
        let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        match control.as_ref() {
            Some(tx) => tx.start_send(msg.to_frame()).is_ok(),
            None => false,
        }
    }

    fn advertised(&self) -> (String, u16) {
        (self.advertised_host.lock().unwrap_or_else(|p| p.into_inner()).clone(), self.listen_port)
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    pub(crate) fn block_on_pub<F: Future>(&self, fut: F) -> F::Output {
        self.block_on(fut)
    }

    /// Runs `fut` to completion from synchronous code, inside or outside the runtime.
    fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.handle.block_on(fut))
            }
            _ => self.handle.block_on(fut),
        }
    }
}

/// The async core of a dialog process: a cheap, cloneable handle. Most programs use the
/// synchronous [`Dialog`](crate::Dialog) on top of it; tokio programs use it directly.
///
/// ```no_run
/// # async fn run() -> Result<(), daqflow_dialog::DialogError> {
/// use daqflow_dialog::{Client, DialogConfig, ServiceEvent};
/// let addrs = daqflow_dialog::parse_control_addrs("127.0.0.1:7000")?;
/// let client = Client::start(DialogConfig::new("monitor-1", addrs)).await?;
/// let _sub = client.subscribe("ru-1/stats", |event| {
///     if let ServiceEvent::Update { data, .. } = event {
///         println!("{}", String::from_utf8_lossy(&data));
///     }
/// })?;
/// let state = client.provide("monitor-1/state").await?;
/// state.update_async(br#"{"state":"Running"}"#).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("name", &self.inner.config.name).finish()
    }
}

impl Client {
    /// Starts a dialog process on the current tokio runtime: binds its listening socket and
    /// starts connecting to the control server in the background (processes may start before
    /// the control server; see [`Client::wait_connected`]).
    pub async fn start(config: DialogConfig) -> Result<Client, DialogError> {
        if !valid_name(&config.name) {
            return Err(DialogError::InvalidName(config.name));
        }
        if config.control.is_empty() {
            return Err(DialogError::Config("no control server address".into()));
        }
        let listener = AsyncListener::bind(config.listen, config.peer_options()).await.map_err(|e| {
            DialogError::Setup { context: format!("listening on {}", config.listen), message: e.to_string() }
        })?;
        let local = listener.local_addr();
        let advertised = config.advertise_host.clone().unwrap_or_else(|| local.ip().to_string());
        let (shutdown, _) = watch::channel(false);
        let (connected, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            handle: Handle::current(),
            state: Mutex::new(State { next_sub: 1, ..State::default() }),
            control: Mutex::new(None),
            connected,
            links: Mutex::new(HashMap::new()),
            incoming: Mutex::new(HashMap::new()),
            listen_port: local.port(),
            listen_ip: local.ip(),
            advertised_host: Mutex::new(advertised),
            shutdown,
            next_request: AtomicU32::new(1),
            start_time_ns: crate::directory::wall_ns(),
            tasks: Mutex::new(Vec::new()),
            control_done: Mutex::new(None),
            command_queue: Mutex::new(None),
            problem: Mutex::new(None),
            server: Mutex::new(None),
            config,
        });
        let setup =
            |context: &str, e: std::io::Error| DialogError::Setup { context: context.into(), message: e.to_string() };
        // The control connection (handshake, heartbeats) runs on a thread of its own, so that
        // handlers that take their time never make the process look dead.
        let (done_tx, done_rx) = oneshot::channel();
        let control_rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| setup("starting the control thread", e))?;
        let for_control = inner.clone();
        std::thread::Builder::new()
            .name(format!("dialog-control-{}", inner.config.name))
            .spawn(move || {
                control_rt.block_on(control::run(for_control));
                let _ = done_tx.send(());
            })
            .map_err(|e| setup("starting the control thread", e))?;
        *inner.control_done.lock().unwrap_or_else(|p| p.into_inner()) = Some(done_rx);
        // Commands run in the order they arrive, on a thread of their own.
        let (cmd_tx, cmd_rx) = std::sync::mpsc::channel::<CommandMessage>();
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(format!("dialog-commands-{}", inner.config.name))
            .spawn(move || {
                for cmd in cmd_rx {
                    let Some(inner) = weak.upgrade() else { return };
                    let entry = inner.state().commands.get(&cmd.name).cloned();
                    drop(inner);
                    match entry {
                        Some(e) => {
                            let mut h = e.handler.lock().unwrap_or_else(|p| p.into_inner());
                            (h)(cmd);
                        }
                        None => tracing::debug!(command = %cmd.name, "command for a registration that ended"),
                    }
                }
            })
            .map_err(|e| setup("starting the command thread", e))?;
        *inner.command_queue.lock().unwrap_or_else(|p| p.into_inner()) = Some(cmd_tx);
        let tasks = vec![
            tokio::spawn(peers::accept_loop(inner.clone(), listener)),
            tokio::spawn(peers::reap_idle_links(Arc::downgrade(&inner))),
        ];
        *inner.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        Ok(Client { inner })
    }

    /// The process name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// The address peers reach this process at, as published in the directory.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.inner.listen_ip, self.inner.listen_port)
    }

    /// Whether the process is connected to a control server now.
    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// Waits until connected to a control server, at most `timeout`; returns whether it is.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.connected.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c)).await.is_ok_and(|r| r.is_ok())
    }

    /// The control server this process is connected to now (of the primary and its spares).
    pub fn control_server(&self) -> Option<SocketAddr> {
        *self.inner.server.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the last attempt to reach a control server failed, while not connected: a wrong or
    /// missing token, a refusal, or the last connection error.
    pub fn connection_problem(&self) -> Option<String> {
        if *self.inner.connected.borrow() {
            return None;
        }
        self.inner.problem.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Provides service `name`, unique in the system. Waits until the control server has
    /// accepted the registration (if no control server is reachable yet, until one is); if
    /// another live process provides it, fails with [`DialogError::ServiceTaken`] naming that
    /// process, and nothing is registered.
    pub async fn provide(&self, name: &str) -> Result<Service, DialogError> {
        self.provide_with(name, ServiceOptions::default()).await
    }

    /// [`Client::provide`] with options (what to do with subscribers that do not keep up).
    pub async fn provide_with(&self, name: &str, options: ServiceOptions) -> Result<Service, DialogError> {
        if !valid_name(name) {
            return Err(DialogError::InvalidName(name.into()));
        }
        if reserved_name(name) {
            return Err(DialogError::Reserved(name.into()));
        }
        let (tx, rx) = oneshot::channel();
        let slot = {
            let mut st = self.inner.state();
            if st.services.contains_key(name) {
                return Err(DialogError::AlreadyProvided(name.into()));
            }
            let slot = Arc::new(ServiceSlot {
                name: name.to_owned(),
                inner: Mutex::new(Provided {
                    options,
                    dropped: 0,
                    status: Status::Pending,
                    seq: 0,
                    value: None,
                    subscribers: Vec::new(),
                    waiter: Some(tx),
                }),
            });
            st.services.insert(name.to_owned(), slot.clone());
            let request = self.inner.request_id();
            st.registrations.insert(request, name.to_owned());
            self.inner.send_control(&Message::RegisterService { request, name: name.to_owned() });
            slot
        };
        let mut shutdown = self.inner.shutdown.subscribe();
        let stopped = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        let answer = tokio::select! {
            r = rx => r.unwrap_or(Err(DialogError::Shutdown)),
            _ = stopped => Err(DialogError::Shutdown),
        };
        match answer {
            Ok(()) => Ok(Service { inner: self.inner.clone(), slot }),
            Err(e) => {
                self.inner.state().services.remove(name);
                Err(e)
            }
        }
    }

    /// Subscribes to service `name`. `handler` gets the current value first, then every
    /// update, and [`ServiceEvent::Lost`] when the provider goes away. A service nobody
    /// provides yet is waited for. The handler runs on the client's threads: keep it short,
    /// or hand the work to a channel. Dropping the [`Subscription`] ends it.
    pub fn subscribe(
        &self,
        name: &str,
        handler: impl FnMut(ServiceEvent) + Send + 'static,
    ) -> Result<Subscription, DialogError> {
        if !valid_name(name) {
            return Err(DialogError::InvalidName(name.into()));
        }
        let mut key = [0u8; 16];
        getrandom::fill(&mut key).map_err(|e| DialogError::Random(e.to_string()))?;
        let mut st = self.inner.state();
        let id = st.next_sub;
        st.next_sub = st.next_sub.wrapping_add(1).max(1);
        st.subs.insert(
            id,
            Arc::new(SubEntry {
                id,
                name: name.to_owned(),
                key,
                handler: Mutex::new(Box::new(handler)),
                provider: Mutex::new(Provider::Waiting),
                generation: AtomicU64::new(0),
                pending_loss: Mutex::new(None),
            }),
        );
        self.inner.send_control(&Message::RequestService { sub: id, name: name.to_owned() });
        Ok(Subscription { inner: Arc::downgrade(&self.inner), id, name: name.to_owned() })
    }

    /// Accepts command `name` (several processes may accept the same command); `handler`
    /// runs for each one delivered. Dropping the [`CommandRegistration`] stops accepting it.
    pub fn register_command(
        &self,
        name: &str,
        handler: impl FnMut(CommandMessage) + Send + 'static,
    ) -> Result<CommandRegistration, DialogError> {
        if !valid_name(name) {
            return Err(DialogError::InvalidName(name.into()));
        }
        if reserved_name(name) {
            return Err(DialogError::Reserved(name.into()));
        }
        let mut st = self.inner.state();
        if st.commands.contains_key(name) {
            return Err(DialogError::Config(format!("command `{name}` is already registered by this process")));
        }
        st.commands.insert(name.to_owned(), Arc::new(CommandEntry { handler: Mutex::new(Box::new(handler)) }));
        self.inner.send_control(&Message::RegisterCommand { name: name.to_owned() });
        Ok(CommandRegistration { inner: Arc::downgrade(&self.inner), name: name.to_owned() })
    }

    /// Sends command `name` with `data` through the control server to every process that
    /// registered it; returns how many that was. Waits up to the configured command timeout
    /// for a control server.
    pub async fn send_command(&self, name: &str, data: impl Into<Bytes>) -> Result<u32, DialogError> {
        if !valid_name(name) {
            return Err(DialogError::InvalidName(name.into()));
        }
        let timeout = self.inner.config.command_timeout;
        let unavailable = || DialogError::ControlServerUnavailable {
            addrs: self.inner.config.control.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","),
            waited: timeout,
        };
        let data = data.into();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let connected = tokio::time::timeout_at(deadline, async {
                let mut rx = self.inner.connected.subscribe();
                let _ = rx.wait_for(|c| *c).await;
            })
            .await;
            if connected.is_err() {
                return Err(unavailable());
            }
            let (tx, rx) = oneshot::channel();
            let request = self.inner.request_id();
            {
                let mut st = self.inner.state();
                st.commands_in_flight.insert(request, tx);
                if !self.inner.send_control(&Message::SendCommand {
                    request,
                    name: name.to_owned(),
                    data: data.clone(),
                }) {
                    st.commands_in_flight.remove(&request);
                    continue;
                }
            }
            return match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(delivered)) => Ok(delivered),
                Ok(Err(_)) => Err(DialogError::ControlServerLost),
                Err(_) => {
                    self.inner.state().commands_in_flight.remove(&request);
                    Err(unavailable())
                }
            };
        }
    }

    /// The processes in the system, from the control server's `dialog/processes` service.
    pub async fn processes(&self, timeout: Duration) -> Result<Vec<ProcessInfo>, DialogError> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _sub = self.subscribe("dialog/processes", move |e| {
            if let ServiceEvent::Update { data, .. } = e {
                let _ = tx.send(data);
            }
        })?;
        let waited = tokio::time::timeout(timeout, rx.recv()).await;
        let data = match waited {
            Ok(Some(d)) => d,
            _ => {
                return Err(DialogError::ControlServerUnavailable {
                    addrs: self.inner.config.control.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","),
                    waited: timeout,
                });
            }
        };
        serde_json::from_slice(&data)
            .map_err(|e| DialogError::Setup { context: "dialog/processes".into(), message: e.to_string() })
    }

    /// Connections to peers open now (for monitoring, and to see idle ones close).
    pub fn open_links(&self) -> usize {
        peers::open_links(&self.inner)
    }

    /// Leaves the system: says goodbye to the control server and the peers, and stops every
    /// task. Services, subscriptions and commands end with it.
    pub async fn shutdown(&self) {
        if self.inner.shutdown.send_replace(true) {
            return;
        }
        peers::close_all_links(&self.inner).await;
        // Give the control thread a moment to say goodbye, then stop everything.
        let done = self.inner.control_done.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            let _ = tokio::time::timeout(Duration::from_secs(3), done).await;
        }
        self.inner.command_queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

/// A service this process provides. Dropping it stops providing it.
pub struct Service {
    inner: Arc<Inner>,
    slot: Arc<ServiceSlot>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("name", &self.slot.name).finish()
    }
}

impl Service {
    /// The service name.
    pub fn name(&self) -> &str {
        &self.slot.name
    }

    /// Number of subscribers now.
    pub fn subscriber_count(&self) -> usize {
        self.slot.lock().subscribers.len()
    }

    /// Updates of this service so far.
    pub fn seq(&self) -> u64 {
        self.slot.lock().seq
    }

    /// Updates skipped for subscribers that did not keep up (only with [`WhenFull::Fail`]).
    pub fn dropped(&self) -> u64 {
        self.slot.lock().dropped
    }

    /// Publishes a new value to every subscriber, straight from this process. Returns at once
    /// unless a subscriber's queue is full: then it waits for that subscriber (back-pressure;
    /// memory stays bounded, and a subscriber that stops reading is declared lost by the
    /// control server within its heartbeat check and dropped).
    pub fn update(&self, data: &[u8]) -> Result<(), DialogError> {
        self.update_bytes(Bytes::copy_from_slice(data))
    }

    /// [`Service::update`] without copying `data`: every subscriber's connection writes it from
    /// this memory (large values: event samples, histograms).
    pub fn update_bytes(&self, data: Bytes) -> Result<(), DialogError> {
        let waits = self.publish(data)?;
        if !waits.is_empty() {
            self.inner.block_on(wait_all(waits));
        }
        Ok(())
    }

    /// [`Service::update`] for async code.
    pub async fn update_async(&self, data: &[u8]) -> Result<(), DialogError> {
        self.update_bytes_async(Bytes::copy_from_slice(data)).await
    }

    /// [`Service::update_bytes`] for async code.
    pub async fn update_bytes_async(&self, data: Bytes) -> Result<(), DialogError> {
        let waits = self.publish(data)?;
        wait_all(waits).await;
        Ok(())
    }

    /// Queues the update on every subscriber's link, in the order of updates; returns the
    /// links that are over their bound.
    fn publish(&self, data: Bytes) -> Result<Vec<Arc<PeerLink>>, DialogError> {
        let mut p = self.slot.lock();
        if let Status::Revoked(reason) = &p.status {
            return Err(DialogError::ServiceRevoked { service: self.slot.name.clone(), reason: reason.clone() });
        }
        p.seq += 1;
        let seq = p.seq;
        p.value = Some((seq, data.clone()));
        let mut waits = Vec::new();
        let mut failed = false;
        let skip_slow = p.options.when_full == WhenFull::Fail;
        let mut skipped = 0;
        for s in &p.subscribers {
            if skip_slow && !s.link.has_room() {
                skipped += 1;
                continue;
            }
            match s.link.enqueue(Outgoing::Update { sub: s.sub, initial: false, seq, data: data.clone() }) {
                Enqueued::Ok => {}
                // A lossy service never waits: the next update finds the queue full and skips.
                Enqueued::NeedsRoom if skip_slow => {}
                Enqueued::NeedsRoom => waits.push(s.link.clone()),
                Enqueued::Failed => failed = true,
            }
        }
        p.dropped += skipped;
        if failed {
            p.subscribers.retain(|s| !s.link.is_failed());
        }
        Ok(waits)
    }
}

async fn wait_all(links: Vec<Arc<PeerLink>>) {
    for l in links {
        l.ready().await;
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let removed = {
            let mut st = self.inner.state();
            match st.services.get(&self.slot.name) {
                Some(s) if Arc::ptr_eq(s, &self.slot) => st.services.remove(&self.slot.name).is_some(),
                _ => false,
            }
        };
        if removed {
            self.inner.send_control(&Message::UnregisterService { name: self.slot.name.clone() });
        }
    }
}

/// A subscription; dropping it ends it.
pub struct Subscription {
    inner: Weak<Inner>,
    id: u32,
    name: String,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("name", &self.name).field("id", &self.id).finish()
    }
}

impl Subscription {
    /// The service subscribed to.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The provider now, if any (`control server` for `dialog/…` services).
    pub fn provider(&self) -> Option<String> {
        let inner = self.inner.upgrade()?;
        let entry = inner.state().subs.get(&self.id).cloned()?;
        let p = entry.provider().clone();
        match p {
            Provider::Waiting => None,
            Provider::ControlServer => Some("control server".into()),
            Provider::Process { name, .. } => Some(name),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else { return };
        let entry = inner.state().subs.remove(&self.id);
        inner.send_control(&Message::CancelRequest { sub: self.id });
        if let Some(entry) = entry
            && let Provider::Process { name, addr } = entry.provider().clone()
        {
            let link = peers::link(&inner, &name, addr);
            let _ = link.enqueue(Message::UnsubscribeService { sub: self.id, key: entry.key }.to_frame());
        }
    }
}

/// A registered command; dropping it stops accepting the command.
pub struct CommandRegistration {
    inner: Weak<Inner>,
    name: String,
}

impl std::fmt::Debug for CommandRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandRegistration").field("name", &self.name).finish()
    }
}

impl Drop for CommandRegistration {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else { return };
        inner.state().commands.remove(&self.name);
        inner.send_control(&Message::UnregisterCommand { name: self.name.clone() });
    }
}
