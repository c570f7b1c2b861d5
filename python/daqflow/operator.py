"""Scripting runs: :class:`Operator` drives a running daqflow operator through its HTTP API.

The operator (``daqflow run system.toml`` or ``daqflow demo``) serves the web UI and its HTTP
API (docs/web.md). An :class:`Operator` logs in with the web token, takes control, and makes
the transitions the web UI's buttons make; it reads the status, the run history and each run's
record (the run database, through the operator). Standard library only (``urllib``).

Example (a scan of five short runs, ``python/examples/scan.py``)::

    import daqflow

    with daqflow.Operator("http://127.0.0.1:8080", data="daqflow-demo") as op:
        if op.status()["running"]:
            op.stop()                             # no reset while a run goes on: stop it first
        op.reset()
        for rate in (500, 1000, 1500, 2000, 2500):
            op.set("src-0", "rate_hz", rate)      # for the next configure (or live, once configured)
            op.configure()
            summary = op.take_run(seconds=2)      # start, wait, stop: the run's summary
            print(rate, summary["run"], summary["events"], summary["lost"])
            op.reset()
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from ._native import Error

__all__ = ["Operator", "OperatorError"]


class OperatorError(Error):
    """The operator refused or failed a request: :attr:`status` is the HTTP status (400 a bad
    argument, 403 not in control or not logged in, 404 nothing of that name, 409 the state
    does not allow it, 500 a component or the operator failed), the message the operator's
    ``error``."""

    def __init__(self, status: int, message: str, body: Any = None):
        super().__init__(f"{message} (HTTP {status})")
        #: The HTTP status.
        self.status = status
        #: The operator's error text.
        self.message = message
        #: The whole JSON answer, when there was one.
        self.body = body


class Operator:
    """A client of a daqflow operator's HTTP API at ``url`` (``http://HOST:PORT``).

    ``token`` is the operator's web token; without it, ``token_file`` is read, else
    ``<data>/web-token`` (the operator writes it there, mode 0600, at every start), else
    ``$DAQFLOW_WEB_TOKEN``; white space around a token read from a file is stripped.

    Without any token the client **watches**: :meth:`status`, :meth:`runs`, :meth:`run`,
    :meth:`logs`, :meth:`processes`, :meth:`history` and every other reading call work where
    the operator lets anyone watch (its web UI on loopback, the default), and
    :attr:`may_control` is ``False``. Every call that acts (control, transitions,
    :meth:`set`, :meth:`command`) then raises :class:`OperatorError` (403) before sending
    anything, naming the missing token and the ways to give it. An operator that runs without
    a web token lets a tokenless client act; one that lets only logged-in sessions watch
    (``token_to_watch``) refuses the reading calls too (403, with the same advice).

    Use it as a context manager to take control on entry and release it on exit::

        with daqflow.Operator(url, data="daqflow-demo") as op:
            op.configure()
    """

    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        data: Optional[str] = None,
        timeout: float = 120.0,
        client: str = "daqflow-python",
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.netloc:
            raise ValueError(f"{url!r}: expected http://HOST:PORT")
        self.url = f"http://{parts.netloc}"
        self.timeout = timeout
        self._client = client
        self._cookie: Optional[str] = None
        if token is None:
            path = token_file or (str(Path(data) / "web-token") if data is not None else None)
            if path is not None:
                token = Path(path).read_text().strip()
            else:
                token = os.environ.get("DAQFLOW_WEB_TOKEN")
        self._token = token
        self.me: Optional[str] = None
        #: Whether this client may act (take control, make transitions): it logged in with the
        #: token, or the operator needs none. ``False``: it can only watch.
        self.may_control = False
        self.login()

    # HTTP. ----------------------------------------------------------------------------------

    _HOW = (
        "give the operator's web token: Operator(url, token=...) (the token in the web UI URL the operator "
        "printed), token_file=PATH, data=DATA_DIR (reads DATA_DIR/web-token), or $DAQFLOW_WEB_TOKEN"
    )

    def _request(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        if method == "POST" and path != "/api/login" and not self.may_control:
            what = path.rsplit("/", 1)[-1] if path.startswith("/api/transition/") else f"POST {path}"
            raise OperatorError(
                403,
                f"{what}: this Operator has no web token, so it may only watch (status, runs, logs): {self._HOW}",
            )
        headers = {"Accept": "application/json"}
        data = None
        if method == "POST":
            headers["X-Daqflow-Client"] = self._client
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode() if body is not None else b""
        if self._cookie:
            headers["Cookie"] = self._cookie
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                self._keep_cookie(resp.headers)
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                answer = json.loads(text)
            except ValueError:
                answer = None
            message = str(answer.get("error", text) if isinstance(answer, dict) else (text or e.reason))
            if e.code == 403 and not self._token:
                message += f" (this Operator has no web token: {self._HOW})"
            raise OperatorError(e.code, message, answer) from None
        except urllib.error.URLError as e:
            raise OperatorError(0, f"cannot reach the operator at {self.url}: {e.reason}") from None
        return json.loads(text) if text else None

    def _keep_cookie(self, headers: Any) -> None:
        for value in headers.get_all("Set-Cookie") or []:
            first = value.split(";", 1)[0].strip()
            if first.startswith("daqflow_session="):
                self._cookie = first

    def login(self) -> Dict[str, Any]:
        """Logs in (done by the constructor; again after the operator restarted). Returns
        ``{"me": "client N", "may_control": bool}``; without a token, against an operator that
        has one, ``{"me": None, "may_control": False}`` (watching needs no session)."""
        if self._token:
            answer = self._request("POST", "/api/login", {"token": self._token})
        else:
            try:
                # An operator without a web token gives any client a session that may act.
                answer = self._request("POST", "/api/login", {})
            except OperatorError as e:
                if e.status != 400:
                    raise
                # It has one and this client none: it watches, without a session.
                answer = {"me": None, "may_control": False}
        self.me = answer.get("me")
        self.may_control = bool(answer.get("may_control"))
        return answer

    # Control. -------------------------------------------------------------------------------

    def take_control(self, force: bool = False) -> Dict[str, Any]:
        """Takes control of the run (``force``: from whoever holds it). Returns
        ``GET /api/control``'s answer."""
        return self._request("POST", "/api/control/take", {"force": force})

    def release_control(self) -> Dict[str, Any]:
        """Releases control."""
        return self._request("POST", "/api/control/release")

    def control(self) -> Dict[str, Any]:
        """Who controls: ``{"controlled", "holder", "since_ms", "you", "me", "may_control"}``."""
        return self._request("GET", "/api/control")

    def __enter__(self) -> "Operator":
        self.take_control()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release_control()
        except OperatorError:
            pass

    # Transitions. ---------------------------------------------------------------------------

    def transition(self, name: str, body: Any = None) -> Any:
        """Makes transition ``name`` of the whole system and returns its result (docs/web.md,
        ``POST /api/transition/{name}``); returns when it is done."""
        return self._request("POST", f"/api/transition/{urllib.parse.quote(name)}", body)["result"]

    def configure(self) -> Dict[str, Dict[str, Any]]:
        """Initial → Configured. Returns what each component told the others."""
        return self.transition("configure")["configured"]

    def start(self, run: Optional[int] = None) -> int:
        """Configured → Running: run ``run``, or the next number. Returns the run number."""
        return self.transition("start", {"run": run} if run is not None else None)["started"]

    def pause(self) -> None:
        """Running → Paused."""
        self.transition("pause")

    def resume(self) -> None:
        """Paused → Running."""
        self.transition("resume")

    def stop(self) -> Dict[str, Any]:
        """Ends the run. Returns its summary (``RunSummary``: ``run``, ``events``, ``recorded``,
        ``lost``, ``files``, ``components``, …), which the run database keeps too."""
        return self.transition("stop")["stopped"]

    def reset(self) -> None:
        """Initial, Configured, Error or Mixed → Initial (refused, 409, while Running or Paused:
        stop the run first)."""
        self.transition("reset")

    def set(self, component: str, key: str, value: Any) -> Dict[str, Any]:
        """Sets parameter ``key`` (dotted for a nested key: ``size.mean``) of ``component`` to
        ``value``: while the system is Initial for the next configure; while Configured,
        Running or Paused a live parameter the component takes at once (refused with its reason
        for a key it does not declare live in that state). Returns every override in force.
        The overrides are stored with each run (its summary's ``overrides``), the live changes
        of a run in its summary's ``changes``."""
        return self._request("POST", "/api/set", {"component": component, "key": key, "value": value})

    def unset(self, component: str, key: str) -> Dict[str, Any]:
        """Takes back an override of :meth:`set`: the system file's value holds again."""
        return self._request("POST", "/api/set", {"component": component, "key": key, "value": None})

    def command(self, name: str, data: str = "") -> int:
        """Sends a control-plane command; returns how many processes received it."""
        return self._request("POST", "/api/command", {"name": name, "data": data})["received"]

    # Reading. -------------------------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        """The system's status (``GET /api/status``): state, run, events, rates, components."""
        return self._request("GET", "/api/status")

    def state(self) -> str:
        """The system's state: ``Initial``, ``Configured``, ``Running``, ``Paused``, ``Error``…"""
        return self.status()["state"]

    def wait(
        self,
        *,
        events: Optional[int] = None,
        seconds: Optional[float] = None,
        timeout: Optional[float] = None,
        poll: float = 0.2,
    ) -> Dict[str, Any]:
        """Waits until the open run has built ``events`` events or lasted ``seconds`` seconds
        (whichever comes first when both are given). Raises :class:`OperatorError` when the
        run stops or a component fails meanwhile, or after ``timeout`` seconds (default: none
        with ``seconds``, else 600). Returns the last status read."""
        if events is None and seconds is None:
            raise ValueError("wait for events=N, seconds=T, or both")
        began = time.monotonic()
        limit = timeout if timeout is not None else (None if seconds is not None else 600.0)
        while True:
            s = self.status()
            if not s.get("running"):
                raise OperatorError(409, f"no run is open (state {s.get('state')})", s)
            if s.get("state") == "Error":
                failed = [f"{c['name']}: {c.get('error')}" for c in s.get("components", []) if c.get("state") in ("Error", "Dead")]
                raise OperatorError(500, "a component failed: " + ("; ".join(failed) or str(s.get("last_error"))), s)
            if events is not None and (s.get("events") or 0) >= events:
                return s
            if seconds is not None and (s.get("duration_s") or 0.0) >= seconds:
                return s
            if limit is not None and time.monotonic() - began > limit:
                raise OperatorError(408, f"waited {limit} s for {events} events: {s.get('events')} so far", s)
            time.sleep(poll)

    def take_run(
        self,
        *,
        events: Optional[int] = None,
        seconds: Optional[float] = None,
        run: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Starts a run (the system must be Configured), waits as :meth:`wait` does, stops it
        and returns its summary. A run that fails while waiting is stopped too (its summary
        then says why) before the error is raised."""
        self.start(run)
        try:
            self.wait(events=events, seconds=seconds, timeout=timeout)
        except OperatorError:
            if self.status().get("running"):
                self.stop()
            raise
        return self.stop()

    def runs(self, limit: int = 50) -> List[Dict[str, Any]]:
        """The run history from the run database, newest first (``RunRecord``s: ``run``,
        ``state``, ``events``, ``recorded``, ``lost``, …)."""
        return self._request("GET", f"/api/runs?limit={int(limit)}")

    def run(self, number: int) -> Dict[str, Any]:
        """One run's whole record from the run database: its ``RunRecord`` fields, the system
        file it ran with (``config``) and its ``summary``."""
        return self._request("GET", f"/api/runs/{int(number)}")

    def logs(self, **query: Any) -> List[Dict[str, Any]]:
        """The message browser's records (``GET /api/logs``; the query parameters of
        docs/web.md, e.g. ``severity="warn"``, ``run=3``, ``limit=100``)."""
        q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return self._request("GET", "/api/logs" + (f"?{q}" if q else ""))

    def histograms(self) -> List[Dict[str, Any]]:
        """The components' histograms and counters as the web UI draws them (``GET
        /api/histograms``): each with its ``component``; those of a parallel group's members
        summed under the group's name, with ``members``."""
        return self._request("GET", "/api/histograms")

    def processes(self) -> List[Dict[str, Any]]:
        """The control plane's directory: every process, its services and commands."""
        return self._request("GET", "/api/processes")

    def alarms(self) -> Dict[str, Any]:
        """Every alarm of the system file with its state, and the recent alarm events, newest
        first (``GET /api/alarms``: ``{"system", "alarms": [{"name", "severity", "condition",
        "message", "state", "since_ms", "acknowledged_by", "value"}], "events": [{"t_ms",
        "name", "kind", "severity", "message", "who"}]}``)."""
        return self._request("GET", "/api/alarms")

    def history_names(self) -> List[str]:
        """The names of the slow values the history holds, sorted (``COMPONENT.KEY``,
        ``system.KEY``, ``SERVICE.PATH``; docs/operator-guide.md, "The history of slow
        values")."""
        return self._request("GET", "/api/history/names")

    def history(
        self,
        name: str,
        *,
        seconds: Optional[float] = None,
        from_ms: Optional[int] = None,
        to_ms: Optional[int] = None,
        points: Optional[int] = None,
    ) -> Dict[str, Any]:
        """One slow value's history (``GET /api/history``): its points, oldest first, between
        ``from_ms`` and ``to_ms`` (Unix ms; ``to_ms`` defaults to now, ``from_ms`` to
        ``seconds`` before it, else an hour), at most ``points`` of them (the operator's
        default 1000): ``{"name", "from_ms", "to_ms", "bucket_ms", "points": [{"t_ms",
        "value", "min", "max", "count"}]}``, down-sampled into buckets (``bucket_ms`` > 0) when
        the range holds more samples than ``points``. 404 (:class:`OperatorError`) for a name
        never sampled."""
        if seconds is not None and from_ms is None:
            end = to_ms if to_ms is not None else int(time.time() * 1000)
            from_ms, to_ms = max(0, end - int(seconds * 1000)), end
        query = {"name": name, "from": from_ms, "to": to_ms, "points": points}
        q = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return self._request("GET", f"/api/history?{q}")

    def __repr__(self) -> str:
        return f"<daqflow.Operator {self.url} as {self.me}>"
