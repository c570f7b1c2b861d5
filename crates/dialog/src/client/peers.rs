//! Connections between processes: the direct data path.
//!
//! As in the paper, a connection carries messages in one direction: a process that has
//! something to send to a peer opens a connection to the peer's listening socket, starts it
//! with `PEER_HELLO`, and keeps it open until it has been idle for the idle timeout (then it
//! says `PEER_BYE` and closes it); the next message opens it again. Between two processes there
//! are thus zero, one or two connections. A provider sends `SERVICE_MESSAGE`s on its connection
//! to the subscriber; a subscriber sends `SUBSCRIBE_SERVICE` on its connection to the provider.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use daqflow_transport::{AsyncConnection, AsyncListener, FrameReceiver, FrameSender, RetryPolicy, SendError};
use daqflow_wire::frame::{FRAME_HEADER_LEN, Frame, FrameLimits};
use tokio::sync::Notify;

use super::{Inner, LostCause, Provider, ServiceEvent, Status, SubEntry, Subscriber};
use crate::protocol::{Message, PROTOCOL_VERSION, SubscriptionKey};

/// A peer: its name and listening address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
}

/// A message waiting for a peer.
pub(crate) enum Outgoing {
    /// Any protocol message.
    Frame(Frame),
    /// A service value: sent with its sequence number as a prefix, the data from its own memory.
    Update { sub: u32, initial: bool, seq: u64, data: Bytes },
}

impl From<Frame> for Outgoing {
    fn from(f: Frame) -> Self {
        Outgoing::Frame(f)
    }
}

impl Outgoing {
    fn wire_len(&self) -> usize {
        match self {
            Outgoing::Frame(f) => f.wire_len(),
            Outgoing::Update { data, .. } => FRAME_HEADER_LEN + 8 + data.len(),
        }
    }

    /// Queues on `tx`; `Ok(room)`, or the message back (as a frame) if the connection closed.
    fn send(self, tx: &FrameSender) -> Result<bool, Outgoing> {
        let r = match self {
            Outgoing::Frame(f) => tx.start_send(f),
            Outgoing::Update { sub, initial, seq, data } => tx.start_send_prefixed(
                crate::protocol::kind::SERVICE_MESSAGE,
                if initial { crate::protocol::FLAG_INITIAL } else { 0 },
                sub,
                &seq.to_le_bytes(),
                data,
            ),
        };
        r.map_err(|e: SendError| match e.into_frame() {
            Some(f) => Outgoing::Frame(f),
            None => Outgoing::Frame(Frame::default()),
        })
    }
}

enum LinkState {
    /// Not connected; the next message opens a connection.
    Down,
    /// Opening a connection; messages wait here, in order.
    Connecting { pending: VecDeque<Outgoing>, bytes: usize },
    /// Open.
    Up(FrameSender),
    /// The peer cannot be reached (or is gone); the link is dropped.
    Failed,
}

struct LinkInner {
    state: LinkState,
    /// Reaper passes since the link was last used.
    idle_passes: u32,
    /// The peer's subscriptions to our services and their keys: proven (`SUBSCRIPTION_PROOF`)
    /// first on every connection the link opens, before any value.
    grants: HashMap<u32, SubscriptionKey>,
}

/// The outgoing connection to one peer.
pub(crate) struct PeerLink {
    pub(crate) key: PeerKey,
    inner: Mutex<LinkInner>,
    changed: Notify,
    client: Weak<Inner>,
}

/// What [`PeerLink::enqueue`] did.
pub(crate) enum Enqueued {
    /// Queued.
    Ok,
    /// Queued, and the queue is over its bound: wait for [`PeerLink::ready`].
    NeedsRoom,
    /// The peer is unreachable; the message was dropped.
    Failed,
}

