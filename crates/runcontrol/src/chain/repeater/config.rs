//! Configuration of a repeater.

use serde::{Deserialize, Serialize};

use crate::ComponentError;
use crate::chain::link::{Tuning, resolve};
use crate::chain::{DEFAULT_RECV_CHUNK_BYTES, DEFAULT_SEND_QUEUE_BYTES};

/// Configuration of a repeater (`daqflow component repeater --set downstream=HOST:PORT …`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepeaterConfig {
    /// Address the upstream component (a generator or a repeater) connects to; port 0 picks a
    /// free port, which `configure` returns as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// Address of the next component (a repeater or a sink), `HOST:PORT`. Required.
    /// Connected at `start`.
    pub downstream: String,
    /// How long (ms) `start` retries connecting to `downstream`.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for the end marker to come through before it cuts both
    /// connections.
    pub stop_timeout_ms: u64,
    /// Most bytes waiting to be written to `downstream`; the upstream is not read beyond
    /// (back-pressure travels up the chain).
    pub send_queue_bytes: usize,
    /// Size of the buffers the upstream is read into; chunks are forwarded as slices of them.
    pub recv_chunk_bytes: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of both connections in bytes; unset: the kernel's default
    /// and auto-tuning.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for RepeaterConfig {
    fn default() -> Self {
        RepeaterConfig {
            listen: "127.0.0.1:0".into(),
            downstream: String::new(),
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            send_queue_bytes: DEFAULT_SEND_QUEUE_BYTES,
            recv_chunk_bytes: DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

impl RepeaterConfig {
    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        resolve(name, "listen", &self.listen)?;
        resolve(name, "downstream", &self.downstream)?;
        Ok(())
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: self.send_queue_bytes,
            recv_chunk_bytes: self.recv_chunk_bytes,
            socket_buffer_bytes: self.socket_buffer_bytes,
        }
    }
}
