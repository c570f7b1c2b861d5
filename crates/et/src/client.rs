//! A process on the ET system's machine: connects by the system's name, maps its shared memory,
//! and attaches to stations.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::config::{Position, StationConfig};
use crate::error::EtError;
use crate::ipc::{self, Request, Response};
use crate::local::{Backend, LocalAttachment, Returns};
use crate::monitor::Snapshot;
use crate::pool::{ATT_ACTIVE, Pool};
use crate::sys::{self, Mapping};

pub(crate) struct ClientInner {
    name: String,
    sock: Mutex<UnixStream>,
    pool: Pool,
    dead: AtomicBool,
    temps: Mutex<HashMap<u32, Weak<Mapping>>>,
    attachments: Mutex<Vec<u32>>,
    /// The events this process's attachments keep to return in groups: flushed every beat.
    returns: Mutex<Vec<Weak<Returns>>>,
}

/// A connection to an ET system running on this machine.
///
/// A heartbeat thread marks this process's attachments alive and watches the ET process: if it
/// dies, every call (also one waiting for events) returns [`EtError::SystemDead`] within about
/// 200 ms. Connect again when the system is back.
#[derive(Clone)]
pub struct EtClient {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for EtClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtClient").field("system", &self.inner.name).finish()
    }
}

impl ClientInner {
    fn call(&self, req: &Request) -> Result<(Response, Option<std::os::fd::OwnedFd>), EtError> {
        if self.dead.load(Ordering::Acquire) {
            return Err(EtError::SystemDead(self.name.clone()));
        }
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let dead = |_| {
            self.dead.store(true, Ordering::Release);
            EtError::SystemDead(self.name.clone())
        };
        ipc::send(&sock, req, None).map_err(dead)?;
        let (resp, fd) = ipc::recv::<Response>(&sock, ipc::MAX_RESPONSE).map_err(dead)?;
        match resp {
            Response::Error(e) => Err(e),
            r => Ok((r, fd)),
        }
    }

    fn mark_dead(&self) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            tracing::warn!(system = %self.name, "the ET system is gone");
            // Wake every sleeper in this process so that its call returns.
            for q in 0..self.pool.layout.max_stations + 2 {
                self.pool.queue(q).wake_all();
            }
        }
    }
}

impl Backend for ClientInner {
    fn pool(&self) -> &Pool {
        &self.pool
    }
    fn system_name(&self) -> &str {
        &self.name
    }
    fn admit_large(&self, att: u32, n: usize, size: usize) -> Result<(), EtError> {
        let req = Request::AdmitLarge { attachment: att, count: n as u64, size: size as u64 };
        self.call(&req).map(|_| ())
    }
    fn new_temp(&self, att: u32, event: u32, size: usize) -> Result<(u32, Arc<Mapping>), EtError> {
        match self.call(&Request::NewTemp { attachment: att, event, size: size as u64 })? {
            (Response::Temp { temp, size }, Some(fd)) => {
                let map = Arc::new(
                    Mapping::map_lazy(&fd, size as usize).map_err(|e| EtError::io("mapping a large event", e))?,
                );
                self.temps.lock().unwrap_or_else(|p| p.into_inner()).insert(temp, Arc::downgrade(&map));
                Ok((temp, map))
            }
            _ => Err(EtError::Protocol("unexpected answer to a large-event request".into())),
        }
    }
    fn temp(&self, id: u32) -> Result<Arc<Mapping>, EtError> {
        if let Some(m) = self.temps.lock().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(Weak::upgrade) {
            return Ok(m);
        }
        match self.call(&Request::TempFd { temp: id })? {
            (Response::Temp { size, .. }, Some(fd)) => {
                let map = Arc::new(
                    Mapping::map_lazy(&fd, size as usize).map_err(|e| EtError::io("mapping a large event", e))?,
                );
                let mut t = self.temps.lock().unwrap_or_else(|p| p.into_inner());
                t.retain(|_, w| w.strong_count() > 0);
                t.insert(id, Arc::downgrade(&map));
                Ok(map)
            }
            _ => Err(EtError::Protocol("unexpected answer to a large-event request".into())),
        }
    }
    fn detach(&self, att: u32, _generation: u32) {
        // The system's connection handler knows the generation of each attachment it made.
        self.attachments.lock().unwrap_or_else(|p| p.into_inner()).retain(|&a| a != att);
        let _ = self.call(&Request::Detach { attachment: att });
    }
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
    fn groups_returns(&self) -> bool {
        true
    }
    fn watch_returns(&self, returns: Weak<Returns>) {
        let mut r = self.returns.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|w| w.strong_count() > 0);
        r.push(returns);
    }
}

