"""Analysis files: File.batches, to_arrow, to_awkward, and `daqflow export` to Parquet, ROOT and
HDF5, read back with pyarrow, uproot and h5py and compared event by event with daqflow.open()."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import daqflow
from daqflow import export as ex
from conftest import COMPLETE, CUT_SHORT, copy_of, daqflow_binary

np = pytest.importorskip("numpy")


def need(module):
    """The module, or (outside CI) a skip; CI installs every library these tests read with."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is needed here ({e}): .ci/run installs it")
        pytest.skip(f"{module} is not installed")


@pytest.fixture(scope="session")
def varied(tmp_path_factory):
    """Run 5 of two RUs with two sources each, fragments of 0 to 300 bytes (empty ones too),
    written by two BUs, with the run database in `data`: (data dir, files)."""
    root = tmp_path_factory.mktemp("export")
    out, data = root / "out", root / "data"
    run = subprocess.run(
        [daqflow_binary(), "evb", "local", "--rus", "2", "--bus", "2", "--streams", "2",
         "--size", "uniform:0:300", "--seconds", "1", "--rate", "300", "--run", "5",
         "--output", str(out), "--data", str(data)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"daqflow evb local failed:\n{run.stdout}\n{run.stderr}"
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["run000005_bu-0_0001.daq", "run000005_bu-1_0001.daq"]
    return data, files


def expected_rows(files, payload=True):
    """What every format must hold, from daqflow.open(): one dict per event, in order."""
    rows = []
    for path in files:
        for event in daqflow.open(path):
            fragments = event.fragments
            rows.append({
                "run": event.run, "event_id": event.id, "trigger_type": event.trigger_type,
                "flags": event.flags, "bu_id": event.bu_id,
                "trigger_time": fragments[0].timestamp if fragments else 0, "size": len(event),
                "fragments": [
                    dict({"source_id": f.source_id, "size": len(f), "timestamp": f.timestamp, "flags": f.flags},
                         **({"payload": bytes(f.payload)} if payload else {}))
                    for f in fragments
                ],
            })
    return rows


def test_batches_hold_every_event_in_bounded_pieces(varied):
    _, files = varied
    f = daqflow.open(files[0])
    whole = expected_rows([files[0]])
    small = list(f.batches(max_bytes=4096))
    assert len(small) > 3 and sum(b.events for b in small) == len(whole)
    assert all(len(b.payload) < 4096 + 2 * 300 for b in small), "a batch ends once it holds max_bytes"
    rows = []
    for b in small:
        assert b.fragment_start[0] == 0 and b.fragment_start[-1] == len(b.source_id)
        assert b.payload_start[-1] == len(b.payload) and not b.payload.flags.writeable
        for i in range(b.events):
            frags = range(int(b.fragment_start[i]), int(b.fragment_start[i + 1]))
            rows.append({
                "run": int(b.run[i]), "event_id": int(b.event_id[i]), "trigger_type": int(b.trigger_type[i]),
                "flags": int(b.flags[i]), "bu_id": int(b.bu_id[i]), "trigger_time": int(b.trigger_time[i]),
                "size": int(b.size[i]),
                "fragments": [{
                    "source_id": int(b.source_id[k]), "size": int(b.fragment_size[k]),
                    "timestamp": int(b.fragment_timestamp[k]), "flags": int(b.fragment_flags[k]),
                    "payload": bytes(b.payload[b.payload_start[k]:b.payload_start[k + 1]]),
                } for k in frags],
            })
    assert rows == whole
    assert any(fr["size"] == 0 for row in rows for fr in row["fragments"]), "empty fragments are covered"
    (one,) = list(f.batches(payload=False))
    assert one.payload is None and one.payload_start is None and one.events == len(whole)


def test_arrow_and_awkward_hold_what_the_file_holds(varied):
    pa = need("pyarrow")
    ak = need("awkward")
    _, files = varied
    f = daqflow.open(files[1])
    table = f.to_arrow(payload=True)
    assert isinstance(table, pa.Table)
    assert table.to_pylist() == expected_rows([files[1]])
    assert table.schema.field("event_id").type == pa.uint64()
    assert "payload" in table.schema.field("fragments").type.value_type.names
    assert f.to_arrow().to_pylist() == expected_rows([files[1]], payload=False)
    events = f.to_awkward(payload=True)
    assert isinstance(events, ak.Array)
    as_bytes = [dict(r, fragments=[dict(fr, payload=bytes(fr["payload"])) for fr in r["fragments"]])
                for r in events.to_list()]
    assert as_bytes == expected_rows([files[1]])
    both = ex.to_awkward(files, payload=False)
    assert both.to_list() == expected_rows(files, payload=False)


def read_parquet(path):
    pq = need("pyarrow.parquet")
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"layout_version"])
    assert meta == ex.LAYOUT_VERSION
    return table.to_pylist()


