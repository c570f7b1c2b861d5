//! The open connections and what each is doing, so that a newcomer can be let in when the
//! server is full: the connection idle or incomplete the longest makes room, rather than the
//! newcomer being refused. Half-sent requests (slowloris) and idle kept-alive connections thus
//! cannot lock anyone out; the server refuses (503) only when every connection is busy with a
//! request or is an event stream of a logged-in session.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the first byte of a request (a new or kept-alive connection).
    Idle,
    /// A request has begun but not all of it has arrived.
    Reading,
    /// The server is handling a request (the backend works).
    Busy,
    /// Writing a response to the client.
    Writing,
    /// Holding back the answer to a failed login (closed first to make room: the client learns
    /// nothing it would not have learnt from the answer).
    HeldBack,
    /// An event stream; `spared` streams (of logged-in sessions) never make room.
    Stream {
        /// Never closed to make room.
        spared: bool,
    },
}

impl Phase {
    /// Whether the connection waits on its client (and may be closed to make room), and how
    /// early it is in line for that: 0 first, then 1; None never.
    fn eviction_rank(self) -> Option<u8> {
        match self {
            Phase::Idle | Phase::Reading | Phase::Writing | Phase::HeldBack => Some(0),
            Phase::Stream { spared: false } => Some(1),
            Phase::Busy | Phase::Stream { spared: true } => None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    phase: Phase,
    since: Instant,
    close: watch::Sender<bool>,
    closing: bool,
}

/// Every open connection.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    entries: HashMap<u64, Entry>,
}

/// What admitting a connection did.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The new connection's handle; None when there is no room (answer 503).
    pub conn: Option<Conn>,
    /// How many connections were told to close to make room.
    pub evicted: usize,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Map operations that cannot panic half-way: a poisoned lock still holds a consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection from `ip`. Beyond `max_idle_per_ip` idle or incomplete connections
    /// from that address, its one idle or incomplete the longest is closed; beyond `max`
    /// connections, the one idle or incomplete the longest (of any address), else the oldest
    /// unspared event stream. Without any of those, there is no room.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, max: usize, max_idle_per_ip: usize, now: Instant) -> Admission {
        let mut inner = self.lock();
        let mut evicted = 0;
        let waiting_from_ip =
            inner.entries.values().filter(|e| !e.closing && e.ip == ip && e.phase.eviction_rank() == Some(0)).count();
        if waiting_from_ip >= max_idle_per_ip.max(1) && inner.evict(|e| e.ip == ip, 0) {
            evicted += 1;
        }
        let open = inner.entries.values().filter(|e| !e.closing).count();
        if open >= max.max(1) {
            if inner.evict(|_| true, 0) || inner.evict(|_| true, 1) {
                evicted += 1;
            } else {
                return Admission { conn: None, evicted };
            }
        }
        let id = inner.next;
        inner.next += 1;
        let (close, closed) = watch::channel(false);
        inner.entries.insert(id, Entry { ip, phase: Phase::Idle, since: now, close, closing: false });
        Admission { conn: Some(Conn { id, registry: self.clone(), closed }), evicted }
    }

    /// How many connections are open (not told to close).
    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().entries.values().filter(|e| !e.closing).count()
    }
}

impl Inner {
    /// Tells the connection of rank `rank` waiting the longest among those `which` selects to
    /// close; false if there is none.
    fn evict(&mut self, which: impl Fn(&Entry) -> bool, rank: u8) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| !e.closing && e.phase.eviction_rank() == Some(rank) && which(e))
            .min_by_key(|(_, e)| e.since)
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.entries.get_mut(&id)) {
            Some(e) => {
                e.closing = true;
                e.close.send_replace(true);
                true
            }
            None => false,
        }
    }
}

/// One connection's place in the registry; dropping it removes it.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    registry: Arc<Registry>,
    closed: watch::Receiver<bool>,
}

impl Conn {
    /// Notes what the connection does from now on.
    pub fn set(&self, phase: Phase) {
        if let Some(e) = self.registry.lock().entries.get_mut(&self.id) {
            if e.phase != phase {
                e.since = Instant::now();
            }
            e.phase = phase;
        }
    }

    /// Completes when the connection was told to close to make room for another.
    pub async fn evicted(&self) {
        let mut closed = self.closed.clone();
        // The `Ref` it returns must not live across an await: drop it here. The sender lives
        // in the registry as long as this handle: an error cannot happen, but would mean close.
        let _ = closed.wait_for(|c| *c).await.map(drop);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.registry.lock().entries.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

    fn closing(c: &Conn) -> bool {
        *c.closed.borrow()
    }

    #[test]
    fn when_full_the_longest_waiting_connection_makes_room() {
        let r = Arc::new(Registry::default());
        let t = Instant::now();
        let a = r.admit(LOCAL, 3, 10, t).conn.unwrap();
        let b = r.admit(LOCAL, 3, 10, t).conn.unwrap();
        let c = r.admit(LOCAL, 3, 10, t).conn.unwrap();
        b.set(Phase::Reading);
        a.set(Phase::Busy);
        c.set(Phase::Stream { spared: true });
        let d = r.admit(LOCAL, 3, 10, t);
        assert_eq!(d.evicted, 1);
        assert!(closing(&b) && !closing(&a) && !closing(&c));
        drop(b);
        assert_eq!(r.open(), 3);
        // Busy and spared streams never make room.
        d.conn.as_ref().unwrap().set(Phase::Busy);
        let e = r.admit(LOCAL, 3, 10, t);
        assert!(e.conn.is_none());
        assert_eq!(e.evicted, 0);
    }

    #[test]
    fn an_unspared_stream_makes_room_when_nothing_waits() {
        let r = Arc::new(Registry::default());
        let t = Instant::now();
        let a = r.admit(LOCAL, 2, 10, t).conn.unwrap();
        let b = r.admit(LOCAL, 2, 10, t).conn.unwrap();
        a.set(Phase::Stream { spared: false });
        b.set(Phase::Stream { spared: true });
        let c = r.admit(LOCAL, 2, 10, t);
        assert!(c.conn.is_some() && closing(&a) && !closing(&b));
    }

    #[test]
    fn one_address_cannot_hold_more_than_its_share_of_waiting_connections() {
        let r = Arc::new(Registry::default());
        let t = Instant::now();
        let ms = Duration::from_millis;
        let other = r.admit(OTHER, 100, 2, t).conn.unwrap();
        let first = r.admit(LOCAL, 100, 2, t + ms(1)).conn.unwrap();
        let second = r.admit(LOCAL, 100, 2, t + ms(2)).conn.unwrap();
        let third = r.admit(LOCAL, 100, 2, t + ms(3));
        assert_eq!(third.evicted, 1);
        assert!(closing(&first) && !closing(&second) && !closing(&other));
    }
}
