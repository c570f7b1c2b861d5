//! The Python package `daqflow`: daqflow from Python.
//!
//! This crate is the extension module `daqflow._native`, built with PyO3 by maturin from
//! `python/pyproject.toml`; `python/daqflow/__init__.py` re-exports it and
//! `python/daqflow/_native.pyi` documents it for Python users (`docs/python.md`). This file
//! wraps [`daqflow_wire::file::FileReader`] and [`daqflow_wire::Event`]; `et.rs` the ET
//! clients, `dialog.rs` the control plane, `component.rs` the component process and the
//! source protocol:
//!
//! ```python
//! import daqflow
//! for event in daqflow.open("run000001_0001.daq"):
//!     for fragment in event.fragments:
//!         data = fragment.payload   # a read-only memoryview of the bytes read, not a copy
//! ```
//!
//! `daqflow.decode_event(data)` gives the same [`Event`] for the bytes of one event from anywhere
//! else (an ET event, a socket): it keeps an export of the caller's buffer (`Lent`) rather than
//! copying it, unless asked to copy.
//!
//! Payloads reach Python without a copy: a [`Buffer`] owns a slice of the block the reader read
//! ([`bytes::Bytes`], reference counted) and lends it through the buffer protocol. Nothing here
//! panics on a file's content: every problem becomes a Python exception ([`Error`] and its
//! subclasses, or `OSError`).

mod dialog;

use std::ffi::{CStr, c_int};
use std::fs;
use std::sync::Arc;

use bytes::Bytes;
use daqflow_wire::file::{FileReadError, FileReader, Problem, ScanCursor, ScanItem};
use daqflow_wire::{
    DecodeError, EVENT_MAGIC, Event as WireEvent, EventFlags, EventHeader, Fragment as WireFragment,
    SuperFragment as WireSF,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyException, PyImportError, PyOSError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyMemoryView};
use pyo3::{create_exception, ffi};

mod component;
mod et;
mod ports;

create_exception!(daqflow, Error, PyException, "Base class of the errors daqflow raises about data.");
create_exception!(
    daqflow,
    FormatError,
    Error,
    "The file is not a daqflow data file: its file header is missing, damaged or of an unknown version."
);
create_exception!(
    daqflow,
    CorruptDataError,
    Error,
    "A record of the file is damaged: its CRC does not match, it is not a daqflow event, or bytes between records are not records."
);

/// A [`FileReadError`] as a Python exception: `OSError` (with errno and file name, so that a
/// missing file is a `FileNotFoundError`), [`FormatError`] or [`CorruptDataError`].
fn read_error(e: FileReadError) -> PyErr {
    match e {
        FileReadError::Io { path, source } => match source.raw_os_error() {
            Some(errno) => PyOSError::new_err((errno, source.to_string(), path.display().to_string())),
            None => PyOSError::new_err(format!("reading {}: {source}", path.display())),
        },
        FileReadError::Header { .. } => FormatError::new_err(e.to_string()),
        FileReadError::NoSuchRecord { .. } | FileReadError::BadRecord { .. } => {
            CorruptDataError::new_err(e.to_string())
        }
    }
}

fn decode_error(what: &str, e: DecodeError) -> PyErr {
    CorruptDataError::new_err(format!("{what}: {e}"))
}

/// What a [`Buffer`] holds.
enum Store {
    /// A slice of the bytes a reader read, shared.
    Shared(Bytes),
    /// Bytes made for Python (the contiguous payload of [`File::arrays`]).
    U8(Vec<u8>),
    /// 32-bit numbers.
    U32(Vec<u32>),
    /// 64-bit numbers.
    U64(Vec<u64>),
}

impl Store {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Store::Shared(b) => b,
            Store::U8(v) => v,
            // SAFETY: a `[u32]` is valid as bytes (no padding, any bit pattern is a `u8`, `u8`
            // needs no alignment), and the length is its size in bytes.
            Store::U32(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
            },
            // SAFETY: as for `U32`.
            Store::U64(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
            },
        }
    }

    /// The buffer protocol's format and item size.
    fn format(&self) -> (&'static CStr, isize) {
        match self {
            Store::Shared(_) | Store::U8(_) => (c"B", 1),
            Store::U32(_) => (c"I", 4),
            Store::U64(_) => (c"Q", 8),
        }
    }
}

