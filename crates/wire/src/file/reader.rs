//! [`FileReader`]: reads, verifies and recovers data files.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::format::{
    FILE_HEADER_LEN, FOOTER_LEN, FileHeader, Footer, INDEX_ENTRY_LEN, INDEX_MAGIC, INDEX_MARKER_LEN, IndexEntry,
    RECORD_HEADER_LEN, RecordHeader, RecordHeaderProblem, TrailerProblem, index_marker,
};
use crate::EventId;
use crate::crc::crc32c;
use crate::error::DecodeError;
use crate::event::{EVENT_MAGIC, Event};
use crate::le::pad8;

/// Positional reads from a file or a buffer; lets the reader work on files and, in tests, on
/// bytes in memory.
pub trait ReadAt {
    /// Total size in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start.checked_add(buf.len()).ok_or(io::ErrorKind::UnexpectedEof)?;
        let src = self.get(start..end).ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl ReadAt for Vec<u8> {
    fn size(&self) -> io::Result<u64> {
        self.as_slice().size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
}

impl ReadAt for Bytes {
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
}

/// Reading a data file failed.
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    /// The operating system refused a read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file (`<memory>` for a buffer).
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file does not start with a valid daqflow file header.
    #[error("{path}: {source}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: DecodeError,
    },
    /// Random access past the last record.
    #[error("{path}: no record {index}; the file holds {count}")]
    NoSuchRecord {
        /// The file.
        path: PathBuf,
        /// Index asked for.
        index: u64,
        /// Records in the file.
        count: u64,
    },
    /// The record the index points to is damaged.
    #[error("{path}: record {index} at offset {offset}: {problem}")]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// Record index.
        index: u64,
        /// File offset.
        offset: u64,
        /// What is wrong.
        problem: String,
    },
}

/// One event record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Position of the record among the records of the file, from 0.
    pub index: u64,
    /// File offset of the record header.
    pub offset: u64,
    /// The event id stored in the record header.
    pub event_id: EventId,
    /// The payload, as stored.
    pub payload: Bytes,
}

/// What a sequential scan finds, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanItem {
    /// A whole record whose payload CRC matches.
    Record(Record),
    /// A whole record whose payload does not match its CRC; `record.payload` is what was read.
    CrcMismatch {
        /// The record.
        record: Record,
        /// CRC in the record header.
        stored: u32,
        /// CRC of the payload as read.
        computed: u32,
    },
    /// Bytes that are not a record were skipped until the next intact record header (or the end).
    Garbage {
        /// Where the bad bytes start.
        offset: u64,
        /// How many were skipped.
        len: u64,
    },
    /// The file ends inside a record: it was cut short while being written. The partial record
    /// is ignored; everything before it was returned.
    CutShort {
        /// Where the partial record starts.
        offset: u64,
        /// Bytes of it present.
        len: u64,
        /// Bytes the record needed (0 when even its header is incomplete).
        needed: u64,
    },
}

/// Reads a data file: header, trailer index, random access and sequential scans that verify
/// every CRC and recover a file cut short by a crash.
pub struct FileReader<S: ReadAt = File> {
    source: S,
    path: PathBuf,
    size: u64,
    header: FileHeader,
    footer: Option<Footer>,
    index: Option<Vec<IndexEntry>>,
    trailer_problem: Option<TrailerProblem>,
}

impl std::fmt::Debug for FileReader<File> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader").field("path", &self.path).field("header", &self.header).finish()
    }
}

impl FileReader<File> {
    /// Opens `path`, reading the header and, if the file was closed, its trailer.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FileReadError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| FileReadError::Io { path: path.to_path_buf(), source })?;
        Self::from_source(file, path)
    }
}

/// Reads blocks of this size when scanning.
const SCAN_BLOCK: usize = 1 << 20;

impl<S: ReadAt> FileReader<S> {
    /// Reads from any [`ReadAt`] source; `name` is used in messages.
    pub fn from_source(source: S, name: impl Into<PathBuf>) -> Result<Self, FileReadError> {
        let path = name.into();
        let size = source.size().map_err(|source| FileReadError::Io { path: path.clone(), source })?;
        let mut h = [0u8; FILE_HEADER_LEN];
        let have = size.min(FILE_HEADER_LEN as u64) as usize;
        source.read_exact_at(&mut h[..have], 0).map_err(|source| FileReadError::Io { path: path.clone(), source })?;
        let header =
            FileHeader::decode(&h[..have]).map_err(|source| FileReadError::Header { path: path.clone(), source })?;
        let mut reader = FileReader { source, path, size, header, footer: None, index: None, trailer_problem: None };
        reader.load_trailer()?;
        Ok(reader)
    }

