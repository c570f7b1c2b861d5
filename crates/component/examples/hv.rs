//! A component program of your own: a high-voltage supply (`docs/operator-guide.md`, "Writing
//! your own component"). It links `daqflow-component` only, the contract and its run loop: no
//! operator, no database, no HTTP.
//!
//! Name it in a system file:
//!
//! ```toml
//! [[component]]
//! name = "hv"
//! kind = "hv"
//! command = ["target/release/examples/hv"]
//! channel = 3
//! ```
//!
//! or run it by hand and type commands (`configure`, `start 1`, `set volts=1200`, `stats`,
//! `stop`, `quit`): `cargo run -p daqflow-component --example hv -- --set channel=3`.
use daqflow_component::process::{Options, run};
use daqflow_component::{Component, ComponentError, Info, Kind, Live, Registry, Role, State, Stats, parse_config};

/// Its configuration: every key documented, unknown keys refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HvConfig {
    /// The supply's channel.
    channel: u32,
    /// The set point in volts, 0 … 2000.
    #[serde(default)]
    volts: f64,
}

/// What it reports besides the standard counters (`detail` of its statistics).
#[derive(serde::Serialize)]
struct HvDetail {
    ramps: u64,
    volts: f64,
}

struct HighVoltage {
    config: HvConfig,
    ramps: u64,
}

impl HighVoltage {
    const LIVE: &'static [Live] = &[Live {
        key: "volts",
        states: &[State::Configured, State::Paused],
        about: "the set point, ramped to at once",
    }];

    fn ramp_to(&mut self, volts: f64) -> Result<(), ComponentError> {
        if !(0.0..=2000.0).contains(&volts) {
            return Err(ComponentError::Config(format!("`volts` = {volts} must be 0 … 2000")));
        }
        self.config.volts = volts;
        self.ramps += 1;
        Ok(())
    }
}

impl Component for HighVoltage {
    fn configure(&mut self) -> Result<Info, ComponentError> {
        let volts = self.config.volts;
        self.ramp_to(volts)?;
        let mut info = Info::new();
        info.insert("channel".into(), self.config.channel.into());
        Ok(info)
    }
    fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
        Ok(())
    }
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        Ok(self.stats())
    }
    fn stats(&self) -> Stats {
        Stats::default().with_detail(&HvDetail { ramps: self.ramps, volts: self.config.volts })
    }
    fn live(&self) -> &'static [Live] {
        Self::LIVE
    }
    fn set(&mut self, key: &str, value: &serde_json::Value) -> Result<(), ComponentError> {
        let volts =
            value.as_f64().ok_or_else(|| ComponentError::Config(format!("`{key}` = {value} is not a number")))?;
        self.ramp_to(volts)
    }
}

fn main() {
    daqflow_component::log::init("info");
    let mut registry = Registry::new();
    registry.add(Kind::new("hv", "ramps the high voltage", Role::Other, |name, table| {
        Ok(Box::new(HighVoltage { config: parse_config(name, table)?, ramps: 0 }))
    }));
    // `--name NAME --control ADDR` (and the lease and operator in the environment) come from
    // the operator; `--set KEY=VALUE` from a person.
    let failed = Options::from_args("hv", std::env::args().skip(1)).and_then(|options| run(registry, options));
    match failed {
        Ok(failed) => std::process::exit(i32::from(failed)),
        Err(e) => {
            eprintln!("hv: {e}");
            std::process::exit(2);
        }
    }
}
