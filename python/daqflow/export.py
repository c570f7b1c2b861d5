"""daqflow data files as the field's analysis files: Parquet, ROOT and HDF5, and Arrow and
awkward arrays in memory.

One row per event, in file order (the files in the order given): the run, the event id, the
trigger type, the event's flags and builder unit, its trigger time (the time stamp of its first
fragment), its size in bytes, and its fragments as lists (source id, payload size, time stamp,
flags and, when asked for, the payload)::

    import daqflow
    table = daqflow.open("run000001_bu-0_0001.daq").to_arrow()        # a pyarrow.Table
    events = daqflow.open("run000001_bu-0_0001.daq").to_awkward()     # an awkward.Array

    from daqflow.export import export
    export(["run000001_bu-0_0001.daq"], "parquet", "run1.parquet")   # also "root", "hdf5"

Each format is written by its own library: Parquet by pyarrow, ROOT by uproot (with awkward),
HDF5 by h5py. A file is read and written in batches of about ``max_bytes`` (``File.batches``),
so that a run of any size is exported in bounded memory; the output is written under a
temporary name (``OUT.part``) and renamed when complete, so that an interrupted export leaves
nothing that looks finished. ``python -m daqflow.export`` (and ``daqflow export``, which runs
it) is the command line. The layouts are in docs/analysis-files.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

from . import _native

FORMATS = ("parquet", "root", "hdf5")
"""The formats :func:`export` writes."""

LAYOUT_VERSION = 1
"""The version of the layouts below (columns and their types); a file says which it follows."""

EVENT_COLUMNS = (
    ("run", "uint32"),
    ("event_id", "uint64"),
    ("trigger_type", "uint32"),
    ("flags", "uint32"),
    ("bu_id", "uint32"),
    ("trigger_time", "uint64"),
    ("size", "uint64"),
)
"""One value per event: name and numpy type (the ``Batch`` attribute of the same name)."""

FRAGMENT_COLUMNS = (
    ("source_id", "source_id", "uint32"),
    ("size", "fragment_size", "uint32"),
    ("timestamp", "fragment_timestamp", "uint64"),
    ("flags", "fragment_flags", "uint32"),
)
"""One value per fragment: name in the output, ``Batch`` attribute, numpy type."""

DEFAULT_BATCH_BYTES = 16 << 20
"""What one batch holds at most, about: 16 MiB (a batch is read, converted and written before
the next is read)."""

COMPRESSIONS = {
    "parquet": ("snappy", ("none", "snappy", "zstd", "lz4", "gzip", "brotli")),
    "root": ("zlib", ("none", "zlib", "lzma", "lz4", "zstd")),
    "hdf5": ("none", ("none", "gzip", "lzf")),
}
"""Per format: the default compression and those it takes."""

INSTALL = {
    "parquet": ("pyarrow", "pip install pyarrow"),
    "root": ("uproot", "pip install uproot awkward"),
    "hdf5": ("h5py", "pip install h5py"),
    "arrow": ("pyarrow", "pip install pyarrow"),
    "awkward": ("awkward", "pip install awkward"),
}
"""Per use: the package it needs, and how to install it (or, from daqflow's source, the
package's extras: ``pip install './python[export]'``)."""


class MissingLibraryError(ImportError):
    """The library a format needs is not installed; the message says how to install it."""


def _need(what: str, module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        package, command = INSTALL[what]
        raise MissingLibraryError(
            f"{what} needs the Python package {package} ({e}); install it into this Python "
            f"({sys.executable}): {command}"
        ) from e


Source = Union[str, os.PathLike, "_native.File"]


def _open(source: Source):
    return source if isinstance(source, _native.File) else _native.open(source)


def batches(
    sources: Iterable[Source], payload: bool = False, max_bytes: int = DEFAULT_BATCH_BYTES,
    skip_damaged: bool = False,
) -> Iterator[Any]:
    """The events of ``sources`` (paths or open files), in order, as ``daqflow.Batch`` objects
    of about ``max_bytes`` each."""
    for source in sources:
        yield from _open(source).batches(max_bytes=max_bytes, payload=payload, skip_damaged=skip_damaged)


# ---- Arrow (Parquet) -------------------------------------------------------------------------


def arrow_schema(payload: bool = False, metadata: Optional[dict] = None):
    """The Arrow schema of the event rows (``payload``: with each fragment's bytes)."""
    pa = _need("arrow", "pyarrow")
    fragment = [pa.field(name, getattr(pa, kind)(), nullable=False) for name, _, kind in FRAGMENT_COLUMNS]
    if payload:
        fragment.append(pa.field("payload", pa.large_binary(), nullable=False))
    fields = [pa.field(name, getattr(pa, kind)(), nullable=False) for name, kind in EVENT_COLUMNS]
    fields.append(pa.field("fragments", pa.list_(pa.field("item", pa.struct(fragment), nullable=False)), nullable=False))
    return pa.schema(fields, metadata=metadata)


def arrow_batch(batch, schema):
    """One ``daqflow.Batch`` as a ``pyarrow.RecordBatch`` of ``schema`` (the numbers are not
    copied; the list offsets are)."""
    pa = _need("arrow", "pyarrow")
    import numpy as np

    children = [pa.array(getattr(batch, attr)) for _, attr, _ in FRAGMENT_COLUMNS]
    struct_type = schema.field("fragments").type.value_type
    if struct_type.get_field_index("payload") >= 0:
        if batch.payload is None:
            raise ValueError("the schema has payloads but the batch was read without them")
        starts = batch.payload_start.view(np.int64)
        children.append(
            pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), len(batch.source_id), [None, pa.py_buffer(starts), pa.py_buffer(batch.payload)]
            )
        )
    fragments = pa.StructArray.from_arrays(children, fields=list(struct_type))
    offsets = pa.array(batch.fragment_start.astype(np.int32))
    lists = pa.ListArray.from_arrays(offsets, fragments, type=schema.field("fragments").type)
    columns = [pa.array(getattr(batch, name)) for name, _ in EVENT_COLUMNS] + [lists]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def to_arrow(source: Union[Source, Sequence[Source]], payload: bool = False, skip_damaged: bool = False):
    """The events of a file (or of several, in order) as one ``pyarrow.Table``: the whole table
    is in memory; for a large run, write Parquet with :func:`export` instead."""
    pa = _need("arrow", "pyarrow")
    sources = _as_list(source)
    schema = arrow_schema(payload)
    return pa.Table.from_batches(
        [arrow_batch(b, schema) for b in batches(sources, payload, skip_damaged=skip_damaged)], schema=schema
    )