    fn io_err(&self, source: io::Error) -> FileReadError {
        FileReadError::Io { path: self.path.clone(), source }
    }

    fn load_trailer(&mut self) -> Result<(), FileReadError> {
        if self.size < (FILE_HEADER_LEN + FOOTER_LEN) as u64 {
            self.trailer_problem = Some(TrailerProblem::NotClosed);
            return Ok(());
        }
        let mut f = [0u8; FOOTER_LEN];
        self.source.read_exact_at(&mut f, self.size - FOOTER_LEN as u64).map_err(|e| self.io_err(e))?;
        let footer = match Footer::decode(&f) {
            Ok(footer) => footer,
            Err(problem) => {
                self.trailer_problem = Some(problem);
                return Ok(());
            }
        };
        let index_len = footer.event_count.checked_mul(INDEX_ENTRY_LEN as u64);
        let consistent = index_len
            .and_then(|l| footer.index_offset.checked_add(l + INDEX_MARKER_LEN as u64))
            .and_then(|end| end.checked_add(FOOTER_LEN as u64))
            == Some(self.size)
            && footer.index_offset >= FILE_HEADER_LEN as u64;
        if !consistent {
            self.trailer_problem = Some(TrailerProblem::Inconsistent);
            return Ok(());
        }
        let index_len = (footer.event_count * INDEX_ENTRY_LEN as u64) as usize;
        let mut raw = vec![0u8; INDEX_MARKER_LEN + index_len];
        self.source.read_exact_at(&mut raw, footer.index_offset).map_err(|e| self.io_err(e))?;
        let (marker, raw) = raw.split_at(INDEX_MARKER_LEN);
        if marker != index_marker() || crc32c(raw) != footer.index_crc {
            self.trailer_problem = Some(TrailerProblem::IndexCrc);
            return Ok(());
        }
        let index = raw
            .chunks_exact(INDEX_ENTRY_LEN)
            .filter_map(|c| c.first_chunk::<INDEX_ENTRY_LEN>())
            .map(IndexEntry::decode)
            .collect();
        self.footer = Some(footer);
        self.index = Some(index);
        Ok(())
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// The name given when opening (the path of a file).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the file was closed properly: its trailer and index are intact.
    pub fn is_complete(&self) -> bool {
        self.footer.is_some()
    }

    /// Why the trailer could not be used, for a file that is not complete: not closed, or
    /// closed with a damaged trailer ([`TrailerProblem::is_damage`]).
    pub fn trailer_problem(&self) -> Option<&TrailerProblem> {
        self.trailer_problem.as_ref()
    }

    /// The trailer footer of a complete file.
    pub fn footer(&self) -> Option<&Footer> {
        self.footer.as_ref()
    }

    /// Where the records end: the index of a complete file, else the end of the file.
    fn data_end(&self) -> u64 {
        self.footer.map_or(self.size, |f| f.index_offset)
    }

    /// A sequential scan of every record, in file order, with CRCs verified.
    pub fn scan(&self) -> Scan<'_, S> {
        Scan { reader: self, cursor: self.cursor() }
    }

    /// The state of a sequential scan at the first record, kept apart from the reader: for a
    /// caller that cannot hold the borrow a [`Scan`] needs (a reader shared through an `Arc`, as
    /// the Python bindings do). [`ScanCursor::next_item`] advances it.
    pub fn cursor(&self) -> ScanCursor {
        ScanCursor {
            pos: FILE_HEADER_LEN as u64,
            end: self.data_end(),
            block: Bytes::new(),
            block_start: 0,
            next_index: 0,
            done: false,
        }
    }

