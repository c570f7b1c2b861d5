"""Fixtures: data files written by the `daqflow` binary (`daqflow evb local --output`)."""

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import daqflow

REPO = Path(__file__).resolve().parents[2]
COMPLETE = "run000001_bu-0_0001.daq"
CUT_SHORT = "run000001_bu-0_0002.daq.part"


@contextlib.contextmanager
def running_operator(system, data, timeout=120):
    """`daqflow run SYSTEM --data DATA` until the block ends (then `quit`, else killed): yields
    its web address (the system's `web` must name one) and the list of its output lines, which
    keeps growing."""
    proc = subprocess.Popen([daqflow_binary(), "run", str(system), "--data", str(data)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, lines = None, []
        deadline = time.monotonic() + timeout
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"web UI: (http://[0-9.:]+)/\?token=", line)
            if m:
                url = m.group(1)
        assert url, "".join(lines)
        threading.Thread(target=lambda: [lines.append(l) for l in proc.stdout], daemon=True).start()
        yield url, lines
    finally:
        if proc.poll() is None:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()


def daqflow_binary():
    """`$DAQFLOW_BIN`, else the workspace's `target/debug/daqflow` or `target/release/daqflow`."""
    candidates = [os.environ.get("DAQFLOW_BIN")]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    candidates += [target / "debug" / "daqflow", target / "release" / "daqflow"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    message = "no daqflow binary: build it (cargo build) or set DAQFLOW_BIN"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A directory with `COMPLETE`, written by a builder of one RU (two sources, 64-byte
    fragments) and one BU, and `CUT_SHORT`, a copy of it cut in the middle of a record, as a
    writer that died leaves it."""
    out = tmp_path_factory.mktemp("evb")
    run = subprocess.run(
        [daqflow_binary(), "evb", "local", "--rus", "1", "--bus", "1", "--streams", "2",
         "--fragment-size", "64", "--seconds", "1", "--rate", "200", "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"daqflow evb local failed:\n{run.stdout}\n{run.stderr}"
    files = sorted(p.name for p in out.iterdir())
    assert files == [COMPLETE], files
    complete = out / COMPLETE
    events = list(daqflow.open(complete))
    assert len(events) >= 10, "the run should have built some events"
    # Cut in the middle of the record after the first half of the events: no trailer, a
    # partial record at the end.
    middle = events[len(events) // 2]
    with open(complete, "rb") as src, open(out / CUT_SHORT, "wb") as dst:
        dst.write(src.read(middle.offset + 40))
    return out


@pytest.fixture
def in_data_dir(data_dir, monkeypatch):
    monkeypatch.chdir(data_dir)
    return data_dir


def copy_of(data_dir, tmp_path, name=COMPLETE):
    dst = tmp_path / name
    shutil.copyfile(data_dir / name, dst)
    return dst
