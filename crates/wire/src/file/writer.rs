//! [`FileWriter`]: writes event records into data files, rotating by size.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::format::{
    FILE_HEADER_LEN, FOOTER_LEN, FileHeader, Footer, INDEX_ENTRY_LEN, INDEX_MARKER_LEN, IndexEntry, MAX_RECORD_LEN,
    RECORD_HEADER_LEN, RecordHeader, index_marker,
};
use crate::EventId;
use crate::crc::{Crc32c, crc32c};
use crate::le::pad8;

/// Where and how a [`FileWriter`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWriterConfig {
    /// Directory the files go into; created if missing.
    pub directory: PathBuf,
    /// Run number, in the file names and headers.
    pub run_number: u32,
    /// Optional stream name (e.g. the builder unit's name) so that several writers of one run
    /// can share a directory: `run000123_bu-1_0001.daq`. Letters, digits, `-`, `_` and `.` only.
    pub stream: Option<String>,
    /// A file is closed and the next one opened before a record would make it larger than this
    /// (a single record larger than the limit still gets a file of its own). Default 1 GiB.
    pub max_file_bytes: u64,
    /// Digest of the run's configuration, stored in every file header.
    pub config_digest: [u8; 32],
    /// `fsync` each file (and its directory) when it is closed. Default on.
    pub sync_on_close: bool,
    /// Size of the write buffer. Default 1 MiB.
    pub buffer_bytes: usize,
}

impl FileWriterConfig {
    /// Defaults for run `run_number` in `directory`.
    pub fn new(directory: impl Into<PathBuf>, run_number: u32) -> Self {
        FileWriterConfig {
            directory: directory.into(),
            run_number,
            stream: None,
            max_file_bytes: 1 << 30,
            config_digest: [0; 32],
            sync_on_close: true,
            buffer_bytes: 1 << 20,
        }
    }
}

/// A file the writer finished: renamed from `.part` to its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedFile {
    /// Final path.
    pub path: PathBuf,
    /// Sequence number within the run (and stream).
    pub sequence: u32,
    /// Event records in the file.
    pub events: u64,
    /// Sum of the record payloads.
    pub payload_bytes: u64,
    /// Size of the file.
    pub file_bytes: u64,
    /// First event id written, if any.
    pub first_event: Option<EventId>,
    /// Last event id written, if any.
    pub last_event: Option<EventId>,
}

/// Writing a data file failed.
#[derive(Debug, thiserror::Error)]
pub enum FileWriteError {
    /// The operating system refused an operation on `path`.
    #[error("{operation} {path}: {source}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file to be written exists already; nothing is overwritten.
    #[error("{path} exists already; refusing to overwrite data (is another writer using run {run} in this directory?)")]
    FileExists {
        /// The existing file.
        path: PathBuf,
        /// The run.
        run: u32,
    },
    /// A record is larger than the format allows.
    #[error("event {event_id}: record of {len} bytes is larger than the maximum of {max}")]
    RecordTooLarge {
        /// The event.
        event_id: EventId,
        /// Its length.
        len: u64,
        /// The maximum.
        max: u64,
    },
    /// The stream name would make an unsafe or ambiguous file name.
    #[error("stream name {0:?} may only contain letters, digits, '-', '_' and '.'")]
    BadStreamName(String),
    /// The writer failed earlier and was closed; no more events are accepted.
    #[error("the writer failed earlier and accepts no more events")]
    Failed,
}

impl FileWriteError {
    /// Whether the error says the disk is full (`ENOSPC`, `EDQUOT`).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, FileWriteError::Io { source, .. } if super::disk::is_disk_full(source))
    }
}

struct OpenFile {
    out: BufWriter<File>,
    part_path: PathBuf,
    final_path: PathBuf,
    sequence: u32,
    bytes: u64,
    payload_bytes: u64,
    index: Vec<IndexEntry>,
}