def read_root(path):
    uproot = need("uproot")
    with uproot.open(path) as f:
        tree = f["events"]
        arrays = tree.arrays(library="np")
        metadata = json.loads(str(f["daqflow"]))
    rows = []
    for i in range(tree.num_entries):
        sizes = arrays["fragment_size"][i]
        payload = bytes(arrays["payload"][i]) if "payload" in arrays else None
        starts = [0] + [int(x) for x in np.cumsum(sizes, dtype=np.int64)]
        fragments = []
        for k in range(len(sizes)):
            fr = {"source_id": int(arrays["fragment_source_id"][i][k]), "size": int(sizes[k]),
                  "timestamp": int(arrays["fragment_timestamp"][i][k]), "flags": int(arrays["fragment_flags"][i][k])}
            if payload is not None:
                fr["payload"] = payload[starts[k]:starts[k + 1]]
            fragments.append(fr)
        row = {name: int(arrays[name][i]) for name, _ in ex.EVENT_COLUMNS}
        row["fragments"] = fragments
        rows.append(row)
    assert metadata["layout_version"] == ex.LAYOUT_VERSION
    return rows


def read_hdf5(path):
    h5py = need("h5py")
    rows = []
    with h5py.File(path, "r") as f:
        assert (f.attrs["format"], int(f.attrs["layout_version"])) == ("daqflow-export", ex.LAYOUT_VERSION)
        ev = {k: f["events"][k][:] for k in f["events"]}
        fr = {k: f["fragments"][k][:] for k in f["fragments"]}
        payload = f["payload"][:] if "payload" in f else None
    for i in range(len(ev["event_id"])):
        first, count = int(ev["first_fragment"][i]), int(ev["fragment_count"][i])
        fragments = []
        for k in range(first, first + count):
            one = {"source_id": int(fr["source_id"][k]), "size": int(fr["size"][k]),
                   "timestamp": int(fr["timestamp"][k]), "flags": int(fr["flags"][k])}
            if payload is not None:
                start = int(fr["payload_offset"][k])
                one["payload"] = payload[start:start + one["size"]].tobytes()
            fragments.append(one)
        row = {name: int(ev[name][i]) for name, _ in ex.EVENT_COLUMNS}
        row["fragments"] = fragments
        rows.append(row)
    return rows


READERS = {"parquet": read_parquet, "root": read_root, "hdf5": read_hdf5}