impl EtClient {
    /// Connects to the ET system named `name` on this machine.
    pub fn connect(name: &str) -> Result<EtClient, EtError> {
        let addr = ipc::address(name).map_err(|e| EtError::io("naming the ET socket", e))?;
        let sock = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => EtError::NotFound(name.into()),
            _ => EtError::io(format!("connecting to ET system {name}"), e),
        })?;
        // Who runs the system, from the kernel: anyone can bind an abstract name first.
        match sys::peer_cred(&sock) {
            Ok(owner) if owner.uid != sys::geteuid() && owner.uid != 0 => tracing::warn!(
                system = name,
                owner_uid = owner.uid,
                pid = owner.pid,
                my_uid = sys::geteuid(),
                "the ET system is run by another user"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(system = name, error = %e, "no credentials of the ET process"),
        }
        // A system that refuses this user answers with the reason and closes the connection,
        // possibly before the hello is written: its answer is read all the same.
        let sent = ipc::send(&sock, &Request::Hello { pid: sys::getpid() }, None);
        let (resp, fd) = match ipc::recv::<Response>(&sock, ipc::MAX_RESPONSE) {
            Ok(r) => r,
            Err(e) => {
                let e = sent.err().unwrap_or(e);
                return Err(match e.kind() {
                    std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionReset => EtError::NotFound(name.into()),
                    std::io::ErrorKind::InvalidData => EtError::Protocol(format!("greeting ET system {name}: {e}")),
                    _ => EtError::io(format!("greeting ET system {name}"), e),
                });
            }
        };
        let (pool_len, fd) = match (resp, fd) {
            (Response::Error(e), _) => return Err(e),
            (Response::Hello { pool_len, .. }, Some(fd)) => (pool_len, fd),
            _ => return Err(EtError::Protocol("the ET system did not send its memory".into())),
        };
        let len = sys::file_len(&fd).map_err(|e| EtError::io("sizing the shared memory", e))?;
        if len != pool_len {
            return Err(EtError::Protocol(format!("the shared memory is {len} bytes, the system says {pool_len}")));
        }
        let map = Mapping::map(&fd, len as usize).map_err(|e| EtError::io("mapping the shared memory", e))?;
        let pool = Pool::open(map).map_err(|e| EtError::Protocol(e.to_string()))?;
        let inner = Arc::new(ClientInner {
            name: name.to_owned(),
            sock: Mutex::new(sock),
            pool,
            dead: AtomicBool::new(false),
            temps: Mutex::default(),
            attachments: Mutex::default(),
            returns: Mutex::default(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("et-heartbeat".into())
            .spawn(move || heartbeat(weak))
            .map_err(|e| EtError::io("starting the heartbeat thread", e))?;
        Ok(EtClient { inner })
    }

    /// Attaches to a station (`GRAND_CENTRAL` for a producer).
    pub fn attach(&self, station: &str) -> Result<LocalAttachment, EtError> {
        match self.inner.call(&Request::Attach { station: station.into() })? {
            (Response::Attached { attachment, station: slot }, _) => {
                self.inner.attachments.lock().unwrap_or_else(|p| p.into_inner()).push(attachment);
                Ok(LocalAttachment::new(self.inner.clone(), attachment, slot, station.to_owned()))
            }
            _ => Err(EtError::Protocol("unexpected answer to attach".into())),
        }
    }

    /// Creates a station (the selection cannot be a closure from another process).
    pub fn create_station(&self, name: &str, config: StationConfig, position: Position) -> Result<(), EtError> {
        if matches!(config.selection, crate::Selection::Closure(_)) {
            return Err(EtError::Refused(
                "a closure selection needs the station to be created in the ET system's process".into(),
            ));
        }
        self.inner.call(&Request::CreateStation { name: name.into(), config, position }).map(|_| ())
    }

    /// Removes a station without attachments.
    pub fn remove_station(&self, name: &str) -> Result<(), EtError> {
        self.inner.call(&Request::RemoveStation { name: name.into() }).map(|_| ())
    }

    /// Changes a station's configuration while it runs.
    pub fn configure_station(&self, name: &str, config: StationConfig) -> Result<(), EtError> {
        if matches!(config.selection, crate::Selection::Closure(_)) {
            return Err(EtError::Refused(
                "a closure selection needs the station to be configured in the ET system's process".into(),
            ));
        }
        self.inner.call(&Request::Configure { name: name.into(), config }).map(|_| ())
    }

    /// The system's state now.
    pub fn snapshot(&self) -> Result<Snapshot, EtError> {
        match self.inner.call(&Request::Status)? {
            (Response::Status(s), _) => Ok(*s),
            _ => Err(EtError::Protocol("unexpected answer to status".into())),
        }
    }

    /// Whether the ET system is gone.
    pub fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

/// Marks this process's attachments alive, and notices the ET process dying.
fn heartbeat(client: Weak<ClientInner>) {
    let mut last_beat = None;
    let mut still = 0u32;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Some(c) = client.upgrade() else { return };
        if c.dead.load(Ordering::Acquire) {
            return;
        }
        for &a in c.attachments.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let rec = c.pool.attachment(a);
            if rec.state.load(Ordering::Acquire) == ATT_ACTIVE {
                rec.heartbeat.fetch_add(1, Ordering::Release);
            }
        }
        // Events put back to GrandCentral wait at most one beat for their group.
        let returns: Vec<Arc<Returns>> =
            c.returns.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
        for r in returns {
            r.flush(&c.pool);
        }
        // The control socket closes when the ET process exits: poll it for a hang-up.
        let hung_up = {
            let sock = match c.sock.try_lock() {
                Ok(s) => s.try_clone().ok(),
                Err(_) => None,
            };
            sock.is_some_and(|s| {
                let fds = [s.as_fd()];
                let mut p =
                    libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&fds[0]), events: libc::POLLRDHUP, revents: 0 };
                // SAFETY: one valid pollfd on our stack; zero timeout.
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
            })
        };
        let h = c.pool.header();
        let stopped = h.state.load(Ordering::Acquire) == 2;
        let beat = h.heartbeat.load(Ordering::Acquire);
        still = if last_beat == Some(beat) { still + 1 } else { 0 };
        last_beat = Some(beat);
        let pid_gone = !sys::pid_alive(h.et_pid.load(Ordering::Acquire));
        // A system that stops heartbeating for 3 s is stuck: treat it as gone.
        if hung_up || stopped || pid_gone || still > 30 {
            c.mark_dead();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn a_refusal_by_the_et_system_is_reported_as_sent() {
        let name = format!("refusing-{}", std::process::id());
        let listener = UnixListener::bind_addr(&ipc::address(&name).unwrap()).unwrap();
        let server = std::thread::spawn(move || {
            // As the ET process refuses a stranger: the reason at once, nothing read, closed.
            let (conn, _) = listener.accept().unwrap();
            let e = EtError::AccessDenied { name: "refusing".into(), owner: 1000, uid: 65534 };
            ipc::send(&conn, &Response::Error(e), None).unwrap();
        });
        let e = EtClient::connect(&name).unwrap_err();
        server.join().unwrap();
        assert!(matches!(e, EtError::AccessDenied { owner: 1000, uid: 65534, .. }), "{e:?}");
        assert!(e.to_string().contains("daqflow et start --allow-uid 65534"), "{e}");
    }

    #[test]
    fn a_socket_that_closes_without_answering_is_no_et_system() {
        let name = format!("silent-{}", std::process::id());
        let listener = UnixListener::bind_addr(&ipc::address(&name).unwrap()).unwrap();
        let server = std::thread::spawn(move || drop(listener.accept().unwrap()));
        assert!(matches!(EtClient::connect(&name), Err(EtError::NotFound(n)) if n == name));
        server.join().unwrap();
    }
}