/// Memory lent to Python without a copy, read-only, through the buffer protocol: wrap it in a
/// `memoryview` or pass it to `numpy.frombuffer`. It keeps the memory alive as long as any view
/// of it exists.
#[pyclass(frozen, module = "daqflow")]
pub struct Buffer {
    store: Store,
    /// The shape and strides the buffer protocol points to: `[bytes, items, 1, item size]`.
    dims: [isize; 4],
}

impl Buffer {
    fn new(store: Store) -> Self {
        let bytes = store.as_bytes().len() as isize;
        let (_, item) = store.format();
        Buffer { dims: [bytes, bytes / item, 1, item], store }
    }

    /// A read-only `memoryview` of `store`.
    fn view(py: Python<'_>, store: Store) -> PyResult<Bound<'_, PyMemoryView>> {
        let buffer = Bound::new(py, Buffer::new(store))?;
        PyMemoryView::from(buffer.as_any())
    }
}

#[pymethods]
impl Buffer {
    /// # Safety
    ///
    /// Called by Python with a valid `view`; the memory it points to is owned by `slf`, which
    /// the view keeps alive (`view.obj`), and never changes (the class is frozen).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no Py_buffer to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("daqflow buffers are read-only"));
        }
        let this = slf.get();
        let data = this.store.as_bytes();
        let (format, item) = this.store.format();
        // A typed view (numbers, not bytes) needs the consumer to take the format and shape.
        let typed = flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT && flags & ffi::PyBUF_ND == ffi::PyBUF_ND;
        // The pointers below point into `this`, which `(*view).obj` keeps alive and which is
        // never written to: consumers only read `shape` and `strides`.
        let dims = this.dims.as_ptr().cast_mut();
        // SAFETY: `view` is a valid, writable `Py_buffer` (checked non-null; Python passes one);
        // `data`, `format` and `dims` outlive the view as said above; `format` is static.
        unsafe {
            (*view).buf = data.as_ptr().cast_mut().cast();
            (*view).len = data.len() as isize;
            (*view).readonly = 1;
            (*view).itemsize = if typed { item } else { 1 };
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                if typed { format.as_ptr().cast_mut() } else { c"B".as_ptr().cast_mut() }
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                if typed { dims.add(1) } else { dims }
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                if typed { dims.add(3) } else { dims.add(2) }
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.store.as_bytes().len()
    }

    fn __repr__(&self) -> String {
        format!("<daqflow.Buffer of {} bytes>", self.store.as_bytes().len())
    }
}

/// A data file opened for reading; see `daqflow.open`.
#[pyclass(frozen, module = "daqflow")]
pub struct File {
    reader: Arc<FileReader<fs::File>>,
}

#[pymethods]
impl File {
    #[getter]
    fn path(&self) -> String {
        self.reader.path().display().to_string()
    }
    #[getter]
    fn run(&self) -> u32 {
        self.reader.header().run_number
    }
    #[getter]
    fn sequence(&self) -> u32 {
        self.reader.header().file_sequence
    }
    #[getter]
    fn created_ns(&self) -> u64 {
        self.reader.header().creation_time_ns
    }
    #[getter]
    fn writer_version(&self) -> String {
        let (major, minor, patch) = self.reader.header().writer_version_parts();
        format!("{major}.{minor}.{patch}")
    }
    #[getter]
    fn size(&self) -> u64 {
        self.reader.size()
    }
    #[getter]
    fn complete(&self) -> bool {
        self.reader.is_complete()
    }
    #[getter]
    fn trailer_problem(&self) -> Option<String> {
        self.reader.trailer_problem().map(|p| p.to_string())
    }

    fn __iter__(&self) -> Events {
        self.events(false)
    }

    #[pyo3(signature = (skip_damaged = false))]
    fn events(&self, skip_damaged: bool) -> Events {
        Events { reader: Arc::clone(&self.reader), cursor: self.reader.cursor(), skip_damaged }
    }

    #[pyo3(signature = (deep = true))]
    fn verify(&self, py: Python<'_>, deep: bool) -> PyResult<VerifyReport> {
        let reader = Arc::clone(&self.reader);
        let report = py.detach(move || reader.verify(deep)).map_err(read_error)?;
        Ok(VerifyReport {
            clean: report.is_clean(),
            records: report.records,
            payload_bytes: report.payload_bytes,
            events_checked: report.events_checked,
            complete: report.complete,
            cut_short: report.cut_short,
            problems: report.problems.iter().map(Problem::to_string).collect(),
        })
    }

