"""retry_run: a failed run starts again from where it failed. Its failed and unfinished tasks are
queued again with their whole retry budget and new messages (their attempt numbers go on);
completed work keeps its outputs and does not run again; the run is started again with one
event. A run that is not failed, or whose flow has changed since, is refused and left as it was."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def statuses(engine: Engine, run_id: uuid.UUID) -> dict[str, str]:
    rows = engine.all("select step_slug, status from pgflow.step_states where run_id = %s", run_id)
    return {row["step_slug"]: row["status"] for row in rows}


def test_a_failed_run_runs_its_failed_step_again_and_keeps_what_completed(engine: Engine) -> None:
    engine.flow(
        "chain",
        {"slug": "first"},
        {"slug": "second", "deps_slugs": ["first"]},
        {"slug": "third", "deps_slugs": ["second"]},
        max_attempts=1,
    )
    run_id = engine.start("chain")
    [first] = engine.poll("chain")
    engine.complete(first, {"n": 1})
    [second] = engine.poll("chain")
    engine.fail(second, "the API was down")
    assert engine.run(run_id)["status"] == "failed"
    old_message = engine.task(run_id, "second")["message_id"]

    [run] = engine.call("retry_run", run_id)

    assert (run["status"], run["failed_at"], run["retry_count"]) == ("started", None, 1)
    assert run["retried_at"] is not None
    assert statuses(engine, run_id) == {
        "first": "completed",
        "second": "started",
        "third": "created",
    }
    task = engine.task(run_id, "second")
    # The attempt numbers go on (a result of attempt 1 stays stale); the budget starts again.
    assert (task["status"], task["attempts_count"]) == ("queued", 1)
    assert task["attempts_before_retry"] == 1
    assert task["error_message"] == "the API was down"  # the last error stays until the next
    assert task["message_id"] != old_message
    assert engine.state(run_id, "second")["error_message"] is None

    [again] = engine.poll("chain")  # only the failed step: the completed one does not run again
    assert (again.step_slug, again.attempt, again.input) == ("second", 2, {"first": {"n": 1}})
    engine.complete(again, "two")
    [third] = engine.poll("chain")
    engine.complete(third, "three")
    finished = engine.run(run_id)
    assert (finished["status"], finished["output"]) == ("completed", {"third": "three"})
    assert engine.task(run_id, "first")["attempts_count"] == 1


def test_a_retried_task_has_all_its_attempts_again(engine: Engine) -> None:
    engine.flow("flaky", {"slug": "only", "base_delay": 0}, max_attempts=2)
    run_id = engine.start("flaky")
    for _ in range(2):
        [task] = engine.poll("flaky")
        engine.fail(task)
    assert engine.run(run_id)["status"] == "failed"

    engine.call("retry_run", run_id)

    [task] = engine.poll("flaky")
    assert task.attempt == 3  # numbers go on, the budget starts again
    assert engine.fail(task)["status"] == "queued"  # a retry left, as on a first run
    [task] = engine.poll("flaky")
    engine.complete(task, "done")
    assert engine.run(run_id)["status"] == "completed"


def test_in_a_map_only_the_failed_and_unfinished_elements_run_again(engine: Engine) -> None:
    engine.flow(
        "fan",
        {"slug": "items"},
        {"slug": "each", "deps_slugs": ["items"], "step_type": "map"},
        max_attempts=1,
    )
    run_id = engine.start("fan")
    [items] = engine.poll("fan")
    engine.complete(items, ["a", "b", "c", "d"])
    done, failing = engine.poll("fan", qty=2)  # elements 2 and 3 stay queued
    engine.complete(done, "A")
    engine.fail(failing, "no B")
    assert [t["status"] for t in engine.tasks(run_id, "each")] == [
        "completed",
        "failed",
        "cancelled",
        "cancelled",
    ]

    engine.call("retry_run", run_id)

    assert engine.state(run_id, "each")["remaining_tasks"] == 3
    again = engine.poll("fan")
    assert sorted(t.task_index for t in again) == [1, 2, 3]
    for task in again:
        engine.complete(task, task.input.upper())
    finished = engine.run(run_id)
    assert finished["status"] == "completed"
    assert finished["output"] == {"each": ["A", "B", "C", "D"]}
    assert engine.task(run_id, "each", 0)["attempts_count"] == 1


def test_a_step_running_beside_the_failure_runs_again_and_its_old_result_is_ignored(
    engine: Engine,
) -> None:
    engine.flow(
        "pair",
        {"slug": "root"},
        {"slug": "left", "deps_slugs": ["root"]},
        {"slug": "right", "deps_slugs": ["root"]},
        max_attempts=1,
    )
    run_id = engine.start("pair")
    [root] = engine.poll("pair")
    engine.complete(root, 1)
    claimed = {t.step_slug: t for t in engine.poll("pair")}
    engine.fail(claimed["left"], "left broke")
    assert engine.task(run_id, "right")["status"] == "cancelled"

    engine.call("retry_run", run_id)

    # The handler of the cancelled attempt reports late: a stale attempt changes nothing.
    late = engine.complete(claimed["right"], "old", fenced=True)
    assert (late["status"], late["output"]) == ("queued", None)
    again = {t.step_slug: t for t in engine.poll("pair")}
    assert sorted(again) == ["left", "right"]
    for task in again.values():
        engine.complete(task, task.step_slug, fenced=True)
    assert engine.run(run_id)["output"] == {"left": "left", "right": "right"}


def test_a_step_that_failed_its_condition_is_decided_again(engine: Engine) -> None:
    engine.flow(
        "gated",
        {"slug": "check"},
        {
            "slug": "gate",
            "deps_slugs": ["check"],
            "required_input_pattern": {"check": {"ok": True}},
            "when_unmet": "fail",
        },
    )
    run_id = engine.start("gated")
    [check] = engine.poll("gated")
    engine.complete(check, {"ok": False})
    assert engine.state(run_id, "gate")["error_message"] == "Condition not met"

    [run] = engine.call("retry_run", run_id)

    # The same outputs meet the same condition: the run fails again, as it should.
    assert run["status"] == "failed"
    assert run["retry_count"] == 1
    assert engine.state(run_id, "gate")["status"] == "failed"


@pytest.mark.parametrize("finish", ["started", "completed", "cancelled"])
def test_a_run_that_is_not_failed_is_refused_and_left_as_it_was(
    engine: Engine, finish: str
) -> None:
    engine.flow("single", {"slug": "only"})
    run_id = engine.start("single")
    if finish == "completed":
        [task] = engine.poll("single")
        engine.complete(task, "done")
    elif finish == "cancelled":
        engine.call("cancel_run", run_id)
    before = engine.run(run_id)

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        engine.call("retry_run", run_id)

    assert str(refused.value.diag.message_primary) == (
        f"Run {run_id} is {finish}; only a failed run can be retried."
    )
    assert engine.run(run_id) == before


def test_an_unknown_run_is_refused(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        engine.call("retry_run", uuid.uuid4())


def test_a_run_whose_flow_gained_a_step_since_is_refused(engine: Engine) -> None:
    engine.flow("growing", {"slug": "only"}, max_attempts=1)
    run_id = engine.start("growing")
    [task] = engine.poll("growing")
    engine.fail(task)
    engine.call("add_step", "growing", "later")

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        engine.call("retry_run", run_id)

    assert refused.value.diag.message_detail == (
        'Step "later" was added to the flow after the run started.'
    )
    assert engine.run(run_id)["status"] == "failed"
    assert engine.poll("growing") == []


def test_a_retry_is_one_event(engine: Engine, db_url: str) -> None:
    engine.flow("single", {"slug": "only"}, max_attempts=1)
    run_id = engine.start("single")
    [task] = engine.poll("single")
    engine.fail(task)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        engine.call("retry_run", run_id)
        events: list[dict[str, Any]] = [
            json.loads(n.payload) for n in listener.notifies(timeout=10, stop_after=1)
        ]
        assert list(listener.notifies(timeout=0.2)) == []  # and nothing else
    assert [(e["event"], e["status"]) for e in events] == [("run:retried", "started")]


def test_a_retry_in_step_mode_sends_each_task_to_its_step_queue(engine: Engine) -> None:
    engine.compile("stepped", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], mode="step")
    engine.conn.execute("update pgflow.flows set opt_max_attempts = 1 where flow_slug = 'stepped'")
    run_id = engine.start("stepped")
    [a] = engine.poll("stepped", queue="stepped__a", step="a")
    engine.complete(a, 1)
    [b] = engine.poll("stepped", queue="stepped__b", step="b")
    engine.fail(b)

    engine.call("retry_run", run_id)

    assert engine.poll("stepped", queue="stepped__a", step="a") == []
    [again] = engine.poll("stepped", queue="stepped__b", step="b")
    engine.complete(again, 2)
    assert engine.run(run_id)["status"] == "completed"