/// Writes event records into `run000123_0001.daq`, `run000123_0002.daq`, … rotating by size.
///
/// A file is written as `NAME.daq.part` and renamed to `NAME.daq` when it is closed with its
/// trailer, so a `.part` file is one that was being written when the writer stopped; the
/// [`FileReader`](super::FileReader) reads it up to its last whole event.
///
/// ```
/// use daqflow_wire::file::{FileReader, FileWriter, FileWriterConfig};
/// use daqflow_wire::EventId;
/// let dir = tempfile::tempdir().unwrap();
/// let mut writer = FileWriter::new(FileWriterConfig::new(dir.path(), 123)).unwrap();
/// writer.write_event(EventId(1), b"first event").unwrap();
/// writer.write_event(EventId(2), b"second event").unwrap();
/// let files = writer.finish().unwrap();
/// assert!(files[0].path.ends_with("run000123_0001.daq"));
/// let mut reader = FileReader::open(&files[0].path).unwrap();
/// assert_eq!(reader.read_record(1).unwrap().payload, &b"second event"[..]);
/// ```
pub struct FileWriter {
    config: FileWriterConfig,
    current: Option<OpenFile>,
    next_sequence: u32,
    closed: Vec<ClosedFile>,
    abandoned: Vec<ClosedFile>,
    failed: bool,
}

