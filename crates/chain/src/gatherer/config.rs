//! Configuration of a gatherer.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::framing::{Endian, Framing};
use crate::link::{Tuning, resolve};
use daqflow_component::ComponentError;
use daqflow_component::schema::{Key, Schema, Type};

/// A raw TCP readout link: the gatherer listens, the front end connects and sends frames cut
/// by a length field ([`Framing`]); the link ends when the front end closes the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpInput {
    /// Address the front end connects to (port 0: a free port, which `configure` gives).
    pub listen: String,
    /// Bytes of each frame's header.
    pub header_bytes: usize,
    /// Offset of the length field in the header.
    pub length_offset: usize,
    /// Bytes of the length field: 1, 2, 4 or 8.
    pub length_width: usize,
    /// `"little"` or `"big"`.
    pub length_endian: Endian,
    /// Whether the length counts the whole frame rather than the body.
    pub length_includes_header: bool,
    /// Largest frame taken; a longer one fails the gatherer (wrong framing or a broken link).
    pub max_frame_bytes: usize,
}

impl Default for TcpInput {
    fn default() -> Self {
        let f = Framing::default();
        TcpInput {
            listen: "127.0.0.1:0".into(),
            header_bytes: f.header_bytes,
            length_offset: f.length_offset,
            length_width: f.length_width,
            length_endian: f.length_endian,
            length_includes_header: f.length_includes_header,
            max_frame_bytes: f.max_frame_bytes,
        }
    }
}

impl TcpInput {
    /// Its framing.
    pub fn framing(&self) -> Framing {
        Framing {
            header_bytes: self.header_bytes,
            length_offset: self.length_offset,
            length_width: self.length_width,
            length_endian: self.length_endian,
            length_includes_header: self.length_includes_header,
            max_frame_bytes: self.max_frame_bytes,
        }
    }
}

/// A daqflow data file replayed: each record one chunk; the input ends at the file's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct FileInput {
    /// The file (`docs/file-format.md`).
    pub path: PathBuf,
}

/// Generated chunks, as the generator makes them; the input ends at `stop`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SourceInput {
    /// Bytes of each chunk.
    pub chunk_bytes: usize,
    /// Chunks per second; 0: as fast as the chain takes them.
    pub rate_hz: f64,
}

impl Default for SourceInput {
    fn default() -> Self {
        SourceInput { chunk_bytes: 4096, rate_hz: 1000.0 }
    }
}

/// One readout link of a gatherer: `{ kind = "tcp", … }`, `{ kind = "file", path = "…" }` or
/// `{ kind = "source", … }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum InputConfig {
    /// A raw TCP link with length-field framing.
    Tcp(TcpInput),
    /// A data file replayed.
    File(FileInput),
    /// Generated chunks.
    Source(SourceInput),
}

/// Configuration of a gatherer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GathererConfig {
    /// Address of the next component (a dispatcher, a repeater, a logger, a sink). Required.
    pub downstream: String,
    /// The readout links, one to 64.
    pub inputs: Vec<InputConfig>,
    /// How long (ms) `start` retries connecting to `downstream`.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for the TCP links to close and the end marker to be written.
    pub stop_timeout_ms: u64,
    /// Most bytes waiting for `downstream`; the inputs wait beyond.
    pub send_queue_bytes: usize,
}

impl Default for GathererConfig {
    fn default() -> Self {
        GathererConfig {
            downstream: String::new(),
            inputs: Vec::new(),
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            send_queue_bytes: crate::DEFAULT_SEND_QUEUE_BYTES,
        }
    }
}

