from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def age_run(engine: Engine, run_id: uuid.UUID, days: int) -> None:
    engine.conn.execute(
        "update pgflow.runs set started_at = started_at - make_interval(days => %s),"
        " completed_at = completed_at - make_interval(days => %s),"
        " failed_at = failed_at - make_interval(days => %s) where run_id = %s",
        (days, days, days, run_id),
    )


def test_deletes_finished_runs_older_than_the_retention(engine: Engine) -> None:
    engine.flow("old", {"slug": "a"})
    done = engine.run_to_end("old", {"a": 1})["run_id"]
    age_run(engine, done, 10)
    result = engine.value("select pgflow.prune_data_older_than(interval '7 days')")
    assert result["runs"] == 1
    for table in ("runs", "step_states", "step_tasks"):
        assert engine.value(f"select count(*) from pgflow.{table}") == 0


def test_keeps_recent_runs(engine: Engine) -> None:
    engine.flow("old", {"slug": "a"})
    engine.run_to_end("old", {"a": 1})
    assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["runs"] == 0
    assert engine.value("select count(*) from pgflow.runs") == 1


def test_never_deletes_a_running_run_however_old(engine: Engine) -> None:
    engine.flow("old", {"slug": "a"})
    run_id = engine.start("old")
    age_run(engine, run_id, 100)
    engine.value("select pgflow.prune_data_older_than(interval '1 day')")
    assert engine.run(run_id)["status"] == "started"
    assert len(engine.queued_messages("old")) == 1


def test_deletes_old_failed_runs(engine: Engine) -> None:
    engine.flow("old", {"slug": "a", "max_attempts": 1})
    run_id = engine.start("old")
    [task] = engine.poll("old")
    engine.fail(task)
    age_run(engine, run_id, 10)
    assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["runs"] == 1


def failed_run(engine: Engine) -> None:
    """A run of flow `old` whose task failed for good: its message is archived (a completed
    task's is deleted, engine 0025)."""
    engine.start("old")
    [task] = engine.poll("old")
    engine.fail(task)


def test_deletes_only_old_archived_messages(engine: Engine) -> None:
    engine.flow("old", {"slug": "a", "max_attempts": 1})
    failed_run(engine)
    failed_run(engine)
    engine.conn.execute(
        "update pgmq.a_old set archived_at = now() - interval '10 days'"
        " where msg_id = (select min(msg_id) from pgmq.a_old)"
    )
    result = engine.value("select pgflow.prune_data_older_than(interval '7 days')")
    assert result["archived_messages"] == 1
    assert engine.value("select count(*) from pgmq.a_old") == 1


def test_deletes_workers_silent_for_longer_than_the_retention(engine: Engine) -> None:
    engine.flow("old", {"slug": "a"})
    engine.register("old")
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '9 days'")
    assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["workers"] == 1


def test_rejects_a_negative_retention(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="non-negative"):
        engine.value("select pgflow.prune_data_older_than(interval '-1 day')")


def test_a_run_held_by_a_callback_is_pruned_next_time(engine: Engine, db_url: str) -> None:
    engine.flow("old", {"slug": "a"})
    run = engine.run_to_end("old", {"a": 1})
    age_run(engine, run["run_id"], 10)
    with psycopg.connect(db_url) as callback:
        callback.execute("select 1 from pgflow.runs where run_id = %s for update", (run["run_id"],))
        engine.conn.execute("set lock_timeout = '2s'")
        assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["runs"] == 0
        callback.rollback()
    assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["runs"] == 1


def test_deletes_the_queued_messages_of_the_tasks_it_deletes(engine: Engine) -> None:
    # A run failed by hand (an operator's update) keeps its queued task and its message.
    engine.flow("old", {"slug": "a"})
    kept = engine.start("old")
    failed = engine.start("old")
    engine.conn.execute(
        "update pgflow.runs set status = 'failed', failed_at = now() - interval '10 days'"
        " where run_id = %s",
        (failed,),
    )
    assert len(engine.queued_messages("old")) == 2
    assert engine.value("select pgflow.prune_data_older_than(interval '7 days')")["runs"] == 1
    [left] = engine.queued_messages("old")
    assert left["message"]["run_id"] == str(kept)


def test_without_a_batch_size_prunes_everything_in_one_call_and_says_it_is_done(
    engine: Engine,
) -> None:
    engine.flow("old", {"slug": "a"})
    for i in range(3):
        age_run(engine, engine.run_to_end("old", {"a": i})["run_id"], 10)
    result = engine.value("select pgflow.prune_data_older_than(interval '7 days')")
    assert (result["runs"], result["done"]) == (3, True)


def test_a_batch_deletes_at_most_batch_size_runs_and_says_when_more_may_be_left(
    engine: Engine,
) -> None:
    engine.flow("old", {"slug": "a"})
    for i in range(5):
        age_run(engine, engine.run_to_end("old", {"a": i})["run_id"], 10)
    kept = engine.run_to_end("old", {"a": 9})["run_id"]
    calls: list[dict[str, Any]] = []
    while not calls or not calls[-1]["done"]:
        calls.append(engine.value("select pgflow.prune_data_older_than(interval '7 days', 2)"))
    assert [c["runs"] for c in calls] == [2, 2, 1]
    assert [c["done"] for c in calls] == [False, False, True]
    assert engine.value("select array_agg(run_id) from pgflow.runs") == [kept]
    assert engine.value("select count(*) from pgflow.step_tasks") == 1


def test_a_batch_deletes_at_most_batch_size_archived_messages_per_queue(engine: Engine) -> None:
    engine.flow("old", {"slug": "a", "max_attempts": 1})
    for _ in range(3):
        failed_run(engine)
    engine.conn.execute("update pgmq.a_old set archived_at = now() - interval '10 days'")
    first = engine.value("select pgflow.prune_data_older_than(interval '7 days', 2)")
    assert (first["archived_messages"], first["done"]) == (2, False)
    second = engine.value("select pgflow.prune_data_older_than(interval '7 days', 2)")
    assert (second["archived_messages"], second["done"]) == (1, True)
    assert engine.value("select count(*) from pgmq.a_old") == 0


def test_rejects_a_batch_size_below_one(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch size must be at least 1"):
        engine.value("select pgflow.prune_data_older_than(interval '7 days', 0)")
