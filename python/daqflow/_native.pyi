"""Type stubs of daqflow's extension module (crates/python, built with PyO3)."""

import os
from typing import Any, Iterator, Optional, Tuple, Union

__version__: str
"""The version of daqflow the module was built from."""

class Error(Exception):
    """Base class of the errors daqflow raises about data."""

class FormatError(Error):
    """The file is not a daqflow data file: its file header is missing, damaged or of an
    unknown version."""

class CorruptDataError(Error):
    """A record of the file is damaged: its CRC does not match, it is not a daqflow event, or
    bytes between records are not records. The message says which record, at which offset."""

def open(path: Union[str, os.PathLike[str]]) -> File:
    """Opens the data file ``path``: a ``.daq`` file, or a ``.daq.part`` file whose writer
    stopped before closing it.

    Reads the file header and, if the file was closed, its trailer. Raises ``OSError``
    (``FileNotFoundError`` for a missing file) when the file cannot be read and
    ``FormatError`` when it is not a daqflow data file.
    """

def decode_event(data: Any, *, verify: bool = True, copy: bool = False) -> Event:
    """Decodes one built event (the ``DEVT`` record of docs/formats.md) from ``data``, any
    object with the buffer protocol holding exactly that event: an ``et.Event`` (or its
    ``data``), ``bytes``, a ``memoryview``, a numpy array. Returns the ``Event`` that
    ``daqflow.open()`` gives for the same bytes, with ``index`` and ``offset`` ``None``.

    With ``verify`` (the default) it walks every super-fragment and fragment first and raises
    ``CorruptDataError`` for a malformed event and for a fragment whose payload does not match
    its CRC32C, unless the event's header flags ``CRC_ERROR`` (2: the builder found it and
    delivered the event flagged; ``Fragment.crc_ok`` then says which). ``verify=False`` checks
    only the header (magic, version, length).

    Without ``copy`` nothing is copied: the event, its super-fragments, fragments and payload
    views keep a buffer of ``data`` until the last of them is gone. While they live an
    ``et.Event`` cannot be put or dumped (``et.BufferInUseError``), a ``bytearray`` cannot be
    resized, and writing into ``data`` changes what they read. ``copy=True`` copies the
    event's bytes once: the result then holds nothing of ``data``.
    """

class File:
    """A data file opened for reading. Iterating over it yields its events in file order.

    A file cut short (a writer that died: no trailer, a partial record at the end) is read up
    to its last whole event. A damaged record raises ``CorruptDataError`` while iterating;
    ``events(skip_damaged=True)`` skips damaged records instead. Record CRCs are checked as the
    records are read; fragment CRCs are checked by ``verify()`` (or ``Fragment.crc_ok``).
    """

    @property
    def path(self) -> str:
        """The path the file was opened with."""
    @property
    def run(self) -> int:
        """The run number in the file header."""
    @property
    def sequence(self) -> int:
        """The file's sequence number within its run (and stream), from 1."""
    @property
    def created_ns(self) -> int:
        """When the file was created, in ns since the Unix epoch."""
    @property
    def writer_version(self) -> str:
        """The version of the software that wrote the file, ``major.minor.patch``."""
    @property
    def size(self) -> int:
        """The file's size in bytes."""
    @property
    def complete(self) -> bool:
        """Whether the file was closed with an intact trailer."""
    @property
    def trailer_problem(self) -> Optional[str]:
        """Why the trailer was not used (the file was not closed, or the trailer is damaged);
        ``None`` for a complete file."""
    def __iter__(self) -> Events:
        """The events of the file, in file order; the same as ``events()``."""
    def events(self, skip_damaged: bool = False) -> Events:
        """The events of the file, in file order. With ``skip_damaged``, damaged records are
        skipped instead of raising ``CorruptDataError``."""
    def verify(self, deep: bool = True) -> VerifyReport:
        """Reads the whole file and checks every record CRC and, with ``deep``, the structure
        and every fragment CRC of each event (what ``daqflow inspect --verify`` does). Never
        raises for damage: it is in the report."""
    def arrays(self, skip_damaged: bool = False) -> Arrays:
        """Every fragment of the whole file as numpy arrays (the fast path): one row per
        fragment, and all payloads in one contiguous ``uint8`` array. Needs numpy (``ImportError``
        without it). Raises ``CorruptDataError`` on a damaged record unless ``skip_damaged``."""
    def batches(self, max_bytes: int = 16 << 20, payload: bool = True, skip_damaged: bool = False) -> Batches:
        """The events of the file in file order, as batches of numpy columns of about
        ``max_bytes`` each (an event larger than that makes a batch of its own): bounded memory
        for a file of any size. Each batch is read in Rust without the GIL. ``payload``: with the
        fragments' bytes. Needs numpy."""
    def to_arrow(self, payload: bool = False, skip_damaged: bool = False) -> Any:
        """The file's events as a ``pyarrow.Table``, one row per event with its fragments as a
        list (``daqflow.export.to_arrow``; docs/analysis-files.md). Needs pyarrow."""
    def to_awkward(self, payload: bool = False, skip_damaged: bool = False) -> Any:
        """The file's events as an ``awkward.Array`` of records, each with its list of fragment
        records (``daqflow.export.to_awkward``). Needs awkward."""

