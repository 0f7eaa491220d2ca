"""A run's events as Server-Sent Events, so that its page updates while it runs without
polling. One LISTEN connection per dashboard process (`RunEvents`, run by the application's
lifespan) listens on the channel of each run an open page follows (`pgflow_run_<id>`) and fans
each notification out to those pages' streams. A stream says `event: ready` once its channel is
listened to (again after the connection was lost), and the page reads the run then: whatever
happened before is in that read, whatever happens after reaches the stream. A stream gets a
comment every 15 s to keep proxies
from closing it, and ends when the browser goes away (Starlette cancels it) or, after passing it
on, at the run's final event. Only a run that exists gets a stream (else 404), and at most
`max_streams` are open at once (then 503: a page falls back to reloading), so open pages cannot
use up the database's connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from pgflow_gen.dashboard import pages
from pgflow_gen.engine import dashboard_statements, statements
from pgflow_gen.runtime.reconnecting import Outage, primary_message

log = logging.getLogger("pgflow_gen.dashboard")

KEEPALIVE_S = 15.0
FINAL_EVENTS = ("run:completed", "run:failed", "run:cancelled")
#: The most event streams one dashboard process keeps open.
MAX_STREAMS = 32
#: How soon a new stream's LISTEN (or a closed one's UNLISTEN) reaches the shared connection.
COMMAND_EVERY_S = 0.2
#: How long the shared connection waits before it connects again after losing the database.
RECONNECT_S = 1.0
#: What the listening connection is for, in the log.
PURPOSE = "live updates"
#: What a stream's queue gets once its channel is listened to: the page should read the run.
READY = None


class RunEvents:
    """The process's one listening connection and the streams it feeds."""

    def __init__(self, database_url: str, max_streams: int = MAX_STREAMS) -> None:
        self.database_url = database_url
        self.max_streams = max_streams
        self._streams: dict[str, set[asyncio.Queue[str | None]]] = {}
        self._listening: set[str] = set()

    @property
    def open_streams(self) -> int:
        return sum(len(queues) for queues in self._streams.values())

    def check_room(self) -> None:
        """HTTPException 503 when `max_streams` are open."""
        if self.open_streams >= self.max_streams:
            raise HTTPException(
                503,
                f"This dashboard already follows {self.max_streams} live pages; this one updates"
                " when reloaded.",
            )

    def subscribe(self, channel: str) -> asyncio.Queue[str | None]:
        """A queue of the channel's payloads, and `READY` each time the channel is (again)
        listened to; unsubscribe when done."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._streams.setdefault(channel, set()).add(queue)
        if channel in self._listening:
            queue.put_nowait(READY)
        return queue

    def unsubscribe(self, channel: str, queue: asyncio.Queue[str | None]) -> None:
        queues = self._streams.get(channel)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._streams[channel]

    async def run(self) -> None:
        """Listen for the open streams until cancelled, connecting again after a loss (one
        warning when the database goes, one line when it is back; each retry at DEBUG)."""
        outage = Outage(log)
        while True:
            connected = False
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.database_url, autocommit=True
                ) as conn:
                    connected = True
                    outage.back(PURPOSE)
                    self._listening = set()
                    await self._serve(conn)
            except psycopg.Error as exc:
                outage.down(PURPOSE, primary_message(exc), None if connected else RECONNECT_S)
                await asyncio.sleep(RECONNECT_S)

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            wanted = set(self._streams)
            for channel in sorted(wanted - self._listening):
                await conn.execute(statements.listen(channel))
                # Every stream of the channel now, including one that arrived during the LISTEN.
                self._listening.add(channel)
                for queue in self._streams.get(channel, ()):
                    queue.put_nowait(READY)
            for channel in sorted(self._listening - wanted):
                # Before the UNLISTEN: a stream arriving meanwhile waits for the next LISTEN.
                self._listening.discard(channel)
                await conn.execute(statements.unlisten(channel))
            async with contextlib.aclosing(conn.notifies(timeout=COMMAND_EVERY_S)) as heard:
                async for notify in heard:
                    for queue in self._streams.get(notify.channel, ()):
                        queue.put_nowait(notify.payload)


async def run_events(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    await _require_run(request, run_id)
    events: RunEvents = request.app.state.run_events
    channel = f"pgflow_run_{run_id.hex}"
    events.check_room()

    async def stream() -> AsyncIterator[str]:
        queue = events.subscribe(channel)
        try:
            yield "retry: 2000\n\n"
            while True:
                try:
                    payload = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if payload is READY:
                    yield "event: ready\ndata: ready\n\n"
                    continue
                yield f"data: {payload}\n\n"
                if _event(payload) in FINAL_EVENTS:
                    return
        finally:
            events.unsubscribe(channel, queue)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


async def _require_run(request: Request, run_id: uuid.UUID) -> None:
    async with request.app.state.pool.connection() as conn:
        row = await (await conn.execute(dashboard_statements.RUN_FLOW, (run_id,))).fetchone()
    if row is None:
        raise HTTPException(404, "No such run in this database (it may have been pruned).")


def _event(payload: str) -> str | None:
    try:
        value = json.loads(payload)
    except json.JSONDecodeError:
        return None
    return value.get("event") if isinstance(value, dict) else None