    #[pyo3(signature = (skip_damaged = false))]
    fn arrays(&self, py: Python<'_>, skip_damaged: bool) -> PyResult<Arrays> {
        let numpy = import_numpy(py, "File.arrays()")?;
        let reader = Arc::clone(&self.reader);
        let columns = py.detach(move || Columns::read(&reader, skip_damaged))?;
        let array = |store: Store, dtype: &str| numpy_array(&numpy, store, dtype);
        Ok(Arrays {
            events: columns.events,
            event_ids: array(Store::U64(columns.event_ids), "uint64")?,
            source_ids: array(Store::U32(columns.source_ids), "uint32")?,
            flags: array(Store::U32(columns.flags), "uint32")?,
            sizes: array(Store::U32(columns.sizes), "uint32")?,
            timestamps: array(Store::U64(columns.timestamps), "uint64")?,
            offsets: array(Store::U64(columns.offsets), "uint64")?,
            payload: array(Store::U8(columns.payload), "uint8")?,
        })
    }

    #[pyo3(signature = (max_bytes = DEFAULT_BATCH_BYTES, payload = true, skip_damaged = false))]
    fn batches(&self, py: Python<'_>, max_bytes: usize, payload: bool, skip_damaged: bool) -> PyResult<Batches> {
        let numpy = import_numpy(py, "File.batches()")?;
        Ok(Batches {
            numpy: numpy.unbind(),
            reader: Arc::clone(&self.reader),
            cursor: Some(self.reader.cursor()),
            max_bytes: max_bytes.max(1),
            payload,
            skip_damaged,
        })
    }

    /// See `daqflow.export.to_arrow`.
    #[pyo3(signature = (payload = false, skip_damaged = false))]
    fn to_arrow(slf: &Bound<'_, Self>, payload: bool, skip_damaged: bool) -> PyResult<Py<PyAny>> {
        export_call(slf, "to_arrow", payload, skip_damaged)
    }

    /// See `daqflow.export.to_awkward`.
    #[pyo3(signature = (payload = false, skip_damaged = false))]
    fn to_awkward(slf: &Bound<'_, Self>, payload: bool, skip_damaged: bool) -> PyResult<Py<PyAny>> {
        export_call(slf, "to_awkward", payload, skip_damaged)
    }

    fn __repr__(&self) -> String {
        format!(
            "<daqflow.File {:?} run {} sequence {} {}>",
            self.path(),
            self.run(),
            self.sequence(),
            if self.complete() { "complete" } else { "not closed" }
        )
    }
}

/// `daqflow.export.FUNCTION(file, payload=…, skip_damaged=…)`: the conversions to the field's
/// libraries are written in Python, beside the libraries they call.
fn export_call(file: &Bound<'_, File>, function: &str, payload: bool, skip_damaged: bool) -> PyResult<Py<PyAny>> {
    let py = file.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("payload", payload)?;
    kwargs.set_item("skip_damaged", skip_damaged)?;
    Ok(py.import("daqflow.export")?.getattr(function)?.call((file,), Some(&kwargs))?.unbind())
}

/// A [`CorruptDataError`] about a record.
fn damaged(index: u64, offset: u64, event_id: impl std::fmt::Display, what: impl std::fmt::Display) -> PyErr {
    CorruptDataError::new_err(format!("record {index} (event {event_id}) at offset {offset}: {what}"))
}

/// The next event of a scan: `Ok(None)` at the end of the records (after the last whole record
/// of a file cut short); damaged records are errors or, with `skip_damaged`, skipped.
fn next_event(
    reader: &FileReader<fs::File>,
    cursor: &mut ScanCursor,
    skip_damaged: bool,
) -> PyResult<Option<(u64, u64, WireEvent)>> {
    loop {
        let problem = match cursor.next_item(reader) {
            None => return Ok(None),
            Some(Err(e)) => return Err(read_error(e)),
            Some(Ok(ScanItem::CutShort { .. })) => continue,
            Some(Ok(ScanItem::Record(r))) => {
                if r.payload.get(..4) != Some(&EVENT_MAGIC.to_le_bytes()[..]) {
                    damaged(r.index, r.offset, r.event_id, "the record holds no daqflow event")
                } else {
                    match WireEvent::parse(r.payload) {
                        Ok(event) => return Ok(Some((r.index, r.offset, event))),
                        Err(e) => damaged(r.index, r.offset, r.event_id, e),
                    }
                }
            }
            Some(Ok(ScanItem::CrcMismatch { record: r, stored, computed })) => damaged(
                r.index,
                r.offset,
                r.event_id,
                format_args!("payload CRC32C is {computed:#010x} but {stored:#010x} was stored"),
            ),
            Some(Ok(ScanItem::Garbage { offset, len })) => {
                CorruptDataError::new_err(format!("{len} bytes at offset {offset} are not records"))
            }
        };
        if !skip_damaged {
            return Err(problem);
        }
    }
}