class Batches(Iterator[Batch]):
    """The batches of ``File.batches``."""

    def __iter__(self) -> Batches: ...
    def __next__(self) -> Batch: ...

class Batch:
    """Events of a file as read-only numpy columns: one value per event, then one per fragment
    (event ``i``'s fragments are ``fragment_start[i]`` to ``fragment_start[i + 1]``)."""

    events: int
    """Events in the batch."""
    run: Any
    """``uint32``: each event's run number."""
    event_id: Any
    """``uint64``: each event's id."""
    trigger_type: Any
    """``uint32``: each event's trigger type."""
    flags: Any
    """``uint32``: each event's flags."""
    bu_id: Any
    """``uint32``: the builder unit that built each event."""
    trigger_time: Any
    """``uint64``: the time stamp of each event's first fragment (0 without fragments)."""
    size: Any
    """``uint64``: each built event's size in bytes."""
    fragment_start: Any
    """``uint64``, ``events + 1`` entries: where each event's fragments start, then their number."""
    source_id: Any
    """``uint32``: each fragment's source."""
    fragment_size: Any
    """``uint32``: each fragment's payload size."""
    fragment_timestamp: Any
    """``uint64``: each fragment's time stamp."""
    fragment_flags: Any
    """``uint32``: each fragment's flags."""
    payload_start: Optional[Any]
    """``uint64``, fragments + 1 entries: where each fragment's bytes start in ``payload``
    (``None`` without payloads)."""
    payload: Optional[Any]
    """``uint8``: every payload back to back (``None`` without payloads)."""
    def __len__(self) -> int:
        """The number of events."""

class Events(Iterator[Event]):
    """An iterator over the events of a file, in file order."""

    def __iter__(self) -> Events: ...
    def __next__(self) -> Event: ...

class Event:
    """A built event: the builder unit's header and the super-fragments of every readout unit."""

    @property
    def id(self) -> int:
        """The event id."""
    @property
    def run(self) -> int:
        """The run number."""
    @property
    def flags(self) -> int:
        """Event flags: 1 incomplete, 2 CRC error, 4 truncated, 8 event-id mismatch."""
    @property
    def trigger_type(self) -> int:
        """The trigger type."""
    @property
    def bu_id(self) -> int:
        """The builder unit that built the event."""
    @property
    def index(self) -> Optional[int]:
        """The position of the event's record in the file, from 0; ``None`` for an event
        from ``decode_event``."""
    @property
    def offset(self) -> Optional[int]:
        """The file offset of the event's record; ``None`` for an event from
        ``decode_event``."""
    @property
    def data(self) -> memoryview:
        """The whole encoded event, read-only, without a copy (for an event from
        ``decode_event``: of the buffer it was decoded from, unless it copied)."""
    @property
    def super_fragments(self) -> list[SuperFragment]:
        """The super-fragments, one per readout unit. Raises ``CorruptDataError`` if the event
        is malformed."""
    @property
    def fragments(self) -> list[Fragment]:
        """The fragments of every super-fragment, in order."""
    def __len__(self) -> int:
        """The event's size in bytes."""

class SuperFragment:
    """A readout unit's fragments of one event."""

    @property
    def ru_id(self) -> int:
        """The readout unit that built it."""
    @property
    def event_id(self) -> int:
        """The event id in its header."""
    @property
    def flags(self) -> int:
        """Super-fragment flags: 1 incomplete, 2 CRC error."""
    @property
    def fragments(self) -> list[Fragment]:
        """Its fragments, in order."""
    def __len__(self) -> int:
        """The number of fragments."""

class Fragment:
    """One source's data of one event."""

    @property
    def source_id(self) -> int:
        """The source (front-end stream) that produced it."""
    @property
    def event_id(self) -> int:
        """The event id in its header."""
    @property
    def run(self) -> int:
        """The run number in its header."""
    @property
    def trigger_type(self) -> int:
        """The trigger type in its header."""
    @property
    def timestamp(self) -> int:
        """The trigger time stamp (ns since the Unix epoch, or a bunch-crossing counter)."""
    @property
    def flags(self) -> int:
        """Fragment flags: 1 truncated, 2 data error, 4 CRC error."""
    @property
    def crc_ok(self) -> bool:
        """Whether the payload matches its CRC32C (computed when asked)."""
    @property
    def payload(self) -> memoryview:
        """The payload, read-only, without a copy: a view of the bytes read from the file (or
        of the buffer ``decode_event`` decoded), usable by ``numpy.frombuffer``. It keeps the
        block it was read in (or that buffer) alive."""
    def __len__(self) -> int:
        """The payload's size in bytes."""

