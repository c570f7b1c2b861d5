"""EPICS Channel Access for daqflow: the facility's process variables in, the DAQ's state out.

Two component kinds, each a process the operator runs (``docs/epics.md``):

- ``epics`` (:class:`EpicsReader`): monitors process variables (PVs) over Channel Access (and
  over pvAccess those named ``pva://NAME``) and publishes each as a slow value of its
  statistics (``stats()["slow"]``): in the history and in the alarms as ``COMPONENT.PV``
  (``epics.HV:CH1:VMON > 1510 for 5 s while Running``), with the
  PV's engineering units, alarm severity and status and record time stamp; the values at the
  run's start and stop go into the run's record. A PV that disconnects loses its value (a gap in
  the history, its tests false), gets severity 3 (INVALID, as every EPICS client shows a
  disconnected channel) and counts in ``detail.disconnected``; the run goes on.
- ``epics_server`` (:class:`EpicsServer`): serves the DAQ's state, run number, counters, rates
  and alarms as read-only PVs (``DAQ:STATE``, ``DAQ:RUN``, ``DAQ:EVENT_RATE``,
  ``DAQ:ALARM:slow-trigger``, …) on an address given explicitly, read from the operator's web
  API, so that the control room's ``caget``, Phoebus or CSS sees the DAQ.

Both use caproto (NSLS-II's pure-Python Channel Access client and server: ``pip install
caproto``), the reader's ``pva://`` PVs p4p (EPICS's PVXS from Python: ``pip install p4p``); a
Python without the one it needs gets a message naming the command. ::

    [[component]]
    name = "epics"
    kind = "epics"
    command = ["python3", "-m", "daqflow.epics", "read"]
    [component.params]
    pvs = ["HV:CH1:VMON", "HV:CH1:IMON"]
    addr_list = "10.0.1.255"

    >>> from daqflow.epics import EpicsReader, EpicsServer
    >>> EpicsReader.kind, EpicsServer.kind
    ('epics', 'epics_server')
"""

import asyncio
import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from .component import Component, Parameter, slow_name_ok

__all__ = ["EpicsReader", "EpicsServer", "SERVED", "main"]

#: EPICS alarm severities, by number (``stats()["slow"][PV]["severity"]``).
SEVERITIES = ("NO_ALARM", "MINOR", "MAJOR", "INVALID")

_INSTALL = "the EPICS components need caproto: pip install caproto (or pip install './python[epics]')"


def _caproto():
    try:
        import caproto  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"{_INSTALL} ({e})") from None
    return caproto


def _set_ca_environment(addr_list: Optional[str], auto_addr_list: bool, server_port: int, repeater_port: int) -> None:
    """The Channel Access variables caproto reads (``EPICS_CA_*``), from the parameters: the
    component's own, whatever its process inherited."""
    if addr_list is not None:
        os.environ["EPICS_CA_ADDR_LIST"] = addr_list
    else:
        os.environ.pop("EPICS_CA_ADDR_LIST", None)
    os.environ["EPICS_CA_AUTO_ADDR_LIST"] = "YES" if auto_addr_list else "NO"
    os.environ["EPICS_CA_SERVER_PORT"] = str(server_port)
    os.environ["EPICS_CA_REPEATER_PORT"] = str(repeater_port)


_CA_PARAMETERS = [
    Parameter("addr_list", str, doc="Where to search for PVs (EPICS_CA_ADDR_LIST): addresses separated by spaces, "
              "each HOST or HOST:PORT; default: the broadcast addresses of this host's interfaces"),
    Parameter("auto_addr_list", bool, default=True,
              doc="Also search the broadcast addresses of every interface (EPICS_CA_AUTO_ADDR_LIST)"),
    Parameter("server_port", int, min=1, max=65535, default=5064,
              doc="The servers' UDP search port (EPICS_CA_SERVER_PORT)"),
    Parameter("repeater_port", int, min=1, max=65535, default=5065,
              doc="The CA repeater's port (EPICS_CA_REPEATER_PORT)"),
]

