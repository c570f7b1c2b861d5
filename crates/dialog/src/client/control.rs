//! The connection to the control server: handshake, re-registration of everything after each
//! (re)connection, heartbeats both ways, and the messages the server sends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use daqflow_transport::AsyncConnection;

use super::{Inner, LostCause, Provider, ServiceEvent, Status, peers};
use crate::error::DialogError;
use crate::protocol::{Message, PROTOCOL_VERSION, RefuseReason, ServiceLocation};

/// Connects, serves, and reconnects, until shutdown.
pub(super) async fn run(inner: Arc<Inner>) {
    let mut shutdown = inner.shutdown.subscribe();
    let mut refusals = 0u32;
    // The server that went silent, if the last one did: the next connection tries the
    // addresses after it first (a stopped server accepts connections that then wait).
    let mut silent: Option<SocketAddr> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let options = inner.config.control_options();
        let order = addresses_after(&inner.config.control, silent.take());
        let connected = tokio::select! {
            c = AsyncConnection::connect_with_retry(&order, &options, &inner.config.retry) => c,
            _ = stopped(&mut shutdown) => return,
        };
        let conn = match connected {
            Ok(c) => c,
            Err(e) => {
                if let daqflow_transport::ConnectError::Auth(a) = &e {
                    // A wrong or missing token does not mend itself: say so loudly, once per try.
                    tracing::error!("the control server refused us: {a}");
                } else {
                    tracing::warn!(error = %e, "cannot reach a control server; still trying");
                }
                inner.set_problem(Some(e.to_string()));
                tokio::select! {
                    _ = tokio::time::sleep(inner.config.retry.max) => continue,
                    _ = stopped(&mut shutdown) => return,
                }
            }
        };
        let server = conn.peer_addr();
        if inner.config.advertise_host.is_none() && inner.listen_ip.is_unspecified() {
            // Listening on every interface: publish the address peers reach us at, the one
            // the control server sees.
            if let Ok(local) = conn.local_addr() {
                *inner.advertised_host.lock().unwrap_or_else(|p| p.into_inner()) = local.ip().to_string();
            }
        }
        match serve(&inner, conn, &mut shutdown).await {
            Ended::Shutdown => return,
            Ended::Refused(reason, message) => {
                inner.set_problem(Some(format!("the control server refused us: {message}")));
                refusals += 1;
                let delay = inner.config.retry.delay_after(refusals);
                match reason {
                    RefuseReason::NameTaken => {
                        tracing::warn!(%server, "control server refused us: {message}; retrying in {delay:?}")
                    }
                    _ => tracing::error!(%server, "control server refused us: {message}; retrying in {delay:?}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stopped(&mut shutdown) => return,
                }
            }
            Ended::Lost(why) => {
                refusals = 0;
                tracing::warn!(%server, "lost the control server ({why}); reconnecting (peer connections stay up)");
            }
            Ended::Silent(why) => {
                refusals = 0;
                silent = Some(server);
                tracing::warn!(%server, "lost the control server ({why}); moving to the next one (peer connections stay up)");
            }
        }
    }
}

/// The control servers in the order to try them: from the one after `silent` (a server that
/// stopped answering: tried last), else as given (the primary first).
fn addresses_after(all: &[SocketAddr], silent: Option<SocketAddr>) -> Vec<SocketAddr> {
    match silent.and_then(|s| all.iter().position(|a| *a == s)) {
        Some(i) => all[i + 1..].iter().chain(&all[..=i]).copied().collect(),
        None => all.to_vec(),
    }
}

enum Ended {
    Shutdown,
    Refused(RefuseReason, String),
    Lost(String),
    /// The server stopped answering (it may still accept connections).
    Silent(String),
}