/// An iterator over the events of a file, in file order.
#[pyclass(module = "daqflow")]
pub struct Events {
    reader: Arc<FileReader<fs::File>>,
    cursor: ScanCursor,
    skip_damaged: bool,
}

#[pymethods]
impl Events {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> PyResult<Option<Event>> {
        Ok(next_event(&self.reader, &mut self.cursor, self.skip_damaged)?.map(|(index, offset, event)| Event {
            record: Some((index, offset)),
            header: *event.header(),
            bytes: event.as_bytes().clone(),
        }))
    }
}

/// A built event: its header, and its super-fragments parsed when asked for.
#[pyclass(frozen, module = "daqflow")]
pub struct Event {
    /// Its record's index and file offset; `None` for an event decoded from bytes.
    record: Option<(u64, u64)>,
    header: EventHeader,
    bytes: Bytes,
}

/// A Python buffer lent to Rust for as long as this lives: the exporter keeps its memory (and
/// refuses to resize or free it: a `bytearray` cannot grow, an ET event cannot be put) until
/// the buffer is released, which dropping this does.
struct Lent(PyUntypedBuffer);

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `Lent` is made only from a C-contiguous buffer of at least one byte
        // (`decode_event`), whose `len_bytes` bytes from `buf_ptr` the exporter keeps valid
        // until the buffer is released, which happens only when `self` is dropped. The bytes
        // are read while the GIL is held (Python code that could write them then waits).
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr().cast::<u8>(), self.0.len_bytes()) }
    }
}

/// Decodes one built event (`DEVT…`, `docs/formats.md`) from any object with the buffer
/// protocol; see `daqflow.decode_event`.
#[pyfunction]
#[pyo3(signature = (data, *, verify = true, copy = false))]
fn decode_event(data: &Bound<'_, PyAny>, verify: bool, copy: bool) -> PyResult<Event> {
    let buffer = PyUntypedBuffer::get(data)?;
    if !buffer.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "decode_event needs contiguous bytes (a bytes object, a memoryview, an ET event, …)",
        ));
    }
    if buffer.len_bytes() < daqflow_wire::EVENT_HEADER_LEN {
        return Err(CorruptDataError::new_err(format!(
            "{} bytes cannot hold a daqflow event (its header alone takes {})",
            buffer.len_bytes(),
            daqflow_wire::EVENT_HEADER_LEN
        )));
    }
    let lent = Lent(buffer);
    let bytes = if copy { Bytes::copy_from_slice(lent.as_ref()) } else { Bytes::from_owner(lent) };
    if bytes.get(..4) != Some(&EVENT_MAGIC.to_le_bytes()[..]) {
        return Err(CorruptDataError::new_err(format!(
            "not a daqflow event: it starts with {:02x?}, not `DEVT`",
            &bytes[..4]
        )));
    }
    let event = WireEvent::parse(bytes).map_err(|e| decode_error("the event", e))?;
    let what = format!("event {}", event.header().event_id);
    if verify {
        let check = event.check().map_err(|e| decode_error(&what, e))?;
        // What the builder found and flagged is data; a mismatch nobody flagged is damage.
        if !event.header().flags.contains(EventFlags::CRC_ERROR)
            && let Some(m) = check.crc_errors.first()
        {
            return Err(CorruptDataError::new_err(format!(
                "{what}: the payload CRC32C of source {}'s fragment is {:#010x} but {:#010x} was stored, and the \
                 event is not flagged CRC_ERROR ({} fragment(s) damaged)",
                m.source_id,
                m.computed,
                m.stored,
                check.crc_errors.len()
            )));
        }
    }
    Ok(Event { record: None, header: *event.header(), bytes: event.as_bytes().clone() })
}

