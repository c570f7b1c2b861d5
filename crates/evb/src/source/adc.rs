//! The `adc` payload (`payload = "adc"`): what an emulated digitizer reads out, so that a
//! monitor has a detector's quantities to show (the demo's `detector` monitor,
//! `docs/histograms.md`). A payload is a run of 8-byte hits, little-endian (docs/evb.md,
//! "The `adc` payload"):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | channel: `source_id × channels + k`, k = 0 … `channels` − 1 |
//! | 2 | 2 | ADC counts, 0 … 4095 (12 bits) |
//! | 4 | 4 | time after the trigger, ns |
//!
//! A payload of `n` bytes holds `n / 8` hits; the bytes after the last whole hit are zero. About
//! a third of the hits are pulses: ADC counts of a pedestal (100 + 4 per channel, σ 6) plus an
//! exponential signal of mean 300 + 40 per channel, at 150 + 10 per channel ns (σ 8 ns); the rest
//! is pedestal noise at times uniform over 0 … 500 ns. Every value follows from (event, source):
//! a payload can be made again to check it.
//!
//! ```
//! use daqflow_evb::source::adc;
//! let mut payload = vec![0u8; 8 * 100 + 3];
//! adc::fill(&mut payload, 42, 1, 8);
//! let hits: Vec<adc::Hit> = adc::hits(&payload).collect();
//! assert_eq!(hits.len(), 100);
//! assert!(hits.iter().all(|h| (8..16).contains(&h.channel) && h.adc < 4096 && h.time_ns < 500));
//! ```

use crate::model::Rng;

/// The bytes of one hit.
pub const HIT_LEN: usize = 8;

/// The largest ADC value (12 bits).
pub const ADC_MAX: u16 = 4095;

/// The time window the hits fall in, ns.
pub const TIME_WINDOW_NS: u32 = 500;

/// One hit of an `adc` payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// The channel: `source_id × channels + k`.
    pub channel: u16,
    /// ADC counts, 0 … 4095.
    pub adc: u16,
    /// Time after the trigger, ns.
    pub time_ns: u32,
}

/// Writes the hits of (`event_id`, `source_id`) into `payload`, with `channels` channels per
/// source (at least 1), and zeroes the bytes after the last whole hit.
pub fn fill(payload: &mut [u8], event_id: u64, source_id: u32, channels: u16) {
    let channels = channels.max(1);
    let mut rng = Rng::new(event_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(source_id).rotate_left(32) ^ 0xADC);
    let mut chunks = payload.chunks_exact_mut(HIT_LEN);
    for chunk in &mut chunks {
        let k = (rng.next_u64() % u64::from(channels)) as u16;
        let pedestal = 100.0 + 4.0 * f64::from(k) + 6.0 * rng.normal();
        let (adc, time) = if rng.unit() < 1.0 / 3.0 {
            let signal = -(300.0 + 40.0 * f64::from(k)) * (1.0 - rng.unit()).ln();
            (pedestal + signal, 150.0 + 10.0 * f64::from(k) + 8.0 * rng.normal())
        } else {
            (pedestal, rng.unit() * f64::from(TIME_WINDOW_NS))
        };
        let channel = (source_id.wrapping_mul(u32::from(channels)).wrapping_add(u32::from(k))) as u16;
        let adc = adc.round().clamp(0.0, f64::from(ADC_MAX)) as u16;
        let time = time.round().clamp(0.0, f64::from(TIME_WINDOW_NS - 1)) as u32;
        chunk[0..2].copy_from_slice(&channel.to_le_bytes());
        chunk[2..4].copy_from_slice(&adc.to_le_bytes());
        chunk[4..8].copy_from_slice(&time.to_le_bytes());
    }
    chunks.into_remainder().fill(0);
}

/// The hits of an `adc` payload, in order (the bytes after the last whole hit are left out).
pub fn hits(payload: &[u8]) -> impl Iterator<Item = Hit> + '_ {
    payload.chunks_exact(HIT_LEN).map(|c| Hit {
        channel: u16::from_le_bytes([c[0], c[1]]),
        adc: u16::from_le_bytes([c[2], c[3]]),
        time_ns: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_made_again_from_event_and_source_and_looks_like_a_detector() {
        let mut a = vec![0xFFu8; 8 * 3000 + 5];
        fill(&mut a, 7, 2, 4);
        let mut b = vec![0u8; a.len()];
        fill(&mut b, 7, 2, 4);
        assert_eq!(a, b, "the same (event, source): the same bytes");
        assert_eq!(&a[a.len() - 5..], &[0; 5], "the tail after the last whole hit is zero");
        fill(&mut b, 8, 2, 4);
        assert_ne!(a, b);
        let hits: Vec<Hit> = hits(&a).collect();
        assert_eq!(hits.len(), 3000);
        assert!(hits.iter().all(|h| (8..12).contains(&h.channel)));
        // Every channel is hit; pulses (ADC well above the pedestal) are a third, late by their
        // channel's delay; channel 11's pedestal sits above channel 8's.
        let pulses: Vec<&Hit> = hits.iter().filter(|h| h.adc > 200).collect();
        let share = pulses.len() as f64 / hits.len() as f64;
        assert!((0.2..0.4).contains(&share), "{share}");
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let pedestal = |ch: u16| {
            mean(&hits.iter().filter(|h| h.channel == ch && h.adc < 150).map(|h| f64::from(h.adc)).collect::<Vec<_>>())
        };
        assert!(pedestal(11) > pedestal(8) + 8.0, "{} {}", pedestal(8), pedestal(11));
        let late = |ch: u16| {
            mean(&pulses.iter().filter(|h| h.channel == ch).map(|h| f64::from(h.time_ns)).collect::<Vec<_>>())
        };
        assert!(late(11) > late(8) + 15.0, "{} {}", late(8), late(11));
    }
}