_PVA_PARAMETERS = [
    Parameter("pva_addr_list", str, doc="Where to search for pva:// PVs (EPICS_PVA_ADDR_LIST): addresses separated "
              "by spaces; default: the broadcast addresses of this host's interfaces"),
    Parameter("pva_auto_addr_list", bool, default=True,
              doc="Also search the broadcast address of every interface for pva:// PVs (EPICS_PVA_AUTO_ADDR_LIST)"),
    Parameter("pva_server_port", int, min=1, max=65535, default=5075,
              doc="The pvAccess servers' TCP port (EPICS_PVA_SERVER_PORT)"),
    Parameter("pva_broadcast_port", int, min=1, max=65535, default=5076,
              doc="The pvAccess UDP search port (EPICS_PVA_BROADCAST_PORT)"),
]

#: A PV named with this prefix is read over pvAccess (p4p); without one, or with ``ca://``,
#: over Channel Access (caproto).
PVA_PREFIX, CA_PREFIX = "pva://", "ca://"

# The reader's Channel Access and pvAccess contexts: one each per process, closed before the
# next configure.
_reader_lock = threading.Lock()
_reader_context: Any = None
_reader_pva: Any = None


def _close_reader_context() -> None:
    global _reader_context, _reader_pva
    with _reader_lock:
        ctx, _reader_context = _reader_context, None
        pva, _reader_pva = _reader_pva, None
    try:  # closing must never fail a reset
        if ctx is not None:
            ctx.disconnect(wait=False)
            ctx.broadcaster.disconnect(wait=False)
        if pva is not None:
            pva.close()
    except Exception:
        pass


def _p4p():
    try:
        from p4p.client.thread import Context
    except ImportError as e:
        raise RuntimeError(f"reading pva:// PVs needs p4p: pip install p4p (or pip install './python[pva]') ({e})") from None
    return Context


class _Channel:
    """What the reader knows of one PV."""

    __slots__ = ("name", "pv", "sub", "connected", "value", "unit", "severity", "status", "at_ms", "updates")

    def __init__(self, name: str):
        self.name = name
        self.pv: Any = None
        self.sub: Any = None
        self.connected = False
        self.value: Optional[float] = None
        self.unit: Optional[str] = None
        self.severity = 3
        self.status = "never connected"
        self.at_ms: Optional[int] = None
        self.updates = 0

    def slow(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"value": self.value if self.connected else None, "severity": self.severity,
                               "status": self.status}
        if self.unit:
            out["unit"] = self.unit
        if self.at_ms is not None:
            out["at_ms"] = self.at_ms
        return out


