"""Components written in Python: subclass :class:`Component`, run it with :meth:`Component.main`.

A component is one process of a daqflow system (a readout, a monitor, a slow-control reader).
The operator drives it through the run-control state machine::

    Initial --configure--> Configured --start--> Running --pause--> Paused
       ^                       ^                    |  <--resume--    |
       +--------reset----------+-------stop---------+-----------------+

Write only the hooks you need; :meth:`Component.main` runs the class as a whole daqflow
component process, exactly as ``daqflow component KIND`` runs a built-in kind: the same line
commands on standard input, the same control-plane protocol (``NAME/configure`` …, ``NAME/state``,
``NAME/stats``, ``NAME/log``), the system token, the lease and the operator's lock. The
process loop is daqflow's own (Rust), so a Python component behaves like any other.

Example (``python/examples/counter.py``)::

    import daqflow

    class Counter(daqflow.Component):
        kind = "counter"

        def configure(self):
            self.step = int(self.config.get("step", 1))
            return {"step": self.step}        # what the others may read: ${NAME.step}

        def start(self, run):
            self.count = 0

        def stop(self, last_event):
            return {"events": self.count}     # the run's summary

        def stats(self):
            return {"events": getattr(self, "count", 0)}

    if __name__ == "__main__":
        Counter.main()

Run it by hand (``python3 counter.py --name c1``, then type ``configure``, ``start 1``,
``stop``), with ``daqflow component --command "python3 counter.py" --name c1``, or from a
system file with ``command = ["python3", "counter.py"]`` (docs/python.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

from . import _native
from .histograms import Histograms

__all__ = ["Component", "Parameter", "ROLES", "STATES_CONFIGURED"]

#: How a component's counters enter the run's accounting (docs/operator-guide.md).
ROLES = ("trigger", "readout", "builder", "buffer", "recorder", "other")

_STATS_KEYS = ("events", "bytes", "events_per_s", "mb_per_s", "detail", "slow")
_SLOW_KEYS = ("value", "unit", "severity", "status", "at_ms")

#: Every state a configured component can be in: a parameter live in all of them.
STATES_CONFIGURED = ("Configured", "Running", "Paused")

_TYPES = {bool: "bool", int: "integer", float: "float", str: "text", "address": "address", "path": "path",
          list: "list", dict: "table"}
_INT_RANGE = (-(2**63), 2**63 - 1)


class Parameter:
    """One configuration key of a Python component: its type, range, unit, default, the states
    in which it may change live, and what it means. The same typed schema as a built-in kind's
    (``daqflow component KIND --schema``): every value, from the system file, ``--set``, the
    operator's ``set`` or the web UI's Parameters form, is checked by it before the component
    sees it, and a misspelt key is named with the one it was probably meant to be.

    ``type`` is ``bool``, ``int``, ``float``, ``str``, ``"address"`` (``HOST:PORT``), ``"path"``,
    ``list`` (a list of texts), ``dict`` (a table the component checks itself), or a list of the
    words it may be (a choice). ``live`` lists the states in which the key may
    change after configure (some of :data:`STATES_CONFIGURED`); the component's :meth:`Component.set`
    then applies it. ::

        parameters = [
            daqflow.Parameter("channel", int, min=0, max=63, required=True, doc="The supply's channel."),
            daqflow.Parameter("volts", float, min=0, max=2000, default=0.0, unit="V",
                              live=("Configured", "Paused"), doc="The set point."),
        ]
    """

    def __init__(
        self,
        name: str,
        type: Any,
        *,
        doc: str,
        min: Optional[float] = None,
        max: Optional[float] = None,
        unit: Optional[str] = None,
        default: Any = None,
        required: bool = False,
        live: Sequence[str] = (),
    ):
        if not isinstance(name, str) or not name or any(not p for p in name.split(".")):
            raise ValueError(f"parameter name {name!r}: a key, dotted for a nested one")
        if not isinstance(doc, str) or not doc.strip():
            raise ValueError(f"parameter {name!r}: doc, one line saying what it means, is required")
        bad_states = [s for s in live if s not in STATES_CONFIGURED]
        if bad_states:
            raise ValueError(f"parameter {name!r}: live states {bad_states}: some of {', '.join(STATES_CONFIGURED)}")
        self.name, self.doc, self.unit, self.default, self.required = name, doc, unit, default, bool(required)
        self.live = tuple(live)
        if isinstance(type, (list, tuple)):
            if not type or not all(isinstance(v, str) for v in type):
                raise ValueError(f"parameter {name!r}: a choice is a list of words")
            self._type: Dict[str, Any] = {"type": "choice", "values": list(type)}
        elif type in _TYPES:
            kind = _TYPES[type]
            self._type = {"type": kind}
            if kind == "list":
                self._type["of"] = {"type": "text"}
            if kind == "integer":
                lo, hi = (_INT_RANGE[0] if min is None else int(min)), (_INT_RANGE[1] if max is None else int(max))
                self._type.update(min=lo, max=hi)
            elif kind == "float":
                lo, hi = (-1.7976931348623157e308 if min is None else float(min)), (1.7976931348623157e308 if max is None else float(max))
                self._type.update(min=lo, max=hi)
            elif min is not None or max is not None:
                raise ValueError(f"parameter {name!r}: min and max are for int and float parameters")
        else:
            raise ValueError(f"parameter {name!r}: type {type!r}: bool, int, float, str, 'address', 'path', list (of "
                             "texts), dict (a table the component checks) or a list of words")
        if self._type.get("min") is not None and self._type["min"] > self._type["max"]:
            raise ValueError(f"parameter {name!r}: min {min} is above max {max}")

    def _json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"name": self.name, **self._type, "required": self.required, "live": list(self.live), "doc": self.doc}
        if self.unit is not None:
            out["unit"] = self.unit
        if self.default is not None:
            out["default"] = self.default
        return out

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, {self._type['type']})"


class _DaqflowLogHandler(logging.Handler):
    """Sends Python log records to the process's daqflow log (standard error and ``NAME/log``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = record.levelname.lower()
            _native._log(level, self.format(record))
        except Exception:  # a log record must never fail the component
            self.handleError(record)


