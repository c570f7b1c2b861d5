//! Configuration of a generator.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use crate::{DEFAULT_SEND_QUEUE_BYTES, MAX_CHUNK_BYTES};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema};

/// Configuration of a generator (`daqflow component generator --set downstream=HOST:PORT …`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeneratorConfig {
    /// Address of the next component in the chain (a repeater or a sink), `HOST:PORT`.
    /// Required. Connected at `start`.
    pub downstream: String,
    /// Bytes of data in each chunk (a 16-byte chunk header goes in front), 1 … 64 MiB − 16.
    pub chunk_bytes: usize,
    /// Chunks per second; 0: free-running, as fast as the chain takes them.
    pub rate_hz: f64,
    /// Put the CRC32C of the data in every chunk header (a sink with `check = true` verifies
    /// it). The data is one pattern sent for every chunk, so its CRC is computed once.
    pub check: bool,
    /// How long (ms) `start` retries connecting to `downstream`.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for a downstream that no longer reads before it cuts the
    /// stream (without an end marker).
    pub stop_timeout_ms: u64,
    /// Most bytes waiting to be written to `downstream`; the generator waits for room beyond.
    pub send_queue_bytes: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of the connection in bytes; unset: the kernel's default and
    /// auto-tuning.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            downstream: String::new(),
            chunk_bytes: 64 << 10,
            rate_hz: 0.0,
            check: true,
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            send_queue_bytes: DEFAULT_SEND_QUEUE_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// The typed schema of the `generator` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("generator")
        .key(
            Key::address(
                "downstream",
                "Address of the next component in the chain (a repeater or a sink); connected at `start`.",
            )
            .required(),
        )
        .key(
            Key::integer(
                "chunk_bytes",
                1,
                MAX_CHUNK_BYTES as i64,
                "Bytes of data in each chunk (a 16-byte chunk header goes in front).",
            )
            .unit("bytes"),
        )
        .key(
            Key::float("rate_hz", 0.0, 1e9, "Chunks per second; 0: free-running, as fast as the chain takes them.")
                .unit("Hz"),
        )
        .key(Key::bool(
            "check",
            "Put the CRC32C of the data in every chunk header (a sink with `check = true` verifies it).",
        ))
        .key(
            Key::integer("connect_timeout_ms", 1, 86_400_000, "How long `start` retries connecting to `downstream`.")
                .unit("ms"),
        )
        .key(
            Key::integer(
                "stop_timeout_ms",
                1,
                86_400_000,
                "How long `stop` waits for a downstream that no longer reads before it cuts the stream.",
            )
            .unit("ms"),
        )
        .key(
            Key::integer(
                "send_queue_bytes",
                4096,
                1 << 34,
                "Most bytes waiting to be written to `downstream`; the generator waits for room beyond.",
            )
            .unit("bytes"),
        )
        .key(
            Key::integer(
                "socket_buffer_bytes",
                1024,
                1 << 30,
                "`SO_SNDBUF` and `SO_RCVBUF` of the connection; unset: the kernel's default and auto-tuning.",
            )
            .unit("bytes"),
        )
        .output(Key::integer("chunk_bytes", 1, MAX_CHUNK_BYTES as i64, "Bytes of data in each chunk."))
        .summary(Key::integer("chunks", 0, i64::MAX, "Chunks sent (the same as `events`)."))
        .defaults_from(&GeneratorConfig::default())
}

impl GeneratorConfig {
    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "downstream", &self.downstream)?;
        Ok(())
    }

    /// Checks every key against the [`schema`], without resolving addresses (`daqflow run --check`).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        let mut probe = self.clone();
        if probe.downstream.trim().is_empty() {
            c.problem("downstream", "is required (HOST:PORT)");
            probe.downstream = "127.0.0.1:9".into();
        }
        c.schema(&schema(), &probe);
        c.finish()
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: self.send_queue_bytes,
            recv_chunk_bytes: 64 << 10,
            socket_buffer_bytes: self.socket_buffer_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&GeneratorConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
