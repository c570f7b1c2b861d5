//! The control plane from Python: `daqflow.dialog` (see `docs/python.md`, "Control plane").
//!
//! A thin layer over the synchronous [`daqflow_dialog::Dialog`]: a Python program joins the
//! control plane under a name, provides services and publishes their values, subscribes to
//! services (a callback, or a queue it iterates over), registers commands and sends them.
//!
//! ```python
//! from daqflow import dialog
//! with dialog.connect("monitor", control="127.0.0.1:7000") as d:
//!     for msg in d.subscribe("ru-1/state"):
//!         print(msg.json()["state"])
//! ```
//!
//! Where Python runs:
//!
//! - Every blocking call (joining, `provide`, `update`, `send_command`, waiting on a
//!   subscription's queue, `close`) releases the GIL.
//! - Service callbacks run on the client's runtime threads, command callbacks on its command
//!   thread, each with the GIL taken ([`Gate::call`]); an exception a callback raises is logged
//!   (logger `daqflow.dialog`) and the callback stays.
//! - A callback may call back into its `Dialog` (publish, send a command, subscribe, even
//!   `close` it). After `close()` returns no callback of the dialog runs any more.
//!
//! Handles (services, subscriptions, command registrations) live as long as the `Dialog` unless
//! closed: a Python program does not have to keep them to keep a subscription going.

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_dialog::{
    CommandInfo, CommandMessage, CommandRegistration as RustRegistration, Dialog as RustDialog, DialogConfig,
    DialogError as Failure, ProcessInfo, Service as RustService, ServiceEvent, ServiceOptions,
    Subscription as RustSubscription, Token, WhenFull, parse_control_addrs,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyStopIteration, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use crate::Error;

create_exception!(
    daqflow.dialog,
    DialogError,
    Error,
    "An operation on the control plane failed; the message says what and why."
);
create_exception!(
    daqflow.dialog,
    ControlServerUnavailableError,
    DialogError,
    "No control server answered in time, or it refused this process (a wrong or missing token, a name taken): the message gives the reason."
);
create_exception!(
    daqflow.dialog,
    ServiceTakenError,
    DialogError,
    "Another live process provides the service (the message names it and its address); nothing was registered."
);
create_exception!(
    daqflow.dialog,
    ServiceRevokedError,
    DialogError,
    "This process no longer provides the service: another process registered it while the control server was away."
);
create_exception!(
    daqflow.dialog,
    InvalidNameError,
    DialogError,
    "A process, service or command name is invalid (1 to 200 ASCII letters, digits or - _ . : / @ +), or reserved (dialog/...)."
);
create_exception!(
    daqflow.dialog,
    TokenError,
    DialogError,
    "The system token could not be read: a missing file, a file other users may read, or a malformed token."
);
create_exception!(
    daqflow.dialog,
    DialogClosedError,
    DialogError,
    "The dialog (or the service, subscription or registration) was closed."
);

/// A [`Failure`] of the Rust client as a Python exception, with its message.
fn dialog_error(e: Failure) -> PyErr {
    let message = e.to_string();
    match e {
        Failure::ServiceTaken { .. } => ServiceTakenError::new_err(message),
        Failure::ServiceRevoked { .. } => ServiceRevokedError::new_err(message),
        Failure::ControlServerUnavailable { .. } | Failure::ControlServerLost | Failure::Refused(_) => {
            ControlServerUnavailableError::new_err(message)
        }
        Failure::InvalidName(_) | Failure::Reserved(_) => InvalidNameError::new_err(message),
        Failure::Shutdown => DialogClosedError::new_err(message),
        _ => DialogError::new_err(message),
    }
}

fn closed(what: &str) -> PyErr {
    DialogClosedError::new_err(format!("{what} is closed"))
}

use daqflow_component::sync::lock;

/// The bytes of `data`: `bytes`, `str` (as UTF-8) or any object with a byte buffer
/// (`bytearray`, `memoryview`, a numpy `uint8` array).
fn payload(data: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    if let Ok(s) = data.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(s.to_str()?.as_bytes()));
    }
    match PyBuffer::<u8>::get(data) {
        Ok(buffer) => Ok(Bytes::from(buffer.to_vec(data.py())?)),
        Err(_) => {
            Err(PyTypeError::new_err(format!("expected bytes, str or a byte buffer, not {}", data.get_type().name()?)))
        }
    }
}

/// `obj` as compact JSON bytes (Python's `json.dumps`).
fn json_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("separators", (",", ":"))?;
    let text = py.import("json")?.call_method("dumps", (obj,), Some(&kwargs))?;
    Ok(Bytes::copy_from_slice(text.cast::<PyString>()?.to_str()?.as_bytes()))
}

/// `data` parsed as JSON (Python's `json.loads`).
fn json_value<'py>(data: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyAny>> {
    data.py().import("json")?.call_method1("loads", (data,))
}

/// `data` as text (UTF-8, undecodable bytes replaced).
fn text(data: &Bound<'_, PyBytes>) -> String {
    String::from_utf8_lossy(data.as_bytes()).into_owned()
}

