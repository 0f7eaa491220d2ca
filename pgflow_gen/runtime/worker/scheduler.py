"""The scheduler: starts the runs of every flow's schedules in the database, and the runs of
debounced bursts that are due (engine 0030), from each worker process (setting `schedules`),
one elected per tick.

Each tick is one transaction: `pg_try_advisory_xact_lock` elects one scheduler across every
worker (the others read the schedules only to know when to wake), which asks `cron_slots.due`
what to start and calls `pgflow.start_scheduled_runs` for it, then
`pgflow.start_debounced_runs`. The engine's promise (one run per
slot, by the slot's idempotency key and the schedule's last slot) holds whoever ticks, so an
election lost or doubled by a network partition costs a wasted call, never a second run. A
transaction-scoped lock works behind a transaction pooler (PgBouncer), where a session's lock
would not.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgflow_gen.engine import statements, support, worker_statements
from pgflow_gen.runtime.reconnecting import primary_message
from pgflow_gen.runtime.worker import cron_slots
from pgflow_gen.words import counted

#: Advisory lock keys in namespace 2 (session.LOCK_NAMESPACE); 3 and 4 are taken.
LOCK_NAMESPACE = 2
SCHEDULER_LOCK = 5
#: The longest a scheduler sleeps: it then reads the schedules again (new, changed, resumed).
MAX_SLEEP_S = 10.0
#: How long it waits after losing the database.
RETRY_S = 5.0
#: While the database has no schedule, the scheduler holds no connection and looks again this
#: often (on a connection of that moment); a new schedule's slots count from when it was stored.
IDLE_CHECK_S = 30.0
#: The least time between two ticks, however often the scheduler is nudged.
NUDGE_FLOOR_S = 0.2
#: Past a slot's time before it ticks, so that the slot is due (clocks differ a little).
WAKE_MARGIN_S = 0.05


Clock = Callable[[], datetime.datetime]


def wall_clock() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Scheduler:
    """Ticks until stopped (see the module docstring)."""

    def __init__(self, logger: logging.Logger, clock: Clock = wall_clock) -> None:
        self.log = logger
        self.clock = clock
        #: (flow, schedule, cron) whose expression croniter refused: said once.
        self._refused: set[tuple[str, str, str]] = set()
        #: (flow, schedule, error) the engine refused: said once until it works again.
        self._failing: dict[tuple[str, str], str] = {}
        #: How many schedules the last tick read (paused ones included).
        self.schedules_seen = 0
        #: Whether the last tick saw a debounced burst waiting for its run (engine 0030).
        self.bursts_pending = False
        #: Set when a new burst begins (the worker's listener hears it): tick now.
        self._nudged = asyncio.Event()

    def nudge(self) -> None:
        """A new burst of debounced starts waits: tick at once, even while idle."""
        self._nudged.set()

    async def tick(self, conn: psycopg.AsyncConnection[Any]) -> float:
        """One tick on `conn` (autocommit); the seconds until the next slot of any schedule."""
        now = self.clock()
        wake = MAX_SLEEP_S
        async with conn.transaction():
            cursor = await conn.execute(
                worker_statements.ELECT_SCHEDULER, (LOCK_NAMESPACE, SCHEDULER_LOCK)
            )
            row = await cursor.fetchone()
            elected = bool(row and row[0])
            async with conn.cursor(row_factory=dict_row) as cur:
                rows = await (await cur.execute(worker_statements.LIST_SCHEDULES)).fetchall()
            self.schedules_seen = len(rows)
            for row in rows:
                schedule = cron_slots.Schedule(**row)
                if schedule.paused:
                    continue
                try:
                    plan = cron_slots.due(schedule, now)
                    upcoming = cron_slots.next_slot(schedule, now)
                except (ValueError, KeyError) as exc:
                    self._say_refused(schedule, exc)
                    continue
                wake = min(wake, max(0.0, (upcoming - now).total_seconds()))
                if elected and plan.passed_through is not None:
                    await self._start(conn, schedule, plan)
            if statements.has_debounce(await support.version_async(conn)):
                if elected:
                    await self._start_debounced(conn)
                row = await (
                    await conn.execute(worker_statements.DEBOUNCED_STARTS_DUE_IN)
                ).fetchone()
                due_in = None if row is None else row[0]
                self.bursts_pending = due_in is not None
                if due_in is not None:
                    wake = min(wake, due_in)
        return wake

    async def _sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or until nudged; never less than NUDGE_FLOOR_S (anyone may notify
        the channel: a flood of notifications costs a tick every NUDGE_FLOOR_S at most)."""
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._nudged.wait(), seconds)
        self._nudged.clear()
        await asyncio.sleep(max(0.0, NUDGE_FLOOR_S - (time.monotonic() - started)))

    async def _start_debounced(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Start the runs of the debounced bursts that are due; a failure is said once."""
        key = ("", "debounced starts")
        try:
            async with conn.transaction():  # a savepoint, as for a schedule
                started = await (
                    await conn.execute(worker_statements.START_DEBOUNCED_RUNS)
                ).fetchall()
        except psycopg.Error as exc:
            message = exc.diag.message_primary or str(exc)
            if self._failing.get(key) != message:
                self._failing[key] = message
                self.log.error("debounced starts could not start their runs: %s", message)
            return
        self._failing.pop(key, None)
        for flow_slug, debounce_key, starts, run_id in started:
            self.log.info(
                "debounced start %s of flow %s started run %s (%s)",
                debounce_key, flow_slug, run_id, counted(starts, "start"),
            )  # fmt: skip

    async def _start(
        self,
        conn: psycopg.AsyncConnection[Any],
        schedule: cron_slots.Schedule,
        plan: cron_slots.Plan,
    ) -> None:
        key = (schedule.flow_slug, schedule.name)
        try:
            async with conn.transaction():  # a savepoint: one schedule's failure is its own
                started = await (
                    await conn.execute(
                        worker_statements.START_SCHEDULED_RUNS,
                        (schedule.flow_slug, schedule.name, plan.slots, plan.passed_through),
                    )
                ).fetchall()
        except psycopg.Error as exc:
            message = exc.diag.message_primary or str(exc)
            if self._failing.get(key) != message:
                self._failing[key] = message
                self.log.error(
                    "schedule %s of flow %s could not start its runs: %s",
                    schedule.name, schedule.flow_slug, message,
                )  # fmt: skip
            return
        self._failing.pop(key, None)
        for slot, run_id, created in started:
            if created:
                self.log.info(
                    "schedule %s of flow %s started run %s for %s",
                    schedule.name, schedule.flow_slug, run_id, slot.isoformat(),
                )  # fmt: skip
        if plan.passed_over:
            self.log.warning(
                "schedule %s of flow %s passed over %s%s (catch_up: %s)",
                schedule.name, schedule.flow_slug,
                "at least " if plan.more_passed_over else "",
                counted(plan.passed_over, "missed slot"),
                schedule.catch_up,
            )  # fmt: skip

    def _say_refused(self, schedule: cron_slots.Schedule, exc: Exception) -> None:
        key = (schedule.flow_slug, schedule.name, schedule.cron)
        if key not in self._refused:
            self._refused.add(key)
            self.log.error(
                "schedule %s of flow %s has a cron expression or time zone this scheduler"
                " cannot read (%r, %s): %s; it starts nothing until its spec is fixed",
                schedule.name, schedule.flow_slug, schedule.cron, schedule.timezone, exc,
            )  # fmt: skip

    async def run(self, database_url: str, prepare_threshold: int | None) -> None:
        """Tick until cancelled, on a connection of its own while the database has schedules or
        debounced bursts waiting (none otherwise: it looks again every IDLE_CHECK_S, or at once
        when the worker's listener hears that a burst began), reconnecting after it is lost
        (said once per outage)."""
        conn: psycopg.AsyncConnection[Any] | None = None
        down = False
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            database_url, autocommit=True, prepare_threshold=prepare_threshold
                        )
                    wait = await self.tick(conn)
                    if down:
                        self.log.info("scheduler: connected again")
                    down = False
                    if self.schedules_seen == 0 and not self.bursts_pending:
                        # Nothing to start: hold no connection.
                        await conn.close()
                        conn = None
                        wait = IDLE_CHECK_S
                except psycopg.OperationalError as exc:
                    if not down:
                        self.log.warning(
                            "scheduler: lost the database (%s); trying again every %g s",
                            primary_message(exc), RETRY_S,
                        )  # fmt: skip
                    down = True
                    wait = RETRY_S
                    if conn is not None:
                        await conn.close()
                        conn = None
                await self._sleep(wait if conn is None else min(MAX_SLEEP_S, wait + WAKE_MARGIN_S))
        finally:
            if conn is not None:
                await conn.close()
