//! The ET system from Python (`daqflow.et`): create a system in this process, connect to one on
//! this machine (shared memory) or elsewhere (TCP, discovery by name), create and configure
//! stations, attach, and get, put and dump batches of events whose data Python reads and writes
//! in place.
//!
//! This wraps `daqflow-et` (`docs/et.md`); `python/daqflow/et.py` re-exports the classes under
//! their Python names and `docs/python.md` ("ET") is the user's guide.
//!
//! # Events held by Python
//!
//! A Rust [`Event`] borrows its attachment. Python cannot express that borrow, so a [`Batch`]
//! keeps the attachment alive itself: it holds the events (their lifetime extended to
//! `'static`) together with an `Arc` of the attachment they came from, and drops the events
//! first (see [`State`]). Every call that hands events back checks that they came from that
//! same attachment.
//!
//! # Buffers lent to Python, and why they cannot outlive the event
//!
//! `Event.data` (and `memoryview(event)`) lends the event's bytes to Python through the buffer
//! protocol, writable, without a copy: for a local attachment they are the shared memory itself
//! (a large event's temporary buffer is unmapped once it is put), for a remote one the event's
//! own copy (freed when it is sent back). So a view must never outlive the event's time in
//! this process. Each event counts the views exported from it; `put_events` and
//! `dump_events` first release the memoryviews `Event.data` handed out (using one afterwards
//! raises `ValueError`), then refuse (`BufferInUseError`, nothing handed back) while any other
//! export remains (a `numpy` array made from the event, a slice, a `memoryview(event)`).
//! Nothing can then point into memory the process no longer owns.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_et::{
    EtClient, EtError as RustEtError, EtSystem, Event as RustEvent, EventView, GroupPolicy, LocalAttachment, Position,
    Priority as RustPriority, RemoteAttachment, RemoteClient, RestoreMode, SelectFn, Selection as RustSelection,
    Snapshot, StationConfig, SystemConfig, Wait,
};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySequence, PyString, PyTuple};
use pyo3::{PyTraverseError, create_exception, gc::PyVisit, intern};

create_exception!(daqflow.et, EtError, super::Error, "Base class of the errors of the ET system.");
create_exception!(
    daqflow.et,
    NotFoundError,
    EtError,
    "No ET system of that name runs on this machine (or answers at that address)."
);
create_exception!(daqflow.et, NameTakenError, EtError, "An ET system of that name runs already.");
create_exception!(
    daqflow.et,
    SystemDeadError,
    EtError,
    "The ET system stopped or died: connect again when it is back."
);
create_exception!(
    daqflow.et,
    AttachmentDeadError,
    EtError,
    "The ET system declared the attachment dead and took its events back: attach again."
);
create_exception!(daqflow.et, NoSuchStationError, EtError, "No station of that name.");
create_exception!(daqflow.et, StationExistsError, EtError, "A station of that name exists already.");
create_exception!(daqflow.et, RefusedError, EtError, "The ET system refused the request (the message says why).");
create_exception!(daqflow.et, TimedOutError, EtError, "No event came within the wait.");
create_exception!(
    daqflow.et,
    NotOwnedError,
    EtError,
    "Events were handed to an attachment that did not hand them out."
);
create_exception!(
    daqflow.et,
    OverLimitError,
    EtError,
    "The request goes over one of the ET system's limits; nothing was taken."
);
create_exception!(
    daqflow.et,
    AccessDeniedError,
    EtError,
    "The ET system does not accept local connections from this user."
);
create_exception!(
    daqflow.et,
    EventReleasedError,
    EtError,
    "The event was put or dumped already: it is no longer this process's."
);
create_exception!(
    daqflow.et,
    BufferInUseError,
    EtError,
    "Events cannot be put or dumped while buffers of their data are still exported (numpy arrays, memoryview slices)."
);

/// An [`RustEtError`] as the matching Python exception.
fn et_error(e: RustEtError) -> PyErr {
    let m = e.to_string();
    match e {
        RustEtError::NotFound(_) => NotFoundError::new_err(m),
        RustEtError::NameTaken(_) => NameTakenError::new_err(m),
        RustEtError::SystemDead(_) => SystemDeadError::new_err(m),
        RustEtError::AttachmentDead(_) => AttachmentDeadError::new_err(m),
        RustEtError::NoSuchStation(_) => NoSuchStationError::new_err(m),
        RustEtError::StationExists(_) => StationExistsError::new_err(m),
        RustEtError::Refused(_) => RefusedError::new_err(m),
        RustEtError::Timeout => TimedOutError::new_err(m),
        RustEtError::NotOwned { .. } => NotOwnedError::new_err(m),
        RustEtError::OverLimit { .. } => OverLimitError::new_err(m),
        RustEtError::AccessDenied { .. } => AccessDeniedError::new_err(m),
        RustEtError::Io { .. } | RustEtError::Protocol(_) => EtError::new_err(m),
    }
}

use daqflow_component::sync::lock;

/// How long one blocking call waits without the GIL before Python checks for signals
/// (Ctrl-C): a `sleep` wait is a series of these.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// A `wait=` argument: `"sleep"` (default), `"async"`, or seconds.
#[derive(Clone, Copy)]
enum WaitArg {
    Sleep,
    Async,
    Timed(Duration),
}

fn wait_arg(wait: Option<&Bound<'_, PyAny>>) -> PyResult<WaitArg> {
    let Some(w) = wait else { return Ok(WaitArg::Sleep) };
    if w.is_none() {
        return Ok(WaitArg::Sleep);
    }
    if let Ok(s) = w.cast::<PyString>() {
        return match s.to_str()? {
            "sleep" => Ok(WaitArg::Sleep),
            "async" => Ok(WaitArg::Async),
            other => Err(PyValueError::new_err(format!(
                "wait={other:?}: wait is \"sleep\", \"async\" or a number of seconds"
            ))),
        };
    }
    let secs: f64 =
        w.extract().map_err(|_| PyTypeError::new_err("wait is \"sleep\", \"async\" or a number of seconds"))?;
    seconds(secs, "wait").map(WaitArg::Timed)
}

fn seconds(secs: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| PyValueError::new_err(format!("{what}={secs}: a number of seconds, 0 or more")))
}

