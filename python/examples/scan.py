#!/usr/bin/env python3
"""A scan: five short runs, each with one parameter changed, driven through the operator's
HTTP API (the operator runs: ``daqflow demo`` or ``daqflow run system.toml``).

    python3 scan.py http://127.0.0.1:8080 --data daqflow-demo \\
        --set src-0.rate_hz --values 500 1000 1500 2000 2500 --seconds 2

For each value: reset, set the parameter, configure, take a run of --seconds (or --events),
stop; then print one line per run from the run database.
"""

import argparse
import json

import daqflow


def scan(url, data, parameter, values, seconds=None, events=None):
    """Takes one run per value of ``parameter`` (``COMPONENT.KEY``); returns their summaries."""
    component, key = parameter.split(".", 1)
    summaries = []
    with daqflow.Operator(url, data=data) as op:
        if op.state() != "Initial":
            if op.status()["running"]:
                op.stop()
            op.reset()
        try:
            for value in values:
                op.set(component, key, value)
                op.configure()
                summary = op.take_run(seconds=seconds, events=events)
                summaries.append(summary)
                print(f"run {summary['run']}: {parameter} = {value}: {summary['events']} events, "
                      f"{summary['recorded']} recorded, {summary['lost']} lost in {summary['seconds']:.1f} s",
                      flush=True)
                op.reset()
        finally:
            if op.state() == "Initial":
                op.unset(component, key)   # the system file's value again
        # The same runs as the run database keeps them.
        for record in reversed(op.runs(limit=len(values))):
            detail = op.run(record["run"])
            print(json.dumps({"run": record["run"], "state": record["state"], "events": record["events"],
                              "lost": record["lost"], "overrides": detail["summary"]["overrides"]}))
    return summaries


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the operator's web address, http://HOST:PORT")
    p.add_argument("--data", default="daqflow-demo", help="the operator's data directory (for its web-token)")
    p.add_argument("--set", dest="parameter", default="src-0.rate_hz", help="COMPONENT.KEY to scan")
    p.add_argument("--values", nargs="+", type=json.loads, default=[500, 1000, 1500, 2000, 2500],
                   help="the values, as JSON (numbers, strings in quotes)")
    p.add_argument("--seconds", type=float, help="length of each run")
    p.add_argument("--events", type=int, help="or: events to build in each run")
    args = p.parse_args()
    if args.seconds is None and args.events is None:
        args.seconds = 2.0
    scan(args.url, args.data, args.parameter, args.values, seconds=args.seconds, events=args.events)


if __name__ == "__main__":
    main()