class VerifyReport:
    """What ``File.verify()`` found."""

    clean: bool
    """No damaged record, no garbage, not cut short, and closed properly."""
    records: int
    """Whole records found (good or not)."""
    payload_bytes: int
    """The sum of their payload lengths."""
    events_checked: int
    """Records checked fragment by fragment (with ``deep``)."""
    complete: bool
    """Whether the file was closed with an intact trailer."""
    cut_short: Optional[Tuple[int, int, int]]
    """``(offset, bytes present, bytes needed)`` of the partial record at the end of a file
    cut short, or ``None``."""
    problems: list[str]
    """Everything wrong, in file order, one message each."""
    def as_dict(self) -> dict[str, Any]:
        """The report as a dictionary (for JSON)."""

class Arrays:
    """The fragments of a whole file as numpy arrays, one row per fragment in file order."""

    events: int
    """Events read."""
    event_ids: Any
    """``uint64``: each fragment's event id."""
    source_ids: Any
    """``uint32``: each fragment's source id."""
    flags: Any
    """``uint32``: each fragment's flags."""
    sizes: Any
    """``uint32``: each fragment's payload size in bytes."""
    timestamps: Any
    """``uint64``: each fragment's time stamp."""
    offsets: Any
    """``uint64``: where each fragment's payload starts in ``payload``."""
    payload: Any
    """``uint8``: every payload, back to back (fragment ``i`` is
    ``payload[offsets[i]:offsets[i] + sizes[i]]``)."""
    def __len__(self) -> int:
        """The number of fragments."""

class Buffer:
    """Memory lent to Python without a copy, read-only, through the buffer protocol: the object
    behind every ``memoryview`` and array daqflow returns (``memoryview.obj``)."""

    def __len__(self) -> int:
        """Its size in bytes."""

# ---- Components and the source protocol (crates/python/src/component.rs) ----

class SourceStream:
    """One source's stream of fragments to a readout unit (the source protocol of
    docs/evb.md, "Writing a source"): event ids 1, 2, 3, … in the order of :meth:`send`. The
    connection proves the process's system token (``DAQFLOW_TOKEN_FILE``, or what
    :class:`daqflow.Component` was given)."""

    def __init__(self, ru: str, source_id: int, run: int, name: str = "python-source", timeout: float = 10.0) -> None:
        """Connects to the RU at ``ru`` (``host:port``), retrying for ``timeout`` seconds, and
        says hello as source ``source_id`` of run ``run``. Raises :class:`Error` when it
        cannot."""
    def send(self, payload: Any, trigger_type: int = 1, timestamp: Optional[int] = None) -> int:
        """Sends the next event's fragment (``payload``: any bytes-like object; ``bytes`` are
        sent from their own memory) with ``trigger_type`` and ``timestamp`` (ns since the Unix
        epoch; now by default). Returns its event id. Fragments are queued and written as the
        connection's chunks fill: call :meth:`flush` before waiting. Blocks (without the GIL)
        while the RU holds the stream back. An error ends the stream."""
    def flush(self) -> None:
        """Writes what is queued."""
    def end(self) -> int:
        """Sends the end frame with the last event id, writes everything and closes. Returns the
        last event id."""
    @property
    def next_event(self) -> int:
        """The id the next fragment gets."""
    @property
    def last_event(self) -> int:
        """The last event id sent (0 before the first); kept after the end."""
    @property
    def bytes(self) -> int:
        """Bytes sent in fragments: 48-byte headers, payloads, padding to 8 bytes."""
    @property
    def is_open(self) -> bool:
        """Whether the stream is open (not ended, no error)."""

def _run_component(
    factory: Any,
    *,
    kind: str,
    role: str,
    process: dict[str, Any],
    schema: Optional[str] = None,
) -> bool:
    """Runs a component as a daqflow component process (what :meth:`daqflow.Component.run`
    calls); returns whether it failed. ``process``: the command line, a dict with ``name``,
    ``config_file``, ``sets``, ``start``, ``control``, ``lease_s``, ``end_with_stdin``,
    ``operator``, ``incarnation`` (the launch its operator gave it, put in every
    ``NAME/state``). ``schema``: the class's parameters and outputs as JSON
    (:meth:`daqflow.Component._df_schema`), the kind's typed schema."""

