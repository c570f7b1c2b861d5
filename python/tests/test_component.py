"""Components written in Python (daqflow.Component), the source protocol from Python
(daqflow.SourceStream), and scripted runs through the operator's HTTP API (daqflow.Operator):
each with real processes, against the `daqflow` binary."""

import json
import re
import struct
import subprocess
import sys
import time

import pytest

import daqflow

from conftest import REPO, daqflow_binary, running_operator

EXAMPLES = REPO / "python" / "examples"


def drive(argv, lines, timeout=60, env=None):
    """Runs a component process, types `lines`, returns its answers (one JSON object per
    command) and its standard error."""
    p = subprocess.run(argv, input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                       timeout=timeout, env=env)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    # A failure during a run is a line of its own ({"event": "error", …}), not an answer.
    answers = [l for l in lines if "ok" in l]
    return p.returncode, answers, p.stderr


COMMANDS = ["configure", "start 3", "stats", "pause", "resume", "stop", "reset", "configure", "quit"]


def check_counter_answers(answers):
    assert [a["state"] for a in answers] == [
        "Configured", "Running", "Running", "Paused", "Running", "Configured", "Initial", "Configured", "Configured",
    ], answers
    assert all(a["ok"] for a in answers), answers
    assert answers[0]["result"] == {"step": 5}
    assert answers[1]["result"] == {"run": 3}
    assert answers[5]["result"]["events"] >= 5 and answers[5]["result"]["events"] % 5 == 0


def test_a_python_component_speaks_the_line_protocol():
    code, answers, err = drive([sys.executable, str(EXAMPLES / "counter.py"), "--name", "c1", "--set", "step=5"],
                               COMMANDS)
    assert code == 0, err
    check_counter_answers(answers)
    # Its log line went to standard error with the process's other records.
    assert "run 3: counting in steps of 5" in err


def test_a_python_component_declares_its_parameters_and_changes_the_live_ones_in_a_run():
    code, answers, err = drive(
        [sys.executable, str(EXAMPLES / "counter.py"), "--name", "c1", "--set", "step=5"],
        ["schema", "configure", "start 1", "set step=7", "set step=0", "set stepp=2", "stop", "quit"],
    )
    assert code == 0, err
    schema, configure, start, live, too_small, misspelt, stop = answers[:7]
    key = schema["result"]["keys"][0]
    assert (key["name"], key["type"], key["min"], key["max"], key["default"]) == ("step", "integer", 1, 1000, 1)
    assert key["live"] == ["Configured", "Running", "Paused"] and key["doc"]
    assert schema["result"]["outputs"][0]["name"] == "step"
    assert configure["result"] == {"step": 5} and start["ok"]
    assert live["ok"] and live["state"] == "Running", live
    assert "counting in steps of 7 from now on" in err
    # Refused by the schema before the component sees the value, the run going on.
    assert not too_small["ok"] and too_small["state"] == "Running" and too_small["kind"] == "refused", too_small
    assert "`step` = 0 is out of range: 1 … 1000" in too_small["error"], too_small
    assert not misspelt["ok"] and "`stepp`: no such key; did you mean `step`?" in misspelt["error"], misspelt
    assert stop["ok"] and stop["result"]["events"] > 0, stop
    # A value out of range, or an unknown key, is refused at configure too.
    code, answers, err = drive([sys.executable, str(EXAMPLES / "counter.py"), "--name", "c1", "--set", "step=5000"],
                               ["configure"])
    assert not answers[0]["ok"] and "`step` = 5000 is out of range: 1 … 1000" in answers[0]["error"], answers
    assert answers[0]["kind"] == "config", answers
    # Without --set, the declared default fills the configuration.
    code, answers, err = drive([sys.executable, str(EXAMPLES / "counter.py"), "--name", "c1"], ["configure"])
    assert answers[0]["result"] == {"step": 1}, answers


