from __future__ import annotations

import uuid

import pytest

from tests.engine import WORKER_ID, Engine


def stalled_flow(engine: Engine) -> None:
    engine.flow("stall", {"slug": "slow", "timeout": 10}, {"slug": "fast"}, timeout=60)


def test_requeues_a_task_started_longer_than_its_timeout_plus_30_seconds(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")
    engine.backdate_started(run_id, "slow", 41)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    task = engine.task(run_id, "slow")
    assert (task["status"], task["requeued_count"], task["attempts_count"]) == ("queued", 1, 1)
    assert (task["started_at"], task["last_worker_id"]) == (None, None)
    assert task["last_requeued_at"] is not None


def test_makes_the_requeued_message_visible_at_once(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")
    engine.backdate_started(run_id, "slow", 41)
    engine.value("select pgflow.requeue_stalled_tasks()")
    [again] = engine.poll("stall")
    assert again.step_slug == "slow"
    assert engine.task(run_id, "slow")["attempts_count"] == 2


def test_uses_the_effective_step_timeout(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")
    engine.backdate_started(run_id, "slow", 41)
    engine.backdate_started(run_id, "fast", 80)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    assert engine.task(run_id, "slow")["status"] == "queued"
    assert engine.task(run_id, "fast")["status"] == "started"
    engine.backdate_started(run_id, "fast", 95)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1


def stall(engine: Engine, run_id: uuid.UUID, times: int, flow: str = "stall") -> int:
    """Claim the task and let its lease run out `times` times, sweeping after each; the
    tasks requeued or failed by the sweeps."""
    swept = 0
    for _ in range(times):
        engine.poll(flow)
        engine.backdate_started(run_id, "slow", 41)
        swept += engine.value("select pgflow.requeue_stalled_tasks()")
    return swept


def test_the_fourth_stall_fails_the_attempt_and_the_step_policy_ends_the_run(
    engine: Engine,
) -> None:
    engine.flow("stall", {"slug": "slow", "timeout": 10, "max_attempts": 3})
    run_id = engine.start("stall")
    assert stall(engine, run_id, 3) == 3
    assert engine.task(run_id, "slow")["status"] == "queued"
    assert stall(engine, run_id, 1) == 1  # attempt 4 of a budget of 3: exhausted
    task = engine.task(run_id, "slow")
    assert (task["status"], task["requeued_count"], task["attempts_count"]) == ("failed", 3, 4)
    assert task["error_message"] == "Stalled 4 times: no live worker kept it"
    assert task["permanently_stalled_at"] is None
    assert task["message_id"] in engine.archived_ids("stall")
    run = engine.run(run_id)
    assert run["status"] == "failed"
    assert engine.state(run_id, "slow")["error_message"] == task["error_message"]

    engine.call("retry_run", run_id)  # a failed run: it can be resumed

    [again] = engine.poll("stall")
    assert again.attempt == 5
    engine.complete(again, "done", fenced=True)
    assert engine.run(run_id)["status"] == "completed"


def test_a_stalled_attempt_with_attempts_left_is_retried_after_its_delay(engine: Engine) -> None:
    engine.flow("stall", {"slug": "slow", "timeout": 10, "max_attempts": 9, "base_delay": 7})
    run_id = engine.start("stall")
    assert stall(engine, run_id, 4) == 4
    task = engine.task(run_id, "slow")
    assert (task["status"], task["attempts_count"]) == ("queued", 4)
    assert task["error_message"] == "Stalled 4 times: no live worker kept it"
    assert engine.run(run_id)["status"] == "started"
    assert engine.poll("stall") == []  # hidden for 7 * 2^4 s, like any failed attempt
    delay = engine.value(
        "select extract(epoch from vt - clock_timestamp())::int from pgmq.q_stall"
        " where msg_id = %s",
        task["message_id"],
    )
    assert 7 * 2**4 - 5 <= delay <= 7 * 2**4
    # Each further stall fails an attempt too, until the budget is spent.
    for attempt in range(5, 10):
        engine.conn.execute(
            "update pgmq.q_stall set vt = clock_timestamp() where msg_id = %s",
            (task["message_id"],),
        )
        assert stall(engine, run_id, 1) == 1
        assert engine.task(run_id, "slow")["attempts_count"] == attempt
    assert engine.task(run_id, "slow")["status"] == "failed"
    assert engine.run(run_id)["status"] == "failed"


@pytest.mark.parametrize(
    ("policy", "step_status"), [("skip", "skipped"), ("skip-cascade", "skipped")]
)
def test_a_stalled_task_out_of_attempts_follows_when_exhausted(
    engine: Engine, policy: str, step_status: str
) -> None:
    engine.flow(
        "stall",
        {"slug": "slow", "timeout": 10, "max_attempts": 1, "when_exhausted": policy},
        {"slug": "after", "deps_slugs": ["slow"]},
    )
    run_id = engine.start("stall")
    assert stall(engine, run_id, 4) == 4
    assert engine.state(run_id, "slow")["status"] == step_status
    assert engine.run(run_id)["status"] in {"started", "completed"}


def test_a_late_result_after_the_engine_gave_up_is_stale(engine: Engine) -> None:
    engine.flow("stall", {"slug": "slow", "timeout": 10, "max_attempts": 9})
    run_id = engine.start("stall")
    tasks = []
    for _ in range(4):
        tasks += engine.poll("stall")
        engine.backdate_started(run_id, "slow", 41)
        engine.value("select pgflow.requeue_stalled_tasks()")
    row = engine.fail(tasks[-1], "gave up late", fenced=True)
    assert (row["status"], row["error_message"]) == (
        "queued",
        "Stalled 4 times: no live worker kept it",
    )
    row = engine.complete(tasks[-1], "late", fenced=True)
    assert (row["status"], row["output"]) == ("queued", None)
    assert engine.run(run_id)["status"] == "started"


def test_leaves_tasks_of_failed_runs_alone(engine: Engine) -> None:
    engine.flow("stall", {"slug": "slow", "timeout": 10}, {"slug": "bad", "max_attempts": 1})
    run_id = engine.start("stall")
    tasks = {t.step_slug: t for t in engine.poll("stall")}
    engine.fail(tasks["bad"])
    engine.backdate_started(run_id, "slow", 100)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0


def test_returns_zero_when_nothing_is_stalled(engine: Engine) -> None:
    stalled_flow(engine)
    engine.start("stall")
    engine.poll("stall")
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0


def test_a_late_completion_of_a_requeued_task_changes_nothing(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    tasks = {t.step_slug: t for t in engine.poll("stall")}
    engine.backdate_started(run_id, "slow", 41)
    engine.value("select pgflow.requeue_stalled_tasks()")
    assert engine.complete(tasks["slow"], "late")["status"] == "queued"


def test_archives_the_messages_an_older_engine_left_for_the_next_claim(engine: Engine) -> None:
    engine.flow("idle", {"slug": "only"})
    engine.start("idle")
    [task] = engine.poll("idle")
    # Until engine 0014 complete_task recorded its message for the next claim to archive.
    engine.value(
        "insert into pgflow.archivable_messages (queue_name, message_id) values ('idle', %s)"
        " returning message_id",
        task.msg_id,
    )
    engine.value("select pgflow.requeue_stalled_tasks()")
    assert engine.archived_ids("idle") == {task.msg_id}
    assert engine.value("select count(*) from pgflow.archivable_messages") == 0


def test_requeues_at_once_the_task_of_a_worker_without_heartbeat_for_30_seconds(
    engine: Engine,
) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")  # claimed by the test's worker, well within the timeout
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    engine.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '31 seconds'"
    )
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 2
    assert engine.task(run_id, "slow")["status"] == "queued"


def test_requeues_at_once_the_task_of_a_worker_marked_stopped(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")
    engine.conn.execute("select pgflow.mark_worker_stopped(worker_id) from pgflow.workers")
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 2
    assert engine.task(run_id, "fast")["status"] == "queued"


def test_never_takes_a_task_a_live_worker_runs_within_its_timeout(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    engine.poll("stall")
    engine.backdate_started(run_id, "slow", 9)  # its timeout is 10 s
    engine.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '29 seconds'"
    )
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    assert {t["status"] for t in engine.all("select status from pgflow.step_tasks")} == {"started"}


def test_a_renewed_lease_keeps_a_task_whose_result_waits(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    tasks = {task.step_slug: task for task in engine.poll("stall")}
    engine.backdate_started(run_id, "slow", 41)  # past its timeout 10 s + 30 s
    slow = tasks["slow"]
    renewed = engine.value(
        "select pgflow.renew_task_leases(%s, %s, %s, %s, %s)",
        WORKER_ID, [run_id], ["slow"], [0], [slow.attempt],
    )  # fmt: skip
    assert renewed == 1
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    engine.conn.execute(
        "update pgflow.step_tasks set lease_renewed_at = now() - interval '41 seconds'"
        " where run_id = %s and step_slug = 'slow'",
        (run_id,),
    )
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1


def test_only_the_current_attempt_of_its_own_worker_is_renewed(engine: Engine) -> None:
    stalled_flow(engine)
    run_id = engine.start("stall")
    slow = next(task for task in engine.poll("stall") if task.step_slug == "slow")
    other = uuid.UUID(int=7)
    renew = "select pgflow.renew_task_leases(%s, %s, %s, %s, %s)"
    assert engine.value(renew, other, [run_id], ["slow"], [0], [slow.attempt]) == 0
    assert engine.value(renew, WORKER_ID, [run_id], ["slow"], [0], [slow.attempt + 1]) == 0
    assert engine.task(run_id, "slow")["lease_renewed_at"] is None
