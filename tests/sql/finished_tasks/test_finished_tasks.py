"""finished_tasks counts the tasks that left each queue per minute: completed ones from the tasks
table (their messages are deleted since engine 0025), the others from the queues' archives, each
task once."""

from __future__ import annotations

from typing import Any

from tests.engine import Engine


def finished(engine: Engine, since: str = "1 hour", by_step: bool = True) -> dict[Any, int]:
    """Tasks per queue and step, summed over the minutes; one row per queue, step and minute."""
    rows = engine.all(
        "select queue_name, step_slug, minute, tasks from pgflow.finished_tasks(%s::interval, %s)",
        since,
        by_step,
    )
    minutes = [(r["queue_name"], r["step_slug"], r["minute"]) for r in rows]
    assert len(set(minutes)) == len(minutes), f"a queue, step and minute twice: {minutes}"
    counts: dict[Any, int] = {}
    for row in rows:
        key = (row["queue_name"], row["step_slug"])
        counts[key] = counts.get(key, 0) + row["tasks"]
    return counts


def test_completed_and_failed_tasks_are_counted_per_step(engine: Engine) -> None:
    engine.flow("mixed", {"slug": "fetch"}, {"slug": "check", "max_attempts": 1})
    for _ in range(3):
        engine.start("mixed")
    tasks = engine.poll("mixed")
    for task in tasks:
        if task.step_slug == "check" and task.run_id == tasks[-1].run_id:
            engine.fail(task)
        else:
            engine.complete(task, 1)

    assert engine.archived_ids("mixed") != set()  # the failure's message and the run's others
    assert finished(engine) == {("mixed", "fetch"): 3, ("mixed", "check"): 3}
    assert finished(engine, by_step=False) == {("mixed", None): 6}


def test_a_message_archived_for_a_completed_task_counts_once(engine: Engine) -> None:
    # As engine 0024 left a completion: the message in the archive, the task completed.
    engine.flow("once", {"slug": "only"})
    engine.start("once")
    [task] = engine.poll("once")
    engine.complete(task, 1)
    engine.conn.execute(
        "insert into pgmq.a_once (msg_id, vt, message, archived_at)"
        " values (%s, now(), '{}'::jsonb, now())",
        (task.msg_id,),
    )
    assert finished(engine) == {("once", "only"): 1}


def test_only_tasks_finished_within_the_interval_count(engine: Engine) -> None:
    engine.flow("late", {"slug": "only"})
    for _ in range(2):
        engine.start("late")
    first, second = engine.poll("late")
    engine.complete(first, 1)
    engine.complete(second, 1)
    engine.conn.execute(
        "update pgflow.step_tasks set completed_at = now() - interval '2 hours' where run_id = %s",
        (first.run_id,),
    )
    assert finished(engine) == {("late", "only"): 1}
    assert finished(engine, since="3 hours") == {("late", "only"): 2}
