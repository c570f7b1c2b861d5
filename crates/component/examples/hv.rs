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
use daqflow_component::schema::{Key, Schema};
use daqflow_component::{Component, ComponentError, Info, Kind, Registry, Role, State, Stats, parse_config};

/// Its configuration: every key documented, unknown keys refused.
#[derive(serde::Deserialize, serde::Serialize, Default)]
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

/// The typed schema of its configuration: the operator's `--check`, the driver's checks of
/// every value (at configure and live), the web UI's Parameters form and `schema` on its
/// standard input all come from it.
fn schema() -> Schema {
    Schema::new("hv")
        .key(Key::integer("channel", 0, 63, "The supply's channel.").required())
        .key(
            Key::float("volts", 0.0, 2000.0, "The set point, ramped to at once.")
                .unit("V")
                .live(&[State::Configured, State::Paused]),
        )
        .output(Key::integer("channel", 0, 63, "The channel it drives."))
        .defaults_from(&HvConfig::default())
}

impl HighVoltage {
    /// Ramps to `volts` (in range: the schema checked it).
    fn ramp_to(&mut self, volts: f64) -> Result<(), ComponentError> {
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
    // Called only for `volts`, only while Configured or Paused, with a number in range.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        let volts = value.as_float().ok_or_else(|| ComponentError::Refused(format!("`{key}` = {value}: a number")))?;
        self.ramp_to(volts)
    }
}

fn main() {
    daqflow_component::log::init("info");
    let mut registry = Registry::new();
    registry.add(
        Kind::new("hv", "ramps the high voltage", Role::Other, |name, table| {
            Ok(Box::new(HighVoltage { config: parse_config(name, table)?, ramps: 0 }))
        })
        .schema(schema()),
    );
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_schema_is_the_configuration_struct_s() {
        let problems = super::schema().struct_problems(&super::HvConfig::default());
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