/// Runs `call` without the GIL with waits of at most [`SIGNAL_CHECK`], checking for signals in
/// between, until it returns events (or an error), as `wait` says.
fn waiting<F>(py: Python<'_>, wait: WaitArg, mut call: F) -> PyResult<()>
where
    F: FnMut(Wait) -> Result<usize, RustEtError> + Send,
{
    let deadline = match wait {
        WaitArg::Timed(d) => Some(Instant::now() + d),
        _ => None,
    };
    loop {
        let this = match (wait, deadline) {
            (WaitArg::Async, _) => Wait::NoWait,
            (_, Some(dl)) => Wait::Timed(dl.saturating_duration_since(Instant::now()).min(SIGNAL_CHECK)),
            (_, None) => Wait::Timed(SIGNAL_CHECK),
        };
        match py.detach(|| call(this)) {
            Ok(_) => return Ok(()),
            Err(RustEtError::Timeout) if deadline.is_none_or(|dl| Instant::now() < dl) => py.check_signals()?,
            Err(e) => return Err(et_error(e)),
        }
    }
}

fn restore_arg(s: &str) -> PyResult<RestoreMode> {
    match normalize(s).as_str() {
        "output" => Ok(RestoreMode::Output),
        "input" => Ok(RestoreMode::Input),
        "grand-central" | "grandcentral" | "gc" => Ok(RestoreMode::GrandCentral),
        "redistribute" => Ok(RestoreMode::Redistribute),
        _ => Err(PyValueError::new_err(format!(
            "restore={s:?}: one of \"output\", \"input\", \"grand-central\", \"redistribute\""
        ))),
    }
}

fn group_policy_arg(s: &str) -> PyResult<GroupPolicy> {
    match normalize(s).as_str() {
        "round-robin" | "roundrobin" => Ok(GroupPolicy::RoundRobin),
        "shortest-queue" | "shortestqueue" => Ok(GroupPolicy::ShortestQueue),
        _ => Err(PyValueError::new_err(format!("group_policy={s:?}: \"round-robin\" or \"shortest-queue\""))),
    }
}

fn normalize(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace('_', "-")
}

/// A `select=` argument: a `Selection`, its command-line form, a sequence of up to four
/// control integers or `None` (a match), or — where `closure` allows — a Python callable.
fn selection_arg(obj: &Bound<'_, PyAny>, closure: bool) -> PyResult<RustSelection> {
    if obj.is_none() {
        return Ok(RustSelection::All);
    }
    if let Ok(s) = obj.cast::<Selection>() {
        return Ok(s.get().0.clone());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return RustSelection::parse(s.to_str()?).map_err(PyValueError::new_err);
    }
    if obj.is_callable() {
        if !closure {
            return Err(PyValueError::new_err(
                "a Python function can select events only in the ET system's own process: create the station with System.create_station",
            ));
        }
        let f: Py<PyAny> = obj.clone().unbind();
        let select: SelectFn = Arc::new(move |v: &EventView<'_>| python_selects(&f, v));
        return Ok(RustSelection::Closure(select));
    }
    if let Ok(seq) = obj.cast::<PySequence>() {
        return Ok(RustSelection::Match(match_values(seq)?));
    }
    Err(PyTypeError::new_err(
        "select is a daqflow.et.Selection, its text form (\"match:1,*,*,*\"), a sequence of up to 4 ints or None, or a function",
    ))
}

fn match_values(seq: &Bound<'_, PySequence>) -> PyResult<[Option<i32>; 4]> {
    let n = seq.len()?;
    if n > 4 {
        return Err(PyValueError::new_err(format!("a match takes at most 4 control integers, not {n}")));
    }
    let mut m = [None; 4];
    for (i, slot) in m.iter_mut().enumerate().take(n) {
        let item = seq.get_item(i)?;
        if !item.is_none() {
            *slot = Some(item.extract::<i32>().map_err(|_| {
                PyTypeError::new_err(format!("match position {i}: an int (32 bits) or None, not {item}"))
            })?);
        }
    }
    Ok(m)
}

/// Runs a Python selection function in the ET system's conductor thread: `f(control,
/// priority, data)`. An exception counts as "not selected" and is reported as unraisable.
fn python_selects(f: &Py<PyAny>, v: &EventView<'_>) -> bool {
    Python::try_attach(|py| {
        let control = PyTuple::new(py, v.control).ok();
        let priority = Priority::from(v.priority);
        let result = control.and_then(|c| f.call1(py, (c, priority, PyBytes::new(py, v.data))).ok());
        match result {
            Some(r) => r.is_truthy(py).unwrap_or(false),
            None => {
                if let Some(e) = PyErr::take(py) {
                    e.write_unraisable(py, Some(f.bind(py)));
                }
                false
            }
        }
    })
    .unwrap_or(false)
}

/// The options of a new station, from `create_station`'s keywords.
#[allow(clippy::too_many_arguments)]
fn station_config(
    blocking: bool,
    cue: u32,
    select: Option<&Bound<'_, PyAny>>,
    prescale: u32,
    restore: &str,
    single_user: bool,
    keep_when_idle: bool,
    group_policy: &str,
    closure: bool,
) -> PyResult<StationConfig> {
    Ok(StationConfig {
        blocking,
        cue,
        prescale,
        selection: match select {
            Some(s) => selection_arg(s, closure)?,
            None => RustSelection::All,
        },
        single_user,
        restore: restore_arg(restore)?,
        group_policy: group_policy_arg(group_policy)?,
        keep_when_idle,
    })
}

fn position_arg(first: bool, after: Option<String>, parallel_with: Option<String>) -> PyResult<Position> {
    match (first, after, parallel_with) {
        (false, None, None) => Ok(Position::End),
        (true, None, None) => Ok(Position::First),
        (false, Some(a), None) => Ok(Position::After(a)),
        (false, None, Some(p)) => Ok(Position::ParallelWith(p)),
        _ => Err(PyValueError::new_err("give at most one of first=True, after=NAME and parallel_with=NAME")),
    }
}

/// Changes given to `configure_station`, applied to the station's current configuration.
struct Changes<'py> {
    blocking: Option<bool>,
    cue: Option<u32>,
    select: Option<Bound<'py, PyAny>>,
    prescale: Option<u32>,
    restore: Option<String>,
    single_user: Option<bool>,
    keep_when_idle: Option<bool>,
    group_policy: Option<String>,
}

impl Changes<'_> {
    fn apply(self, snapshot: &Snapshot, name: &str, closure: bool) -> PyResult<StationConfig> {
        let Some(station) = snapshot.stations.iter().find(|s| s.name == name) else {
            return Err(et_error(RustEtError::NoSuchStation(name.into())));
        };
        if station.closure && self.select.is_none() {
            return Err(PyValueError::new_err(format!(
                "station `{name}` selects with a function, which a configuration cannot keep: give select= as well"
            )));
        }
        let mut c = station.config.clone();
        if let Some(v) = self.blocking {
            c.blocking = v;
        }
        if let Some(v) = self.cue {
            c.cue = v;
        }
        if let Some(v) = self.select {
            c.selection = selection_arg(&v, closure)?;
        }
        if let Some(v) = self.prescale {
            c.prescale = v;
        }
        if let Some(v) = self.restore {
            c.restore = restore_arg(&v)?;
        }
        if let Some(v) = self.single_user {
            c.single_user = v;
        }
        if let Some(v) = self.keep_when_idle {
            c.keep_when_idle = v;
        }
        if let Some(v) = self.group_policy {
            c.group_policy = group_policy_arg(&v)?;
        }
        Ok(c)
    }
}