@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_the_command_writes_every_event_of_a_run_in_each_format(fmt, varied, tmp_path):
    data, files = varied
    out = tmp_path / f"run5.{fmt}"
    run = subprocess.run(
        [daqflow_binary(), "--data", str(data), "export", "5", "--to", fmt, str(out), "--payload",
         "--python", sys.executable, "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout)
    expected = expected_rows(files)
    assert (done["events"], done["files"], done["format"]) == (len(expected), 2, fmt)
    assert READERS[fmt](out) == expected
    assert not (tmp_path / f"run5.{fmt}.part").exists()


@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_without_payloads_and_a_file_cut_short(fmt, data_dir, tmp_path):
    """The numbers only; a `.daq.part` left by a writer that died is read up to its last
    whole event, like daqflow.open() reads it."""
    files = [data_dir / COMPLETE, data_dir / CUT_SHORT]
    out = tmp_path / f"x.{fmt}"
    done = ex.export(files, fmt, out, compression="none")
    expected = expected_rows(files, payload=False)
    assert done["events"] == len(expected)
    assert READERS[fmt](out) == expected


def test_a_damaged_file_stops_the_export_and_leaves_nothing(data_dir, tmp_path):
    need("pyarrow")
    bad = copy_of(data_dir, tmp_path)
    events = list(daqflow.open(bad))
    with open(bad, "r+b") as f:
        f.seek(events[len(events) // 2].offset + 200)
        f.write(b"\xff\xff")
    out = tmp_path / "bad.parquet"
    run = subprocess.run(
        [sys.executable, "-m", "daqflow.export", str(bad), "--to", "parquet", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2
    assert "daqflow export: error: record" in run.stderr and "CRC32C" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [COMPLETE], "no output, no .part"
    # Asked to, it leaves the damaged record out and goes on.
    done = ex.export([bad], "parquet", out, skip_damaged=True)
    assert done["events"] == len(events) - 1
    assert [r["event_id"] for r in read_parquet(out)] == [e.id for k, e in enumerate(events) if k != len(events) // 2]


def test_an_existing_output_is_kept_unless_replacing_is_asked_for(data_dir, tmp_path):
    need("h5py")
    out = tmp_path / "x.h5"
    out.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="exists"):
        ex.export([data_dir / COMPLETE], "hdf5", out)
    assert out.read_bytes() == b"keep me"
    ex.export([data_dir / COMPLETE], "hdf5", out, overwrite=True)
    assert len(read_hdf5(out)) == len(list(daqflow.open(data_dir / COMPLETE)))


def test_a_missing_library_says_how_to_install_it(data_dir, tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for module in ("pyarrow", "uproot", "h5py"):
        (hidden / f"{module}.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(hidden))
    for fmt, package in (("parquet", "pip install pyarrow"), ("root", "pip install uproot awkward"),
                         ("hdf5", "pip install h5py")):
        run = subprocess.run(
            [sys.executable, "-m", "daqflow.export", str(data_dir / COMPLETE), "--to", fmt, "-o",
             str(tmp_path / f"x.{fmt}")],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert run.returncode == 2, run.stderr
        assert package in run.stderr and "hidden by the test" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hidden"]
    # Through `daqflow export`, the same message.
    run = subprocess.run(
        [daqflow_binary(), "export", str(data_dir / COMPLETE), "--to", "root", str(tmp_path / "y.root"),
         "--python", sys.executable],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert run.returncode == 2 and "pip install uproot awkward" in run.stderr, run.stderr
    # A Python without the daqflow package (this one without its site-packages): `daqflow
    # export` says how to get it, and runs nothing.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    run = subprocess.run(
        [daqflow_binary(), "export", str(data_dir / COMPLETE), "--to", "parquet", str(tmp_path / "y.parquet"),
         "--python", str(bare)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2
    assert "has no daqflow Python package (ModuleNotFoundError: No module named 'daqflow')" in run.stderr, run.stderr
    assert "pip install ./python" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare-python", "hidden"]


@pytest.fixture(scope="session")
def big_file(tmp_path_factory):
    """A file of 64 KiB fragments, a few hundred MB to 1 GiB (one pattern of payload, sent fast)."""
    out = tmp_path_factory.mktemp("big-run")
    run = subprocess.run(
        [daqflow_binary(), "evb", "local", "--rus", "1", "--bus", "1", "--streams", "2",
         "--fragment-size", "65536", "--seconds", "1", "--cached-payload", "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"daqflow evb local failed:\n{run.stdout}\n{run.stderr}"
    files = sorted(out.iterdir())
    assert files, f"daqflow evb local wrote no file:\n{run.stdout}\n{run.stderr}"
    # The BU starts a new file at 1 GiB: a machine that writes faster than that in the second
    # leaves two; the largest is the one to read.
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("fmt", ex.FORMATS)
def test_a_gigabyte_is_exported_in_bounded_memory(fmt, tmp_path_factory, big_file):
    """Peak RSS of the export process ≤ 256 MiB for ≥ 1 GiB of input with every payload."""
    need({"parquet": "pyarrow", "root": "uproot", "hdf5": "h5py"}[fmt])
    copies = -(-(1 << 30) // big_file.stat().st_size)
    out = tmp_path_factory.mktemp("big") / f"big.{fmt}"
    run = subprocess.run(
        [sys.executable, "-m", "daqflow.export", *[str(big_file)] * copies, "--to", fmt, "-o", str(out),
         "--payload", "--compression", "none", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout)
    assert done["bytes_in"] >= 1 << 30
    assert done["events"] == copies * sum(b.events for b in daqflow.open(big_file).batches(payload=False))
    assert done["bytes_out"] >= 1 << 30, "every payload was written"
    assert 0 < done["peak_rss_bytes"] <= 256 << 20, f"peak RSS {done['peak_rss_bytes'] / 2**20:.0f} MiB"
    out.unlink()


def test_ctrl_c_in_the_terminal_leaves_nothing_behind(big_file, tmp_path):
    """SIGINT to the terminal's process group (what Ctrl-C does) while `daqflow export` writes:
    the export removes OUT.part, `daqflow export` waits for it and exits 130."""
    need("uproot")
    import signal
    import time

    out = tmp_path / "big.root"
    # Enough input (24 copies, compressed with zlib) that the export is far from its end when
    # its first megabyte is on disk, however fast the machine. In a terminal SIGINT is not
    # ignored; a test run in the background by a script inherits it ignored (a shell's
    # asynchronous commands ignore SIGINT), and Python then never raises KeyboardInterrupt:
    # the child gets the terminal's disposition back.
    proc = subprocess.Popen(
        [daqflow_binary(), "export", *[str(big_file)] * 24, "--to", "root", str(out), "--payload",
         "--python", sys.executable],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    part = tmp_path / "big.root.part"
    deadline = time.monotonic() + 120
    while not (part.exists() and part.stat().st_size > 1 << 20):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the export never started writing"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted; nothing was written" in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_file_without_events_gives_an_empty_table(data_dir, tmp_path):
    """A file cut right after its header: no event, and every format still says what it holds."""
    empty = tmp_path / "run000001_bu-0_0003.daq.part"
    with open(data_dir / COMPLETE, "rb") as src:
        empty.write_bytes(src.read(next(iter(daqflow.open(data_dir / COMPLETE))).offset))
    assert list(daqflow.open(empty)) == []
    for fmt in ex.FORMATS:
        need({"parquet": "pyarrow", "root": "uproot", "hdf5": "h5py"}[fmt])
        out = tmp_path / f"empty.{fmt}"
        assert ex.export([empty], fmt, out, payload=True)["events"] == 0
        assert READERS[fmt](out) == []
    assert len(ex.to_awkward(empty)) == 0 and ex.to_arrow(empty).num_rows == 0
