//! Finding an ET system by name: a UDP query, broadcast or sent to given hosts, answered by the
//! system of that name with the address of its remote-access server.
//!
//! Query: `DQET?` + name. Answer: `DQET!` + u16 port (little-endian) + u8 length + the server's
//! IP as text (`0.0.0.0` when it listens on every interface: then use the answer's source
//! address) + name. Several systems may share a port: each answers only its own name (a
//! broadcast query reaches them all; a unicast one only the last bound, so prefer broadcast).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::EtError;
use crate::system::SystemInner;

const QUERY: &[u8] = b"DQET?";
const ANSWER: &[u8] = b"DQET!";

/// The default places a query is sent: the local broadcast address and this host.
pub fn default_targets() -> Vec<IpAddr> {
    vec![IpAddr::V4(Ipv4Addr::BROADCAST), IpAddr::V4(Ipv4Addr::LOCALHOST)]
}

/// Binds the discovery socket; several ET systems on one machine share the port (every one
/// receives broadcast queries and answers only its own name).
pub(crate) fn bind(port: u16) -> Result<UdpSocket, EtError> {
    let err = |e| EtError::io(format!("binding the discovery port {port}"), e);
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    s.set_reuse_address(true).map_err(err)?;
    s.set_broadcast(true).map_err(err)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into()).map_err(err)?;
    let u: UdpSocket = s.into();
    u.set_read_timeout(Some(Duration::from_millis(200))).map_err(err)?;
    Ok(u)
}

/// Answers queries for this system's name until it stops.
pub(crate) fn answer(system: Weak<SystemInner>, sock: UdpSocket) {
    let mut buf = [0u8; 512];
    loop {
        let Some(s) = system.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(_) => continue,
        };
        let Some(name) = buf[..n].strip_prefix(QUERY) else { continue };
        if name != s.config.name.as_bytes() {
            continue;
        }
        let Some(addr) = *s.remote_addr.lock().unwrap_or_else(|p| p.into_inner()) else { continue };
        let mut reply = Vec::with_capacity(64);
        reply.extend_from_slice(ANSWER);
        reply.extend_from_slice(&addr.port().to_le_bytes());
        let ip = addr.ip().to_string();
        reply.push(ip.len() as u8);
        reply.extend_from_slice(ip.as_bytes());
        reply.extend_from_slice(s.config.name.as_bytes());
        let _ = sock.send_to(&reply, from);
    }
}

/// Sends a query for `name` to port `port` of every target and returns the first answer's
/// remote-access address.
pub fn discover(name: &str, port: u16, timeout: Duration, targets: &[IpAddr]) -> Result<SocketAddr, EtError> {
    let err = |e| EtError::io("discovery", e);
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    s.set_broadcast(true).map_err(err)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into()).map_err(err)?;
    let sock: UdpSocket = s.into();
    let mut query = QUERY.to_vec();
    query.extend_from_slice(name.as_bytes());
    let deadline = Instant::now() + timeout;
    let mut next_send = Instant::now();
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        if Instant::now() >= next_send {
            for t in targets {
                // A broadcast may be impossible here (no interface for it): other targets remain.
                let _ = sock.send_to(&query, SocketAddr::new(*t, port));
            }
            next_send = Instant::now() + Duration::from_millis(250);
        }
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(100));
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1)))).map_err(err)?;
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        let Some(rest) = buf[..n].strip_prefix(ANSWER) else { continue };
        if rest.len() < 3 {
            continue;
        }
        let p = u16::from_le_bytes([rest[0], rest[1]]);
        let iplen = rest[2] as usize;
        if rest.len() < 3 + iplen || &rest[3 + iplen..] != name.as_bytes() {
            continue;
        }
        let ip = std::str::from_utf8(&rest[3..3 + iplen]).ok().and_then(|t| t.parse::<IpAddr>().ok());
        let ip = match ip {
            Some(ip) if !ip.is_unspecified() => ip,
            _ => from.ip(),
        };
        return Ok(SocketAddr::new(ip, p));
    }
    Err(EtError::NotFound(name.into()))
}
