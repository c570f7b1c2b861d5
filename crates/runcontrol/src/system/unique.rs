//! What two components of a system cannot share, checked before anything starts: the values
//! a kind's schema marks as its components' identities
//! ([`Key::unique`](daqflow_component::schema::Key::unique): a source's `source_id`, an RU's or a
//! BU's `id`; the default counts), and the ports components listen on (`listen`),
//! the control servers' (`control`) and the web UI's (`web`) on one host. At run time each of
//! these fails far from its cause (an RU refusing "a second source 0", an address in use).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use daqflow_component::Registry;

use super::{SystemSection, line_of, references};

/// A component as these checks see it.
pub(super) struct Entry<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    /// Its host (`None`: the operator's).
    pub host: Option<&'a str>,
    /// The line of its name.
    pub line: usize,
    /// Its parameters as written (references in).
    pub params: &'a toml::Table,
    /// Where its parameters' table starts in the text (for the line of a key).
    pub params_at: Option<usize>,
}

/// The line of `key` in `e`'s parameters, else of its name.
fn key_line(text: &str, e: &Entry<'_>, key: &str) -> usize {
    e.params_at.and_then(|at| super::key_line(text, at..text.len(), &format!("`{key}`"))).unwrap_or(e.line)
}

/// Two components of one kind with the same identity: each second one is a problem naming the
/// first.
pub(super) fn identities(text: &str, entries: &[Entry<'_>], registry: &Registry, problems: &mut Vec<String>) {
    let mut first: HashMap<(&str, &str, String), (&str, usize)> = HashMap::new();
    for e in entries {
        let Some(schema) = registry.kind(e.kind).and_then(|k| k.schema.as_deref()) else { continue };
        for k in schema.keys.iter().filter(|k| k.unique) {
            let key = k.name.as_str();
            let Some(value) = e.params.get(key).or(k.default.as_ref()).map(|v| match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            }) else {
                continue;
            };
            // A value made of references is known only at configure.
            if e.params.get(key).is_some_and(|v| v.as_str().is_some_and(|s| !references(s).is_empty())) {
                continue;
            }
            let line = key_line(text, e, key);
            let written = if e.params.contains_key(key) { "" } else { " (the default)" };
            match first.get(&(e.kind, key, value.clone())) {
                Some((other, other_line)) => problems.push(format!(
                    "line {line}: `{}`: {key} = {value}{written} is also the {key} of `{other}` (line {other_line}): \
                     no two {} components may share it",
                    e.name, e.kind
                )),
                None => {
                    first.insert((e.kind, key, value), (e.name, line));
                }
            }
        }
    }
}

/// Who listens where on one host.
struct Listener {
    who: String,
    line: usize,
    host: Option<String>,
    addr: SocketAddr,
}

/// Two listeners on one port of one host (the same address, or one of them a wildcard): each
/// second one is a problem naming the first. Port 0 (any free port) and addresses made of
/// references are not checked.
pub(super) fn ports(text: &str, system: &SystemSection, entries: &[Entry<'_>], problems: &mut Vec<String>) {
    let system_line = |key: &str| {
        let at = text.find("[system]").unwrap_or(0);
        super::key_line(text, at..text.len(), &format!("`{key}`")).unwrap_or_else(|| line_of(text, at))
    };
    let mut listeners: Vec<Listener> = Vec::new();
    for a in system.control.split(',').map(str::trim).filter_map(socket_addr) {
        listeners.push(Listener {
            who: "the control server (`control`)".into(),
            line: system_line("control"),
            host: None,
            addr: a,
        });
    }
    if let Some(a) = socket_addr(&system.web) {
        listeners.push(Listener { who: "the web UI (`web`)".into(), line: system_line("web"), host: None, addr: a });
    }
    for e in entries {
        let Some(value) = e.params.get("listen").and_then(toml::Value::as_str) else { continue };
        if !references(value).is_empty() {
            continue;
        }
        let Some(addr) = socket_addr(value) else { continue };
        listeners.push(Listener {
            who: format!("`{}`", e.name),
            line: key_line(text, e, "listen"),
            host: e.host.map(str::to_owned),
            addr,
        });
    }
    for (i, l) in listeners.iter().enumerate() {
        if l.addr.port() == 0 {
            continue;
        }
        if let Some(other) = listeners[..i].iter().find(|o| o.host == l.host && overlap(o.addr, l.addr)) {
            let on = l.host.as_deref().map(|h| format!(" on host {h}")).unwrap_or_default();
            problems.push(format!(
                "line {}: {} would listen on {}{on}, where {} listens (line {}): two processes cannot listen on one \
                 port (give one another port, or port 0 for any free one)",
                l.line, l.who, l.addr, other.who, other.line
            ));
        }
    }
}

/// Whether two listening addresses take the same port of one host.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `HOST:PORT` as a socket address (`localhost` as loopback); None if it is not one.
fn socket_addr(text: &str) -> Option<SocketAddr> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Some(a);
    }
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if host.eq_ignore_ascii_case("localhost") {
        return Some(SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port));
    }
    // Another name is not resolved here: no network lookups while checking a file.
    None
}