def test_a_parameter_is_declared_with_a_type_a_range_and_a_doc():
    with pytest.raises(ValueError, match="doc"):
        daqflow.Parameter("x", int, doc="")
    with pytest.raises(ValueError, match="live states"):
        daqflow.Parameter("x", int, doc="x", live=("Running", "Initial"))
    with pytest.raises(ValueError, match="min 5 is above max 1"):
        daqflow.Parameter("x", float, doc="x", min=5, max=1)
    with pytest.raises(ValueError, match="type"):
        daqflow.Parameter("x", set, doc="x")
    with pytest.raises(ValueError, match="min and max"):
        daqflow.Parameter("x", list, doc="x", min=1)
    assert daqflow.Parameter("pvs", list, doc="PVs.")._json()["of"] == {"type": "text"}
    assert daqflow.Parameter("t", dict, doc="T.")._json()["type"] == "table"
    p = daqflow.Parameter("mode", ["fast", "slow"], doc="How.", default="fast")
    assert p._json() == {"name": "mode", "type": "choice", "values": ["fast", "slow"], "required": False,
                         "live": [], "doc": "How.", "default": "fast"}


def test_slow_values_in_statistics_are_checked():
    from daqflow.component import _stats_json

    out = json.loads(_stats_json({"events": 1, "slow": {"A:B": 1.5, "C": {"value": float("nan"), "unit": "V",
                                                                          "severity": 2}}}, "stats()"))
    assert out["slow"] == {"A:B": {"value": 1.5}, "C": {"value": None, "unit": "V", "severity": 2}}
    for bad, why in [({"events": 1}, "cannot name"), ({"x y": 1}, "cannot name"), ({"detail.x": 1}, "cannot name"),
                     ({"A": {"severity": 4}}, "not 0 … 3"), ({"A": {"vale": 1}}, "unknown keys vale")]:
        with pytest.raises(ValueError, match=why):
            _stats_json({"slow": bad}, "stats()")
    with pytest.raises(TypeError, match="dict of slow values"):
        _stats_json({"slow": [1]}, "stats()")


def test_daqflow_component_command_runs_a_python_component():
    cmd = f"{sys.executable} {EXAMPLES / 'counter.py'}"
    code, answers, err = drive([daqflow_binary(), "component", "--command", cmd, "--name", "c2", "--set", "step=5"],
                               COMMANDS)
    assert code == 0, err
    check_counter_answers(answers)


def test_a_hook_that_raises_fails_its_transition_and_reset_recovers(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(
        "import daqflow\n"
        "class Broken(daqflow.Component):\n"
        "    def configure(self):\n"
        "        if self.config.get('bad'):\n"
        "            raise ValueError('no hardware on this crate')\n"
        "    def start(self, run):\n"
        "        self.fail('the crate lost power')\n"
        "    def stats(self):\n"
        "        return {'events': 1, 'colour': 'blue'}\n"
        "if __name__ == '__main__':\n"
        "    Broken.main()\n"
    )
    code, answers, err = drive(
        [sys.executable, str(script), "--name", "b", "--set", "bad=true"],
        ["configure", "reset", "state"],
    )
    assert answers[0]["ok"] is False and "no hardware on this crate" in answers[0]["error"], answers
    assert answers[0]["kind"] in ("config", "failed"), answers
    assert answers[0]["state"] == "Error"
    assert answers[1]["state"] == "Initial"
    assert "ValueError" in err  # the traceback is in the log
    # A failure reported during the run puts the component in Error; an unknown statistic is
    # refused with its name.
    code, answers, err = drive([sys.executable, str(script), "--name", "b"], ["configure", "start 1", "state", "stats"])
    assert answers[1]["ok"] is True
    assert answers[2]["state"] == "Error" and "the crate lost power" in json.dumps(answers[2]), answers
    assert "unknown statistics colour" in err


def test_bad_arguments_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="role"):
        class Wrong(daqflow.Component):
            role = "conductor"
        Wrong.run("w")
    with pytest.raises(daqflow.Error, match="cannot connect"):
        daqflow.SourceStream("127.0.0.1:1", 0, 1, timeout=0.2)


