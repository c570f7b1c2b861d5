"""EPICS (daqflow.epics): the `epics` reader against a real soft IOC (EPICS base's, as packaged
for Python: pythonSoftIOC), its PVs in the history, the alarms and the run's record, a PV that
disappears mid-run; and the `epics_server` kind's PVs read by another Channel Access
implementation (pyepics, on EPICS base's libca) than the one serving them (caproto).

Every process here has its own Channel Access ports (searches, the repeater, pvAccess) and
`EPICS_CA_AUTO_ADDR_LIST=NO`: the tests collide neither with each other nor with a facility's
IOCs on the host.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import daqflow

from conftest import daqflow_binary, running_operator
from test_component import drive

pytest.importorskip("caproto", reason="pip install caproto (the EPICS components' library)")
pytest.importorskip("softioc", reason="pip install softioc (the tests' IOC)")
pytest.importorskip("epics", reason="pip install pyepics (the tests' second client)")

HERE = Path(__file__).parent


def free_ports(n):
    """`n` consecutive ports free for both TCP and UDP on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            held = []
            for p in range(base, base + n):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    s = socket.socket(socket.AF_INET, kind)
                    held.append(s)
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return list(range(base, base + n))
    raise RuntimeError("no free ports")


def ca_env(port, repeater):
    """A client's or a server's environment on Channel Access port `port` of 127.0.0.1 only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPICS_")}
    env.update(
        EPICS_CA_SERVER_PORT=str(port), EPICS_CA_REPEATER_PORT=str(repeater), EPICS_CA_AUTO_ADDR_LIST="NO",
        EPICS_CA_ADDR_LIST="127.0.0.1", EPICS_CAS_INTF_ADDR_LIST="127.0.0.1",
        EPICS_CAS_BEACON_ADDR_LIST="127.0.0.1", EPICS_CAS_AUTO_BEACON_ADDR_LIST="NO",
    )
    return env


class Ioc:
    """The soft IOC of epics_ioc.py on its own ports; `set("VMON", 1515)` changes a record."""

    def __init__(self, ports):
        port, repeater, pva, pva_bcast = ports
        env = ca_env(port, repeater)
        env.update(EPICS_PVA_SERVER_PORT=str(pva), EPICS_PVA_BROADCAST_PORT=str(pva_bcast),
                   EPICS_PVAS_INTF_ADDR_LIST="127.0.0.1", EPICS_PVA_AUTO_ADDR_LIST="NO", EPICS_PVA_ADDR_LIST="127.0.0.1")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "epics_ioc.py"), "HV:CH1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if line.strip() == "ready":
                break
        assert lines and lines[-1].strip() == "ready", "".join(lines)
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def set(self, record, value):
        self.proc.stdin.write(f"{record} {value}\n")
        self.proc.stdin.flush()

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def ports():
    return free_ports(4)


def test_the_reader_publishes_each_pv_with_its_unit_severity_and_time_stamp(ports):
    ioc = Ioc(ports)
    try:
        code, answers, err = drive(
            [sys.executable, "-m", "daqflow.epics", "read", "--name", "epics",
             "--set", 'pvs=["HV:CH1:VMON", "HV:CH1:IMON", "HV:CH1:MODE", "HV:CH9:NOPE"]',
             "--set", "addr_list=127.0.0.1", "--set", "auto_addr_list=false", "--set", f"server_port={ports[0]}",
             "--set", f"repeater_port={ports[1]}", "--set", "connect_timeout_s=1.5"],
            ["configure", "stats", "start 7", "stop", "reset", "quit"],
        )
    finally:
        ioc.kill()
    assert code == 0, err
    assert all(a["ok"] for a in answers), answers
    slow = answers[1]["result"]["slow"]
    vmon = slow["HV:CH1:VMON"]
    assert (vmon["value"], vmon["unit"], vmon["severity"], vmon["status"]) == (1500.0, "V", 0, "NO_ALARM"), slow
    assert abs(vmon["at_ms"] / 1000 - time.time()) < 120, "the record's own time stamp"
    assert slow["HV:CH1:IMON"]["unit"] == "uA"
    assert slow["HV:CH1:MODE"]["value"] == 1.0, "an enum is its index"
    assert slow["HV:CH9:NOPE"] == {"value": None, "severity": 3, "status": "never connected"}
    assert answers[1]["result"]["detail"] == {"pvs": 4, "connected": 3, "disconnected": 1}
    assert "not connected after 1.5 s: HV:CH9:NOPE" in err
    at = answers[3]["result"]["detail"]
    assert at["at_start"]["HV:CH1:VMON"]["value"] == 1500.0 and at["at_stop"]["HV:CH1:VMON"]["unit"] == "V"


def test_pva_pvs_are_read_over_pvaccess_and_one_that_goes_away_loses_its_value(ports):
    pytest.importorskip("p4p", reason="pip install p4p (pvAccess)")
    port, repeater, pva, pva_bcast = ports
    ioc = Ioc(ports)
    reader = subprocess.Popen(
        [sys.executable, "-m", "daqflow.epics", "read", "--name", "epics",
         "--set", 'pvs=["pva://HV:CH1:VMON", "pva://HV:CH1:MODE", "HV:CH1:IMON"]',
         "--set", "pva_addr_list=127.0.0.1", "--set", "pva_auto_addr_list=false",
         "--set", f"pva_server_port={pva}", "--set", f"pva_broadcast_port={pva_bcast}",
         "--set", "addr_list=127.0.0.1", "--set", "auto_addr_list=false", "--set", f"server_port={port}",
         "--set", f"repeater_port={repeater}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ask(command):
        reader.stdin.write(command + "\n")
        reader.stdin.flush()
        while True:
            answer = json.loads(reader.stdout.readline())
            if "ok" in answer:
                return answer

    try:
        assert ask("configure")["ok"]
        slow = ask("stats")["result"]["slow"]
        vmon = slow["HV:CH1:VMON"]
        assert (vmon["value"], vmon["unit"], vmon["severity"], vmon["status"]) == (1500.0, "V", 0, "NO_ALARM"), slow
        assert abs(vmon["at_ms"] / 1000 - time.time()) < 120
        assert slow["HV:CH1:MODE"]["value"] == 1.0, "an NTEnum is its index"
        assert slow["HV:CH1:IMON"]["unit"] == "uA", "Channel Access beside pvAccess"
        ioc.set("VMON", 1521)
        vmon = wait_for("the MAJOR value", lambda: (lambda v: v["value"] == 1521.0 and v)(
            ask("stats")["result"]["slow"]["HV:CH1:VMON"]))
        assert (vmon["severity"], vmon["status"]) == (2, "HIHI"), vmon
        ioc.kill()
        vmon = wait_for("disconnected", lambda: (lambda v: v["status"] == "disconnected" and v)(
            ask("stats")["result"]["slow"]["HV:CH1:VMON"]))
        assert (vmon["value"], vmon["severity"]) == (None, 3)
        assert ask("stats")["result"]["detail"]["disconnected"] == 3
        assert ask("quit")["ok"]
    finally:
        ioc.kill()
        reader.kill()
        reader.wait(10)


def test_a_bad_pv_list_is_refused_at_configure():
    for pvs, why in [("[]", "`pvs` is empty"), ('["A B"]', "cannot name a slow value"), ('["A", "A"]', "A named twice")]:
        code, answers, err = drive([sys.executable, "-m", "daqflow.epics", "read", "--name", "epics", "--set",
                                    f"pvs={pvs}", "--set", "connect_timeout_s=0"], ["configure", "quit"])
        assert not answers[0]["ok"] and why in answers[0]["error"], (pvs, answers)
    code, answers, err = drive([sys.executable, "-m", "daqflow.epics", "read", "--name", "epics", "--set", "pvs=3"],
                               ["configure", "quit"])
    assert not answers[0]["ok"] and "pvs" in answers[0]["error"], answers


SYSTEM = """
[system]
name = "epics-test"
web = "127.0.0.1:{web}"

