"""daqflow from Python: read daqflow data files.

``daqflow.open(path)`` opens a data file (``.daq``, or ``.daq.part`` left by a writer that
stopped); iterating over it yields its events, whose fragments' payloads are read-only
``memoryview`` objects over the bytes read from the file (no copy). ``File.verify()`` checks
every CRC; ``File.arrays()`` returns the fragments of the whole file as numpy arrays.
``File.batches()`` yields the events in batches of numpy columns, and ``File.to_arrow()`` /
``File.to_awkward()`` return them as a pyarrow table or an awkward array (``daqflow.export``,
which also writes Parquet, ROOT and HDF5 files: docs/analysis-files.md).
``daqflow.decode_event(data)`` gives the same ``Event`` for the bytes of one event from
elsewhere (an ET event: ``daqflow.et``).

The module is built from daqflow's Rust crates (``crates/python``, PyO3); see docs/python.md.
"""

from ._native import (
    Arrays,
    Batch,
    Batches,
    Buffer,
    CorruptDataError,
    Error,
    Event,
    Events,
    File,
    FormatError,
    Fragment,
    SourceStream,
    SuperFragment,
    VerifyReport,
    __version__,
    decode_event,
    open,
)
from .component import STATES_CONFIGURED, Component, Parameter
from .ports import InPort, OutPort, PortComponent
from .operator import Operator, OperatorError
from . import dialog, histograms

__all__ = [
    "Arrays",
    "Batch",
    "Batches",
    "Buffer",
    "Component",
    "InPort",
    "OutPort",
    "Parameter",
    "PortComponent",
    "STATES_CONFIGURED",
    "CorruptDataError",
    "Error",
    "Event",
    "Events",
    "File",
    "FormatError",
    "Operator",
    "OperatorError",
    "Fragment",
    "SourceStream",
    "SuperFragment",
    "VerifyReport",
    "__version__",
    "decode_event",
    "dialog",
    "histograms",
    "open",
]
