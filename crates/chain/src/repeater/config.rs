//! Configuration of a repeater.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use crate::{DEFAULT_RECV_CHUNK_BYTES, DEFAULT_SEND_QUEUE_BYTES};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema};

/// How a repeater moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    /// Every frame is received into the transport's buffers and sent from them: no copy in
    /// user space; the kernel copies each byte in and out.
    #[default]
    Transport,
    /// Chunks of at least `splice_min_bytes` go from socket to socket through a pipe with
    /// `splice(2)`, never through the repeater's memory; smaller frames through its buffer.
    /// Fewer copies, but slower than `transport` on loopback (`docs/performance.md`, chain).
    Splice,
}

/// Configuration of a repeater (`daqflow component repeater --set downstream=HOST:PORT …`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepeaterConfig {
    /// Address the upstream component (a generator or a repeater) connects to; port 0 picks a
    /// free port, which `configure` returns as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// The address `configure` returns instead (`HOST` or `HOST:PORT`), when the upstream on
    /// another host does not reach `listen` as it is. Default: the bound address; for a
    /// wildcard `listen`, this host's address on the network towards the control server.
    pub advertise: Option<String>,
    /// Address of the next component (a repeater or a sink), `HOST:PORT`. Required.
    /// Connected at `start`.
    pub downstream: String,
    /// How long (ms) `start` retries connecting to `downstream`.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for the end marker to come through before it cuts both
    /// connections.
    pub stop_timeout_ms: u64,
    /// How the data moves: `"transport"` (default) or `"splice"`; `docs/performance.md`
    /// (chain) has the measurement that chose the default.
    pub forward: Forward,
    /// With `forward = "splice"`: chunks with at least this many bytes of data are spliced,
    /// smaller ones pass through the repeater's buffer.
    pub splice_min_bytes: usize,
    /// With `forward = "splice"`: capacity of the pipe between the sockets (at most
    /// `fs.pipe-max-size`, 1 MiB, for an unprivileged process), and the bytes gathered in it
    /// before it is emptied into the downstream.
    pub pipe_bytes: usize,
    /// With `forward = "transport"`: most bytes waiting to be written to `downstream`; the
    /// upstream is not read beyond (back-pressure travels up the chain).
    pub send_queue_bytes: usize,
    /// Size of the buffers the upstream is read into: the transport's receive buffers, whose
    /// slices are forwarded, or the splice forwarder's buffer for headers and small frames;
    /// 4 MiB by default ([`DEFAULT_RECV_CHUNK_BYTES`](crate::DEFAULT_RECV_CHUNK_BYTES)
    /// says why).
    pub recv_chunk_bytes: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of both connections in bytes; unset: the kernel's default
    /// and auto-tuning.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for RepeaterConfig {
    fn default() -> Self {
        RepeaterConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            downstream: String::new(),
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            forward: Forward::Transport,
            splice_min_bytes: 16 << 10,
            pipe_bytes: 1 << 20,
            send_queue_bytes: DEFAULT_SEND_QUEUE_BYTES,
            recv_chunk_bytes: DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// The typed schema of the `repeater` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("repeater")
        .key(Key::address(
            "listen",
            "Address the upstream connects to (port 0: a free port, which `configure` gives); bound at `configure`.",
        ))
        .key(crate::link::advertise_key())
        .key(
            Key::address("downstream", "Address of the next component (a repeater or a sink); connected at `start`.")
                .required(),
        )
        .key(
            Key::integer("connect_timeout_ms", 1, 86_400_000, "How long `start` retries connecting to `downstream`.")
                .unit("ms"),
        )
        .key(
            Key::integer(
                "stop_timeout_ms",
                1,
                86_400_000,
                "How long `stop` waits for the end marker to come through before it cuts both connections.",
            )
            .unit("ms"),
        )
        .key(Key::choice(
            "forward",
            &["transport", "splice"],
            "How the data moves: through the transport's buffers, or from socket to socket with `splice(2)`.",
        ))
        .key(
            Key::integer(
                "splice_min_bytes",
                0,
                1 << 30,
                "With `forward = \"splice\"`: chunks with at least this much data are spliced.",
            )
            .unit("bytes"),
        )
        .key(
            Key::integer(
                "pipe_bytes",
                4096,
                1 << 30,
                "With `forward = \"splice\"`: capacity of the pipe between the sockets.",
            )
            .unit("bytes"),
        )
        .key(
            Key::integer(
                "send_queue_bytes",
                4096,
                1 << 34,
                "With `forward = \"transport\"`: most bytes waiting for `downstream`; the upstream is not read beyond.",
            )
            .unit("bytes"),
        )
        .key(crate::link::recv_chunk_key())
        .key(
            Key::integer(
                "socket_buffer_bytes",
                1024,
                1 << 30,
                "`SO_SNDBUF` and `SO_RCVBUF` of both connections; unset: the kernel's default and auto-tuning.",
            )
            .unit("bytes"),
        )
        .output(crate::link::listen_output())
        .defaults_from(&RepeaterConfig::default())
}

impl RepeaterConfig {
    /// Checks the values.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "listen", &self.listen)?;
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
        crate::link::check_advertise(&mut c, self.advertise.as_deref());
        c.finish()
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: self.send_queue_bytes,
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
        let problems = schema().struct_problems(&RepeaterConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