[history]
interval_s = 0.5

[[component]]
name = "epics"
kind = "epics"
command = {python}
[component.params]
pvs = ["HV:CH1:VMON", "HV:CH1:IMON"]
addr_list = "127.0.0.1"
auto_addr_list = false
server_port = {ca}
repeater_port = {repeater}

[[component]]
name = "ca"
kind = "epics_server"
command = {server}
[component.params]
bind = "127.0.0.1:{serve}"
prefix = "T:DAQ:"
operator = "http://127.0.0.1:{web}"
interval_s = 0.3

[[alarm]]
name = "hv-high"
when = "epics.HV:CH1:VMON > 1510 for 1 s while Running"
severity = "error"

[[alarm]]
name = "pv-lost"
when = "epics.detail.disconnected > 0"
"""

CAGET = textwrap.dedent("""
    import json, sys
    import epics
    out = {}
    for name in sys.argv[1:]:
        pv = epics.PV(name, form="ctrl")
        value = pv.get(timeout=5, as_string=name.endswith(("STATE", ":ALARM")))
        out[name] = {"value": value, "severity": pv.severity, "write": pv.write_access, "units": pv.units}
    run = next((n for n in sys.argv[1:] if n.endswith(":RUN")), None)
    if run:
        # A control room's write: refused by a read-only server (caput answers None or raises).
        try:
            out["put"] = epics.caput(run, 99, wait=True, timeout=3)
        except Exception as e:
            out["put"] = repr(e)
    print(json.dumps(out, default=str))
