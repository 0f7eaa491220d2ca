"""The listener: waits for PGMQ's insert notifications on the worker's queue and wakes the
poller, on its own connection (reconnecting, and checking a quiet session now and then).

The engine uses the same channel to say that a run was cancelled (engine 0010): PGMQ's own
notifications carry no payload, the engine's a JSON object `{"event": "run:cancelled", "run_id":
...}`, passed to `on_cancelled`. Anything else on the channel only wakes the poller."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable

import psycopg

from pgflow_gen import naming
from pgflow_gen.runtime.links import Link
from pgflow_gen.runtime.session import Connector, Session

#: A listener that heard nothing for this long checks that its session is alive.
LISTEN_CHECK_S = 60.0


async def listen(
    connect: Connector,
    queue: str,
    wake: asyncio.Event,
    log: logging.Logger,
    on_cancelled: Callable[[uuid.UUID], None] | None = None,
    on_reconnect: Callable[[str], None] | None = None,
) -> None:
    """Set `wake` on every insert into `queue`, and call `on_cancelled` with the id of every
    run the engine cancels while this queue has tasks of it running, until cancelled."""
    channel = naming.pgmq_insert_channel(queue)
    link: Link[Session] = Link(connect, "notifications", log, on_reconnect=on_reconnect)
    try:
        while True:
            session = await link.get()
            if session is None:
                return
            try:
                await session.listen(channel)
                wake.set()  # anything sent while we were not listening
                while True:
                    async for payload in session.notifies(LISTEN_CHECK_S):
                        cancelled = cancelled_run(payload)
                        if cancelled is not None and on_cancelled is not None:
                            on_cancelled(cancelled)
                        wake.set()
                    # Quiet for a while: make sure the session is still alive.
                    await session.ping()
            except psycopg.Error as exc:
                await link.broken(exc)
    finally:
        await link.close()


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