impl PeerLink {
    fn lock(&self) -> MutexGuard<'_, LinkInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bound(&self) -> usize {
        self.client.upgrade().map_or(8 << 20, |c| c.config.connection.send_queue_bytes)
    }

    /// Queues a message for the peer, opening the connection if needed. Never waits: messages
    /// queued by one caller under its own lock keep that order.
    pub(crate) fn enqueue(self: &Arc<Self>, item: impl Into<Outgoing>) -> Enqueued {
        let mut frame = item.into();
        let mut l = self.lock();
        l.idle_passes = 0;
        if let LinkState::Up(tx) = &l.state {
            match frame.send(tx) {
                Ok(true) => return Enqueued::Ok,
                Ok(false) => return Enqueued::NeedsRoom,
                Err(back) => {
                    // The connection closed under us: open a new one and resend this message.
                    frame = back;
                    l.state = LinkState::Down;
                }
            }
        }
        match &mut l.state {
            LinkState::Down => {
                let bytes = frame.wire_len();
                l.state = LinkState::Connecting { pending: VecDeque::from([frame]), bytes };
                drop(l);
                // Called from user threads too: spawn on the client's runtime explicitly.
                match self.client.upgrade() {
                    Some(inner) => {
                        inner.handle.spawn(connect(self.clone()));
                        Enqueued::Ok
                    }
                    None => Enqueued::Failed,
                }
            }
            LinkState::Connecting { pending, bytes } => {
                *bytes += frame.wire_len();
                pending.push_back(frame);
                if *bytes > self.bound() { Enqueued::NeedsRoom } else { Enqueued::Ok }
            }
            LinkState::Failed => Enqueued::Failed,
            LinkState::Up(_) => unreachable!("handled above"),
        }
    }

    /// Waits until the queue to the peer is below its bound, or the link failed or closed.
    pub(crate) async fn ready(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let sender = {
                let l = self.lock();
                match &l.state {
                    LinkState::Up(tx) => Some(tx.clone()),
                    LinkState::Connecting { bytes, .. } if *bytes > self.bound() => None,
                    _ => return,
                }
            };
            match sender {
                Some(tx) => {
                    tokio::select! {
                        _ = tx.ready() => return,
                        _ = &mut changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Whether the queue to the peer is below its bound.
    pub(crate) fn has_room(&self) -> bool {
        match &self.lock().state {
            LinkState::Up(tx) => tx.has_room(),
            LinkState::Connecting { bytes, .. } => *bytes <= self.bound(),
            LinkState::Down | LinkState::Failed => true,
        }
    }

    /// Records the peer's subscription `sub` with its `key` and queues its proof: on this
    /// connection now, and first on every later one.
    pub(crate) fn grant(self: &Arc<Self>, sub: u32, key: SubscriptionKey) -> Enqueued {
        self.lock().grants.insert(sub, key);
        self.enqueue(Message::SubscriptionProof { sub, key }.to_frame())
    }

    /// Forgets the peer's subscription `sub` (no more proofs of it).
    pub(crate) fn revoke(&self, sub: u32) {
        self.lock().grants.remove(&sub);
    }

    pub(crate) fn is_failed(&self) -> bool {
        matches!(self.lock().state, LinkState::Failed)
    }

    fn is_up(&self) -> bool {
        matches!(self.lock().state, LinkState::Up(_))
    }

    /// Closes the connection at once and marks the link failed (the peer is gone).
    fn abort(&self) {
        let old = std::mem::replace(&mut self.lock().state, LinkState::Failed);
        if let LinkState::Up(tx) = old {
            tx.abort();
        }
        self.changed.notify_waiters();
    }
}

/// The link to peer `name` at `addr`, created if needed.
pub(crate) fn link(inner: &Arc<Inner>, name: &str, addr: SocketAddr) -> Arc<PeerLink> {
    let key = PeerKey { name: name.to_owned(), addr };
    let mut links = inner.links.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = links.get(&key)
        && !l.is_failed()
    {
        return l.clone();
    }
    let l = Arc::new(PeerLink {
        key: key.clone(),
        inner: Mutex::new(LinkInner { state: LinkState::Down, idle_passes: 0, grants: HashMap::new() }),
        changed: Notify::new(),
        client: Arc::downgrade(inner),
    });
    links.insert(key, l.clone());
    l
}

async fn connect(link: Arc<PeerLink>) {
    let Some(inner) = link.client.upgrade() else { return };
    // A few quick attempts: a peer that is up answers at once; one that is gone is reported.
    let policy = RetryPolicy {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(500),
        max_attempts: Some(4),
        deadline: None,
        multiplier: 3.0,
    };
    let result = AsyncConnection::connect_with_retry(&[link.key.addr], &inner.config.peer_options(), &policy).await;
    match result {
        Ok(conn) => {
            let (tx, rx) = conn.split();
            let (host, port) = inner.advertised();
            let _ = tx.start_send(
                Message::PeerHello { version: PROTOCOL_VERSION, name: inner.config.name.clone(), host, port }
                    .to_frame(),
            );
            {
                let mut l = link.lock();
                if matches!(l.state, LinkState::Connecting { .. }) {
                    // The proofs of the peer's subscriptions come before any value.
                    for (&sub, &key) in &l.grants {
                        let _ = tx.start_send(Message::SubscriptionProof { sub, key }.to_frame());
                    }
                }
                if let LinkState::Connecting { pending, .. } = &mut l.state {
                    for f in pending.drain(..) {
                        let _ = f.send(&tx);
                    }
                    l.state = LinkState::Up(tx.clone());
                } else {
                    // Aborted while connecting.
                    tx.abort();
                    return;
                }
            }
            link.changed.notify_waiters();
            tracing::debug!(peer = %link.key.name, addr = %link.key.addr, "connection to peer opened");
            inner.handle.spawn(watch_outgoing(link, tx, rx));
        }
        Err(e) => {
            tracing::warn!(peer = %link.key.name, addr = %link.key.addr, error = %e, "peer unreachable");
            let old = std::mem::replace(&mut link.lock().state, LinkState::Failed);
            drop(old);
            link.changed.notify_waiters();
            on_link_failed(&inner, &link);
        }
    }
}

/// Reads what the peer sends back on our connection (only `NOT_CONNECTED`, if it refuses us)
/// and notices when it closes.
async fn watch_outgoing(link: Arc<PeerLink>, tx: FrameSender, mut rx: FrameReceiver) {
    while let Ok(frame) = rx.recv().await {
        if let Ok(Message::NotConnected { message }) = Message::from_frame(&frame) {
            tracing::warn!(peer = %link.key.name, "peer refused our connection: {message}");
        }
    }
    let mut l = link.lock();
    if let LinkState::Up(current) = &l.state
        && current.same_connection(&tx)
    {
        l.state = LinkState::Down;
    }
    drop(l);
    tx.abort();
    link.changed.notify_waiters();
}

/// A peer is unreachable: drop its subscriptions to our services, and treat it as lost where
/// it was our provider (the subscription waits for the control server to name a provider; we
/// ask again shortly, in case it still names the dead one).
pub(crate) fn on_link_failed(inner: &Arc<Inner>, link: &Arc<PeerLink>) {
    inner.links.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, l| !Arc::ptr_eq(l, link));
    let (slots, subs): (Vec<_>, Vec<_>) = {
        let st = inner.state();
        (st.services.values().cloned().collect(), st.subs.values().cloned().collect())
    };
    for slot in slots {
        slot.lock().subscribers.retain(|s| !Arc::ptr_eq(&s.link, link));
    }
    for entry in subs {
        let was_provider = matches!(&*entry.provider(), Provider::Process { name, addr } if *name == link.key.name && *addr == link.key.addr);
        if was_provider {
            entry.lose_provider(&link.key.name, LostCause::Unreachable);
            let inner2 = inner.clone();
            let (id, name) = (entry.id, entry.name.clone());
            inner.handle.spawn(async move {
                let inner = inner2;
                tokio::time::sleep(Duration::from_secs(1)).await;
                if inner.state().subs.contains_key(&id) {
                    inner.send_control(&Message::RequestService { sub: id, name });
                }
            });
        }
    }
}

/// Forgets the links to a process the control server declared lost.
pub(crate) fn forget_peer(inner: &Arc<Inner>, name: &str) {
    let gone: Vec<Arc<PeerLink>> = {
        let mut links = inner.links.lock().unwrap_or_else(|p| p.into_inner());
        let keys: Vec<PeerKey> = links.keys().filter(|k| k.name == name).cloned().collect();
        keys.into_iter().filter_map(|k| links.remove(&k)).collect()
    };
    for l in gone {
        l.abort();
    }
}

/// Removes every subscription of process `name` from our services.
pub(crate) fn drop_subscriber(inner: &Arc<Inner>, name: &str) {
    let slots: Vec<_> = inner.state().services.values().cloned().collect();
    for slot in slots {
        slot.lock().subscribers.retain(|s| {
            if s.process == name {
                s.link.revoke(s.sub);
            }
            s.process != name
        });
    }
}

/// Open outgoing connections.
pub(crate) fn open_links(inner: &Arc<Inner>) -> usize {
    inner.links.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|l| l.is_up()).count()
}

/// Says goodbye on every open link and closes it (on shutdown).
pub(crate) async fn close_all_links(inner: &Arc<Inner>) {
    let links: Vec<Arc<PeerLink>> =
        inner.links.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, l)| l).collect();
    let mut closing = Vec::new();
    for l in links {
        let old = std::mem::replace(&mut l.lock().state, LinkState::Failed);
        if let LinkState::Up(tx) = old {
            let _ = tx.start_send(Message::PeerBye.to_frame());
            closing.push(tx);
        }
        l.changed.notify_waiters();
    }
    // Deliver what was published before leaving (bounded, for a peer that stopped reading).
    let all = async {
        for tx in &closing {
            let _ = tx.close().await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), all).await;
    for tx in closing {
        tx.abort();
    }
}

