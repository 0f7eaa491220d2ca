"""Debounced starts and the workers' scheduler (engine 0030): the elected scheduler starts the
bursts that are due and wakes for the next one; an idle scheduler (no schedules, nothing
pending) is nudged by the worker's listener when a burst begins, instead of looking again only
every IDLE_CHECK_S."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.worker import scheduler as scheduling
from pgflow_gen.runtime.worker.listener import listen
from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from pgflow_gen.runtime.worker.scheduler import Scheduler
from tests.e2e.harness import eventually
from tests.engine import Engine

LOG = logging.getLogger("tests.debounce")


@pytest.fixture
def digest(conn: psycopg.Connection[Any]) -> Engine:
    engine = Engine(conn)
    engine.flow("digest", {"slug": "send"})
    return engine


def burst(engine: Engine, key: str, seconds_ago: float, period: float = 1) -> None:
    """A burst of one start made `seconds_ago` on the server's clock."""
    engine.one(
        "select * from pgflow._debounce_start('digest', %s, %s, %s, null,"
        " clock_timestamp() - make_interval(secs => %s))",
        Jsonb({"key": key}), key, period, seconds_ago,
    )  # fmt: skip


async def tick(db_url: str, schedulers: int = 1) -> list[float]:
    conns = [
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(schedulers)
    ]
    try:
        return list(await asyncio.gather(*(Scheduler(LOG).tick(c) for c in conns)))
    finally:
        for conn in conns:
            await conn.close()


def test_the_elected_scheduler_starts_the_due_bursts_once_and_wakes_for_the_next(
    digest: Engine, db_url: str
) -> None:
    burst(digest, "due-a", seconds_ago=5)
    burst(digest, "due-b", seconds_ago=2)
    burst(digest, "later", seconds_ago=0, period=300)

    waits = asyncio.run(tick(db_url, schedulers=3))

    started = digest.all("select input from pgflow.runs order by input->>'key'")
    assert started == [{"input": {"key": "due-a"}}, {"input": {"key": "due-b"}}]
    assert digest.value("select debounce_key from pgflow.debounced_starts") == "later"
    assert len(waits) == 3
    [wait] = asyncio.run(tick(db_url))
    assert wait == scheduling.MAX_SLEEP_S  # the next is 300 s away: it reads again before
    burst(digest, "soon", seconds_ago=0, period=3)
    [wait] = asyncio.run(tick(db_url))
    assert 0 < wait <= 3


def test_an_idle_scheduler_is_nudged_by_the_listener_when_a_burst_begins(
    digest: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduling, "IDLE_CHECK_S", 3600.0)  # without the nudge: not in time

    async def main() -> None:
        scheduler = Scheduler(LOG)
        ticking = asyncio.create_task(scheduler.run(db_url, None))
        listening = asyncio.create_task(
            listen(
                functools.partial(PsycopgSession.connect, db_url, None),
                "digest",
                asyncio.Event(),
                LOG,
                on_debounced=scheduler.nudge,
            )
        )
        try:
            await asyncio.to_thread(
                eventually,
                lambda: digest.value(
                    "select count(*) from pg_stat_activity"
                    " where query ilike 'listen%%pgflow_debounced%%'"
                ),
                "the listener",
            )
            digest.conn.execute("select pgflow.debounce_start('digest', '{}', 'k', 0.01)")
            await asyncio.to_thread(
                eventually, lambda: digest.value("select count(*) from pgflow.runs"), "the run"
            )
        finally:
            ticking.cancel()
            listening.cancel()
            await asyncio.gather(ticking, listening, return_exceptions=True)

    asyncio.run(main())
    assert digest.value("select count(*) from pgflow.debounced_starts") == 0


def test_a_forged_nudge_costs_a_tick_and_starts_nothing_early(digest: Engine, db_url: str) -> None:
    burst(digest, "later", seconds_ago=0, period=300)

    async def main() -> None:
        scheduler = Scheduler(LOG)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            scheduler.nudge()  # what anyone's NOTIFY on the channel does through the listener
            await scheduler._sleep(3600)  # returns at once
            await scheduler.tick(conn)

    asyncio.run(main())
    assert digest.value("select count(*) from pgflow.runs") == 0
    assert digest.value("select starts from pgflow.debounced_starts") == 1
