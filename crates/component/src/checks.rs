//! Range checks of configuration values: every problem of a configuration at once, each
//! naming its key (`` `max_file_bytes` = 0: … ``), so that `daqflow run --check` can point at the
//! key's line and a component refuses the same values at configure.
//!
//! ```
//! use daqflow_component::checks::Checks;
//! let mut c = Checks::new("recorder");
//! c.int("batch", 0, 1, 10_000);
//! c.address("listen", "127.0.0.1:99999");
//! let e = c.finish().unwrap_err().to_string();
//! assert!(e.contains("`batch` = 0 is out of range: 1 … 10000"), "{e}");
//! assert!(e.contains("`listen` = \"127.0.0.1:99999\""), "{e}");
//! ```

use crate::ComponentError;

/// Collects the problems of one configuration.
#[derive(Debug)]
pub struct Checks {
    name: String,
    problems: Vec<String>,
}

/// Separates the problems in the error's text (each starts with its key in backquotes).
pub const SEPARATOR: &str = "; ";

impl Checks {
    /// Checks of the configuration of component `name`.
    pub fn new(name: &str) -> Checks {
        Checks { name: name.to_owned(), problems: Vec::new() }
    }

    /// Adds a problem of `key`.
    pub fn problem(&mut self, key: &str, what: impl std::fmt::Display) {
        self.problems.push(format!("`{key}` {what}"));
    }

    /// An integer in `min ..= max`.
    pub fn int(&mut self, key: &str, value: u64, min: u64, max: u64) {
        if !(min..=max).contains(&value) {
            self.problem(key, format!("= {value} is out of range: {min} … {max}"));
        }
    }

    /// A finite number in `min ..= max`.
    pub fn float(&mut self, key: &str, value: f64, min: f64, max: f64) {
        if !(value.is_finite() && (min..=max).contains(&value)) {
            self.problem(key, format!("= {value} is out of range: {min} … {max}"));
        }
    }

    /// A text that is not empty (nor only spaces).
    pub fn text(&mut self, key: &str, value: &str) {
        if value.trim().is_empty() {
            self.problem(key, "must not be empty");
        }
    }

    /// A `HOST:PORT` address (an IP address or a host name, port 0 … 65535).
    pub fn address(&mut self, key: &str, value: &str) {
        if let Err(why) = check_address(value) {
            self.problem(key, format!("= {value:?} is not an address: {why}"));
        }
    }

    /// `value` must be `host:port[,host:port…]` (a control server and its spares).
    pub fn addresses(&mut self, key: &str, value: &str) {
        if let Some(why) = value.split(',').map(str::trim).find_map(|a| check_address(a).err()) {
            self.problem(key, format!("= {value:?} is not an address or a list of them: {why}"));
        }
    }

    /// Every problem of `config` (serialized) against the kind's typed schema: each key's type
    /// and range ([`crate::schema`]). The kind then adds the rules between keys.
    pub fn schema(&mut self, schema: &crate::schema::Schema, config: &impl serde::Serialize) {
        match toml::Table::try_from(config) {
            Ok(table) => self.problems.extend(schema.check(&table)),
            Err(e) => self.problems.push(format!("the configuration does not serialize: {e}")),
        }
    }

    /// `Ok`, or every problem in one [`ComponentError::Config`].
    pub fn finish(self) -> Result<(), ComponentError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ComponentError::Config(format!("{}: {}", self.name, self.problems.join(SEPARATOR))))
        }
    }
}

/// Checks a `HOST:PORT` address: a host (IP address or name) and a port 0 … 65535.
pub fn check_address(value: &str) -> Result<(), String> {
    if value.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = value.rsplit_once(':') else { return Err("HOST:PORT expected".into()) };
    port.parse::<u16>().map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if name_ok || host.parse::<std::net::IpAddr>().is_ok() {
        Ok(())
    } else {
        Err(format!("{host:?} is neither an IP address nor a host name"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_a_host_and_a_port_in_range() {
        for ok in ["127.0.0.1:0", "[::1]:7000", "daq-node7:7100", "localhost:65535"] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in ["not an address", "127.0.0.1:99999", ":7000", "host:", "127.0.0.1", "a b:1", "host:-1"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let mut c = Checks::new("x");
        c.float("rate_hz", f64::NAN, 0.0, 1e9);
        c.float("timeout_s", -1.0, 0.001, 86400.0);
        c.int("n", 5, 1, 10);
        c.text("et", " ");
        let e = c.finish().unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration: x: `rate_hz` = NaN is out of range: 0 … 1000000000; \
             `timeout_s` = -1 is out of range: 0.001 … 86400; `et` must not be empty"
        );
    }
}