/// The keys every member of one parallel group of ET stations (`group`) must agree on: the
/// group picks its member by one policy, and a farm shares one flow of events.
const GROUP_KEYS: [&str; 3] = ["group_policy", "select", "prescale"];

/// The members of each parallel group (`group = "NAME"` on one ET system, `et`) of the kinds
/// whose schema has a `group` key: they must agree on [`GROUP_KEYS`] and have stations of their
/// own, none named after the group. Each problem names the key and the first member.
pub(super) fn groups(text: &str, entries: &[Entry<'_>], registry: &Registry, problems: &mut Vec<String>) {
    // (et, group) → the first member: its name, line, and its value of each key.
    let mut first: HashMap<(String, String), (&str, usize, Vec<String>)> = HashMap::new();
    // (et, station) → the member whose station it is.
    let mut stations: HashMap<(String, String), &str> = HashMap::new();
    for e in entries {
        let Some(schema) = registry.kind(e.kind).and_then(|k| k.schema.as_deref()) else { continue };
        if schema.key_named("group").is_none() {
            continue;
        }
        let text_of = |key: &str| {
            e.params.get(key).or(schema.key_named(key).and_then(|k| k.default.as_ref())).map(|v| match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        };
        let (Some(group), Some(et)) = (e.params.get("group").and_then(|g| g.as_str()), text_of("et")) else {
            continue;
        };
        if !references(group).is_empty() || !references(&et).is_empty() {
            continue;
        }
        let station = text_of("station").unwrap_or_else(|| e.name.to_owned());
        let line = key_line(text, e, "group");
        if station == group {
            problems.push(format!(
                "line {line}: `{}`: group = {group:?} is also the name of its station: the group's first station is \
                 named after the group; give the group another name",
                e.name
            ));
        }
        match stations.get(&(et.clone(), station.clone())) {
            Some(other) => problems.push(format!(
                "line {}: `{}`: station = {station:?} is also the station of `{other}` in group {group:?}: each \
                 member of a group needs a station of its own",
                key_line(text, e, "station"),
                e.name
            )),
            None => {
                stations.insert((et.clone(), station), e.name);
            }
        }
        let values: Vec<String> = GROUP_KEYS.iter().map(|k| text_of(k).unwrap_or_default()).collect();
        match first.get(&(et.clone(), group.to_owned())) {
            Some((other, other_line, theirs)) => {
                for (k, (mine, theirs)) in GROUP_KEYS.iter().zip(values.iter().zip(theirs)) {
                    if mine != theirs {
                        problems.push(format!(
                            "line {}: `{}`: {k} = {mine:?} differs from {k} = {theirs:?} of `{other}` (line \
                             {other_line}), in the same group {group:?}: every member of a group must have the same {k}",
                            key_line(text, e, k),
                            e.name
                        ));
                    }
                }
            }
            None => {
                first.insert((et, group.to_owned()), (e.name, line, values));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_overlap_every_address_of_their_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(overlap(a("0.0.0.0:7000"), a("127.0.0.1:7000")));
        assert!(overlap(a("127.0.0.1:7000"), a("127.0.0.1:7000")));
        assert!(!overlap(a("127.0.0.1:7000"), a("127.0.0.2:7000")));
        assert!(!overlap(a("0.0.0.0:7000"), a("0.0.0.0:7001")));
        assert_eq!(socket_addr("localhost:80"), Some(a("127.0.0.1:80")));
        assert_eq!(socket_addr("daq-ru-1:80"), None);
    }
}