def demo_with_python_source(tmp_path, web="none"):
    """The demo's system file with its source src-3 replaced by python/examples/readout.py."""
    text = subprocess.run([daqflow_binary(), "demo", "--print-config"], capture_output=True, text=True,
                          check=True).stdout
    start = text.rindex("[[component]]", 0, text.index('name = "src-3"'))
    readout = f'''[[component]]
name = "src-3"
kind = "source"
command = {json.dumps([sys.executable, str(EXAMPLES / "readout.py")])}
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 3
ru = "${{ru-1.listen}}"
rate_hz = 2000.0
size = 1024
'''
    after = text.find("[[component]]", start + 1)
    text = text[:start] + readout + ("\n" + text[after:] if after >= 0 else "")
    text = re.sub(r'(?m)^web = .*$', f'web = "{web}"', text)
    path = tmp_path / "system.toml"
    path.write_text(text)
    return path


def test_a_python_readout_takes_the_place_of_an_emulated_source_in_the_demo(tmp_path):
    system = demo_with_python_source(tmp_path)
    data = tmp_path / "data"
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "3", "--data", str(data)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"(?m)^lost: 0$", run.stdout), run.stdout
    # The run database's summary: src-3 (Python) sent every event the trigger decided on (a
    # source runs ahead of the trigger; the readout units drop what was never triggered).
    import sqlite3
    with sqlite3.connect(data / "runs.sqlite") as db:
        (summary,) = db.execute("select summary from runs where run = 1").fetchone()
    summary = json.loads(summary)
    assert summary["lost"] == 0 and summary["state"] == "stopped", summary
    src3 = summary["components"]["src-3"]
    assert src3["kind"] == "source"
    assert src3["summary"]["events"] >= summary["triggered"] > 1000, (src3, summary["triggered"])
    # Every recorded event holds src-3's fragment, whose payload is what readout.py made.
    files = sorted((data / "files").glob("run000001_*.daq"))
    assert files
    seen = 0
    for f in files:
        for event in daqflow.open(f):
            (fragment,) = [fr for sf in event.super_fragments for fr in sf.fragments if fr.source_id == 3]
            event_id, source = struct.unpack_from("<QQ", fragment.payload)
            assert (event_id, source) == (event.id, 3)
            assert len(fragment.payload) == 1024
            seen += 1
    assert seen == summary["recorded"]
    # Its log is where every component's is.
    log = (data / "logs" / "src-3.log").read_text()
    assert "command done command=stop" in log


@pytest.fixture
def operator(tmp_path):
    """A `daqflow run` of the demo with the Python source, serving its HTTP API."""
    system = demo_with_python_source(tmp_path, web="127.0.0.1:0")
    data = tmp_path / "data"
    with running_operator(system, data) as (url, _):
        yield url, data


def test_a_script_drives_runs_through_the_operator(operator, monkeypatch):
    url, data = operator
    monkeypatch.delenv("DAQFLOW_WEB_TOKEN", raising=False)
    # A wrong token is refused at the login.
    with pytest.raises(daqflow.OperatorError) as refused:
        daqflow.Operator(url, token="wrong-token-0123456789")
    assert refused.value.status == 403
    op = daqflow.Operator(url, data=str(data))
    assert op.state() == "Initial"
    with pytest.raises(daqflow.OperatorError) as e:
        op.configure()
    assert e.value.status == 403 and "take control" in e.value.message
    with op:
        assert op.control()["you"] is True
        configured = op.configure()
        assert "listen" in configured["evm"]
        # Configured: a parameter that is not live is refused with the component's reason.
        with pytest.raises(daqflow.OperatorError) as e:
            op.set("src-0", "source_id", 9)
        assert e.value.status == 400 and "cannot change after configure" in e.value.message
        run = op.start()
        status = op.wait(events=500, timeout=60)
        assert status["events"] >= 500 and status["running"]
        # Running: a live parameter is taken at once and recorded with the run.
        assert op.set("src-0", "rate_hz", 2500)["overrides"]["src-0.rate_hz"] == 2500
        summary = op.stop()
        assert summary["run"] == run and summary["lost"] == 0 and summary["events"] >= 500
        assert [(c["component"], c["key"], c["value"]) for c in summary["changes"]] == [("src-0", "rate_hz", 2500)]
        assert op.runs(limit=1)[0]["run"] == run
        assert op.run(run)["summary"]["events"] == summary["events"]
        # Without a token a script watches (the operator's web UI is on loopback): the status
        # and the run history; every call that acts is refused before it is sent, saying how
        # to give the token.
        watcher = daqflow.Operator(url)
        assert (watcher.may_control, watcher.me) == (False, None)
        assert watcher.state() == "Configured" and watcher.status()["run"] == run
        assert watcher.runs(limit=1)[0]["run"] == run and watcher.run(run)["summary"]["lost"] == 0
        assert isinstance(watcher.logs(limit=5), list) and watcher.control()["you"] is False
        for act in (watcher.take_control, watcher.configure, lambda: watcher.set("src-0", "rate_hz", 1)):
            with pytest.raises(daqflow.OperatorError) as e:
                act()
            assert e.value.status == 403, e.value
            for hint in ("no web token", "token=", "token_file=", "web-token", "$DAQFLOW_WEB_TOKEN"):
                assert hint in e.value.message, (hint, e.value.message)
        with pytest.raises(daqflow.OperatorError, match="no web token"):
            with daqflow.Operator(url):
                pass
        assert op.control()["you"] is True, "the watcher took nothing"
        op.reset()
        op.unset("src-0", "rate_hz")
        with pytest.raises(daqflow.OperatorError) as e:
            op.set("nobody", "rate_hz", 1)
        assert e.value.status == 400 and "no component `nobody`" in e.value.message
    assert op.control()["controlled"] is False


