//! Which `Host` and `Origin` header values a request may carry, without I/O.
//!
//! The `Host` check defeats DNS rebinding: a page of another site whose name was made to
//! resolve to 127.0.0.1 reaches this server, but its requests name that other host. The
//! `Origin` check refuses requests a browser sends on behalf of a page of another origin (a
//! cross-site POST, or an event stream opened by another site's page).

use std::net::SocketAddr;

/// The `Host` values accepted, lowercase.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    accepted: Vec<String>,
}

/// Whether `entry` ends with `:PORT`: a bracketed IPv6 address or a name, then a colon and
/// digits.
fn has_port(entry: &str) -> bool {
    match entry.rsplit_once(':') {
        Some((host, port)) => {
            !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && (host.ends_with(']') || !host.contains(':'))
        }
        None => false,
    }
}

impl Hosts {
    /// The hosts of a server bound to `local`: the bound address, `127.0.0.1`, `localhost` and
    /// `[::1]`, each with the port (and without it when the port is 80, as browsers send it),
    /// and the `allowed` entries (an entry without a port: alone or with this server's port).
    pub fn new(local: SocketAddr, allowed: &[String]) -> Hosts {
        let port = local.port();
        let mut accepted = Vec::new();
        let with_port = |name: &str, accepted: &mut Vec<String>| {
            accepted.push(format!("{name}:{port}"));
            if port == 80 {
                accepted.push(name.to_owned());
            }
        };
        let bound = match local {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        for name in [bound.as_str(), "127.0.0.1", "localhost", "[::1]"] {
            with_port(name, &mut accepted);
        }
        for entry in allowed {
            let entry = entry.trim().to_ascii_lowercase();
            if entry.is_empty() {
                continue;
            }
            if has_port(&entry) {
                accepted.push(entry);
            } else {
                accepted.push(format!("{entry}:{port}"));
                accepted.push(entry);
            }
        }
        accepted.sort();
        accepted.dedup();
        Hosts { accepted }
    }

    /// Whether a request's `Host` value names this server.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim();
        self.accepted.iter().any(|a| a.eq_ignore_ascii_case(host))
    }
}

/// Whether an `Origin` value is this server's own origin, given the request's (accepted)
/// `Host`: `http://HOST` or `https://HOST` (through a TLS proxy).
pub(crate) fn origin_matches(origin: &str, host: &str) -> bool {
    let origin = origin.trim();
    let rest = match origin.get(..8) {
        Some(p) if p.eq_ignore_ascii_case("https://") => &origin[8..],
        _ => match origin.get(..7) {
            Some(p) if p.eq_ignore_ascii_case("http://") => &origin[7..],
            _ => return false,
        },
    };
    !rest.is_empty() && rest.eq_ignore_ascii_case(host.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(local: &str, allowed: &[&str]) -> Hosts {
        Hosts::new(local.parse().unwrap(), &allowed.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_loopback_names_with_the_port_are_accepted_others_not() {
        let h = hosts("127.0.0.1:8080", &[]);
        for ok in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", " localhost:8080 "] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in ["localhost", "127.0.0.1", "localhost:8081", "evil.example:8080", "localhost.:8080", "", "[::1]"] {
            assert!(!h.allows(bad), "{bad}");
        }
        let h = hosts("[::1]:80", &[]);
        assert!(h.allows("[::1]") && h.allows("[::1]:80") && h.allows("localhost"));
        let h = hosts("10.1.2.3:9000", &[]);
        assert!(h.allows("10.1.2.3:9000") && h.allows("127.0.0.1:9000"));
    }

    #[test]
    fn allowed_hosts_match_with_and_without_the_port() {
        let h = hosts("0.0.0.0:8080", &["DAQ.example.org", "proxy:9", "[fe80::1]", "[fe80::2]:7"]);
        for ok in ["daq.example.org", "daq.example.org:8080", "proxy:9", "[fe80::1]", "[fe80::1]:8080", "[fe80::2]:7"] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in ["daq.example.org:8081", "proxy", "proxy:8080", "[fe80::2]", "[fe80::2]:8080"] {
            assert!(!h.allows(bad), "{bad}");
        }
    }

    #[test]
    fn only_the_servers_own_origin_matches() {
        assert!(origin_matches("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(origin_matches("HTTP://LocalHost:8080", "localhost:8080"));
        assert!(origin_matches("https://daq.example.org", "daq.example.org"));
        for bad in ["null", "http://evil.example", "http://127.0.0.1:8081", "file://", "http://", "127.0.0.1:8080", ""]
        {
            assert!(!origin_matches(bad, "127.0.0.1:8080"), "{bad}");
        }
    }
}