    /// The index of records: from the trailer of a complete file, or built by a scan of the whole
    /// records that a file cut short holds (records with a CRC mismatch are included).
    pub fn index(&mut self) -> Result<&[IndexEntry], FileReadError> {
        if self.index.is_none() {
            let mut index = Vec::new();
            for item in self.scan() {
                match item? {
                    ScanItem::Record(r) | ScanItem::CrcMismatch { record: r, .. } => {
                        index.push(IndexEntry { event_id: r.event_id, offset: r.offset })
                    }
                    ScanItem::Garbage { .. } | ScanItem::CutShort { .. } => {}
                }
            }
            self.index = Some(index);
        }
        Ok(self.index.as_deref().unwrap_or(&[]))
    }

    /// Number of records (from the trailer, or by scanning).
    pub fn len(&mut self) -> Result<u64, FileReadError> {
        Ok(self.index()?.len() as u64)
    }

    /// Whether the file holds no records.
    pub fn is_empty(&mut self) -> Result<bool, FileReadError> {
        Ok(self.len()? == 0)
    }

    /// Record number `index` (from 0), read through the index, its CRC verified.
    pub fn read_record(&mut self, index: u64) -> Result<Record, FileReadError> {
        let entries = self.index()?;
        let count = entries.len() as u64;
        let Some(entry) = usize::try_from(index).ok().and_then(|i| entries.get(i)).copied() else {
            return Err(FileReadError::NoSuchRecord { path: self.path.clone(), index, count });
        };
        let bad = |problem: String| FileReadError::BadRecord {
            path: self.path.clone(),
            index,
            offset: entry.offset,
            problem,
        };
        let mut h = [0u8; RECORD_HEADER_LEN];
        if entry.offset + RECORD_HEADER_LEN as u64 > self.data_end() {
            return Err(bad("the index points past the records".into()));
        }
        self.source.read_exact_at(&mut h, entry.offset).map_err(|e| self.io_err(e))?;
        let header = RecordHeader::decode(&h).map_err(|p| bad(format!("record header is {p:?}")))?;
        if header.event_id != entry.event_id {
            return Err(bad(format!("index says event {} but the record holds {}", entry.event_id, header.event_id)));
        }
        let start = entry.offset + RECORD_HEADER_LEN as u64;
        if start + header.payload_len as u64 > self.data_end() {
            return Err(bad("the record runs past the end of the records".into()));
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        self.source.read_exact_at(&mut payload, start).map_err(|e| self.io_err(e))?;
        let computed = crc32c(&payload);
        if computed != header.payload_crc {
            return Err(bad(format!("payload CRC32C is {computed:#010x} but {:#010x} was stored", header.payload_crc)));
        }
        Ok(Record { index, offset: entry.offset, event_id: header.event_id, payload: Bytes::from(payload) })
    }

    /// Reads the whole file and checks every record CRC and, with `deep`, the structure and
    /// every fragment CRC of records that hold daqflow events.
    pub fn verify(&self, deep: bool) -> Result<VerifyReport, FileReadError> {
        let mut verifier = Verifier::new(deep);
        for item in self.scan() {
            verifier.observe(&item?);
        }
        Ok(verifier.finish(self))
    }
}

/// Builds a [`VerifyReport`] from the items of a scan, for callers that look at the records
/// themselves as they go (as `daqflow inspect` does).
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    deep: bool,
    report: VerifyReport,
}

impl Verifier {
    /// A verifier; `deep` also checks records that hold daqflow events fragment by fragment.
    pub fn new(deep: bool) -> Self {
        Verifier { deep, report: VerifyReport::default() }
    }

    /// Takes the next scan item into account.
    pub fn observe(&mut self, item: &ScanItem) {
        let report = &mut self.report;
        match item {
            ScanItem::Record(r) => {
                report.records += 1;
                report.payload_bytes += r.payload.len() as u64;
                if self.deep && r.payload.get(..4) == Some(&EVENT_MAGIC.to_le_bytes()[..]) {
                    report.events_checked += 1;
                    let problem = match Event::parse(r.payload.clone()).and_then(|e| e.check()) {
                        Ok(check) if check.crc_errors.is_empty() && check.id_mismatches.is_empty() => None,
                        Ok(check) => Some(match check.crc_errors.first() {
                            Some(e) => e.to_string(),
                            None => format!("{} parts carry another event id", check.id_mismatches.len()),
                        }),
                        Err(e) => Some(e.to_string()),
                    };
                    if let Some(problem) = problem {
                        report.problems.push(Problem::BadEvent {
                            index: r.index,
                            offset: r.offset,
                            event_id: r.event_id,
                            problem,
                        });
                    }
                }
            }
            ScanItem::CrcMismatch { record, stored, computed } => {
                report.records += 1;
                report.payload_bytes += record.payload.len() as u64;
                report.problems.push(Problem::RecordCrc {
                    index: record.index,
                    offset: record.offset,
                    event_id: record.event_id,
                    stored: *stored,
                    computed: *computed,
                });
            }
            ScanItem::Garbage { offset, len } => report.problems.push(Problem::Garbage { offset: *offset, len: *len }),
            ScanItem::CutShort { offset, len, needed } => report.cut_short = Some((*offset, *len, *needed)),
        }
    }

