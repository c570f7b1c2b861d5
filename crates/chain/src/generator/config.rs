//! Configuration of a generator.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use crate::{DEFAULT_SEND_QUEUE_BYTES, MAX_CHUNK_BYTES};
use daqflow_component::ComponentError;

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

impl GeneratorConfig {
    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "downstream", &self.downstream)?;
        if self.chunk_bytes == 0 || self.chunk_bytes > MAX_CHUNK_BYTES {
            return Err(ComponentError::Config(format!(
                "{name}: chunk_bytes = {} must be 1 … {MAX_CHUNK_BYTES}",
                self.chunk_bytes
            )));
        }
        if !(self.rate_hz >= 0.0 && self.rate_hz.is_finite()) {
            return Err(ComponentError::Config(format!("{name}: rate_hz = {} must be 0 or positive", self.rate_hz)));
        }
        Ok(())
    }

    /// Range-checks every key, without resolving addresses (`daqflow run --check`).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        if self.downstream.is_empty() {
            c.problem("downstream", "is required (HOST:PORT)");
        } else {
            c.address("downstream", &self.downstream);
        }
        c.int("chunk_bytes", self.chunk_bytes as u64, 1, MAX_CHUNK_BYTES as u64);
        c.float("rate_hz", self.rate_hz, 0.0, 1e9);
        c.int("connect_timeout_ms", self.connect_timeout_ms, 1, 86_400_000);
        c.int("stop_timeout_ms", self.stop_timeout_ms, 1, 86_400_000);
        c.int("send_queue_bytes", self.send_queue_bytes as u64, 4096, 1 << 34);
        if let Some(b) = self.socket_buffer_bytes {
            c.int("socket_buffer_bytes", b as u64, 1024, 1 << 30);
        }
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
