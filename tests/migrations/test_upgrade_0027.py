"""Upgrading 0026 to 0027 (complete_tasks parks a keyed child's tasks set-based, where 0026 sent
every task of such a batch through complete_task): work claimed on 0026 finishes, and the same
keyed work before and after the upgrade admits and parks the same tasks in the same order,
leaves the same rows and announces the same events."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.upgrades import announced, claimed_work_finishes, engine_at, upgrade_to

#: Columns that differ between two runs of the same work (ids, times, message ids).
VOLATILE = {"run_id", "started_at", "created_at", "queued_at", "message_id", "completed_at",
            "last_worker_id", "claimed_at"}  # fmt: skip
#: Tenants of the runs, in start order: three runs of "a" compete for its two places.
TENANTS = ("a", "a", "a", "b", "a")
#: Events per run: run:started, started and completed for each of the 3 steps, run:completed.
EVENTS_PER_RUN = 8


@pytest.fixture
def version_26(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0026") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0027")


def test_work_claimed_on_0026_finishes(version_26: Engine) -> None:
    claimed_work_finishes(version_26, upgrade)


def define(engine: Engine) -> None:
    """Flow "keyed": a plain root, a child keyed by tenant (2 at once), a plain grandchild."""
    engine.compile(
        "keyed",
        [
            {"slug": "first"},
            {"slug": "call", "deps": ["first"],
             "options": {"concurrencyKey": "$.tenant", "concurrencyLimit": 2}},
            {"slug": "after", "deps": ["call"]},
        ],
        mode="flow",
        options={},
    )  # fmt: skip


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def work(engine: Engine, listener: psycopg.Connection[Any]) -> list[Any]:
    """Runs whose root tasks complete in one batch, in reverse order; then every task to the end.
    What the batch admitted and parked (by run number), and each run's rows and events."""
    runs: list[uuid.UUID] = []
    for n, tenant in enumerate(TENANTS):
        run_id = uuid.uuid4()
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        engine.call("start_flow", "keyed", Jsonb({"tenant": tenant, "n": n}), run_id=run_id)
        runs.append(run_id)
    number = {run_id: n for n, run_id in enumerate(runs)}
    firsts = engine.poll("keyed")
    assert [t.step_slug for t in firsts] == ["first"] * len(TENANTS)
    engine.complete_batch(firsts[::-1], list(range(len(firsts))))
    admitted = [
        number[row["run_id"]]
        for row in engine.all(
            "select (q.message ->> 'run_id')::uuid as run_id from pgmq.q_keyed as q"
            " where q.message ->> 'step_slug' = 'call' order by q.msg_id"
        )
    ]
    parked = [
        (row["concurrency_key"], number[row["run_id"]])
        for row in engine.all(
            "select concurrency_key, run_id from pgflow.parked_tasks order by parked_seq"
        )
    ]
    keys = engine.all(
        "select concurrency_key, admitted from pgflow.concurrency_keys order by concurrency_key"
    )
    while tasks := engine.poll("keyed"):
        engine.complete_batch(tasks, [{"done": t.step_slug} for t in tasks])
    events = announced(listener, EVENTS_PER_RUN * len(runs))
    rows = [
        (
            stable(engine.run(run_id)),
            [stable(s) for s in engine.all(
                "select * from pgflow.step_states where run_id = %s order by step_slug", run_id)],
            [stable(t) for t in engine.all(
                "select * from pgflow.step_tasks where run_id = %s order by step_slug, task_index",
                run_id)],
            events.get(run_id),
        )
        for run_id in runs
    ]  # fmt: skip
    return [admitted, parked, keys, rows]


def test_the_same_keyed_work_admits_parks_and_leaves_the_same(
    version_26: Engine, empty_db_url: str
) -> None:
    engine = version_26
    define(engine)
    with psycopg.connect(empty_db_url, autocommit=True) as listener:
        before = work(engine, listener)
        upgrade(engine)
        after = work(engine, listener)

    assert after == before
    admitted, parked, keys, rows = after
    # Parked in the order of the batch's completions (reversed): run 4 of "a" came first.
    assert admitted == [4, 2, 3]
    assert parked == [("a", 1), ("a", 0)]
    assert keys == [
        {"concurrency_key": "a", "admitted": 2},
        {"concurrency_key": "b", "admitted": 1},
    ]
    assert [run[0]["status"] for run in rows] == ["completed"] * len(TENANTS)
    assert all(len(run[3] or []) == EVENTS_PER_RUN for run in rows)
    assert engine.value("select count(*) from pgflow.concurrency_keys") == 0