/// A snapshot as Python dicts and lists (its JSON form, `docs/et.md` "Monitoring").
fn snapshot_dict(py: Python<'_>, s: &Snapshot) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(s).map_err(|e| EtError::new_err(format!("encoding the snapshot: {e}")))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

// ---------------------------------------------------------------------------------------------
// Selection, Priority
// ---------------------------------------------------------------------------------------------

/// Which events a station selects: every event, a match of the four control integers (with
/// wildcards), a range or bit mask of one of them, or the high-priority events. `str()` gives
/// the command-line form (`daqflow et consume --select`), which `Selection.parse` reads.
#[pyclass(frozen, name = "Selection", module = "daqflow.et")]
pub struct Selection(RustSelection);

#[pymethods]
impl Selection {
    /// Every event (the default).
    #[staticmethod]
    fn all() -> Self {
        Selection(RustSelection::All)
    }

    /// Events whose control integers equal these; `None` (or a position left out) is any
    /// value: `Selection.match(1)` selects `control[0] == 1`.
    #[staticmethod]
    #[pyo3(name = "match", signature = (*control))]
    fn match_(control: &Bound<'_, PyTuple>) -> PyResult<Self> {
        Ok(Selection(RustSelection::Match(match_values(control.as_sequence())?)))
    }

    /// Events with `lo <= control[index] <= hi`.
    #[staticmethod]
    fn range(index: usize, lo: i32, hi: i32) -> PyResult<Self> {
        Ok(Selection(RustSelection::Range { index: control_index(index)?, lo, hi }))
    }

    /// Events with any bit of `mask` set in `control[index]`.
    #[staticmethod]
    fn mask_any(index: usize, mask: i32) -> PyResult<Self> {
        Ok(Selection(RustSelection::MaskAny { index: control_index(index)?, mask }))
    }

    /// Events with every bit of `mask` set in `control[index]`.
    #[staticmethod]
    fn mask_all(index: usize, mask: i32) -> PyResult<Self> {
        Ok(Selection(RustSelection::MaskAll { index: control_index(index)?, mask }))
    }

    /// High-priority events.
    #[staticmethod]
    fn high_priority() -> Self {
        Selection(RustSelection::HighPriority)
    }

    /// Reads the command-line form: `all`, `match:A,B,C,D` (`*` for any), `range:I:LO:HI`,
    /// `mask-any:I:MASK`, `mask-all:I:MASK`, `high`.
    #[staticmethod]
    fn parse(text: &str) -> PyResult<Self> {
        RustSelection::parse(text).map(Selection).map_err(PyValueError::new_err)
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Selection.parse('{}')", self.0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Selection>().is_ok_and(|o| o.get().0.to_string() == self.0.to_string())
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.0.to_string().hash(&mut h);
        h.finish()
    }
}

fn control_index(i: usize) -> PyResult<usize> {
    if i < 4 { Ok(i) } else { Err(PyValueError::new_err(format!("control index {i}: 0 to 3"))) }
}

/// An event's priority: high-priority events go ahead of low-priority ones in every station's
/// input list.
#[pyclass(eq, eq_int, frozen, from_py_object, name = "Priority", module = "daqflow.et")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The default.
    #[pyo3(name = "LOW")]
    Low,
    /// Ahead of every low-priority event.
    #[pyo3(name = "HIGH")]
    High,
}

impl From<RustPriority> for Priority {
    fn from(p: RustPriority) -> Self {
        match p {
            RustPriority::Low => Priority::Low,
            RustPriority::High => Priority::High,
        }
    }
}

impl From<Priority> for RustPriority {
    fn from(p: Priority) -> Self {
        match p {
            Priority::Low => RustPriority::Low,
            Priority::High => RustPriority::High,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// System, Client
// ---------------------------------------------------------------------------------------------

/// An ET system created and owned by this process (`EtSystem`): for tests and small setups.
/// `close()` (or leaving a `with` block) stops it; other processes attach to it by its name.
#[pyclass(frozen, name = "System", module = "daqflow.et")]
pub struct System {
    system: Mutex<Option<Arc<EtSystem>>>,
    name: String,
}

impl System {
    fn get(&self) -> PyResult<Arc<EtSystem>> {
        lock(&self.system)
            .clone()
            .ok_or_else(|| SystemDeadError::new_err(format!("the ET system `{}` was closed", self.name)))
    }
}

#[pymethods]
impl System {
    /// Creates the ET system `name` with a pool of `events` events of `event_size` bytes.
    #[new]
    #[pyo3(signature = (name, events, event_size, *, listen=None, discovery_port=None, max_stations=None,
        max_attachments=None, max_temp_events=None, max_event_bytes=None, max_temp_per_attachment=None,
        max_temp_bytes=None, max_attachments_per_connection=None, allowed_uids=None, heartbeat_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        events: u32,
        event_size: usize,
        listen: Option<&str>,
        discovery_port: Option<u16>,
        max_stations: Option<u32>,
        max_attachments: Option<u32>,
        max_temp_events: Option<u32>,
        max_event_bytes: Option<usize>,
        max_temp_per_attachment: Option<u32>,
        max_temp_bytes: Option<u64>,
        max_attachments_per_connection: Option<u32>,
        allowed_uids: Option<Vec<u32>>,
        heartbeat_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let mut c = SystemConfig::new(name.clone(), events, event_size);
        if let Some(l) = listen {
            c.listen = Some(socket_address(l)?);
        }
        c.discovery_port = discovery_port;
        if let Some(v) = max_stations {
            c.max_stations = v;
        }
        if let Some(v) = max_attachments {
            c.max_attachments = v;
        }
        if let Some(v) = max_temp_events {
            c.max_temp_events = v;
        }
        if let Some(v) = max_event_bytes {
            c.max_event_bytes = v;
        }
        if let Some(v) = max_temp_per_attachment {
            c.max_temp_per_attachment = v;
        }
        if let Some(v) = max_temp_bytes {
            c.max_temp_bytes = v;
        }
        if let Some(v) = max_attachments_per_connection {
            c.max_attachments_per_connection = v;
        }
        if let Some(v) = allowed_uids {
            c.allowed_uids = v;
        }
        if let Some(s) = heartbeat_timeout {
            c.heartbeat_timeout = seconds(s, "heartbeat_timeout")?;
        }
        let system = py.detach(|| EtSystem::create(c)).map_err(et_error)?;
        Ok(System { system: Mutex::new(Some(Arc::new(system))), name })
    }

    /// The system's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The remote server's address as `"host:port"` (with `listen=`), else `None`.
    #[getter]
    fn remote_address(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.remote_addr().map(|a| a.to_string()))
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.system).is_none()
    }

    /// Creates a station; see `Client.create_station`. Here `select` may also be a function
    /// `f(control, priority, data) -> bool`, run in this process for every event that reaches
    /// the station.
    #[pyo3(signature = (name, *, blocking=true, cue=100, select=None, prescale=1, restore="output",
        single_user=false, keep_when_idle=false, group_policy="round-robin", first=false, after=None, parallel_with=None))]
    #[allow(clippy::too_many_arguments)]
    fn create_station(
        &self,
        py: Python<'_>,
        name: &str,
        blocking: bool,
        cue: u32,
        select: Option<&Bound<'_, PyAny>>,
        prescale: u32,
        restore: &str,
        single_user: bool,
        keep_when_idle: bool,
        group_policy: &str,
        first: bool,
        after: Option<String>,
        parallel_with: Option<String>,
    ) -> PyResult<()> {
        let config =
            station_config(blocking, cue, select, prescale, restore, single_user, keep_when_idle, group_policy, true)?;
        let position = position_arg(first, after, parallel_with)?;
        let system = self.get()?;
        py.detach(|| system.create_station(name, config, position)).map_err(et_error)
    }

    /// Removes a station that has no attachment.
    fn remove_station(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let system = self.get()?;
        py.detach(|| system.remove_station(name)).map_err(et_error)
    }

    /// Changes a station's settings while it runs; the settings not given keep their values.
    /// `select` may be a function, as for `create_station`.
    #[pyo3(signature = (name, *, blocking=None, cue=None, select=None, prescale=None, restore=None,
        single_user=None, keep_when_idle=None, group_policy=None))]
    #[allow(clippy::too_many_arguments)]
    fn configure_station<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        blocking: Option<bool>,
        cue: Option<u32>,
        select: Option<Bound<'py, PyAny>>,
        prescale: Option<u32>,
        restore: Option<String>,
        single_user: Option<bool>,
        keep_when_idle: Option<bool>,
        group_policy: Option<String>,
    ) -> PyResult<()> {
        let system = self.get()?;
        let snapshot = py.detach(|| system.snapshot());
        let changes = Changes { blocking, cue, select, prescale, restore, single_user, keep_when_idle, group_policy };
        let config = changes.apply(&snapshot, name, true)?;
        py.detach(|| system.configure_station(name, config)).map_err(et_error)
    }

    /// Attaches to a station from this process (no socket): for a producer, `GRAND_CENTRAL`.
    fn attach(&self, py: Python<'_>, station: &str) -> PyResult<Attachment> {
        let system = self.get()?;
        let a = py.detach(|| system.attach(station)).map_err(et_error)?;
        Ok(Attachment::new(Core::Local(Box::new(a)), station, false))
    }

    /// The system's state now, as a dict (`docs/et.md`, "Monitoring").
    fn snapshot(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let system = self.get()?;
        let s = py.detach(|| system.snapshot());
        snapshot_dict(py, &s)
    }

    /// Stops the system: its users see `SystemDeadError`. Doing it again does nothing.
    fn close(&self, py: Python<'_>) {
        let system = lock(&self.system).take();
        if let Some(s) = system {
            py.detach(move || {
                s.stop();
                drop(s);
            });
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("<daqflow.et.System {:?}{}>", self.name, if self.closed() { " closed" } else { "" })
    }
}

