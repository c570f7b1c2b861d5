"""Times reading one data file from Python and with the Rust reader: the figures of the table in
docs/python.md. Usage: python python/benches/read_file.py FILE [--runs N]

The Rust reader is `cargo run --release -p daqflow-wire --example read_fragments`; build it
first (`cargo build --release -p daqflow-wire --example read_fragments`). Prints the median of
N runs (3 by default) of each reader.
"""

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import daqflow

REPO = Path(__file__).resolve().parents[2]


def times(fn, runs):
    """Seconds of each of `runs` calls of `fn` (export_file.py takes these too)."""
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def timed(fn, runs):
    """The median of `times`."""
    return statistics.median(times(fn, runs))


def rust(path, *extra):
    exe = REPO / "target" / "release" / "examples" / "read_fragments"
    start = time.perf_counter()
    subprocess.run([str(exe), str(path), *extra], check=True, capture_output=True)
    return time.perf_counter() - start


def iterate(path):
    n = 0
    for event in daqflow.open(path):
        for fragment in event.fragments:
            n += len(fragment.payload)
    return n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = Path(args.file).stat().st_size
    results = {
        "rust read_fragments": statistics.median(rust(args.file) for _ in range(args.runs)),
        "rust read_fragments --copy": statistics.median(rust(args.file, "--copy") for _ in range(args.runs)),
        "python File.arrays()": timed(lambda: daqflow.open(args.file).arrays(), args.runs),
        "python File.verify(deep=False)": timed(lambda: daqflow.open(args.file).verify(deep=False), args.runs),
        "python iterate events and fragments": timed(lambda: iterate(args.file), args.runs),
    }
    base = results["rust read_fragments"]
    for name, seconds in results.items():
        print(f"{name:40} {seconds:7.3f} s {size / seconds / 1e6:8.0f} MB/s {100 * base / seconds:6.0f} % of Rust")


if __name__ == "__main__":
    main()