# ---- awkward ---------------------------------------------------------------------------------


def awkward_batch(batch):
    """One ``daqflow.Batch`` as an ``awkward.Array`` of event records, each with its list of
    fragment records (``fragments``)."""
    ak = _need("awkward", "awkward")
    import numpy as np

    fields = {name: np.asarray(getattr(batch, attr)) for name, attr, _ in FRAGMENT_COLUMNS}
    if batch.payload is not None:
        fields["payload"] = ak.unflatten(np.asarray(batch.payload), np.asarray(batch.fragment_size))
    fragments = ak.unflatten(ak.zip(fields, depth_limit=1), np.diff(batch.fragment_start))
    events = {name: np.asarray(getattr(batch, name)) for name, _ in EVENT_COLUMNS}
    events["fragments"] = fragments
    return ak.zip(events, depth_limit=1)


def to_awkward(source: Union[Source, Sequence[Source]], payload: bool = False, skip_damaged: bool = False):
    """The events of a file (or of several, in order) as one ``awkward.Array`` of records (in
    memory, like :func:`to_arrow`)."""
    ak = _need("awkward", "awkward")
    parts = [awkward_batch(b) for b in batches(_as_list(source), payload, skip_damaged=skip_damaged)]
    if not parts:
        return awkward_batch(_empty_batch(payload))
    return parts[0] if len(parts) == 1 else ak.concatenate(parts)


class _EmptyBatch:
    """A batch of no events, with every column (for an empty file)."""

    def __init__(self, payload: bool):
        import numpy as np

        for name, kind in EVENT_COLUMNS:
            setattr(self, name, np.zeros(0, kind))
        for _, attr, kind in FRAGMENT_COLUMNS:
            setattr(self, attr, np.zeros(0, kind))
        self.events = 0
        self.fragment_start = np.zeros(1, "uint64")
        self.payload_start = np.zeros(1, "uint64") if payload else None
        self.payload = np.zeros(0, "uint8") if payload else None


