//! Configuration of a logger.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::DEFAULT_RECV_CHUNK_BYTES;
use crate::link::{Tuning, resolve};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema};

/// Configuration of a logger (`daqflow component logger --set directory=DIR`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggerConfig {
    /// Address the upstream connects to; port 0 picks a free port, which `configure` returns
    /// as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// The address `configure` returns instead (`HOST` or `HOST:PORT`).
    pub advertise: Option<String>,
    /// Directory the data files go into (created if missing). Required.
    pub directory: PathBuf,
    /// A file is closed and the next one opened before a chunk would make it larger.
    pub max_file_bytes: u64,
    /// `fsync` each file and its directory when it is closed.
    pub sync_on_close: bool,
    /// Check the CRC32C of every chunk that carries one (sequence numbers are always checked).
    pub check: bool,
    /// How long (ms) `stop` waits for the end marker (and the last file to be closed).
    pub stop_timeout_ms: u64,
    /// Size of the buffers the upstream is read into.
    pub recv_chunk_bytes: usize,
    /// `SO_RCVBUF` (and `SO_SNDBUF`) of the connection; unset: the kernel's default.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for LoggerConfig {
    fn default() -> Self {
        LoggerConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            directory: PathBuf::new(),
            max_file_bytes: 1 << 30,
            sync_on_close: true,
            check: true,
            stop_timeout_ms: 10_000,
            recv_chunk_bytes: DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// The typed schema of the `logger` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("logger")
        .key(Key::address(
            "listen",
            "Address the upstream connects to (port 0: a free port, which `configure` gives); bound at `configure`.",
        ))
        .key(crate::link::advertise_key())
        .key(Key::path("directory", "Directory the data files go into (created if missing).").required())
        .key(
            Key::integer(
                "max_file_bytes",
                4096,
                1 << 50,
                "A file is closed and the next one opened before a chunk would make it larger.",
            )
            .unit("bytes"),
        )
        .key(Key::bool("sync_on_close", "`fsync` each file and its directory when it is closed."))
        .key(Key::bool(
            "check",
            "Check the CRC32C of every chunk that carries one (sequence numbers are always checked).",
        ))
        .keys(crate::link::end_receiver_keys())
        .output(crate::link::listen_output())
        .defaults_from(&LoggerConfig::default())
}

impl LoggerConfig {
    /// Checks the values and resolves `listen`.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "listen", &self.listen)?;
        Ok(())
    }

    /// Checks every key against the [`schema`], without resolving addresses.
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        let mut probe = self.clone();
        if self.directory.as_os_str().is_empty() {
            c.problem("directory", "is required (a directory for the data files)");
            probe.directory = PathBuf::from(".");
        }
        c.schema(&schema(), &probe);
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
        let problems = schema().struct_problems(&LoggerConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