def _run_port_component(
    factory: Any,
    *,
    kind: str,
    inputs: list[tuple[str, Optional[str]]],
    outputs: list[tuple[str, Optional[str]]],
    process: dict[str, Any],
    schema: Optional[str] = None,
) -> bool:
    """Runs a chain component with ports as a daqflow component process (what
    :meth:`daqflow.PortComponent.run` calls); returns whether it failed. ``inputs`` and
    ``outputs``: the class's ports as ``(name, data type or None)``; ``factory(name,
    config_json)`` makes the object from its own keys; ``process`` and ``schema`` as for
    :func:`_run_component`."""

class Outputs:
    """The ``out`` of :meth:`daqflow.PortComponent.on_chunk` and ``end``, lent for the call."""

    @property
    def names(self) -> list[str]:
        """The names of the output ports."""
    def send(self, port: str, data: Any) -> None:
        """Sends ``data`` (any bytes-like object) as the next chunk on output ``port``; waits
        while its queue is full (nothing is dropped). Raises after the hook returned."""

def _use_token(token_file: Optional[Union[str, os.PathLike[str]]] = None, token_stdin: bool = False) -> bool:
    """Sets the process's system token: from standard input's first line, ``token_file``,
    ``$DAQFLOW_TOKEN_FILE`` or ``$DAQFLOW_TOKEN``. Returns whether it has one."""

def _log(level: str, message: str) -> None:
    """Logs a line in the process's daqflow log."""
# ---------------------------------------------------------------------------------------------
# Control plane (DIALOG): crates/python/src/dialog.rs, re-exported by daqflow.dialog
# ---------------------------------------------------------------------------------------------

from typing import Callable, List

class DialogError(Error):
    """An operation on the control plane failed; the message says what and why."""

class ControlServerUnavailableError(DialogError):
    """No control server answered in time, or it refused this process (a wrong or missing
    token, a name taken): the message gives the reason."""

class ServiceTakenError(DialogError):
    """Another live process provides the service (the message names it and its address);
    nothing was registered."""

class ServiceRevokedError(DialogError):
    """This process no longer provides the service: another process registered it while the
    control server was away."""

class InvalidNameError(DialogError):
    """A process, service or command name is invalid (1 to 200 ASCII letters, digits or
    ``- _ . : / @ +``), or reserved (``dialog/...``)."""

class TokenError(DialogError):
    """The system token could not be read: a missing file, a file other users may read, or a
    malformed token."""

class DialogClosedError(DialogError):
    """The dialog (or the service, subscription or registration) was closed."""

def dialog_connect(
    name: str,
    control: str,
    *,
    token: Optional[str] = None,
    token_file: Optional[str] = None,
    listen: Optional[str] = None,
    timeout: Optional[float] = 10.0,
) -> Dialog:
    """Joins the control plane as process ``name`` with the control server(s) ``control``
    (``host:port[,host:port...]``); ``daqflow.dialog.connect`` gives the defaults and documents
    the arguments."""