def _number(data: Any) -> Optional[float]:
    """A monitor's data as one number: a numeric or enum scalar (or a one-element array)."""
    try:
        if len(data) != 1:
            return None
        v = data[0]
    except TypeError:
        v = data
    if isinstance(v, (bytes, str)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


class EpicsReader(Component):
    """Monitors EPICS process variables over Channel Access (``pva://`` ones over pvAccess);
    each is a slow value of its statistics (history, alarms), kept with the run at its start
    and stop."""

    kind = "epics"
    role = "other"
    parameters = [
        Parameter("pvs", list, required=True,
                  doc="The process variables to monitor (HV:CH1:VMON, …; pva://NAME over pvAccess): each a slow value "
                      "COMPONENT.NAME"),
        *_CA_PARAMETERS,
        *_PVA_PARAMETERS,
        Parameter("connect_timeout_s", float, min=0, max=600, default=3.0, unit="s",
                  doc="How long configure waits for the PVs to connect; those still unconnected are logged and "
                      "read once they connect"),
    ]

    def __init__(self, name: str, config: Dict[str, Any]):
        super().__init__(name, config)
        # What stats() reads, there before configure (and after a configure that failed).
        self._lock = threading.Lock()
        self._channels: Dict[str, _Channel] = {}
        self._at_start: Optional[Dict[str, Any]] = None
        self._closed = False

    def configure(self):
        caproto = _caproto()
        from caproto.threading.client import Context, SharedBroadcaster

        given: List[str] = list(self.config["pvs"])
        if not given:
            raise ValueError("`pvs` is empty: name the process variables to read")
        # Each PV's name (its slow value's: without the protocol) and whether pvAccess reads it.
        parsed = [(n[len(PVA_PREFIX):], True) if n.startswith(PVA_PREFIX) else (n.removeprefix(CA_PREFIX), False)
                  for n in given]
        names = [n for n, _ in parsed]
        bad = [n for n in names if not slow_name_ok(n)]
        if bad:
            raise ValueError(f"`pvs`: {bad[0]!r} cannot name a slow value (1 … 200 characters, no white space, "
                             "none of < > = ! , \", not a counter's own key)")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"`pvs`: {', '.join(twice)} named twice")
        over_pva = [n for n, p in parsed if p]
        over_ca = [n for n, p in parsed if not p]
        PvaContext = _p4p() if over_pva else None
        _close_reader_context()
        _set_ca_environment(self.config.get("addr_list"), self.config["auto_addr_list"], self.config["server_port"],
                            self.config["repeater_port"])
        self._alarm_status = caproto.AlarmStatus
        self._channels = {n: _Channel(n) for n in names}
        self._units_wanted: List[Any] = []
        self._units_ready = threading.Condition(self._lock)
        global _reader_context, _reader_pva
        if over_ca:
            ctx = Context(SharedBroadcaster(), timeout=2.0)
            with _reader_lock:
                _reader_context = ctx
            # caproto keeps its callbacks by weak reference: they are bound methods of this object.
            pvs = ctx.get_pvs(*over_ca, connection_state_callback=self._connection, timeout=2.0)
            for name, pv in zip(over_ca, pvs):
                self._channels[name].pv = pv
                sub = pv.subscribe(data_type="time")
                sub.add_callback(self._update)
                self._channels[name].sub = sub
        if over_pva:
            cfg = self.config
            conf = {"EPICS_PVA_AUTO_ADDR_LIST": "YES" if cfg["pva_auto_addr_list"] else "NO",
                    "EPICS_PVA_SERVER_PORT": str(cfg["pva_server_port"]),
                    "EPICS_PVA_BROADCAST_PORT": str(cfg["pva_broadcast_port"])}
            if cfg.get("pva_addr_list") is not None:
                conf["EPICS_PVA_ADDR_LIST"] = cfg["pva_addr_list"]
            pctx = PvaContext("pva", conf=conf, useenv=False, nt=False)
            with _reader_lock:
                _reader_pva = pctx
            for name in over_pva:
                self._channels[name].sub = pctx.monitor(name, lambda v, name=name: self._pva_update(name, v),
                                                        notify_disconnect=True)
        self._units_thread = threading.Thread(target=self._read_units, name="epics-units", daemon=True)
        self._units_thread.start()
        deadline = time.monotonic() + self.config["connect_timeout_s"]
        while time.monotonic() < deadline and not all(c.connected for c in self._channels.values()):
            time.sleep(0.05)
        missing = [c.name for c in self._channels.values() if not c.connected]
        if missing:
            self.log.warning("not connected after %g s: %s (misspelt, or their IOC is down or not on the "
                             "address list?): read once they connect", self.config["connect_timeout_s"],
                             ", ".join(missing))
        return {"pvs": len(names)}

    # caproto's threads call these two.
    def _connection(self, pv: Any, state: str) -> None:
        with self._lock:
            if self._closed:
                return
            c = self._channels.get(pv.name)
            if c is None:
                return
            if state == "connected":
                c.connected = True
                c.status = "connected"
                self._units_wanted.append(c)
                self._units_ready.notify()
            elif state == "disconnected" and c.connected:
                c.connected = False
                c.value, c.severity, c.status = None, 3, "disconnected"
                self.log.warning("%s disconnected (its IOC went away?): no value until it is back", c.name)
            else:
                return
        if state == "connected":
            self.log.info("%s connected", pv.name)

    def _update(self, sub: Any, response: Any) -> None:
        md = response.metadata
        with self._lock:
            c = self._channels.get(sub.pv.name)
            if c is None or self._closed:
                return
            c.value = _number(response.data)
            c.severity = int(md.severity)
            try:
                c.status = self._alarm_status(int(md.status)).name
            except ValueError:
                c.status = str(int(md.status))
            if c.value is None and c.severity < 3:
                c.status = "not a number"
            c.at_ms = int(md.timestamp * 1000)
            c.updates += 1

    def _pva_update(self, name: str, v: Any) -> None:
        """A pvAccess monitor's update (p4p's thread): an NTScalar or NTEnum, or Disconnected."""
        from p4p.client.thread import Cancelled, Disconnected

        if isinstance(v, Cancelled):
            return
        connected_now = False
        with self._lock:
            c = self._channels.get(name)
            if c is None or self._closed:
                return
            if isinstance(v, (Disconnected, Exception)):
                if c.connected:
                    c.connected = False
                    c.value, c.severity, c.status = None, 3, "disconnected"
                    self.log.warning("%s disconnected (its IOC went away?): no value until it is back", name)
                return
            if not c.connected:
                c.connected = connected_now = True
            value = v.get("value")
            if hasattr(value, "get") and value.get("index") is not None:  # an NTEnum
                value = value.get("index")
            c.value = _number(value)
            alarm, stamp, display = v.get("alarm"), v.get("timeStamp"), v.get("display")
            c.severity = int(alarm.get("severity")) if alarm is not None else 0
            message = alarm.get("message") if alarm is not None else ""
            c.status = message or SEVERITIES[min(c.severity, 3)]
            if c.value is None and c.severity < 3:
                c.status = "not a number"
            if stamp is not None:
                c.at_ms = int(stamp.get("secondsPastEpoch")) * 1000 + int(stamp.get("nanoseconds")) // 1_000_000
            if display is not None and display.get("units"):
                c.unit = str(display.get("units"))
            c.updates += 1
        if connected_now:
            self.log.info("%s connected (pvAccess)", name)

    def _read_units(self) -> None:
        """Reads each newly connected PV's engineering units once (a control read), outside
        caproto's callback threads."""
        while True:
            with self._lock:
                while not self._units_wanted and not self._closed:
                    self._units_ready.wait()
                if self._closed:
                    return
                c = self._units_wanted.pop(0)
            try:
                r = c.pv.read(data_type="control", timeout=2.0)
                units = getattr(r.metadata, "units", b"")
                unit = units.decode("latin-1") if isinstance(units, bytes) else str(units)
            except Exception as e:  # a PV without units (a string), or one gone again
                self.log.debug("units of %s: %s", c.name, e)
                continue
            with self._lock:
                c.unit = unit.strip() or None

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            if hasattr(self, "_units_ready"):
                self._units_ready.notify_all()
        _close_reader_context()

    def _slow(self) -> Dict[str, Any]:
        with self._lock:
            return {n: c.slow() for n, c in self._channels.items()}

    def stats(self):
        with self._lock:
            channels = list(self._channels.values())
            connected = sum(c.connected for c in channels)
            updates = sum(c.updates for c in channels)
            slow = {c.name: c.slow() for c in channels}
        return {"events": updates, "bytes": 0, "slow": slow,
                "detail": {"pvs": len(channels), "connected": connected, "disconnected": len(channels) - connected}}

    def start(self, run):
        self._at_start = self._slow()

    def stop(self, last_event):
        s = self.stats()
        s["detail"]["at_start"] = self._at_start or {}
        s["detail"]["at_stop"] = s["slow"]
        return s

    def reset(self):
        self._close()


