//! A monitor of one's own in Rust, as docs/histograms.md ("A monitor in Rust") shows it: a
//! function that fills histograms from each built event, made a kind by `user_kind`, run as a
//! component process. `cargo run -p daqflow-kinds --example my_monitor -- --set et=NAME` runs it
//! by hand (type `configure`, `start 1`, `stats`, `stop`, `quit`); in a system file, `command =
//! ["target/debug/examples/my_monitor"]` with `kind = "my_monitor"`.

use daqflow_component::histogram::{Axis, HistogramSet};
use daqflow_component::schema::Key;
use daqflow_et::components::monitor::{UserFill, user_kind};

fn my_monitor() -> daqflow_component::Kind {
    user_kind(
        "my_monitor",
        "my detector's histograms",
        vec![Key::integer("channels", 1, 65_536, "Channels.").default_value(64)],
        |_name, config| {
            let channels = config.get("channels").and_then(|v| v.as_integer()).unwrap_or(64) as f64;
            let fill: UserFill = Box::new(move |event, h: &mut HistogramSet| {
                for sf in event.super_fragments().flatten() {
                    for fragment in sf.fragments().flatten() {
                        let payload = fragment.payload_slice(); // decode your detector's format
                        h.h1("size", "Payload size", "bytes", 0.0, 4096.0, 64).fill(payload.len() as f64);
                        let map = h.h2(
                            "map",
                            "Source × size",
                            Axis::new("source", 0.0, channels, channels as usize),
                            Axis::new("bytes", 0.0, 4096.0, 32),
                        );
                        map.fill(f64::from(fragment.header().source_id), payload.len() as f64);
                    }
                }
                h.counter("events", "Events seen", "events").value += 1;
            });
            Ok(fill)
        },
    )
}

fn main() {
    daqflow_component::log::init("info");
    let mut registry = daqflow_kinds::standard();
    registry.add(my_monitor());
    // `--name NAME --control ADDR` (and the lease and operator in the environment) come from
    // the operator; `--set KEY=VALUE` from a person.
    let options = daqflow_component::process::Options::from_args("my_monitor", std::env::args().skip(1));
    match options.and_then(|options| daqflow_component::process::run(registry, options)) {
        Ok(failed) => std::process::exit(i32::from(failed)),
        Err(e) => {
            eprintln!("my_monitor: {e}");
            std::process::exit(2);
        }
    }
}