impl FileWriter {
    /// A writer for `config`: creates the directory and opens the first file, so that a run
    /// without events still leaves a (valid, empty) file and a clash of names fails here.
    pub fn new(config: FileWriterConfig) -> Result<Self, FileWriteError> {
        if let Some(stream) = &config.stream {
            let ok = !stream.is_empty()
                && !stream.starts_with('.')
                && stream.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(FileWriteError::BadStreamName(stream.clone()));
            }
        }
        fs::create_dir_all(&config.directory).map_err(|source| FileWriteError::Io {
            operation: "creating directory",
            path: config.directory.clone(),
            source,
        })?;
        let mut writer = FileWriter {
            config,
            current: None,
            next_sequence: 1,
            closed: Vec::new(),
            abandoned: Vec::new(),
            failed: false,
        };
        writer.open_next()?;
        Ok(writer)
    }

    /// The configuration.
    pub fn config(&self) -> &FileWriterConfig {
        &self.config
    }

    /// The final name of file number `sequence` of this writer.
    pub fn file_name(&self, sequence: u32) -> String {
        match &self.config.stream {
            Some(s) => format!("run{:06}_{}_{:04}.daq", self.config.run_number, s, sequence),
            None => format!("run{:06}_{:04}.daq", self.config.run_number, sequence),
        }
    }

    /// Writes one event record.
    pub fn write_event(&mut self, event_id: EventId, payload: &[u8]) -> Result<(), FileWriteError> {
        self.write_event_parts(event_id, &[payload])
    }

    /// Writes one event record whose payload is the concatenation of `parts` (e.g. an event
    /// header and its super-fragments), without concatenating them in memory first.
    pub fn write_event_parts(&mut self, event_id: EventId, parts: &[&[u8]]) -> Result<(), FileWriteError> {
        if self.failed {
            return Err(FileWriteError::Failed);
        }
        let result = self.write_record(event_id, parts);
        if let Err(e) = &result {
            self.failed = true;
            if matches!(e, FileWriteError::Io { .. }) {
                self.abandon_current();
            }
        }
        result
    }

    /// After a failed write: the file being written is left as `.part` without a trailer, cut
    /// back to its last whole record on disk (what was still buffered is dropped), so that no
    /// partial record is left in it; the [`FileReader`](super::FileReader) reads it as a file
    /// whose writer stopped. It is listed in [`FileWriter::abandoned`]. A file without a whole
    /// record on disk is removed instead: it holds no event.
    fn abandon_current(&mut self) {
        if let Some(f) = self.current.take() {
            self.abandoned.extend(abandon(f));
        }
    }

    fn write_record(&mut self, event_id: EventId, parts: &[&[u8]]) -> Result<(), FileWriteError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if len > MAX_RECORD_LEN as u64 {
            return Err(FileWriteError::RecordTooLarge { event_id, len, max: MAX_RECORD_LEN as u64 });
        }
        let record_len = RECORD_HEADER_LEN as u64 + pad8(len as usize) as u64;
        if let Some(f) = &self.current {
            let after =
                f.bytes + record_len + (INDEX_MARKER_LEN + (f.index.len() + 1) * INDEX_ENTRY_LEN + FOOTER_LEN) as u64;
            if !f.index.is_empty() && after > self.config.max_file_bytes {
                self.close_current()?;
            }
        }
        if self.current.is_none() {
            self.open_next()?;
        }
        let payload_crc = match parts {
            [one] => crc32c(one),
            _ => {
                let mut crc = Crc32c::new();
                for p in parts {
                    crc.update(p);
                }
                crc.finish()
            }
        };
        let Some(f) = self.current.as_mut() else { unreachable!("a file was just opened") };
        let header = RecordHeader { payload_len: len as u32, event_id, payload_crc };
        let offset = f.bytes;
        let io = |source| FileWriteError::Io { operation: "writing", path: f.part_path.clone(), source };
        f.out.write_all(&header.encode()).map_err(io)?;
        for p in parts {
            f.out.write_all(p).map_err(io)?;
        }
        let pad = pad8(len as usize) - len as usize;
        f.out.write_all(&[0u8; 8][..pad]).map_err(io)?;
        f.bytes += record_len;
        f.payload_bytes += len;
        f.index.push(IndexEntry { event_id, offset });
        Ok(())
    }

    fn open_next(&mut self) -> Result<(), FileWriteError> {
        let sequence = self.next_sequence;
        let final_path = self.config.directory.join(self.file_name(sequence));
        let part_path = part_path_of(&final_path);
        if final_path.exists() {
            return Err(FileWriteError::FileExists { path: final_path, run: self.config.run_number });
        }
        let file = OpenOptions::new().write(true).create_new(true).open(&part_path).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                FileWriteError::FileExists { path: part_path.clone(), run: self.config.run_number }
            } else {
                FileWriteError::Io { operation: "creating", path: part_path.clone(), source }
            }
        })?;
        let creation_time_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let header = FileHeader {
            flags: 0,
            run_number: self.config.run_number,
            file_sequence: sequence,
            creation_time_ns,
            config_digest: self.config.config_digest,
            writer_version: writer_version(),
        };
        // The header goes to the operating system at once, not into the buffer: a file this
        // writer leaves (killed at any moment, or failing on a full disk before its first
        // flush) is a data file from the start. A header that cannot be written leaves no file.
        if let Err(source) = (&file).write_all(&header.encode()) {
            drop(file);
            let _ = fs::remove_file(&part_path);
            return Err(FileWriteError::Io { operation: "writing the header of", path: part_path, source });
        }
        let out = BufWriter::with_capacity(self.config.buffer_bytes.max(4096), file);
        self.next_sequence += 1;
        self.current = Some(OpenFile {
            out,
            part_path,
            final_path,
            sequence,
            bytes: FILE_HEADER_LEN as u64,
            payload_bytes: 0,
            index: Vec::new(),
        });
        Ok(())
    }

    fn close_current(&mut self) -> Result<(), FileWriteError> {
        let Some(mut f) = self.current.take() else { return Ok(()) };
        let io = |operation, path: &Path| {
            let path = path.to_path_buf();
            move |source| FileWriteError::Io { operation, path, source }
        };
        if let Err(e) = write_trailer(&mut f) {
            self.failed = true;
            self.abandoned.extend(abandon(f));
            return Err(e);
        }
        let file_bytes = f.bytes + (INDEX_MARKER_LEN + f.index.len() * INDEX_ENTRY_LEN + FOOTER_LEN) as u64;
        let file = f.out.into_inner().map_err(|e| FileWriteError::Io {
            operation: "flushing",
            path: f.part_path.clone(),
            source: e.into_error(),
        })?;
        if self.config.sync_on_close {
            file.sync_all().map_err(io("syncing", &f.part_path))?;
        }
        drop(file);
        if f.final_path.exists() {
            return Err(FileWriteError::FileExists { path: f.final_path, run: self.config.run_number });
        }
        fs::rename(&f.part_path, &f.final_path).map_err(io("renaming", &f.part_path))?;
        if self.config.sync_on_close {
            // The rename is durable once the directory is synced.
            if let Ok(dir) = File::open(&self.config.directory) {
                let _ = dir.sync_all();
            }
        }
        self.closed.push(ClosedFile {
            path: f.final_path,
            sequence: f.sequence,
            events: f.index.len() as u64,
            payload_bytes: f.payload_bytes,
            file_bytes,
            first_event: f.index.first().map(|e| e.event_id),
            last_event: f.index.last().map(|e| e.event_id),
        });
        Ok(())
    }

    /// Pushes buffered records to the operating system (they survive a crash of this process,
    /// though not of the machine).
    ///
    /// When the flush fails (a full disk), the writer fails and the file is left as after a
    /// failed write ([`FileWriter::abandoned`]).
    pub fn flush(&mut self) -> Result<(), FileWriteError> {
        if self.failed {
            return Err(FileWriteError::Failed);
        }
        if let Some(f) = self.current.as_mut()
            && let Err(source) = f.out.flush()
        {
            let e = FileWriteError::Io { operation: "flushing", path: f.part_path.clone(), source };
            self.failed = true;
            self.abandon_current();
            return Err(e);
        }
        Ok(())
    }

    /// Whether a write or a flush failed: the writer takes no more events.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The files left as `.part` after a write failed, each cut back to its last whole record:
    /// `path` is the `.part` file, `events` the whole records it holds on disk, `file_bytes`
    /// its size, `last_event` the last of them (`payload_bytes` is not known: 0). A file that
    /// had no whole record on disk is removed, not listed: `events` is never 0 here.
    pub fn abandoned(&self) -> &[ClosedFile] {
        &self.abandoned
    }

    /// Files closed so far.
    pub fn closed_files(&self) -> &[ClosedFile] {
        &self.closed
    }

    /// The path of the file being written (with its `.part` suffix), if one is open.
    pub fn current_path(&self) -> Option<&Path> {
        self.current.as_ref().map(|f| f.part_path.as_path())
    }

    /// Events written in the current file.
    pub fn current_events(&self) -> u64 {
        self.current.as_ref().map_or(0, |f| f.index.len() as u64)
    }

    /// Closes the current file with its trailer and returns every file this writer closed.
    pub fn finish(mut self) -> Result<Vec<ClosedFile>, FileWriteError> {
        self.close_current()?;
        Ok(std::mem::take(&mut self.closed))
    }
}