def _empty_batch(payload: bool):
    return _EmptyBatch(payload)


def _as_list(source) -> list:
    if isinstance(source, (str, os.PathLike, _native.File)):
        return [source]
    return list(source)


# ---- Writers ---------------------------------------------------------------------------------


class _ParquetWriter:
    def __init__(self, path: str, payload: bool, compression: str, metadata: dict):
        _need("parquet", "pyarrow")
        pq = _need("parquet", "pyarrow.parquet")
        self.schema = arrow_schema(payload, {k: json.dumps(v) for k, v in metadata.items()})
        # Dictionary encoding for the numbers (few distinct values: a run, sources, flags), not
        # for payloads: detector data rarely repeats, and a dictionary that overflows costs time.
        # (A nested column's path is `fragments.list.element.NAME`, `…list.item…` in pyarrow < 13.)
        numbers = [name for name, _ in EVENT_COLUMNS] + [
            f"fragments.list.{item}.{name}" for item in ("element", "item") for name, _, _ in FRAGMENT_COLUMNS
        ]
        self.writer = pq.ParquetWriter(path, self.schema, compression=compression, use_dictionary=numbers)

    def write(self, batch) -> None:
        self.writer.write_batch(arrow_batch(batch, self.schema))

    def close(self) -> None:
        self.writer.close()


class _RootWriter:
    """A TTree ``events`` of flat branches: one per event column, and ``fragment_*`` and
    ``payload`` as ``std::vector`` per event (``payload``: the event's fragment payloads back to
    back, in fragment order)."""

    def __init__(self, path: str, payload: bool, compression: str, metadata: dict):
        self.uproot = _need("root", "uproot")
        self.ak = _need("root", "awkward")
        codec = {
            "none": None,
            "zlib": self.uproot.ZLIB(1),
            "lzma": self.uproot.LZMA(1),
            "lz4": self.uproot.LZ4(1),
            "zstd": self.uproot.ZSTD(1),
        }[compression]
        self.file = self.uproot.recreate(path, compression=codec)
        self.payload = payload
        self.metadata = metadata
        self.tree = None

    def write(self, batch) -> None:
        import numpy as np

        counts = np.diff(batch.fragment_start)
        branches = {name: np.asarray(getattr(batch, name)) for name, _ in EVENT_COLUMNS}
        for name, attr, _ in FRAGMENT_COLUMNS:
            branches["fragment_" + name] = self.ak.unflatten(np.asarray(getattr(batch, attr)), counts)
        if self.payload:
            sizes = np.diff(batch.payload_start[batch.fragment_start.astype(np.int64)])
            branches["payload"] = self.ak.unflatten(np.asarray(batch.payload), sizes)
        if self.tree is None:
            self.file["events"] = branches
            self.tree = self.file["events"]
        else:
            self.tree.extend(branches)

    def close(self) -> None:
        if self.tree is None:
            # No event: the tree still says what it would hold.
            self.write(_empty_batch(self.payload))
        # The metadata as a string (TObjString), read with uproot: `file["daqflow"]`.
        self.file["daqflow"] = json.dumps(self.metadata)
        self.file.close()


