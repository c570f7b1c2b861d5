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
    def index(self) -> int:
        """The position of the event's record in the file, from 0."""
    @property
    def offset(self) -> int:
        """The file offset of the event's record."""
    @property
    def data(self) -> memoryview:
        """The whole encoded event, read-only, without a copy."""
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
        """The payload, read-only, without a copy: a view of the bytes read from the file,
        usable by ``numpy.frombuffer``. It keeps the block it was read in alive."""
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