impl Event {
    fn parse_super_fragments(&self) -> PyResult<Vec<WireSF>> {
        // The bytes were parsed once already; the header says they hold an event.
        let event = WireEvent::parse(self.bytes.clone()).map_err(|e| decode_error(&self.what(), e))?;
        event.super_fragments().collect::<Result<Vec<_>, _>>().map_err(|e| decode_error(&self.what(), e))
    }

    fn what(&self) -> String {
        match self.record {
            Some((index, offset)) => format!("record {index} (event {}) at offset {offset}", self.header.event_id),
            None => format!("event {}", self.header.event_id),
        }
    }
}

#[pymethods]
impl Event {
    #[getter]
    fn id(&self) -> u64 {
        self.header.event_id.0
    }
    #[getter]
    fn run(&self) -> u32 {
        self.header.run_number
    }
    #[getter]
    fn flags(&self) -> u32 {
        self.header.flags.0
    }
    #[getter]
    fn trigger_type(&self) -> u32 {
        self.header.trigger_type
    }
    #[getter]
    fn bu_id(&self) -> u32 {
        self.header.bu_id
    }
    #[getter]
    fn index(&self) -> Option<u64> {
        self.record.map(|(index, _)| index)
    }
    #[getter]
    fn offset(&self) -> Option<u64> {
        self.record.map(|(_, offset)| offset)
    }
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMemoryView>> {
        Buffer::view(py, Store::Shared(self.bytes.clone()))
    }
    #[getter]
    fn super_fragments(&self) -> PyResult<Vec<SuperFragment>> {
        Ok(self.parse_super_fragments()?.into_iter().map(|sf| SuperFragment { what: self.what(), sf }).collect())
    }
    #[getter]
    fn fragments(&self) -> PyResult<Vec<Fragment>> {
        let mut fragments = Vec::new();
        for sf in self.parse_super_fragments()? {
            for fragment in sf.fragments() {
                fragments.push(Fragment { fragment: fragment.map_err(|e| decode_error(&self.what(), e))? });
            }
        }
        Ok(fragments)
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<daqflow.Event {} run {} with {} super-fragments, {} bytes>",
            self.header.event_id, self.header.run_number, self.header.super_fragment_count, self.header.total_len
        )
    }
}

/// A readout unit's fragments of one event.
#[pyclass(frozen, module = "daqflow")]
pub struct SuperFragment {
    what: String,
    sf: WireSF,
}

#[pymethods]
impl SuperFragment {
    #[getter]
    fn ru_id(&self) -> u32 {
        self.sf.header().ru_id
    }
    #[getter]
    fn event_id(&self) -> u64 {
        self.sf.header().event_id.0
    }
    #[getter]
    fn flags(&self) -> u32 {
        self.sf.header().flags.0
    }
    #[getter]
    fn fragments(&self) -> PyResult<Vec<Fragment>> {
        self.sf
            .fragments()
            .map(|f| f.map(|fragment| Fragment { fragment }).map_err(|e| decode_error(&self.what, e)))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.sf.header().fragment_count as usize
    }

    fn __repr__(&self) -> String {
        let h = self.sf.header();
        format!("<daqflow.SuperFragment RU {} event {} with {} fragments>", h.ru_id, h.event_id, h.fragment_count)
    }
}

/// One source's data of one event.
#[pyclass(frozen, module = "daqflow")]
pub struct Fragment {
    fragment: WireFragment,
}

#[pymethods]
impl Fragment {
    #[getter]
    fn source_id(&self) -> u32 {
        self.fragment.header().source_id
    }
    #[getter]
    fn event_id(&self) -> u64 {
        self.fragment.header().event_id.0
    }
    #[getter]
    fn run(&self) -> u32 {
        self.fragment.header().run_number
    }
    #[getter]
    fn trigger_type(&self) -> u32 {
        self.fragment.header().trigger_type
    }
    #[getter]
    fn timestamp(&self) -> u64 {
        self.fragment.header().timestamp
    }
    #[getter]
    fn flags(&self) -> u32 {
        self.fragment.header().flags.0
    }
    #[getter]
    fn crc_ok(&self) -> bool {
        self.fragment.verify_crc().is_ok()
    }
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMemoryView>> {
        Buffer::view(py, Store::Shared(self.fragment.payload()))
    }

    fn __len__(&self) -> usize {
        self.fragment.header().payload_len as usize
    }

    fn __repr__(&self) -> String {
        let h = self.fragment.header();
        format!("<daqflow.Fragment source {} event {} with {} bytes>", h.source_id, h.event_id, h.payload_len)
    }
}

