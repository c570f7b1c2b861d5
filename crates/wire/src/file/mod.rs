//! The data file format: a file header, event records, and a trailer with an index.
//!
//! ```text
//! ┌──────────────┬──────────┬──────────┬─────┬──────────────────────┬──────────┐
//! │ file header  │ record 0 │ record 1 │ ... │ DIDX + index         │ footer   │
//! │ 72 B         │ 24 B hdr │          │     │ 8 B + 16 B / event   │ 48 B     │
//! │              │ + payload│          │     │                      │          │
//! └──────────────┴──────────┴──────────┴─────┴──────────────────────┴──────────┘
//! ```
//!
//! Every structure carries a CRC32C: the file header its own, each record its header and its
//! payload, the index and the footer theirs. A file that was being written when its writer
//! died has no trailer; [`FileReader`] then scans it from the start and returns every whole
//! record, reporting the partial one at the end as [`ScanItem::CutShort`]. The byte layout is
//! specified in `docs/formats.md`. [`DiskWatcher`] throttles a writer before its disk is full.

mod disk;
mod format;
mod reader;
mod writer;

pub use disk::{DiskChange, DiskError, DiskMarks, DiskReport, DiskSpace, DiskWatcher, is_disk_full};
pub use format::{
    END_MAGIC, FILE_HEADER_LEN, FILE_MAGIC, FILE_VERSION, FOOTER_LEN, FileHeader, Footer, INDEX_ENTRY_LEN, INDEX_MAGIC,
    INDEX_MARKER_LEN, IndexEntry, MAX_RECORD_LEN, RECORD_HEADER_LEN, RECORD_MAGIC, RecordHeader, TRAILER_MAGIC,
    TrailerProblem,
};
pub use reader::{
    FileReadError, FileReader, Problem, ReadAt, Record, Scan, ScanCursor, ScanItem, Verifier, VerifyReport, record_len,
};
pub use writer::{
    ClosedFile, FileWriteError, FileWriter, FileWriterConfig, part_path_of, remove_empty_part_files, writer_version,
};