/// Seconds from Python as a [`Duration`]; `None` is "for ever".
fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(PyValueError::new_err(format!("timeout must be a number of seconds ≥ 0, not {t}"))),
    }
}

/// How long blocking waits release the GIL at a time before looking for signals (Ctrl-C).
const SLICE: Duration = Duration::from_millis(100);

/// Waits, the GIL released, for `done` to say yes, at most `timeout` (`None`: for ever),
/// looking for signals (Ctrl-C raises `KeyboardInterrupt`) every [`SLICE`]. `done` gets the
/// longest it may wait this time.
fn wait_until(
    py: Python<'_>,
    timeout: Option<Duration>,
    done: impl Fn(Duration) -> bool + Send + Sync,
) -> PyResult<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let slice = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        };
        if py.detach(|| done(slice)) {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        py.check_signals()?;
    }
}

thread_local! {
    /// How many dialog callbacks this thread is running (a callback may close its dialog).
    static IN_CALLBACK: Cell<usize> = const { Cell::new(0) };
}

/// What the callbacks of one dialog share with it: whether it is closed, and how many
/// callbacks run now, so that `close()` returns only once none runs.
#[derive(Default)]
struct Gate {
    closed: AtomicBool,
    /// Callbacks running now.
    running: Mutex<usize>,
    idle: Condvar,
    /// The queues of the subscriptions without a callback: closed with the dialog, which ends
    /// their iterators.
    inboxes: Mutex<Vec<Weak<Inbox>>>,
}

impl Gate {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs `f` with the GIL taken unless the dialog is closed (or Python is shutting down).
    fn call(&self, f: impl FnOnce(Python<'_>)) {
        Python::try_attach(|py| {
            {
                let mut running = lock(&self.running);
                if self.is_closed() {
                    return;
                }
                *running += 1;
            }
            IN_CALLBACK.with(|c| c.set(c.get() + 1));
            // Undone however `f` ends.
            struct Done<'a>(&'a Gate);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    IN_CALLBACK.with(|c| c.set(c.get().saturating_sub(1)));
                    *lock(&self.0.running) -= 1;
                    self.0.idle.notify_all();
                }
            }
            let _done = Done(self);
            f(py);
        });
    }

    /// Marks the dialog closed, ends the iterators of its subscriptions, and waits (the GIL
    /// released) until no callback runs but the caller's own, at most `patience`.
    fn close(&self, py: Python<'_>, patience: Duration) {
        let own = IN_CALLBACK.with(Cell::get);
        {
            let _running = lock(&self.running);
            self.closed.store(true, Ordering::Release);
        }
        for inbox in lock(&self.inboxes).drain(..) {
            if let Some(inbox) = inbox.upgrade() {
                inbox.close();
            }
        }
        py.detach(|| {
            let running = lock(&self.running);
            let _ = self.idle.wait_timeout_while(running, patience, |n| *n > own);
        });
    }
}

/// Logs an exception a callback raised (logger `daqflow.dialog`, with its traceback); the
/// callback stays registered.
fn report(py: Python<'_>, err: PyErr, what: &str) {
    let logged = (|| -> PyResult<()> {
        let logger = py.import("logging")?.call_method1("getLogger", ("daqflow.dialog",))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("exc_info", err.value(py))?;
        logger.call_method("error", ("%s raised an exception", what), Some(&kwargs))?;
        Ok(())
    })();
    if let Err(e) = logged {
        e.write_unraisable(py, None);
        err.write_unraisable(py, None);
    }
}

/// A subscription's message before it becomes a Python [`Message`].
struct Received {
    data: Bytes,
    seq: u64,
    initial: bool,
    provider: Option<String>,
    /// `Some(cause)` for the loss of the provider.
    lost: Option<String>,
}

impl Received {
    fn from_event(event: ServiceEvent, provider: impl FnOnce() -> Option<String>) -> Option<Received> {
        match event {
            ServiceEvent::Update { data, seq, initial } => {
                Some(Received { data, seq, initial, provider: provider(), lost: None })
            }
            ServiceEvent::Lost { provider, cause } => Some(Received {
                data: Bytes::new(),
                seq: 0,
                initial: false,
                provider: Some(provider),
                lost: Some(cause.to_string()),
            }),
            _ => None,
        }
    }

    fn into_message(self, py: Python<'_>, service: &str) -> Message {
        Message {
            service: service.to_owned(),
            data: PyBytes::new(py, &self.data).unbind(),
            seq: self.seq,
            initial: self.initial,
            provider: self.provider,
            lost: self.lost.is_some(),
            cause: self.lost,
        }
    }
}

/// The queue of a subscription without a callback.
struct Inbox {
    state: Mutex<InboxState>,
    ready: Condvar,
}

struct InboxState {
    items: VecDeque<Received>,
    /// Most messages kept; the oldest is dropped for a new one past it.
    maxsize: Option<usize>,
    dropped: u64,
    closed: bool,
}

impl Inbox {
    fn new(maxsize: Option<usize>) -> Inbox {
        Inbox {
            state: Mutex::new(InboxState { items: VecDeque::new(), maxsize, dropped: 0, closed: false }),
            ready: Condvar::new(),
        }
    }

