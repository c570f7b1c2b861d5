"""daqflow's control plane (DIALOG) from Python.

A Python program joins the control plane under a name, as every daqflow process does: it
provides services and publishes their values, subscribes to services (with a callback, or
iterating over a queue), accepts commands and sends them. The processes of a running system
(components, the operator, the web UI) are its partners: a component's status is the service
``NAME/state``, and it takes the commands ``NAME/configure``, ``NAME/start``, ... (the component
protocol, docs/operator-guide.md).

::

    from daqflow import dialog

    with dialog.connect("monitor", control="127.0.0.1:7000", token_file="daqflow-demo/token") as d:
        for msg in d.subscribe("evm/state"):
            print(msg.json()["state"])

It wraps the Rust client ``daqflow_dialog::Dialog`` (crates/dialog, docs/dialog.md). Blocking
calls release the GIL; callbacks run on the client's threads with the GIL taken, one command at a
time in order; an exception in a callback is logged (logger ``daqflow.dialog``). Services,
subscriptions and command registrations last until closed, or until their ``Dialog`` is.
"""

import atexit
import os
import weakref
from typing import Iterable, Optional, Union

from ._native import (
    Command,
    CommandRegistration,
    ControlServerUnavailableError,
    DialogClosedError,
    DialogError,
    InvalidNameError,
    Message,
    Service,
    ServiceRevokedError,
    ServiceTakenError,
    Subscription,
    TokenError,
    dialog_connect as _connect,
)
from ._native import Dialog

__all__ = [
    "CONTROL_ENV",
    "DEFAULT_CONTROL",
    "Command",
    "CommandRegistration",
    "ControlServerUnavailableError",
    "Dialog",
    "DialogClosedError",
    "DialogError",
    "InvalidNameError",
    "Message",
    "Service",
    "ServiceRevokedError",
    "ServiceTakenError",
    "Subscription",
    "TokenError",
    "connect",
]

DEFAULT_CONTROL = "127.0.0.1:7000"
"""The control server's address when neither ``control`` nor ``DAQFLOW_CONTROL`` gives one."""

CONTROL_ENV = "DAQFLOW_CONTROL"
"""The environment variable with the control server address(es), as for the ``daqflow``
command."""

# Every dialog still open, closed when Python exits: callbacks must not run into an
# interpreter that is shutting down, and the control server is told the process left.
_open: "weakref.WeakSet[Dialog]" = weakref.WeakSet()


def connect(
    name: str,
    control: Union[str, Iterable[str], None] = None,
    *,
    token: Optional[str] = None,
    token_file: Union[str, "os.PathLike[str]", None] = None,
    listen: Optional[str] = None,
    timeout: Optional[float] = 10.0,
) -> Dialog:
    """Joins the control plane as process ``name`` (unique in the system) and returns its
    ``Dialog``; use it as a context manager, or ``close()`` it.

    ``control``: the control server, ``"host:port"``, or several (the primary, then spares) as a
    list or comma-separated; default ``$DAQFLOW_CONTROL``, else ``127.0.0.1:7000``.

    The system token, proven on every connection: ``token`` (the secret itself), else
    ``token_file`` (a file only its owner may read, as ``daqflow --token-file``), else the file
    ``$DAQFLOW_TOKEN_FILE``, else ``$DAQFLOW_TOKEN``, else none. A token file readable by group or
    others is refused (``TokenError``), as the ``daqflow`` command refuses it.

    ``listen``: where to listen for peers (default: a free port on 127.0.0.1 when the control
    servers are on this host, else on every interface).

    Waits up to ``timeout`` seconds for a control server to accept the process (``None``: for
    ever; ``0``: not at all, the connection is then made in the background and retried for
    ever); raises ``ControlServerUnavailableError`` with the reason (a wrong token, a name
    taken, nothing listening) if none did.
    """
    if control is None:
        control = os.environ.get(CONTROL_ENV, "").strip() or DEFAULT_CONTROL
    elif not isinstance(control, str):
        control = ",".join(control)
    if token_file is not None:
        token_file = os.fspath(token_file)
    d = _connect(name, control, token=token, token_file=token_file, listen=listen, timeout=timeout)
    _open.add(d)
    return d


@atexit.register
def _close_all() -> None:
    for d in list(_open):
        d.close()
