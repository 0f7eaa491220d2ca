"""Subflow failures (engine 0028): a failed child fails its parent's task attempt, which retries
the child in place (its completed steps keep their outputs) while attempts are left; a cancelled
child fails the task for good; a child that cannot start fails it for good. Cancel cascades from
parent to children, a failed parent fails its running children, and retry_run of the parent
resumes them. Reports from workers or callers on a subflow task are refused."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine


def two_step_child(engine: Engine) -> str:
    """fetch -> store, one attempt each."""
    return engine.flow(
        "document",
        {"slug": "fetch"},
        {"slug": "store", "deps_slugs": ["fetch"]},
        max_attempts=1,
    )


def parent(engine: Engine, *extra: dict[str, Any], **subflow: Any) -> str:
    """A root subflow step "process" running "document", then whatever `extra` adds."""
    return engine.flow(
        "ingest",
        {"slug": "process", "step_type": "subflow", "subflow_slug": "document", **subflow},
        *extra,
    )


def child_of(engine: Engine, run_id: uuid.UUID, task_index: int = 0) -> dict[str, Any]:
    return engine.one(
        "select * from pgflow.runs where parent_run_id = %s and parent_task_index = %s"
        " order by started_at desc limit 1",
        run_id,
        task_index,
    )


def fail_store(engine: Engine, message: str = "disk full") -> None:
    [fetch] = engine.poll("document")
    engine.complete(fetch, {"bytes": 10})
    [store] = engine.poll("document")
    engine.fail(store, message)


def test_a_failed_child_is_retried_in_place_as_the_tasks_next_attempt(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=2, base_delay=0)
    run_id = engine.start("ingest", {"url": "u"})
    child_id = child_of(engine, run_id)["run_id"]

    fail_store(engine, "disk full")

    child = engine.run(child_id)
    assert (child["status"], child["retry_count"]) == ("started", 1)  # the same child, again
    task = engine.task(run_id, "process")
    assert (task["status"], task["attempts_count"]) == ("started", 2)
    assert task["error_message"] == (
        f'Subflow run {child_id} of flow "document" failed: step "store": disk full'
    )
    # Only the failed step runs again; the completed one keeps its output.
    [store] = engine.poll("document")
    assert (store.step_slug, store.input) == ("store", {"fetch": {"bytes": 10}})
    engine.complete(store, "stored")
    assert engine.run(run_id)["status"] == "completed"
    assert engine.task(child_id and run_id, "process")["output"] == {"store": "stored"}


def test_the_retry_waits_for_the_steps_retry_delay(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=2, base_delay=60)
    engine.start("ingest", {"url": "u"})

    fail_store(engine)

    assert engine.poll("document") == []  # hidden for base_delay * 2^1 seconds
    engine.make_visible("document")
    [store] = engine.poll("document")
    assert store.step_slug == "store"


def test_a_child_failing_with_no_attempt_left_fails_the_parents_step_and_run(
    engine: Engine,
) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=1)
    run_id = engine.start("ingest", {"url": "u"})
    child_id = child_of(engine, run_id)["run_id"]

    fail_store(engine, "disk full\nTraceback ...")

    assert engine.run(child_id)["status"] == "failed"
    state = engine.state(run_id, "process")
    assert state["status"] == "failed"
    assert state["error_message"] == (
        f'Subflow run {child_id} of flow "document" failed: step "store": disk full'
    )
    assert engine.run(run_id)["status"] == "failed"


def test_when_exhausted_skip_lets_the_parent_go_on_without_the_child(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, {"slug": "after"}, max_attempts=1, when_exhausted="skip")
    run_id = engine.start("ingest", {"url": "u"})

    fail_store(engine)

    assert engine.state(run_id, "process")["status"] == "skipped"
    [after] = engine.poll("ingest")
    engine.complete(after, "ok")
    assert engine.run(run_id)["status"] == "completed"


def test_a_child_that_cannot_start_fails_the_task_for_good(engine: Engine) -> None:
    # "document" does not exist: the flow is applied later, or never.
    parent(engine, max_attempts=3)

    run_id = engine.start("ingest", {"url": "u"})

    task = engine.task(run_id, "process")
    assert (task["status"], task["attempts_count"]) == ("failed", 1)
    assert task["error_message"].splitlines() == [
        'The subflow run could not start: Flow "document" does not exist.',
        "Not retried (attempt 1 of 3): the subflow run could not start",
        "Check the slug (it is case-sensitive) or compile the flow first.",
    ]
    assert engine.run(run_id)["status"] == "failed"
    assert engine.all("select * from pgflow.runs where parent_run_id = %s", run_id) == []


def test_a_map_element_the_child_flow_refuses_fails_only_after_the_others_started(
    engine: Engine,
) -> None:
    # The child maps its input, so an element that is not an array cannot start it.
    engine.flow("each_item", {"slug": "item", "step_type": "map"})
    engine.flow(
        "batches", {"slug": "all", "step_type": "map", "subflow_slug": "each_item"}, max_attempts=1
    )

    run_id = engine.start("batches", [[1], "oops", [2]])

    tasks = engine.tasks(run_id, "all")
    assert [t["status"] for t in tasks] == ["cancelled", "failed", "cancelled"]
    assert "must be a JSON array, got string" in tasks[1]["error_message"]
    # The first child had started; the run's failure failed it too. The third never started.
    kids = engine.all(
        "select parent_task_index, status from pgflow.runs where parent_run_id = %s", run_id
    )
    assert kids == [{"parent_task_index": 0, "status": "failed"}]


def test_cancelling_a_parent_cancels_its_children_and_their_tasks(engine: Engine) -> None:
    two_step_child(engine)
    engine.flow("fanout", {"slug": "each", "step_type": "map", "subflow_slug": "document"})
    run_id = engine.start("fanout", [{"url": "a"}, {"url": "b"}])
    [first, _second] = engine.poll("document")
    engine.complete(first, {"bytes": 1})

    engine.call("cancel_run", run_id, "operator said so")

    kids = engine.all(
        "select run_id, status, cancel_reason from pgflow.runs where parent_run_id = %s"
        " order by parent_task_index",
        run_id,
    )
    assert [k["status"] for k in kids] == ["cancelled", "cancelled"]
    assert kids[0]["cancel_reason"] == f"Its parent run {run_id} was cancelled."
    assert {
        t["status"]
        for k in kids
        for t in engine.all("select status from pgflow.step_tasks where run_id = %s", k["run_id"])
    } == {"completed", "cancelled"}
    assert engine.queued_messages("document") == []  # archived: no worker gets them
    assert [t["status"] for t in engine.tasks(run_id, "each")] == ["cancelled", "cancelled"]
    # Only the operator's own cancel is an operator action.
    assert engine.value("select count(*) from pgflow.operator_actions where action = 'cancel'") == 1


def test_cancelling_a_child_fails_its_parents_task_for_good(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=3)
    run_id = engine.start("ingest", {"url": "u"})
    child_id = child_of(engine, run_id)["run_id"]

    engine.call("cancel_run", child_id, "wrong document")

    task = engine.task(run_id, "process")
    assert task["status"] == "failed"  # two attempts were left: none is used
    assert task["error_message"].splitlines()[:2] == [
        f'Subflow run {child_id} of flow "document" was cancelled: wrong document',
        "Not retried (attempt 1 of 3): its subflow run was cancelled",
    ]
    assert engine.run(run_id)["status"] == "failed"


def test_a_failed_parent_fails_its_running_children_and_retry_run_resumes_them(
    engine: Engine,
) -> None:
    two_step_child(engine)
    parent(engine, {"slug": "sibling", "max_attempts": 1}, max_attempts=1)
    run_id = engine.start("ingest", {"url": "u"})
    child_id = child_of(engine, run_id)["run_id"]
    [sibling] = engine.poll("ingest")
    [fetch] = engine.poll("document")
    engine.complete(fetch, {"bytes": 5})

    engine.fail(sibling, "the API was down")  # fails the parent run

    assert engine.run(run_id)["status"] == "failed"
    assert engine.run(child_id)["status"] == "failed"
    assert engine.task(child_id, "store")["status"] == "cancelled"
    assert engine.queued_messages("document") == []

    engine.call("retry_run", run_id)

    child = engine.run(child_id)
    assert (child["status"], child["retry_count"]) == ("started", 1)  # resumed, not replaced
    task = engine.task(run_id, "process")
    assert (task["status"], task["attempts_count"], task["attempts_before_retry"]) == (
        "started",
        2,
        1,
    )
    [store] = engine.poll("document")
    assert store.input == {"fetch": {"bytes": 5}}  # its completed step kept its output
    engine.complete(store, "kept")
    [again] = engine.poll("ingest")
    engine.complete(again, "up")
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == (
        "completed",
        {"process": {"store": "kept"}, "sibling": "up"},
    )


def test_retry_run_of_a_parent_replaces_a_cancelled_child(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=1)
    run_id = engine.start("ingest", {"url": "u"})
    cancelled = child_of(engine, run_id)["run_id"]
    engine.call("cancel_run", cancelled)
    assert engine.run(run_id)["status"] == "failed"

    engine.call("retry_run", run_id)

    fresh = child_of(engine, run_id)
    assert fresh["run_id"] != cancelled
    assert (fresh["status"], fresh["input"]) == ("started", {"url": "u"})
    assert engine.run(cancelled)["status"] == "cancelled"


def test_a_subflow_run_cannot_be_retried_on_its_own(engine: Engine) -> None:
    two_step_child(engine)
    parent(engine, max_attempts=1)
    run_id = engine.start("ingest", {"url": "u"})
    child_id = child_of(engine, run_id)["run_id"]
    fail_store(engine)

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as raised:
        engine.call("retry_run", child_id)

    assert str(raised.value.diag.message_primary) == (
        f"Run {child_id} is a subflow run of run {run_id}: retry that run."
    )
    assert engine.run(child_id)["status"] == "failed"


@pytest.mark.parametrize("report", ["complete_task", "fail_task", "complete_tasks"])
def test_no_report_completes_or_fails_a_subflow_task(engine: Engine, report: str) -> None:
    # A worker or a client with the parent's run id could forge one: the task ends only with
    # its child run.
    two_step_child(engine)
    parent(engine, {"slug": "other"})
    run_id = engine.start("ingest", {"url": "u"})
    [other] = engine.poll("ingest")
    calls = {
        "complete_task": (
            "select * from pgflow.complete_task(%s, 'process', 0, %s, 1)",
            (run_id, Jsonb({"store": "forged"})),
        ),
        "fail_task": ("select * from pgflow.fail_task(%s, 'process', 0, 'forged', 1)", (run_id,)),
        "complete_tasks": (
            "select * from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[], %s::int[])",
            (
                [other.run_id, run_id],
                [other.step_slug, "process"],
                [0, 0],
                [Jsonb("x"), Jsonb("forged")],
                [other.attempt, 1],
            ),
        ),
    }
    query, params = calls[report]

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as raised:
        engine.conn.execute(query, params)

    assert str(raised.value.diag.message_primary) == (
        f'Task 0 of step "process" in run {run_id} runs a subflow: it ends when its child run does.'
    )
    engine.conn.rollback()
    task = engine.task(run_id, "process")
    assert (task["status"], task["output"]) == ("started", None)
    assert engine.task(run_id, "other")["status"] == "started"


def test_subflows_nest_at_most_eight_deep(engine: Engine) -> None:
    # Two flows that start each other, made in plain SQL (a build refuses the cycle).
    for flow, other in (("ping", "pong"), ("pong", "ping")):
        engine.flow(
            flow, {"slug": "call", "step_type": "subflow", "subflow_slug": other}, max_attempts=1
        )

    run_id = engine.start("ping", {})

    depths = engine.all(
        "select (select count(*) from pgflow._run_ancestors(r.run_id)) as depth, r.status"
        " from pgflow.runs r order by 1"
    )
    # The top run and 8 below it; the 9th could not start, and its failure went up the tree.
    assert depths == [{"depth": n, "status": "failed"} for n in range(1, 10)]
    deepest = engine.one(
        "select r.run_id from pgflow.runs r"
        " where (select count(*) from pgflow._run_ancestors(r.run_id)) = 9"
    )["run_id"]
    message = engine.task(deepest, "call")["error_message"]
    assert message.splitlines()[0] == (
        f'The subflow run could not start: Run {deepest} of flow "ping" cannot start a subflow'
        ' run of flow "pong": subflows nest at most 8 deep.'
    )
    assert engine.run(run_id)["status"] == "failed"