class Dialog:
    """A process on the control plane (``daqflow.dialog.connect``). A context manager; ``close()``
    leaves the control plane."""

    @property
    def name(self) -> str:
        """The process name, unique in the system."""
    @property
    def control(self) -> List[str]:
        """The control server addresses: the primary, then the spares."""
    @property
    def control_server(self) -> Optional[str]:
        """The control server this process is connected to now, or ``None``."""
    @property
    def is_connected(self) -> bool:
        """Whether the process is connected to a control server now."""
    @property
    def connection_problem(self) -> Optional[str]:
        """Why no control server answers while not connected (a wrong token, a refusal, the last
        connection error); ``None`` when connected."""
    @property
    def listen_addr(self) -> str:
        """Where this process listens for its peers (``host:port``)."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def wait_connected(self, timeout: Optional[float] = None) -> bool:
        """Waits until connected to a control server, at most ``timeout`` seconds (``None``: for
        ever); returns whether it is."""
    def provide(
        self,
        name: str,
        initial: Union[bytes, str, Any, None] = None,
        *,
        when_full: str = "block",
        timeout: Optional[float] = 10.0,
    ) -> Service:
        """Provides service ``name`` (unique in the system) and publishes ``initial`` unless it is
        ``None``. Waits up to ``timeout`` seconds for a control server, then for its answer.

        ``when_full``: what an update does for a subscriber whose queue is full: ``"block"``
        waits for it (every subscriber gets every update), ``"skip"`` skips it for that
        subscriber (counted in ``Service.dropped``; for monitoring, so that a stuck subscriber
        never slows this process).

        Raises ``ServiceTakenError`` if another process provides it,
        ``ControlServerUnavailableError`` if no control server answered."""
    def subscribe(
        self,
        name: str,
        callback: Optional[Callable[[Message], Any]] = None,
        *,
        maxsize: Optional[int] = None,
        lost: bool = True,
    ) -> Subscription:
        """Subscribes to service ``name`` (one nobody provides yet is waited for): the current
        value first, then every update, and a ``lost`` message when the provider goes away.

        With ``callback``, it is called with each ``Message`` on the thread reading the
        provider's connection (with the GIL); an exception it raises is logged. Without, the
        messages wait in the returned ``Subscription``: iterate over it or ``get()``; with
        ``maxsize``, only the newest ``maxsize`` are kept. ``lost=False`` leaves out the
        messages about the provider going away. The subscription lasts until closed, or until
        the dialog is."""
    def register_command(self, name: str, callback: Callable[[Command], Any]) -> CommandRegistration:
        """Accepts command ``name`` (several processes may): ``callback`` is called with each
        ``Command``, one at a time in the order they came, on the dialog's command thread (with
        the GIL); an exception it raises is logged. Lasts until closed, or until the dialog is.
        The registration reaches the control server shortly after this returns (see
        ``wait_for_command``)."""
    def send_command(self, name: str, data: Union[bytes, str, Any, None] = None) -> int:
        """Sends command ``name`` with ``data`` (bytes, str as UTF-8, or a byte buffer) to every
        process that registered it; returns how many that was (0: nobody). Waits up to 5 s for
        a control server (then ``ControlServerUnavailableError``)."""
    def send_json(self, name: str, obj: Any) -> int:
        """``send_command`` with ``obj`` as JSON."""
    def wait_for_command(
        self, name: str, registrants: int = 1, timeout: Optional[float] = 10.0
    ) -> List[str]:
        """Waits until at least ``registrants`` processes registered command ``name``, as the
        control server's ``dialog/commands`` says, at most ``timeout`` seconds (then
        ``TimeoutError``); returns their names."""
    def processes(self, timeout: Optional[float] = 10.0) -> List[dict[str, Any]]:
        """The processes on the control plane (``dialog/processes``): ``name``, ``host``,
        ``port``, ``pid``, ``start_time_ns``, ``connected_ns``, ``last_heartbeat_ns``,
        ``provides``, ``subscribes``, ``commands``."""
    def close(self) -> None:
        """Leaves the control plane: ends every service, subscription and command registration
        of this process, and returns once no callback of it runs (but the caller's, when a
        callback closes its own dialog). Calling it again does nothing."""
    def __enter__(self) -> Dialog: ...
    def __exit__(self, *args: Any) -> bool: ...

class Service:
    """A service this process provides (``Dialog.provide``)."""

    @property
    def name(self) -> str:
        """The service name."""
    @property
    def seq(self) -> int:
        """Updates published so far (the ``seq`` of the last one)."""
    @property
    def subscriber_count(self) -> int:
        """Subscribers now."""
    @property
    def dropped(self) -> int:
        """Updates skipped for subscribers that did not keep up (``when_full="skip"``)."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (or the dialog closed)."""
    def update(self, data: Union[bytes, str, Any]) -> None:
        """Publishes ``data`` (bytes, str as UTF-8, or a byte buffer) to every subscriber, straight
        from this process. Waits for a subscriber whose queue is full unless the service was
        provided with ``when_full="skip"``. Raises ``ServiceRevokedError`` when another process
        took the service over while the control server was away."""
    def update_json(self, obj: Any) -> None:
        """Publishes ``obj`` as JSON."""
    def close(self) -> None:
        """Stops providing the service (its subscribers are told it was withdrawn)."""
    def __enter__(self) -> Service: ...
    def __exit__(self, *args: Any) -> bool: ...

class Subscription:
    """A subscription (``Dialog.subscribe``); without a callback, an iterator over its
    messages, each waited for."""

    @property
    def name(self) -> str:
        """The service subscribed to."""
    @property
    def provider(self) -> Optional[str]:
        """The process providing the service now (``"control server"`` for ``dialog/...``), or
        ``None`` while nobody does."""
    @property
    def pending(self) -> int:
        """Messages waiting in the queue."""
    @property
    def dropped(self) -> int:
        """Messages dropped from a full queue (``maxsize``), the oldest first."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (or the dialog closed)."""
    def get(self, timeout: Optional[float] = None) -> Message:
        """The next message, waiting at most ``timeout`` seconds (``None``: for ever). Raises
        ``TimeoutError`` when none came in time, ``DialogClosedError`` once the subscription is
        closed and its queue empty, ``DialogError`` for a subscription with a callback."""
    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message:
        """The next message, waited for; the iteration ends once the subscription is closed
        and its queue empty."""
    def close(self) -> None:
        """Ends the subscription."""
    def __enter__(self) -> Subscription: ...
    def __exit__(self, *args: Any) -> bool: ...