impl Drop for FileWriter {
    /// Closes the current file on a best-effort basis; call [`FileWriter::finish`] to see errors.
    fn drop(&mut self) {
        let _ = self.close_current();
    }
}

/// Writes the index and the footer of `f` and pushes them to the operating system.
fn write_trailer(f: &mut OpenFile) -> Result<(), FileWriteError> {
    let io = |source| FileWriteError::Io { operation: "writing", path: f.part_path.clone(), source };
    let mut index_crc = Crc32c::new();
    let mut trailer = Vec::with_capacity(INDEX_MARKER_LEN + f.index.len() * INDEX_ENTRY_LEN + FOOTER_LEN);
    trailer.extend_from_slice(&index_marker());
    for entry in &f.index {
        let e = entry.encode();
        index_crc.update(&e);
        trailer.extend_from_slice(&e);
    }
    let footer = Footer {
        event_count: f.index.len() as u64,
        index_offset: f.bytes,
        payload_bytes: f.payload_bytes,
        index_crc: index_crc.finish(),
    };
    trailer.extend_from_slice(&footer.encode());
    f.out.write_all(&trailer).map_err(io)?;
    f.out.flush().map_err(io)
}

/// Leaves `f` as a `.part` file holding whole records only: what is still buffered is
/// dropped, and the file is cut back to the end of the last record that reached the disk
/// whole. Best effort, on a file already in trouble: a file that cannot be cut back is one
/// cut short, which the reader recovers anyway. A file with no whole record on disk is
/// removed (`None`): it holds no event, and a header alone is no data worth a file.
fn abandon(f: OpenFile) -> Option<ClosedFile> {
    let (file, _unwritten) = f.out.into_parts();
    let on_disk = file.metadata().map(|m| m.len()).unwrap_or(0);
    // The record boundaries: the end of the header, where every later record starts, the end.
    let ends: Vec<u64> = std::iter::once(FILE_HEADER_LEN as u64)
        .chain(f.index.iter().skip(1).map(|e| e.offset))
        .chain((!f.index.is_empty()).then_some(f.bytes))
        .collect();
    let whole = ends.iter().filter(|&&b| b <= on_disk).count();
    let keep = if whole == 0 { on_disk } else { ends[whole - 1] };
    if keep != on_disk {
        let _ = file.set_len(keep);
    }
    let events = whole.saturating_sub(1) as u64;
    if events == 0 {
        drop(file);
        let _ = fs::remove_file(&f.part_path);
        return None;
    }
    let _ = file.sync_all();
    Some(ClosedFile {
        path: f.part_path,
        sequence: f.sequence,
        events,
        payload_bytes: 0,
        file_bytes: keep,
        first_event: f.index.first().filter(|_| events > 0).map(|e| e.event_id),
        last_event: events.checked_sub(1).and_then(|i| f.index.get(i as usize)).map(|e| e.event_id),
    })
}

