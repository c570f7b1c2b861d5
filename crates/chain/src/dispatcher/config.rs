//! Configuration of a dispatcher.

use serde::{Deserialize, Serialize};

use crate::link::{Tuning, resolve};
use crate::{DEFAULT_RECV_CHUNK_BYTES, DEFAULT_SEND_QUEUE_BYTES};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema, Type};

/// Default queue of a sampling output (`queue_bytes` unset): 256 KiB, so that a slow monitor
/// sees recent chunks rather than a long backlog, and the end marker reaches it soon after the
/// input's.
pub const DEFAULT_SAMPLING_QUEUE_BYTES: usize = 256 << 10;

/// `SO_SNDBUF` of a sampling output's connection when `socket_buffer_bytes` is unset: the
/// kernel holds little more than the queue, for the same reason.
pub const SAMPLING_SOCKET_BUFFER_BYTES: usize = 256 << 10;

/// What a dispatcher does with a chunk when an output's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The dispatcher waits for room (and so stops reading its input): nothing is dropped.
    /// For a logger.
    #[default]
    Blocking,
    /// The chunk is dropped for this output and counted; the input never waits for it. For a
    /// monitor.
    Sampling,
}

/// Which outputs a chunk goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Every chunk to every output.
    #[default]
    Copy,
    /// Each chunk to one output, in turn: chunk 1 to the first, chunk 2 to the second, …
    RoundRobin,
}

/// One output of a dispatcher: `{ downstream = "HOST:PORT", mode = "blocking" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    /// Address of the component this output feeds (a logger, a monitor, a sink, a repeater,
    /// another dispatcher), `HOST:PORT`. Required.
    pub downstream: String,
    /// `"blocking"` (default: nothing dropped) or `"sampling"` (takes what it can, drops counted).
    pub mode: Mode,
    /// Most bytes waiting to be written to this output; default `send_queue_bytes` for a
    /// blocking output, 256 KiB for a sampling one. A sampling output drops chunks beyond.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_bytes: Option<usize>,
}

impl OutputConfig {
    /// The bound of this output's queue.
    pub fn queue_bytes(&self, send_queue_bytes: usize) -> usize {
        self.queue_bytes.unwrap_or(match self.mode {
            Mode::Blocking => send_queue_bytes,
            Mode::Sampling => DEFAULT_SAMPLING_QUEUE_BYTES,
        })
    }
}

/// Configuration of a dispatcher (`daqflow component dispatcher`, its outputs in the system
/// file: `outputs = [{ downstream = "${log.listen}" }, { downstream = "${mon.listen}", mode = "sampling" }]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatcherConfig {
    /// Address the upstream component connects to; port 0 picks a free port, which
    /// `configure` returns as `{"listen": ADDR}`. Bound at `configure`.
    pub listen: String,
    /// The address `configure` returns instead (`HOST` or `HOST:PORT`).
    pub advertise: Option<String>,
    /// The outputs, one to 64; connected at `start`.
    pub outputs: Vec<OutputConfig>,
    /// `"copy"` (every chunk to every output) or `"round_robin"` (each chunk to one output in turn).
    pub policy: Policy,
    /// How long (ms) `start` retries connecting to each output.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for the end marker to come through and be passed to every
    /// output before it cuts the connections.
    pub stop_timeout_ms: u64,
    /// Most bytes waiting for a blocking output (unless its own `queue_bytes` says otherwise).
    pub send_queue_bytes: usize,
    /// Size of the buffers the upstream is read into.
    pub recv_chunk_bytes: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of every connection in bytes; unset: the kernel's default.
    pub socket_buffer_bytes: Option<usize>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            outputs: Vec::new(),
            policy: Policy::Copy,
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            send_queue_bytes: DEFAULT_SEND_QUEUE_BYTES,
            recv_chunk_bytes: DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// Most outputs of one dispatcher.
pub const MAX_OUTPUTS: usize = 64;