    fn push(&self, item: Received) {
        let mut st = lock(&self.state);
        if st.closed {
            return;
        }
        st.items.push_back(item);
        if st.maxsize.is_some_and(|m| st.items.len() > m) {
            st.items.pop_front();
            st.dropped += 1;
        }
        self.ready.notify_all();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
    }

    /// The next message, waiting at most `wait`; `Err(())` once closed and empty.
    fn pop(&self, wait: Duration) -> Result<Option<Received>, ()> {
        let st = lock(&self.state);
        let (mut st, _) = self
            .ready
            .wait_timeout_while(st, wait, |s| s.items.is_empty() && !s.closed)
            .unwrap_or_else(|p| p.into_inner());
        match st.items.pop_front() {
            Some(item) => Ok(Some(item)),
            None if st.closed => Err(()),
            None => Ok(None),
        }
    }
}

/// What a [`Subscription`] shares with its handler and its dialog.
struct SubShared {
    sub: Arc<Mutex<Option<RustSubscription>>>,
    inbox: Option<Arc<Inbox>>,
}

impl SubShared {
    fn close(&self) {
        let sub = lock(&self.sub).take();
        drop(sub);
        if let Some(inbox) = &self.inbox {
            inbox.close();
        }
    }

    fn provider(&self) -> Option<String> {
        lock(&self.sub).as_ref().and_then(RustSubscription::provider)
    }
}

/// The handles a dialog keeps alive until they or it are closed.
#[derive(Default)]
struct Handles {
    services: Vec<Arc<Mutex<Option<RustService>>>>,
    subscriptions: Vec<Arc<SubShared>>,
    commands: Vec<Arc<Mutex<Option<RustRegistration>>>>,
}

impl Handles {
    /// Forgets the handles closed by their owners.
    fn prune(&mut self) {
        self.services.retain(|s| lock(s).is_some());
        self.subscriptions.retain(|s| lock(&s.sub).is_some());
        self.commands.retain(|c| lock(c).is_some());
    }
}

/// A process on the control plane; see `daqflow.dialog.connect`.
#[pyclass(frozen, weakref, module = "daqflow.dialog", name = "Dialog")]
pub struct PyDialog {
    dialog: Mutex<Option<Arc<RustDialog>>>,
    gate: Arc<Gate>,
    handles: Mutex<Handles>,
    name: String,
    control: Vec<String>,
    listen_addr: String,
}

impl PyDialog {
    /// The Rust dialog, unless closed.
    fn dialog(&self) -> PyResult<Held> {
        match &*lock(&self.dialog) {
            Some(d) if !self.gate.is_closed() => Ok(Held(Some(Arc::clone(d)))),
            _ => Err(closed(&format!("dialog `{}`", self.name))),
        }
    }

    /// Waits for a control server at most `timeout`; raises `ControlServerUnavailableError`
    /// with the reason (a wrong token, a refusal, the last connection error) if none answers.
    fn ensure_connected(&self, py: Python<'_>, dialog: &RustDialog, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        let d = dialog;
        if wait_until(py, timeout, move |slice| d.wait_connected(slice))? {
            return Ok(());
        }
        let problem = dialog.client().connection_problem().unwrap_or_else(|| "no answer".into());
        let waited = timeout.map_or_else(String::new, |t| format!(" within {} s", t.as_secs_f64()));
        Err(ControlServerUnavailableError::new_err(format!(
            "process `{}` could not reach a control server at {}{waited}: {problem}",
            self.name,
            self.control.join(",")
        )))
    }

    fn keep<T>(&self, add: impl FnOnce(&mut Handles) -> T) -> T {
        let mut handles = lock(&self.handles);
        handles.prune();
        add(&mut handles)
    }

    /// Takes everything out (the GIL held): what [`PyDialog::close`] and `Drop` then let go.
    fn take_all(&self) -> (Option<Held>, Handles) {
        let dialog = lock(&self.dialog).take().map(|d| Held(Some(d)));
        let handles = std::mem::take(&mut *lock(&self.handles));
        for s in &handles.subscriptions {
            if let Some(inbox) = &s.inbox {
                inbox.close();
            }
        }
        (dialog, handles)
    }
}

/// A reference to the Rust dialog that never stops it on one of its own threads: the last
/// reference, dropped in a callback (a thread of the client), is dropped on a new thread
/// (stopping the client's runtime from one of its threads would panic).
struct Held(Option<Arc<RustDialog>>);

