"""Client and AsyncClient starts with a priority (engine 0031): the run keeps it, its tasks are
claimed first, and a priority out of range is refused before anything is sent."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import AsyncClient, Client
from tests.engine import WORKER_ID, Engine
from tests.runtime.test_client import ADA, FLOW


@pytest.fixture
def client(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Client]:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    with Client(db_url) as client:
        yield client


def priorities(conn: psycopg.Connection[Any]) -> list[tuple[Any, int]]:
    rows = conn.execute("select run_id, priority from pgflow.runs order by started_at").fetchall()
    return [(row[0], row[1]) for row in rows]


def test_a_run_started_with_a_priority_is_claimed_before_the_backlog(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    backlog = client.start_flows(FLOW, [ADA, ADA])
    urgent = client.start_flow(FLOW, ADA, priority=10)
    batch = client.start_flows(FLOW, [ADA], priority=5)
    by_slug = client.start_flow(FLOW.slug, dict(ADA), priority=1)

    assert [urgent.priority, batch[0].priority, by_slug.priority] == [10, 5, 1]
    assert [run.priority for run in backlog] == [0, 0]
    assert client.get_run(urgent.run_id).priority == 10
    assert dict(priorities(conn)) == {
        backlog[0].run_id: 0,
        backlog[1].run_id: 0,
        urgent.run_id: 10,
        batch[0].run_id: 5,
        by_slug.run_id: 1,
    }
    engine = Engine(conn)
    engine.register(FLOW.slug)
    order = [
        row[0]
        for _ in range(5)
        for row in conn.execute(
            "select run_id from pgflow.read_and_claim(%s, %s, %s, 1, 30)",
            (FLOW.slug, FLOW.slug, WORKER_ID),
        ).fetchall()
    ]
    assert order == [urgent.run_id, batch[0].run_id, by_slug.run_id] + [r.run_id for r in backlog]


@pytest.mark.parametrize("bad", [-1, 1001, True, 2.5])
def test_a_priority_out_of_range_is_refused_before_anything_is_sent(
    client: Client, conn: psycopg.Connection[Any], bad: Any
) -> None:
    expected = f"A run's priority must be a whole number from 0 to 1000, got {bad!r}."
    with pytest.raises(UsageError, match=re.escape(expected)):
        client.start_flow(FLOW, ADA, priority=bad)
    with pytest.raises(UsageError, match="whole number from 0 to 1000"):
        client.start_flows(FLOW, [ADA], priority=bad)
    assert priorities(conn) == []


def test_the_async_client_starts_with_a_priority(
    client: Client, conn: psycopg.Connection[Any], db_url: str
) -> None:
    async def main() -> tuple[Any, list[Any]]:
        async with AsyncClient(db_url) as aclient:
            one = await aclient.start_flow(FLOW, ADA, priority=7)
            many = await aclient.start_flows(FLOW, [ADA, ADA], priority=3)
            with pytest.raises(UsageError):
                await aclient.start_flow(FLOW, ADA, priority=-5)
            return one.run_id, [r.run_id for r in many]

    one, many = asyncio.run(main())
    assert dict(priorities(conn)) == {one: 7, many[0]: 3, many[1]: 3}


def test_a_run_says_where_it_came_from_a_parent_step_or_a_fork(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    engine = Engine(conn)
    engine.flow("shipping", {"slug": "pack"})
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})
    parent = client.start_flow("orders", {"id": 1}, priority=4)
    child_id = engine.value(
        "select run_id from pgflow.runs where parent_run_id = %s", parent.run_id
    )

    child = client.get_run(child_id)
    assert (child.parent_run_id, child.parent_step_slug, child.parent_task_index) == (
        parent.run_id,
        "ship",
        0,
    )
    assert (child.priority, parent.parent_run_id, parent.forked_from_run_id) == (4, None, None)
    [task] = engine.poll("shipping")
    engine.complete(task, {"box": 1})
    assert client.get_run(parent.run_id).status == "completed"
    fork = client.fork_run(parent.run_id, "ship")
    assert (fork.forked_from_run_id, fork.forked_from_step, fork.priority) == (
        parent.run_id,
        "ship",
        4,
    )
