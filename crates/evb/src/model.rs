//! Fragment-size models and the sources' payload pattern.
//!
//! A source draws each fragment's payload size from a [`SizeModel`]: fixed, uniform, or
//! log-normal with a given mean and RMS (the CMS paper, section 4.4, emulates each FEROL stream
//! this way from sizes measured in physics running). A [`StreamTable`] gives every stream its
//! own model, loaded from a small text table.
//!
//! The payload is a pattern of 64-bit words that depends on the event, the source and the word's
//! position ([`fill_pattern`]), so that any reader can check it ([`check_pattern`]) on top of the
//! fragment's CRC.
//!
//! ```
//! use daqflow_evb::model::{SizeModel, Rng, StreamTable};
//! let model = SizeModel::LogNormal { mean: 2048.0, rms: 1024.0 };
//! let mut rng = Rng::new(1);
//! let sizes: Vec<usize> = (0..10_000).map(|_| model.sample(&mut rng, 1 << 20)).collect();
//! let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
//! assert!((mean - 2048.0).abs() < 100.0);
//!
//! let table = StreamTable::parse("# source mean rms\n0 1024 256\n1 4096 2048\n").unwrap();
//! assert_eq!(table.model_for(1), Some(SizeModel::LogNormal { mean: 4096.0, rms: 2048.0 }));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a source chooses fragment payload sizes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SizeModel {
    /// Every fragment has `bytes` of payload.
    Fixed {
        /// Payload bytes.
        bytes: usize,
    },
    /// Uniform between `min` and `max` bytes (inclusive).
    Uniform {
        /// Smallest payload.
        min: usize,
        /// Largest payload.
        max: usize,
    },
    /// Log-normal with this mean and RMS, in bytes.
    LogNormal {
        /// Mean payload size.
        mean: f64,
        /// Root-mean-square spread of the payload size.
        rms: f64,
    },
}

impl Default for SizeModel {
    fn default() -> Self {
        SizeModel::Fixed { bytes: 1024 }
    }
}

/// The schema's keys of a size model in the table `table` (`size.kind`, `size.bytes`, …).
pub fn schema_keys(table: &str, what: &str) -> Vec<daqflow_component::schema::Key> {
    use daqflow_component::schema::Key;
    let k = |key: &str| format!("{table}.{key}");
    vec![
        Key::choice(
            &k("kind"),
            &["fixed", "uniform", "lognormal"],
            &format!("{what}: the model (each takes its own keys below)."),
        ),
        Key::integer(&k("bytes"), 0, 1 << 30, "`fixed`: payload bytes of every fragment.").unit("bytes"),
        Key::integer(&k("min"), 0, 1 << 30, "`uniform`: smallest payload.").unit("bytes"),
        Key::integer(&k("max"), 0, 1 << 30, "`uniform`: largest payload (at least `min`).").unit("bytes"),
        Key::float(&k("mean"), 0.0, 1e12, "`lognormal`: mean payload size (more than 0).").unit("bytes"),
        Key::float(&k("rms"), 0.0, 1e12, "`lognormal`: root-mean-square spread of the payload size.").unit("bytes"),
    ]
}

impl SizeModel {
    /// Draws one size, at most `max`.
    pub fn sample(&self, rng: &mut Rng, max: usize) -> usize {
        let v = match *self {
            SizeModel::Fixed { bytes } => bytes,
            SizeModel::Uniform { min, max: hi } => {
                let (lo, hi) = (min.min(hi), min.max(hi));
                lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
            }
            SizeModel::LogNormal { mean, rms } => {
                if mean <= 0.0 {
                    0
                } else {
                    let sigma2 = (1.0 + (rms / mean).powi(2)).ln();
                    let mu = mean.ln() - sigma2 / 2.0;
                    (mu + sigma2.sqrt() * rng.normal()).exp().round() as usize
                }
            }
        };
        v.min(max)
    }

    /// The mean size of the model.
    pub fn mean(&self) -> f64 {
        match *self {
            SizeModel::Fixed { bytes } => bytes as f64,
            SizeModel::Uniform { min, max } => (min + max) as f64 / 2.0,
            SizeModel::LogNormal { mean, .. } => mean,
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            SizeModel::LogNormal { mean, rms }
                if !(mean.is_finite() && mean > 0.0 && rms.is_finite() && rms >= 0.0) =>
            {
                Err(format!("log-normal size model needs mean > 0 and rms >= 0 (got mean {mean}, rms {rms})"))
            }
            SizeModel::Uniform { min, max } if min > max => Err(format!("uniform size model: min {min} > max {max}")),
            _ => Ok(()),
        }
    }
}

/// Per-stream size models, from a text table with one line per stream:
/// `source_id mean_bytes rms_bytes` (log-normal), blank lines and `#` comments ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamTable {
    streams: BTreeMap<u32, SizeModel>,
}