/// Removes the `.part` files of run `run` and stream `stream` (as [`FileWriterConfig`] names
/// them) in `directory` that hold no whole record: those a writer killed before its first
/// record reached the disk left (older writers also left them empty, without their header).
/// A writer that takes over a stream, e.g. one restarted within a run, calls this first, so
/// that no file is left that is not a readable data file, and none holding data is touched: a
/// file with a whole record, a closed file and a file that is not a daqflow data file stay.
/// Returns the files removed.
pub fn remove_empty_part_files(directory: &Path, run: u32, stream: Option<&str>) -> io::Result<Vec<PathBuf>> {
    let prefix = match stream {
        Some(s) => format!("run{run:06}_{s}_"),
        None => format!("run{run:06}_"),
    };
    let mut removed = Vec::new();
    let entries = match fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(sequence) = name.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix(".daq.part")) else {
            continue;
        };
        if sequence.len() < 4 || !sequence.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if holds_no_record(&path)? {
            fs::remove_file(&path)?;
            removed.push(path);
        }
    }
    removed.sort();
    Ok(removed)
}

/// Whether the data file at `path` holds no whole record and no trailer: shorter than a file
/// header, or a header followed by nothing or by part of a record. A file whose header is
/// not a daqflow header is not judged here (false).
fn holds_no_record(path: &Path) -> io::Result<bool> {
    use super::reader::{FileReader, ScanItem};
    if fs::metadata(path)?.len() < FILE_HEADER_LEN as u64 {
        return Ok(true);
    }
    let Ok(reader) = FileReader::open(path) else { return Ok(false) };
    if reader.is_complete() {
        return Ok(false);
    }
    let mut scan = reader.cursor();
    while let Some(item) = scan.next_item(&reader) {
        match item {
            Ok(ScanItem::CutShort { .. }) => {}
            Ok(_) | Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// `NAME.daq` → `NAME.daq.part`.
pub fn part_path_of(final_path: &Path) -> PathBuf {
    let mut s = final_path.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// This crate's version packed as `major << 16 | minor << 8 | patch`.
pub fn writer_version() -> u32 {
    let part = |s: &str| s.parse::<u32>().unwrap_or(0).min(255);
    part(env!("CARGO_PKG_VERSION_MAJOR")) << 16
        | part(env!("CARGO_PKG_VERSION_MINOR")) << 8
        | part(env!("CARGO_PKG_VERSION_PATCH"))
}
