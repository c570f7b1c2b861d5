"""A detector monitor in Python: the demo's `detector` monitor (the `adc_monitor` kind, written
in Rust) written again as a user's Python component (docs/histograms.md).

It takes built events from the ET system through a non-blocking station of its own (it never
slows the data), decodes the sources' `adc` payloads (8-byte hits: channel, ADC counts, time;
docs/evb.md, "The `adc` payload") with numpy, and fills its histograms: the web UI shows them
live, they are emptied when a run starts and saved with the run when it stops. In a system file,
next to the demo's components (`daqflow demo --print-config`)::

    [[component]]
    name = "py-detector"
    kind = "adc_monitor_py"
    command = ["python3", "python/examples/adc_monitor.py"]
    [component.params]
    et = "${et.et}"
    channels = 32
"""

import threading

import numpy as np

import daqflow
import daqflow.et as et

HIT = np.dtype([("channel", "<u2"), ("adc", "<u2"), ("time_ns", "<u4")])


class AdcMonitor(daqflow.Component):
    kind = "adc_monitor_py"
    parameters = [
        daqflow.Parameter("et", str, required=True, doc="The ET system's name."),
        daqflow.Parameter("station", str, doc="Its station; default: the component's name."),
        daqflow.Parameter("channels", int, min=1, max=65536, default=32, doc="Channels on the channel axis."),
        daqflow.Parameter("spectra", int, min=0, max=256, default=4, doc="Channels with an ADC spectrum of their own."),
    ]

    def configure(self):
        self.station = self.config.get("station") or self.name
        client = et.connect(self.config["et"])
        try:
            client.create_station(self.station, blocking=False, cue=200)
        except et.StationExistsError:
            pass  # made by this monitor before (a restart): take it as it is
        return {"station": self.station}

    def start(self, run):
        self.events = 0
        self.stopping = threading.Event()
        self.client = et.connect(self.config["et"])
        self.attachment = self.client.attach(self.station)
        self.thread = threading.Thread(target=self.read, name="fill", daemon=True)
        self.thread.start()

    def read(self):
        try:
            while not self.stopping.is_set():
                try:
                    batch = self.attachment.get_events(64, wait=0.1)
                except et.TimedOutError:
                    continue
                try:
                    for event in batch:
                        self.fill(daqflow.decode_event(event.data))
                finally:
                    self.attachment.put_events(batch)
        except Exception as e:  # the run goes on without histograms: say why and fail
            self.fail(f"reading ET: {e}")

    def fill(self, event):
        hits = np.concatenate([np.frombuffer(f.payload, dtype=np.uint8)[: len(f) // 8 * 8].view(HIT)
                               for f in event.fragments] or [np.zeros(0, HIT)])
        n = int(self.config["channels"])
        h = self.histograms
        h.h2("adc_vs_channel", "ADC counts by channel", ("channel", 0, n, n), ("ADC counts", 0, 4096, 64)).fill(
            hits["channel"], hits["adc"])
        h.h2("time_vs_channel", "Hit time by channel", ("channel", 0, n, n), ("time (ns)", 0, 500, 50)).fill(
            hits["channel"], hits["time_ns"])
        for c in range(int(self.config["spectra"])):
            h.h1(f"adc_ch{c}", f"ADC spectrum, channel {c}", "ADC counts", 0, 4096, 128).fill(
                hits["adc"][hits["channel"] == c])
        h.h1("hits_per_event", "Hits per event", "hits", 0, 2048, 64).fill(len(hits))
        h.counter("hits", "Hits", "hits").add(len(hits))
        self.events += 1

    def stop(self, last_event):
        self.stopping.set()
        self.thread.join()
        self.attachment.detach()
        self.client = None  # the connection ends with the client object
        return self.stats()

    def stats(self):
        return {"events": getattr(self, "events", 0)}


if __name__ == "__main__":
    AdcMonitor.main()