impl std::ops::Deref for Held {
    type Target = RustDialog;
    fn deref(&self) -> &RustDialog {
        self.0.as_deref().unwrap_or_else(|| unreachable!("a Held is emptied only by its drop"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(last) = self.0.take().and_then(Arc::into_inner) else { return };
        if IN_CALLBACK.with(Cell::get) == 0 {
            drop(last);
        } else {
            let _ = std::thread::Builder::new().name("dialog-close".into()).spawn(move || drop(last));
        }
    }
}

/// Lets go of a dialog and its handles: leaves the control plane (the control server and the
/// peers are told), stops the client's threads. Blocks up to a few seconds; never with the GIL.
fn release(dialog: Option<Held>, handles: Handles) {
    for s in &handles.subscriptions {
        s.close();
    }
    // Leave as a process before the services go: their subscribers are told that the provider
    // disconnected (LOST_SENDER reason 3), not that each service was withdrawn one by one.
    if let Some(d) = &dialog {
        d.shutdown();
    }
    for s in &handles.services {
        lock(s).take();
    }
    drop(handles);
    drop(dialog);
}

#[pymethods]
impl PyDialog {
    /// The process name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The control server addresses: the primary, then the spares.
    #[getter]
    fn control(&self) -> Vec<String> {
        self.control.clone()
    }

    /// The control server this process is connected to now, or `None`.
    #[getter]
    fn control_server(&self) -> Option<String> {
        lock(&self.dialog).as_ref()?.client().control_server().map(|a| a.to_string())
    }

    /// Whether the process is connected to a control server now.
    #[getter]
    fn is_connected(&self) -> bool {
        !self.gate.is_closed() && lock(&self.dialog).as_ref().is_some_and(|d| d.is_connected())
    }

    /// Why no control server answers, while not connected (a wrong token, a refusal, the last
    /// connection error); `None` when connected.
    #[getter]
    fn connection_problem(&self) -> Option<String> {
        lock(&self.dialog).as_ref()?.client().connection_problem()
    }

    /// The address (`host:port`) where this process listens for its peers.
    #[getter]
    fn listen_addr(&self) -> &str {
        &self.listen_addr
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.gate.is_closed()
    }

    /// Waits until connected to a control server, at most `timeout` seconds (`None`: for
    /// ever); returns whether it is.
    #[pyo3(signature = (timeout = None))]
    fn wait_connected(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let d = self.dialog()?;
        wait_until(py, seconds(timeout)?, move |slice| d.wait_connected(slice))
    }

    /// Provides service `name` (unique in the system) and returns its `Service`; publishes
    /// `initial` at once unless it is `None`.
    #[pyo3(signature = (name, initial = None, *, when_full = "block", timeout = Some(10.0)))]
    fn provide(
        &self,
        py: Python<'_>,
        name: &str,
        initial: Option<&Bound<'_, PyAny>>,
        when_full: &str,
        timeout: Option<f64>,
    ) -> PyResult<Service> {
        let when_full = match when_full {
            "block" => WhenFull::Block,
            "skip" => WhenFull::Fail,
            other => {
                return Err(PyValueError::new_err(format!("when_full must be \"block\" or \"skip\", not {other:?}")));
            }
        };
        let initial = initial.map(payload).transpose()?;
        let dialog = self.dialog()?;
        self.ensure_connected(py, &dialog, timeout)?;
        let service = py
            .detach(|| {
                let service = dialog.provide_with(name, ServiceOptions { when_full })?;
                if let Some(value) = initial {
                    service.update_bytes(value)?;
                }
                Ok(service)
            })
            .map_err(dialog_error)?;
        let service = Arc::new(Mutex::new(Some(service)));
        self.keep(|h| h.services.push(Arc::clone(&service)));
        Ok(Service { name: name.to_owned(), service, gate: Arc::clone(&self.gate) })
    }

    /// Subscribes to service `name`. With a `callback`, it is called with each `Message`;
    /// without one, the messages wait in the returned `Subscription` (iterate over it, or
    /// `get()`).
    #[pyo3(signature = (name, callback = None, *, maxsize = None, lost = true))]
    fn subscribe(
        &self,
        name: &str,
        callback: Option<Py<PyAny>>,
        maxsize: Option<usize>,
        lost: bool,
    ) -> PyResult<Subscription> {
        if maxsize == Some(0) {
            return Err(PyValueError::new_err("maxsize must be at least 1 (or None: no bound)"));
        }
        let dialog = self.dialog()?;
        // The handler looks the provider up through the subscription, which it must not keep
        // alive: it lives in the client's state, which the subscription's drop cleans.
        let slot: Arc<Mutex<Option<RustSubscription>>> = Arc::new(Mutex::new(None));
        let weak = Arc::downgrade(&slot);
        let provider = move || weak.upgrade().and_then(|s| lock(&s).as_ref().and_then(RustSubscription::provider));
        let wanted = move |event: &ServiceEvent| lost || !matches!(event, ServiceEvent::Lost { .. });
        let service = name.to_owned();
        let (inbox, handler): (_, Box<dyn FnMut(ServiceEvent) + Send>) = match callback {
            Some(callback) => {
                let gate = Arc::clone(&self.gate);
                let handler = move |event: ServiceEvent| {
                    if !wanted(&event) {
                        return;
                    }
                    let Some(received) = Received::from_event(event, &provider) else { return };
                    gate.call(|py| {
                        let result = Bound::new(py, received.into_message(py, &service))
                            .and_then(|m| callback.bind(py).call1((m,)).map(drop));
                        if let Err(e) = result {
                            report(py, e, &format!("the callback of subscription `{service}`"));
                        }
                    });
                };
                (None, Box::new(handler))
            }
            None => {
                let inbox = Arc::new(Inbox::new(maxsize));
                let queue = Arc::clone(&inbox);
                let handler = move |event: ServiceEvent| {
                    if wanted(&event)
                        && let Some(received) = Received::from_event(event, &provider)
                    {
                        queue.push(received);
                    }
                };
                (Some(inbox), Box::new(handler))
            }
        };
        let sub = dialog.subscribe(name, handler).map_err(dialog_error)?;
        *lock(&slot) = Some(sub);
        let shared = Arc::new(SubShared { sub: slot, inbox: inbox.clone() });
        if let Some(inbox) = &inbox {
            lock(&self.gate.inboxes).push(Arc::downgrade(inbox));
        }
        self.keep(|h| h.subscriptions.push(Arc::clone(&shared)));
        Ok(Subscription { name: name.to_owned(), shared, gate: Arc::clone(&self.gate) })
    }

    /// Accepts command `name`: `callback` is called with each `Command` sent to it, one at a
    /// time, in order. Returns a `CommandRegistration` (its `close()` stops accepting it).
    fn register_command(&self, name: &str, callback: Py<PyAny>) -> PyResult<CommandRegistration> {
        let dialog = self.dialog()?;
        let gate = Arc::clone(&self.gate);
        let what = format!("the callback of command `{name}`");
        let registration = dialog
            .register_command(name, move |cmd: CommandMessage| {
                gate.call(|py| {
                    let command =
                        Command { name: cmd.name, sender: cmd.from, data: PyBytes::new(py, &cmd.data).unbind() };
                    let result = Bound::new(py, command).and_then(|c| callback.bind(py).call1((c,)).map(drop));
                    if let Err(e) = result {
                        report(py, e, &what);
                    }
                });
            })
            .map_err(dialog_error)?;
        let registration = Arc::new(Mutex::new(Some(registration)));
        self.keep(|h| h.commands.push(Arc::clone(&registration)));
        Ok(CommandRegistration { name: name.to_owned(), registration, gate: Arc::clone(&self.gate) })
    }

    /// Sends command `name` with `data` to every process that registered it; returns how many
    /// processes that was (0: nobody registered it).
    #[pyo3(signature = (name, data = None))]
    fn send_command(&self, py: Python<'_>, name: &str, data: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
        let data = data.map(payload).transpose()?.unwrap_or_default();
        let dialog = self.dialog()?;
        py.detach(|| dialog.send_command(name, &data)).map_err(dialog_error)
    }

    /// `send_command(name, data)` with `obj` as JSON.
    fn send_json(&self, py: Python<'_>, name: &str, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
        let data = json_bytes(obj)?;
        let dialog = self.dialog()?;
        py.detach(|| dialog.send_command(name, &data)).map_err(dialog_error)
    }

    /// Waits until at least `registrants` processes registered command `name`, as the control
    /// server's directory (`dialog/commands`) says, at most `timeout` seconds; returns their
    /// names. A registration takes effect shortly after `register_command` returns: a sender
    /// that must reach a process that just registered waits for it with this.
    #[pyo3(signature = (name, registrants = 1, timeout = Some(10.0)))]
    fn wait_for_command(
        &self,
        py: Python<'_>,
        name: &str,
        registrants: usize,
        timeout: Option<f64>,
    ) -> PyResult<Vec<String>> {
        let dialog = self.dialog()?;
        watch_directory(py, &dialog, "dialog/commands", seconds(timeout)?, |data| {
            let commands: Vec<CommandInfo> =
                serde_json::from_slice(data).map_err(|e| directory_error("dialog/commands", e))?;
            Ok(commands
                .into_iter()
                .find(|c| c.name == name && c.registrants.len() >= registrants)
                .map(|c| c.registrants))
        })
    }

    /// The processes on the control plane, from the control server's `dialog/processes`: one
    /// dictionary each (`name`, `host`, `port`, `pid`, `start_time_ns`, `connected_ns`,
    /// `last_heartbeat_ns`, `provides`, `subscribes`, `commands`), waiting at most `timeout`
    /// seconds for the directory.
    #[pyo3(signature = (timeout = Some(10.0)))]
    fn processes<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let dialog = self.dialog()?;
        let data = watch_directory(py, &dialog, "dialog/processes", seconds(timeout)?, |data| {
            serde_json::from_slice::<Vec<ProcessInfo>>(data).map_err(|e| directory_error("dialog/processes", e))?;
            Ok(Some(PyBytes::new(py, data).unbind()))
        })?;
        json_value(data.bind(py))
    }

    /// Leaves the control plane: stops every service, subscription and command registration
    /// of this process and waits until no callback runs (but the caller's, when a callback
    /// closes its own dialog). Calling it again does nothing.
    fn close(&self, py: Python<'_>) {
        self.gate.close(py, Duration::from_secs(10));
        let (dialog, handles) = self.take_all();
        if IN_CALLBACK.with(Cell::get) > 0 {
            // The client cannot be stopped from one of its own threads: another thread does
            // it once the callback has returned.
            let spawned = std::thread::Builder::new()
                .name(format!("dialog-close-{}", self.name))
                .spawn(move || release(dialog, handles));
            if let Err(e) = spawned {
                warn(py, &format!("closing dialog `{}`: {e}", self.name));
            }
        } else {
            py.detach(move || release(dialog, handles));
        }
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.gate.is_closed() {
            "closed".to_owned()
        } else if self.is_connected() {
            format!("connected to {}", self.control_server().unwrap_or_default())
        } else {
            "not connected".to_owned()
        };
        format!("<daqflow.dialog.Dialog {:?} {state}>", self.name)
    }
}

/// A warning through Python's `warnings` (what is left when nothing else can report).
fn warn(py: Python<'_>, message: &str) {
    if let Err(e) = py.import("warnings").and_then(|w| w.call_method1("warn", (message,))) {
        e.write_unraisable(py, None);
    }
}

impl Drop for PyDialog {
    fn drop(&mut self) {
        // Garbage collected without close(): leave in the background, never blocking the
        // thread that holds the GIL (callbacks may be waiting for it).
        self.closed_by_drop();
    }
}

impl PyDialog {
    fn closed_by_drop(&self) {
        {
            let _running = lock(&self.gate.running);
            self.gate.closed.store(true, Ordering::Release);
        }
        let (dialog, handles) = self.take_all();
        if dialog.is_some() {
            let _ = std::thread::Builder::new()
                .name(format!("dialog-close-{}", self.name))
                .spawn(move || release(dialog, handles));
        }
    }
}

/// Joins the control plane as process `name`; see `daqflow.dialog.connect`, which gives the
/// defaults.
#[pyfunction]
#[pyo3(signature = (name, control, *, token = None, token_file = None, listen = None, timeout = Some(10.0)))]
pub fn dialog_connect(
    py: Python<'_>,
    name: &str,
    control: &str,
    token: Option<&str>,
    token_file: Option<PathBuf>,
    listen: Option<&str>,
    timeout: Option<f64>,
) -> PyResult<PyDialog> {
    let addrs = parse_control_addrs(control).map_err(dialog_error)?;
    let mut config = DialogConfig::new(name, addrs.clone());
    config.token = resolve_token(token, token_file)?;
    if let Some(listen) = listen {
        config.listen = listen.parse().map_err(|e| PyValueError::new_err(format!("listen address {listen:?}: {e}")))?;
    }
    let dialog = Held(Some(Arc::new(py.detach(|| RustDialog::start(config)).map_err(dialog_error)?)));
    let this = PyDialog {
        listen_addr: dialog.client().listen_addr().to_string(),
        dialog: Mutex::new(dialog.0.clone()),
        gate: Arc::new(Gate::default()),
        handles: Mutex::new(Handles::default()),
        name: name.to_owned(),
        control: addrs.iter().map(ToString::to_string).collect(),
    };
    let connected = if timeout == Some(0.0) { Ok(()) } else { this.ensure_connected(py, &dialog, timeout) };
    drop(dialog);
    if let Err(e) = connected {
        this.close(py);
        return Err(e);
    }
    Ok(this)
}

/// The environment variable with the system token file (as for the `daqflow` command).
const TOKEN_FILE_ENV: &str = "DAQFLOW_TOKEN_FILE";
/// The environment variable with the system token itself.
const TOKEN_ENV: &str = "DAQFLOW_TOKEN";

/// The system token as the `daqflow` command finds it: `token`, else `token_file`, else the
/// file `$DAQFLOW_TOKEN_FILE`, else `$DAQFLOW_TOKEN`, else none.
fn resolve_token(token: Option<&str>, token_file: Option<PathBuf>) -> PyResult<Option<Token>> {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
    match (token, token_file) {
        (Some(_), Some(_)) => Err(PyValueError::new_err("give token or token_file, not both")),
        (Some(text), None) => Token::new(text).map(Some).map_err(|e| TokenError::new_err(format!("token: {e}"))),
        (None, Some(path)) => Token::from_file(&path).map(Some).map_err(|e| TokenError::new_err(e.to_string())),
        (None, None) => {
            if let Some(path) = env(TOKEN_FILE_ENV) {
                Token::from_file(path.as_ref())
                    .map(Some)
                    .map_err(|e| TokenError::new_err(format!("{TOKEN_FILE_ENV}: {e}")))
            } else if let Some(text) = env(TOKEN_ENV) {
                Token::new(&text).map(Some).map_err(|e| TokenError::new_err(format!("{TOKEN_ENV}: {e}")))
            } else {
                Ok(None)
            }
        }
    }
}

/// A service this process provides; see `Dialog.provide`.
#[pyclass(frozen, module = "daqflow.dialog")]
pub struct Service {
    name: String,
    service: Arc<Mutex<Option<RustService>>>,
    gate: Arc<Gate>,
}

impl Service {
    fn publish(&self, py: Python<'_>, data: Bytes) -> PyResult<()> {
        if self.gate.is_closed() {
            return Err(closed(&format!("the dialog of service `{}`", self.name)));
        }
        let service = Arc::clone(&self.service);
        py.detach(move || match &*lock(&service) {
            Some(s) => s.update_bytes(data).map_err(dialog_error),
            None => Err(closed(&format!("service `{}`", self.name))),
        })
    }