""")


def caget(serve_port, repeater, names):
    """The served PVs as pyepics (EPICS base's libca) reads them, in a process of its own."""
    p = subprocess.run([sys.executable, "-c", CAGET, *names], capture_output=True, text=True, timeout=60,
                       env=ca_env(serve_port, repeater))
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def wait_for(what, check, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def test_pvs_feed_history_alarms_and_the_run_record_and_the_daq_is_served_read_only(tmp_path):
    ca, repeater, pva, pva_bcast = free_ports(4)
    web, serve, _ = free_ports(3)
    ioc = Ioc([ca, repeater, pva, pva_bcast])
    system = tmp_path / "system.toml"
    system.write_text(SYSTEM.format(web=web, ca=ca, repeater=repeater, serve=serve,
                                    python=json.dumps([sys.executable, "-m", "daqflow.epics", "read"]),
                                    server=json.dumps([sys.executable, "-m", "daqflow.epics", "serve"])))
    check = subprocess.run([daqflow_binary(), "run", str(system), "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    data = tmp_path / "data"
    iocs = [ioc]
    try:
        with running_operator(system, data) as (url, _):
            check_the_run(url, data, iocs, ca, repeater, pva, pva_bcast, serve)
    finally:
        for ioc in iocs:
            ioc.kill()


def check_the_run(url, data, iocs, ca, repeater, pva, pva_bcast, serve):
    """Everything the PVs feed, and what is served, in one run of the operator at `url` (a new
    IOC it starts goes into `iocs`)."""
    ioc = iocs[0]
    with daqflow.Operator(url, data=str(data)) as op:
        op.configure()
        run = op.start()

        def component(name):
            return next(c for c in op.status()["components"] if c["name"] == name)

        slow = wait_for("the PVs in the status", lambda: component("epics")["stats"].get("slow"))
        assert (slow["HV:CH1:VMON"]["value"], slow["HV:CH1:VMON"]["unit"]) == (1500.0, "V"), slow

        # Above the record's HIGH limit (MINOR) and the alarm's 1510 for 1 s: raised, with the unit.
        ioc.set("VMON", 1515)

        def alarm(name):
            return next(a for a in op.alarms()["alarms"] if a["name"] == name)

        raised = wait_for("hv-high raised", lambda: alarm("hv-high")["state"] == "raised" and alarm("hv-high"))
        assert raised["value"] == 1515.0
        event = next(e for e in op.alarms()["events"] if e["name"] == "hv-high" and e["kind"] == "raised")
        assert "epics.HV:CH1:VMON = 1515 V" in event["message"], event
        assert component("epics")["stats"]["slow"]["HV:CH1:VMON"]["status"] == "HIGH"

        # The history has the PV and its severity by name.
        names = wait_for("history names", lambda: {"epics.HV:CH1:VMON", "epics.HV:CH1:VMON.severity"}
                         <= set(op.history_names()) and op.history_names())
        assert "epics.HV:CH1:IMON" in names
        points = wait_for("a sample of 1515",
                          lambda: [p for p in op.history("epics.HV:CH1:VMON", seconds=60)["points"]
                                   if p["value"] == 1515.0])
        assert points

        # The DAQ as the control room reads it: another implementation (libca) than caproto's server.
        names = ["T:DAQ:STATE", "T:DAQ:RUN", "T:DAQ:RUNNING", "T:DAQ:EVENT_RATE", "T:DAQ:ALARMS",
                 "T:DAQ:ALARM", "T:DAQ:ALARM:hv-high", "T:DAQ:ALARM:pv-lost", "T:DAQ:HEARTBEAT"]
        got = wait_for("the served PVs", lambda: (lambda g: g["T:DAQ:ALARM:hv-high"]["value"] == 1 and g)(
            caget(serve, repeater, names)), timeout=60)
        assert got["T:DAQ:STATE"]["value"] == "Running", got
        assert (got["T:DAQ:RUN"]["value"], got["T:DAQ:RUNNING"]["value"]) == (run, 1), got
        assert got["T:DAQ:EVENT_RATE"]["units"] == "Hz"
        assert (got["T:DAQ:ALARMS"]["value"], got["T:DAQ:ALARMS"]["severity"]) == (1, 2), got
        assert (got["T:DAQ:ALARM:hv-high"]["severity"], got["T:DAQ:ALARM:pv-lost"]["value"]) == (2, 0), got
        assert got["T:DAQ:ALARM"]["value"] == "hv-high"
        assert not any(v["write"] for k, v in got.items() if k != "put"), "read-only"
        assert got["put"] != 1, f"a write was taken: {got['put']}"  # pyepics's caput: 1 when written
        assert caget(serve, repeater, ["T:DAQ:RUN"])["T:DAQ:RUN"]["value"] == run

        # The IOC goes away mid-run: the PVs lose their values, an alarm is raised, the run goes on.
        ioc.kill()
        wait_for("pv-lost raised", lambda: alarm("pv-lost")["state"] == "raised")
        epics = component("epics")
        assert epics["state"] == "Running" and op.status()["state"] == "Running", op.status()
        assert epics["stats"]["detail"]["disconnected"] == 2
        lost = epics["stats"]["slow"]["HV:CH1:VMON"]
        assert (lost["value"], lost["severity"], lost["status"], lost["unit"]) == (None, 3, "disconnected", "V"), lost
        wait_for("hv-high no longer holding", lambda: alarm("hv-high")["state"] == "cleared")

        # A new IOC on the same port: the reader reconnects by itself.
        ioc = Ioc([ca, repeater, pva, pva_bcast])
        iocs.append(ioc)
        wait_for("reconnected", lambda: component("epics")["stats"]["slow"]["HV:CH1:VMON"]["value"] == 1500.0,
                 timeout=60)
        summary = op.stop()
        assert summary["run"] == run
    record = op.run(run)["summary"]["components"]["epics"]["summary"]
    start, stop = record["detail"]["at_start"], record["detail"]["at_stop"]
    assert (start["HV:CH1:VMON"]["value"], start["HV:CH1:VMON"]["unit"], start["HV:CH1:VMON"]["severity"]) == \
        (1500.0, "V", 0), start
    assert stop["HV:CH1:VMON"]["value"] == 1500.0 and stop["HV:CH1:IMON"]["unit"] == "uA", stop
    assert record["slow"]["HV:CH1:VMON"]["at_ms"] >= start["HV:CH1:VMON"]["at_ms"]


class FakeOperator:
    """An operator's web API as far as the server reads it: /api/status and /api/alarms."""

    def __init__(self):
        import http.server

        self.status = {"state": "Configured", "run": 4, "running": False, "events": 1000, "events_per_s": 0.0}
        self.alarms = {"alarms": [{"name": "disk", "state": "ok", "severity": "warning"}], "events": []}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(fake.status if self.path == "/api/status" else fake.alarms).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.closed = False
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        if not self.closed:
            self.closed = True
            self.server.shutdown()
            self.server.server_close()


def test_the_server_needs_an_explicit_address_and_an_operator_and_goes_invalid_without_one():
    serve, repeater, dead = free_ports(3)
    base = [sys.executable, "-m", "daqflow.epics", "serve", "--name", "ca"]
    code, answers, err = drive(base, ["configure", "quit"])
    assert not answers[0]["ok"] and "bind" in answers[0]["error"], answers
    code, answers, err = drive(base + ["--set", f"bind=127.0.0.1:{serve}", "--set",
                                       f"operator=http://127.0.0.1:{dead}"], ["configure", "quit"])
    assert not answers[0]["ok"] and f"web API at http://127.0.0.1:{dead} does not answer" in answers[0]["error"]

    fake = FakeOperator()
    proc = subprocess.Popen(base + ["--set", f"bind=127.0.0.1:{serve}", "--set", f"operator={fake.url}",
                                    "--set", "interval_s=0.2", "--set", "prefix=F:"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("configure\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["ok"] and answer["result"]["bind"] == f"127.0.0.1:{serve}", answer
        got = wait_for("served", lambda: (lambda g: g["F:RUN"]["value"] == 4 and g)(
            caget(serve, repeater, ["F:STATE", "F:RUN", "F:EVENTS", "F:ALARM:disk"])))
        assert (got["F:STATE"]["value"], got["F:EVENTS"]["value"], got["F:ALARM:disk"]["value"]) == \
            ("Configured", 1000.0, 0), got
        assert got["F:STATE"]["severity"] == 0
        # The operator goes away: every PV turns INVALID (severity 3), as a control room shows stale data.
        fake.close()
        got = wait_for("invalid", lambda: (lambda g: g["F:RUN"]["severity"] == 3 and g)(
            caget(serve, repeater, ["F:STATE", "F:RUN"])))
        assert got["F:STATE"]["severity"] == 3 and got["F:RUN"]["value"] == 4, "the last value, marked invalid"
    finally:
        proc.kill()
        proc.wait(10)
        fake.close()


def test_the_docs_list_every_served_pv_with_its_type_and_unit():
    import re

    from daqflow.epics import SERVED

    text = (HERE.parent.parent / "docs" / "epics.md").read_text()
    table = re.findall(r"^\| `([A-Z_]+(?::NAME)?)` \| (string|long|double) \|([^|]*)\|", text, re.M)
    documented = [(name.replace(":NAME", ":<name>"), {"long": "int"}.get(kind, kind), unit.strip() or None)
                  for name, kind, unit in table]
    assert documented == [(name, kind, unit) for name, kind, unit, _ in SERVED]
