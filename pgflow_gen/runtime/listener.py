"""The listener: waits for PGMQ's insert notifications on the worker's queue and wakes the
poller, on its own connection (reconnecting, and checking a quiet session now and then)."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from pgflow_gen import naming
from pgflow_gen.runtime.links import Link
from pgflow_gen.runtime.session import Connector, Session

#: A listener that heard nothing for this long checks that its session is alive.
LISTEN_CHECK_S = 60.0


async def listen(connect: Connector, queue: str, wake: asyncio.Event, log: logging.Logger) -> None:
    """Set `wake` on every insert into `queue`, until cancelled."""
    channel = naming.pgmq_insert_channel(queue)
    link: Link[Session] = Link(connect, "notifications", log)
    try:
        while True:
            session = await link.get()
            if session is None:
                return
            try:
                await session.listen(channel)
                wake.set()  # anything sent while we were not listening
                while True:
                    async for _notify in session.notifies(LISTEN_CHECK_S):
                        wake.set()
                    # Quiet for a while: make sure the session is still alive.
                    await session.ping()
            except psycopg.Error as exc:
                await link.broken(exc)
    finally:
        await link.close()
