"""The control plane from Python (daqflow.dialog) against a real control server
(`daqflow control-server` with a token) and real components (`daqflow component sink`)."""

import contextlib
import json
import logging
import os
import queue
import secrets
import subprocess
import sys
import threading
import time

import pytest

import daqflow
from daqflow import dialog
from conftest import REPO, daqflow_binary
import doc_blocks

WAIT = 20.0  # generous bound of every wait: a failure fails, it never hangs


def wait_for(predicate, what, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def read_line(stream, timeout=WAIT):
    """The next line of a child's output, waited for at most `timeout`."""
    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    return lines.get(timeout=timeout)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dialog") / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path


@pytest.fixture(scope="module")
def control(token_file):
    """A control server requiring the token, on a free port: its address."""
    server = subprocess.Popen(
        [daqflow_binary(), "control-server", "--listen", "127.0.0.1:0", "--token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = read_line(server.stdout)
        assert line.startswith("listening on "), line
        yield line.split()[-1]
    finally:
        server.terminate()
        server.wait(timeout=WAIT)


@pytest.fixture
def join(control, token_file):
    """join(name, **options): a Dialog with the system's control server and token, closed at
    the end of the test."""
    opened = []

    def join(name, **options):
        options.setdefault("token_file", token_file)
        d = dialog.connect(name, control, **options)
        opened.append(d)
        return d

    yield join
    for d in opened:
        d.close()


def wait_registrants(d, command, count):
    """Waits until `count` processes registered `command` (the control server's directory
    service `dialog/commands`): a registration takes effect asynchronously."""
    with d.subscribe("dialog/commands") as sub:
        while True:
            commands = {c["name"]: c["registrants"] for c in sub.get(timeout=WAIT).json()}
            if len(commands.get(command, [])) >= count:
                return


def test_a_dialog_joins_with_the_token_and_says_where_it_is(join, control):
    d = join("py-join")
    assert d.is_connected and d.control_server == control and d.control == [control]
    assert d.name == "py-join" and d.connection_problem is None and not d.closed
    host, port = d.listen_addr.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert "connected" in repr(d)
    d.close()
    assert d.closed and not d.is_connected
    d.close()  # a second close does nothing
    with pytest.raises(dialog.DialogClosedError):
        d.provide("py-join/x")


def test_values_published_reach_a_callback_and_an_iterator_in_order(join):
    provider, subscriber = join("py-pub"), join("py-sub")
    service = provider.provide("py-pub/value", b"first")
    got, three = [], threading.Event()

    def on_value(msg):
        got.append(msg)
        if len(got) == 3:
            three.set()

    subscriber.subscribe("py-pub/value", on_value)  # kept by the dialog: no need to hold it
    sub = subscriber.subscribe("py-pub/value")
    first = sub.get(timeout=WAIT)
    assert (first.data, first.seq, first.initial, first.provider, first.lost) == (b"first", 1, True, "py-pub", False)
    wait_for(lambda: service.subscriber_count == 2, "two subscribers")
    service.update("second")                 # str: UTF-8
    service.update(bytearray(b"third"))      # any byte buffer
    assert service.seq == 3 and service.dropped == 0
    for seq, data in [(2, b"second"), (3, b"third")]:
        msg = next(sub)
        assert (msg.service, msg.data, msg.seq, msg.initial) == ("py-pub/value", data, seq, False)
    assert three.wait(WAIT)
    assert [(m.data, m.seq) for m in got] == [(b"first", 1), (b"second", 2), (b"third", 3)]
    assert sub.provider == "py-pub" and sub.pending == 0
    with pytest.raises(TimeoutError):
        sub.get(timeout=0.2)


def test_json_values_and_commands(join):
    provider, subscriber = join("py-json"), join("py-json-sub")
    state = provider.provide("py-json/state")
    state.update_json({"state": "Configured", "run": 3})
    sub = subscriber.subscribe("py-json/state")
    msg = sub.get(timeout=WAIT)
    assert msg.json() == {"state": "Configured", "run": 3}
    assert msg.text() == '{"state":"Configured","run":3}' and bytes(msg) == msg.data
    got = queue.Queue()
    provider.register_command("py-json/set", got.put)
    wait_registrants(subscriber, "py-json/set", 1)
    assert subscriber.send_json("py-json/set", {"gain": 2}) == 1
    command = got.get(timeout=WAIT)
    assert (command.name, command.sender, command.json()) == ("py-json/set", "py-json-sub", {"gain": 2})


def test_a_command_registered_by_two_processes_reaches_both(join):
    a, b, sender = join("py-cmd-a"), join("py-cmd-b"), join("py-cmd-sender")
    got = queue.Queue()
    a.register_command("py-cmd/all", lambda cmd: got.put(("a", cmd.sender, cmd.data)))
    b.register_command("py-cmd/all", lambda cmd: got.put(("b", cmd.sender, cmd.data)))
    wait_registrants(sender, "py-cmd/all", 2)
    assert sender.send_command("py-cmd/all", b"go") == 2
    delivered = sorted(got.get(timeout=WAIT) for _ in range(2))
    assert delivered == [("a", "py-cmd-sender", b"go"), ("b", "py-cmd-sender", b"go")]
    assert got.empty()


def test_a_command_nobody_registered_reaches_nobody(join):
    assert join("py-nobody").send_command("py-nobody/nothing", b"") == 0


def test_a_closed_registration_takes_no_more_commands(join):
    d, sender = join("py-unreg"), join("py-unreg-sender")
    got = queue.Queue()
    registration = d.register_command("py-unreg/cmd", got.put)
    wait_registrants(sender, "py-unreg/cmd", 1)
    assert sender.send_command("py-unreg/cmd") == 1
    got.get(timeout=WAIT)
    registration.close()
    assert registration.closed
    wait_for(lambda: sender.send_command("py-unreg/cmd") == 0, "the registration to end")


def test_a_service_name_is_unique_in_the_system(join):
    join("py-owner").provide("py-owner/state")
    with pytest.raises(dialog.ServiceTakenError, match="py-owner/state.*already provided by `py-owner`") as e:
        join("py-thief").provide("py-owner/state")
    assert isinstance(e.value, dialog.DialogError) and isinstance(e.value, daqflow.Error)
    with pytest.raises(dialog.InvalidNameError):
        join("py-bad-name").provide("no spaces allowed")
    with pytest.raises(dialog.InvalidNameError, match="reserved"):
        join("py-reserved").provide("dialog/mine")


def test_a_wrong_or_missing_token_is_refused_with_the_reason(control, token_file, tmp_path, monkeypatch):
    monkeypatch.delenv("DAQFLOW_TOKEN_FILE", raising=False)
    monkeypatch.delenv("DAQFLOW_TOKEN", raising=False)
    with pytest.raises(dialog.ControlServerUnavailableError, match="wrong token") as e:
        dialog.connect("py-wrong-token", control, token="not-the-system-token", timeout=3)
    assert control in str(e.value)
    with pytest.raises(dialog.ControlServerUnavailableError, match="requires the system token and this process has none"):
        dialog.connect("py-no-token", control, timeout=3)
    exposed = tmp_path / "exposed-token"
    exposed.write_text(token_file.read_text())
    exposed.chmod(0o644)
    with pytest.raises(dialog.TokenError, match="chmod 600"):
        dialog.connect("py-exposed", control, token_file=exposed)
    with pytest.raises(dialog.TokenError, match="No such file"):
        dialog.connect("py-missing", control, token_file=tmp_path / "missing")


def test_the_token_and_the_control_server_come_from_the_environment(control, token_file, monkeypatch):
    monkeypatch.setenv("DAQFLOW_CONTROL", control)
    monkeypatch.setenv("DAQFLOW_TOKEN_FILE", str(token_file))
    with dialog.connect("py-env-file") as d:
        assert d.is_connected
    monkeypatch.delenv("DAQFLOW_TOKEN_FILE")
    monkeypatch.setenv("DAQFLOW_TOKEN", token_file.read_text().strip())
    with dialog.connect("py-env-token") as d:
        assert d.is_connected


def test_a_process_name_in_use_is_refused(join, control, token_file):
    join("py-twin")
    with pytest.raises(dialog.ControlServerUnavailableError, match="named py-twin is connected already"):
        dialog.connect("py-twin", control, token_file=token_file, timeout=2)


def test_subscribers_see_the_provider_go_and_an_iterator_ends_when_closed(join):
    provider, subscriber = join("py-leaving"), join("py-watching")
    provider.provide("py-leaving/state", b"here")      # the dialog keeps it until it closes
    dropped = provider.provide("py-leaving/spare", b"spare")
    sub = subscriber.subscribe("py-leaving/state")
    spare = subscriber.subscribe("py-leaving/spare")
    assert sub.get(timeout=WAIT).data == b"here" and spare.get(timeout=WAIT).data == b"spare"
    # A service closed while its process stays is withdrawn (INFO_SERVICE status 3) ...
    dropped.close()
    withdrawn = spare.get(timeout=WAIT)
    assert withdrawn.lost and withdrawn.cause == "service withdrawn", withdrawn
    # ... a process that leaves, with its services still open, disconnected (LOST_SENDER 3).
    provider.close()
    lost = sub.get(timeout=WAIT)
    assert lost.lost and lost.provider == "py-leaving" and lost.cause == "disconnected", lost
    assert sub.provider is None
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(m for m in sub))
    reader.start()
    sub.close()
    reader.join(WAIT)
    assert not reader.is_alive() and seen == [] and sub.closed
    with pytest.raises(dialog.DialogClosedError):
        sub.get(timeout=1)


def test_a_bounded_queue_keeps_the_newest_messages(join):
    provider, subscriber = join("py-burst"), join("py-burst-sub")
    service = provider.provide("py-burst/n", b"0")
    sub = subscriber.subscribe("py-burst/n", maxsize=2)
    wait_for(lambda: service.subscriber_count == 1, "the subscriber")
    for i in range(1, 11):
        service.update(str(i))
    wait_for(lambda: sub.dropped == 9, "9 messages dropped")
    assert [sub.get(timeout=WAIT).data for _ in range(2)] == [b"9", b"10"]


def test_callbacks_may_call_back_into_the_dialog(join):
    """A service callback that publishes, sends a command and subscribes, and a command
    callback that answers with a command: no deadlock, everything arrives."""
    a, b = join("py-reentrant-a"), join("py-reentrant-b")
    echo = a.provide("py-reentrant-a/echo")
    replies, echoes, inner = queue.Queue(), queue.Queue(), queue.Queue()
    b.register_command("py-reentrant-b/reply", lambda cmd: replies.put(cmd.data))
    a.register_command("py-reentrant-a/ping", lambda cmd: a.send_command(f"{cmd.sender}/reply", b"pong:" + cmd.data))
    wait_registrants(a, "py-reentrant-b/reply", 1)
    wait_registrants(b, "py-reentrant-a/ping", 1)

    def on_source(msg):
        echo.update(msg.data)                                     # publish from a callback
        delivered = a.send_command("py-reentrant-b/reply", b"via-callback:" + msg.data)
        a.subscribe("py-reentrant-a/echo", lambda m: echoes.put((delivered, m.data)))  # and subscribe

    b.provide("py-reentrant-b/source", b"1")
    a.subscribe("py-reentrant-b/source", on_source)
    assert replies.get(timeout=WAIT) == b"via-callback:1"
    assert echoes.get(timeout=WAIT) == (1, b"1")
    assert b.send_command("py-reentrant-a/ping", b"7") == 1
    assert replies.get(timeout=WAIT) == b"pong:7"


def test_a_callback_may_close_its_own_dialog(join):
    provider, subscriber = join("py-closer-p"), join("py-closer-s")
    service = provider.provide("py-closer-p/n", b"0")
    closed = threading.Event()

    def close_on_first(msg):
        subscriber.close()
        closed.set()

    subscriber.subscribe("py-closer-p/n", close_on_first)
    assert closed.wait(WAIT)
    assert subscriber.closed
    wait_for(lambda: service.subscriber_count == 0, "the closed subscriber to be dropped")


def test_no_callback_runs_after_close(join):
    provider, subscriber = join("py-stop-p"), join("py-stop-s")
    service = provider.provide("py-stop-p/n", b"0")
    calls = []
    running = threading.Event()

    def slow(msg):
        running.set()
        time.sleep(0.05)
        calls.append(msg.seq)

    subscriber.subscribe("py-stop-p/n", slow)
    assert running.wait(WAIT)
    stop = threading.Event()

    def publish():
        while not stop.is_set():
            service.update(b"x")
            time.sleep(0.005)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_for(lambda: len(calls) >= 3, "a few callbacks")
        subscriber.close()
        after_close = len(calls)
        time.sleep(0.5)
        assert len(calls) == after_close
    finally:
        stop.set()
        publisher.join(WAIT)


def test_an_exception_in_a_callback_is_logged_and_the_callback_stays(join, caplog):
    provider, subscriber = join("py-raise-p"), join("py-raise-s")
    service = provider.provide("py-raise-p/n", b"1")
    good = queue.Queue()

    def fails_on_first(msg):
        if msg.seq == 1:
            raise ValueError("bad value 1")
        good.put(msg.seq)

    with caplog.at_level(logging.ERROR, logger="daqflow.dialog"):
        subscriber.subscribe("py-raise-p/n", fails_on_first)
        wait_for(lambda: service.subscriber_count == 1, "the subscriber")
        wait_for(lambda: any("bad value 1" in str(r.exc_info) for r in caplog.records), "the error logged")
        service.update(b"2")
        assert good.get(timeout=WAIT) == 2
    record = next(r for r in caplog.records if r.exc_info)
    assert record.name == "daqflow.dialog" and "subscription `py-raise-p/n`" in record.getMessage()


@contextlib.contextmanager
def component(kind, name, control, token_file):
    """A real component, `daqflow component KIND --name NAME`, on the control plane."""
    process = subprocess.Popen(
        [daqflow_binary(), "component", kind, "--name", name, "--control", control,
         "--token-file", str(token_file)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield name
    finally:
        process.terminate()
        process.wait(timeout=WAIT)


@pytest.fixture
def sink(control, token_file):
    with component("sink", "py-sink", control, token_file) as name:
        yield name


def test_a_python_process_drives_a_real_component(join, sink):
    """The component protocol (docs/operator-guide.md): subscribe to NAME/state, send
    NAME/configure with a reply_to, get the reply and see the state change."""
    operator = join("py-operator")
    replies = queue.Queue()
    operator.register_command("py-operator/reply", lambda cmd: replies.put(cmd.json()))
    states = operator.subscribe(f"{sink}/state")
    first = states.get(timeout=WAIT).json()
    assert first["name"] == sink and first["kind"] == "sink" and first["state"] == "Initial"
    wait_registrants(operator, "py-operator/reply", 1)
    wait_registrants(operator, f"{sink}/configure", 1)
    assert operator.send_json(f"{sink}/configure", {"id": 7, "reply_to": "py-operator"}) == 1
    reply = replies.get(timeout=WAIT)
    assert reply["id"] == 7 and reply["command"] == "configure"
    assert "listen" in reply["outcome"]["ok"]["info"] and reply["status"]["state"] == "Configured"
    for msg in states:
        if msg.json()["state"] == "Configured":
            break
    assert operator.send_command(f"{sink}/reset") == 1
    for msg in states:
        if msg.json()["state"] == "Initial":
            break


def test_dialogs_left_open_are_closed_when_python_exits(control, token_file):
    """A script that never closes its dialog (with a callback running) exits cleanly."""
    script = (
        "import sys, threading\n"
        "from daqflow import dialog\n"
        "d = dialog.connect('py-exit', sys.argv[1], token_file=sys.argv[2])\n"
        "s = d.provide('py-exit/n', b'0')\n"
        "seen = threading.Event()\n"
        "d.subscribe('py-exit/n', lambda m: seen.set())\n"
        "assert seen.wait(20)\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script, control, str(token_file)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_every_example_of_the_control_plane_guide_runs(control, token_file, tmp_path, monkeypatch, capsys):
    """The blocks docs/blocks.toml runs in the setting "control-plane" (docs/python.md's "Control
    plane"), in order, in one namespace, with the system's control server and token in the
    environment and a sink component `sink-1`; each prints what the manifest says."""
    monkeypatch.setenv("DAQFLOW_CONTROL", control)
    monkeypatch.setenv("DAQFLOW_TOKEN_FILE", str(token_file))
    monkeypatch.chdir(tmp_path)
    pairs = doc_blocks.listed("control-plane")
    assert len(pairs) >= 3
    namespace = {}
    with component("sink", "sink-1", control, token_file), contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: [v.close() for v in namespace.values() if isinstance(v, dialog.Dialog)])
        for block, entry in pairs:
            doc_blocks.run_python(block, entry, namespace)


def test_a_python_component_joins_the_control_plane_and_obeys_its_operator_only(join, control, token_file):
    """`daqflow --token-file F component --command "python3 counter.py" --control ADDR
    --operator NAME`: the Python component gets the token (DAQFLOW_TOKEN_FILE), publishes its
    state and statistics, and refuses commands from anyone but its operator."""
    counter = REPO / "python" / "examples" / "counter.py"
    process = subprocess.Popen(
        [daqflow_binary(), "--token-file", str(token_file), "component", "--command",
         f"{sys.executable} {counter}", "--name", "py-counter", "--control", control, "--operator", "py-op",
         "--set", "step=3"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        op, intruder = join("py-op"), join("intruder")
        replies = {"py-op": queue.Queue(), "intruder": queue.Queue()}
        for d in (op, intruder):
            d.register_command(f"{d.name}/reply", lambda cmd, q=replies[d.name]: q.put(cmd.json()))
        states = op.subscribe("py-counter/state")
        assert states.get(timeout=WAIT).json()["kind"] == "counter"
        for d in (op, intruder):
            wait_registrants(d, f"{d.name}/reply", 1)
        wait_registrants(op, "py-counter/configure", 1)
        intruder.send_json("py-counter/configure", {"id": 1, "reply_to": "intruder"})
        refused = replies["intruder"].get(timeout=WAIT)
        assert "py-op" in json.dumps(refused["outcome"]) and refused["status"]["state"] == "Initial", refused
        # Typed on the wire: its kind, and the text a person reads.
        assert refused["outcome"]["error"]["kind"] == "refused", refused
        assert "takes commands from its operator `py-op` only" in refused["outcome"]["error"]["message"], refused
        op.send_json("py-counter/configure", {"id": 2, "reply_to": "py-op", "config": {"step": 7}})
        done = replies["py-op"].get(timeout=WAIT)
        assert done["outcome"]["ok"]["info"] == {"step": 7}, done
        op.send_json("py-counter/start", {"id": 3, "reply_to": "py-op", "run": 5})
        assert replies["py-op"].get(timeout=WAIT)["status"]["state"] == "Running"
        with op.subscribe("py-counter/stats") as stats:
            wait_for(lambda: stats.get(timeout=WAIT).json()["events"] > 0, "counted events in py-counter/stats")
        op.send_json("py-counter/stop", {"id": 4, "reply_to": "py-op"})
        stopped = replies["py-op"].get(timeout=WAIT)
        assert stopped["status"]["state"] == "Configured" and stopped["outcome"]["ok"]["summary"]["events"] % 7 == 0
    finally:
        process.terminate()
        process.wait(timeout=WAIT)
