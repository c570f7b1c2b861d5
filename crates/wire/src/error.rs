//! Error types of the wire formats. Each says which structure failed and why, so that a log
//! line is enough to find the bad producer.

use crate::EventId;

/// A header or a container could not be decoded. Decoding never panics; it returns one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes are available than the structure needs.
    #[error("{what}: needs {need} bytes but only {have} are available")]
    Short {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// The magic number is wrong: the bytes are not this structure (or the stream lost alignment).
    #[error(
        "{what}: bad magic {found:#010x}, expected {expected:#010x} (not daqflow data, or the stream is misaligned)"
    )]
    BadMagic {
        /// The structure being decoded.
        what: &'static str,
        /// The magic number found.
        found: u32,
        /// The magic number of this structure.
        expected: u32,
    },
    /// The magic bytes at the start of a data file are wrong: the bytes are not a daqflow data
    /// file. Both are shown in full, as hex and as text.
    #[error("{what}: bad magic {}, expected {} (not a daqflow data file)", show_bytes(.found), show_bytes(.expected))]
    BadMagicBytes {
        /// The structure being decoded.
        what: &'static str,
        /// The bytes found.
        found: [u8; 8],
        /// The magic bytes of this structure.
        expected: [u8; 8],
    },
    /// The structure was written by a format version this build does not read.
    #[error("{what}: format version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// The structure being decoded.
        what: &'static str,
        /// The version found.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The header length field disagrees with the format.
    #[error("{what}: header length {found} where the format says {expected}")]
    BadHeaderLength {
        /// The structure being decoded.
        what: &'static str,
        /// The header length found.
        found: u64,
        /// The header length of this version.
        expected: u64,
    },
    /// A length or count field contradicts the others or the data around it.
    #[error("{what}: {detail}")]
    Inconsistent {
        /// The structure being decoded.
        what: &'static str,
        /// What does not add up.
        detail: String,
    },
}

/// A payload's CRC32C does not match the value stored with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "fragment of event {event_id} from source {source_id}: payload CRC32C is {computed:#010x} but {stored:#010x} was stored"
)]
pub struct CrcMismatch {
    /// The fragment's event.
    pub event_id: EventId,
    /// The fragment's source.
    pub source_id: u32,
    /// CRC stored in the header.
    pub stored: u32,
    /// CRC computed over the payload.
    pub computed: u32,
}

/// Bytes as hex and, where printable, as text: `44 51 46 4c 46 49 4c 45 ("DQFLFILE")`.
fn show_bytes(b: &[u8]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    let text: String = b.iter().map(|&x| if x.is_ascii_graphic() || x == b' ' { x as char } else { '.' }).collect();
    format!("{} ({text:?})", hex.join(" "))
}
