"""fork_run (engine 0029): a new run of the same flow with the same input, from one step. Every step
not downstream of it is copied as it ended (no task runs), the step and everything downstream of
it run fresh. The new run says where it came from; the old one is left as it was. Refused,
changing nothing: an unknown run or step, a step to copy that did not end well, a flow that
changed since the run started."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine
from tests.roles import Logins, refused


def chain(engine: Engine) -> str:
    """first -> second -> third, and side (a root step beside them)."""
    return engine.flow(
        "chain",
        {"slug": "first"},
        {"slug": "second", "deps_slugs": ["first"]},
        {"slug": "third", "deps_slugs": ["second"]},
        {"slug": "side"},
        max_attempts=1,
    )


def finished_chain(engine: Engine, fail_second: bool = False) -> uuid.UUID:
    chain(engine)
    run_id = engine.start("chain", {"n": 1})
    for _ in range(3):
        for task in engine.poll("chain"):
            if task.step_slug == "second" and fail_second:
                engine.fail(task, "a bug in second")
            else:
                engine.complete(task, f"{task.step_slug} v1")
    return run_id


def fork(engine: Engine, run_id: uuid.UUID, step: str) -> dict[str, Any]:
    [run] = engine.call("fork_run", run_id, step)
    return run


def states(engine: Engine, run_id: uuid.UUID) -> dict[str, tuple[str, Any]]:
    rows = engine.all(
        "select step_slug, status, output from pgflow.step_states where run_id = %s", run_id
    )
    return {row["step_slug"]: (row["status"], row["output"]) for row in rows}


def test_a_fork_copies_what_comes_before_the_step_and_runs_the_rest_again(engine: Engine) -> None:
    source = finished_chain(engine)
    before = states(engine, source)

    run = fork(engine, source, "second")

    assert run["run_id"] != source
    assert (run["status"], run["input"]) == ("started", {"n": 1})
    assert (run["forked_from_run_id"], run["forked_from_step"]) == (source, "second")
    assert states(engine, run["run_id"]) == {
        "first": ("completed", "first v1"),  # copied, with its output
        "side": ("completed", "side v1"),  # not downstream of second: copied too
        "second": ("started", None),
        "third": ("created", None),
    }
    [again] = engine.poll("chain")  # only second runs again, with the copied output as input
    assert (again.run_id, again.step_slug, again.input) == (
        run["run_id"],
        "second",
        {"first": "first v1"},
    )
    engine.complete(again, "second v2")
    [third] = engine.poll("chain")
    engine.complete(third, "third v2")
    finished = engine.run(run["run_id"])
    assert (finished["status"], finished["output"]) == (
        "completed",
        {"third": "third v2", "side": "side v1"},
    )
    assert states(engine, source) == before  # the old run is left as it was
    [action] = engine.all("select action, run_id, step_slug, detail from pgflow.operator_actions")
    assert action == {
        "action": "fork",
        "run_id": run["run_id"],
        "step_slug": "second",
        "detail": {"from_run": str(source)},
    }


def test_a_failed_run_forks_from_its_failed_step_once_the_handler_is_fixed(engine: Engine) -> None:
    source = finished_chain(engine, fail_second=True)
    assert engine.run(source)["status"] == "failed"

    run = fork(engine, source, "second")

    [again] = engine.poll("chain")
    assert again.step_slug == "second"
    assert engine.task(run["run_id"], "second")["attempts_count"] == 1  # a fresh task
    assert engine.run(source)["status"] == "failed"


def test_a_fork_from_a_root_step_runs_every_step_downstream_of_it(engine: Engine) -> None:
    source = finished_chain(engine)

    run = fork(engine, source, "first")

    assert {slug: status for slug, (status, _) in states(engine, run["run_id"]).items()} == {
        "first": "started",
        "second": "created",
        "third": "created",
        "side": "completed",
    }


def test_a_copied_map_keeps_its_tasks_outputs(engine: Engine) -> None:
    engine.flow(
        "mapped",
        {"slug": "each", "step_type": "map"},
        {"slug": "sum", "deps_slugs": ["each"]},
    )
    source = engine.start("mapped", [1, 2])
    for task in engine.poll("mapped"):
        engine.complete(task, task.input * 10)
    [total] = engine.poll("mapped")
    engine.complete(total, 30)

    run = fork(engine, source, "sum")

    assert [t["output"] for t in engine.tasks(run["run_id"], "each")] == [10, 20]
    [again] = engine.poll("mapped")
    assert (again.step_slug, again.input) == ("sum", {"each": [10, 20]})


def test_a_fork_takes_no_idempotency_key_and_the_callers_trace_context(engine: Engine) -> None:
    chain(engine)
    [source] = engine.call("start_flow", "chain", {"n": 1}, idempotency_key="order-1")
    while tasks := engine.poll("chain"):
        for task in tasks:
            engine.complete(task, "done")
    traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with engine.conn.transaction():
        engine.conn.execute("select set_config('pgflow.traceparent', %s, true)", (traced,))
        run = fork(engine, source["run_id"], "first")

    assert (run["idempotency_key"], run["traceparent"]) == (None, traced)


def test_a_fresh_subflow_step_starts_a_new_child_and_a_copied_one_keeps_its_output(
    engine: Engine,
) -> None:
    engine.flow("child", {"slug": "only"})
    engine.flow(
        "parent",
        {"slug": "call", "step_type": "subflow", "subflow_slug": "child"},
        {"slug": "after", "deps_slugs": ["call"]},
    )
    source = engine.start("parent", {})
    [only] = engine.poll("child")
    engine.complete(only, "done")
    [after] = engine.poll("parent")
    engine.complete(after, "after v1")

    copied = fork(engine, source, "after")
    fresh = fork(engine, source, "call")

    assert states(engine, copied["run_id"])["call"] == ("completed", {"only": "done"})
    children = engine.all("select parent_run_id from pgflow.runs where flow_slug = 'child'")
    assert sorted(str(c["parent_run_id"]) for c in children) == sorted(
        [str(source), str(fresh["run_id"])]
    )


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("unknown run", psycopg.errors.NoDataFound, "Run {missing} does not exist."),
        ("unknown step", psycopg.errors.NoDataFound, 'Flow "chain" has no step "fourth".'),
        (
            "step to copy failed",
            psycopg.errors.ObjectNotInPrerequisiteState,
            'Run {source} cannot be forked from step "third": step "second", which it would copy,'
            " is failed.",
        ),
        (
            "flow changed",
            psycopg.errors.ObjectNotInPrerequisiteState,
            'Run {source} cannot be forked: flow "chain" has changed since it started.',
        ),
    ],
)
def test_a_fork_that_cannot_be_made_is_refused_and_changes_nothing(
    engine: Engine, case: str, error: type[psycopg.Error], message: str
) -> None:
    source = finished_chain(engine, fail_second=True)
    missing = uuid.uuid4()
    run_id, step = {
        "unknown run": (missing, "second"),
        "unknown step": (source, "fourth"),
        "step to copy failed": (source, "third"),
        "flow changed": (source, "second"),
    }[case]
    if case == "flow changed":
        engine.call("add_step", "chain", "later", deps_slugs=["third"])
    runs = engine.value("select count(*) from pgflow.runs")

    with pytest.raises(error) as raised:
        engine.call("fork_run", run_id, step)

    assert raised.value.diag.message_primary == message.format(missing=missing, source=source)
    engine.conn.rollback()
    assert engine.value("select count(*) from pgflow.runs") == runs
    if case == "unknown step":
        assert raised.value.diag.message_hint == "Its steps: first, second, third, side."


def test_a_client_forks_and_a_worker_may_not(engine: Engine, logins: Logins) -> None:
    source = finished_chain(engine)
    client = logins.login("client")
    worker = logins.login("worker")

    assert client.execute(
        "select status from pgflow.fork_run(%s, 'third')", (source,)
    ).fetchone() == ("started",)
    refused(worker, "select pgflow.fork_run(%s, 'third')", source)
    [action] = engine.all("select action, actor from pgflow.operator_actions")
    assert action == {"action": "fork", "actor": logins.login_role("client")}
