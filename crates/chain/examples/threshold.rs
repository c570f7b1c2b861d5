//! A chain component of your own with named, typed ports (DAQ-Middleware's component model,
//! `docs/operator-guide.md`, "Chain components of your own"): it takes ADC chunks on its input
//! `raw` and passes those whose first sample (a little-endian `u16`) is at least `threshold` to
//! its output `accepted`, the others to `rejected`. The ports, their connections, the stream
//! protocol, the end markers and the state machine are the framework's; this file is the logic.
//!
//! In a system file, fed by a dispatcher and feeding a logger and a sink:
//!
//! ```toml
//! [[component]]
//! name = "cut"
//! kind = "threshold"
//! command = ["target/release/examples/threshold"]
//! [component.params]
//! threshold = 512
//! downstream.accepted = "${log.listen}"
//! downstream.rejected = "${sink.listen}"
//! # its input's address is ${cut.raw} (or ${cut.listen}), for the upstream's `downstream`
//! ```
//!
//! or by hand: `cargo run -p daqflow-chain --example threshold -- --set threshold=512
//! --set downstream.accepted=127.0.0.1:7300 --set downstream.rejected=127.0.0.1:7301`, then type
//! `configure`, `start 1`, `stats`, `stop`, `quit`.
use bytes::Bytes;
use daqflow_chain::ports::{InPort, Logic, OutPort, Outputs, kind};
use daqflow_component::{Registry, parse_config};

/// Its own keys (the port keys are the framework's).
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ThresholdConfig {
    /// Chunks whose first sample is at least this are accepted.
    #[serde(default)]
    threshold: u16,
}

struct Threshold {
    threshold: u16,
    accepted: u64,
    rejected: u64,
}

impl Logic for Threshold {
    fn inputs(&self) -> Vec<InPort> {
        vec![InPort::typed("raw", "adc")]
    }

    fn outputs(&self) -> Vec<OutPort> {
        vec![OutPort::typed("accepted", "adc"), OutPort::typed("rejected", "adc")]
    }

    fn begin(&mut self, _run: u32) -> Result<(), String> {
        (self.accepted, self.rejected) = (0, 0);
        Ok(())
    }

    fn on_chunk(&mut self, _input: &str, data: Bytes, out: &mut Outputs) -> Result<(), String> {
        let first = data.first_chunk::<2>().map_or(0, |s| u16::from_le_bytes(*s));
        if first >= self.threshold {
            self.accepted += 1;
            out.send("accepted", &data)
        } else {
            self.rejected += 1;
            out.send("rejected", &data)
        }
    }

    fn detail(&self) -> serde_json::Value {
        serde_json::json!({ "accepted": self.accepted, "rejected": self.rejected })
    }
}

fn main() {
    let mut registry = Registry::new();
    registry.add(kind("threshold", "passes ADC chunks above a threshold", |name, table| {
        let c: ThresholdConfig = parse_config(name, table)?;
        Ok(Threshold { threshold: c.threshold, accepted: 0, rejected: 0 })
    }));
    // The token, `--name NAME --control ADDR` from the operator, `--set KEY=VALUE` from a person.
    std::process::exit(daqflow_chain::ports::run_process("threshold", registry));
}
