//! The fixed structures of a data file: file header, record header, index entry and trailer.

use crate::EventId;
use crate::crc::crc32c;
use crate::error::DecodeError;
use crate::le::{head, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Magic bytes at the start of every data file.
pub const FILE_MAGIC: [u8; 8] = *b"DQFLFILE";
/// Data-file format version written and read by this build.
pub const FILE_VERSION: u16 = 1;
/// Size of the file header.
pub const FILE_HEADER_LEN: usize = 72;
/// Magic number of a record header: the bytes `DREC`.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"DREC");
/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 24;
/// Magic number of the marker in front of the index: the bytes `DIDX`.
pub const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"DIDX");
/// Size of the index marker (magic and four zero bytes).
pub const INDEX_MARKER_LEN: usize = 8;
/// Size of one index entry in the trailer.
pub const INDEX_ENTRY_LEN: usize = 16;
/// Magic number at the start of the trailer footer: the bytes `DTRL`.
pub const TRAILER_MAGIC: u32 = u32::from_le_bytes(*b"DTRL");
/// Magic number in the last four bytes of a closed file: the bytes `DEND`.
pub const END_MAGIC: u32 = u32::from_le_bytes(*b"DEND");
/// Size of the trailer footer, the last bytes of a closed file.
pub const FOOTER_LEN: usize = 48;
/// Largest record payload this build writes or accepts (1 GiB).
pub const MAX_RECORD_LEN: u32 = 1 << 30;

/// The header at the start of a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Flags; none are defined yet, written as zero.
    pub flags: u32,
    /// The run the file belongs to.
    pub run_number: u32,
    /// Sequence number of the file within the run (and stream), from 1.
    pub file_sequence: u32,
    /// When the file was created, in ns since the Unix epoch.
    pub creation_time_ns: u64,
    /// Digest (e.g. SHA-256) of the configuration the run was taken with; zeros if none.
    pub config_digest: [u8; 32],
    /// Version of the software that wrote the file, `major << 16 | minor << 8 | patch`.
    pub writer_version: u32,
}

impl FileHeader {
    /// The bytes of this header, its CRC included.
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN] {
        let mut h = [0u8; FILE_HEADER_LEN];
        h[0..8].copy_from_slice(&FILE_MAGIC);
        put_u16(&mut h, 8, FILE_VERSION);
        put_u16(&mut h, 10, FILE_HEADER_LEN as u16);
        put_u32(&mut h, 12, self.flags);
        put_u32(&mut h, 16, self.run_number);
        put_u32(&mut h, 20, self.file_sequence);
        put_u64(&mut h, 24, self.creation_time_ns);
        h[32..64].copy_from_slice(&self.config_digest);
        put_u32(&mut h, 64, self.writer_version);
        let crc = crc32c(&h[..68]);
        put_u32(&mut h, 68, crc);
        h
    }

    /// Decodes and checks a file header.
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        const WHAT: &str = "file header";
        let h: &[u8; FILE_HEADER_LEN] = head(data).ok_or(DecodeError::Short {
            what: WHAT,
            need: FILE_HEADER_LEN as u64,
            have: data.len() as u64,
        })?;
        if h[0..8] != FILE_MAGIC {
            let mut found = [0u8; 8];
            found.copy_from_slice(&h[0..8]);
            return Err(DecodeError::BadMagicBytes { what: WHAT, found, expected: FILE_MAGIC });
        }
        let version = u16_at(h, 8);
        if version != FILE_VERSION {
            return Err(DecodeError::UnsupportedVersion { what: WHAT, found: version, supported: FILE_VERSION });
        }
        let header_len = u16_at(h, 10) as usize;
        if header_len != FILE_HEADER_LEN {
            return Err(DecodeError::BadHeaderLength {
                what: WHAT,
                found: header_len as u64,
                expected: FILE_HEADER_LEN as u64,
            });
        }
        let stored = u32_at(h, 68);
        let computed = crc32c(&h[..68]);
        if stored != computed {
            return Err(DecodeError::Inconsistent {
                what: WHAT,
                detail: format!("header CRC32C is {computed:#010x} but {stored:#010x} was stored"),
            });
        }
        let mut config_digest = [0u8; 32];
        config_digest.copy_from_slice(&h[32..64]);
        Ok(FileHeader {
            flags: u32_at(h, 12),
            run_number: u32_at(h, 16),
            file_sequence: u32_at(h, 20),
            creation_time_ns: u64_at(h, 24),
            config_digest,
            writer_version: u32_at(h, 64),
        })
    }

    /// The writer version as `(major, minor, patch)`.
    pub fn writer_version_parts(&self) -> (u8, u8, u8) {
        ((self.writer_version >> 16) as u8, (self.writer_version >> 8) as u8, self.writer_version as u8)
    }
}

/// The header in front of every event record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Length of the payload (without padding).
    pub payload_len: u32,
    /// The event the record holds.
    pub event_id: EventId,
    /// CRC32C of the payload.
    pub payload_crc: u32,
}

/// Why bytes at a record position are not a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordHeaderProblem {
    /// Not the record magic.
    NotARecord,
    /// The magic is there but the header CRC does not match or the length is impossible.
    Damaged,
}

