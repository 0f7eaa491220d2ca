"""The listener: waits for PGMQ's insert notifications on the worker's queue and wakes the
poller, on its own connection (reconnecting, and checking a quiet session now and then).

The engine uses the same channel to say that a run was cancelled (engine 0010): PGMQ's own
notifications carry no payload, the engine's a JSON object `{"event": "run:cancelled", "run_id":
...}`. Any role that can connect may notify any channel, so such a notification is a hint: for a
run this worker is running (`holds`), the listener asks the engine (one query, engine 0020's
`cancelled_runs`) and calls `on_cancelled` only for a run the engine did cancel. Anything else on
the channel only wakes the poller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable

import psycopg

from pgflow_gen import naming
from pgflow_gen.runtime.reconnecting import Link, Outage
from pgflow_gen.runtime.worker.session import Connector, Session

#: A listener that heard nothing for this long checks that its session is alive.
LISTEN_CHECK_S = 60.0
#: Where the engine says a new burst of debounced starts waits for its run (engine 0030), and
#: what it says.
DEBOUNCED_CHANNEL = "pgflow_debounced"
DEBOUNCED_PAYLOAD = '{"event": "debounce:pending"}'


async def listen(
    connect: Connector,
    queue: str,
    wake: asyncio.Event,
    log: logging.Logger,
    on_cancelled: Callable[[uuid.UUID], None] | None = None,
    on_reconnect: Callable[[str], None] | None = None,
    holds: Callable[[uuid.UUID], bool] = lambda _run_id: True,
    outage: Outage | None = None,
    on_debounced: Callable[[], None] | None = None,
) -> None:
    """Set `wake` on every insert into `queue`, call `on_cancelled` with the id of every run
    the engine cancels while this worker `holds` tasks of it, and `on_debounced` when a new
    burst of debounced starts waits for its run (engine 0030), until cancelled."""
    channel = naming.pgmq_insert_channel(queue)
    link: Link[Session] = Link(
        connect, "notifications", log, on_reconnect=on_reconnect, outage=outage
    )
    try:
        while True:
            session = await link.get()
            if session is None:
                return
            try:
                await session.listen(channel)
                if on_debounced is not None:
                    await session.listen(DEBOUNCED_CHANNEL)
                    on_debounced()  # any burst begun while we were not listening
                wake.set()  # anything sent while we were not listening
                while True:
                    claimed = await _hear(
                        session, wake, holds if on_cancelled else None, on_debounced
                    )
                    if claimed is None:
                        # Quiet for a while: make sure the session is still alive.
                        await session.ping()
                        continue
                    assert on_cancelled is not None
                    confirmed = set(await session.cancelled_runs(claimed))
                    for run_id in claimed:
                        if run_id in confirmed:
                            on_cancelled(run_id)
                        else:
                            log.warning(
                                "ignored a run:cancelled notification for run %s: the engine"
                                " says the run is not cancelled (someone else sent it)",
                                run_id,
                            )
            except psycopg.Error as exc:
                await link.broken(exc)
    finally:
        await link.close()


async def _hear(
    session: Session,
    wake: asyncio.Event,
    holds: Callable[[uuid.UUID], bool] | None,
    on_debounced: Callable[[], None] | None = None,
) -> list[uuid.UUID] | None:
    """Wake the poller on each notification until some that arrived together say that runs
    this worker holds were cancelled (returned, for the engine to confirm: between batches,
    as psycopg holds the connection while it waits), or LISTEN_CHECK_S pass (None). Each
    batch is read to its end: one transaction that cancels several runs (a parent run and
    its subflow runs) sends their notifications together."""
    deadline = time.monotonic() + LISTEN_CHECK_S
    while (left := deadline - time.monotonic()) > 0:
        found: list[uuid.UUID] = []
        async with contextlib.aclosing(session.notifies(left)) as stream:
            async for payload in stream:
                if payload == DEBOUNCED_PAYLOAD:
                    if on_debounced is not None:
                        on_debounced()
                    continue
                wake.set()
                cancelled = cancelled_run(payload)
                if cancelled is not None and holds is not None and holds(cancelled):
                    found.append(cancelled)
        if found:
            return list(dict.fromkeys(found))
    return None


def cancelled_run(payload: str) -> uuid.UUID | None:
    """The run a notification says was cancelled, or None (an insert, anything else).

    >>> cancelled_run('{"event": "run:cancelled", "run_id": "5f0e8b0a-3c3e-4a53-9b4e-3f1b7d1c'
    ...               '2a10"}')
    UUID('5f0e8b0a-3c3e-4a53-9b4e-3f1b7d1c2a10')
    >>> cancelled_run(""), cancelled_run("not json"), cancelled_run('{"event": "other"}')
    (None, None, None)
    """
    if not payload.startswith("{"):
        return None
    try:
        event = json.loads(payload)
        if event.get("event") != "run:cancelled":
            return None
        return uuid.UUID(str(event["run_id"]))
    except (ValueError, KeyError, AttributeError):
        return None
