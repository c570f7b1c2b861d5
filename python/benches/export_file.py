"""Times exporting one data file to Parquet, ROOT and HDF5 against reading it: the figures of
docs/performance.md ("Analysis files"). Usage:

    python python/benches/export_file.py FILE [--runs N] [--out DIR] [--csv results.csv]

References measured in the same run: reading the file in the export's own batches (with the
payloads copied into them, as the export does) and `File.arrays()`. Then each format with and
without payloads, with its default compression and with none. Prints the median of N runs (3 by
default) of each, its spread (min–max), the rate over the input file's size, the ratio to the
batch reading, the output size and the export's peak resident memory (its own process, as
`daqflow export --json` reports it). The outputs go to DIR (default: the system's temporary
directory) and are removed after each run.
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import daqflow
from daqflow import export as ex
from read_file import times  # the same timing as the reading benchmark (this script's directory)


def read_batches(path):
    n = 0
    for batch in daqflow.open(path).batches(max_bytes=ex.DEFAULT_BATCH_BYTES, payload=True):
        n += batch.events
    return n


def export_once(path, fmt, payload, compression, out_dir):
    out = Path(out_dir) / f"bench.{fmt}"
    cmd = [sys.executable, "-m", "daqflow.export", str(path), "--to", fmt, "-o", str(out), "--overwrite", "--json",
           "--compression", compression]
    if payload:
        cmd.append("--payload")
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    done = json.loads(run.stdout)
    out.unlink()
    return done


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=tempfile.gettempdir())
    parser.add_argument("--csv")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    size = Path(args.file).stat().st_size
    rows = []

    def add(case, seconds, out_bytes="", rss=""):
        median = statistics.median(seconds)
        rows.append({"case": case, "median_s": median, "min_s": min(seconds), "max_s": max(seconds),
                     "mb_per_s": size / 1e6 / median, "out_mb": out_bytes, "peak_rss_mib": rss})

    add("read: File.batches (reference)", times(lambda: read_batches(args.file), args.runs))
    add("read: File.arrays()", times(lambda: daqflow.open(args.file).arrays(), args.runs))
    for fmt in ex.FORMATS:
        default = ex.COMPRESSIONS[fmt][0]
        for payload in (False, True):
            for compression in dict.fromkeys((default, "none")):
                done = [export_once(args.file, fmt, payload, compression, args.out) for _ in range(args.runs)]
                name = f"{fmt}{' + payload' if payload else ''}, {compression}"
                add(name, [d["seconds"] for d in done], f"{statistics.median(d['bytes_out'] for d in done) / 1e6:.1f}",
                    f"{max(d['peak_rss_bytes'] for d in done) / 2**20:.0f}")
    reference = rows[0]["median_s"]
    print(f"{args.file}: {size / 1e6:.1f} MB, medians of {args.runs}")
    print(f"{'case':34} {'median s':>9} {'min–max s':>13} {'MB/s':>7} {'÷ read':>7} {'out MB':>8} {'RSS MiB':>8}")
    for r in rows:
        r["ratio_to_read"] = reference / r["median_s"]
        print(f"{r['case']:34} {r['median_s']:9.2f} {r['min_s']:6.2f}–{r['max_s']:<6.2f} {r['mb_per_s']:7.0f} "
              f"{r['ratio_to_read']:7.2f} {r['out_mb']:>8} {r['peak_rss_mib']:>8}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
