//! `adc_monitor`: the demo's detector monitor, written as a user writes a monitor of their own
//! (`docs/histograms.md`): a function that decodes each built event's `adc` payloads
//! (`daqflow_evb::source::adc`: channel, ADC counts, time of each hit) and fills histograms,
//! made a kind by [`daqflow_et::components::monitor::user_kind`]. It uses only the public API a
//! program of one's own has.
//!
//! What it fills (emptied when a run starts):
//! - `adc_vs_channel`: ADC counts by channel (a two-dimensional map: every channel's spectrum);
//! - `time_vs_channel`: hit time by channel;
//! - `adc_ch<N>`: the ADC spectrum of each of the first `spectra` channels;
//! - `hits_per_event`: hits in an event;
//! - `hits` and `pulses` (hits above `threshold`): counters.
//!
//! ```
//! let kind = daqflow_kinds::adc_monitor::kind();
//! assert_eq!(kind.name, "adc_monitor");
//! ```

use daqflow_component::histogram::{Axis, HistogramSet};
use daqflow_component::schema::Key;
use daqflow_component::{ComponentError, Kind};
use daqflow_et::components::monitor::{UserFill, user_kind};
use daqflow_evb::source::adc;

/// The `adc_monitor` kind.
pub fn kind() -> Kind {
    user_kind(
        "adc_monitor",
        "an ET consumer filling a detector's histograms from its sources' `adc` payloads (the demo's)",
        vec![
            Key::integer("channels", 1, 65_536, "Channels on the histograms' channel axis: 0 … channels − 1.")
                .default_value(32),
            Key::integer("spectra", 0, 256, "The first this many channels get an ADC spectrum of their own.")
                .default_value(4),
            Key::integer("threshold", 0, 4095, "ADC counts above which a hit counts as a pulse.")
                .unit("ADC counts")
                .default_value(200),
        ],
        make,
    )
}

/// The monitor's code, from its configuration.
fn make(_name: &str, config: &toml::Table) -> Result<UserFill, ComponentError> {
    let int = |key: &str, default: i64| config.get(key).and_then(toml::Value::as_integer).unwrap_or(default);
    let channels = int("channels", 32) as f64;
    let spectra = int("spectra", 4) as u16;
    let threshold = int("threshold", 200) as u16;
    let adc_top = f64::from(adc::ADC_MAX) + 1.0;
    let time_top = f64::from(adc::TIME_WINDOW_NS);
    let n = channels as usize;
    let spectrum: Vec<(String, String)> =
        (0..spectra).map(|c| (format!("adc_ch{c}"), format!("ADC spectrum, channel {c}"))).collect();
    let mut hits: Vec<adc::Hit> = Vec::new();
    let fill: UserFill = Box::new(move |event, h: &mut HistogramSet| {
        hits.clear();
        for sf in event.super_fragments().flatten() {
            for fragment in sf.fragments().flatten() {
                hits.extend(adc::hits(fragment.payload_slice()));
            }
        }
        let map = h.h2(
            "adc_vs_channel",
            "ADC counts by channel",
            Axis::new("channel", 0.0, channels, n),
            Axis::new("ADC counts", 0.0, adc_top, 64),
        );
        for hit in &hits {
            map.fill(f64::from(hit.channel), f64::from(hit.adc));
        }
        let map = h.h2(
            "time_vs_channel",
            "Hit time by channel",
            Axis::new("channel", 0.0, channels, n),
            Axis::new("time (ns)", 0.0, time_top, 50),
        );
        for hit in &hits {
            map.fill(f64::from(hit.channel), f64::from(hit.time_ns));
        }
        // The spectra in channel order, booked before their first hit.
        for (name, title) in &spectrum {
            h.h1(name, title, "ADC counts", 0.0, adc_top, 128);
        }
        for hit in hits.iter().filter(|hit| hit.channel < spectra) {
            let (name, title) = &spectrum[usize::from(hit.channel)];
            h.h1(name, title, "ADC counts", 0.0, adc_top, 128).fill(f64::from(hit.adc));
        }
        h.h1("hits_per_event", "Hits per event", "hits", 0.0, 2048.0, 64).fill(hits.len() as f64);
        h.counter("hits", "Hits", "hits").value += hits.len() as u64;
        h.counter("pulses", "Hits above threshold", "hits").value +=
            hits.iter().filter(|hit| hit.adc > threshold).count() as u64;
    });
    Ok(fill)
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_wire::{Event, EventId, EventInfo, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags};

    /// A built event of two sources whose payloads hold `hits` hits each.
    fn event(id: u64, hits: usize) -> Event {
        let fragments: Vec<Fragment> = (0..2u32)
            .map(|src| {
                let mut payload = vec![0u8; hits * adc::HIT_LEN];
                adc::fill(&mut payload, id, src, 2);
                let info = FragmentInfo { source_id: src, event_id: EventId(id), ..Default::default() };
                Fragment::parse(Fragment::encode(&info, &payload)).unwrap()
            })
            .collect();
        let sf =
            SuperFragment::parse(SuperFragment::assemble(0, EventId(id), SuperFragmentFlags::default(), &fragments))
                .unwrap();
        Event::parse(Event::assemble(&EventInfo { event_id: EventId(id), ..Default::default() }, &[sf])).unwrap()
    }

    #[test]
    fn the_detector_histograms_hold_every_hit() {
        let config: toml::Table = toml::from_str("channels = 4\nspectra = 2\nthreshold = 200").unwrap();
        let mut fill = make("detector", &config).unwrap();
        let mut h = HistogramSet::default();
        for id in 1..=10 {
            fill(&event(id, 50), &mut h);
        }
        let published = h.to_json();
        let by_name = |n: &str| published.as_array().unwrap().iter().find(|x| x["name"] == n).cloned().unwrap();
        let map = by_name("adc_vs_channel");
        assert_eq!(
            (map["kind"].as_str(), map["entries"].as_u64(), map["outside"].as_u64()),
            (Some("h2"), Some(1000), Some(0))
        );
        assert_eq!(map["x"]["bins"], 4);
        let per_event = by_name("hits_per_event");
        assert_eq!((per_event["entries"].as_u64(), per_event["mean"].as_f64()), (Some(10), Some(100.0)));
        assert_eq!(by_name("hits")["value"], 1000);
        let spectra: u64 = ["adc_ch0", "adc_ch1"].iter().map(|n| by_name(n)["entries"].as_u64().unwrap()).sum();
        assert_eq!(spectra, 500, "source 0's channels are 0 and 1: each of its hits is in a spectrum");
        let pulses = by_name("pulses")["value"].as_u64().unwrap();
        assert!(pulses > 100 && pulses < 500, "{pulses}");
        let names: Vec<&str> = published.as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["adc_vs_channel", "time_vs_channel", "adc_ch0", "adc_ch1", "hits_per_event", "hits", "pulses"],
            "the spectra in channel order, only `spectra` of them"
        );
    }

    #[test]
    fn its_keys_are_checked_with_the_monitors() {
        let registry = crate::standard();
        let schema = registry.kind("adc_monitor").unwrap().schema.clone().unwrap();
        let names: Vec<&str> = schema.keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["et", "station", "cue", "prescale", "channels", "spectra", "threshold"]);
    }
}
