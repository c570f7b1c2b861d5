//! Configuration of a chain monitor.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema};

/// Configuration of a chain monitor (`daqflow component chain_monitor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChainMonitorConfig {
    /// Address the upstream connects to; port 0 picks a free port, which `configure` returns
    /// as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// The address `configure` returns instead (`HOST` or `HOST:PORT`).
    pub advertise: Option<String>,
    /// Bins of each histogram.
    pub bins: usize,
    /// Upper edge of the `chunk_size` histogram, in bytes (its lower edge is 0).
    pub max_chunk_bytes: u64,
    /// Time spent on each chunk besides filling the histograms, in µs (the thread sleeps):
    /// stands for an analysis that takes its time.
    pub work_us: u64,
    /// Check the CRC32C of every chunk that carries one.
    pub check: bool,
    /// How long (ms) `stop` waits for the end marker.
    pub stop_timeout_ms: u64,
    /// Size of the buffers the upstream is read into: 256 KiB, so that a slow monitor holds
    /// little backlog in its own memory.
    pub recv_chunk_bytes: usize,
    /// `SO_RCVBUF` (and `SO_SNDBUF`) of the connection; unset: the kernel's default.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for ChainMonitorConfig {
    fn default() -> Self {
        ChainMonitorConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            bins: 100,
            max_chunk_bytes: 1 << 20,
            work_us: 0,
            check: true,
            stop_timeout_ms: 10_000,
            recv_chunk_bytes: 256 << 10,
            socket_buffer_bytes: None,
        }
    }
}

/// The typed schema of the `chain_monitor` kind's configuration.
pub fn schema() -> Schema {
    Schema::new("chain_monitor")
        .key(Key::address(
            "listen",
            "Address the upstream connects to (port 0: a free port, which `configure` gives); bound at `configure`.",
        ))
        .key(crate::link::advertise_key())
        .key(Key::integer("bins", 1, 100_000, "Bins of each histogram."))
        .key(
            Key::integer(
                "max_chunk_bytes",
                1,
                1 << 40,
                "Upper edge of the `chunk_size` histogram (its lower edge is 0); larger chunks are its overflow.",
            )
            .unit("bytes"),
        )
        .key(
            Key::integer(
                "work_us",
                0,
                10_000_000,
                "Time spent on each chunk besides filling the histograms (the thread sleeps): an analysis that takes its time.",
            )
            .unit("µs"),
        )
        .key(Key::bool("check", "Check the CRC32C of every chunk that carries one."))
        .keys(crate::link::end_receiver_keys())
        .output(crate::link::listen_output())
        .defaults_from(&ChainMonitorConfig::default())
}

impl ChainMonitorConfig {
    /// Checks the values and resolves `listen`.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "listen", &self.listen)?;
        Ok(())
    }

    /// Checks every key against the [`schema`], without resolving addresses.
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        c.schema(&schema(), self);
        crate::link::check_advertise(&mut c, self.advertise.as_deref());
        c.finish()
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: crate::DEFAULT_SEND_QUEUE_BYTES,
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
        let problems = schema().struct_problems(&ChainMonitorConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