#: What :class:`EpicsServer` serves, after its prefix: (name, type, unit, what).
SERVED = [
    ("STATE", "string", None, "the system's state: Initial, Configured, Running, Paused, Error, Mixed, or a "
                              "transition under way (Configuring, Starting, …)"),
    ("RUNNING", "int", None, "1 while a run is open, else 0"),
    ("RUN", "int", None, "the run taken or last taken (0 before the first)"),
    ("EVENTS", "double", "events", "events built in the run (the last run's after it)"),
    ("RECORDED", "double", "events", "events recorded in the run (never above EVENTS)"),
    ("BYTES", "double", "B", "bytes built in the run"),
    ("EVENT_RATE", "double", "Hz", "events built per second (0 while no run is open)"),
    ("MB_RATE", "double", "MB/s", "megabytes (10^6) built per second"),
    ("LOST", "double", "events", "events the trigger's accounting gave up on in the run (INVALID while not known)"),
    ("DURATION", "double", "s", "how long the open run has lasted (0 without one)"),
    ("ALARMS", "int", None, "alarms that hold (raised or acknowledged); severity MAJOR when one of them is an "
                            "error, MINOR when a warning"),
    ("ALARMS_UNACK", "int", None, "alarms waiting for a person (raised or cleared)"),
    ("ALARM", "string", None, "the name of the alarm raised last that still holds, or empty"),
    ("ALARM:<name>", "int", None, "one per alarm of the system file: 0 ok, 1 raised, 2 acknowledged, 3 cleared; "
                                  "severity MAJOR (an error alarm) or MINOR (a warning) while it holds"),
    ("HEARTBEAT", "int", None, "counts every refresh: a control room sees a DAQ whose PVs went stale"),
]