impl StreamTable {
    /// Parses a table; errors name the line.
    pub fn parse(text: &str) -> Result<StreamTable, String> {
        let mut streams = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let cols: Vec<&str> =
                line.split(|c: char| c.is_whitespace() || c == ',').filter(|c| !c.is_empty()).collect();
            let err = |what: &str| format!("stream table line {}: {what}: `{line}`", n + 1);
            if cols.len() != 3 {
                return Err(err("expected `source_id mean_bytes rms_bytes`"));
            }
            let id: u32 = cols[0].parse().map_err(|_| err("source id is not a number"))?;
            let mean: f64 = cols[1].parse().map_err(|_| err("mean is not a number"))?;
            let rms: f64 = cols[2].parse().map_err(|_| err("rms is not a number"))?;
            let model = SizeModel::LogNormal { mean, rms };
            model.validate().map_err(|e| err(&e))?;
            if streams.insert(id, model).is_some() {
                return Err(err("source listed twice"));
            }
        }
        Ok(StreamTable { streams })
    }

    /// Reads and parses a table file.
    pub fn load(path: &std::path::Path) -> Result<StreamTable, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The model of stream `source_id`.
    pub fn model_for(&self, source_id: u32) -> Option<SizeModel> {
        self.streams.get(&source_id).copied()
    }

    /// The streams, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, SizeModel)> + '_ {
        self.streams.iter().map(|(k, v)| (*k, *v))
    }

    /// Number of streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// A small, fast, seedable generator (SplitMix64); sources need speed and reproducibility, not
/// cryptography.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn pattern_word(event_id: u64, source_id: u32, word: u64) -> u64 {
    event_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(source_id) << 40) ^ word
}

/// Fills `payload` with the pattern of (`event_id`, `source_id`).
pub fn fill_pattern(payload: &mut [u8], event_id: u64, source_id: u32) {
    let n = (payload.len() / 8) as u64;
    let mut chunks = payload.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&pattern_word(event_id, source_id, i as u64).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let w = pattern_word(event_id, source_id, n).to_le_bytes();
        let len = rest.len();
        rest.copy_from_slice(&w[..len]);
    }
}

/// Whether `payload` holds the pattern of (`event_id`, `source_id`); the offset of the first
/// wrong byte otherwise.
pub fn check_pattern(payload: &[u8], event_id: u64, source_id: u32) -> Result<(), usize> {
    for (i, c) in payload.chunks(8).enumerate() {
        let w = pattern_word(event_id, source_id, i as u64).to_le_bytes();
        if c != &w[..c.len()] {
            let j = c.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0);
            return Err(i * 8 + j);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_normal_has_the_asked_mean_and_rms() {
        let m = SizeModel::LogNormal { mean: 4000.0, rms: 2000.0 };
        let mut rng = Rng::new(7);
        let v: Vec<f64> = (0..200_000).map(|_| m.sample(&mut rng, usize::MAX) as f64).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let rms = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!((mean / 4000.0 - 1.0).abs() < 0.02, "mean {mean}");
        assert!((rms / 2000.0 - 1.0).abs() < 0.05, "rms {rms}");
    }

    #[test]
    fn uniform_stays_in_range_and_fixed_is_fixed() {
        let mut rng = Rng::new(1);
        let u = SizeModel::Uniform { min: 10, max: 20 };
        let v: Vec<usize> = (0..1000).map(|_| u.sample(&mut rng, 1 << 20)).collect();
        assert!(v.iter().all(|&x| (10..=20).contains(&x)));
        assert!(v.contains(&10) && v.contains(&20));
        assert_eq!(SizeModel::Fixed { bytes: 5 }.sample(&mut rng, 3), 3);
    }

    #[test]
    fn the_pattern_checks_and_finds_the_first_bad_byte() {
        for len in [0, 1, 7, 8, 9, 100] {
            let mut p = vec![0u8; len];
            fill_pattern(&mut p, 42, 3);
            assert_eq!(check_pattern(&p, 42, 3), Ok(()));
            if len > 5 {
                p[5] ^= 1;
                assert_eq!(check_pattern(&p, 42, 3), Err(5));
                assert!(check_pattern(&p, 43, 3).is_err());
            }
        }
    }

    #[test]
    fn bad_tables_name_the_line() {
        assert!(StreamTable::parse("0 1 1\n1 x 1\n").unwrap_err().contains("line 2"));
        assert!(StreamTable::parse("0 1 1\n0 1 1\n").unwrap_err().contains("twice"));
        assert!(StreamTable::parse("0 -1 1\n").is_err());
        assert_eq!(StreamTable::parse("# nothing\n\n").unwrap().len(), 0);
    }
}
