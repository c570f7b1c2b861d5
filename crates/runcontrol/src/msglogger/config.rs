//! The configuration of the `msglogger` kind: every key, documented, checked by
//! [`MsgLoggerConfig::check`].

use daqflow_component::ComponentError;
use serde::Deserialize;

/// Configuration of a `msglogger`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsgLoggerConfig {
    /// The control server (HOST:PORT, or `PRIMARY,SPARE…`) whose processes it follows.
    pub control: String,
    /// The run database the records go into: an SQLite file, or a PostgreSQL URL
    /// (`postgres://USER@HOST:PORT/DBNAME`).
    pub database: String,
    /// How often the list of processes is read.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
}

impl MsgLoggerConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.addresses("control", &self.control);
        if let Err(e) = crate::db::Location::parse(&self.database) {
            c.problem("database", format!("is not a database: {e}"));
        }
        c.int("poll_ms", self.poll_ms, 10, 60_000);
        c.finish()
    }
}

fn default_poll_ms() -> u64 {
    500
}
