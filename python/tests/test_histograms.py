"""A monitor's own histograms (daqflow.histograms): filling, the published form, a Python
component publishing them, and the operator summing a group's."""

import json
import math
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import daqflow
from daqflow.histograms import H1, H2, Histograms

from conftest import daqflow_binary, running_operator
from test_component import drive
from test_export import need

np = pytest.importorskip("numpy")


def test_h1_fills_numbers_and_arrays_alike():
    one, many = H1("adc", "ADC", "counts", 0, 10, 5), H1("adc", "ADC", "counts", 0, 10, 5)
    values = [0.0, 1.9, 2.0, 9.99, 10.0, -0.5, float("nan"), 5.0, 5.0]
    for v in values:
        one.fill(v)
    many.fill(np.array(values))
    assert one.to_json() == many.to_json()
    j = one.to_json()
    assert j["bins"] == [2, 1, 2, 0, 1]
    assert (j["underflow"], j["overflow"], j["entries"]) == (2, 1, 9), "NaN is underflow, high is overflow"
    assert (j["min"], j["max"]) == (-0.5, 10.0)
    assert math.isclose(j["sum"], sum(v for v in values if not math.isnan(v)))
    assert math.isclose(j["mean"], j["sum"] / 9)
    many.fill([1.0, 1.0], weight=3)
    assert many.to_json()["bins"][0] == 8
    many.reset()
    assert many.to_json()["entries"] == 0 and many.to_json()["mean"] is None


def test_h2_counts_row_by_row_and_what_falls_outside():
    h = H2("map", "Map", ("channel", 0, 4, 4), ("ns", 0, 100, 2))
    h.fill(1.5, 10.0)
    h.fill(np.array([3.9, 3.0, 3.0, 4.0, np.nan]), np.array([99.0, 50.0, 50.0, 10.0, 10.0]))
    h.fill(0, -1)
    assert (h.bin(1, 0), h.bin(3, 1)) == (1, 3)
    j = h.to_json()
    assert (j["kind"], j["entries"], j["outside"], len(j["bins"])) == ("h2", 7, 3, 8)
    assert j["x"] == {"label": "channel", "low": 0.0, "high": 4.0, "bins": 4}
    with pytest.raises(ValueError, match="as many x as y"):
        h.fill(np.zeros(3), np.zeros(2))


def test_a_set_books_by_first_use_and_refuses_a_name_of_another_kind():
    hs = Histograms()
    hs.h1("a", "A", "x", 0, 1, 4).fill(0.5)
    hs.h1("a", "ignored", "x", 0, 99, 2).fill(0.6)
    hs.counter("n", "N", "hits").add(3)
    assert [h["name"] for h in hs.to_json()] == ["a", "n"]
    assert hs["a"].to_json()["entries"] == 2 and hs["a"].title == "A"
    with pytest.raises(ValueError, match="booked as a H1, not a Counter"):
        hs.counter("a", "A", "")
    with pytest.raises(ValueError, match="count only grows"):
        hs["n"].add(-1)
    hs.reset()
    assert [h.get("entries", h.get("value")) for h in hs.to_json()] == [0, 0]
    with pytest.raises(ValueError, match="high > low"):
        H1("bad", "", "", 1, 1, 3)


def test_filling_from_a_thread_while_publishing_gives_consistent_copies():
    h = H1("x", "X", "", 0, 100, 10)
    stop = threading.Event()

    def fill():
        while not stop.is_set():
            h.fill(np.arange(100.0))

    t = threading.Thread(target=fill)
    t.start()
    try:
        for _ in range(200):
            j = h.to_json()
            assert sum(j["bins"]) + j["underflow"] + j["overflow"] == j["entries"]
    finally:
        stop.set()
        t.join()


