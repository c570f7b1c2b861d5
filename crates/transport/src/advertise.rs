//! The address a listener tells its peers: reachable from the other hosts.
//!
//! A component that listens answers its address (an RU to the EVM and the BUs, the EVM and an
//! ET system to whoever is configured after them, a chain link to its upstream). A socket bound
//! to a wildcard (`0.0.0.0:PORT`) has no address another host can use, so the address told is:
//!
//! 1. the `advertise` key, when the configuration has one: a host name or address, with or
//!    without a port (without one, the bound port is added);
//! 2. for a wildcard bind: the address of this host's interface that routes to the control
//!    server ([`set_route_target`], which a component process calls with its control server's
//!    address), or, without one, to the default route; `127.0.0.1` when there is no route at
//!    all (a host without a network);
//! 3. otherwise the bound address itself.
//!
//! The route is asked of the kernel with a UDP socket that is connected but never sends
//! anything: `connect(2)` on UDP only picks the route and the source address.
//!
//! ```
//! use daqflow_transport::advertise::advertised;
//!
//! let bound = "127.0.0.1:5000".parse().unwrap();
//! assert_eq!(advertised(bound, None).unwrap(), "127.0.0.1:5000");
//! assert_eq!(advertised(bound, Some("ru-host-1")).unwrap(), "ru-host-1:5000");
//! assert_eq!(advertised(bound, Some("10.0.0.7:6000")).unwrap(), "10.0.0.7:6000");
//! let wildcard = "0.0.0.0:5000".parse().unwrap();
//! assert!(!advertised(wildcard, None).unwrap().starts_with("0.0.0.0"));
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Mutex;

/// Why an `advertise` value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdvertiseError {
    /// Empty, a wildcard, or not of the form `HOST` or `HOST:PORT`.
    #[error(
        "advertise = {value:?}: {why} (give a host name or address that the other hosts reach, with or without :PORT)"
    )]
    Invalid {
        /// The value given.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// The address whose route decides the advertised address of a wildcard bind.
static ROUTE_TARGET: Mutex<Option<IpAddr>> = Mutex::new(None);

/// Sets the address whose route decides what a wildcard bind advertises: a component process
/// calls it with its control server's address, so that every component of a system answers
/// an address on the network it shares with the control server.
pub fn set_route_target(target: IpAddr) {
    *ROUTE_TARGET.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
}

/// Like [`set_route_target`], from the first address of a `HOST:PORT[,HOST:PORT…]` list (host
/// names are resolved). Does nothing when none can be read.
pub fn set_route_target_from(addrs: &str) {
    use std::net::ToSocketAddrs;
    let first = addrs.split(',').next().unwrap_or("").trim();
    if let Some(a) = first.to_socket_addrs().ok().and_then(|mut a| a.next()) {
        set_route_target(a.ip());
    }
}

/// The route target set by [`set_route_target`].
pub fn route_target() -> Option<IpAddr> {
    *ROUTE_TARGET.lock().unwrap_or_else(|p| p.into_inner())
}

/// The address of this host's interface that routes to `target` (a loopback target gives a
/// loopback address). Sends nothing.
pub fn local_ip_toward(target: IpAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match target {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any)?;
    // Port 9 (discard): any port does; nothing is sent.
    socket.connect((target, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// The address of this host as the other hosts reach it: the interface routing to the route
/// target, else to the default route, else `127.0.0.1`.
pub fn host_ip() -> IpAddr {
    let default_route = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)); // TEST-NET-1: only a route is asked
    route_target()
        .and_then(|t| local_ip_toward(t).ok())
        .or_else(|| local_ip_toward(default_route).ok())
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Checks an `advertise` value (for configuration checks): `HOST` or `HOST:PORT`, not a
/// wildcard.
pub fn check(value: &str) -> Result<(), AdvertiseError> {
    split(value).map(|_| ())
}

fn split(value: &str) -> Result<(String, Option<u16>), AdvertiseError> {
    let bad = |why| AdvertiseError::Invalid { value: value.to_owned(), why };
    let v = value.trim();
    if v.is_empty() {
        return Err(bad("it is empty"));
    }
    if let Ok(sa) = v.parse::<SocketAddr>() {
        if sa.ip().is_unspecified() {
            return Err(bad("a wildcard address cannot be reached"));
        }
        return Ok((fmt_ip(sa.ip()), Some(sa.port())));
    }
    if let Ok(ip) = v.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        if ip.is_unspecified() {
            return Err(bad("a wildcard address cannot be reached"));
        }
        return Ok((fmt_ip(ip), None));
    }
    let (host, port) = match v.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().map_err(|_| bad("the port is not a number from 0 to 65535"))?)),
        None => (v, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
        });
    if !host_ok {
        return Err(bad("not a host name"));
    }
    Ok((host.to_owned(), port))
}

fn fmt_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The address to tell peers for a listener bound to `bound`, given the configuration's
/// `advertise` value (see the [module](self)).
pub fn advertised(bound: SocketAddr, advertise: Option<&str>) -> Result<String, AdvertiseError> {
    if let Some(a) = advertise {
        let (host, port) = split(a)?;
        return Ok(format!("{host}:{}", port.unwrap_or(bound.port())));
    }
    if bound.ip().is_unspecified() {
        return Ok(format!("{}:{}", fmt_ip(host_ip()), bound.port()));
    }
    Ok(bound.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertise_value_wins_and_takes_the_bound_port_when_it_has_none() {
        let bound: SocketAddr = "0.0.0.0:4000".parse().unwrap();
        assert_eq!(advertised(bound, Some("daq-ru-1.example.org")).unwrap(), "daq-ru-1.example.org:4000");
        assert_eq!(advertised(bound, Some("10.1.2.3")).unwrap(), "10.1.2.3:4000");
        assert_eq!(advertised(bound, Some("10.1.2.3:80")).unwrap(), "10.1.2.3:80");
        assert_eq!(advertised(bound, Some("::1")).unwrap(), "[::1]:4000");
        assert_eq!(advertised(bound, Some("[::1]:81")).unwrap(), "[::1]:81");
    }

    #[test]
    fn bad_advertise_values_are_refused_with_the_reason() {
        for (v, why) in [
            ("", "empty"),
            ("0.0.0.0", "wildcard"),
            ("0.0.0.0:5", "wildcard"),
            ("host:99999", "port"),
            ("bad host", "host name"),
            ("-x.org", "host name"),
        ] {
            let e = check(v).unwrap_err().to_string();
            assert!(e.contains(why), "{v:?}: {e}");
        }
    }

    #[test]
    fn a_wildcard_bind_advertises_the_interface_toward_the_route_target() {
        // Loopback routes to loopback: a concrete address, never the wildcard.
        assert_eq!(local_ip_toward("127.0.0.1".parse().unwrap()).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        set_route_target("127.0.0.1".parse().unwrap());
        assert_eq!(advertised("0.0.0.0:7".parse().unwrap(), None).unwrap(), "127.0.0.1:7");
        // A concrete bind is told as it is.
        assert_eq!(advertised("127.0.0.2:8".parse().unwrap(), None).unwrap(), "127.0.0.2:8");
    }
}