    fn with<T: Default>(&self, f: impl FnOnce(&RustService) -> T) -> T {
        lock(&self.service).as_ref().map(f).unwrap_or_default()
    }
}

#[pymethods]
impl Service {
    /// The service name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Updates published so far (the `seq` of the last one).
    #[getter]
    fn seq(&self) -> u64 {
        self.with(RustService::seq)
    }

    /// Subscribers now.
    #[getter]
    fn subscriber_count(&self) -> usize {
        self.with(RustService::subscriber_count)
    }

    /// Updates skipped for subscribers that did not keep up (`when_full="skip"` only).
    #[getter]
    fn dropped(&self) -> u64 {
        self.with(RustService::dropped)
    }

    /// Whether `close()` was called (or the dialog closed).
    #[getter]
    fn closed(&self) -> bool {
        self.gate.is_closed() || lock(&self.service).is_none()
    }

    /// Publishes `data` (bytes, str as UTF-8, or a byte buffer) to every subscriber.
    fn update(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.publish(py, payload(data)?)
    }

    /// Publishes `obj` as JSON.
    fn update_json(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        self.publish(py, json_bytes(obj)?)
    }

    /// Stops providing the service (its subscribers are told it was withdrawn).
    fn close(&self) {
        let service = lock(&self.service).take();
        drop(service);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!("<daqflow.dialog.Service {:?} seq {} subscribers {}>", self.name, self.seq(), self.subscriber_count())
    }
}

/// A subscription to a service; see `Dialog.subscribe`.
#[pyclass(frozen, module = "daqflow.dialog")]
pub struct Subscription {
    name: String,
    shared: Arc<SubShared>,
    gate: Arc<Gate>,
}

impl Subscription {
    fn inbox(&self) -> PyResult<&Arc<Inbox>> {
        self.shared.inbox.as_ref().ok_or_else(|| {
            DialogError::new_err(format!(
                "subscription `{}` hands its messages to its callback: there is nothing to get",
                self.name
            ))
        })
    }