def _stats_json(value: Any, what: str) -> Optional[str]:
    """A hook's statistics (a mapping with ``events``, ``bytes``, … or None) as JSON."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must return a dict such as {{'events': 10, 'bytes': 4096}}, not {type(value).__name__}")
    unknown = sorted(set(value) - set(_STATS_KEYS))
    if unknown:
        raise ValueError(
            f"{what}: unknown statistics {', '.join(unknown)} (events, bytes, events_per_s, mb_per_s, "
            "detail: a dict of your own figures, and slow: your slow values by name)"
        )
    out: Dict[str, Any] = {}
    for key in ("events", "bytes"):
        if key in value:
            n = int(value[key])
            if n < 0:
                raise ValueError(f"{what}: {key} must not be negative")
            out[key] = n
    for key in ("events_per_s", "mb_per_s"):
        if key in value:
            out[key] = float(value[key])
    if value.get("detail") is not None:
        out["detail"] = value["detail"]
    if value.get("slow"):
        out["slow"] = _slow_values(value["slow"], what)
    return json.dumps(out)


def slow_name_ok(name: Any) -> bool:
    """Whether ``name`` may name a slow value (the Rust ``SlowValue::name_ok``): 1 … 200
    characters, no white space, none of ``< > = ! , "``, not a counter's own key."""
    return (isinstance(name, str) and 0 < len(name) <= 200 and not any(c.isspace() or c in '<>=!,"' for c in name)
            and name not in ("events", "bytes", "events_per_s", "mb_per_s", "trigger", "detail")
            and not name.startswith(("trigger.", "detail.")))


