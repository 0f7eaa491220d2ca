"""What each page shows, read from the database and shaped into plain view objects that the
templates print without deciding anything. One async function per page; each takes a connection
from the dashboard's pool and sends the named statements of
`pgflow_gen.engine.dashboard_statements`.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import uuid
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg

from pgflow_gen import run_ids
from pgflow_gen.engine import dashboard_statements, statements, support
from pgflow_gen.runtime.client import calls, limits_in_words, run_calls, with_concurrency
from pgflow_gen.runtime.client.models import PendingStart

Connection = psycopg.AsyncConnection[dict[str, Any]]

PAGE_SIZE = 50
BACKLOG_AGE_S = 30  # a step's backlog "grows" once its oldest waiting task waited this long
RUN_STATUSES = ("started", "completed", "failed", "cancelled")


class BadCursorError(ValueError):
    """A page cursor that this dashboard did not write (edited or truncated)."""


# -- queues and routes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """A step's queue route as an operator watches it."""

    flow_slug: str
    step_slug: str
    step_index: int
    queue_name: str
    live_workers: int
    covered: bool
    paused: bool
    pause_reason: str | None
    paused_at: datetime.datetime | None
    queued: int
    running: int
    last_claim_at: datetime.datetime | None
    oldest_queued_at: datetime.datetime | None
    went_last_minute: int
    parked: int
    depth: int | None = None
    visible: int | None = None
    oldest_age_s: int | None = None
    total_sent: int | None = None
    #: The step's limits and their use (step_limit_usage's row; engine 0017), None: no limits.
    limits: dict[str, Any] | None = None

    @property
    def limits_text(self) -> str | None:
        """The limits and their use in a few words: "3/4 in flight, 42/100 starts per 60 s",
        and whose they are when an operator's override the spec's."""
        return None if self.limits is None else limits_in_words(self.limits)

    @property
    def at_limit(self) -> bool:
        """No task of the step can start now: a limit is used up (its waiting tasks wait for
        room, not for a worker)."""
        limits = self.limits
        if limits is None:
            return False
        capped = limits["max_in_flight"] is not None
        rated = limits["rate_limit"] is not None
        return (capped and limits["in_flight"] >= limits["max_in_flight"]) or (
            rated and limits["window_starts"] >= limits["rate_limit"]
        )

    @property
    def growing(self) -> bool:
        """The step falls behind: its oldest waiting task has waited for BACKLOG_AGE_S or longer
        (one that just came is no backlog), and more of its tasks wait than finished in the
        last minute (at its pace it cannot clear them within a minute)."""
        if self.oldest_queued_at is None or self.queued <= self.went_last_minute:
            return False
        waited = datetime.datetime.now(datetime.UTC) - self.oldest_queued_at
        return waited.total_seconds() >= BACKLOG_AGE_S

    @property
    def problems(self) -> tuple[str, ...]:
        found = []
        if not self.covered:
            found.append("no live worker")
        if self.paused:
            found.append("paused")
        if self.growing:
            found.append("backlog growing")
        return tuple(found)


async def routes(conn: Connection) -> list[Route]:
    """Every step route with its coverage, pause, limits, tasks and its queue's metrics."""
    live_within = await _one(conn, dashboard_statements.LIVE_WITHIN)
    rows = await (
        await conn.execute(dashboard_statements.ROUTES, (live_within["seconds"],))
    ).fetchall()
    metrics = {
        m["queue_name"]: m
        for m in await (await conn.execute(dashboard_statements.QUEUE_METRICS)).fetchall()
    }
    step_limits = statements.step_limit_usage(await support.version_async(conn))
    limits = {
        (r["flow_slug"], r["step_slug"]): r
        for r in await (await conn.execute(step_limits, (None,))).fetchall()
    }
    usage = await (await conn.execute(statements.CONCURRENCY_USAGE)).fetchall()
    limits = with_concurrency(limits, usage)
    found = []
    for row in rows:
        m = metrics.get(row["queue_name"], {})
        found.append(
            Route(
                **row,
                depth=m.get("queue_length"),
                visible=m.get("queue_visible_length"),
                oldest_age_s=m.get("oldest_msg_age_sec"),
                total_sent=m.get("total_messages"),
                limits=limits.get((row["flow_slug"], row["step_slug"])),
            )
        )
    return found


# -- overview ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowSummary:
    flow_slug: str
    queue_mode: str
    steps: int
    started: int
    completed: int
    failed: int
    cancelled: int
    per_minute: tuple[int, ...]  # tasks finished per minute, the oldest of the last 60 first

    @property
    def tasks_last_hour(self) -> int:
        return sum(self.per_minute)


