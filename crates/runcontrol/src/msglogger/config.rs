//! The configuration of the `msglogger` kind: every key, documented, checked by
//! [`MsgLoggerConfig::check`].

use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema, Type};
use serde::{Deserialize, Serialize};

/// Configuration of a `msglogger`.
#[derive(Debug, Clone, Deserialize, Serialize)]
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

/// The typed schema of the `msglogger` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    let sample = MsgLoggerConfig { control: String::new(), database: String::new(), poll_ms: default_poll_ms() };
    Schema::new("msglogger")
        .key(Key::new("control", Type::Addresses, "The control server (`HOST:PORT`, or `PRIMARY,SPARE…`) whose processes it follows: `\"${system.control}\"`.").required())
        .key(Key::text("database", "The run database: an SQLite file, or a PostgreSQL URL `postgres://USER@HOST[:PORT]/DBNAME`: `\"${system.database}\"`.").required())
        .key(Key::integer("poll_ms", 10, 60_000, "How often the list of processes is read.").unit("ms"))
        .output(Key::text("database", "Where the records go (a URL's password never shown)."))
        .defaults_from(&sample)
}

impl MsgLoggerConfig {
    /// Range-checks every key (`docs/operator-guide.md` has the ranges).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
        if let Err(e) = crate::db::Location::parse(&self.database) {
            c.problem("database", format!("is not a database: {e}"));
        }
        c.finish()
    }
}

fn default_poll_ms() -> u64 {
    500
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(
            &toml::from_str::<MsgLoggerConfig>("control = \"127.0.0.1:1\"\ndatabase = \"x.sqlite\"").unwrap(),
        );
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
