//! Configuration of a sink.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use crate::{DEFAULT_RECV_CHUNK_BYTES, DEFAULT_SEND_QUEUE_BYTES};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema};

/// Configuration of a sink (`daqflow component sink --set listen=127.0.0.1:7302 …`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SinkConfig {
    /// Address the upstream component (a generator or a repeater) connects to; port 0 picks a
    /// free port, which `configure` returns as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// The address `configure` returns instead (`HOST` or `HOST:PORT`), when the upstream on
    /// another host does not reach `listen` as it is. Default: the bound address; for a
    /// wildcard `listen`, this host's address on the network towards the control server.
    pub advertise: Option<String>,
    /// Check the CRC32C of every chunk that carries one (`crc_errors` counts the bad ones).
    /// Sequence numbers are always checked.
    pub check: bool,
    /// How long (ms) `stop` waits for the end marker, so that nothing in flight is lost; then
    /// the run ends without it and the summary says so.
    pub stop_timeout_ms: u64,
    /// Size of the buffers the upstream is read into; 4 MiB by default
    /// ([`DEFAULT_RECV_CHUNK_BYTES`](crate::DEFAULT_RECV_CHUNK_BYTES) says why).
    pub recv_chunk_bytes: usize,
    /// `SO_RCVBUF` (and `SO_SNDBUF`) of the connection in bytes; unset: the kernel's default
    /// and auto-tuning.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            check: true,
            stop_timeout_ms: 10_000,
            recv_chunk_bytes: DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// The typed schema of the `sink` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("sink")
        .key(Key::address(
            "listen",
            "Address the upstream connects to (port 0: a free port, which `configure` gives); bound at `configure`.",
        ))
        .key(crate::link::advertise_key())
        .key(Key::bool(
            "check",
            "Check the CRC32C of every chunk that carries one (sequence numbers are always checked).",
        ))
        .keys(crate::link::end_receiver_keys())
        .output(crate::link::listen_output())
        .defaults_from(&SinkConfig::default())
}

impl SinkConfig {
    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "listen", &self.listen)?;
        Ok(())
    }

    /// Checks every key against the [`schema`], without resolving addresses (`daqflow run --check`).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
        crate::link::check_advertise(&mut c, self.advertise.as_deref());
        c.finish()
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: DEFAULT_SEND_QUEUE_BYTES,
            recv_chunk_bytes: self.recv_chunk_bytes,
            socket_buffer_bytes: self.socket_buffer_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&SinkConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