def test_the_scan_example_takes_five_runs_each_with_its_value(operator):
    url, data = operator
    values = [500, 1000, 1500, 2000, 2500]
    # The command line of docs/python.md.
    scan = subprocess.run(
        [sys.executable, str(EXAMPLES / "scan.py"), url, "--data", str(data), "--set", "src-3.rate_hz",
         "--values", *map(str, values), "--seconds", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert scan.returncode == 0, scan.stdout + scan.stderr
    lines = scan.stdout.splitlines()
    assert sum("0 lost in" in l for l in lines) == 5, scan.stdout
    records = [json.loads(l) for l in lines if l.startswith("{")]
    assert [r["overrides"] for r in records] == [{"src-3.rate_hz": v} for v in values]
    assert all(r["state"] == "stopped" and r["lost"] == 0 for r in records), records
    # The slowest source sets the pace: the Python source's rate shows in the event rates.
    op = daqflow.Operator(url, data=str(data))
    summaries = [op.run(r["run"])["summary"] for r in records]
    rates = [s["events"] / s["seconds"] for s in summaries]
    assert rates[-1] > rates[0] * 1.5, rates
    # The scan took its setting back at the end.
    assert op.status()["overrides"] == {}


def test_the_operator_example_of_the_python_guide_runs(operator, capsys, monkeypatch):
    url, data = operator
    monkeypatch.delenv("DAQFLOW_WEB_TOKEN", raising=False)
    doc = REPO / "docs" / "python.md"
    blocks = re.findall(r"^```python operator\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"{doc}:operator-block{i}", "exec"), {"URL": url, "DATA": str(data)})
    first, second, watching = capsys.readouterr().out.splitlines()[:3]
    run, events, recorded, lost = map(int, first.split())
    assert events >= 1000 and recorded == events and lost == 0
    assert second == f"{run} 0"
    assert watching == "False Initial"


def test_a_script_reads_the_history_of_slow_values(operator):
    url, data = operator
    op = daqflow.Operator(url, data=str(data))
    # The operator samples every 5 s (the default interval): the names come with the first sample.
    deadline = time.monotonic() + 60
    names = []
    while not {"system.state", "evm.events", "src-3.events"} <= set(names):
        assert time.monotonic() < deadline, names
        time.sleep(0.5)
        try:
            names = op.history_names()
        except daqflow.OperatorError:
            names = []
    assert names == sorted(names)
    series = op.history("system.state", seconds=600)
    assert series["name"] == "system.state" and series["to_ms"] - series["from_ms"] == 600_000
    assert series["points"] and all(p["value"] == 0.0 and p["count"] == 1 for p in series["points"]), series
    one = op.history("evm.events", from_ms=0, points=1)
    assert len(one["points"]) == 1 and one["points"][0]["count"] >= 1
    with pytest.raises(daqflow.OperatorError) as e:
        op.history("nobody.events")
    assert e.value.status == 404 and "nobody.events" in e.value.message