/// What `File.verify` found.
#[pyclass(frozen, module = "daqflow", get_all)]
pub struct VerifyReport {
    clean: bool,
    records: u64,
    payload_bytes: u64,
    events_checked: u64,
    complete: bool,
    cut_short: Option<(u64, u64, u64)>,
    problems: Vec<String>,
}

#[pymethods]
impl VerifyReport {
    fn __repr__(&self) -> String {
        format!(
            "<daqflow.VerifyReport clean={} records={} complete={} cut_short={} problems={}>",
            if self.clean { "True" } else { "False" },
            self.records,
            if self.complete { "True" } else { "False" },
            if self.cut_short.is_some() { "True" } else { "False" },
            self.problems.len()
        )
    }

    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("clean", self.clean)?;
        d.set_item("records", self.records)?;
        d.set_item("payload_bytes", self.payload_bytes)?;
        d.set_item("events_checked", self.events_checked)?;
        d.set_item("complete", self.complete)?;
        d.set_item("cut_short", self.cut_short)?;
        d.set_item("problems", PyList::new(py, &self.problems)?)?;
        Ok(d)
    }
}

/// The fragments of a whole file as columns; see `File.arrays`.
#[pyclass(frozen, module = "daqflow", get_all)]
pub struct Arrays {
    events: u64,
    event_ids: Py<PyAny>,
    source_ids: Py<PyAny>,
    flags: Py<PyAny>,
    sizes: Py<PyAny>,
    timestamps: Py<PyAny>,
    offsets: Py<PyAny>,
    payload: Py<PyAny>,
}

#[pymethods]
impl Arrays {
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.sizes.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<daqflow.Arrays of {} events, {} fragments, {} payload bytes>",
            self.events,
            self.sizes.bind(py).len()?,
            self.payload.bind(py).len()?
        ))
    }
}

/// `numpy`, or an `ImportError` saying that `what` needs it.
fn import_numpy<'py>(py: Python<'py>, what: &str) -> PyResult<Bound<'py, PyModule>> {
    py.import("numpy").map_err(|e| {
        PyImportError::new_err(format!("{what} needs numpy ({e}): pip install numpy, or install daqflow[numpy]"))
    })
}

/// A read-only numpy array of `dtype` over `store`, without a copy.
fn numpy_array(numpy: &Bound<'_, PyModule>, store: Store, dtype: &str) -> PyResult<Py<PyAny>> {
    let buffer = Bound::new(numpy.py(), Buffer::new(store))?;
    Ok(numpy.call_method1("frombuffer", (buffer, dtype))?.unbind())
}

/// What one batch of `File.batches` holds at most, about: 16 MiB (`daqflow.export` reads with
/// the same; its peak memory follows it).
const DEFAULT_BATCH_BYTES: usize = 16 << 20;

/// The events of a file in batches of columns; see `File.batches`.
#[pyclass(module = "daqflow")]
pub struct Batches {
    numpy: Py<PyModule>,
    reader: Arc<FileReader<fs::File>>,
    /// `None` once the records ended.
    cursor: Option<ScanCursor>,
    max_bytes: usize,
    payload: bool,
    skip_damaged: bool,
}

#[pymethods]
impl Batches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        let Some(mut cursor) = self.cursor.take() else { return Ok(None) };
        let (reader, max_bytes, payload, skip_damaged) =
            (Arc::clone(&self.reader), self.max_bytes, self.payload, self.skip_damaged);
        let (columns, ended, cursor) = py.detach(move || {
            let mut c = Columns::new(payload, max_bytes.min(reader.size() as usize) + 1024);
            let ended = c.read_until(&reader, &mut cursor, skip_damaged, max_bytes);
            (c, ended, cursor)
        });
        if !ended? {
            self.cursor = Some(cursor);
        }
        if columns.events == 0 {
            return Ok(None);
        }
        Batch::new(self.numpy.bind(py), columns).map(Some)
    }
}

/// Events of a file as numpy columns: one row per event in the first group, one per fragment
/// in the second (`fragment_start[i]` to `fragment_start[i + 1]` are event `i`'s).
#[pyclass(frozen, module = "daqflow", get_all)]
pub struct Batch {
    events: u64,
    run: Py<PyAny>,
    event_id: Py<PyAny>,
    trigger_type: Py<PyAny>,
    flags: Py<PyAny>,
    bu_id: Py<PyAny>,
    trigger_time: Py<PyAny>,
    size: Py<PyAny>,
    fragment_start: Py<PyAny>,
    source_id: Py<PyAny>,
    fragment_size: Py<PyAny>,
    fragment_timestamp: Py<PyAny>,
    fragment_flags: Py<PyAny>,
    payload_start: Option<Py<PyAny>>,
    payload: Option<Py<PyAny>>,
}