class Message:
    """A value of a service, or the loss of its provider (``lost``)."""

    service: str
    """The service."""
    data: bytes
    """The value (empty for a loss)."""
    seq: int
    """The provider's update counter: consecutive updates have consecutive numbers (0 for a
    loss)."""
    initial: bool
    """The value the service had when the subscription started (or moved to a new provider)."""
    provider: Optional[str]
    """The provider (for a loss: the one lost)."""
    lost: bool
    """This message says the provider went away; the subscription stays and resumes with the
    next provider."""
    cause: Optional[str]
    """Why it went away: ``"connection closed"``, ``"no heartbeat"``, ``"disconnected"``,
    ``"service withdrawn"`` or ``"unreachable"``."""
    def json(self) -> Any:
        """The value parsed as JSON."""
    def text(self) -> str:
        """The value as text (UTF-8)."""
    def __bytes__(self) -> bytes: ...
    def __len__(self) -> int:
        """The value's size in bytes."""

class Command:
    """A command delivered to this process (``Dialog.register_command``)."""

    name: str
    """The command name."""
    sender: str
    """The process that sent it."""
    data: bytes
    """Its payload."""
    def json(self) -> Any:
        """The payload parsed as JSON."""
    def text(self) -> str:
        """The payload as text (UTF-8)."""
    def __bytes__(self) -> bytes: ...

class CommandRegistration:
    """A command this process accepts (``Dialog.register_command``)."""

    @property
    def name(self) -> str:
        """The command name."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (or the dialog closed)."""
    def close(self) -> None:
        """Stops accepting the command."""
    def __enter__(self) -> CommandRegistration: ...
    def __exit__(self, *args: Any) -> bool: ...
# =============================================================================================
# ET: the Event Transfer system (crates/python/src/et.rs). `daqflow.et` re-exports these under
# their Python names (EtSystem -> daqflow.et.System, …); see docs/python.md, "ET".
# =============================================================================================

from typing import Callable, Iterable, Literal, Sequence

_Wait = Union[Literal["sleep", "async"], float, None]
_Select = Union["EtSelection", str, Sequence[Optional[int]], None]
_Control = Tuple[int, int, int, int]

class EtError(Error):
    """Base class of the errors of the ET system (``daqflow.et.EtError``)."""

class EtNotFoundError(EtError):
    """No ET system of that name runs on this machine (or answers at that address)."""

class EtNameTakenError(EtError):
    """An ET system of that name runs already."""

class EtSystemDeadError(EtError):
    """The ET system stopped or died: connect again when it is back."""

class EtAttachmentDeadError(EtError):
    """The ET system declared the attachment dead and took its events back: attach again."""

class EtNoSuchStationError(EtError):
    """No station of that name."""

class EtStationExistsError(EtError):
    """A station of that name exists already."""

class EtRefusedError(EtError):
    """The ET system refused the request (the message says why)."""

class EtTimedOutError(EtError):
    """No event came within the wait."""

class EtNotOwnedError(EtError):
    """Events were handed to an attachment that did not hand them out."""

class EtOverLimitError(EtError):
    """The request goes over one of the ET system's limits; nothing was taken."""

class EtAccessDeniedError(EtError):
    """The ET system does not accept local connections from this user."""

class EtEventReleasedError(EtError):
    """The event was put or dumped already: it is no longer this process's."""

class EtBufferInUseError(EtError):
    """Events cannot be put or dumped while buffers of their data are still exported (numpy
    arrays, memoryview slices, ``memoryview(event)``); nothing was handed back."""

class EtPriority:
    """An event's priority (``daqflow.et.Priority``): high-priority events go ahead of
    low-priority ones in every station's input list."""

    LOW: "EtPriority"
    """The default."""
    HIGH: "EtPriority"
    """Ahead of every low-priority event."""
    def __int__(self) -> int: ...

