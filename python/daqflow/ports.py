"""Chain components with named, typed ports written in Python: subclass :class:`PortComponent`.

DAQ-Middleware's component model: you write only what happens to each chunk of data. The
class declares its input and output ports (:class:`InPort`, :class:`OutPort`, each with an
optional data type); daqflow binds one listening address per input at ``configure`` (given to
the others as ``${NAME.PORT}``, and ``${NAME.listen}`` for the first), connects each output to
its ``downstream.PORT`` at ``start``, speaks the chain's stream protocol (begin and end
markers, numbered chunks with their CRC32C; docs/chain.md), joins the end markers of several
inputs and splits a stream onto several outputs, and drives the state machine: the same code
as the Rust components of ``daqflow_chain::ports``. Each input is received by a thread of its
own; the hooks run on one thread, one chunk at a time, in each input's order.

Example (``python/examples/threshold.py``)::

    import daqflow

    class Threshold(daqflow.PortComponent):
        kind = "threshold"
        inputs = [daqflow.InPort("raw", "adc")]
        outputs = [daqflow.OutPort("accepted", "adc"), daqflow.OutPort("rejected", "adc")]
        parameters = [daqflow.Parameter("threshold", int, min=0, max=65535, default=0,
                                        doc="Chunks whose first sample is at least this are accepted.")]

        def begin(self, run):
            self.accepted = self.rejected = 0

        def on_chunk(self, input, data, out):          # data: a memoryview, no copy
            first = int.from_bytes(data[:2], "little")
            if first >= self.config["threshold"]:
                self.accepted += 1
                out.send("accepted", data)
            else:
                self.rejected += 1
                out.send("rejected", data)

        def detail(self):
            return {"accepted": self.accepted, "rejected": self.rejected}

    if __name__ == "__main__":
        Threshold.main()

In a system file: ``command = ["python3", "threshold.py"]`` with ``downstream.accepted`` and
``downstream.rejected`` in its ``params``; its input's address is ``${NAME.raw}``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _native
from .component import Component, Parameter

__all__ = ["InPort", "OutPort", "PortComponent"]


class _Port:
    def __init__(self, name: str, data_type: Optional[str] = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a port's name is a word, not {name!r}")
        if data_type is not None and (not isinstance(data_type, str) or not data_type):
            raise ValueError(f"port {name!r}: its data type is a word or None, not {data_type!r}")
        self.name, self.data_type = name, data_type

    def _pair(self) -> Tuple[str, Optional[str]]:
        return (self.name, self.data_type)

    def __repr__(self) -> str:
        typed = f", {self.data_type!r}" if self.data_type is not None else ""
        return f"{type(self).__name__}({self.name!r}{typed})"


class InPort(_Port):
    """An input port: its ``name`` (the key of ``listen.NAME`` and of its address in the
    configure answer, ``${COMPONENT.NAME}``) and the ``data_type`` it takes (a stream whose
    begin marker names another type is refused; an untyped one is taken). ``None``: any."""


class OutPort(_Port):
    """An output port: its ``name`` (the key of ``downstream.NAME``, required) and the
    ``data_type`` its begin marker names (``None``: untyped)."""


class PortComponent(Component):
    """A chain component with named ports written in Python. Subclass it, declare
    :attr:`inputs` and :attr:`outputs`, and override :meth:`on_chunk` (and :meth:`begin`,
    :meth:`end`, :meth:`detail` if you need them).

    Class attributes:

    - ``kind``: the kind's name (a system file's ``kind``).
    - ``inputs``: a list of :class:`InPort`, at least one.
    - ``outputs``: a list of :class:`OutPort` (none for a component that ends the chain).
    - ``parameters``: its own configuration keys, a list of :class:`daqflow.Parameter`; the
      port keys (``listen.PORT``, ``downstream.PORT``, ``connect_timeout_ms``,
      ``stop_timeout_ms``, ``send_queue_bytes``) are daqflow's and are added to its schema.
      ``None``: any own key is taken.

    :attr:`config` holds the component's own keys (the port keys are not in it). The role is
    ``other`` (outside the event accounting); its statistics count the chunks received on all
    inputs, with each port's chunks, bytes and end marker and :meth:`detail` in ``detail``.
    An exception in a hook fails the component with its text (Error; the operator applies its
    policy).
    """

    kind: str = "python_ports"
    inputs: Sequence[InPort] = ()
    outputs: Sequence[OutPort] = ()

    # The hooks. ---------------------------------------------------------------------------

    def begin(self, run: int) -> None:
        """A run begins, before its first chunk."""

    def on_chunk(self, input: str, data: memoryview, out: Any) -> None:
        """A chunk arrived on input port ``input``: ``data`` is a read-only ``memoryview`` of
        its bytes (valid while you keep it; ``bytes(data)`` copies). ``out.send(PORT, DATA)``
        sends a chunk (any bytes-like object) on an output port, waiting while its queue is
        full; ``out`` is lent for this call only."""
        raise NotImplementedError(f"{type(self).__name__}.on_chunk")

    def end(self, out: Any) -> None:
        """Every input has ended (their end markers are joined here): send what is left; the
        outputs' end markers go out after this returns."""

    def detail(self) -> Optional[Dict[str, Any]]:
        """Figures of your own, in the statistics' ``detail.logic`` (a JSON-able dict)."""
        return None

    # What the process loop calls. ---------------------------------------------------------

    def _df_begin(self, run: int) -> None:
        self.begin(run)

    def _df_on_chunk(self, input: str, data: memoryview, out: Any) -> None:
        self.on_chunk(input, data, out)

    def _df_end(self, out: Any) -> None:
        self.end(out)

    def _df_detail(self) -> Optional[str]:
        d = self.detail()
        return None if d is None else json.dumps(d)

    @classmethod
    def _df_ports(cls) -> Tuple[List[Tuple[str, Optional[str]]], List[Tuple[str, Optional[str]]]]:
        for p in cls.inputs:
            if not isinstance(p, InPort):
                raise TypeError(f"{cls.__name__}.inputs holds daqflow.InPort, not {type(p).__name__}")
        for p in cls.outputs:
            if not isinstance(p, OutPort):
                raise TypeError(f"{cls.__name__}.outputs holds daqflow.OutPort, not {type(p).__name__}")
        return [p._pair() for p in cls.inputs], [p._pair() for p in cls.outputs]

    @classmethod
    def _df_schema(cls) -> Optional[str]:
        if cls.parameters is None:
            return None
        for p in cls.parameters:
            if not isinstance(p, Parameter):
                raise TypeError(f"{cls.__name__}.parameters holds daqflow.Parameter, not {type(p).__name__}")
        # What configure answers (the ports' addresses) is daqflow's.
        return json.dumps({"parameters": [p._json() for p in cls.parameters], "outputs": []})

    @classmethod
    def _df_run(cls, factory: Any, kind: str, process: Dict[str, Any]) -> bool:
        inputs, outputs = cls._df_ports()
        return _native._run_port_component(
            factory, kind=kind, inputs=inputs, outputs=outputs, process=process, schema=cls._df_schema()
        )
