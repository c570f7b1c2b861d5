"""How fast a Python consumer takes events from a local ET system (issue 16: >= 1 M events/s at
64 B, batch 100), next to the Rust consumer `daqflow et consume` on the same system.

    python python/benches/et_consumer.py [--events 2000000] [--runs 5] [--size 64] [--batch 100]

An ET system runs in its own process (`daqflow et start`, the release binary if there is one:
`--daqflow PATH` or `$DAQFLOW_BIN` pick another; without any binary, a `daqflow.et.System` in
a helper process). A producer process (`daqflow et produce --size 64 --batch 100`; without a
binary, Python with batch calls only) fills a blocking station at the end of the chain as fast
as it can, at nice 10 (`--producer-nice`) so that on a machine with few cores the consumer
under test gets the CPU first; the consumer is this process, attached to that station, and the time is
that of its loop `get_events(batch)` -> touch every event -> `put_events(batch)` over
`--events` events. Each way of touching is measured `--runs` times; the medians are printed:
events per second of wall-clock time, and events per second of the consumer's CPU time (less
sensitive to other load on the machine; the consumer spins a little before it sleeps), with the
Rust consumer (`daqflow et consume --json`, its CPU time from `getrusage`) measured the same way
between them.

The ways of touching the events:
  len       `for e in batch: n += len(e)`          (an Event object per event)
  data      `for e in batch: n += e.data[0]`       (an Event and a memoryview per event)
  lengths   `n += int(batch.lengths().sum())`      (numpy, one call per batch)
  total     `n += batch.total_length()`            (one call per batch)
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import daqflow.et as et

REPO = Path(__file__).resolve().parents[2]

PRODUCER = r"""
import sys, daqflow.et as et
name, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
producer = et.connect(name).attach(et.GRAND_CENTRAL)
print("producing", flush=True)
try:
    while True:
        b = producer.new_events(batch, size)
        producer.put_events(b)
except (et.SystemDeadError, KeyboardInterrupt):
    pass
"""

SYSTEM = r"""
import sys, time, daqflow.et as et
with et.System(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])):
    print("ready", sys.argv[1], flush=True)
    sys.stdin.read()
"""


def daqflow_binary(given):
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for c in [given, os.environ.get("DAQFLOW_BIN"), target / "release" / "daqflow", target / "debug" / "daqflow"]:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def consume(attachment, events, batch, how):
    """Takes `events` events; returns the seconds the loop took, wall clock and CPU."""
    n = 0
    got = 0
    cpu = time.process_time()
    start = time.perf_counter()
    while got < events:
        b = attachment.get_events(batch)
        if how == "len":
            for e in b:
                n += len(e)
        elif how == "data":
            for e in b:
                n += e.data[0]
        elif how == "lengths":
            n += int(b.lengths().sum())
        else:
            n += b.total_length()
        got += len(b)
        attachment.put_events(b)
    return time.perf_counter() - start, time.process_time() - cpu


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=2_000_000, help="events per measurement")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--daqflow", help="the daqflow binary (default: $DAQFLOW_BIN, target/release, target/debug)")
    p.add_argument("--ways", default="len,data,lengths,total")
    p.add_argument("--producer-nice", type=int, default=10,
                   help="the producer's niceness: on a machine with few cores, the consumer under test "
                        "gets the CPU first (the producer is faster and waits for free events)")
    args = p.parse_args()

    name = f"etbench-{os.getpid()}"
    binary = daqflow_binary(args.daqflow)
    if binary:
        system = subprocess.Popen(
            [binary, "et", "start", "--name", name, "--events", "3000", "--event-size", str(max(args.size, 1024))],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    else:
        system = subprocess.Popen([sys.executable, "-c", SYSTEM, name, "3000", str(max(args.size, 1024))],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    producer = None
    try:
        assert system.stdout.readline().startswith("ready"), "the ET system did not start"
        client = et.connect(name)
        client.create_station("bench")
        consumer = client.attach("bench")
        if binary:
            producer = subprocess.Popen(
                [binary, "et", "produce", "--name", name, "--size", str(args.size), "--batch", str(args.batch)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(args.producer_nice))
        else:
            producer = subprocess.Popen([sys.executable, "-c", PRODUCER, name, str(args.size), str(args.batch)],
                                        stdout=subprocess.PIPE, text=True,
                                        preexec_fn=lambda: os.nice(args.producer_nice))
            assert producer.stdout.readline().startswith("producing")
        consume(consumer, args.events // 10, args.batch, "len")  # warm up
        rates = {way: [] for way in args.ways.split(",")}
        cpu_rates = {way: [] for way in args.ways.split(",")}
        if binary:
            rates["rust"] = []
            cpu_rates["rust"] = []
        for _ in range(args.runs):
            for way in rates:
                if way == "rust":
                    consumer.detach()
                    before = resource.getrusage(resource.RUSAGE_CHILDREN)
                    out = subprocess.run(
                        [binary, "et", "consume", "--name", name, "--station", "bench", "--count",
                         str(args.events), "--batch", str(args.batch), "--json"],
                        capture_output=True, text=True, check=True).stdout
                    line = [x for x in out.splitlines() if x.startswith("{")][-1]
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                    rates[way].append(json.loads(line)["events_per_s"])
                    cpu_rates[way].append(args.events / cpu)
                    consumer = client.attach("bench")
                else:
                    wall, cpu = consume(consumer, args.events, args.batch, way)
                    rates[way].append(args.events / wall)
                    cpu_rates[way].append(args.events / cpu)
        print(f"ET consumer, local, {args.size} B events, batch {args.batch}, {args.events} events per run, "
              f"median of {args.runs} (system: {binary or 'daqflow.et.System'})")
        for way, r in rates.items():
            label = "Rust `daqflow et consume`" if way == "rust" else f"Python, {way}"
            print(f"  {label:28} {statistics.median(r) / 1e6:6.2f} M events/s "
                  f"{statistics.median(cpu_rates[way]) / 1e6:6.2f} M events/CPU s   "
                  f"(runs: {', '.join(f'{x / 1e6:.2f}' for x in r)})")
        consumer.detach()
    finally:
        if producer:
            producer.terminate()
            producer.wait()
        if binary:
            system.terminate()
        else:
            system.stdin.close()
        system.wait()


if __name__ == "__main__":
    main()
