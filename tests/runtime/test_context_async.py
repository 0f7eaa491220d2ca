"""Async handlers reach the database without blocking the worker's event loop: while one waits
for its flow input (the database is slowed by a lock), another handler on the same loop still
finishes."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.worker.context import Context
from pgflow_gen.runtime.worker.task_runner import Handler, Report, run_task
from tests.engine import Engine


@pytest.fixture
def dependent_task(conn: psycopg.Connection[Any]) -> ClaimedTask:
    """A claimed task of a dependent step: it does not carry the run input."""
    engine = Engine(conn)
    engine.flow("pair", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    engine.start("pair", {"who": "Ada"})
    [first] = engine.poll("pair")
    engine.complete(first, 1)
    [second] = engine.poll("pair")
    assert second.flow_input is None
    return second


async def start(
    task: ClaimedTask, handler: Handler, executor: ThreadPoolExecutor, url: str
) -> Report:
    return await run_task(
        task,
        handler,
        executor=executor,
        worker_id=uuid.uuid4(),
        shutdown=threading.Event(),
        logger=logging.getLogger("test"),
        database_url=url,
    )


def test_one_async_handler_waiting_for_the_database_does_not_hold_up_another(
    dependent_task: ClaimedTask, db_url: str
) -> None:
    async def reads_input(value: Any, ctx: Context[Any], /) -> Any:
        return await ctx.flow_input_async()

    async def quick(value: Any, ctx: Context[Any], /) -> Any:
        return "quick"

    other = ClaimedTask("pair", uuid.uuid4(), "first", None, 0, 0, None, attempt=1, timeout=60)
    with psycopg.connect(db_url) as blocker, ThreadPoolExecutor(max_workers=2) as executor:
        blocker.execute("lock table pgflow.runs in access exclusive mode")  # reads now wait

        async def main() -> tuple[Report, Report]:
            slow = asyncio.create_task(start(dependent_task, reads_input, executor, db_url))
            fast = asyncio.create_task(start(other, quick, executor, db_url))
            done, _ = await asyncio.wait(
                {slow, fast}, timeout=30, return_when=asyncio.FIRST_COMPLETED
            )
            assert done == {fast}  # the loop ran the quick handler while the read waited
            assert not slow.done()
            blocker.rollback()  # the database answers again
            return await slow, await fast

        slow_report, fast_report = asyncio.run(main())
    assert fast_report.output == "quick"
    assert slow_report.output == {"who": "Ada"}


def test_an_async_handler_gets_its_own_async_connection_closed_afterwards(
    dependent_task: ClaimedTask, db_url: str
) -> None:
    connections: list[psycopg.AsyncConnection[Any]] = []

    async def query(value: Any, ctx: Context[Any], /) -> Any:
        connection = await ctx.connection_async()
        assert connection is await ctx.connection_async()  # one per task
        connections.append(connection)
        cursor = await connection.execute("select input from pgflow.runs")
        row = await cursor.fetchone()
        return row[0] if row else None

    with ThreadPoolExecutor(max_workers=1) as executor:
        report = asyncio.run(start(dependent_task, query, executor, db_url))
    assert report.output == {"who": "Ada"}
    assert connections[0].closed