class _Hdf5Writer:
    """Groups ``events`` and ``fragments`` of one-dimensional datasets that grow by batch, and
    ``payload`` (bytes, back to back)."""

    def __init__(self, path: str, payload: bool, compression: str, metadata: dict):
        self.h5py = _need("hdf5", "h5py")
        self.file = self.h5py.File(path, "w")
        self.file.attrs["format"] = "daqflow-export"
        self.file.attrs["layout_version"] = LAYOUT_VERSION
        for key, value in metadata.items():
            if key != "layout_version":
                self.file.attrs[key] = json.dumps(value)
        options = {} if compression == "none" else {"compression": compression}

        def dataset(group, name, kind, chunk=1 << 14):
            return group.create_dataset(name, shape=(0,), maxshape=(None,), dtype=kind, chunks=(chunk,), **options)

        events = self.file.create_group("events")
        self.events = {name: dataset(events, name, kind) for name, kind in EVENT_COLUMNS}
        self.events["first_fragment"] = dataset(events, "first_fragment", "uint64")
        self.events["fragment_count"] = dataset(events, "fragment_count", "uint32")
        fragments = self.file.create_group("fragments")
        self.fragments = {name: dataset(fragments, name, kind) for name, _, kind in FRAGMENT_COLUMNS}
        self.payload = None
        if payload:
            self.fragments["payload_offset"] = dataset(fragments, "payload_offset", "uint64")
            self.payload = dataset(self.file, "payload", "uint8", 1 << 20)
        self.fragments_written = 0
        self.payload_written = 0

    @staticmethod
    def _append(dataset, values) -> None:
        start = dataset.shape[0]
        dataset.resize((start + len(values),))
        if len(values):
            dataset[start:] = values

    def write(self, batch) -> None:
        import numpy as np

        for name, _ in EVENT_COLUMNS:
            self._append(self.events[name], np.asarray(getattr(batch, name)))
        starts = np.asarray(batch.fragment_start)
        self._append(self.events["first_fragment"], starts[:-1] + self.fragments_written)
        self._append(self.events["fragment_count"], np.diff(starts).astype(np.uint32))
        for name, attr, _ in FRAGMENT_COLUMNS:
            self._append(self.fragments[name], np.asarray(getattr(batch, attr)))
        if self.payload is not None:
            self._append(self.fragments["payload_offset"], batch.payload_start[:-1] + self.payload_written)
            self._append(self.payload, np.asarray(batch.payload))
            self.payload_written += len(batch.payload)
        self.fragments_written += len(batch.source_id)

    def close(self) -> None:
        self.file.close()


WRITERS = {"parquet": _ParquetWriter, "root": _RootWriter, "hdf5": _Hdf5Writer}


def export(
    sources: Sequence[Source],
    to: str,
    output: Union[str, os.PathLike],
    payload: bool = False,
    compression: Optional[str] = None,
    overwrite: bool = False,
    max_bytes: int = DEFAULT_BATCH_BYTES,
    skip_damaged: bool = False,
    progress: Optional[Callable[[dict], None]] = None,
) -> dict:
    """Writes the events of ``sources`` (paths or open files, in order) to ``output`` as ``to``
    (``"parquet"``, ``"root"`` or ``"hdf5"``); returns what was done (events, fragments, bytes
    read and written, seconds). The output appears only when complete: it is written as
    ``OUTPUT.part`` and renamed. An existing output is an error unless ``overwrite``."""
    if to not in WRITERS:
        raise ValueError(f"unknown format {to!r}: one of {', '.join(FORMATS)}")
    default, known = COMPRESSIONS[to]
    compression = (compression or default).lower()
    if compression not in known:
        raise ValueError(f"{to} takes compression {', '.join(known)}, not {compression!r}")
    output = _refuse_existing(output, overwrite)
    files = [_open(s) for s in sources]
    metadata = {
        "daqflow_version": _native.__version__,
        "layout_version": LAYOUT_VERSION,
        "files": [f.path for f in files],
        "runs": sorted({f.run for f in files}),
        "payload": payload,
    }
    started = time.monotonic()
    done = {"events": 0, "fragments": 0, "bytes_in": sum(f.size for f in files), "files": len(files)}
    with _as_part(output) as part:
        writer = WRITERS[to](str(part), payload, compression, metadata)
        try:
            for batch in batches(files, payload, max_bytes, skip_damaged):
                writer.write(batch)
                done["events"] += batch.events
                done["fragments"] += len(batch.source_id)
                if progress:
                    progress(dict(done))
        except BaseException:
            # The error (or Ctrl-C) is what is reported, not what closing the half-written
            # output may say; the output is removed either way.
            with contextlib.suppress(Exception):
                writer.close()
            raise
        writer.close()
    done["bytes_out"] = output.stat().st_size
    done["seconds"] = time.monotonic() - started
    done["output"] = str(output)
    done["format"] = to
    return done


def _refuse_existing(output: Union[str, os.PathLike], overwrite: bool) -> Path:
    output = Path(output)
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} exists (give overwrite=True, or --overwrite, to replace it)")
    return output


