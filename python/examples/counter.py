#!/usr/bin/env python3
"""The smallest daqflow component in Python: it counts in steps while a run is on.

    python3 counter.py --name c1 --set step=5     then type: configure, start 1, stats, stop, quit
"""

import threading
import time

import daqflow


class Counter(daqflow.Component):
    kind = "counter"

    def configure(self):
        self.step = int(self.config.get("step", 1))
        if self.step < 1:
            raise ValueError("step must be at least 1")
        self.count = 0
        return {"step": self.step}            # what the others may read: ${NAME.step}

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
