"""cancel_run: a started run ends as cancelled with its reason; its unfinished steps and tasks
are cancelled and their messages archived; late callbacks, stall recovery and the next poll
change nothing; one event; workers of the running tasks' queues are told. A run that is not
started is refused and left as it was."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def chain(engine: Engine) -> str:
    return engine.flow(
        "chain",
        {"slug": "first"},
        {"slug": "fan", "deps_slugs": ["first"], "step_type": "map"},
        {"slug": "last", "deps_slugs": ["fan"]},
    )


def test_a_started_run_is_cancelled_with_its_reason_and_nothing_of_it_runs_again(
    engine: Engine,
) -> None:
    chain(engine)
    run_id = engine.start("chain", {})
    [first] = engine.poll("chain")
    engine.complete(first, [1, 2, 3])
    started, *_queued = engine.poll("chain", qty=1)  # one element running, two queued

    [cancelled] = engine.call("cancel_run", run_id, "the customer left")

    assert cancelled["status"] == "cancelled"
    assert cancelled["cancel_reason"] == "the customer left"
    assert cancelled["cancelled_at"] is not None
    assert engine.run(run_id)["status"] == "cancelled"
    assert {s["step_slug"]: s["status"] for s in engine.all(
        "select step_slug, status from pgflow.step_states where run_id = %s", run_id
    )} == {"first": "completed", "fan": "cancelled", "last": "cancelled"}  # fmt: skip
    assert [t["status"] for t in engine.tasks(run_id, "fan")] == ["cancelled"] * 3
    assert engine.task(run_id, "first")["status"] == "completed"
    # Every message of the run is archived: nothing is left to read, now or after a lease.
    assert engine.value("select count(*) from pgmq.q_chain") == 0
    assert (
        engine.value("select count(*) from pgmq.a_chain where message->>'step_slug' = 'fan'") == 3
    )

    late = engine.complete(started, {"late": True}, fenced=True)
    assert late["status"] == "cancelled"
    assert late["output"] is None
    assert engine.fail(started, "late failure", fenced=True)["status"] == "cancelled"
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    assert engine.poll("chain") == []
    assert engine.run(run_id)["status"] == "cancelled"
    assert engine.run(run_id)["output"] is None


def test_a_run_without_a_reason_is_cancelled_too(engine: Engine) -> None:
    chain(engine)
    run_id = engine.start("chain", {})
    [row] = engine.call("cancel_run", run_id)
    assert (row["status"], row["cancel_reason"]) == ("cancelled", None)


@pytest.mark.parametrize("finish", ["complete", "fail", "cancel"])
def test_a_finished_run_is_refused_and_left_as_it_was(engine: Engine, finish: str) -> None:
    engine.flow("single", {"slug": "only"}, max_attempts=1)
    run_id = engine.start("single", {})
    [task] = engine.poll("single")
    if finish == "complete":
        engine.complete(task, "done")
    elif finish == "fail":
        engine.fail(task)
    else:
        engine.call("cancel_run", run_id, "first")
    before = engine.run(run_id)

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        engine.call("cancel_run", run_id, "second")

    status = {"complete": "completed", "fail": "failed", "cancel": "cancelled"}[finish]
    assert refused.value.diag.message_primary == (
        f"Run {run_id} is {status} already; only a started run can be cancelled."
    )
    assert refused.value.diag.message_hint == "Nothing was changed."
    assert engine.run(run_id) == before


def test_an_unknown_run_is_no_data_found(engine: Engine) -> None:
    missing = uuid.uuid4()
    with pytest.raises(psycopg.errors.NoDataFound, match=f"Run {missing} does not exist."):
        engine.call("cancel_run", missing, "why")


def test_one_event_announces_it_and_the_running_tasks_queues_are_told(
    engine: Engine, db_url: str
) -> None:
    engine.compile("control", [{"slug": "busy"}, {"slug": "idle", "deps": ["busy"]}])
    run_id = engine.start("control", {})
    [busy] = engine.poll("control", queue="control__busy", step="busy")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        listener.execute('listen "pgmq.q_control__busy.INSERT"')
        listener.execute('listen "pgmq.q_control__idle.INSERT"')
        engine.call("cancel_run", run_id, "stop")
        heard: list[tuple[str, Any]] = [
            (n.channel, json.loads(n.payload)) for n in listener.notifies(timeout=10, stop_after=2)
        ]
        assert list(listener.notifies(timeout=0.2)) == []  # nothing for the idle step's queue
    assert heard == [
        (
            f"pgflow_run_{run_id.hex}",
            {"event": "run:cancelled", "run_id": str(run_id), "step_slug": None,
             "status": "cancelled"},
        ),
        ("pgmq.q_control__busy.INSERT", {"event": "run:cancelled", "run_id": str(run_id)}),
    ]  # fmt: skip
    assert engine.task(run_id, "busy")["status"] == "cancelled"
    assert busy.attempt == 1


def test_pruning_deletes_cancelled_runs_past_the_retention(engine: Engine) -> None:
    chain(engine)
    run_id = engine.start("chain", {})
    engine.call("cancel_run", run_id, "old")
    engine.conn.execute(
        "update pgflow.runs set cancelled_at = now() - interval '2 days' where run_id = %s",
        (run_id,),
    )
    result = engine.value("select pgflow.prune_data_older_than(interval '1 day')")
    assert result["runs"] == 1
    assert engine.value("select count(*) from pgflow.runs where run_id = %s", run_id) == 0