impl Batch {
    fn new(numpy: &Bound<'_, PyModule>, mut c: Columns) -> PyResult<Batch> {
        let u32s = |v: Vec<u32>| numpy_array(numpy, Store::U32(v), "uint32");
        let u64s = |v: Vec<u64>| numpy_array(numpy, Store::U64(v), "uint64");
        let (payload_start, payload) = if c.with_payload {
            c.offsets.push(c.payload.len() as u64);
            (Some(u64s(c.offsets)?), Some(numpy_array(numpy, Store::U8(c.payload), "uint8")?))
        } else {
            (None, None)
        };
        Ok(Batch {
            events: c.events,
            run: u32s(c.runs)?,
            event_id: u64s(c.ids)?,
            trigger_type: u32s(c.trigger_types)?,
            flags: u32s(c.event_flags)?,
            bu_id: u32s(c.bu_ids)?,
            trigger_time: u64s(c.trigger_times)?,
            size: u64s(c.event_sizes)?,
            fragment_start: u64s(c.fragment_starts)?,
            source_id: u32s(c.source_ids)?,
            fragment_size: u32s(c.sizes)?,
            fragment_timestamp: u64s(c.timestamps)?,
            fragment_flags: u32s(c.flags)?,
            payload_start,
            payload,
        })
    }
}

#[pymethods]
impl Batch {
    fn __len__(&self) -> usize {
        self.events as usize
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<daqflow.Batch of {} events, {} fragments{}>",
            self.events,
            self.source_id.bind(py).len()?,
            match &self.payload {
                Some(p) => format!(", {} payload bytes", p.bind(py).len()?),
                None => String::new(),
            }
        ))
    }
}

/// The columns [`File::arrays`] and [`File::batches`] fill, without Python: one entry per event
/// in the first group, one per fragment in the second, and the fragments' payloads back to back.
#[derive(Default)]
struct Columns {
    events: u64,
    runs: Vec<u32>,
    ids: Vec<u64>,
    trigger_types: Vec<u32>,
    event_flags: Vec<u32>,
    bu_ids: Vec<u32>,
    trigger_times: Vec<u64>,
    event_sizes: Vec<u64>,
    /// Where each event's fragments start in the fragment columns, and after the last one the
    /// number of fragments (`events + 1` entries).
    fragment_starts: Vec<u64>,
    event_ids: Vec<u64>,
    source_ids: Vec<u32>,
    flags: Vec<u32>,
    sizes: Vec<u32>,
    timestamps: Vec<u64>,
    /// Where each fragment's payload starts in `payload` (with payloads).
    offsets: Vec<u64>,
    payload: Vec<u8>,
    with_payload: bool,
}

/// Bytes the columns hold per event and per fragment, besides the payloads.
const EVENT_COLUMN_BYTES: usize = 4 + 8 + 4 + 4 + 4 + 8 + 8 + 8;
const FRAGMENT_COLUMN_BYTES: usize = 8 + 4 + 4 + 4 + 8 + 8;

impl Columns {
    fn new(with_payload: bool, payload_capacity: usize) -> Columns {
        let mut c = Columns { with_payload, fragment_starts: vec![0], ..Columns::default() };
        if with_payload {
            c.payload = Vec::with_capacity(payload_capacity);
            advise_huge_pages(&mut c.payload);
        }
        c
    }

    /// Bytes held, about.
    fn held(&self) -> usize {
        self.ids.len() * EVENT_COLUMN_BYTES + self.sizes.len() * FRAGMENT_COLUMN_BYTES + self.payload.len()
    }

    /// The whole file from the start; see `File.arrays`.
    fn read(reader: &FileReader<fs::File>, skip_damaged: bool) -> PyResult<Columns> {
        let mut c = Columns::new(true, reader.size() as usize);
        c.read_until(reader, &mut reader.cursor(), skip_damaged, usize::MAX)?;
        Ok(c)
    }

