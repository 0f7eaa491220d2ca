"""A run's events as Server-Sent Events, so that its page updates while it runs without
polling: one LISTEN connection per open page on the run's channel (`pgflow_run_<id>`), each
notification passed on as it comes, a comment every 15 s to keep proxies from closing the stream.
The stream ends when the browser goes away (Starlette cancels it; the connection closes with it)
or, after passing it on, at the run's final event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import psycopg
from psycopg import sql
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from pgflow_gen.dashboard import pages

KEEPALIVE_S = 15.0
FINAL_EVENTS = ("run:completed", "run:failed", "run:cancelled")


async def run_events(request: Request) -> Response:
    run_id = pages.run_id_of(request)
    url: str = request.app.state.database_url
    channel = f"pgflow_run_{run_id.hex}"

    async def stream() -> AsyncIterator[str]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(sql.SQL("listen {}").format(sql.Identifier(channel)))
            yield "retry: 2000\n\n"
            while True:
                async for notify in conn.notifies(timeout=KEEPALIVE_S):
                    yield f"data: {notify.payload}\n\n"
                    if _event(notify.payload) in FINAL_EVENTS:
                        return
                yield ": keep-alive\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def _event(payload: str) -> str | None:
    try:
        value = json.loads(payload)
    except json.JSONDecodeError:
        return None
    return value.get("event") if isinstance(value, dict) else None