class EtSelection:
    """Which events a station selects (``daqflow.et.Selection``). ``str()`` gives the
    command-line form (``daqflow et consume --select``), which ``parse`` reads."""

    @staticmethod
    def all() -> EtSelection:
        """Every event (the default)."""
    @staticmethod
    def match(*control: Optional[int]) -> EtSelection:
        """Events whose control integers equal these (at most 4); ``None`` or a position left
        out is any value."""
    @staticmethod
    def range(index: int, lo: int, hi: int) -> EtSelection:
        """Events with ``lo <= control[index] <= hi`` (index 0 to 3)."""
    @staticmethod
    def mask_any(index: int, mask: int) -> EtSelection:
        """Events with any bit of ``mask`` set in ``control[index]``."""
    @staticmethod
    def mask_all(index: int, mask: int) -> EtSelection:
        """Events with every bit of ``mask`` set in ``control[index]``."""
    @staticmethod
    def high_priority() -> EtSelection:
        """High-priority events."""
    @staticmethod
    def parse(text: str) -> EtSelection:
        """Reads ``all``, ``match:A,B,C,D`` (``*`` for any), ``range:I:LO:HI``,
        ``mask-any:I:MASK``, ``mask-all:I:MASK`` or ``high``; ``ValueError`` otherwise."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class EtSystem:
    """An ET system created and owned by this process (``daqflow.et.System``); other
    processes attach to it by its name. ``close()`` or the end of a ``with`` block stops it."""

    def __init__(
        self,
        name: str,
        events: int,
        event_size: int,
        *,
        listen: Optional[str] = None,
        discovery_port: Optional[int] = None,
        max_stations: Optional[int] = None,
        max_attachments: Optional[int] = None,
        max_temp_events: Optional[int] = None,
        max_event_bytes: Optional[int] = None,
        max_temp_per_attachment: Optional[int] = None,
        max_temp_bytes: Optional[int] = None,
        max_attachments_per_connection: Optional[int] = None,
        allowed_uids: Optional[Sequence[int]] = None,
        heartbeat_timeout: Optional[float] = None,
    ) -> None:
        """Creates the ET system ``name``: a pool of ``events`` events of ``event_size`` bytes;
        ``listen="host:port"`` serves remote clients (port 0: any free port),
        ``discovery_port`` answers discovery by name; the other keywords are the limits of
        ``SystemConfig`` (docs/et.md, "Defaults"). ``NameTakenError`` if the name is in use."""
    name: str
    """The system's name."""
    remote_address: Optional[str]
    """The remote server's ``"host:port"`` (with ``listen``), else ``None``."""
    closed: bool
    """Whether ``close()`` was called."""
    def create_station(
        self,
        name: str,
        *,
        blocking: bool = True,
        cue: int = 100,
        select: Union[_Select, Callable[[_Control, EtPriority, bytes], bool]] = None,
        prescale: int = 1,
        restore: str = "output",
        single_user: bool = False,
        keep_when_idle: bool = False,
        group_policy: str = "round-robin",
        first: bool = False,
        after: Optional[str] = None,
        parallel_with: Optional[str] = None,
    ) -> None:
        """Creates a station, as ``EtClient.create_station``; ``select`` may also be a function
        ``f(control, priority, data) -> bool`` that the system's conductor thread calls."""
    def remove_station(self, name: str) -> None:
        """Removes a station that has no attachment."""
    def configure_station(
        self,
        name: str,
        *,
        blocking: Optional[bool] = None,
        cue: Optional[int] = None,
        select: Union[_Select, Callable[[_Control, EtPriority, bytes], bool]] = None,
        prescale: Optional[int] = None,
        restore: Optional[str] = None,
        single_user: Optional[bool] = None,
        keep_when_idle: Optional[bool] = None,
        group_policy: Optional[str] = None,
    ) -> None:
        """Changes a running station's settings; those not given keep their values."""
    def attach(self, station: str) -> EtAttachment:
        """Attaches to a station from this process (no socket)."""
    def snapshot(self) -> dict[str, Any]:
        """The system's state now (the JSON of ``daqflow et monitor --json``)."""
    def close(self) -> None:
        """Stops the system: its users see ``SystemDeadError``. Again: nothing."""
    def __enter__(self) -> EtSystem: ...
    def __exit__(self, *exc: Any) -> bool: ...

