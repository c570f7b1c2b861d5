#!/usr/bin/env python3
"""The smallest daqflow component in Python: it counts in steps while a run is on.

    python3 counter.py --name c1 --set step=5     then type: configure, start 1, stats, set step=7, stop, quit

Its parameter `step` is declared with its type, range and doc, and live: it may change while
the run goes on (`set c1.step=7` from the operator's console, the web UI's Parameters form, or
`set step=7` on its standard input); a value out of range or a misspelt key is refused before
the component sees it.
"""

import threading
import time

import daqflow


class Counter(daqflow.Component):
    kind = "counter"
    parameters = [
        daqflow.Parameter("step", int, min=1, max=1000, default=1, live=daqflow.STATES_CONFIGURED,
                          doc="How much the count grows each millisecond."),
    ]
    outputs = [daqflow.Parameter("step", int, doc="The step it counts in.")]

    def configure(self):
        self.step = self.config["step"]       # checked against the parameter, default filled in
        self.count = 0
        return {"step": self.step}            # what the others may read: ${NAME.step}

    def set(self, key, value):                # a live parameter (only `step` is live)
        super().set(key, value)
        self.step = value
        self.log.info("counting in steps of %d from now on", value)

    def start(self, run):
        self.count = 0
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()
        self.log.info("run %d: counting in steps of %d", run, self.step)

    def loop(self):
        while self.running.is_set():
            self.count += self.step
            time.sleep(0.001)

    def stop(self, last_event):
        self.running.clear()
        self.thread.join()
        return {"events": self.count}         # the run's summary

    def stats(self):
        return {"events": getattr(self, "count", 0)}


if __name__ == "__main__":
    Counter.main()