async fn serve(inner: &Arc<Inner>, conn: AsyncConnection, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> Ended {
    let server: SocketAddr = conn.peer_addr();
    let (tx, mut rx) = conn.split();
    let (host, port) = inner.advertised();
    let _ = tx.start_send(
        Message::ConnectToControlServer {
            version: PROTOCOL_VERSION,
            name: inner.config.name.clone(),
            pid: std::process::id(),
            host,
            port,
            start_time_ns: inner.start_time_ns,
        }
        .to_frame(),
    );
    let lost_after = inner.config.lost_after;
    let first = tokio::select! {
        r = tokio::time::timeout(lost_after, rx.recv()) => r,
        _ = stopped(shutdown) => { tx.abort(); return Ended::Shutdown; }
    };
    let (heartbeat, lost_after) = match first.map(|r| r.map(|f| Message::from_frame(&f))) {
        Ok(Ok(Ok(Message::SuccessfullyConnected { heartbeat_interval_ms, lost_after_ms, server: name }))) => {
            tracing::info!(%server, server_name = %name, process = %inner.config.name, "connected to the control server");
            let hb = if heartbeat_interval_ms > 0 {
                Duration::from_millis(heartbeat_interval_ms as u64)
            } else {
                inner.config.heartbeat_interval
            };
            let lost = if lost_after_ms > 0 { Duration::from_millis(lost_after_ms as u64) } else { lost_after };
            (hb, lost.max(hb * 2))
        }
        Ok(Ok(Ok(Message::ConnectRefused { reason, message }))) => {
            tx.abort();
            return Ended::Refused(reason, message);
        }
        other => {
            tx.abort();
            if other.is_err() {
                return Ended::Silent("no answer to the handshake".to_owned());
            }
            let why = match other {
                Err(_) => "no answer to the handshake".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(Err(e))) => e.to_string(),
                Ok(Ok(Ok(m))) => format!("unexpected answer to the handshake (kind {})", m.kind()),
            };
            return Ended::Lost(why);
        }
    };
    *inner.control.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx.clone());
    *inner.server.lock().unwrap_or_else(|p| p.into_inner()) = Some(server);
    resync(inner);
    inner.set_problem(None);
    inner.connected.send_replace(true);
    let mut ticker = tokio::time::interval(heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    let mut last_heard = Instant::now();
    let mut last_tick = Instant::now();
    // With one control server only there is nowhere else to go: a silent one is waited for on
    // its connection (a stopped server that resumes finds every process where it was), and
    // meanwhile the process counts as not connected (its lease runs, commands wait).
    let alone = inner.config.control.len() == 1;
    let mut silent = false;
    let ended = loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(frame) => {
                    last_heard = Instant::now();
                    if silent {
                        silent = false;
                        tracing::info!(%server, "the control server answers again");
                        inner.set_problem(None);
                        inner.connected.send_replace(true);
                    }
                    match Message::from_frame(&frame) {
                        Ok(msg) => {
                            if let Some(why) = on_message(inner, msg).await {
                                break Ended::Lost(why);
                            }
                        }
                        Err(e) => break Ended::Lost(format!("malformed message: {e}")),
                    }
                }
                Err(e) => break Ended::Lost(e.to_string()),
            },
            _ = ticker.tick() => {
                let now = Instant::now();
                let gap = now.saturating_duration_since(last_tick);
                last_tick = now;
                if gap > heartbeat * 2 {
                    // This process did not run (stopped, or an overloaded host): what it did
                    // not hear meanwhile is its own silence, not the server's. The server gets
                    // a new grace period.
                    tracing::warn!(%server, "this process did not run for {:.1} s: the control server gets a new {lost_after:?} to be heard from", gap.as_secs_f64());
                    last_heard = last_heard.max(now);
                }
                if last_heard.elapsed() > lost_after {
                    if !alone {
                        break Ended::Silent(format!("no answer for {lost_after:?}"));
                    }
                    if !silent {
                        silent = true;
                        tracing::warn!(%server, "no answer from the control server for {lost_after:?}; it is the only one: waiting for it on this connection");
                        inner.set_problem(Some(format!("the control server {server} has not answered for {lost_after:?}")));
                        inner.connected.send_replace(false);
                    }
                }
                seq += 1;
                let _ = tx.start_send(Message::Heartbeat { seq }.to_frame());
            }
            _ = stopped(shutdown) => {
                let _ = tx.start_send(Message::Disconnect.to_frame());
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.close()).await;
                break Ended::Shutdown;
            }
        }
    };
    *inner.control.lock().unwrap_or_else(|p| p.into_inner()) = None;
    *inner.server.lock().unwrap_or_else(|p| p.into_inner()) = None;
    inner.connected.send_replace(false);
    tx.abort();
    // Commands waiting for their delivery count will not get it from this server.
    inner.state().commands_in_flight.clear();
    ended
}

/// After a (re)connection: register every service and command and request every
/// subscription again, as in a fresh start (paper IV.C).
fn resync(inner: &Inner) {
    let mut st = inner.state();
    st.registrations.clear();
    let services: Vec<String> = st.services.keys().cloned().collect();
    for name in services {
        let request = inner.request_id();
        st.registrations.insert(request, name.clone());
        inner.send_control(&Message::RegisterService { request, name });
    }
    for name in st.commands.keys() {
        inner.send_control(&Message::RegisterCommand { name: name.clone() });
    }
    for (id, entry) in &st.subs {
        inner.send_control(&Message::RequestService { sub: *id, name: entry.name.clone() });
    }
}