    /// The next message, at most `timeout` (`None`: for ever); `Ok(None)` when closed.
    fn next_message(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<Option<Message>> {
        let received = next_received(py, self.inbox()?, timeout, &self.name)?;
        Ok(received.map(|r| r.into_message(py, &self.name)))
    }
}

/// The next message of `inbox`, waiting at most `timeout` (`None`: for ever) with the GIL
/// released, looking for signals meanwhile; `Ok(None)` once the inbox is closed and empty,
/// `TimeoutError` (naming `service`) when nothing came in time.
fn next_received(
    py: Python<'_>,
    inbox: &Arc<Inbox>,
    timeout: Option<Duration>,
    service: &str,
) -> PyResult<Option<Received>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let slice = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        };
        match py.detach(|| inbox.pop(slice)) {
            Ok(Some(item)) => return Ok(Some(item)),
            Err(()) => return Ok(None),
            Ok(None) => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PyTimeoutError::new_err(format!(
                "no message of `{service}` within {} s",
                timeout.unwrap_or_default().as_secs_f64()
            )));
        }
        py.check_signals()?;
    }
}

/// Reads values of the control server's directory service `service` (`dialog/...`) until
/// `done` finds what it wants in one, at most `timeout`.
fn watch_directory<T>(
    py: Python<'_>,
    dialog: &RustDialog,
    service: &str,
    timeout: Option<Duration>,
    mut done: impl FnMut(&[u8]) -> PyResult<Option<T>>,
) -> PyResult<T> {
    let inbox = Arc::new(Inbox::new(Some(1)));
    let queue = Arc::clone(&inbox);
    let _sub = dialog
        .subscribe(service, move |event| {
            if let ServiceEvent::Update { data, seq, initial } = event {
                queue.push(Received { data, seq, initial, provider: None, lost: None });
            }
        })
        .map_err(dialog_error)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(value) = next_received(py, &inbox, left, service)? else {
            return Err(closed(&format!("the subscription to `{service}`")));
        };
        if let Some(found) = done(&value.data)? {
            return Ok(found);
        }
    }
}

