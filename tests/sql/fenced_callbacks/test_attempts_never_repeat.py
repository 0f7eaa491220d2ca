"""Attempt numbers of a task never repeat (engine 0020): a retry, a requeue and a cancel followed
by a retry all continue the numbering, so every fenced callback of an attempt from before refuses
to touch the attempt that is current now. Before 0020, retry_run handed out attempt 1 again and a
late callback of the first run's attempt 1 failed or completed the retry's attempt 1.

Each scenario ends with a stale attempt (the first worker's, still in hand) and the current one
(the second worker's claim after the retry or requeue), then each callback sends the stale one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task
from tests.engine import WORKER_ID, Engine

Scenario = Callable[[Engine], tuple[Task, Task]]


def _failed_map(engine: Engine) -> tuple[list[Task], list[Task]]:
    """The issue's reproduction: a map of 2 elements with max_attempts 1. W1 claims both, fails
    element 0 (the run fails, element 1 is cancelled); retry_run; W2 claims both again."""
    engine.flow(
        "items",
        {"slug": "list"},
        {"slug": "items", "deps_slugs": ["list"], "step_type": "map", "base_delay": 1},
        max_attempts=1,
    )
    run_id = engine.start("items")
    [root] = engine.poll("items")
    engine.complete(root, ["a", "b"], fenced=True)
    first = sorted(engine.poll("items"), key=lambda t: t.task_index)
    engine.fail(first[0], "old", fenced=True)
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "items", 1)["status"] == "cancelled"
    engine.call("retry_run", run_id)
    second = sorted(engine.poll("items"), key=lambda t: t.task_index)
    assert [t.task_index for t in second] == [0, 1]
    return first, second


def retried(engine: Engine) -> tuple[Task, Task]:
    """Element 0: its attempt failed, the run was retried."""
    first, second = _failed_map(engine)
    return first[0], second[0]


def cancelled_then_retried(engine: Engine) -> tuple[Task, Task]:
    """Element 1: the run's failure cancelled its attempt, the run was retried."""
    first, second = _failed_map(engine)
    return first[1], second[1]


def requeued(engine: Engine) -> tuple[Task, Task]:
    """Stall recovery requeued the first attempt, a second claim started the next one."""
    engine.flow("items", {"slug": "items", "timeout": 10})
    run_id = engine.start("items")
    [stale] = engine.poll("items")
    engine.backdate_started(run_id, "items", 41)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    [current] = engine.poll("items")
    return stale, current


SCENARIOS = [retried, cancelled_then_retried, requeued]


def complete_task(engine: Engine, stale: Task) -> None:
    engine.complete(stale, "stale", fenced=True)


def fail_task(engine: Engine, stale: Task) -> None:
    engine.fail(stale, "stale", fenced=True)


def complete_tasks(engine: Engine, stale: Task) -> None:
    engine.complete_batch([stale], ["stale"], fenced=True)


def complete_and_claim(engine: Engine, stale: Task) -> None:
    notices: list[str] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_detail or "")

    engine.conn.add_notice_handler(heard)
    try:
        claimed = engine.conn.execute(
            "select * from pgflow.complete_and_claim(%s, %s, %s, 10, 30, null, %s, %s, %s,"
            " %s::jsonb[], %s::int[])",
            (
                stale.flow_slug,
                "items",
                WORKER_ID,
                [stale.run_id],
                [stale.step_slug],
                [stale.task_index],
                [Jsonb("stale")],
                [stale.attempt],
            ),
        ).fetchall()
    finally:
        engine.conn.remove_notice_handler(heard)
    assert claimed == []
    assert any("ignored_results" in detail for detail in notices), notices


def renew_task_leases(engine: Engine, stale: Task) -> None:
    # The same worker id claimed both attempts here: only the attempt tells them apart.
    renewed = engine.value(
        "select pgflow.renew_task_leases(%s, %s, %s, %s, %s)",
        WORKER_ID,
        [stale.run_id],
        [stale.step_slug],
        [stale.task_index],
        [stale.attempt],
    )
    assert renewed == 0


CALLBACKS = [complete_task, fail_task, complete_tasks, complete_and_claim, renew_task_leases]


@pytest.mark.parametrize("callback", CALLBACKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_a_callback_of_an_attempt_from_before_changes_nothing(
    engine: Engine,
    scenario: Scenario,
    callback: Callable[[Engine, Task], None],
) -> None:
    stale, current = scenario(engine)
    assert current.attempt > stale.attempt
    before = engine.task(current.run_id, current.step_slug, current.task_index)

    callback(engine, stale)

    after = engine.task(current.run_id, current.step_slug, current.task_index)
    assert after == before
    assert (after["status"], after["attempts_count"]) == ("started", current.attempt)
    assert engine.run(current.run_id)["status"] == "started"
    # The current attempt still decides the task.
    assert engine.complete(current, "fresh", fenced=True)["output"] == "fresh"


def test_a_retry_keeps_the_budget_of_max_attempts(engine: Engine) -> None:
    engine.flow("items", {"slug": "items", "base_delay": 0}, max_attempts=2)
    run_id = engine.start("items")
    for attempt in (1, 2):
        [task] = engine.poll("items")
        assert task.attempt == attempt
        engine.fail(task, fenced=True)
    assert engine.run(run_id)["status"] == "failed"

    engine.call("retry_run", run_id)

    [task] = engine.poll("items")
    assert engine.fail(task, fenced=True)["status"] == "queued"  # attempt 1 of 2 in this budget
    [task] = engine.poll("items")
    assert task.attempt == 4
    assert engine.fail(task, fenced=True)["status"] == "failed"  # attempt 2 of 2: exhausted
    assert engine.run(run_id)["status"] == "failed"


def test_the_retry_delay_counts_from_the_retry(engine: Engine) -> None:
    engine.flow("items", {"slug": "items", "base_delay": 10}, max_attempts=2)
    run_id = engine.start("items")
    for _ in range(2):
        [task] = engine.poll("items")
        engine.fail(task, fenced=True)
        engine.conn.execute("update pgmq.q_items set vt = clock_timestamp()")
    engine.call("retry_run", run_id)
    [task] = engine.poll("items")
    row: dict[str, Any] = engine.fail(task, fenced=True)
    delay = engine.value(
        "select extract(epoch from vt - clock_timestamp()) from pgmq.q_items where msg_id = %s",
        row["message_id"],
    )
    assert 15 <= delay <= 20  # 10 * 2^1 (the budget's first attempt), not 10 * 2^3
