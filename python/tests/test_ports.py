"""Chain components with named, typed ports written in Python (daqflow.PortComponent): the
example python/examples/threshold.py under the operator with real processes (a generator into
its typed input, its two outputs into a logger and a sink), its schema (the port keys added to
its own), a stream of another type refused, a hook that raises, and `out` kept past its call."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import daqflow

from conftest import REPO, daqflow_binary

EXAMPLE = REPO / "python" / "examples" / "threshold.py"


def system_file(tmp_path, threshold, command=None):
    """A generator into the component's input `raw`, `accepted` into a logger, `rejected` into
    a sink. The generator's chunks begin with the bytes 0, 1: a first sample of 256."""
    data = tmp_path / "data"
    command = command or [sys.executable, str(EXAMPLE)]
    text = f'''[system]
name = "ports-python-test"
control = "127.0.0.1:0"
data = "{data}"
web = "none"

[[component]]
name = "log"
kind = "logger"
[component.params]
directory = "{data / "files"}"
sync_on_close = false

[[component]]
name = "sink"
kind = "sink"

[[component]]
name = "cut"
kind = "threshold"
command = {json.dumps(command)}
[component.params]
threshold = {threshold}
downstream.accepted = "${{log.listen}}"
downstream.rejected = "${{sink.listen}}"

[[component]]
name = "gen"
kind = "generator"
[component.params]
downstream = "${{cut.raw}}"
chunk_bytes = 1024
rate_hz = 1000.0
'''
    path = tmp_path / "system.toml"
    path.write_text(text)
    return path, data


def summary_of(data):
    with sqlite3.connect(data / "runs.sqlite") as db:
        (summary,) = db.execute("select summary from runs where run = 1").fetchone()
    return json.loads(summary)


@pytest.mark.parametrize("threshold,to_log", [(200, True), (300, False)])
def test_a_python_component_with_named_typed_ports_runs_under_the_operator(tmp_path, threshold, to_log):
    system, data = system_file(tmp_path, threshold)
    check = subprocess.run([daqflow_binary(), "run", str(system), "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "2"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = summary_of(data)
    stats = {name: c["summary"] for name, c in summary["components"].items()}
    sent, cut, log, sink = stats["gen"], stats["cut"], stats["log"], stats["sink"]
    assert sent["events"] > 100, sent
    assert cut["events"] == sent["events"], cut
    accepted, rejected = (sent["events"], 0) if to_log else (0, sent["events"])
    assert cut["detail"]["logic"] == {"accepted": accepted, "rejected": rejected}, cut
    assert [p["name"] for p in cut["detail"]["outputs"]] == ["accepted", "rejected"]
    assert all(p["end"] for p in cut["detail"]["inputs"] + cut["detail"]["outputs"]), cut
    assert (log["events"], sink["events"]) == (accepted, rejected)
    # Each receiver saw its stream whole: its end marker, nothing missing, no sequence error.
    for s in (log, sink):
        assert s["detail"]["end_seen"] is True and s["detail"]["missing"] == 0, s
    # Every chunk that went through Python is a whole record of the logger's files (each
    # record's CRC checked).
    if to_log:
        records = 0
        for f in (data / "files").glob("*.daq"):
            report = daqflow.open(f).verify()
            assert report.problems == [] and report.complete, report.as_dict()
            records += report.records
        assert records == sent["events"]


def test_its_schema_has_its_own_keys_and_the_ports_and_names_a_misspelt_one(tmp_path):
    code = subprocess.run([sys.executable, str(EXAMPLE), "--name", "cut"], input="schema\nquit\n",
                          capture_output=True, text=True, timeout=60)
    answer = json.loads(code.stdout.splitlines()[0])
    keys = {k["name"]: k for k in answer["result"]["keys"]}
    assert keys["threshold"]["type"] == "integer" and keys["threshold"]["max"] == 65535
    assert keys["downstream.accepted"]["required"] and keys["downstream.rejected"]["required"]
    assert keys["listen.raw"]["type"] == "address"
    assert {"connect_timeout_ms", "stop_timeout_ms", "send_queue_bytes"} <= set(keys)
    outputs = {k["name"] for k in answer["result"]["outputs"]}
    assert outputs == {"listen", "raw"}
    # A misspelt key, a value out of range and a missing output: the component refuses its
    # configuration with each named (its schema is its own: the operator learns it when the
    # process publishes it, so `--check` cannot), and no run starts.
    system, _ = system_file(tmp_path, 70000)
    text = system.read_text().replace("downstream.rejected", "downstream.rejectd")
    system.write_text(text)
    check = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "1"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode != 0
    err = check.stdout + check.stderr
    assert "threshold" in err and "65535" in err, err
    assert "downstream.rejectd" in err and "downstream.rejected" in err, err


RELAY = """
import daqflow

class Relay(daqflow.PortComponent):
    kind = "relay"
    inputs = [daqflow.InPort("in")]
    outputs = [daqflow.OutPort("out", "tdc")]

    def on_chunk(self, input, data, out):
        out.send("out", data)

if __name__ == "__main__":
    Relay.main()
"""


def test_a_stream_of_another_type_is_refused_and_a_raising_hook_fails_the_component(tmp_path):
    # A relay between the generator and the cut says `tdc` in its begin marker; the cut's
    # input takes `adc`: refused, the cut fails, the run says why.
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    system, data = system_file(tmp_path, 200)
    text = system.read_text().replace('downstream = "${cut.raw}"', 'downstream = "${relay.in}"')
    text += f"""
[[component]]
name = "relay"
kind = "relay"
command = {json.dumps([sys.executable, str(relay)])}
[component.params]
downstream.out = "${{cut.raw}}"
"""
    system.write_text(text)
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "2"],
                         capture_output=True, text=True, timeout=180)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    # The relay's writes then fail too; whichever the operator heard of first stops the run,
    # and the run's record keeps the cut's reason.
    cut = summary_of(data)["components"]["cut"]["summary"]["detail"]
    assert "sends data of another type" in cut["error"] and "this input takes `adc`" in cut["error"], cut
    assert cut["inputs"][0]["chunks"] == 0, cut

    # A hook that raises: the component goes to Error with the exception's text.
    broken = tmp_path / "broken.py"
    broken.write_text(EXAMPLE.read_text().replace(
        "        first = int.from_bytes(data[:2], \"little\")",
        "        raise RuntimeError(\"the cut has no calibration\")"))
    (tmp_path / "broken").mkdir()
    system, data = system_file(tmp_path / "broken", 200, command=[sys.executable, str(broken)])
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "2"],
                         capture_output=True, text=True, timeout=180)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "the cut has no calibration" in out, out