impl Drop for System {
    fn drop(&mut self) {
        // Stopping joins the conductor thread, which may be waiting for the GIL to run a
        // Python selection function: stop without the GIL.
        if let Some(system) = self.system.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = Python::try_attach(move |py| py.detach(move || drop(system)));
        }
    }
}

fn socket_address(text: &str) -> PyResult<SocketAddr> {
    text.to_socket_addrs()
        .map_err(|e| PyValueError::new_err(format!("{text:?}: not a host:port address ({e})")))?
        .next()
        .ok_or_else(|| PyValueError::new_err(format!("{text:?}: no address")))
}

enum ClientKind {
    Local(EtClient),
    Remote(RemoteClient),
}

/// A connection to an ET system: on this machine (`daqflow.et.connect`, shared memory) or
/// over TCP (`connect_remote`, `discover`). The same calls for both.
#[pyclass(frozen, name = "Client", module = "daqflow.et")]
pub struct Client {
    kind: ClientKind,
}

macro_rules! on_client {
    ($self:expr, $c:ident => $body:expr) => {
        match &$self.kind {
            ClientKind::Local($c) => $body,
            ClientKind::Remote($c) => $body,
        }
    };
}

#[pymethods]
impl Client {
    /// The system's name (for a remote client, the name its server gave).
    #[getter]
    fn name(&self) -> &str {
        on_client!(self, c => c.name())
    }

    /// Whether this is a remote (TCP) client.
    #[getter]
    fn is_remote(&self) -> bool {
        matches!(self.kind, ClientKind::Remote(_))
    }

    /// Whether the ET system is gone (it stopped or died, or the connection broke).
    #[getter]
    fn is_dead(&self) -> bool {
        on_client!(self, c => c.is_dead())
    }

    /// Attaches to a station: `GRAND_CENTRAL` for a producer.
    fn attach(&self, py: Python<'_>, station: &str) -> PyResult<Attachment> {
        let (core, remote) = match &self.kind {
            ClientKind::Local(c) => (Core::Local(Box::new(py.detach(|| c.attach(station)).map_err(et_error)?)), false),
            ClientKind::Remote(c) => (Core::Remote(py.detach(|| c.attach(station)).map_err(et_error)?), true),
        };
        Ok(Attachment::new(core, station, remote))
    }

    /// Creates a station.
    ///
    /// `blocking` (default) takes every event selected; non-blocking takes events only while
    /// fewer than `cue` wait in its input list. `select`: a `Selection`, its text form
    /// (`"match:1,*,*,*"`), or a sequence of up to four control integers or `None` (a match).
    /// `prescale` N takes every Nth selected event. `restore`: where a dead attachment's events
    /// go (`"output"`, `"input"`, `"grand-central"`, `"redistribute"`). `single_user` allows one
    /// attachment. `keep_when_idle` keeps events while no one is attached. `group_policy`
    /// (`"round-robin"`, `"shortest-queue"`) for a parallel group. Position: at the end, or
    /// `first=True`, `after=NAME`, `parallel_with=NAME` (a parallel group).
    #[pyo3(signature = (name, *, blocking=true, cue=100, select=None, prescale=1, restore="output",
        single_user=false, keep_when_idle=false, group_policy="round-robin", first=false, after=None, parallel_with=None))]
    #[allow(clippy::too_many_arguments)]
    fn create_station(
        &self,
        py: Python<'_>,
        name: &str,
        blocking: bool,
        cue: u32,
        select: Option<&Bound<'_, PyAny>>,
        prescale: u32,
        restore: &str,
        single_user: bool,
        keep_when_idle: bool,
        group_policy: &str,
        first: bool,
        after: Option<String>,
        parallel_with: Option<String>,
    ) -> PyResult<()> {
        let config =
            station_config(blocking, cue, select, prescale, restore, single_user, keep_when_idle, group_policy, false)?;
        let position = position_arg(first, after, parallel_with)?;
        on_client!(self, c => py.detach(|| c.create_station(name, config, position))).map_err(et_error)
    }

    /// Removes a station that has no attachment.
    fn remove_station(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        on_client!(self, c => py.detach(|| c.remove_station(name))).map_err(et_error)
    }

    /// Changes a station's settings while it runs; the settings not given keep their values
    /// (read from a snapshot first).
    #[pyo3(signature = (name, *, blocking=None, cue=None, select=None, prescale=None, restore=None,
        single_user=None, keep_when_idle=None, group_policy=None))]
    #[allow(clippy::too_many_arguments)]
    fn configure_station<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        blocking: Option<bool>,
        cue: Option<u32>,
        select: Option<Bound<'py, PyAny>>,
        prescale: Option<u32>,
        restore: Option<String>,
        single_user: Option<bool>,
        keep_when_idle: Option<bool>,
        group_policy: Option<String>,
    ) -> PyResult<()> {
        let snapshot = on_client!(self, c => py.detach(|| c.snapshot())).map_err(et_error)?;
        let changes = Changes { blocking, cue, select, prescale, restore, single_user, keep_when_idle, group_policy };
        let config = changes.apply(&snapshot, name, false)?;
        on_client!(self, c => py.detach(|| c.configure_station(name, config))).map_err(et_error)
    }

    /// The system's state now, as a dict (`docs/et.md`, "Monitoring").
    fn snapshot(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = on_client!(self, c => py.detach(|| c.snapshot())).map_err(et_error)?;
        snapshot_dict(py, &s)
    }

    fn __repr__(&self) -> String {
        let (kind, name) = on_client!(self, c => (if self.is_remote() { "remote" } else { "local" }, c.name()));
        format!("<daqflow.et.Client {kind} {name:?}>")
    }
}

/// Connects to the ET system `name` on this machine (shared memory).
#[pyfunction]
fn et_connect(py: Python<'_>, name: &str) -> PyResult<Client> {
    let c = py.detach(|| EtClient::connect(name)).map_err(et_error)?;
    Ok(Client { kind: ClientKind::Local(c) })
}