MONITOR = textwrap.dedent('''
    import daqflow

    class Mon(daqflow.Component):
        kind = "mon"

        def start(self, run):
            value = float(self.config.get("value", 1.0))
            for _ in range(int(self.config.get("n", 1))):
                self.histograms.h1("adc", "ADC", "counts", 0, 10, 10).fill(value)
            self.histograms.h2("map", "Map", ("channel", 0, 2, 2), ("ns", 0, 10, 1)).fill(value % 2, 5)
            self.histograms.counter("hits", "Hits", "hits").add(int(self.config.get("n", 1)))

        def stats(self):
            return {"events": 0, "detail": {"mine": 1}}

    if __name__ == "__main__":
        Mon.main()
''')


def test_a_python_component_publishes_its_histograms_and_a_run_start_empties_them(tmp_path):
    script = tmp_path / "mon.py"
    script.write_text(MONITOR)
    code, answers, err = drive(
        [sys.executable, str(script), "--name", "m", "--set", "n=3", "--set", "value=2.5"],
        ["configure", "stats", "start 1", "stats", "stop", "start 2", "stats", "quit"],
    )
    assert code == 0, err
    assert all(a["ok"] for a in answers), answers
    assert "histograms" not in json.dumps(answers[1]), "nothing booked before the first run"
    detail = answers[3]["result"]["detail"]
    assert detail["mine"] == 1, "the component's own detail is kept"
    adc, hmap, hits = detail["histograms"]
    assert (adc["name"], adc["entries"], adc["bins"][2], adc["mean"]) == ("adc", 3, 3, 2.5)
    assert (hmap["kind"], hmap["bins"], hits["value"]) == ("h2", [1, 0], 3)
    # The run's summary (stop) holds them too: the operator saves it with the run.
    assert answers[4]["result"]["detail"]["histograms"][0]["entries"] == 3
    # Run 2 starts empty, then its own start fills 3 again (not 6).
    assert answers[6]["result"]["detail"]["histograms"][0]["entries"] == 3


