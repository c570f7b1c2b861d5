"""How many chunks a chain component with ports written in Python passes on
(daqflow.PortComponent, docs/python.md "Chain components with ports in Python"), next to the
Rust `repeater` in the same place, measured in the same invocation.

    python python/benches/port_component.py [--seconds 3] [--runs 3] [--sizes 1024 65536]

Each measurement is a whole system under `daqflow run --start --seconds S` (the release binary
if there is one; `--daqflow PATH` or `$DAQFLOW_BIN` pick another): a free-running `generator`
into the component under test, whose one output feeds a `sink`. The component is either a
Python pass-through (`on_chunk` sends each chunk on unchanged: one call, one memoryview and one
send per chunk) or the Rust `repeater`. The figure is the chunks the sink received per second of
the run (the run's record in runs.sqlite), the median of `--runs` runs, alternating the two.
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PASS = '''
import daqflow

class Pass(daqflow.PortComponent):
    kind = "pass"
    inputs = [daqflow.InPort("in")]
    outputs = [daqflow.OutPort("out")]

    def on_chunk(self, input, data, out):
        out.send("out", data)

if __name__ == "__main__":
    Pass.main()
'''


def binary(given):
    for c in (given, os.environ.get("DAQFLOW_BIN"), REPO / "target" / "release" / "daqflow",
              REPO / "target" / "debug" / "daqflow"):
        if c and Path(c).is_file():
            return str(c)
    sys.exit("no daqflow binary: cargo build --release")


def system(dir, kind, size, script):
    if kind == "python":
        middle = f'''[[component]]
name = "mid"
kind = "pass"
command = {json.dumps([sys.executable, str(script)])}
[component.params]
downstream.out = "${{sink.listen}}"
'''
        target = "${mid.in}"
    else:
        middle = '''[[component]]
name = "mid"
kind = "repeater"
[component.params]
downstream = "${sink.listen}"
'''
        target = "${mid.listen}"
    text = f'''[system]
name = "port-bench"
control = "127.0.0.1:0"
data = "{dir / "data"}"
web = "none"

[[component]]
name = "sink"
kind = "sink"

{middle}
[[component]]
name = "gen"
kind = "generator"
[component.params]
downstream = "{target}"
chunk_bytes = {size}
rate_hz = 0.0
'''
    path = dir / "system.toml"
    path.write_text(text)
    return path


def measure(daqflow, kind, size, seconds, script):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        path = system(d, kind, size, script)
        run = subprocess.run([daqflow, "run", str(path), "--start", "--seconds", str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 300)
        if run.returncode != 0:
            sys.exit(f"{kind} {size}: the run failed:\n{run.stdout}\n{run.stderr}")
        with sqlite3.connect(d / "data" / "runs.sqlite") as db:
            (summary,) = db.execute("select summary from runs where run = 1").fetchone()
        summary = json.loads(summary)
        sink = summary["components"]["sink"]["summary"]
        # The run's whole time, its start and its stop included: the same for both kinds.
        return sink["events"] / summary["seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 65536])
    p.add_argument("--daqflow")
    args = p.parse_args()
    daqflow = binary(args.daqflow)
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "pass.py"
        script.write_text(PASS)
        print(f"{'chunk':>8} {'Python chunks/s':>16} {'Rust repeater chunks/s':>23} {'ratio':>6}")
        for size in args.sizes:
            got = {"python": [], "rust": []}
            for _ in range(args.runs):
                for kind in ("python", "rust"):
                    got[kind].append(measure(daqflow, kind, size, args.seconds, script))
            py, rs = statistics.median(got["python"]), statistics.median(got["rust"])
            print(f"{size:>8} {py:>16.0f} {rs:>23.0f} {py / rs:>6.2f}")


if __name__ == "__main__":
    main()