class EtClient:
    """A connection to an ET system (``daqflow.et.Client``), local (shared memory) or remote
    (TCP): the same calls for both."""

    name: str
    """The system's name."""
    is_remote: bool
    """Whether this is a remote (TCP) client."""
    is_dead: bool
    """Whether the ET system is gone (stopped, died, or the connection broke)."""
    def attach(self, station: str) -> EtAttachment:
        """Attaches to a station: ``GRAND_CENTRAL`` for a producer."""
    def create_station(
        self,
        name: str,
        *,
        blocking: bool = True,
        cue: int = 100,
        select: _Select = None,
        prescale: int = 1,
        restore: str = "output",
        single_user: bool = False,
        keep_when_idle: bool = False,
        group_policy: str = "round-robin",
        first: bool = False,
        after: Optional[str] = None,
        parallel_with: Optional[str] = None,
    ) -> None:
        """Creates a station: blocking or not (with ``cue``), its selection (an
        ``EtSelection``, its text form, or up to four control integers or ``None``), its
        prescale, restore mode (``"output"``, ``"input"``, ``"grand-central"``,
        ``"redistribute"``), single user, keep when idle, group policy (``"round-robin"``,
        ``"shortest-queue"``), and where: at the end, ``first``, ``after=NAME`` or
        ``parallel_with=NAME``."""
    def remove_station(self, name: str) -> None:
        """Removes a station that has no attachment."""
    def configure_station(
        self,
        name: str,
        *,
        blocking: Optional[bool] = None,
        cue: Optional[int] = None,
        select: _Select = None,
        prescale: Optional[int] = None,
        restore: Optional[str] = None,
        single_user: Optional[bool] = None,
        keep_when_idle: Optional[bool] = None,
        group_policy: Optional[str] = None,
    ) -> None:
        """Changes a running station's settings; those not given keep their values."""
    def snapshot(self) -> dict[str, Any]:
        """The system's state now (the JSON of ``daqflow et monitor --json``)."""

def et_connect(name: str) -> EtClient:
    """Connects to the ET system ``name`` on this machine (``daqflow.et.connect``)."""

def et_connect_remote(address: str) -> EtClient:
    """Connects to an ET system's remote server at ``"host:port"`` (``daqflow.et.connect_remote``)."""

def et_discover(name: str, port: int, timeout: float = 3.0) -> EtClient:
    """Finds the ET system ``name`` by UDP discovery on ``port`` and connects to its remote
    server (``daqflow.et.discover``)."""

class EtAttachment:
    """An attachment to a station (``daqflow.et.Attachment``). ``detach()`` or the end of a
    ``with`` block ends it; events still in batches keep it attached until put, dumped or
    deleted."""

    station: str
    """The station attached to."""
    is_remote: bool
    """Whether it is a remote (TCP) attachment."""
    def new_events(self, count: int, size: int, wait: _Wait = None) -> EtBatch:
        """Up to ``count`` new events of ``size`` bytes (large events above the pool's event
        size). ``wait``: ``"sleep"`` (default), ``"async"`` or seconds (``TimedOutError``)."""
    def get_events(self, count: int, wait: _Wait = None) -> EtBatch:
        """Up to ``count`` events from the station's input list; ``wait`` as above."""
    def put_events(self, events: Union[EtBatch, EtEvent, Iterable[EtEvent]]) -> None:
        """Hands events on to the next stations. Releases the memoryviews ``EtEvent.data``
        gave; ``BufferInUseError`` (nothing put) while other buffers of them exist."""
    def dump_events(self, events: Union[EtBatch, EtEvent, Iterable[EtEvent]]) -> None:
        """Returns events straight to GrandCentral; the rules of ``put_events``."""
    def detach(self) -> None:
        """Ends the attachment."""
    def __enter__(self) -> EtAttachment: ...
    def __exit__(self, *exc: Any) -> bool: ...

class EtBatch:
    """The events one call got or made, not yet put or dumped (``daqflow.et.Batch``)."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> EtEvent: ...
    def __iter__(self) -> Iterator[EtEvent]: ...
    def lengths(self) -> Any:
        """Each event's length, a numpy ``uint32`` array (a copy)."""
    def controls(self) -> Any:
        """Each event's control integers, a numpy ``int32`` array of shape ``(len, 4)``."""
    def total_length(self) -> int:
        """The sum of the events' lengths."""
    def set_control(self, control: Sequence[int]) -> None:
        """Sets the four control integers of every event."""
    def set_priority(self, priority: EtPriority) -> None:
        """Sets the priority of every event."""

class EtEvent:
    """One event of a batch (``daqflow.et.Event``); also a writable buffer
    (``memoryview(event)``). Every use after it was put or dumped raises
    ``EtEventReleasedError``."""

    index: int
    """Its index in the ET system's pool."""
    length: int
    """The length of its data (settable up to ``capacity``)."""
    capacity: int
    """The most data it can hold."""
    control: _Control
    """The four control integers (set with any sequence of four ints)."""
    priority: EtPriority
    """``LOW`` (default) or ``HIGH``."""
    possibly_corrupt: bool
    """Taken back from an attachment that died holding it: its data may be half written."""
    is_large: bool
    """Whether it has a temporary buffer larger than the pool's event size."""
    released: bool
    """Whether it was put or dumped."""
    data: memoryview
    """Its ``length`` bytes, writable, without a copy; released at put or dump."""
    def write(self, data: Any) -> None:
        """Copies ``data`` (bytes or any byte buffer) into the event and sets its length."""
    def tobytes(self) -> bytes:
        """A copy of its data."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
