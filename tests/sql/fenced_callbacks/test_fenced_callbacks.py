"""Callbacks fenced by attempt (engine 0005): claim_tasks returns the attempt its claim started,
and a callback that passes an attempt which is no longer the task's current one changes nothing.
The lost-reply story: a worker's callback reaches the engine, the reply is lost, the task is
claimed again (a retry, or stall recovery), then the worker resends: the new attempt is untouched.
"""

from __future__ import annotations

from typing import Any

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task
from tests.engine import START_TASKS_COLUMNS, WORKER_ID, Engine


def unchanged(engine: Engine, task: Task) -> dict[str, Any]:
    return engine.task(task.run_id, task.step_slug, task.task_index)


def test_claim_tasks_returns_the_attempt_and_the_effective_timeout(engine: Engine) -> None:
    engine.flow("fenced", {"slug": "own", "timeout": 7}, {"slug": "inherited"}, timeout=40)
    engine.start("fenced")
    tasks = sorted(engine.poll("fenced"), key=lambda t: t.step_slug)
    assert [(t.step_slug, t.attempt, t.timeout) for t in tasks] == [
        ("inherited", 1, 40),
        ("own", 1, 7),
    ]


def test_a_resent_failure_cannot_fail_the_retry_another_worker_claimed(engine: Engine) -> None:
    engine.flow("fenced", {"slug": "flaky", "base_delay": 0}, max_attempts=3)
    run_id = engine.start("fenced")
    [first] = engine.poll("fenced")
    assert engine.fail(first, "timeout talking to the API", fenced=True)["status"] == "queued"
    # The reply was lost; meanwhile another worker claims the retry.
    [second] = engine.poll("fenced")
    assert (second.attempt, second.msg_id) == (2, first.msg_id)

    row = engine.fail(first, "timeout talking to the API", fenced=True)  # the resend

    assert (row["status"], row["attempts_count"]) == ("started", 2)  # stale: says attempt 2
    assert unchanged(engine, first) == row
    assert engine.complete(second, "done", fenced=True)["status"] == "completed"
    assert engine.run(run_id)["output"] == {"flaky": "done"}


def test_a_late_result_cannot_complete_the_attempt_stall_recovery_restarted(
    engine: Engine,
) -> None:
    engine.flow("fenced", {"slug": "slow", "timeout": 3}, max_attempts=3)
    run_id = engine.start("fenced")
    [first] = engine.poll("fenced")
    engine.backdate_started(run_id, "slow", 60)  # its worker looks gone
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    engine.make_visible("fenced")
    [second] = engine.poll("fenced")
    before = unchanged(engine, second)

    row = engine.complete(first, "result of attempt 1", fenced=True)

    assert (row["status"], row["attempts_count"]) == ("started", 2)
    assert unchanged(engine, second) == before
    engine.complete(second, "result of attempt 2", fenced=True)
    assert engine.run(run_id)["output"] == {"slow": "result of attempt 2"}


def test_a_batch_completes_the_current_attempts_and_ignores_the_stale_one(
    engine: Engine,
) -> None:
    engine.flow("fenced", {"slug": "work", "base_delay": 0}, max_attempts=3)
    runs = [engine.start("fenced", {"n": n}) for n in range(3)]
    claimed = {t.run_id: t for t in engine.poll("fenced")}
    stale = claimed[runs[1]]
    engine.fail(stale, "first try failed", fenced=True)
    [retry] = engine.poll("fenced")
    assert retry.attempt == 2

    rows = engine.complete_batch(
        [claimed[runs[0]], stale, claimed[runs[2]]], ["a", "stale", "c"], fenced=True
    )

    assert [(r["status"], r["attempts_count"]) for r in rows] == [
        ("completed", 1),
        ("started", 2),
        ("completed", 1),
    ]
    assert unchanged(engine, retry)["output"] is None
    assert [engine.run(r)["status"] for r in runs] == ["completed", "started", "completed"]


def test_a_stale_result_in_a_batch_of_one_or_a_repeated_batch_changes_nothing(
    engine: Engine,
) -> None:
    engine.flow("fenced", {"slug": "work", "base_delay": 0}, max_attempts=3)
    run_id = engine.start("fenced")
    [first] = engine.poll("fenced")
    engine.fail(first, "first try failed", fenced=True)
    [retry] = engine.poll("fenced")
    assert [r["status"] for r in engine.complete_batch([first], ["x"], fenced=True)] == ["started"]
    rows = engine.complete_batch([first, first], ["x", "y"], fenced=True)  # the general path
    assert [r["status"] for r in rows] == ["started", "started"]
    assert engine.run(run_id)["status"] == "started"
    assert engine.complete(retry, "ok", fenced=True)["status"] == "completed"


def test_callbacks_without_an_attempt_answer_the_current_one_as_before_0005(
    engine: Engine,
) -> None:
    # What a worker from before 0005 does during a rolling upgrade: it claims with start_tasks
    # and reports without an attempt. It keeps working, unfenced: a resent failure does fail
    # the retry another worker claimed. Upgrade workers to close that window.
    engine.flow("fenced", {"slug": "flaky", "base_delay": 0}, max_attempts=3)
    engine.start("fenced")
    engine.register("fenced")
    ids = [r[0] for r in engine.conn.execute("select msg_id from pgmq.read('fenced', 30, 5)")]
    cursor = engine.conn.execute(
        "select * from pgflow.start_tasks('fenced', %s, %s, 'fenced')",
        (ids, WORKER_ID),
    )
    assert tuple(c.name for c in cursor.description or []) == START_TASKS_COLUMNS
    [old] = [
        Task(**dict(zip(START_TASKS_COLUMNS, row, strict=True)), attempt=1, timeout=60)
        for row in cursor.fetchall()
    ]
    assert engine.fail(old, "lost reply")["status"] == "queued"
    [retry] = engine.poll("fenced")

    row = engine.fail(old, "lost reply")  # the resend, without an attempt

    assert (row["status"], row["attempts_count"]) == ("queued", 2)  # it failed attempt 2
    assert engine.complete(retry, "late", fenced=True)["status"] == "queued"