/// Connects to an ET system's remote server at `"host:port"` (TCP).
#[pyfunction]
fn et_connect_remote(py: Python<'_>, address: &str) -> PyResult<Client> {
    let addr = socket_address(address)?;
    let c = py.detach(|| RemoteClient::connect(addr)).map_err(et_error)?;
    Ok(Client { kind: ClientKind::Remote(c) })
}

/// Finds the ET system `name` by UDP discovery on `port` (broadcast and 127.0.0.1) and
/// connects to its remote server.
#[pyfunction]
#[pyo3(signature = (name, port, timeout=3.0))]
fn et_discover(py: Python<'_>, name: &str, port: u16, timeout: f64) -> PyResult<Client> {
    let timeout = seconds(timeout, "timeout")?;
    let c = py.detach(|| RemoteClient::discover(name, port, timeout)).map_err(et_error)?;
    Ok(Client { kind: ClientKind::Remote(c) })
}

// ---------------------------------------------------------------------------------------------
// Attachment
// ---------------------------------------------------------------------------------------------

/// The attachment a batch's events came from.
enum Core {
    /// Boxed: a local attachment is several times the size of a remote one.
    Local(Box<LocalAttachment>),
    Remote(RemoteAttachment),
}

impl Core {
    /// The attachment with its lifetime extended to `'static`, so that the events it hands out
    /// can be kept in a [`Batch`].
    ///
    /// # Safety
    ///
    /// The caller keeps an `Arc` of this `Core` for as long as the reference, and every event
    /// got through it, lives: [`State`] holds its events and their `Core` together and drops
    /// the events first.
    unsafe fn forever(&self) -> &'static (dyn daqflow_et::Attachment + Sync) {
        match self {
            // SAFETY: the caller keeps the `Core` alive (above); `LocalAttachment` is `Sync`.
            Core::Local(a) => unsafe { &*(&**a as *const LocalAttachment) },
            // SAFETY: as above.
            Core::Remote(a) => unsafe { &*(a as *const RemoteAttachment) },
        }
    }
}

/// An attachment to a station: `new_events` (producers), `get_events` (consumers),
/// `put_events`, `dump_events`. `detach()` (or leaving a `with` block) ends it.
#[pyclass(frozen, name = "Attachment", module = "daqflow.et")]
pub struct Attachment {
    core: Mutex<Option<Arc<Core>>>,
    /// The same attachment after `detach()`, alive while batches still hold its events: they
    /// can still be put or dumped.
    detached: std::sync::Weak<Core>,
    station: String,
    remote: bool,
}

impl Attachment {
    fn new(core: Core, station: &str, remote: bool) -> Self {
        let core = Arc::new(core);
        Attachment {
            detached: Arc::downgrade(&core),
            core: Mutex::new(Some(core)),
            station: station.to_owned(),
            remote,
        }
    }

    fn core(&self) -> PyResult<Arc<Core>> {
        lock(&self.core)
            .clone()
            .ok_or_else(|| EtError::new_err(format!("the attachment to `{}` was detached", self.station)))
    }
}

#[pymethods]
impl Attachment {
    /// The station attached to.
    #[getter]
    fn station(&self) -> &str {
        &self.station
    }

    /// Whether it is a remote (TCP) attachment.
    #[getter]
    fn is_remote(&self) -> bool {
        self.remote
    }