_ALARM_STATES = {"ok": 0, "raised": 1, "acknowledged": 2, "cleared": 3}


def _fetch(url: str, token: Optional[str], timeout: float) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


class EpicsServer(Component):
    """Serves the DAQ's state, run, counters, rates and alarms as read-only Channel Access
    PVs (:data:`SERVED`), read from the operator's web API once a second."""

    kind = "epics_server"
    role = "other"
    parameters = [
        Parameter("bind", "address", required=True,
                  doc="The interface and UDP/TCP port to serve on (127.0.0.1:5064; 0.0.0.0:5064 for every interface, "
                      "which broadcast searches need): said explicitly, never a default"),
        Parameter("prefix", str, default="DAQ:", doc="What every PV's name starts with (DAQ: gives DAQ:STATE, …)"),
        Parameter("operator", str, default="http://127.0.0.1:8080",
                  doc="The operator's web address, whose /api/status and /api/alarms are served"),
        Parameter("web_token_file", "path",
                  doc="A file holding the operator's web token, for an operator that lets only logged-in sessions watch"),
        Parameter("interval_s", float, min=0.1, max=60, default=1.0, unit="s", live=("Configured", "Running", "Paused"),
                  doc="How often the PVs are refreshed"),
        Parameter("writable", bool, default=False,
                  doc="Whether clients may write the served PVs (their values are overwritten at the next refresh; "
                      "there is nothing to control through them)"),
    ]

    def configure(self):
        _caproto()
        cfg = self.config
        self._url = cfg["operator"].rstrip("/")
        token_file = cfg.get("web_token_file")
        self._token = None
        if token_file:
            with open(token_file) as f:
                self._token = f.read().strip()
        try:
            alarms = _fetch(self._url + "/api/alarms", self._token, 5.0)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"the operator's web API at {self._url} does not answer: {e} (set `operator` to its "
                               "address, and `web_token_file` where watching needs a token)") from None
        names = [a["name"] for a in alarms.get("alarms", [])]
        host, port = cfg["bind"].rsplit(":", 1)
        host = host.strip("[]")
        _Served.ensure(host, int(port), cfg["prefix"], names, cfg["writable"], self.log)
        _Refresher.replace(self._url, self._token, self.config, self.log)
        return {"prefix": cfg["prefix"], "bind": f"{host}:{_Served.current.port}"}

    def stats(self):
        served = _Served.current
        return {"events": served.refreshes if served else 0, "bytes": 0,
                "detail": {"pvs": len(served.channels) if served else 0, "clients": served.clients() if served else 0}}

    def reset(self):
        # The PVs stay served (the control room sees the DAQ Initial); the refresh goes on
        # until the process ends or the next configure replaces it.
        return None