impl RecordHeader {
    /// The bytes of this header, its CRC included.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut h = [0u8; RECORD_HEADER_LEN];
        put_u32(&mut h, 0, RECORD_MAGIC);
        put_u32(&mut h, 4, self.payload_len);
        put_u64(&mut h, 8, self.event_id.0);
        put_u32(&mut h, 16, self.payload_crc);
        let crc = crc32c(&h[..20]);
        put_u32(&mut h, 20, crc);
        h
    }

    pub(crate) fn decode(h: &[u8; RECORD_HEADER_LEN]) -> Result<Self, RecordHeaderProblem> {
        if u32_at(h, 0) != RECORD_MAGIC {
            return Err(RecordHeaderProblem::NotARecord);
        }
        if u32_at(h, 20) != crc32c(&h[..20]) {
            return Err(RecordHeaderProblem::Damaged);
        }
        let payload_len = u32_at(h, 4);
        if payload_len > MAX_RECORD_LEN {
            return Err(RecordHeaderProblem::Damaged);
        }
        Ok(RecordHeader { payload_len, event_id: EventId(u64_at(h, 8)), payload_crc: u32_at(h, 16) })
    }

    /// Bytes the record occupies in the file: header, payload and padding to 8 bytes.
    pub fn record_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + crate::le::pad8(self.payload_len as usize) as u64
    }
}

/// One entry of the trailer's index: where an event's record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexEntry {
    /// The event.
    pub event_id: EventId,
    /// File offset of the record header.
    pub offset: u64,
}

impl IndexEntry {
    pub(crate) fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut h = [0u8; INDEX_ENTRY_LEN];
        put_u64(&mut h, 0, self.event_id.0);
        put_u64(&mut h, 8, self.offset);
        h
    }

    pub(crate) fn decode(h: &[u8; INDEX_ENTRY_LEN]) -> Self {
        IndexEntry { event_id: EventId(u64_at(h, 0)), offset: u64_at(h, 8) }
    }
}

/// The footer at the very end of a closed file; it locates and protects the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Number of event records in the file.
    pub event_count: u64,
    /// File offset of the index marker; the records end here.
    pub index_offset: u64,
    /// Sum of the records' payload lengths.
    pub payload_bytes: u64,
    /// CRC32C of the index entries (not the marker).
    pub index_crc: u32,
}

impl Footer {
    /// The bytes of the footer.
    pub fn encode(&self) -> [u8; FOOTER_LEN] {
        let mut h = [0u8; FOOTER_LEN];
        put_u32(&mut h, 0, TRAILER_MAGIC);
        put_u32(&mut h, 4, FILE_VERSION as u32);
        put_u64(&mut h, 8, self.event_count);
        put_u64(&mut h, 16, self.index_offset);
        put_u64(&mut h, 24, self.payload_bytes);
        put_u32(&mut h, 32, self.index_crc);
        // 36..40 reserved
        let crc = crc32c(&h[..40]);
        put_u32(&mut h, 40, crc);
        put_u32(&mut h, 44, END_MAGIC);
        h
    }

    /// Decodes a footer: [`TrailerProblem::NotClosed`] if the bytes do not end in a footer's
    /// magic numbers (the file was not closed), another problem if they do but the footer is
    /// damaged.
    pub fn decode(h: &[u8; FOOTER_LEN]) -> Result<Self, TrailerProblem> {
        if u32_at(h, 0) != TRAILER_MAGIC || u32_at(h, 44) != END_MAGIC {
            return Err(TrailerProblem::NotClosed);
        }
        let version = u32_at(h, 4);
        if version != FILE_VERSION as u32 {
            return Err(TrailerProblem::FooterVersion(version));
        }
        let (stored, computed) = (u32_at(h, 40), crc32c(&h[..40]));
        if stored != computed {
            return Err(TrailerProblem::FooterCrc { stored, computed });
        }
        Ok(Footer {
            event_count: u64_at(h, 8),
            index_offset: u64_at(h, 16),
            payload_bytes: u64_at(h, 24),
            index_crc: u32_at(h, 32),
        })
    }
}

/// Why the trailer of a data file cannot be used: the file was not closed, or it was but its
/// trailer is damaged (then the records are still read, by a scan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailerProblem {
    /// The file does not end in a footer: its writer did not close it (it died, or still writes).
    NotClosed,
    /// The footer's magic numbers are there but its format version is not this build's.
    FooterVersion(u32),
    /// The footer's magic numbers are there but its CRC32C does not match: the footer is damaged.
    FooterCrc {
        /// The CRC32C stored in the footer.
        stored: u32,
        /// The CRC32C of the footer's bytes.
        computed: u32,
    },
    /// The footer is intact but its event count and index offset do not fit the file's size.
    Inconsistent,
    /// The index marker is missing or the index entries do not match the footer's CRC32C.
    IndexCrc,
}

impl TrailerProblem {
    /// Whether the file was closed but its trailer is damaged (not merely absent).
    pub fn is_damage(&self) -> bool {
        *self != TrailerProblem::NotClosed
    }
}

impl std::fmt::Display for TrailerProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrailerProblem::NotClosed => write!(f, "no trailer: the file was not closed"),
            TrailerProblem::FooterVersion(v) => write!(
                f,
                "the trailer's footer says format version {v} (this build reads version {FILE_VERSION}); ignoring the trailer"
            ),
            TrailerProblem::FooterCrc { stored, computed } => write!(
                f,
                "the trailer's footer is damaged: its CRC32C is {computed:#010x} but {stored:#010x} was stored; ignoring the trailer"
            ),
            TrailerProblem::Inconsistent => write!(f, "the trailer is inconsistent with the file size; ignoring it"),
            TrailerProblem::IndexCrc => write!(f, "the trailer's index CRC32C does not match; ignoring the index"),
        }
    }
}

/// The marker that separates the records from the index.
pub fn index_marker() -> [u8; INDEX_MARKER_LEN] {
    let mut h = [0u8; INDEX_MARKER_LEN];
    put_u32(&mut h, 0, INDEX_MAGIC);
    h
}