    /// The report, checked against the file's trailer.
    pub fn finish<S: ReadAt>(mut self, reader: &FileReader<S>) -> VerifyReport {
        self.report.complete = reader.is_complete();
        if let Some(p) = reader.trailer_problem()
            && p.is_damage()
        {
            self.report.problems.push(Problem::Trailer(*p));
        }
        if let Some(footer) = reader.footer()
            && footer.event_count != self.report.records
        {
            self.report
                .problems
                .push(Problem::CountMismatch { trailer: footer.event_count, found: self.report.records });
        }
        self.report
    }
}

/// The result of [`FileReader::verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Whole records found (good or not).
    pub records: u64,
    /// Sum of their payload lengths.
    pub payload_bytes: u64,
    /// Records that hold daqflow events and were checked in depth.
    pub events_checked: u64,
    /// Whether the file was closed with an intact trailer.
    pub complete: bool,
    /// `(offset, bytes present, bytes needed)` of the partial record at the end of a file that
    /// was cut short.
    pub cut_short: Option<(u64, u64, u64)>,
    /// Everything wrong, in file order.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// No damaged record, no garbage, not cut short, and closed properly.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.cut_short.is_none() && self.complete
    }
}

/// One thing [`FileReader::verify`] found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A record's payload does not match its CRC.
    RecordCrc {
        /// Record index.
        index: u64,
        /// File offset.
        offset: u64,
        /// Event id in the record header.
        event_id: EventId,
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// A record holds a daqflow event that is malformed or has a fragment CRC error.
    BadEvent {
        /// Record index.
        index: u64,
        /// File offset.
        offset: u64,
        /// Event id.
        event_id: EventId,
        /// What is wrong.
        problem: String,
    },
    /// Bytes that are not records.
    Garbage {
        /// Where they start.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// The file was closed but its trailer is damaged (the records were read by a scan).
    Trailer(TrailerProblem),
    /// The trailer counts a different number of records than the file holds.
    CountMismatch {
        /// Count in the trailer.
        trailer: u64,
        /// Records found.
        found: u64,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::RecordCrc { index, offset, event_id, stored, computed } => write!(
                f,
                "record {index} (event {event_id}) at offset {offset}: payload CRC32C is {computed:#010x} but {stored:#010x} was stored"
            ),
            Problem::BadEvent { index, offset, event_id, problem } => {
                write!(f, "record {index} (event {event_id}) at offset {offset}: {problem}")
            }
            Problem::Garbage { offset, len } => write!(f, "{len} bytes at offset {offset} are not records"),
            Problem::Trailer(p) => write!(f, "{p}"),
            Problem::CountMismatch { trailer, found } => {
                write!(f, "the trailer counts {trailer} records but the file holds {found}")
            }
        }
    }
}

/// A sequential scan; see [`FileReader::scan`].
pub struct Scan<'a, S: ReadAt> {
    reader: &'a FileReader<S>,
    cursor: ScanCursor,
}

impl<S: ReadAt> Iterator for Scan<'_, S> {
    type Item = Result<ScanItem, FileReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.cursor.next_item(self.reader)
    }
}

/// Where a sequential scan stands, without a borrow of its reader; see [`FileReader::cursor`].
/// It holds the block last read, so that records are handed out as slices of it.
#[derive(Debug, Clone)]
pub struct ScanCursor {
    pos: u64,
    end: u64,
    block: Bytes,
    block_start: u64,
    next_index: u64,
    done: bool,
}

