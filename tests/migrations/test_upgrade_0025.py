"""Upgrading 0024 to 0025 (rows written once: a plain root step is written started, a plain
child starts in the statement that counts it down, a run completes in the statement that counts
its last step off; a completed task's message is deleted): work claimed on 0024 finishes, the
same work done before and after the upgrade leaves the same rows and announces the same events,
in the same order, with fewer row versions written, and the tasks finished on either side of the
upgrade are counted once each."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.engine import Engine
from tests.upgrades import announced, claimed_work_finishes, engine_at, upgrade_to

#: Columns that differ between two runs of the same work (ids, times, message ids).
VOLATILE = {"run_id", "started_at", "completed_at", "created_at", "queued_at", "message_id",
            "last_worker_id", "lease_renewed_at", "claimed_timeout", "skipped_at"}  # fmt: skip


#: The events of the four runs `work` makes: run:started, each step's start and end (or skip),
#: run:completed.
EVENTS = [4, 10, 8, 7]


@pytest.fixture
def version_24(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0024") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0025")


def test_work_claimed_on_0024_finishes(version_24: Engine) -> None:
    claimed_work_finishes(version_24, upgrade)


def define(engine: Engine) -> None:
    engine.flow("single", {"slug": "only"})
    engine.flow(
        "diamond",
        {"slug": "a"},
        {"slug": "b", "deps_slugs": ["a"]},
        {"slug": "c", "deps_slugs": ["a"]},
        {"slug": "d", "deps_slugs": ["b", "c"]},
    )
    engine.flow(
        "gated",
        {"slug": "a"},
        {"slug": "b", "deps_slugs": ["a"], "required_input_pattern": {"a": {"go": True}}},
        {"slug": "c", "deps_slugs": ["a"]},
    )


def work(engine: Engine, listener: psycopg.Connection[Any], batch: bool) -> list[Any]:
    """Every flow's runs to the end, one result at a time or all visible results at once;
    what the runs, their steps and tasks hold afterwards, and each run's events."""
    runs = []
    for flow, input in (("single", {}), ("diamond", {}), ("gated", {"go": True}), ("gated", {})):
        run_id = uuid.uuid4()
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        engine.call("start_flow", flow, input, run_id=run_id)
        runs.append(run_id)
    while tasks := engine.poll("single") + engine.poll("diamond") + engine.poll("gated"):
        outputs = [{"go": task.run_id in runs[2:3], "step": task.step_slug} for task in tasks]
        if batch:
            engine.complete_batch(tasks, outputs, fenced=True)
        else:
            for task, output in zip(tasks, outputs, strict=True):
                engine.complete(task, output, fenced=True)
    events = announced(listener, sum(EVENTS))
    return [
        (
            stable(engine.run(run_id)),
            [stable(s) for s in engine.all(
                "select * from pgflow.step_states where run_id = %s order by step_slug", run_id)],
            [stable(t) for t in engine.all(
                "select * from pgflow.step_tasks where run_id = %s order by step_slug", run_id)],
            events.get(run_id, []),
        )
        for run_id in runs
    ]  # fmt: skip


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


def row_versions(engine: Engine) -> int:
    """Updates the engine's run, step and task tables have seen (flushed to the statistics)."""
    engine.conn.execute("select pg_stat_force_next_flush()")
    engine.conn.execute("select 1")
    engine.conn.execute("select pg_stat_clear_snapshot()")
    return int(
        engine.value(
            "select sum(n_tup_upd) from pg_stat_user_tables where schemaname = 'pgflow'"
            " and relname in ('runs', 'step_states', 'step_tasks')"
        )
    )


@pytest.mark.parametrize("batch", [False, True], ids=["one_by_one", "batched"])
def test_the_same_work_leaves_the_same_rows_and_events(
    version_24: Engine, empty_db_url: str, batch: bool
) -> None:
    engine = version_24
    define(engine)
    with psycopg.connect(empty_db_url, autocommit=True) as listener:
        updates = row_versions(engine)
        before = work(engine, listener, batch)
        updates_before = row_versions(engine) - updates
        upgrade(engine)
        updates = row_versions(engine)
        after = work(engine, listener, batch)
        updates_after = row_versions(engine) - updates

    assert after == before
    assert [run[0]["status"] for run in after] == ["completed"] * 4
    assert [len(run[3]) for run in before] == EVENTS
    assert updates_after < updates_before


def test_tasks_finished_on_either_side_of_the_upgrade_count_once(version_24: Engine) -> None:
    engine = version_24
    engine.flow("count", {"slug": "only"})
    engine.start("count")
    [before] = engine.poll("count")
    engine.complete(before, 1, fenced=True)
    assert engine.archived_ids("count") == {before.msg_id}

    upgrade(engine)
    engine.start("count")
    [after] = engine.poll("count")
    engine.complete(after, 1, fenced=True)

    assert engine.archived_ids("count") == {before.msg_id}
    assert engine.queued_messages("count") == []
    assert (
        engine.value(
            "select sum(tasks) from pgflow.finished_tasks(interval '1 hour')"
            " where queue_name = 'count' and step_slug = 'only'"
        )
        == 2
    )