/// Handles one message from the control server; `Some(reason)` means: reconnect.
async fn on_message(inner: &Arc<Inner>, msg: Message) -> Option<String> {
    match msg {
        Message::HeartbeatAck { .. } => {}
        Message::ServiceRegistered { request } => {
            let slot = {
                let mut st = inner.state();
                st.registrations.remove(&request).and_then(|name| st.services.get(&name).cloned())
            };
            if let Some(slot) = slot {
                let mut p = slot.lock();
                p.status = Status::Registered;
                if let Some(w) = p.waiter.take() {
                    let _ = w.send(Ok(()));
                }
            }
        }
        Message::ServiceRefused { request, owner, owner_addr } => {
            let slot = {
                let mut st = inner.state();
                st.registrations.remove(&request).and_then(|name| st.services.get(&name).cloned())
            };
            if let Some(slot) = slot {
                let mut p = slot.lock();
                let err = DialogError::ServiceTaken { service: slot.name.clone(), owner: owner.clone(), owner_addr };
                if let Some(w) = p.waiter.take() {
                    // A `provide()` is waiting: it fails and removes the service (nothing is
                    // half-registered).
                    let _ = w.send(Err(err));
                } else {
                    tracing::error!(service = %slot.name, %owner, "after reconnecting, the service is provided by another process; this process no longer provides it");
                    p.status = Status::Revoked(format!("registered by {owner} while the control server was away"));
                    p.subscribers.clear();
                }
            }
        }
        Message::InfoService { sub, name, location } => on_info(inner, sub, name, location).await,
        Message::CommandSent { request, delivered } => {
            if let Some(tx) = inner.state().commands_in_flight.remove(&request) {
                let _ = tx.send(delivered);
            }
        }
        Message::CommandMessage { name, from, data } => {
            // Handlers run on the command thread, never here: a long `configure` must not
            // stop the heartbeats.
            let queue = inner.command_queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(q) = queue {
                let _ = q.send(super::CommandMessage { name, from, data });
            }
        }
        Message::LostSender { process, reason } => {
            let subs: Vec<_> = inner.state().subs.values().cloned().collect();
            // A provider that left cleanly flushed its last updates before saying goodbye; if
            // its connection to us is still open they are on the way: report the loss after them.
            let draining = reason == crate::protocol::LostReason::Disconnected && peers::has_incoming(inner, &process);
            for entry in subs {
                if draining {
                    entry.defer_loss(&process, reason.into());
                } else {
                    entry.lose_provider(&process, reason.into());
                }
            }
            peers::forget_peer(inner, &process);
        }
        Message::LostReceiver { process, reason } => {
            tracing::debug!(%process, %reason, "a subscriber was lost");
            peers::drop_subscriber(inner, &process);
            peers::forget_peer(inner, &process);
        }
        Message::ServiceMessage { sub, initial, seq, data } => {
            let entry = inner.state().subs.get(&sub).cloned();
            if let Some(e) = entry
                && *e.provider() == Provider::ControlServer
            {
                e.deliver(ServiceEvent::Update { data, seq, initial });
            }
        }
        Message::ConnectionLost { message } => return Some(format!("the control server says: {message}")),
        Message::NotConnected { message } => return Some(format!("the control server says: {message}")),
        other => tracing::warn!(kind = other.kind(), "unexpected message from the control server ignored"),
    }
    None
}

async fn on_info(inner: &Arc<Inner>, sub: u32, name: String, location: ServiceLocation) {
    let Some(entry) = inner.state().subs.get(&sub).cloned() else { return };
    match location {
        ServiceLocation::Process { name: provider, host, port } => {
            let addr = match resolve(&host, port).await {
                Some(a) => a,
                None => {
                    tracing::warn!(service = %name, %provider, %host, "cannot resolve the provider's host");
                    return;
                }
            };
            let current = entry.provider().clone();
            if current == (Provider::Process { name: provider.clone(), addr }) {
                // Already subscribed there (the control server restarted; the link is fine).
                return;
            }
            entry.set_provider(Provider::Process { name: provider.clone(), addr });
            let link = peers::link(inner, &provider, addr);
            let key = entry.key;
            if matches!(link.enqueue(Message::SubscribeService { sub, key, name }.to_frame()), super::Enqueued::Failed)
            {
                peers::on_link_failed(inner, &link);
            }
        }
        ServiceLocation::ControlServer => entry.set_provider(Provider::ControlServer),
        ServiceLocation::NotProvided => {
            // After a control-server restart a live provider may not have re-registered yet:
            // keep it; it is declared lost by LOST_SENDER or its connection closing.
            if !matches!(*entry.provider(), Provider::Process { .. }) {
                entry.set_provider(Provider::Waiting);
            }
        }
        ServiceLocation::Withdrawn => {
            let provider = match &*entry.provider() {
                Provider::Process { name, .. } => Some(name.clone()),
                _ => None,
            };
            match provider {
                Some(p) => {
                    entry.lose_provider(&p, LostCause::Withdrawn);
                }
                None => entry.set_provider(Provider::Waiting),
            }
        }
    }
}

async fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port)).await.ok()?.next()
}

/// Resolves once shutdown was requested.
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_server_is_tried_last() {
        let a: Vec<SocketAddr> =
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(addresses_after(&a, None), a);
        assert_eq!(addresses_after(&a, Some(a[0])), [a[1], a[2], a[0]]);
        assert_eq!(addresses_after(&a, Some(a[2])), a);
        assert_eq!(addresses_after(&a, Some("127.0.0.1:9".parse().unwrap())), a);
    }
}