impl ScanCursor {
    /// The next item of the scan of `reader`, which must be the reader the cursor came from;
    /// `None` at the end. After an error the scan is over.
    pub fn next_item<S: ReadAt>(&mut self, reader: &FileReader<S>) -> Option<Result<ScanItem, FileReadError>> {
        if self.done {
            return None;
        }
        match self.step(reader) {
            Ok(Some(item)) => Some(Ok(item)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(source) => {
                self.done = true;
                Some(Err(FileReadError::Io { path: reader.path.clone(), source }))
            }
        }
    }

    /// The bytes `[at, at + len)`, which must lie before `self.end`, sharing a read block.
    fn bytes<S: ReadAt>(&mut self, reader: &FileReader<S>, at: u64, len: usize) -> io::Result<Bytes> {
        let block_end = self.block_start + self.block.len() as u64;
        if at < self.block_start || at + len as u64 > block_end {
            let want = (self.end - at).min(len.max(SCAN_BLOCK) as u64) as usize;
            let mut buf = vec![0u8; want];
            reader.source.read_exact_at(&mut buf, at)?;
            self.block = Bytes::from(buf);
            self.block_start = at;
        }
        let from = (at - self.block_start) as usize;
        Ok(self.block.slice(from..from + len))
    }

    fn header_at<S: ReadAt>(
        &mut self,
        reader: &FileReader<S>,
        at: u64,
    ) -> io::Result<Result<RecordHeader, RecordHeaderProblem>> {
        let b = self.bytes(reader, at, RECORD_HEADER_LEN)?;
        Ok(match b.first_chunk::<RECORD_HEADER_LEN>() {
            Some(h) => RecordHeader::decode(h),
            None => Err(RecordHeaderProblem::Damaged),
        })
    }

    /// The next 8-aligned position after `from` holding an intact record header that fits.
    fn resync<S: ReadAt>(&mut self, reader: &FileReader<S>, from: u64) -> io::Result<Option<u64>> {
        let mut at = from + 8;
        while at + RECORD_HEADER_LEN as u64 <= self.end {
            if let Ok(h) = self.header_at(reader, at)?
                && at + h.record_len() <= self.end
            {
                return Ok(Some(at));
            }
            at += 8;
        }
        Ok(None)
    }

    fn step<S: ReadAt>(&mut self, reader: &FileReader<S>) -> io::Result<Option<ScanItem>> {
        let at = self.pos;
        let remaining = self.end - at;
        if remaining == 0 {
            return Ok(None);
        }
        if remaining >= INDEX_MARKER_LEN as u64 && self.bytes(reader, at, 4)?[..] == INDEX_MAGIC.to_le_bytes() {
            // The writer got as far as the trailer: every record is here, only the index is
            // incomplete or damaged.
            self.pos = self.end;
            return Ok(None);
        }
        if remaining < RECORD_HEADER_LEN as u64 {
            self.pos = self.end;
            return Ok(Some(ScanItem::CutShort { offset: at, len: remaining, needed: 0 }));
        }
        match self.header_at(reader, at)? {
            Ok(h) => {
                let record_len = h.record_len();
                if remaining < RECORD_HEADER_LEN as u64 + h.payload_len as u64 {
                    self.pos = self.end;
                    return Ok(Some(ScanItem::CutShort { offset: at, len: remaining, needed: record_len }));
                }
                let payload = self.bytes(reader, at + RECORD_HEADER_LEN as u64, h.payload_len as usize)?;
                self.pos = (at + record_len).min(self.end);
                let record = Record { index: self.next_index, offset: at, event_id: h.event_id, payload };
                self.next_index += 1;
                let computed = crc32c(&record.payload);
                if computed == h.payload_crc {
                    Ok(Some(ScanItem::Record(record)))
                } else {
                    Ok(Some(ScanItem::CrcMismatch { record, stored: h.payload_crc, computed }))
                }
            }
            Err(_) => {
                let next = self.resync(reader, at)?;
                let to = next.unwrap_or(self.end);
                self.pos = to;
                Ok(Some(ScanItem::Garbage { offset: at, len: to - at }))
            }
        }
    }
}

/// Bytes a record of `payload_len` bytes occupies in a file.
pub fn record_len(payload_len: usize) -> u64 {
    (RECORD_HEADER_LEN + pad8(payload_len)) as u64
}