    /// Up to `count` new events of `size` bytes from GrandCentral to fill and put (larger
    /// than the pool's event size: a large event). `wait`: `"sleep"` (until there are some),
    /// `"async"` (at once, maybe none) or seconds (then `TimedOutError`).
    #[pyo3(signature = (count, size, wait=None))]
    fn new_events(
        &self,
        py: Python<'_>,
        count: usize,
        size: usize,
        wait: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<Batch>> {
        let wait = wait_arg(wait)?;
        let core = self.core()?;
        // SAFETY: the batch made below holds `core` with the events.
        let att = unsafe { core.forever() };
        let mut events = Vec::with_capacity(count.min(4096));
        waiting(py, wait, |w| att.new_events_into(count, size, w, &mut events))?;
        Batch::make(py, events, core, self.remote)
    }

    /// Up to `count` events from the station's input list; `wait` as for `new_events`. A
    /// GrandCentral attachment cannot get events (`RefusedError`).
    #[pyo3(signature = (count, wait=None))]
    fn get_events(&self, py: Python<'_>, count: usize, wait: Option<&Bound<'_, PyAny>>) -> PyResult<Py<Batch>> {
        let wait = wait_arg(wait)?;
        let core = self.core()?;
        // SAFETY: the batch made below holds `core` with the events.
        let att = unsafe { core.forever() };
        let mut events = Vec::with_capacity(count.min(4096));
        waiting(py, wait, |w| att.get_events_into(count, w, &mut events))?;
        Batch::make(py, events, core, self.remote)
    }

    /// Hands events on to the next stations: a `Batch` (its events not yet put or dumped), an
    /// `Event`, or an iterable of events, all from this attachment. Releases the memoryviews
    /// `Event.data` gave; raises `BufferInUseError` (and puts nothing) while other buffers of
    /// their data exist.
    fn put_events(&self, py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<()> {
        self.hand_back(py, events, false)
    }

    /// Returns events straight to GrandCentral, skipping every later station; the same
    /// arguments and rules as `put_events`.
    fn dump_events(&self, py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<()> {
        self.hand_back(py, events, true)
    }

    /// Ends the attachment. Events still in batches keep it attached until they are put,
    /// dumped or deleted; events deleted without being put go where the station's restore
    /// mode says when it ends.
    fn detach(&self, py: Python<'_>) {
        let core = lock(&self.core).take();
        if let Some(c) = core {
            py.detach(move || drop(c));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.detach(py);
        false
    }

    fn __repr__(&self) -> String {
        let how = if self.remote { "remote" } else { "local" };
        let state = if lock(&self.core).is_none() { " detached" } else { "" };
        format!("<daqflow.et.Attachment {how} to {:?}{state}>", self.station)
    }
}

/// Events to hand back, by batch: (batch, event ids, or `None` for all of it).
type Groups = Vec<(Py<Batch>, Option<Vec<u32>>)>;

fn groups_of(events: &Bound<'_, PyAny>) -> PyResult<Groups> {
    if let Ok(b) = events.cast::<Batch>() {
        return Ok(vec![(b.clone().unbind(), None)]);
    }
    let mut groups: Groups = Vec::new();
    let mut add = |e: &Bound<'_, Event>| {
        let e = e.get();
        match groups.iter_mut().find(|g| g.0.is(&e.batch)) {
            Some((_, Some(ids))) => ids.push(e.id),
            _ => groups.push((e.batch.clone_ref(events.py()), Some(vec![e.id]))),
        }
    };
    if let Ok(e) = events.cast::<Event>() {
        add(e);
        return Ok(groups);
    }
    let iter = events.try_iter().map_err(|_| {
        PyTypeError::new_err("put_events and dump_events take a Batch, an Event or an iterable of events")
    })?;
    for item in iter {
        let item = item?;
        let e = item.cast::<Event>().map_err(|_| PyTypeError::new_err(format!("not a daqflow.et.Event: {item}")))?;
        add(e);
    }
    Ok(groups)
}

/// An event taken out of its batch to be handed back: (its batch, its slot).
type Taken = (Py<Batch>, Slot);

impl Attachment {
    fn hand_back(&self, py: Python<'_>, events: &Bound<'_, PyAny>, dump: bool) -> PyResult<()> {
        let core = self.core().or_else(|e| self.detached.upgrade().ok_or(e))?;
        let groups = groups_of(events)?;
        for (b, _) in &groups {
            let state = lock(&b.get().state);
            if let Some(c) = &state.core
                && !Arc::ptr_eq(c, &core)
            {
                return Err(NotOwnedError::new_err(format!(
                    "these events came from another attachment than this one (to `{}`)",
                    self.station
                )));
            }
        }
        // Release the memoryviews `Event.data` gave, without holding any batch's lock (a
        // release calls back into `Event.__releasebuffer__`). One with exports of its own
        // refuses; the export count below then stops the put.
        // A view that refuses stays cached, so that a later put releases it.
        for (b, ids) in &groups {
            let views: Vec<(u32, Py<PyAny>)> = {
                let mut state = lock(&b.get().state);
                state
                    .slots
                    .iter_mut()
                    .filter(|s| ids.as_ref().is_none_or(|ids| ids.contains(&s.id)))
                    .flat_map(|s| s.views.take().map(|v| (s.id, v)))
                    .collect()
            };
            let kept: Vec<(u32, Py<PyAny>)> =
                views.into_iter().filter(|(_, v)| v.call_method0(py, intern!(py, "release")).is_err()).collect();
            if !kept.is_empty() {
                let mut state = lock(&b.get().state);
                for (id, v) in kept {
                    if let Some(s) = state.slot_mut(id) {
                        s.views.push(v);
                    }
                }
            }
        }
        // Take the events out of their batches, all or none.
        let mut taken: Vec<Taken> = Vec::new();
        for (b, ids) in &groups {
            let result = {
                let mut state = lock(&b.get().state);
                state.take(ids.as_deref())
            };
            match result {
                Ok(slots) => taken.extend(slots.into_iter().map(|s| (b.clone_ref(py), s))),
                Err(e) => {
                    restore(taken, None);
                    return Err(e);
                }
            }
        }
        if taken.is_empty() {
            return Ok(());
        }
        let mut batch: Vec<RustEvent<'static>> = Vec::with_capacity(taken.len());
        let mut owners: Vec<(Py<Batch>, Slot)> = Vec::with_capacity(taken.len());
        for (b, mut s) in taken {
            if let Some(e) = s.event.take() {
                batch.push(e);
                owners.push((b, s));
            }
        }
        // SAFETY: the events come from batches holding this same `Core` (checked above); `core`
        // (an `Arc`) lives until the end of this function, after every event not given back
        // to its batch.
        let att = unsafe { core.forever() };
        let result = py.detach(|| if dump { att.dump_events(&mut batch) } else { att.put_events(&mut batch) });
        match result {
            Ok(()) => {
                drop(batch);
                for (b, _) in &owners {
                    lock(&b.get().state).release_core_if_empty();
                }
                Ok(())
            }
            Err(e) => {
                // A refused call leaves the events with us: back into their batches.
                if batch.len() == owners.len() {
                    restore(owners, Some(batch));
                }
                Err(et_error(e))
            }
        }
    }
}

/// Puts taken events back into their batches (a refused put).
fn restore(taken: Vec<Taken>, events: Option<Vec<RustEvent<'static>>>) {
    let mut events = events.map(|v| v.into_iter());
    for (b, mut slot) in taken {
        if let Some(it) = events.as_mut() {
            slot.event = it.next();
        }
        let mut state = lock(&b.get().state);
        let at = state.slots.binary_search_by_key(&slot.id, |s| s.id).unwrap_or_else(|p| p);
        state.slots.insert(at, slot);
    }
}

// ---------------------------------------------------------------------------------------------
// Batch, Event
// ---------------------------------------------------------------------------------------------

/// One event of a batch.
struct Slot {
    /// Its position in the batch as got (stable: handles find their slot by it).
    id: u32,
    event: Option<RustEvent<'static>>,
    /// Buffers exported from it now (`__getbuffer__` minus `__releasebuffer__`), shared with
    /// each export so that releasing one needs no lock.
    exports: Arc<AtomicU32>,
    /// The memoryviews `Event.data` gave, released when the event is put or dumped.
    views: Views,
}

/// The memoryviews `Event.data` gave for one event: nearly always one, kept without an
/// allocation of its own.
#[derive(Default)]
struct Views {
    last: Option<Py<PyAny>>,
    older: Vec<Py<PyAny>>,
}

impl Views {
    fn push(&mut self, view: Py<PyAny>) {
        if let Some(v) = self.last.replace(view) {
            self.older.push(v);
        }
    }

    fn last(&self) -> Option<&Py<PyAny>> {
        self.last.as_ref()
    }

    fn iter(&self) -> impl Iterator<Item = &Py<PyAny>> {
        self.older.iter().chain(self.last.as_ref())
    }

    /// Every view, leaving none.
    fn take(&mut self) -> impl Iterator<Item = Py<PyAny>> + use<> {
        std::mem::take(&mut self.older).into_iter().chain(self.last.take())
    }
}

/// A slot's buffers, beside its event (`Event::with`).
struct SlotRef<'a> {
    exports: &'a Arc<AtomicU32>,
    views: &'a mut Views,
}

/// What a batch holds. Field order matters: `slots` (the events) drop before `core` (the
/// attachment they borrow).
struct State {
    slots: Vec<Slot>,
    core: Option<Arc<Core>>,
    remote: bool,
}

impl State {
    fn slot(&self, id: u32) -> Option<&Slot> {
        match self.slots.get(id as usize) {
            Some(s) if s.id == id => Some(s),
            _ => self.slots.binary_search_by_key(&id, |s| s.id).ok().map(|i| &self.slots[i]),
        }
    }

    fn slot_mut(&mut self, id: u32) -> Option<&mut Slot> {
        let at = match self.slots.get(id as usize) {
            Some(s) if s.id == id => Some(id as usize),
            _ => self.slots.binary_search_by_key(&id, |s| s.id).ok(),
        };
        at.map(move |i| &mut self.slots[i])
    }

    /// Takes the slots `ids` (all if `None`) out, if none is gone or has buffers exported.
    fn take(&mut self, ids: Option<&[u32]>) -> PyResult<Vec<Slot>> {
        let wanted = |id: u32| ids.is_none_or(|ids| ids.contains(&id));
        if let Some(ids) = ids
            && let Some(id) = ids.iter().find(|&&id| self.slot(id).is_none())
        {
            return Err(EventReleasedError::new_err(format!("event {id} of its batch was put or dumped already")));
        }
        if let Some(s) = self.slots.iter().find(|s| wanted(s.id) && s.exports.load(Ordering::Relaxed) > 0) {
            return Err(BufferInUseError::new_err(format!(
                "event {} of the batch still has {} buffer(s) of its data in use (a numpy array, a memoryview slice or a \
                 memoryview(event)): delete them (or call .release() on memoryviews) before putting or dumping it",
                s.id,
                s.exports.load(Ordering::Relaxed)
            )));
        }
        let (out, keep): (Vec<Slot>, Vec<Slot>) =
            std::mem::take(&mut self.slots).into_iter().partition(|s| wanted(s.id));
        self.slots = keep;
        Ok(out)
    }

    fn release_core_if_empty(&mut self) {
        if self.slots.is_empty() {
            self.core = None;
        }
    }
}

/// A batch of events got or made by one call. It holds the events not yet put or dumped, in
/// order: `len()`, indexing and iteration give `Event`s. `lengths()` and `controls()` read
/// the whole batch at once (numpy arrays). Deleting a batch does not give its events back.
#[pyclass(frozen, name = "Batch", module = "daqflow.et")]
pub struct Batch {
    state: Mutex<State>,
}

impl Batch {
    fn make(py: Python<'_>, events: Vec<RustEvent<'static>>, core: Arc<Core>, remote: bool) -> PyResult<Py<Batch>> {
        let slots = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| Slot { id: i as u32, event: Some(e), exports: Arc::default(), views: Views::default() })
            .collect::<Vec<_>>();
        let core = if slots.is_empty() { None } else { Some(core) };
        Py::new(py, Batch { state: Mutex::new(State { slots, core, remote }) })
    }

    fn numpy_array<'py>(py: Python<'py>, store: super::Store, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
        let numpy = py.import("numpy").map_err(|e| {
            pyo3::exceptions::PyImportError::new_err(format!("this needs numpy ({e}): pip install numpy"))
        })?;
        let buffer = Bound::new(py, super::Buffer::new(store))?;
        numpy.call_method1("frombuffer", (buffer, dtype))
    }
}