fn directory_error(service: &str, e: serde_json::Error) -> PyErr {
    DialogError::new_err(format!("`{service}` from the control server does not read: {e}"))
}

#[pymethods]
impl Subscription {
    /// The service subscribed to.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The process providing the service now (`"control server"` for `dialog/...`), or `None`
    /// while nobody does.
    #[getter]
    fn provider(&self) -> Option<String> {
        self.shared.provider()
    }

    /// Messages waiting in the queue (0 with a callback).
    #[getter]
    fn pending(&self) -> usize {
        self.shared.inbox.as_ref().map_or(0, |i| lock(&i.state).items.len())
    }

    /// Messages dropped from a full queue (`maxsize`), oldest first.
    #[getter]
    fn dropped(&self) -> u64 {
        self.shared.inbox.as_ref().map_or(0, |i| lock(&i.state).dropped)
    }

    /// Whether `close()` was called (or the dialog closed).
    #[getter]
    fn closed(&self) -> bool {
        self.gate.is_closed() || lock(&self.shared.sub).is_none()
    }

    /// The next message, waiting at most `timeout` seconds (`None`: for ever). Raises
    /// `TimeoutError` when none came in time, `DialogClosedError` once the subscription is
    /// closed and its queue empty.
    #[pyo3(signature = (timeout = None))]
    fn get(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        self.next_message(py, seconds(timeout)?)?.ok_or_else(|| closed(&format!("subscription `{}`", self.name)))
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Message> {
        self.next_message(py, None)?.ok_or_else(|| PyStopIteration::new_err(()))
    }

    /// Ends the subscription; an iterator over it stops once it has handed out what was
    /// queued.
    fn close(&self) {
        self.shared.close();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let provider = self.provider().unwrap_or_else(|| "nobody yet".into());
        format!("<daqflow.dialog.Subscription {:?} provided by {provider}>", self.name)
    }
}

/// A value of a service (or the loss of its provider), as a subscription receives it.
#[pyclass(frozen, module = "daqflow.dialog", get_all)]
pub struct Message {
    /// The service.
    service: String,
    /// The value (empty for a loss).
    data: Py<PyBytes>,
    /// The provider's update counter: consecutive updates have consecutive numbers (0 for a
    /// loss).
    seq: u64,
    /// The value the service had when the subscription started (or moved to a new provider).
    initial: bool,
    /// The provider (for a loss: the one lost).
    provider: Option<String>,
    /// This message says the provider went away.
    lost: bool,
    /// Why it went away, for a loss.
    cause: Option<String>,
}

#[pymethods]
impl Message {
    /// The value parsed as JSON.
    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_value(self.data.bind(py))
    }

