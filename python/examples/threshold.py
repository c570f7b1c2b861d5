"""A chain component with named, typed ports written in Python (docs/python.md, "Chain
components with ports"): it takes ADC chunks on its input ``raw`` and passes those whose first
sample (a little-endian 16-bit number) is at least ``threshold`` to its output ``accepted``,
the others to ``rejected``. The same component as the Rust example
``crates/chain/examples/threshold.rs``; the ports, their connections, the stream protocol, the
end markers and the state machine are daqflow's, this file is the logic.

In a system file, fed by a generator or a dispatcher::

    [[component]]
    name = "cut"
    kind = "threshold"
    command = ["python3", "python/examples/threshold.py"]
    [component.params]
    threshold = 512
    downstream.accepted = "${log.listen}"
    downstream.rejected = "${sink.listen}"
    # its input's address is ${cut.raw} (or ${cut.listen}), for the upstream's `downstream`

or by hand: ``python3 threshold.py --name cut --set threshold=512 --set
downstream.accepted=127.0.0.1:7300 --set downstream.rejected=127.0.0.1:7301``, then type
``configure``, ``start 1``, ``stats``, ``stop``, ``quit``.
"""

import daqflow


class Threshold(daqflow.PortComponent):
    kind = "threshold"
    inputs = [daqflow.InPort("raw", "adc")]
    outputs = [daqflow.OutPort("accepted", "adc"), daqflow.OutPort("rejected", "adc")]
    parameters = [
        daqflow.Parameter("threshold", int, min=0, max=65535, default=0,
                          doc="Chunks whose first sample is at least this are accepted."),
    ]

    def begin(self, run):
        self.accepted = self.rejected = 0

    def on_chunk(self, input, data, out):
        first = int.from_bytes(data[:2], "little")
        if first >= self.config["threshold"]:
            self.accepted += 1
            out.send("accepted", data)
        else:
            self.rejected += 1
            out.send("rejected", data)

    def detail(self):
        return {"accepted": getattr(self, "accepted", 0), "rejected": getattr(self, "rejected", 0)}


if __name__ == "__main__":
    Threshold.main()