#[pymethods]
impl Batch {
    /// The events not yet put or dumped.
    fn __len__(&self) -> usize {
        lock(&self.state).slots.len()
    }

    fn __getitem__(slf: &Bound<'_, Self>, i: isize) -> PyResult<Event> {
        let state = lock(&slf.get().state);
        let n = state.slots.len() as isize;
        let k = if i < 0 { i + n } else { i };
        if k < 0 || k >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err("batch index out of range"));
        }
        Ok(Event { batch: slf.clone().unbind(), id: state.slots[k as usize].id })
    }

    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let ids: Vec<u32> = lock(&slf.get().state).slots.iter().map(|s| s.id).collect();
        let mut list = Vec::with_capacity(ids.len());
        for id in ids {
            list.push(Bound::new(py, Event { batch: slf.clone().unbind(), id })?);
        }
        pyo3::types::PyList::new(py, list)?.try_iter().map(|i| i.into_any())
    }

    /// Each event's data length, as a numpy `uint32` array (a copy).
    fn lengths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v: Vec<u32> =
            lock(&self.state).slots.iter().map(|s| s.event.as_ref().map_or(0, |e| e.len() as u32)).collect();
        Batch::numpy_array(py, super::Store::U32(v), "uint32")
    }

    /// Each event's four control integers, as a numpy `int32` array of shape `(len, 4)` (a
    /// copy).
    fn controls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v: Vec<u32> = lock(&self.state)
            .slots
            .iter()
            .flat_map(|s| s.event.as_ref().map_or([0; 4], |e| e.control()).map(|c| c as u32))
            .collect();
        Batch::numpy_array(py, super::Store::U32(v), "int32")?.call_method1("reshape", ((-1i64, 4i64),))
    }

    /// The total of the events' data lengths.
    fn total_length(&self) -> usize {
        lock(&self.state).slots.iter().map(|s| s.event.as_ref().map_or(0, |e| e.len())).sum()
    }

    /// Sets the control integers of every event of the batch.
    fn set_control(&self, control: [i32; 4]) {
        for s in lock(&self.state).slots.iter_mut() {
            if let Some(e) = s.event.as_mut() {
                e.set_control(control);
            }
        }
    }

    /// Sets the priority of every event of the batch.
    fn set_priority(&self, priority: Priority) {
        for s in lock(&self.state).slots.iter_mut() {
            if let Some(e) = s.event.as_mut() {
                e.set_priority(priority.into());
            }
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never block in the collector: a batch in use right now is simply not traversed.
        if let Ok(state) = self.state.try_lock() {
            for s in &state.slots {
                for v in s.views.iter() {
                    visit.call(v)?;
                }
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let views: Vec<Py<PyAny>> = match self.state.try_lock() {
            Ok(mut state) => state.slots.iter_mut().flat_map(|s| s.views.take()).collect(),
            Err(_) => Vec::new(),
        };
        drop(views);
    }

    fn __repr__(&self) -> String {
        let state = lock(&self.state);
        format!("<daqflow.et.Batch of {} events>", state.slots.len())
    }
}

/// One event of a batch: its data (`data`, a writable memoryview; `write`, `tobytes`), length,
/// control integers and priority. It can be used until it is put or dumped; after that every
/// use raises `EventReleasedError`.
#[pyclass(frozen, name = "Event", module = "daqflow.et")]
pub struct Event {
    batch: Py<Batch>,
    id: u32,
}

impl Event {
    /// Runs `f` on the event, its slot's buffers and whether it is remote, under the batch's
    /// lock; `EventReleasedError` if it was put or dumped.
    fn with<R>(&self, f: impl FnOnce(&mut RustEvent<'static>, SlotRef<'_>, bool) -> PyResult<R>) -> PyResult<R> {
        let mut state = lock(&self.batch.get().state);
        let remote = state.remote;
        match state.slot_mut(self.id) {
            Some(Slot { event: Some(event), exports, views, .. }) => f(event, SlotRef { exports, views }, remote),
            _ => Err(self.gone()),
        }
    }

    fn gone(&self) -> PyErr {
        EventReleasedError::new_err(format!(
            "event {} of its batch was put or dumped: it is no longer this process's",
            self.id
        ))
    }
}

#[pymethods]
impl Event {
    /// The event's index in the ET system's pool.
    #[getter]
    fn index(&self) -> PyResult<u32> {
        self.with(|e, _, _| Ok(e.index()))
    }

    /// The length of its data in bytes; setting it (up to `capacity`) keeps the bytes.
    #[getter]
    fn get_length(&self) -> PyResult<usize> {
        self.with(|e, _, _| Ok(e.len()))
    }

    #[setter]
    fn set_length(&self, n: usize) -> PyResult<()> {
        self.with(|e, _, _| e.set_len(n).map_err(et_error))
    }

    fn __len__(&self) -> PyResult<usize> {
        self.get_length()
    }

    /// The most data it can hold.
    #[getter]
    fn capacity(&self) -> PyResult<usize> {
        self.with(|e, _, _| Ok(e.capacity()))
    }

    /// The four control integers, a tuple; set it with any sequence of four ints.
    #[getter]
    fn get_control(&self) -> PyResult<(i32, i32, i32, i32)> {
        self.with(|e, _, _| {
            let [a, b, c, d] = e.control();
            Ok((a, b, c, d))
        })
    }

    #[setter]
    fn set_control(&self, control: [i32; 4]) -> PyResult<()> {
        self.with(|e, _, _| {
            e.set_control(control);
            Ok(())
        })
    }

    /// `Priority.LOW` (the default) or `Priority.HIGH`.
    #[getter]
    fn get_priority(&self) -> PyResult<Priority> {
        self.with(|e, _, _| Ok(e.priority().into()))
    }

    #[setter]
    fn set_priority(&self, priority: Priority) -> PyResult<()> {
        self.with(|e, _, _| {
            e.set_priority(priority.into());
            Ok(())
        })
    }

    /// Whether the event was taken back from an attachment that died holding it: its data
    /// may be half written.
    #[getter]
    fn possibly_corrupt(&self) -> PyResult<bool> {
        self.with(|e, _, _| Ok(e.is_possibly_corrupt()))
    }

    /// Whether it is a large event (a temporary buffer larger than the pool's event size).
    #[getter]
    fn is_large(&self) -> PyResult<bool> {
        self.with(|e, _, _| Ok(e.is_large()))
    }

    /// Its data (`length` bytes) as a writable memoryview, without a copy: the shared memory
    /// itself for a local attachment; for a remote one the event's own copy, sent back at
    /// put. Released when the event is put or dumped (using it then raises `ValueError`).
    #[getter]
    fn data<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let (len, cached) = this.with(|e, s, _| Ok((e.len(), s.views.last().map(|v| v.clone_ref(slf.py())))))?;
        if let Some(v) = cached {
            let v = v.into_bound(slf.py());
            if v.len().is_ok_and(|n| n == len) {
                return Ok(v);
            }
        }
        let view = PyMemoryView::from(slf.as_any())?.into_any();
        this.with(|_, s, _| {
            s.views.push(view.clone().unbind());
            Ok(())
        })?;
        Ok(view)
    }

    /// Copies `data` (bytes or any buffer) into the event and sets its length.
    fn write(&self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(b) = data.cast::<PyBytes>() {
            return self.with(|e, s, remote| write_bytes(e, s, remote, b.as_bytes()));
        }
        // Got before locking: the source may be this batch's own event (its buffer protocol
        // locks the batch), so it is copied out first.
        let bytes = PyBuffer::<u8>::get(data)?.to_vec(data.py())?;
        self.with(|e, s, remote| write_bytes(e, s, remote, &bytes))
    }

    /// A copy of its data as `bytes`.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.with(|e, _, _| Ok(PyBytes::new(py, e.data())))
    }

    /// Whether the event was put or dumped (then it can no longer be used).
    #[getter]
    fn released(&self) -> bool {
        lock(&self.batch.get().state).slot(self.id).is_none()
    }

    /// # Safety
    ///
    /// Called by Python with a valid `view`. The pointer lent stays valid while the view is
    /// exported: the view holds this `Event` (`view.obj`), which holds its batch, which holds
    /// the event and its attachment; and the event cannot leave the batch (put or dump) while
    /// its export count is above zero.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no Py_buffer to fill"));
        }
        let (ptr, len, exports) = slf.get().with(|e, s, _| {
            let len = e.len();
            let ptr = e.buffer_mut()[..len].as_mut_ptr();
            s.exports.fetch_add(1, Ordering::Relaxed);
            Ok((ptr, len, s.exports.clone()))
        })?;
        // SAFETY: `view` is a valid, writable `Py_buffer` (checked non-null; Python passes
        // one); `ptr` points to `len` bytes that stay valid while the view is exported (above);
        // the format is a static string.
        unsafe {
            (*view).buf = ptr.cast();
            (*view).len = len as isize;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            // Shape and strides live in a box of their own (consumers may copy the
            // `Py_buffer` and keep its pointers), with the export count to decrement; freed
            // by `__releasebuffer__` through `internal`.
            let export: *mut Export = Box::into_raw(Box::new(Export { dims: [len as isize, 1], exports }));
            let dims_ptr = (&raw mut (*export).dims).cast::<isize>();
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { dims_ptr } else { std::ptr::null_mut() };
            (*view).strides =
                if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { dims_ptr.add(1) } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = export.cast();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    /// # Safety
    ///
    /// Called by Python once per view `__getbuffer__` filled, with that view (or a copy of
    /// it): its `internal` is the [`Export`] made there. It takes no lock: Python may release
    /// a view while this thread holds the batch's lock (a collection run by an allocation).
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `view` is a view `__getbuffer__` filled (above), whose `internal` is a
        // `Box<Export>` made there and freed only here, once.
        unsafe {
            if !view.is_null() && !(*view).internal.is_null() {
                let export = Box::from_raw((*view).internal.cast::<Export>());
                (*view).internal = std::ptr::null_mut();
                export.exports.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.batch)
    }

    fn __repr__(&self) -> String {
        match self.with(|e, _, _| Ok((e.index(), e.len(), e.control()))) {
            Ok((index, len, control)) => {
                format!("<daqflow.et.Event index {index}, {len} bytes, control {control:?}>")
            }
            Err(_) => "<daqflow.et.Event (put or dumped)>".to_owned(),
        }
    }
}