@dataclass(frozen=True)
class Overview:
    flows: list[FlowSummary]
    routes: list[Route]

    @property
    def attention(self) -> list[Route]:
        return [route for route in self.routes if route.problems]


async def overview(conn: Connection) -> Overview:
    minutes: dict[str, list[int]] = {}
    for row in await (await conn.execute(dashboard_statements.TASKS_PER_MINUTE)).fetchall():
        if 0 <= row["minute"] < 60:
            minutes.setdefault(row["flow_slug"], [0] * 60)[59 - row["minute"]] = row["tasks"]
    flows = [
        FlowSummary(**row, per_minute=tuple(minutes.get(row["flow_slug"], [0] * 60)))
        for row in await (await conn.execute(dashboard_statements.FLOWS)).fetchall()
    ]
    return Overview(flows=flows, routes=await routes(conn))


# -- runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    run_id: uuid.UUID
    flow_slug: str
    status: str
    started_at: datetime.datetime
    ended_at: datetime.datetime | None
    retry_count: int
    cancel_reason: str | None
    failed_step: str | None
    failed_error: str | None  # the first line of the failed step's error
    waiting_signals: list[str]  # the signal steps a running run waits for


@dataclass(frozen=True)
class RunFilter:
    flow: str | None = None
    status: str | None = None
    search: str | None = None  # a run id or its first characters


@dataclass(frozen=True)
class RunsPage:
    rows: list[RunRow]
    filter: RunFilter
    flows: list[str]
    older: str | None  # the cursor of the next page (older runs), if there is one
    newer: str | None  # the cursor of the page before (newer runs), if there is one
    #: The debounced starts waiting for their runs (engine 0030), on the first page only.
    pending: list[PendingStart] = field(default_factory=list)


def cursor(row: RunRow) -> str:
    """The keyset position of a run in the list (its start time and id), opaque in a URL."""
    raw = f"{row.started_at.isoformat()}|{row.run_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def read_cursor(text: str) -> tuple[datetime.datetime, uuid.UUID]:
    """The position a cursor names; BadCursorError if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, run_id = raw.split("|")
        when = datetime.datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        raise BadCursorError(f"not a page cursor: {text[:40]!r}") from exc


async def runs_page(
    conn: Connection,
    run_filter: RunFilter,
    *,
    older_than: str | None = None,
    newer_than: str | None = None,
    size: int = PAGE_SIZE,
) -> RunsPage:
    """One page of runs, newest first, after (older than) or before (newer than) a cursor."""
    low, high = run_ids.id_range(run_filter.search) if run_filter.search else (None, None)
    params: dict[str, Any] = {
        "flow": run_filter.flow,
        "status": run_filter.status,
        "low": low,
        "high": high,
        "at": None,
        "id": None,
        "limit": size + 1,
    }
    going_newer = newer_than is not None
    if newer_than is not None:
        params["at"], params["id"] = read_cursor(newer_than)
    elif older_than is not None:
        params["at"], params["id"] = read_cursor(older_than)
    query = dashboard_statements.RUNS_NEWER if going_newer else dashboard_statements.RUNS_OLDER
    found = [RunRow(**row) for row in await (await conn.execute(query, params)).fetchall()]
    more = len(found) > size
    if going_newer:
        rows = found[-size:] if more else found  # the newer query returns the oldest ones last
        older, newer = (cursor(rows[-1]) if rows else None), (cursor(rows[0]) if more else None)
    else:
        rows = found[:size]
        older = cursor(rows[-1]) if more else None
        newer = cursor(rows[0]) if rows and older_than is not None else None
    flows = [
        row["flow_slug"] for row in await (await conn.execute(statements.FLOW_SLUGS)).fetchall()
    ]
    first = older_than is None and newer_than is None
    pending = (
        await calls.run_async(conn, run_calls.pending_starts(run_filter.flow))
        if first and statements.has_debounce(await support.version_async(conn))
        else []
    )
    return RunsPage(
        rows=rows, filter=run_filter, flows=flows, older=older, newer=newer, pending=pending
    )


# -- workers -------------------------------------------------------------------------------------


async def workers(conn: Connection, *, everyone: bool = False) -> list[dict[str, Any]]:
    """The workers, by queue and newest first within it: those stopped more than an hour ago,
    or replaced by a later one of their name, only with `everyone`."""
    statement = statements.workers(await support.version_async(conn))
    rows = await (await conn.execute(statement, (everyone,))).fetchall()
    rows.sort(key=lambda row: row["started_at"], reverse=True)
    rows.sort(key=lambda row: row["queue_name"])  # stable: newest first within each queue
    return rows


async def _one(conn: Connection, query: LiteralString) -> dict[str, Any]:
    row = await (await conn.execute(query)).fetchone()
    assert row is not None, query
    return row
