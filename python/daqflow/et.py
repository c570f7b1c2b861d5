"""The ET system from Python: events in shared memory flowing through stations.

daqflow's Event Transfer system (Jefferson Lab's ET, ``docs/et.md``) hands built events from the
processes that make them (producers) to the processes that use them (consumers). This module
attaches to an ET system on this machine (``connect``, shared memory, no copy) or elsewhere
(``connect_remote``, ``discover``: TCP), creates and configures stations, and gets, puts and
dumps batches of events whose data Python reads and writes in place::

    import daqflow.et as et

    client = et.connect("daq")                     # `daqflow et start --name daq` runs
    client.create_station("mon", blocking=False, cue=50, select=(1, None, None, None))
    with client.attach("mon") as consumer:
        batch = consumer.get_events(100, wait=1.0)
        for event in batch:
            print(event.control, len(event), event.data[:4].tobytes())
        consumer.put_events(batch)

``System`` creates and owns an ET system in this process (tests, small setups). See
``docs/python.md`` ("ET") for the whole guide.
"""

from ._native import (
    EtAccessDeniedError as AccessDeniedError,
    EtAttachment as Attachment,
    EtAttachmentDeadError as AttachmentDeadError,
    EtBatch as Batch,
    EtBufferInUseError as BufferInUseError,
    EtClient as Client,
    EtError,
    EtEvent as Event,
    EtEventReleasedError as EventReleasedError,
    EtNameTakenError as NameTakenError,
    EtNoSuchStationError as NoSuchStationError,
    EtNotFoundError as NotFoundError,
    EtNotOwnedError as NotOwnedError,
    EtOverLimitError as OverLimitError,
    EtPriority as Priority,
    EtRefusedError as RefusedError,
    EtSelection as Selection,
    EtStationExistsError as StationExistsError,
    EtSystem as System,
    EtSystemDeadError as SystemDeadError,
    EtTimedOutError as TimedOutError,
    et_connect as connect,
    et_connect_remote as connect_remote,
    et_discover as discover,
)

GRAND_CENTRAL = "GRAND_CENTRAL"
"""The first station: its input list is the free list. Producers attach to it."""

SLEEP = "sleep"
"""``wait=SLEEP``: wait until events come (the default)."""

ASYNC = "async"
"""``wait=ASYNC``: do not wait; the batch may be empty."""


def consume(attachment, count=100, wait=SLEEP):
    """Yields batches got from ``attachment`` (up to ``count`` events each) for ever, putting
    each batch on after the loop body ran (also when the body leaves the loop with ``break``
    or an exception). With a timed ``wait``, a wait that ends without events yields nothing
    and waits again::

        for batch in et.consume(consumer, 100, wait=0.5):
            total += int(batch.lengths().sum())
            if total > 10_000:
                break
    """
    while True:
        try:
            batch = attachment.get_events(count, wait=wait)
        except TimedOutError:
            continue
        try:
            yield batch
        finally:
            attachment.put_events(batch)


__all__ = [
    "ASYNC",
    "AccessDeniedError",
    "Attachment",
    "AttachmentDeadError",
    "Batch",
    "BufferInUseError",
    "Client",
    "EtError",
    "Event",
    "EventReleasedError",
    "GRAND_CENTRAL",
    "NameTakenError",
    "NoSuchStationError",
    "NotFoundError",
    "NotOwnedError",
    "OverLimitError",
    "Priority",
    "RefusedError",
    "SLEEP",
    "Selection",
    "StationExistsError",
    "System",
    "SystemDeadError",
    "TimedOutError",
    "connect",
    "connect_remote",
    "consume",
    "discover",
]