def _slow_values(slow: Any, what: str) -> Dict[str, Any]:
    """``stats()["slow"]`` checked: ``{NAME: {"value": number or None, "unit", "severity",
    "status", "at_ms"}}`` (a bare number is ``{"value": number}``)."""
    if not isinstance(slow, Mapping):
        raise TypeError(f"{what}: slow must be a dict of slow values by name, not {type(slow).__name__}")
    out: Dict[str, Any] = {}
    for name, v in slow.items():
        if not slow_name_ok(name):
            raise ValueError(f"{what}: {name!r} cannot name a slow value (1 … 200 characters, no white space, "
                             "none of < > = ! , \", not a counter's own key)")
        if not isinstance(v, Mapping):
            v = {"value": v}
        unknown = sorted(set(v) - set(_SLOW_KEYS))
        if unknown:
            raise ValueError(f"{what}: slow value {name!r}: unknown keys {', '.join(unknown)} ({', '.join(_SLOW_KEYS)})")
        one: Dict[str, Any] = {}
        number = v.get("value")
        if number is not None:
            number = float(number)
            # JSON has no NaN: a value that is not finite is no value.
            one["value"] = number if number == number and abs(number) != float("inf") else None
        else:
            one["value"] = None
        if v.get("unit") is not None:
            one["unit"] = str(v["unit"])
        if v.get("severity") is not None:
            severity = int(v["severity"])
            if not 0 <= severity <= 3:
                raise ValueError(f"{what}: slow value {name!r}: severity {severity} is not 0 … 3")
            one["severity"] = severity
        if v.get("status") is not None:
            one["status"] = str(v["status"])
        if v.get("at_ms") is not None:
            one["at_ms"] = int(v["at_ms"])
        out[name] = one
    return out


