"""A soft IOC for the EPICS tests: EPICS base's IOC as packaged for Python (pythonSoftIOC), on
the Channel Access ports of its environment (``EPICS_CA_SERVER_PORT``, …, set by the test).

Records: ``PREFIX:VMON`` (ai, V, HIGH 1510 MINOR, HIHI 1520 MAJOR), ``PREFIX:IMON`` (ai, uA),
``PREFIX:MODE`` (mbbi: OFF, ON). Lines on standard input set them (``VMON 1512.5``); it prints
``ready`` once serving and exits when its input closes.
"""

import os
import sys
import threading

from softioc import asyncio_dispatcher, builder, softioc

builder.SetDeviceName(sys.argv[1] if len(sys.argv) > 1 else "HV:CH1")
records = {
    "VMON": builder.aIn("VMON", initial_value=1500.0, EGU="V", PREC=1, HIGH=1510, HSV="MINOR", HIHI=1520, HHSV="MAJOR"),
    "IMON": builder.aIn("IMON", initial_value=1.5, EGU="uA", PREC=3),
    "MODE": builder.mbbIn("MODE", "OFF", "ON", initial_value=1),
}
builder.LoadDatabase()
softioc.iocInit(asyncio_dispatcher.AsyncioDispatcher())


def commands() -> None:
    for line in sys.stdin:
        words = line.split()
        if len(words) == 2 and words[0] in records:
            records[words[0]].set(float(words[1]) if words[0] != "MODE" else int(words[1]))
            print("set", words[0], flush=True)
    os._exit(0)


threading.Thread(target=commands, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
