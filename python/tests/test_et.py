"""daqflow.et: ET systems, stations, attachments and events from Python, locally (shared memory)
and remotely (TCP), against systems made in this process and by `daqflow et start`."""

import gc
import os
import re
import signal
import socket
import subprocess
import threading
import time
from itertools import count

import numpy as np
import pytest

import daqflow
import daqflow.et as et
from conftest import REPO, daqflow_binary

_names = count()


def unique(prefix="pytest"):
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture
def system():
    with et.System(unique(), 200, 1024, listen="127.0.0.1:0") as s:
        yield s


@pytest.fixture(params=["local", "remote"])
def client(request, system):
    """A client of `system`: over shared memory, or over TCP."""
    if request.param == "local":
        return et.connect(system.name)
    return et.connect_remote(system.remote_address)


def produce(client, controls, size=64, priorities=None, data=None):
    """Puts one event per control tuple (first control integer written as its data)."""
    with client.attach(et.GRAND_CENTRAL) as producer:
        batch = producer.new_events(len(controls), size, wait=5.0)
        assert len(batch) == len(controls)
        for i, (e, c) in enumerate(zip(batch, controls)):
            e.control = c
            e.write(data[i] if data else bytes([i % 256]) * size)
            if priorities:
                e.priority = priorities[i]
        producer.put_events(batch)


def take_all(att):
    """Every event waiting for `att`, dumped afterwards (so that no later station sees them):
    [(control, data)]."""
    out = []
    while True:
        b = att.get_events(100, wait="async")
        if len(b) == 0:
            return out
        out += [(e.control, e.tobytes()) for e in b]
        att.dump_events(b)