/// The typed schema of the `gatherer` kind's configuration.
pub fn schema() -> Schema {
    Schema::new("gatherer")
        .key(Key::address("downstream", "Address of the next component; connected at `start`.").required())
        .key(
            Key::new(
                "inputs",
                Type::List { of: Box::new(Type::Table) },
                "The readout links (1 … 64): `{ kind = \"tcp\", listen, header_bytes, length_offset, length_width, length_endian, length_includes_header, max_frame_bytes }`, `{ kind = \"file\", path }`, `{ kind = \"source\", chunk_bytes, rate_hz }`.",
            )
            .required(),
        )
        .key(Key::integer("connect_timeout_ms", 1, 86_400_000, "How long `start` retries connecting to `downstream`.").unit("ms"))
        .key(
            Key::integer(
                "stop_timeout_ms",
                1,
                86_400_000,
                "How long `stop` waits for the TCP links to close and the end marker to be written.",
            )
            .unit("ms"),
        )
        .key(
            Key::integer("send_queue_bytes", 4096, 1 << 34, "Most bytes waiting for `downstream`; the inputs wait beyond.")
                .unit("bytes"),
        )
        .output(Key::address("listen", "The address of its first TCP link (the front end connects there)."))
        .defaults_from(&GathererConfig::default())
}

impl GathererConfig {
    /// Checks every key, each link's too, without resolving addresses.
    pub fn check(&self, name: &str) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        let mut probe = self.clone();
        if self.downstream.trim().is_empty() {
            c.problem("downstream", "is required (HOST:PORT)");
            probe.downstream = "127.0.0.1:9".into();
        }
        if self.inputs.is_empty() || self.inputs.len() > 64 {
            c.problem("inputs", format!("has {} links: 1 … 64", self.inputs.len()));
        }
        for (i, input) in self.inputs.iter().enumerate() {
            match input {
                InputConfig::Tcp(t) => {
                    c.address(&format!("inputs[{i}].listen"), &t.listen);
                    if let Err(e) = t.framing().check() {
                        c.problem(&format!("inputs[{i}]"), e);
                    }
                }
                InputConfig::File(f) if f.path.as_os_str().is_empty() => {
                    c.problem(&format!("inputs[{i}].path"), "is required (a daqflow data file)")
                }
                InputConfig::File(_) => {}
                InputConfig::Source(s) => {
                    c.int(&format!("inputs[{i}].chunk_bytes"), s.chunk_bytes as u64, 1, crate::MAX_CHUNK_BYTES as u64);
                    c.float(&format!("inputs[{i}].rate_hz"), s.rate_hz, 0.0, 1e9);
                }
            }
        }
        probe.inputs.clear();
        c.schema(&schema(), &probe);
        c.finish()
    }

    /// Checks and resolves the addresses.
    pub fn validate(&self, name: &str) -> Result<(), ComponentError> {
        self.check(name)?;
        resolve(name, "downstream", &self.downstream)?;
        Ok(())
    }

    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: self.send_queue_bytes,
            recv_chunk_bytes: crate::DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = schema().struct_problems(&GathererConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn links_are_parsed_and_checked_each_by_its_place() {
        let t: toml::Table = r#"
            downstream = "127.0.0.1:1"
            inputs = [
              { kind = "tcp", length_offset = 2, length_width = 2, length_endian = "big", header_bytes = 4 },
              { kind = "file", path = "/data/run1.daq" },
              { kind = "source", chunk_bytes = 100 },
            ]"#
        .parse()
        .unwrap();
        let c: GathererConfig = t.try_into().unwrap();
        c.check("g").unwrap();
        let InputConfig::Tcp(tcp) = &c.inputs[0] else { panic!() };
        assert_eq!((tcp.length_offset, tcp.length_width, tcp.length_endian), (2, 2, Endian::Big));
        let bad: toml::Table =
            "downstream = '127.0.0.1:1'\ninputs = [{ kind = 'tcp', length_width = 3 }, { kind = 'file' }]"
                .parse()
                .unwrap();
        let e = bad.try_into::<GathererConfig>().unwrap().check("g").unwrap_err().to_string();
        assert!(e.contains("`inputs[0]` length_width = 3: must be 1, 2, 4 or 8"), "{e}");
        assert!(e.contains("`inputs[1].path` is required"), "{e}");
        let typo: toml::Table = "inputs = [{ kind = 'tcp', lenght_width = 2 }]".parse().unwrap();
        assert!(typo.try_into::<GathererConfig>().unwrap_err().to_string().contains("lenght_width"));
    }
}