    /// The value as text (UTF-8).
    fn text(&self, py: Python<'_>) -> String {
        text(self.data.bind(py))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.data.bind(py).clone()
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.data.bind(py).as_bytes().len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let from = self.provider.as_deref().unwrap_or("?");
        if self.lost {
            format!(
                "<daqflow.dialog.Message {:?} lost {from}: {}>",
                self.service,
                self.cause.as_deref().unwrap_or_default()
            )
        } else {
            format!(
                "<daqflow.dialog.Message {:?} #{} from {from}{}, {} bytes>",
                self.service,
                self.seq,
                if self.initial { " (initial)" } else { "" },
                self.__len__(py)
            )
        }
    }
}

/// A command delivered to this process; see `Dialog.register_command`.
#[pyclass(frozen, module = "daqflow.dialog", get_all)]
pub struct Command {
    /// The command name.
    name: String,
    /// The process that sent it.
    sender: String,
    /// Its payload.
    data: Py<PyBytes>,
}

#[pymethods]
impl Command {
    /// The payload parsed as JSON.
    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_value(self.data.bind(py))
    }

    /// The payload as text (UTF-8).
    fn text(&self, py: Python<'_>) -> String {
        text(self.data.bind(py))
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.data.bind(py).clone()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<daqflow.dialog.Command {:?} from {:?}, {} bytes>",
            self.name,
            self.sender,
            self.data.bind(py).as_bytes().len()
        )
    }
}

/// A command this process accepts; see `Dialog.register_command`.
#[pyclass(frozen, module = "daqflow.dialog")]
pub struct CommandRegistration {
    name: String,
    registration: Arc<Mutex<Option<RustRegistration>>>,
    gate: Arc<Gate>,
}

#[pymethods]
impl CommandRegistration {
    /// The command name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether `close()` was called (or the dialog closed).
    #[getter]
    fn closed(&self) -> bool {
        self.gate.is_closed() || lock(&self.registration).is_none()
    }

    /// Stops accepting the command.
    fn close(&self) {
        let registration = lock(&self.registration).take();
        drop(registration);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!("<daqflow.dialog.CommandRegistration {:?}>", self.name)
    }
}

/// Adds the control plane's classes, exceptions and `dialog_connect` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(dialog_connect, m)?)?;
    m.add_class::<PyDialog>()?;
    m.add_class::<Service>()?;
    m.add_class::<Subscription>()?;
    m.add_class::<Message>()?;
    m.add_class::<Command>()?;
    m.add_class::<CommandRegistration>()?;
    m.add("DialogError", py.get_type::<DialogError>())?;
    m.add("ControlServerUnavailableError", py.get_type::<ControlServerUnavailableError>())?;
    m.add("ServiceTakenError", py.get_type::<ServiceTakenError>())?;
    m.add("ServiceRevokedError", py.get_type::<ServiceRevokedError>())?;
    m.add("InvalidNameError", py.get_type::<InvalidNameError>())?;
    m.add("TokenError", py.get_type::<TokenError>())?;
    m.add("DialogClosedError", py.get_type::<DialogClosedError>())?;
    Ok(())
}