KEEPER = """
import threading
import daqflow

class Keeper(daqflow.PortComponent):
    kind = "keeper"
    inputs = [daqflow.InPort("in")]
    outputs = [daqflow.OutPort("out")]

    def begin(self, run):
        self.kept, self.errors, self.chunks = None, {}, 0

    def on_chunk(self, input, data, out):
        self.kept = out
        self.chunks += 1
        try:
            out.send("nowhere", data)
        except ValueError as e:
            self.errors["nowhere"] = str(e)
        out.send("out", data)
        if self.chunks == 50 and FAIL:
            threading.Thread(target=self.fail, args=("the HV tripped",)).start()

    def detail(self):
        # Asked between calls: `out` is not lent now.
        if getattr(self, "kept", None) is not None:
            try:
                self.kept.send("out", b"late")
            except daqflow.Error as e:
                self.errors["kept"] = str(e)
        return dict(getattr(self, "errors", {}))

if __name__ == "__main__":
    Keeper.main()
"""


def keeper_system(tmp_path, fail):
    keeper = tmp_path / "keeper.py"
    keeper.write_text(KEEPER.replace("FAIL", str(fail)))
    system, data = system_file(tmp_path, 200, command=[sys.executable, str(keeper)])
    text = system.read_text().replace('kind = "threshold"', 'kind = "keeper"').replace(
        "threshold = 200\ndownstream.accepted", "downstream.out").replace(
        'downstream.rejected = "${sink.listen}"\n', "").replace("${cut.raw}", "${cut.in}")
    system.write_text(text)
    return system, data


def test_out_is_lent_for_the_call_only_and_a_failure_from_a_thread_fails_the_component(tmp_path):
    system, data = keeper_system(tmp_path, fail=False)
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "2"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    cut = summary_of(data)["components"]["cut"]["summary"]
    errors = cut["detail"]["logic"]
    assert errors["nowhere"] == "no output port `nowhere` (its outputs: out)", errors
    assert "`out` is lent to on_chunk() and end() only while they run" in errors["kept"], errors
    # The late send sent nothing: the logger has exactly the chunks the component received.
    log = summary_of(data)["components"]["log"]["summary"]
    assert log["events"] == cut["events"] > 100 and log["detail"]["missing"] == 0, (log, cut)

    fails = tmp_path / "fails"
    fails.mkdir()
    system, data = keeper_system(fails, fail=True)
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "3"],
                         capture_output=True, text=True, timeout=180)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "the HV tripped" in out, out


def test_the_ports_a_class_declares_are_checked():
    class NoInput(daqflow.PortComponent):
        outputs = [daqflow.OutPort("out")]
    with pytest.raises(ValueError, match="declares no input port"):
        NoInput.run("n")

    class Twice(daqflow.PortComponent):
        inputs = [daqflow.InPort("a"), daqflow.InPort("a")]
    with pytest.raises(ValueError, match="declared twice"):
        Twice.run("t")

    class Listen(daqflow.PortComponent):
        inputs = [daqflow.InPort("listen")]
    with pytest.raises(ValueError, match="the name is taken"):
        Listen.run("l")

    class NotAPort(daqflow.PortComponent):
        inputs = ["raw"]
    with pytest.raises(TypeError, match="holds daqflow.InPort"):
        NotAPort.run("p")
    with pytest.raises(ValueError, match="data type"):
        daqflow.InPort("a", "")
