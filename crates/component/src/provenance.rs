//! Run provenance in the components' configuration: the digest of the system file a run was
//! configured from, which every data file of the run carries in its header
//! (`docs/formats.md`, `config_digest`; `docs/operator-guide.md`, "Provenance").
//!
//! The operator computes the SHA-256 of the system file's bytes and gives it, as 64 hex digits,
//! to every component whose [`Kind`](crate::Kind) says it writes data files with it
//! ([`Kind::takes_system_digest`](crate::Kind::takes_system_digest)), in the reserved
//! configuration key [`SYSTEM_DIGEST_KEY`]. A component configured without it (run alone by
//! `daqflow component`) writes zeros: no digest.
//!
//! ```
//! use daqflow_component::provenance::Digest;
//! let hex = "ab".repeat(32);
//! let d: Digest = hex.parse().unwrap();
//! assert_eq!(d.0, [0xab; 32]);
//! assert_eq!(d.to_string(), hex);
//! assert!("xyz".parse::<Digest>().unwrap_err().to_string().contains("64 hex digits"));
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The configuration key in which the operator gives a component the system file's digest
/// (64 hex digits). Reserved: the operator sets it, a system file or `set` cannot.
pub const SYSTEM_DIGEST_KEY: &str = "system_digest";

/// A SHA-256 digest (32 bytes), written as 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

/// Why a text is not a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a SHA-256 digest: expected 64 hex digits")]
pub struct DigestError(pub String);

impl Digest {
    /// Whether it is all zeros (no digest).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Digest, DigestError> {
        let err = || DigestError(s.chars().take(80).collect());
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(err());
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).ok_or_else(err);
            out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Ok(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The schema's key [`SYSTEM_DIGEST_KEY`] of a kind that writes data files
/// ([`Kind::takes_system_digest`](crate::Kind::takes_system_digest)).
pub fn schema_key() -> crate::schema::Key {
    crate::schema::Key::text(
        SYSTEM_DIGEST_KEY,
        "Reserved: the SHA-256 of the system file (64 hex digits), written in every data file's header; the operator sets it.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_reads_back_what_it_writes_and_refuses_anything_else() {
        let d = Digest(std::array::from_fn(|i| i as u8 * 7));
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
        assert_eq!("AB".repeat(32).parse::<Digest>(), Ok(Digest([0xab; 32])));
        for bad in ["", "ab", &"g0".repeat(32), &"ab".repeat(33), &"é".repeat(32)] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
        #[derive(Deserialize, Debug)]
        struct C {
            #[allow(dead_code)]
            system_digest: Digest,
        }
        let e = toml::from_str::<C>("system_digest = 'nope'").unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
        assert!(Digest::default().is_zero());
    }
}