/// What a buffer lent by `Event.__getbuffer__` points to besides the data (`Py_buffer.internal`).
struct Export {
    /// The view's shape and strides: `[length, 1]`.
    dims: [isize; 2],
    /// The event's export count.
    exports: Arc<AtomicU32>,
}

/// Copies `data` into an event. A remote event whose buffer is exported is written in place
/// (its buffer, already as large as its capacity, never moves while exported).
fn write_bytes(e: &mut RustEvent<'static>, s: SlotRef<'_>, remote: bool, data: &[u8]) -> PyResult<()> {
    if remote && s.exports.load(Ordering::Relaxed) > 0 {
        if data.len() > e.capacity() {
            return Err(RefusedError::new_err(format!(
                "{} bytes exceed the event's capacity {}",
                data.len(),
                e.capacity()
            )));
        }
        e.buffer_mut()[..data.len()].copy_from_slice(data);
        return e.set_len(data.len()).map_err(et_error);
    }
    e.write(data).map_err(et_error)
}

/// Registers the ET classes, functions and exceptions in `daqflow._native` (`Et…` names;
/// `daqflow.et` gives them their Python names).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("EtSystem", py.get_type::<System>())?;
    m.add("EtClient", py.get_type::<Client>())?;
    m.add("EtAttachment", py.get_type::<Attachment>())?;
    m.add("EtBatch", py.get_type::<Batch>())?;
    m.add("EtEvent", py.get_type::<Event>())?;
    m.add("EtSelection", py.get_type::<Selection>())?;
    m.add("EtPriority", py.get_type::<Priority>())?;
    m.add_function(wrap_pyfunction!(et_connect, m)?)?;
    m.add_function(wrap_pyfunction!(et_connect_remote, m)?)?;
    m.add_function(wrap_pyfunction!(et_discover, m)?)?;
    m.add("EtError", py.get_type::<EtError>())?;
    m.add("EtNotFoundError", py.get_type::<NotFoundError>())?;
    m.add("EtNameTakenError", py.get_type::<NameTakenError>())?;
    m.add("EtSystemDeadError", py.get_type::<SystemDeadError>())?;
    m.add("EtAttachmentDeadError", py.get_type::<AttachmentDeadError>())?;
    m.add("EtNoSuchStationError", py.get_type::<NoSuchStationError>())?;
    m.add("EtStationExistsError", py.get_type::<StationExistsError>())?;
    m.add("EtRefusedError", py.get_type::<RefusedError>())?;
    m.add("EtTimedOutError", py.get_type::<TimedOutError>())?;
    m.add("EtNotOwnedError", py.get_type::<NotOwnedError>())?;
    m.add("EtOverLimitError", py.get_type::<OverLimitError>())?;
    m.add("EtAccessDeniedError", py.get_type::<AccessDeniedError>())?;
    m.add("EtEventReleasedError", py.get_type::<EventReleasedError>())?;
    m.add("EtBufferInUseError", py.get_type::<BufferInUseError>())?;
    Ok(())
}