def free_events(client, total=200, timeout=5.0):
    """Waits for every event to be back in GrandCentral."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = client.snapshot()
        if s["free_events"] == total:
            return s
        time.sleep(0.02)
    return client.snapshot()


# --- data --------------------------------------------------------------------------------------


def test_writable_data_control_and_priority_travel_from_producer_to_consumer(client):
    client.create_station("c")
    with client.attach("c") as consumer, client.attach(et.GRAND_CENTRAL) as producer:
        batch = producer.new_events(3, 100, wait=5.0)
        assert batch.lengths().tolist() == [100, 100, 100]
        for i, e in enumerate(batch):
            assert e.capacity >= 100 and not e.is_large and not e.possibly_corrupt
            e.data[:] = bytes([i]) * 100                 # in place, through the memoryview
            np.frombuffer(e.data, dtype=np.uint8)[:4] = [9, 8, 7, i]   # numpy over the same bytes
            e.control = (1, i, -3, 2**31 - 1)
        batch[2].priority = et.Priority.HIGH
        batch[1].length = 10                             # keeps the first 10 bytes
        producer.put_events(batch)
        assert len(batch) == 0

        got = consumer.get_events(10, wait=5.0)
        assert [e.control[1] for e in got] == [2, 0, 1]  # the high-priority one first
        assert got[0].priority == et.Priority.HIGH and got[1].priority == et.Priority.LOW
        assert got.controls().tolist() == [[1, 2, -3, 2**31 - 1], [1, 0, -3, 2**31 - 1], [1, 1, -3, 2**31 - 1]]
        assert got.lengths().tolist() == [100, 100, 10] and got.total_length() == 210
        first = got[1]
        assert first.tobytes() == bytes([9, 8, 7, 0]) + bytes(96)
        assert bytes(first.data) == first.tobytes() and len(first) == 100
        # The consumer changes the data in place and passes it on.
        first.data[0] = 0xAB
        first.write(b"hello")
        assert first.tobytes() == b"hello" and len(first) == 5
        client.create_station("after")
        with client.attach("after") as after:
            consumer.put_events(got)
            again = after.get_events(10, wait=5.0)
            assert b"hello" in [e.tobytes() for e in again]
            after.put_events(again)
    assert free_events(client)["free_events"] == 200


def test_a_consumer_reads_events_a_rust_producer_made(tmp_path):
    name = unique("cli")
    with et.System(name, 100, 1024) as system:
        system.create_station("mon")
        consumer = system.attach("mon")
        run = subprocess.run(
            [daqflow_binary(), "et", "produce", "--name", name, "--count", "50", "--size", "32",
             "--control", "7,0,0,1", "--high"],
            capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        got = []
        while len(got) < 50:
            b = consumer.get_events(100, wait=5.0)
            got += [(e.control, e.priority, e.tobytes()) for e in b]
            consumer.put_events(b)
        assert got[0] == ((7, 0, 0, 1), et.Priority.HIGH, bytes(range(32)))


def test_large_events_get_their_own_buffers(client):
    client.create_station("c")
    with client.attach("c") as consumer:
        produce(client, [(1, 0, 0, 0)], size=5000, data=[b"L" * 5000])
        b = consumer.get_events(1, wait=5.0)
        assert b[0].is_large and len(b[0]) == 5000 and b[0].tobytes() == b"L" * 5000
        consumer.put_events(b)


def test_events_can_be_put_and_dumped_one_by_one(client):
    client.create_station("c")
    client.create_station("after")
    with client.attach("c") as consumer, client.attach("after") as after:
        produce(client, [(i, 0, 0, 0) for i in range(6)])
        b = consumer.get_events(6, wait=5.0)
        assert len(b) == 6
        keep = [e for e in b if e.control[0] % 2 == 0]
        rejected = [e for e in b if e.control[0] % 2 == 1]
        consumer.dump_events(rejected)       # straight back to GrandCentral
        assert len(b) == 3 and all(e.released for e in rejected)
        consumer.put_events(b[0])            # one Event
        consumer.put_events(b)               # the rest of the batch
        assert len(b) == 0 and all(e.released for e in keep)
        assert sorted(c[0] for c, _ in take_all(after)) == [0, 2, 4]
        snapshot = client.snapshot()
        mine = [a for a in snapshot["attachments"] if a["station"] == "c"]
        assert mine[0]["dumped"] == 3 and mine[0]["put"] == 3


# --- built events: decode_event -----------------------------------------------------------------


def fragments_of(event):
    return [(f.source_id, f.event_id, f.run, f.trigger_type, f.timestamp, f.flags, f.crc_ok, bytes(f.payload))
            for f in event.fragments]


def test_a_decoded_event_holds_its_et_event_until_it_is_gone_unless_copied(in_data_dir, client):
    source = next(iter(daqflow.open("run000001_bu-0_0001.daq")))
    client.create_station("c")
    with client.attach("c") as consumer:
        produce(client, [(1, 0, 0, 0)] * 2, size=len(source), data=[bytes(source.data)] * 2)
        batch = consumer.get_events(2, wait=5.0)
        assert len(batch) == 2
        from_event = daqflow.decode_event(batch[0])        # the event itself
        from_view = daqflow.decode_event(batch[1].data)    # its data's memoryview
        copied = daqflow.decode_event(batch[0], copy=True)
        for e in (from_event, from_view, copied):
            assert (e.id, e.bu_id, e.index) == (source.id, source.bu_id, None)
            assert fragments_of(e) == fragments_of(source)
        payload = from_event.fragments[1].payload
        del from_event
        with pytest.raises(et.BufferInUseError):
            consumer.put_events(batch)                      # a payload view still reads event 0
        assert len(batch) == 2
        del payload
        with pytest.raises(et.BufferInUseError):
            consumer.put_events(batch)                      # event 1's data is still decoded
        del from_view
        consumer.put_events(batch)
        assert len(batch) == 0
        assert fragments_of(copied) == fragments_of(source)  # the copy outlives the put
    assert free_events(client)["free_events"] == 200


def test_a_consumer_decodes_the_events_builder_units_put_as_the_recorder_wrote_them(tmp_path):
    """The demo's system (builder units putting built events into ET, a recorder writing them to
    files) with a Python consumer on a station of its own: every event it decodes is the event
    the recorder's file holds."""
    name = unique("devt")
    text = subprocess.run([daqflow_binary(), "demo", "--print-config"], capture_output=True, text=True,
                          check=True).stdout
    assert 'name = "${system.id}-et"' in text
    text = text.replace('name = "${system.id}-et"', f'name = "{name}"').replace("rate_hz = 2000.0", "rate_hz = 300.0")
    system, data = tmp_path / "system.toml", tmp_path / "data"
    system.write_text(text)
    proc = subprocess.Popen([daqflow_binary(), "run", str(system), "--data", str(data), "--web", "none"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True).start()

    def say(line):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def wait_for(what, predicate, timeout=120):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline and proc.poll() is None, f"{what}: {''.join(output)}"
            time.sleep(0.05)

    decoded = {}
    done = threading.Event()
    try:
        say("configure")
        clients = []

        def connected():
            try:
                clients.append(et.connect(name))
                return True
            except et.NotFoundError:
                return False

        wait_for("the ET system", connected)
        client = clients[0]
        client.create_station("python")                    # blocking, after the recorder's
        consumer = client.attach("python")

        def summary(event):
            # Decoded in place; the Event goes with this frame, before the batch is put.
            e = daqflow.decode_event(event)
            return e.id, (e.run, e.flags, e.trigger_type, e.bu_id, len(e), fragments_of(e))

        def consume():
            while not done.is_set():
                batch = consumer.get_events(100, wait="async")
                if len(batch) == 0:
                    time.sleep(0.01)
                    continue
                decoded.update(summary(e) for e in batch)
                consumer.put_events(batch)

        reader = threading.Thread(target=consume)
        reader.start()
        say("start")
        wait_for("300 events", lambda: len(decoded) >= 300)
        say("stop")
        wait_for("the run's summary", lambda: any(l.startswith("lost:") for l in output))
        # Everything the builder units put has come back to GrandCentral through our station.
        pool = client.snapshot()["events"]
        wait_for("the station drained", lambda: client.snapshot()["free_events"] == pool)
        done.set()
        reader.join(30)
        consumer.detach()
        say("quit")
        proc.wait(60)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    files = sorted((data / "files").glob("run000001_*.daq"))
    assert files, "".join(output)
    recorded = {}
    for f in files:
        for e in daqflow.open(f):
            recorded[e.id] = (e.run, e.flags, e.trigger_type, e.bu_id, len(e), fragments_of(e))
    assert len(decoded) >= 300 and {bu for _, _, _, bu, _, _ in decoded.values()} == {0, 1}
    assert decoded.keys() == recorded.keys()
    assert decoded == recorded


# --- buffers after put -------------------------------------------------------------------------


def test_a_buffer_cannot_be_used_after_its_event_was_put(client):
    client.create_station("c")
    with client.attach("c") as consumer:
        produce(client, [(1, 0, 0, 0)] * 3)
        b = consumer.get_events(3, wait=5.0)
        e = b[0]
        view = e.data
        array = np.frombuffer(b[1], dtype=np.uint8)          # buffer protocol on the Event
        with pytest.raises(et.BufferInUseError, match="event 1 of the batch"):
            consumer.put_events(b)
        assert len(b) == 3                                    # nothing was put
        with pytest.raises(ValueError, match="released"):
            view[0]                                           # Event.data views were released
        view = e.data                                         # a new one
        del array
        part = e.data[1:3]                                    # a slice keeps the export
        with pytest.raises(et.BufferInUseError):
            consumer.dump_events([e])
        del part
        consumer.put_events(b)
        with pytest.raises(ValueError, match="released"):
            view[0] = 1
        for use in (lambda: e.length, lambda: e.control, lambda: e.data, lambda: e.write(b"x"), e.tobytes):
            with pytest.raises(et.EventReleasedError):
                use()
        with pytest.raises(et.EventReleasedError):
            consumer.put_events(e)
        assert "put or dumped" in repr(e)


def test_a_detached_attachment_still_takes_back_the_events_of_its_batches(client):
    client.create_station("c")
    consumer = client.attach("c")
    produce(client, [(1, 0, 0, 0)] * 4)
    batch = consumer.get_events(4, wait=5.0)
    consumer.detach()
    assert "detached" in repr(consumer)
    with pytest.raises(et.EtError, match="detached"):
        consumer.get_events(1, wait="async")
    assert [a["station"] for a in client.snapshot()["attachments"]] == ["c"]   # kept by the batch
    consumer.put_events(batch)
    assert client.snapshot()["attachments"] == []                            # now it is gone
    assert free_events(client)["free_events"] == 200


def test_a_forgotten_batch_is_collected_and_its_events_restored(client):
    client.create_station("c")
    consumer = client.attach("c")
    produce(client, [(1, 0, 0, 0)] * 4)
    batch = consumer.get_events(4, wait=5.0)
    views = [e.data for e in batch]            # views -> events -> batch -> views: a cycle
    del batch, views
    consumer.detach()
    gc.collect()
    assert client.snapshot()["attachments"] == []
    assert free_events(client)["free_events"] == 200   # restore "output": on, then back


# --- stations ----------------------------------------------------------------------------------


def test_stations_select_by_control_integers(client):
    client.create_station("physics", select=(1, None, None, None))
    client.create_station("calib", select=et.Selection.match(2))
    client.create_station("range", select=et.Selection.range(1, 10, 19))
    client.create_station("mask", select="mask-any:2:0x4")
    client.create_station("rest")
    atts = {s: client.attach(s) for s in ["physics", "calib", "range", "mask", "rest"]}
    produce(client, [(1, 0, 0, 0), (2, 0, 0, 0), (3, 15, 0, 0), (3, 0, 5, 0), (3, 0, 0, 0)])
    seen = {s: [c for c, _ in take_all(a)] for s, a in atts.items()}
    assert seen == {
        "physics": [(1, 0, 0, 0)], "calib": [(2, 0, 0, 0)], "range": [(3, 15, 0, 0)],
        "mask": [(3, 0, 5, 0)], "rest": [(3, 0, 0, 0)],
    }
    stations = {s["name"]: s for s in client.snapshot()["stations"]}
    assert stations["physics"]["config"]["selection"] == {"Match": [1, None, None, None]}
    assert stations["mask"]["config"]["selection"] == {"MaskAny": {"index": 2, "mask": 4}}


def test_selections_read_and_print_the_command_line_form():
    assert str(et.Selection.match(1, None, 3)) == "match:1,*,3,*"
    assert et.Selection.parse("match:1") == et.Selection.match(1, None, None, None)
    assert str(et.Selection.mask_all(0, 0x10)) == "mask-all:0:0x10"
    assert str(et.Selection.high_priority()) == "high" and str(et.Selection.all()) == "all"
    assert et.Selection.parse("range:0:1:9") == et.Selection.range(0, 1, 9)
    assert repr(et.Selection.all()) == "Selection.parse('all')"
    with pytest.raises(ValueError):
        et.Selection.parse("everything")
    with pytest.raises(ValueError):
        et.Selection.range(4, 0, 1)
    with pytest.raises(ValueError):
        et.Selection.match(1, 2, 3, 4, 5)


def test_high_priority_events_go_first_and_can_be_selected(client):
    client.create_station("urgent", select=et.Selection.high_priority())
    client.create_station("all")
    urgent, rest = client.attach("urgent"), client.attach("all")
    hi, lo = et.Priority.HIGH, et.Priority.LOW
    produce(client, [(i, 0, 0, 0) for i in range(4)], priorities=[lo, hi, lo, hi])
    assert [c[0] for c, _ in take_all(urgent)] == [1, 3]
    assert [c[0] for c, _ in take_all(rest)] == [0, 2]
    client.configure_station("urgent", select="all")       # now takes everything
    produce(client, [(i, 0, 0, 0) for i in range(4)], priorities=[lo, lo, hi, lo])
    assert [c[0] for c, _ in take_all(urgent)] == [2, 0, 1, 3]   # high first, then in order


def test_prescale_takes_every_nth_selected_event(client):
    client.create_station("sample", prescale=3)
    client.create_station("all")
    sample, rest = client.attach("sample"), client.attach("all")
    produce(client, [(i, 0, 0, 0) for i in range(10)])
    assert [c[0] for c, _ in take_all(sample)] == [0, 3, 6, 9]
    assert len(take_all(rest)) == 6


def test_a_non_blocking_station_takes_events_up_to_its_cue(client):
    client.create_station("monitor", blocking=False, cue=5)
    client.create_station("recorder")
    monitor, recorder = client.attach("monitor"), client.attach("recorder")
    produce(client, [(i, 0, 0, 0) for i in range(20)])
    assert [c[0] for c, _ in take_all(monitor)] == [0, 1, 2, 3, 4]
    assert len(take_all(recorder)) == 15
    client.configure_station("monitor", cue=8)
    config = {s["name"]: s["config"] for s in client.snapshot()["stations"]}["monitor"]
    assert (config["blocking"], config["cue"], config["prescale"]) == (False, 8, 1)


def test_a_parallel_group_shares_the_events(client):
    client.create_station("a")
    client.create_station("b", parallel_with="a", group_policy="round-robin")
    client.create_station("first", first=True, select=(99,))
    client.create_station("mid", after="first", select=(98,))
    order = [s["name"] for s in client.snapshot()["stations"]]
    assert order == ["GRAND_CENTRAL", "first", "mid", "a", "b"]
    groups = {s["name"]: s["group"] for s in client.snapshot()["stations"]}
    assert groups["a"] == groups["b"] is not None
    a, b = client.attach("a"), client.attach("b")
    produce(client, [(i, 0, 0, 0) for i in range(10)])
    assert len(take_all(a)) == 5 and len(take_all(b)) == 5


def test_every_station_option_can_be_given(client):
    client.create_station("full", blocking=False, cue=7, select="match:1,*,*,2", prescale=2,
                          restore="redistribute", single_user=True, keep_when_idle=True,
                          group_policy="shortest-queue")
    config = {s["name"]: s["config"] for s in client.snapshot()["stations"]}["full"]
    assert config == {"blocking": False, "cue": 7, "prescale": 2, "selection": {"Match": [1, None, None, 2]},
                      "single_user": True, "restore": "Redistribute", "group_policy": "ShortestQueue",
                      "keep_when_idle": True}
    first = client.attach("full")
    with pytest.raises(et.RefusedError):
        client.attach("full")                   # single user
    first.detach()
    client.configure_station("full", restore="gc", keep_when_idle=False)
    config = {s["name"]: s["config"] for s in client.snapshot()["stations"]}["full"]
    assert (config["restore"], config["keep_when_idle"], config["cue"]) == ("GrandCentral", False, 7)
    client.remove_station("full")
    with pytest.raises(et.NoSuchStationError):
        client.remove_station("full")


def test_a_python_function_selects_in_the_systems_process(system):
    system.create_station("odd", select=lambda control, priority, data: control[0] % 2 == 1 and data[:1] == b"x")
    client = et.connect(system.name)
    odd = system.attach("odd")
    produce(client, [(i, 0, 0, 0) for i in range(6)], data=[b"x"] * 5 + [b"y"])
    deadline = time.monotonic() + 5
    got = []
    while len(got) < 2 and time.monotonic() < deadline:
        got += [c[0] for c, _ in take_all(odd)]
    assert got == [1, 3]
    snapshot = system.snapshot()
    assert {s["name"]: s["closure"] for s in snapshot["stations"]}["odd"] is True
    with pytest.raises(ValueError, match="give select= as well"):
        system.configure_station("odd", cue=5)
    with pytest.raises(ValueError, match="own process"):
        client.create_station("f", select=lambda c, p, d: True)


# --- remote, discovery, the daqflow binary ------------------------------------------------------


def test_discovery_finds_a_system_by_name():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
    name = unique("disc")
    with et.System(name, 50, 256, listen="127.0.0.1:0", discovery_port=port):
        client = et.discover(name, port, timeout=3.0)
        assert client.is_remote and client.name == name
        assert client.snapshot()["events"] == 50
        with pytest.raises(et.NotFoundError):
            et.discover(unique("nobody"), port, timeout=0.5)


def start_et(name, *extra):
    proc = subprocess.Popen(
        [daqflow_binary(), "et", "start", "--name", name, "--events", "100", "--event-size", "512",
         "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.match(r"ready (\S+) remote (\S+)", line)
    assert m, f"daqflow et start said {line!r}"
    return proc, m.group(2)


def test_a_system_that_dies_is_reported_to_local_and_remote_clients():
    name = unique("dies")
    proc, address = start_et(name)
    try:
        local, remote = et.connect(name), et.connect_remote(address)
        local.create_station("c")
        consumers = [local.attach("c"), remote.attach("c")]
        produce(local, [(1, 0, 0, 0)] * 4)
        assert sum(len(take_all(c)) for c in consumers) == 4
        assert not local.is_dead and not remote.is_dead
    finally:
        proc.kill()
        proc.wait()
    for client, att in zip([local, remote], consumers):
        with pytest.raises(et.SystemDeadError, match="is gone"):
            att.get_events(10, wait=10.0)
        assert client.is_dead
        with pytest.raises(et.SystemDeadError):
            client.snapshot()


def test_a_closed_system_is_dead_for_its_clients():
    system = et.System(unique(), 50, 256)
    client = et.connect(system.name)
    client.create_station("c")
    consumer = client.attach("c")
    mine = system.attach("c")
    system.close()
    system.close()                               # again: nothing
    assert system.closed and "closed" in repr(system)
    with pytest.raises(et.SystemDeadError):
        consumer.get_events(1, wait=10.0)
    with pytest.raises(et.SystemDeadError):
        mine.get_events(1, wait=1.0)
    with pytest.raises(et.SystemDeadError):
        system.snapshot()
    assert client.is_dead


def test_a_system_dropped_without_close_stops_even_with_a_python_selection():
    system = et.System(unique(), 50, 256)
    system.create_station("f", select=lambda control, priority, data: True)
    client = et.connect(system.name)
    f = client.attach("f")
    produce(client, [(1, 0, 0, 0)] * 20)
    del system
    gc.collect()
    with pytest.raises(et.SystemDeadError):
        f.get_events(100, wait=10.0)
        f.get_events(100, wait=10.0)


# --- waiting -----------------------------------------------------------------------------------


def test_waits_sleep_time_out_or_return_at_once(client):
    client.create_station("c")
    consumer = client.attach("c")
    assert len(consumer.get_events(10, wait="async")) == 0
    assert len(consumer.get_events(10, wait=et.ASYNC)) == 0
    t = time.monotonic()
    with pytest.raises(et.TimedOutError):
        consumer.get_events(10, wait=0.3)
    assert time.monotonic() - t >= 0.29
    got = []
    sleeper = threading.Thread(target=lambda: got.append(len(consumer.get_events(10))))  # sleep
    sleeper.start()
    time.sleep(0.3)                               # the sleeper does not hold the GIL
    produce(client, [(1, 0, 0, 0)] * 3)
    sleeper.join(10)
    assert got and got[0] >= 1


def test_a_signal_interrupts_a_sleeping_get(system):
    consumer = et.connect(system.name)
    consumer.create_station("c")
    att = consumer.attach("c")

    def alarm(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            att.get_events(10, wait=et.SLEEP)
        assert time.monotonic() - t < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_consume_puts_every_batch_it_yields(system):
    client = et.connect(system.name)
    client.create_station("c")
    consumer = client.attach("c")
    produce(client, [(1, 0, 0, 0)] * 30)
    seen = 0
    for batch in et.consume(consumer, 10, wait=1.0):
        seen += len(batch)
        if seen == 30:
            break
    assert free_events(client)["free_events"] == 200


# --- errors ------------------------------------------------------------------------------------


def test_bad_arguments_and_wrong_use_raise(client, system):
    assert issubclass(et.EtError, daqflow.Error)
    for e in [et.NotFoundError, et.SystemDeadError, et.TimedOutError, et.BufferInUseError, et.EventReleasedError]:
        assert issubclass(e, et.EtError)
    with pytest.raises(et.NotFoundError, match="daqflow et start --name"):
        et.connect(unique("missing"))
    with pytest.raises(et.NameTakenError):
        et.System(system.name, 10, 64)
    with pytest.raises(ValueError):
        et.connect_remote("not an address")
    client.create_station("c")
    with pytest.raises(et.StationExistsError):
        client.create_station("c")
    with pytest.raises(et.NoSuchStationError):
        client.attach("nowhere")
    with pytest.raises(ValueError, match="at most one"):
        client.create_station("d", first=True, after="c")
    with pytest.raises(ValueError, match="restore"):
        client.create_station("d", restore="sideways")
    with pytest.raises(ValueError, match="group_policy"):
        client.create_station("d", group_policy="random")
    with pytest.raises(ValueError, match="at most 4"):
        client.create_station("d", select=(1, 2, 3, 4, 5))
    with pytest.raises(TypeError):
        client.create_station("d", select=3.5)
    with pytest.raises(OverflowError):
        client.create_station("d", cue=-1)
    producer, consumer = client.attach(et.GRAND_CENTRAL), client.attach("c")
    with pytest.raises(ValueError, match="wait"):
        consumer.get_events(1, wait="forever")
    with pytest.raises(ValueError, match="wait"):
        consumer.get_events(1, wait=-1)
    with pytest.raises(et.RefusedError, match="new_events"):
        producer.get_events(1, wait="async")
    batch = producer.new_events(2, 16, wait=5.0)
    e = batch[0]
    with pytest.raises(et.RefusedError, match="capacity"):
        e.write(b"x" * 2000)
    with pytest.raises(et.RefusedError, match="capacity"):
        e.length = 2000
    with pytest.raises(ValueError):
        e.control = (1, 2)
    with pytest.raises(TypeError):
        e.priority = "high"
    with pytest.raises(IndexError):
        batch[5]
    with pytest.raises(et.NotOwnedError):
        consumer.put_events(batch)             # not its events
    with pytest.raises(TypeError):
        producer.put_events([1, 2])
    assert len(batch) == 2
    producer.put_events(batch)
    producer.detach()
    with pytest.raises(et.EtError, match="detached"):
        producer.new_events(1, 16)
    repr(consumer), repr(client), repr(system)


# --- the guide ---------------------------------------------------------------------------------


def test_the_et_examples_of_the_python_guide_run_and_print_what_they_say(in_data_dir, capsys):
    doc = (REPO / "docs" / "python.md").read_text()
    start = doc.index("## ET: events from and to an ET system")
    section = doc[start:doc.index("\n## ", start + 1)]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    assert len(blocks) >= 7
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/python.md:ET block {i}", "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "10 (1, 0, 0, 0) b'raw detector data'",
        "30",
        "ffff020304050607",
        "refused",
        "operation forbidden on released memoryview object",
        "320 (5, 4)",
        "True [0, 1]",
        "refused",
        "True True",
        "['GRAND_CENTRAL', 'monitor', 'calibration', 'all', 'ana-1', 'ana-2']",
        "100 {'Match': [1, None, None, None]}",
        "['GRAND_CENTRAL', 'big']",
        "True [b'hello', b'hello', b'hello']",
        "SystemDeadError True",
    ]