def test_the_operator_sums_a_groups_histograms_and_saves_them_with_the_run(tmp_path):
    script = tmp_path / "mon.py"
    script.write_text(MONITOR)
    command = json.dumps([sys.executable, str(script)])
    system = tmp_path / "system.toml"
    system.write_text(textwrap.dedent(f'''
        [system]
        name = "histos"
        web = "127.0.0.1:0"

        [[component]]
        name = "m-1"
        kind = "mon"
        command = {command}
        [component.params]
        n = 10
        value = 1.5

        [[component]]
        name = "m-2"
        kind = "mon"
        command = {command}
        [component.params]
        n = 5
        value = 3.5

        [[component]]
        name = "solo"
        kind = "mon"
        command = {command}

        [[group]]
        name = "mons"
        members = ["m-1", "m-2"]
        min = 1
    '''))
    data = tmp_path / "data"
    with running_operator(system, data) as (url, _):
        with daqflow.Operator(url, data=str(data)) as op:
            op.configure()
            for run in (1, 2):
                op.start()
                deadline = time.monotonic() + 30
                while True:
                    shown = {(h["component"], h["name"]): h for h in op.histograms()}
                    if ("mons", "adc") in shown and shown[("mons", "adc")].get("members") == ["m-1", "m-2"]:
                        break
                    assert time.monotonic() < deadline, shown
                    time.sleep(0.3)
                adc = shown[("mons", "adc")]
                assert (adc["entries"], adc["bins"][1], adc["bins"][3]) == (15, 10, 5), f"run {run}: {adc}"
                assert adc["mean"] == pytest.approx((10 * 1.5 + 5 * 3.5) / 15)
                assert shown[("mons", "hits")]["value"] == 15
                assert shown[("mons", "map")]["bins"] == [0, 2], "each member's fill of (1.5 % 2, 5) and (3.5 % 2, 5)"
                assert shown[("solo", "adc")]["entries"] == 1 and "members" not in shown[("solo", "adc")]
                op.stop()
            record = op.run(2)
        # Saved with the run: each member's in its summary, and summed as the web UI shows them.
        saved = record["summary"]["components"]["m-2"]["summary"]["detail"]["histograms"]
        assert [h["name"] for h in saved] == ["adc", "map", "hits"] and saved[0]["entries"] == 5
        summed = {(h["component"], h["name"]): h for h in record["summary"]["histograms"]}
        assert summed[("mons", "adc")]["entries"] == 15 and summed[("mons", "adc")]["members"] == ["m-1", "m-2"]
        assert summed[("solo", "hits")]["value"] == 1
        # … and for ROOT, read back with uproot.
        uproot = need("uproot")
        out = tmp_path / "run2-histograms.root"
        run = subprocess.run(
            [daqflow_binary(), "--data", str(data), "export", "2", "--histograms", "--to", "root", str(out),
             "--python", sys.executable],
            capture_output=True, text=True, timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "histograms of run 2 written to" in run.stdout
        with uproot.open(out) as f:
            adc = f["mons/adc"]
            assert adc.classname == "TH1D" and adc.member("fTitle") == "ADC"
            assert adc.values().tolist() == summed[("mons", "adc")]["bins"]
            assert adc.member("fEntries") == 15 and adc.axis().member("fTitle") == "counts"
            assert adc.axis().edges().tolist()[::5] == [0.0, 5.0, 10.0]
            assert f["mons/map"].values().tolist() == [[0.0], [2.0]], "x by y, as ROOT indexes"
            assert str(f["mons/hits"]) == "15" and str(f["solo/hits"]) == "1"
            assert json.loads(str(f["daqflow"]))["run"] == 2
        again = subprocess.run(
            [daqflow_binary(), "--data", str(data), "export", "2", "--histograms", "--to", "hdf5", str(out),
             "--python", sys.executable],
            capture_output=True, text=True, timeout=120,
        )
        assert again.returncode == 2 and "give --to root" in again.stderr


def test_the_python_detector_monitor_fills_from_the_demos_events(tmp_path):
    """python/examples/adc_monitor.py beside the demo's own (Rust) detector monitor: both
    decode the same sources' hits from ET; their histograms are saved with the run."""
    from test_component import EXAMPLES

    text = subprocess.run([daqflow_binary(), "demo", "--print-config"], capture_output=True, text=True,
                          check=True).stdout
    text = text.replace('web = "127.0.0.1:8080"', 'web = "none"')
    command = json.dumps([sys.executable, str(EXAMPLES / "adc_monitor.py")])
    text += textwrap.dedent(f'''
        [[component]]
        name = "py-detector"
        kind = "adc_monitor_py"
        command = {command}
        [component.params]
        et = "${{et.et}}"
        channels = 32
    ''')
    system = tmp_path / "system.toml"
    system.write_text(text)
    data = tmp_path / "data"
    run = subprocess.run([daqflow_binary(), "run", str(system), "--start", "--seconds", "3", "--data", str(data)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    import sqlite3
    with sqlite3.connect(data / "runs.sqlite") as db:
        (summary,) = db.execute("select summary from runs where run = 1").fetchone()
    saved = {(h["component"], h["name"]): h for h in json.loads(summary)["histograms"]}
    for monitor in ("detector", "py-detector"):
        hits = saved[(monitor, "hits")]["value"]
        tmap = saved[(monitor, "time_vs_channel")]
        assert hits > 1000 and tmap["entries"] == hits and tmap["outside"] == 0, (monitor, hits, tmap["outside"])
        assert saved[(monitor, "adc_ch0")]["entries"] > 0
        # Pulses come 150 ns + 10 ns per channel after the trigger: channel 7's later than 0's.
        bins = np.array(tmap["bins"]).reshape(50, 32)
        peak = lambda ch: int(np.argmax(bins[:, ch]))  # noqa: E731
        assert peak(7) > peak(0), (monitor, peak(0), peak(7))