@contextlib.contextmanager
def _as_part(output: Path) -> Iterator[Path]:
    """Yields ``OUTPUT.part`` to write; renames it to ``output`` when the block ends well, and
    removes it when it raises (an error, Ctrl-C): no partial file is left behind."""
    part = output.with_name(output.name + ".part")
    try:
        yield part
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, output)


# ---- Histograms ------------------------------------------------------------------------------


def export_histograms(histograms: Sequence[dict], output: Union[str, os.PathLike], overwrite: bool = False,
                      run: Optional[int] = None) -> dict:
    """Writes published histograms (``GET /api/histograms``'s, or a run's saved ones:
    ``summary.histograms``) to the ROOT file ``output`` with uproot: a directory per component,
    each one-dimensional histogram a ``TH1D`` (under- and overflow in ROOT's flow bins), each
    two-dimensional one a ``TH2D``, each counter a ``TObjString`` holding its value; and a
    ``TObjString`` ``daqflow`` with the run and what was written (JSON). Returns what was
    written. Written as ``OUTPUT.part`` and renamed, like :func:`export`."""
    uproot = _need("root", "uproot")
    import numpy as np
    from uproot.writing.identify import to_TAxis, to_TH1x, to_TH2x

    output = _refuse_existing(output, overwrite)
    written = []
    with _as_part(output) as part, uproot.recreate(part) as f:
        for h in histograms:
            path = f"{h.get('component', 'daqflow')}/{h['name']}"
            kind = h.get("kind", "h1")
            if kind == "counter":
                f[path] = str(int(h.get("value", 0)))
            elif kind == "h2":
                f[path] = _th2(h, np, to_TAxis, to_TH2x)
            else:
                f[path] = _th1(h, np, to_TAxis, to_TH1x)
            written.append(path)
        f["daqflow"] = json.dumps({"run": run, "histograms": written, "daqflow_version": _native.__version__})
    return {"run": run, "histograms": written, "output": str(output), "bytes_out": output.stat().st_size}


def _centres(low: float, high: float, n: int, np):
    return low + (np.arange(n) + 0.5) * (high - low) / n


def _th1(h: dict, np, to_TAxis, to_TH1x):
    bins = np.asarray(h.get("bins", []), dtype=np.float64)
    n = max(len(bins), 1)
    low, high = float(h.get("low", 0.0)), float(h.get("high", 1.0))
    data = np.concatenate([[h.get("underflow", 0)], bins if len(bins) else [0.0], [h.get("overflow", 0)]]).astype(np.float64)
    inside = float(bins.sum())
    centres = _centres(low, high, n, np)
    # ROOT's statistics are of the entries inside the range. daqflow keeps the exact sum of
    # every value filled: it is ROOT's when nothing fell outside; otherwise the bins' centres.
    outside = h.get("underflow", 0) + h.get("overflow", 0)
    sumx = float(h["sum"]) if outside == 0 and h.get("sum") is not None else float((centres * bins).sum())
    return to_TH1x(
        fName=h["name"], fTitle=h.get("title", ""), data=data, fEntries=float(h.get("entries", 0)),
        fTsumw=inside, fTsumw2=inside, fTsumwx=sumx, fTsumwx2=float((centres ** 2 * bins).sum()), fSumw2=data,
        fXaxis=to_TAxis(fName="xaxis", fTitle=h.get("x_label", ""), fNbins=n, fXmin=low, fXmax=high),
    )


def _th2(h: dict, np, to_TAxis, to_TH2x):
    ax, ay = h["x"], h["y"]
    nx, ny = int(ax["bins"]), int(ay["bins"])
    counts = np.asarray(h["bins"], dtype=np.float64).reshape(ny, nx)
    # ROOT's cells include a flow bin at each end of each axis: cell (ix, iy) is ix + (nx + 2) * iy.
    cells = np.zeros((ny + 2, nx + 2))
    cells[1:-1, 1:-1] = counts
    data = cells.ravel()
    cx, cy = _centres(ax["low"], ax["high"], nx, np), _centres(ay["low"], ay["high"], ny, np)
    inside = float(counts.sum())
    return to_TH2x(
        fName=h["name"], fTitle=h.get("title", ""), data=data, fEntries=float(h.get("entries", 0)),
        fTsumw=inside, fTsumw2=inside, fTsumwx=float((counts.sum(axis=0) * cx).sum()),
        fTsumwx2=float((counts.sum(axis=0) * cx ** 2).sum()), fTsumwy=float((counts.sum(axis=1) * cy).sum()),
        fTsumwy2=float((counts.sum(axis=1) * cy ** 2).sum()), fTsumwxy=float((counts * np.outer(cy, cx)).sum()),
        fSumw2=data,
        fXaxis=to_TAxis(fName="xaxis", fTitle=ax.get("label", ""), fNbins=nx, fXmin=float(ax["low"]), fXmax=float(ax["high"])),
        fYaxis=to_TAxis(fName="yaxis", fTitle=ay.get("label", ""), fNbins=ny, fXmin=float(ay["low"]), fXmax=float(ay["high"])),
    )


