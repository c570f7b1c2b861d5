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
    name: str,
    config_file: Optional[Union[str, os.PathLike[str]]] = None,
    sets: list[str] = ...,
    start: Optional[int] = None,
    control: Optional[str] = None,
    lease_s: Optional[float] = None,
    end_with_stdin: bool = False,
    operator: Optional[str] = None,
) -> bool:
    """Runs a component as a daqflow component process (what :meth:`daqflow.Component.run`
    calls); returns whether it failed."""

def _use_token(token_file: Optional[Union[str, os.PathLike[str]]] = None, token_stdin: bool = False) -> bool:
    """Sets the process's system token: from standard input's first line, ``token_file``,
    ``$DAQFLOW_TOKEN_FILE`` or ``$DAQFLOW_TOKEN``. Returns whether it has one."""

def _log(level: str, message: str) -> None:
    """Logs a line in the process's daqflow log."""