/// The typed schema of the `dispatcher` kind's configuration (`docs/operator-guide.md`,
/// "Parameters of the standard kinds").
pub fn schema() -> Schema {
    Schema::new("dispatcher")
        .key(Key::address(
            "listen",
            "Address the upstream connects to (port 0: a free port, which `configure` gives); bound at `configure`.",
        ))
        .key(crate::link::advertise_key())
        .key(
            Key::new(
                "outputs",
                Type::List { of: Box::new(Type::Table) },
                "The outputs (1 … 64), each `{ downstream = \"HOST:PORT\", mode = \"blocking\" | \"sampling\", queue_bytes = N }`; connected at `start`.",
            )
            .required(),
        )
        .key(Key::choice(
            "policy",
            &["copy", "round_robin"],
            "`copy`: every chunk to every output; `round_robin`: each chunk to one output in turn.",
        ))
        .key(
            Key::integer("connect_timeout_ms", 1, 86_400_000, "How long `start` retries connecting to each output.")
                .unit("ms"),
        )
        .key(
            Key::integer(
                "stop_timeout_ms",
                1,
                86_400_000,
                "How long `stop` waits for the end marker to come through and reach every output before it cuts the connections.",
            )
            .unit("ms"),
        )
        .key(
            Key::integer(
                "send_queue_bytes",
                4096,
                1 << 34,
                "Most bytes waiting for a blocking output (its own `queue_bytes` overrides); the upstream is not read beyond.",
            )
            .unit("bytes"),
        )
        .key(crate::link::recv_chunk_key())
        .key(
            Key::integer(
                "socket_buffer_bytes",
                1024,
                1 << 30,
                "`SO_SNDBUF` and `SO_RCVBUF` of every connection; unset: the kernel's default and auto-tuning.",
            )
            .unit("bytes"),
        )
        .output(crate::link::listen_output())
        .defaults_from(&DispatcherConfig::default())
}

impl DispatcherConfig {
    /// Checks the values and resolves the addresses.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "listen", &self.listen)?;
        for (i, o) in self.outputs.iter().enumerate() {
            resolve(name, &format!("outputs[{i}].downstream"), &o.downstream)?;
        }
        Ok(())
    }

    /// Checks every key against the [`schema`] and each output's keys, without resolving
    /// addresses (`daqflow run --check`).
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        let mut probe = self.clone();
        if self.outputs.is_empty() {
            c.problem("outputs", "needs at least one output: `[{ downstream = \"HOST:PORT\" }]`");
        }
        if self.outputs.len() > MAX_OUTPUTS {
            c.problem("outputs", format!("has {} outputs, at most {MAX_OUTPUTS}", self.outputs.len()));
        }
        for (i, o) in self.outputs.iter().enumerate() {
            let key = format!("outputs[{i}].downstream");
            if o.downstream.trim().is_empty() {
                c.problem(&key, "is required (HOST:PORT)");
            } else {
                c.address(&key, &o.downstream);
            }
            if let Some(q) = o.queue_bytes {
                c.int(&format!("outputs[{i}].queue_bytes"), q as u64, 4096, 1 << 34);
            }
        }
        probe.outputs.clear();
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
        let problems = schema().struct_problems(&DispatcherConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn outputs_are_parsed_and_checked_each_by_its_place() {
        let table: toml::Table = r#"
            policy = "round_robin"
            outputs = [{ downstream = "127.0.0.1:7000" }, { downstream = "127.0.0.1:7001", mode = "sampling", queue_bytes = 8192 }]
        "#
        .parse()
        .unwrap();
        let c: DispatcherConfig = table.try_into().unwrap();
        assert_eq!(c.policy, Policy::RoundRobin);
        assert_eq!((c.outputs[0].mode, c.outputs[1].mode), (Mode::Blocking, Mode::Sampling));
        assert_eq!((c.outputs[0].queue_bytes(100_000), c.outputs[1].queue_bytes(100_000)), (100_000, 8192));
        c.check("d").unwrap();
        let bad = DispatcherConfig {
            outputs: vec![
                OutputConfig { downstream: "nowhere".into(), ..Default::default() },
                OutputConfig { downstream: String::new(), mode: Mode::Sampling, queue_bytes: Some(10) },
            ],
            ..Default::default()
        };
        let e = bad.check("d").unwrap_err().to_string();
        assert!(e.contains("`outputs[0].downstream` = \"nowhere\" is not an address"), "{e}");
        assert!(e.contains("`outputs[1].downstream` is required"), "{e}");
        assert!(e.contains("`outputs[1].queue_bytes` = 10 is out of range"), "{e}");
        let e = DispatcherConfig::default().check("d").unwrap_err().to_string();
        assert!(e.contains("`outputs` needs at least one output"), "{e}");
        let unknown: toml::Table = "outputs = [{ downstream = \"127.0.0.1:1\", mod = \"sampling\" }]".parse().unwrap();
        assert!(unknown.try_into::<DispatcherConfig>().unwrap_err().to_string().contains("unknown field `mod`"));
    }
}