/// Closes links unused for the idle timeout (paper: "the socket is closed by timeout").
pub(crate) async fn reap_idle_links(inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(i) => (i.config.idle_timeout / 4).max(Duration::from_millis(5)),
        None => return,
    };
    let mut ticker = tokio::time::interval(period);
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let links: Vec<Arc<PeerLink>> =
            inner.links.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for l in links {
            let mut g = l.lock();
            g.idle_passes += 1;
            if g.idle_passes < 4 {
                continue;
            }
            if let LinkState::Up(tx) = &g.state
                && tx.queued_bytes() == 0
            {
                let tx = tx.clone();
                g.state = LinkState::Down;
                drop(g);
                tracing::debug!(peer = %l.key.name, "closing idle connection to peer");
                let _ = tx.start_send(Message::PeerBye.to_frame());
                inner.handle.spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(2), tx.close()).await;
                    tx.abort();
                });
            }
        }
    }
}

/// Accepts the connections peers open to us.
pub(crate) async fn accept_loop(inner: Arc<Inner>, listener: AsyncListener) {
    let weak = Arc::downgrade(&inner);
    drop(inner);
    loop {
        match listener.accept().await {
            Ok(conn) => {
                tokio::spawn(serve_incoming(weak.clone(), conn));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a peer connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if weak.strong_count() == 0 {
            return;
        }
    }
}

struct Hello {
    name: String,
    addr: Option<SocketAddr>,
}

/// What a peer may send once it said hello: service values up to the connection's maximum,
/// every other message small.
fn peer_limits(inner: &Inner) -> FrameLimits {
    FrameLimits::uniform(64 << 10)
        .with_kind(crate::protocol::kind::SERVICE_MESSAGE, inner.config.connection.max_frame_bytes)
}

/// Serves one incoming connection: the peer's subscriptions to our services, and the updates
/// of services we subscribe to. The transport's handshake has proven the system token (if one
/// is set); until `PEER_HELLO` the connection takes only small frames.
///
/// A `PEER_HELLO` only claims a name. A value is taken for a subscription only once this
/// connection has proven the subscription's key (`SUBSCRIPTION_PROOF`), which went only to the
/// provider the control server named, on the connection we opened to its address: a process
/// naming itself after another cannot make us take a value, nor make us drop or re-ask a
/// subscription.
async fn serve_incoming(inner: Weak<Inner>, conn: AsyncConnection) {
    let from = conn.peer_addr();
    let (tx, mut rx) = conn.split();
    let mut hello: Option<Hello> = None;
    // The subscriptions this connection proved, with the key it proved.
    let mut proven: HashMap<u32, SubscriptionKey> = HashMap::new();
    // The subscriptions to our services the peer made on this connection.
    let mut subscribed: Vec<u32> = Vec::new();
    // Values refused for want of a proof (said once per connection).
    let mut refused: u64 = 0;
    let mut cache: HashMap<u32, (Arc<SubEntry>, u64)> = HashMap::new();
    // A connection usually carries one subscription: remember the last one.
    let mut last: Option<(u32, Arc<SubEntry>, u64)> = None;
    let mut said_bye = false;
    loop {
        let frame = match rx.recv().await {
            Ok(f) => f,
            Err(e) => {
                if !e.is_clean_close() {
                    tracing::debug!(%from, error = %e, "peer connection ended");
                }
                break;
            }
        };
        if frame.kind == crate::protocol::kind::SERVICE_MESSAGE
            && frame.payload.len() >= 8
            && let Some(peer) = &hello
        {
            // The hot path: decode in place (no copy, no extra reference count).
            if let Some((sub, e, generation)) = &last
                && *sub == frame.channel
                && e.generation.load(Ordering::Acquire) == *generation
            {
                let (seq, data, initial) = split_service_message(frame);
                e.deliver(ServiceEvent::Update { data, seq, initial });
                continue;
            }
            let Some(inner) = inner.upgrade() else { return };
            let sub = frame.channel;
            let entry = match cache.get(&sub) {
                Some((e, generation)) if e.generation.load(Ordering::Acquire) == *generation => {
                    Some((e.clone(), *generation))
                }
                _ => {
                    let e = inner.state().subs.get(&sub).cloned();
                    match e {
                        Some(e) => {
                            let generation = e.generation.load(Ordering::Acquire);
                            if proven.get(&sub) == Some(&e.key) && e.accepts_from(&peer.name) {
                                cache.insert(sub, (e.clone(), generation));
                                Some((e, generation))
                            } else {
                                cache.remove(&sub);
                                None
                            }
                        }
                        None => {
                            cache.remove(&sub);
                            None
                        }
                    }
                }
            };
            if let Some((e, generation)) = entry {
                let (seq, data, initial) = split_service_message(frame);
                e.deliver(ServiceEvent::Update { data, seq, initial });
                last = Some((sub, e, generation));
            } else {
                last = None;
                if !proven.contains_key(&sub) {
                    refused += 1;
                    if refused == 1 {
                        tracing::warn!(%from, peer = %peer.name, sub, "values for a subscription this connection has not proven (a sender naming itself `{}` that is not the provider the control server named): ignored", peer.name);
                    }
                }
            }
            continue;
        }
        let Some(inner) = inner.upgrade() else { return };
        let msg = match Message::from_frame(&frame) {
            Ok(m) => m,
            Err(e) => {
                match crate::protocol::other_version(&frame) {
                    Some(version) => tracing::warn!(
                        %from,
                        version,
                        "closing peer connection: the peer speaks protocol version {version}, this process {}",
                        crate::protocol::PROTOCOL_VERSION
                    ),
                    None => tracing::warn!(%from, error = %e, "closing peer connection: malformed message"),
                }
                break;
            }
        };
        let Some(peer) = &hello else {
            match msg {
                Message::PeerHello { version, name, host, port } => {
                    if !crate::protocol::valid_name(&name) {
                        tracing::warn!(%from, "peer hello with an invalid name refused");
                        let _ =
                            tx.start_send(Message::NotConnected { message: "invalid process name".into() }.to_frame());
                        let _ = tokio::time::timeout(Duration::from_secs(1), tx.close()).await;
                        return;
                    }
                    rx.set_frame_limits(peer_limits(&inner));
                    if version != PROTOCOL_VERSION {
                        tracing::warn!(%from, peer = %name, version, "peer speaks another protocol version");
                    }
                    let addr = host.parse::<std::net::IpAddr>().ok().map(|ip| SocketAddr::new(ip, port));
                    *inner.incoming.lock().unwrap_or_else(|p| p.into_inner()).entry(name.clone()).or_default() += 1;
                    hello = Some(Hello { name, addr });
                }
                other => {
                    // Paper fig. 3: ignored, and answered "not connected".
                    tracing::debug!(%from, kind = other.kind(), "message before PEER_HELLO ignored");
                    let _ = tx.start_send(
                        Message::NotConnected { message: "not connected: start with PEER_HELLO".into() }.to_frame(),
                    );
                }
            }
            continue;
        };
        match msg {
            Message::ServiceMessage { .. } => {
                // Shorter than its sequence number: malformed.
                tracing::warn!(peer = %peer.name, "closing peer connection: malformed service message");
                break;
            }
            Message::SubscribeService { sub, key, name } => {
                if !subscribed.contains(&sub) {
                    subscribed.push(sub);
                }
                on_subscribe(&inner, peer, sub, key, name)
            }
            Message::UnsubscribeService { sub, key } => {
                let slots: Vec<_> = inner.state().services.values().cloned().collect();
                for slot in slots {
                    slot.lock().subscribers.retain(|s| {
                        let gone = s.process == peer.name && s.sub == sub && s.key == key;
                        if gone {
                            s.link.revoke(sub);
                        }
                        !gone
                    });
                }
            }
            Message::SubscriptionProof { sub, key } => {
                let entry = inner.state().subs.get(&sub).cloned();
                match entry {
                    Some(e) if e.key == key => {
                        proven.insert(sub, key);
                    }
                    Some(e) => {
                        tracing::warn!(%from, peer = %peer.name, service = %e.name, "a wrong key for our subscription: none of its values is taken from this connection");
                        // Our provider holds another key (someone subscribed in our name):
                        // give it ours again.
                        if let Provider::Process { name, addr } = e.provider().clone()
                            && name == peer.name
                        {
                            let _ = link(&inner, &name, addr).enqueue(
                                Message::SubscribeService { sub, key: e.key, name: e.name.clone() }.to_frame(),
                            );
                        }
                    }
                    None => {}
                }
            }
            Message::ServiceUnknown { sub, key, name } => {
                let entry = inner.state().subs.get(&sub).cloned().filter(|e| e.key == key);
                if let Some(e) = entry {
                    tracing::debug!(service = %name, peer = %peer.name, "provider does not know the service; asking the control server again");
                    e.set_provider(Provider::Waiting);
                    let inner2 = inner.clone();
                    inner.handle.spawn(async move {
                        let inner = inner2;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        if inner.state().subs.contains_key(&sub) {
                            inner.send_control(&Message::RequestService { sub, name });
                        }
                    });
                }
            }
            Message::PeerBye => said_bye = true,
            other => {
                tracing::debug!(peer = %peer.name, kind = other.kind(), "unexpected message on a peer connection ignored")
            }
        }
    }
    // The connection closed. Losses deferred until its updates were delivered are reported
    // now. Without a goodbye, the peer died: where it was our provider, tell the subscription
    // now (the control server will confirm); drop the subscriptions it made here. Only a
    // connection that proved a subscription speaks for its provider.
    if let (Some(peer), Some(inner)) = (hello, inner.upgrade()) {
        if refused > 1 {
            tracing::warn!(%from, peer = %peer.name, refused, "values refused on this connection for want of a proof");
        }
        {
            let mut incoming = inner.incoming.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = incoming.get_mut(&peer.name) {
                *n -= 1;
                if *n == 0 {
                    incoming.remove(&peer.name);
                }
            }
        }
        let subs: Vec<_> = inner.state().subs.values().filter(|e| proven.get(&e.id) == Some(&e.key)).cloned().collect();
        for entry in &subs {
            entry.report_deferred_loss(&peer.name);
        }
        if !said_bye {
            for entry in subs {
                entry.lose_provider(&peer.name, LostCause::ConnectionClosed);
            }
            let slots: Vec<_> = inner.state().services.values().cloned().collect();
            for slot in slots {
                slot.lock().subscribers.retain(|s| {
                    let gone = s.process == peer.name && subscribed.contains(&s.sub);
                    if gone {
                        s.link.revoke(s.sub);
                    }
                    !gone
                });
            }
        }
    }
}

/// A `SERVICE_MESSAGE` frame (at least 8 bytes) as (seq, data, initial), without copying.
fn split_service_message(frame: Frame) -> (u64, bytes::Bytes, bool) {
    use bytes::Buf;
    let initial = frame.flags & crate::protocol::FLAG_INITIAL != 0;
    let mut data = frame.payload;
    let seq = data.get_u64_le();
    (seq, data, initial)
}

/// Whether process `name` has a connection to us open now.
pub(crate) fn has_incoming(inner: &Inner, name: &str) -> bool {
    inner.incoming.lock().unwrap_or_else(|p| p.into_inner()).contains_key(name)
}

fn on_subscribe(inner: &Arc<Inner>, peer: &Hello, sub: u32, key: SubscriptionKey, name: String) {
    let Some(addr) = peer.addr else {
        tracing::warn!(peer = %peer.name, "subscription from a peer without a usable address ignored");
        return;
    };
    let slot = inner.state().services.get(&name).cloned();
    let link = link(inner, &peer.name, addr);
    let Some(slot) = slot else {
        let _ = link.enqueue(Message::ServiceUnknown { sub, key, name }.to_frame());
        return;
    };
    let mut p = slot.lock();
    if matches!(p.status, Status::Revoked(_)) {
        drop(p);
        let _ = link.enqueue(Message::ServiceUnknown { sub, key, name }.to_frame());
        return;
    }
    p.subscribers.retain(|s| !(s.process == peer.name && s.sub == sub));
    p.subscribers.push(Subscriber { process: peer.name.clone(), sub, key, link: link.clone() });
    // The proof first: the subscriber takes no value of this subscription before it.
    let _ = link.grant(sub, key);
    if let Some((seq, data)) = &p.value {
        // The current value first; later updates are queued after it under the same lock.
        let _ = link.enqueue(Outgoing::Update { sub, initial: true, seq: *seq, data: data.clone() });
    }
    tracing::debug!(service = %name, subscriber = %peer.name, "subscriber added");
}
