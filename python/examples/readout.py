#!/usr/bin/env python3
"""A readout written in Python: a daqflow source that sends fragments to a readout unit.

It takes the place of an emulated source (``kind = "source"``) in a system file::

    [[component]]
    name = "src-3"
    kind = "source"                       # counted as a readout in the run's accounting
    command = ["python3", "python/examples/readout.py"]
    stop_arg = "${evm.last_event}"        # send up to the trigger's last event, then end
    [component.params]
    source_id = 3
    ru = "${ru-1.listen}"
    rate_hz = 2000.0                      # 0: as fast as the RU takes them
    size = 1024                           # payload bytes per fragment

Its "detector" is a counter: each payload starts with the event id and the source id
(two little-endian u64), then a pattern, so that a reader can check what it got. Replace
``read_detector`` with your hardware's readout.
"""

import struct
import threading
import time

import daqflow


class Readout(daqflow.Component):
    kind = "source"
    role = "readout"

    def configure(self):
        c = self.config
        try:
            self.ru = str(c["ru"])
            self.source_id = int(c["source_id"])
        except KeyError as e:
            raise ValueError(f"missing parameter {e.args[0]} (ru and source_id are required)") from None
        self.rate_hz = float(c.get("rate_hz", 1000.0))
        self.size = int(c.get("size", 1024))
        self.trigger_type = int(c.get("trigger_type", 1))
        if self.rate_hz < 0 or self.size < 16:
            raise ValueError("rate_hz must be 0 or more and size at least 16 bytes")
        self.pattern = bytes(range(256)) * (self.size // 256 + 1)
        self.stream = None
        self.thread = None
        return {"mean_bytes": self.size}

    def read_detector(self, event_id):
        """One fragment's payload: what the hardware would give for this event."""
        return struct.pack("<QQ", event_id, self.source_id) + self.pattern[: self.size - 16]

    def start(self, run):
        self.stream = daqflow.SourceStream(self.ru, self.source_id, run, name=self.name)
        self.stop_at = None        # None: until told; else the last event to send
        self.paused = threading.Event()
        self.abandon = threading.Event()
        self.thread = threading.Thread(target=self.loop, name=f"{self.name}-readout", daemon=True)
        self.thread.start()

    def loop(self):
        stream = self.stream
        t0, n0 = time.monotonic(), 0
        try:
            while not self.abandon.is_set():
                next_id = stream.next_event
                if self.stop_at is not None and next_id > self.stop_at:
                    break
                if self.paused.is_set() and self.stop_at is None:
                    stream.flush()
                    time.sleep(0.002)
                    t0, n0 = time.monotonic(), next_id
                    continue
                if self.rate_hz > 0 and self.stop_at is None:
                    due = t0 + (next_id - n0) / self.rate_hz
                    wait = due - time.monotonic()
                    if wait > 0:
                        stream.flush()           # what is queued goes out before we wait
                        time.sleep(min(wait, 0.005))
                        continue
                stream.send(self.read_detector(next_id), trigger_type=self.trigger_type)
            stream.end()
        except daqflow.Error as e:
            self.fail(f"readout: {e}")

    def stop(self, last_event):
        if self.thread is None:
            raise RuntimeError("not running")
        # Send up to the trigger's last event (or stop where we are), then end the stream.
        self.stop_at = last_event if last_event is not None else self.stream.last_event
        self.thread.join(timeout=30)
        if self.thread.is_alive():
            self.abandon.set()
            self.thread.join()
            self.fail(f"the RU did not take events up to {self.stop_at} within 30 s")
        self.thread = None
        return self.stats()

    def pause(self):
        self.paused.set()

    def resume(self):
        self.paused.clear()

    def reset(self):
        if self.thread is not None:
            self.abandon.set()
            self.thread.join()
            self.thread = None

    def stats(self):
        s = getattr(self, "stream", None)
        if s is None:
            return {"events": 0, "bytes": 0}
        return {"events": s.last_event, "bytes": s.bytes,
                "detail": {"source_id": self.source_id, "last_event": s.last_event}}


if __name__ == "__main__":
    Readout.main()