    /// Reads events from `cursor` until the columns hold `budget` bytes or more, or the records
    /// end; returns whether they ended.
    fn read_until(
        &mut self,
        reader: &FileReader<fs::File>,
        cursor: &mut ScanCursor,
        skip_damaged: bool,
        budget: usize,
    ) -> PyResult<bool> {
        while self.held() < budget {
            let Some((index, offset, event)) = next_event(reader, cursor, skip_damaged)? else { return Ok(true) };
            let mark = (self.sizes.len(), self.payload.len());
            match self.add(&event) {
                Ok(()) => {
                    let h = event.header();
                    self.events += 1;
                    self.runs.push(h.run_number);
                    self.ids.push(h.event_id.0);
                    self.trigger_types.push(h.trigger_type);
                    self.event_flags.push(h.flags.0);
                    self.bu_ids.push(h.bu_id);
                    self.trigger_times.push(self.timestamps.get(mark.0).copied().unwrap_or(0));
                    self.event_sizes.push(h.total_len);
                    self.fragment_starts.push(self.sizes.len() as u64);
                }
                // Drop the fragments taken from the damaged event.
                Err(_) if skip_damaged => self.truncate(mark),
                Err(e) => {
                    let what = format!("record {index} (event {}) at offset {offset}", event.header().event_id);
                    return Err(decode_error(&what, e));
                }
            }
        }
        Ok(false)
    }

    fn add(&mut self, event: &WireEvent) -> Result<(), DecodeError> {
        for sf in event.super_fragments() {
            for fragment in sf?.fragments() {
                let fragment = fragment?;
                let h = fragment.header();
                self.event_ids.push(h.event_id.0);
                self.source_ids.push(h.source_id);
                self.flags.push(h.flags.0);
                self.sizes.push(h.payload_len);
                self.timestamps.push(h.timestamp);
                if self.with_payload {
                    self.offsets.push(self.payload.len() as u64);
                    self.payload.extend_from_slice(fragment.payload_slice());
                }
            }
        }
        Ok(())
    }

    fn truncate(&mut self, (fragments, bytes): (usize, usize)) {
        self.event_ids.truncate(fragments);
        self.source_ids.truncate(fragments);
        self.flags.truncate(fragments);
        self.sizes.truncate(fragments);
        self.timestamps.truncate(fragments);
        self.offsets.truncate(fragments);
        self.payload.truncate(bytes);
    }
}

/// Asks Linux to back the spare capacity of `buffer` with huge pages: filling a buffer of a
/// gigabyte then takes 512 times fewer page faults, which made `File.arrays()` twice as fast
/// (`docs/python.md`). Only advice: without transparent huge pages nothing changes.
fn advise_huge_pages(buffer: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        if buffer.capacity() < 2 * HUGE_PAGE {
            return;
        }
        // SAFETY: `sysconf` has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let start = buffer.as_mut_ptr() as usize;
        let end = start + buffer.capacity();
        let first = start.div_ceil(page) * page;
        let last = end / page * page;
        if last > first {
            // SAFETY: `[first, last)` lies inside the allocation of `buffer` and is page aligned;
            // MADV_HUGEPAGE is advice that changes neither the mapping's contents nor its
            // access rights. A failure leaves the memory as it was, which is fine.
            unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buffer;
}

/// Opens the data file `path` (a `.daq` file, or a `.daq.part` file whose writer stopped).
#[pyfunction]
fn open(py: Python<'_>, path: std::path::PathBuf) -> PyResult<File> {
    let reader = py.detach(|| FileReader::open(&path)).map_err(read_error)?;
    Ok(File { reader: Arc::new(reader) })
}

/// The extension module `daqflow._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(decode_event, m)?)?;
    m.add_class::<File>()?;
    m.add_class::<Events>()?;
    m.add_class::<Event>()?;
    m.add_class::<SuperFragment>()?;
    m.add_class::<Fragment>()?;
    m.add_class::<VerifyReport>()?;
    m.add_class::<Arrays>()?;
    m.add_class::<Batches>()?;
    m.add_class::<Batch>()?;
    m.add_class::<Buffer>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<component::SourceStream>()?;
    m.add_function(wrap_pyfunction!(component::_run_component, m)?)?;
    m.add_function(wrap_pyfunction!(ports::_run_port_component, m)?)?;
    m.add_class::<ports::PyOutputs>()?;
    m.add_function(wrap_pyfunction!(component::_use_token, m)?)?;
    m.add_function(wrap_pyfunction!(component::_log, m)?)?;
    dialog::register(m)?;
    et::register(m)?;
    Ok(())
}