class Component:
    """A daqflow component written in Python. Subclass it and override the hooks you need.

    Every hook runs with the configuration in :attr:`config` (a dict: the system file's
    ``params`` for this component, with references resolved, or ``--config`` and ``--set``).
    A hook that raises fails its transition: the component goes to Error with the exception's
    text, as a built-in component would; ``reset`` brings it back to Initial.

    The object is made anew at every configure (from the configuration merged with the
    operator's), so a component starts each configuration from a clean state.

    Class attributes:

    - ``kind``: the kind's name (``"python"`` by default; a system file's ``kind``).
    - ``role``: how its counters enter the run's accounting: ``"readout"`` for a source of
      fragments, ``"other"`` (the default) for anything outside the event accounting; see
      :data:`ROLES`.
    - ``parameters``: its configuration keys, a list of :class:`Parameter` (their typed schema:
      checked before the component sees a value; defaults filled into :attr:`config`; those
      declared ``live`` may change after configure through :meth:`set`). ``None`` (the
      default): any key is taken and none is live.
    - ``outputs``: what :meth:`configure` returns, a list of :class:`Parameter` (for ``daqflow
      run --check`` of the ``${NAME.KEY}`` that name it).
    """

    kind: str = "python"
    role: str = "other"
    parameters: Optional[Sequence[Parameter]] = None
    outputs: Sequence[Parameter] = ()

    def __init__(self, name: str, config: Dict[str, Any]):
        #: The component's name, unique in the system.
        self.name = name
        #: Its configuration.
        self.config = config
        #: A :class:`logging.Logger` whose records go to the process's daqflow log (standard
        #: error, and at info and above the ``NAME/log`` service the message logger stores).
        self.log = logging.getLogger(f"daqflow.component.{name}")
        #: Its histograms and counters (:class:`daqflow.histograms.Histograms`): emptied when a
        #: run starts, published with :meth:`stats` (``detail.histograms``) and drawn by the web
        #: UI. Book and fill them from your hooks or your own threads.
        self.histograms = Histograms()
        self._failure: Optional[str] = None
        self._failure_lock = threading.Lock()

    # The hooks. ---------------------------------------------------------------------------

    def configure(self) -> Optional[Dict[str, Any]]:
        """Initial → Configured: check :attr:`config`, open what the runs need. Return what
        the other components may need to know (a JSON-able dict, e.g. ``{"listen": "…"}``;
        the operator substitutes ``${NAME.KEY}`` with it), or None."""
        return None

    def start(self, run: int) -> None:
        """Configured → Running: take run ``run``. Start your readout thread here."""

    def stop(self, last_event: Optional[int]) -> Optional[Dict[str, Any]]:
        """Running or Paused → Configured: end the run and return its summary (the same keys
        as :meth:`stats`; by default :meth:`stats` itself). A source sends up to event
        ``last_event`` first (the operator passes the trigger's last event)."""
        return self.stats()

    def pause(self) -> None:
        """Running → Paused."""

    def resume(self) -> None:
        """Paused → Running."""

    def reset(self) -> None:
        """Any state → Initial: stop whatever runs, release everything."""

    def set(self, key: str, value: Any) -> None:
        """A live parameter changes (a key of :attr:`parameters` declared ``live``, in one of
        its states, with a value already checked against its type and range). The default
        puts it into :attr:`config`; override it to apply the value (and call ``super().set``
        or update :attr:`config` yourself). Raising refuses the change with the exception's
        text; nothing changes."""
        self.config[key] = value

    def stats(self) -> Dict[str, Any]:
        """The live counters, published in ``NAME/stats`` once a second: ``events`` and
        ``bytes`` handled in the run (in the sense of :attr:`role`), optionally
        ``events_per_s`` and ``mb_per_s`` (computed from the counters when absent) and
        ``detail``, a dict of the component's own figures."""
        return {}

    # Failing during a run. ----------------------------------------------------------------

    def fail(self, why: str) -> None:
        """Reports that the component failed during the run (e.g. from its readout thread):
        its state becomes Error, with ``why``, and the operator applies its policy."""
        with self._failure_lock:
            if self._failure is None:
                self._failure = str(why) or "failed"
        self.log.error("%s", why)

    def failure(self) -> Optional[str]:
        """Why the component failed during the run, if it did (see :meth:`fail`)."""
        with self._failure_lock:
            return self._failure

    # What the process loop calls (JSON in and out). ----------------------------------------

    def _df_configure(self) -> Optional[str]:
        info = self.configure()
        if info is None:
            return None
        if not isinstance(info, Mapping):
            raise TypeError(f"configure() must return a dict or None, not {type(info).__name__}")
        return json.dumps(dict(info))

    def _df_start(self, run: int) -> None:
        with self._failure_lock:
            self._failure = None
        self.histograms.reset()
        self.start(run)

    def _with_histograms(self, value: Any) -> Any:
        """``value`` (the hook's statistics) with :attr:`histograms` in its ``detail``, unless
        nothing is booked or the hook published histograms of its own."""
        if not len(self.histograms) or not isinstance(value, Mapping):
            return value
        detail = value.get("detail")
        if detail is None:
            detail = {}
        if not isinstance(detail, Mapping) or "histograms" in detail:
            return value
        return dict(value, detail=dict(detail, histograms=self.histograms.to_json()))

    def _df_stop(self, last_event: Optional[int]) -> Optional[str]:
        return _stats_json(self._with_histograms(self.stop(last_event)), "stop()")

    def _df_pause(self) -> None:
        self.pause()

    def _df_resume(self) -> None:
        self.resume()

    def _df_reset(self) -> None:
        self.reset()

    def _df_stats(self) -> Optional[str]:
        return _stats_json(self._with_histograms(self.stats()), "stats()")

    def _df_failure(self) -> Optional[str]:
        return self.failure()

    def _df_set(self, key: str, value_json: str) -> None:
        self.set(key, json.loads(value_json))

    @classmethod
    def _df_schema(cls) -> Optional[str]:
        if cls.parameters is None:
            return None
        for p in list(cls.parameters) + list(cls.outputs):
            if not isinstance(p, Parameter):
                raise TypeError(f"{cls.__name__}.parameters and .outputs hold daqflow.Parameter, not {type(p).__name__}")
        return json.dumps({"parameters": [p._json() for p in cls.parameters], "outputs": [p._json() for p in cls.outputs]})

    @classmethod
    def _df_defaults(cls, config: Dict[str, Any]) -> Dict[str, Any]:
        """The configuration with every declared default filled in (dotted keys into tables)."""
        out = dict(config)
        for p in cls.parameters or ():
            if p.default is None:
                continue
            table = out
            *path, last = p.name.split(".")
            for part in path:
                inner = table.get(part)
                if not isinstance(inner, dict):
                    inner = {}
                    table[part] = inner
                table = inner
            table.setdefault(last, p.default)
        return out

    # Running as a process. ----------------------------------------------------------------

    @classmethod
    def argument_parser(cls) -> argparse.ArgumentParser:
        """The command line :meth:`main` reads: the arguments of ``daqflow component``."""
        p = argparse.ArgumentParser(
            description=f"The daqflow component {cls.__name__} (kind {cls.kind!r}): "
            "driven by line commands on standard input (configure, start RUN, pause, resume, "
            "stop [LAST_EVENT], set KEY=VALUE, stats, state, schema, reset, quit) and, with --control, "
            "by the control plane.",
        )
        p.add_argument("--name", required=True, help="the component's name, unique in the system")
        p.add_argument("--config", metavar="FILE", help="a TOML file with the configuration keys")
        p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], dest="sets",
                       help="set one configuration key (dotted for nested keys); after --config")
        p.add_argument("--start", metavar="RUN", type=int,
                       help="configure and start run RUN at once; run until the input ends or a signal")
        p.add_argument("--control", metavar="HOST:PORT", help="join the control plane at this control server")
        p.add_argument("--lease", metavar="SECS", type=float,
                       default=float(os.environ.get("DAQFLOW_LEASE_S", "15")),
                       help="with --control: end when no control server was reachable for this long "
                       "(0: never; default $DAQFLOW_LEASE_S or 15)")
        p.add_argument("--operator", metavar="NAME", default=os.environ.get("DAQFLOW_OPERATOR") or None,
                       help="with --control: take commands only from this process (default $DAQFLOW_OPERATOR)")
        p.add_argument("--incarnation", metavar="N", type=int,
                       default=int(os.environ["DAQFLOW_INCARNATION"]) if os.environ.get("DAQFLOW_INCARNATION") else None,
                       help="with --control: the incarnation the operator launched this process as, put in "
                       "every NAME/state (default $DAQFLOW_INCARNATION)")
        p.add_argument("--token-file", metavar="FILE",
                       help="the system token's file (default $DAQFLOW_TOKEN_FILE, else $DAQFLOW_TOKEN)")
        p.add_argument("--token-stdin", action="store_true",
                       help="read the system token from the first line of standard input")
        p.add_argument("--kind", default=None, help=f"the kind's name (default {cls.kind!r})")
        return p

    @classmethod
    def main(cls, argv: Optional[Sequence[str]] = None) -> None:
        """Runs this class as a daqflow component process with the command line ``argv``
        (default: ``sys.argv[1:]``) and exits: status 0, or 1 when the component failed."""
        args = cls.argument_parser().parse_args(argv)
        sys.exit(1 if cls.run(**vars(args)) else 0)

    @classmethod
    def run(
        cls,
        name: str,
        *,
        config: Optional[str] = None,
        sets: Sequence[str] = (),
        start: Optional[int] = None,
        control: Optional[str] = None,
        lease: float = 15.0,
        operator: Optional[str] = None,
        incarnation: Optional[int] = None,
        token_file: Optional[str] = None,
        token_stdin: bool = False,
        kind: Optional[str] = None,
    ) -> bool:
        """Runs this class as a daqflow component process until it ends (the input ends, a
        signal, ``quit``, or the lease runs out); returns whether it failed. The arguments are
        :meth:`main`'s command line."""
        if cls.role not in ROLES:
            raise ValueError(f"{cls.__name__}.role {cls.role!r}: one of {', '.join(ROLES)}")
        handler = _DaqflowLogHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root = logging.getLogger("daqflow.component")
        if not any(isinstance(h, _DaqflowLogHandler) for h in root.handlers):
            root.addHandler(handler)
        root.setLevel(logging.DEBUG)
        root.propagate = False
        _native._use_token(token_file=token_file, token_stdin=token_stdin)

        def factory(component_name: str, config_json: str) -> Component:
            return cls(component_name, cls._df_defaults(json.loads(config_json)))

        process = {
            "name": name,
            "config_file": config,
            "sets": list(sets),
            "start": start,
            "control": control,
            "lease_s": lease,
            "end_with_stdin": token_stdin,
            "operator": operator,
            "incarnation": incarnation,
        }
        return cls._df_run(factory, kind or cls.kind, process)

    @classmethod
    def _df_run(cls, factory: Any, kind: str, process: Dict[str, Any]) -> bool:
        """The process loop of this class (a subclass of another model overrides it)."""
        return _native._run_component(factory, kind=kind, role=cls.role, process=process, schema=cls._df_schema())