# ---- Command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m daqflow.export",
        description="Write daqflow data files as Parquet, ROOT or HDF5: one row per event "
        "(docs/analysis-files.md).",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="data files (.daq, or .daq.part), in order")
    p.add_argument("--to", required=True, choices=FORMATS, help="the format to write")
    p.add_argument("--histograms", metavar="JSON",
                   help="instead of files: write the histograms of JSON ({\"run\": N, \"histograms\": [...]}; "
                   "- for standard input) to a ROOT file (--to root)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="the file to write")
    p.add_argument("--payload", action="store_true", help="also write every fragment's payload")
    p.add_argument("--compression", help="parquet: none, snappy (default), zstd, lz4, gzip, brotli; "
                   "root: none, zlib (default), lzma, lz4, zstd; hdf5: none (default), gzip, lzf")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--skip-damaged", action="store_true", help="leave out damaged records instead of stopping")
    p.add_argument("--batch-bytes", type=int, default=DEFAULT_BATCH_BYTES, metavar="BYTES",
                   help="bytes read and converted at once, about (memory use follows it)")
    p.add_argument("--json", action="store_true", help="print what was done as one JSON object")
    return p


def peak_rss_bytes() -> int:
    """This process's peak resident memory: for the bound the export keeps (batches of
    --batch-bytes, whatever the size of the run). Linux's `VmHWM` is this program's own;
    `getrusage`'s maximum also counts the parent's memory at the fork before this program
    started (Linux keeps it across exec), so it is the answer only where there is no `/proc`."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m daqflow.export``: exit status 0 when written, 2 on an error (a file that
    cannot be read, a library that is missing, an output that exists), 130 on Ctrl-C."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.histograms is not None:
        if args.files or args.to != "root":
            parser.error("--histograms writes a ROOT file (--to root) and takes no data file")
        try:
            text = sys.stdin.read() if args.histograms == "-" else Path(args.histograms).read_text()
            given = json.loads(text)
            done = export_histograms(given["histograms"], args.output, overwrite=args.overwrite, run=given.get("run"))
        except KeyboardInterrupt:
            print("daqflow export: interrupted; nothing was written", file=sys.stderr)
            return 130
        except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
            print(f"daqflow export: error: {e}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(done))
        else:
            print(f"{len(done['histograms'])} histograms of run {done['run']} written to {done['output']} (root)")
        return 0
    if not args.files:
        parser.error("give the data files to export")
    try:
        done = export(
            args.files, args.to, args.output, payload=args.payload, compression=args.compression,
            overwrite=args.overwrite, max_bytes=args.batch_bytes, skip_damaged=args.skip_damaged,
        )
    except KeyboardInterrupt:
        print("daqflow export: interrupted; nothing was written", file=sys.stderr)
        return 130
    except (OSError, ValueError, ImportError, _native.Error) as e:
        print(f"daqflow export: error: {e}", file=sys.stderr)
        return 2
    done["peak_rss_bytes"] = peak_rss_bytes()
    if args.json:
        print(json.dumps(done))
    else:
        seconds = max(done["seconds"], 1e-9)
        print(
            f"{done['events']} events ({done['fragments']} fragments) of {done['files']} file(s), "
            f"{done['bytes_in'] / 1e6:.1f} MB read, written to {done['output']} ({done['format']}, "
            f"{done['bytes_out'] / 1e6:.1f} MB) in {seconds:.2f} s, {done['bytes_in'] / 1e6 / seconds:.0f} MB/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