class _Refresher:
    """The thread that reads the operator's status and alarms and writes them into the PVs:
    one per process, replaced at every configure (and left running by a reset, so that the
    control room sees the DAQ Initial rather than gone)."""

    current: Optional["_Refresher"] = None

    def __init__(self, url: str, token: Optional[str], config: Dict[str, Any], log: Any):
        self.url, self.token, self.config, self.log = url, token, config, log
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="epics-server", daemon=True)
        self.thread.start()

    @classmethod
    def replace(cls, url: str, token: Optional[str], config: Dict[str, Any], log: Any) -> None:
        if cls.current is not None:
            cls.current.stop.set()
            cls.current.thread.join(15)
        cls.current = _Refresher(url, token, config, log)

    def _loop(self) -> None:
        failing = False
        while not self.stop.is_set():
            served = _Served.current
            try:
                status = _fetch(self.url + "/api/status", self.token, 5.0)
                alarms = _fetch(self.url + "/api/alarms", self.token, 5.0)
            except (OSError, ValueError) as e:
                if not failing:
                    self.log.warning("the operator's web API does not answer (%s): the PVs are INVALID until it does", e)
                failing = True
                if served is not None:
                    served.invalidate()
            else:
                if failing:
                    self.log.info("the operator's web API answers again")
                failing = False
                if served is not None:
                    served.refresh(status, alarms)
            # `interval_s` is live: the component's config is this dict.
            self.stop.wait(self.config["interval_s"])


class _Served:
    """The caproto server of this process: one asyncio loop in a thread, serving until the
    process ends; a configure with another address, prefix or set of alarms makes it anew."""

    current: Optional["_Served"] = None
    _lock = threading.Lock()

    def __init__(self, host: str, port: int, prefix: str, alarms: List[str], writable: bool, log: Any):
        import caproto
        from caproto import AccessRights, ChannelDouble, ChannelInteger, ChannelString

        access = AccessRights.READ | (AccessRights.WRITE if writable else AccessRights(0))

        def fixed(cls):
            class Served(cls):
                def check_access(self, hostname, username):
                    return access

            return Served

        self.key = (host, port, prefix, tuple(alarms), writable)
        self.prefix = prefix
        self.refreshes = 0
        self.heartbeat = 0
        self.channels: Dict[str, Any] = {}
        types = {"string": fixed(ChannelString), "int": fixed(ChannelInteger), "double": fixed(ChannelDouble)}
        for name, kind, unit, _ in SERVED:
            if name == "ALARM:<name>":
                continue
            if kind == "string":
                self.channels[name] = types[kind](value="")  # one DBR_STRING: at most 40 characters
            elif kind == "int":
                self.channels[name] = types[kind](value=0)
            else:
                self.channels[name] = types[kind](value=0.0, units=unit or "", precision=2)
        for a in alarms:
            self.channels[f"ALARM:{a}"] = types["int"](value=0)
        self._caproto = caproto
        self.loop = asyncio.new_event_loop()
        self.port = port
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self._server: Any = None
        self.thread = threading.Thread(target=self._serve, args=(host, port, log), name="epics-ca-server", daemon=True)
        self.thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the Channel Access server on {host}:{port} did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"the Channel Access server cannot serve on {host}:{port}: {self._error}")

    def _serve(self, host: str, port: int, log: Any) -> None:
        from caproto.asyncio.server import Context

        os.environ["EPICS_CA_SERVER_PORT"] = str(port)
        os.environ["EPICS_CAS_SERVER_PORT"] = str(port)
        asyncio.set_event_loop(self.loop)
        pvdb = {self.prefix + n: ch for n, ch in self.channels.items()}

        async def started(_async_lib: Any) -> None:
            if self._server.port != port:
                # caproto takes another TCP port when this one is taken (EPICS's rule for a
                # second server on a host); searches still come to the UDP port.
                log.info("Channel Access: TCP port %d taken, serving on %d (searches on UDP %d)", port,
                         self._server.port, port)
            self.port = self._server.port
            self._ready.set()

        async def serve() -> None:
            try:
                # Made in the loop it runs in (caproto's queues belong to it).
                self._server = Context(pvdb, interfaces=[host])
                await self._server.run(log_pv_names=False, startup_hook=started)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                self._error = e
                self._ready.set()

        self._task = self.loop.create_task(serve())
        try:
            self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass

    def clients(self) -> int:
        server = self._server
        return len(getattr(server, "circuits", ())) if server is not None else 0

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._task.cancel)
        self.thread.join(10)

    @classmethod
    def ensure(cls, host: str, port: int, prefix: str, alarms: List[str], writable: bool, log: Any) -> None:
        with cls._lock:
            key = (host, port, prefix, tuple(alarms), writable)
            if cls.current is not None and cls.current.key == key and cls.current.thread.is_alive():
                return
            if cls.current is not None:
                cls.current.close()
                cls.current = None
            cls.current = _Served(host, port, prefix, alarms, writable, log)
            log.info("serving %d PVs %s… on %s:%d (%s)", len(cls.current.channels), prefix, host, cls.current.port,
                     "writable" if writable else "read-only")

    def _write(self, updates: Dict[str, Any]) -> None:
        """Writes ``{NAME: (value, severity)}`` on the server's loop and waits for it."""

        async def write() -> None:
            for name, (value, severity) in updates.items():
                ch = self.channels.get(name)
                if ch is None:
                    continue
                status = self._caproto.AlarmStatus.NO_ALARM if severity == 0 else (
                    self._caproto.AlarmStatus.UDF if severity == 3 else self._caproto.AlarmStatus.STATE)
                # The value, then the alarm: caproto's write of a number sets the alarm from the
                # channel's limits (none here: no alarm), whatever severity it is given.
                if value is not None:
                    await ch.write(value)
                if (ch.alarm.severity, ch.alarm.status) != (severity, status):
                    await ch.alarm.write(severity=severity, status=status)

        asyncio.run_coroutine_threadsafe(write(), self.loop).result(10)

    def refresh(self, status: Dict[str, Any], alarms: Dict[str, Any]) -> None:
        self.heartbeat += 1
        self.refreshes += 1
        holding = [a for a in alarms.get("alarms", []) if a.get("state") in ("raised", "acknowledged")]
        waiting = [a for a in alarms.get("alarms", []) if a.get("state") in ("raised", "cleared")]
        worst = 2 if any(a.get("severity") == "error" for a in holding) else (1 if holding else 0)
        latest = max(holding, key=lambda a: a.get("since_ms") or 0)["name"][:40] if holding else ""

        def num(key: str) -> float:
            v = status.get(key)
            return float(v) if isinstance(v, (int, float)) else 0.0

        updates: Dict[str, Any] = {
            "STATE": (str(status.get("state", ""))[:40], 0 if status.get("state") != "Error" else 2),
            "RUNNING": (1 if status.get("running") else 0, 0),
            "RUN": (int(status.get("run") or 0), 0),
            "EVENTS": (num("events"), 0),
            "RECORDED": (num("recorded"), 0),
            "BYTES": (num("bytes"), 0),
            "EVENT_RATE": (num("events_per_s"), 0),
            "MB_RATE": (num("mb_per_s"), 0),
            # Null while no trigger counts (or before the first run): not known, so INVALID.
            "LOST": (num("lost"), 0) if isinstance(status.get("lost"), (int, float)) else (None, 3),
            "DURATION": (num("duration_s"), 0),
            "ALARMS": (len(holding), worst),
            "ALARMS_UNACK": (len(waiting), 0),
            "ALARM": (latest, worst),
            "HEARTBEAT": (self.heartbeat % (2**31), 0),
        }
        for a in alarms.get("alarms", []):
            state = a.get("state", "ok")
            held = state in ("raised", "acknowledged")
            updates[f"ALARM:{a['name']}"] = (_ALARM_STATES.get(state, 0),
                                              (2 if a.get("severity") == "error" else 1) if held else 0)
        self._write(updates)

    def invalidate(self) -> None:
        self.heartbeat += 1
        self._write({name: (None, 3) for name in self.channels} | {"HEARTBEAT": (self.heartbeat % (2**31), 3)})


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m daqflow.epics read|serve ARGS``: runs :class:`EpicsReader` (``read``) or
    :class:`EpicsServer` (``serve``) as a component process with ``daqflow component``'s
    arguments (``--name``, ``--control``, …)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("read", "serve"):
        sys.exit("usage: python -m daqflow.epics read|serve --name NAME [daqflow component's arguments]")
    (EpicsReader if args[0] == "read" else EpicsServer).main(args[1:])


if __name__ == "__main__":
    main()
