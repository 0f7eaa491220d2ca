"""Defining subflow steps (engine 0028): add_step's subflow_slug and the shape's "subflowSlug",
what is refused and why, and what a subflow step is not (it has no queue, no worker, no pause
and no limits). Pruning and deleting take subflow runs into account."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def subflow_step(slug: str, child: str, deps: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    return {"slug": slug, "deps": deps, "stepType": "subflow", "subflowSlug": child, **extra}


def test_a_compiled_shape_keeps_the_subflow_slug_and_compares_it(engine: Engine) -> None:
    steps = [{"slug": "validate"}, subflow_step("ship", "shipping", ("validate",))]

    assert engine.compile("orders", steps, mode="step")["status"] == "compiled"

    [ship] = engine.all("select * from pgflow.steps where step_slug = 'ship'")
    assert (ship["step_type"], ship["subflow_slug"]) == ("subflow", "shipping")
    shape = engine.value("select pgflow._get_flow_shape('orders')")
    assert shape["steps"][1]["subflowSlug"] == "shipping"
    assert "subflowSlug" not in shape["steps"][0]
    assert engine.compile("orders", steps, mode="step")["status"] == "verified"
    other = [{"slug": "validate"}, subflow_step("ship", "freight", ("validate",))]
    result = engine.compile("orders", other, mode="step")
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "shape")
    assert result["differences"] == ['Step at index 1: subflowSlug differs "freight" vs "shipping"']


def test_a_step_queued_flow_gets_no_queue_for_its_subflow_step(engine: Engine) -> None:
    engine.compile(
        "orders",
        [{"slug": "validate"}, subflow_step("ship", "shipping", ("validate",))],
        mode="step",
    )

    queues = {r["queue_name"] for r in engine.all("select queue_name from pgmq.list_queues()")}
    assert "orders__validate" in queues
    assert "orders__ship" not in queues
    # No worker is expected for it either.
    coverage = engine.all(
        "select step_slug from pgflow.queue_coverage() where flow_slug = 'orders'"
    )
    assert [row["step_slug"] for row in coverage] == ["validate"]


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            {"step_type": "subflow"},
            'Subflow step "ship" names no flow.',
        ),
        (
            {"step_type": "single", "subflow_slug": "shipping"},
            'Step "ship" of type "single" cannot start a subflow.',
        ),
        (
            {"step_type": "subflow", "subflow_slug": "orders"},
            'Step "ship" of flow "orders" cannot start a run of its own flow.',
        ),
        (
            {"step_type": "subflow", "subflow_slug": "bad__slug"},
            'Invalid subflow slug "bad__slug" for step "ship".',
        ),
        (
            {"step_type": "subflow", "subflow_slug": "shipping", "deps_slugs": ["a", "b"]},
            'Subflow step "ship" can have at most one dependency, got 2.',
        ),
    ],
)
def test_add_step_refuses_a_subflow_step_that_cannot_work(
    engine: Engine, step: dict[str, Any], message: str
) -> None:
    engine.flow("orders", {"slug": "a"}, {"slug": "b"})

    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.call("add_step", "orders", "ship", **step)

    assert raised.value.diag.message_primary == message
    engine.conn.rollback()


def test_a_map_cannot_map_a_subflow_steps_output(engine: Engine) -> None:
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})

    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.call("add_step", "orders", "each", deps_slugs=["ship"], step_type="map")

    assert raised.value.diag.message_primary == (
        'Map step "each" cannot map the output of subflow step "ship":'
        " a run's output is an object."
    )


def test_a_shape_with_a_subflow_slug_on_a_single_step_is_refused(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.compile("orders", [{"slug": "ship", "subflowSlug": "shipping"}], mode="flow")

    assert raised.value.diag.message_primary == (
        'Invalid flow shape: "subflowSlug" of step "ship" must be the slug of a flow, on a'
        " subflow or map step."
    )


@pytest.mark.parametrize(
    ("function", "args"),
    [("pause_step", ("orders", "ship")), ("set_step_limits", ("orders", "ship", 1))],
)
def test_a_subflow_step_cannot_be_paused_or_limited(
    engine: Engine, function: str, args: tuple[Any, ...]
) -> None:
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})

    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.call(function, *args)

    assert "is a subflow step: its tasks are child runs" in str(raised.value.diag.message_primary)


def test_pruning_takes_a_run_with_its_subflow_runs_and_never_a_child_alone(
    engine: Engine,
) -> None:
    engine.flow("leaf", {"slug": "only"})
    engine.flow("middle", {"slug": "call", "step_type": "subflow", "subflow_slug": "leaf"})
    engine.flow("top", {"slug": "call", "step_type": "subflow", "subflow_slug": "middle"})
    for _ in range(2):  # two trees of three runs each, finished from the bottom up
        top = engine.start("top", {})
        [task] = engine.poll("leaf")
        engine.complete(task, "done")
        assert engine.run(top)["status"] == "completed"
    # A third tree whose leaf still runs: nothing of it is pruned; nor is the finished child of a
    # running map.
    waiting = engine.start("top", {})
    engine.flow("pair", {"slug": "each", "step_type": "map", "subflow_slug": "leaf"})
    mapping = engine.start("pair", ["a", "b"])
    first_of_pair = engine.value(
        "select run_id from pgflow.runs where parent_run_id = %s and parent_task_index = 0", mapping
    )
    engine.complete(next(t for t in engine.poll("leaf") if t.run_id == first_of_pair), "one of two")

    [result] = engine.call("prune_data_older_than", "0 seconds")

    assert result["prune_data_older_than"]["runs"] == 2
    assert result["prune_data_older_than"]["subflow_runs"] == 4
    left = engine.all("select flow_slug, status from pgflow.runs order by flow_slug, status")
    assert left == [
        {"flow_slug": "leaf", "status": "completed"},
        {"flow_slug": "leaf", "status": "started"},
        {"flow_slug": "leaf", "status": "started"},
        {"flow_slug": "middle", "status": "started"},
        {"flow_slug": "pair", "status": "started"},
        {"flow_slug": "top", "status": "started"},
    ]
    assert engine.run(waiting)["status"] == engine.run(mapping)["status"] == "started"


def test_a_flow_used_as_a_subflow_cannot_be_deleted_before_its_user(engine: Engine) -> None:
    engine.flow("shipping", {"slug": "pack"})
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as raised:
        engine.call("delete_flow_and_data", "shipping")

    assert raised.value.diag.message_primary == (
        'Flow "shipping" is the subflow of step "ship" of flow "orders", so it cannot be deleted.'
    )
    assert raised.value.diag.message_hint == 'Nothing was deleted. Delete flow "orders" first.'


def test_deleting_a_parent_flow_cancels_and_keeps_its_running_children(engine: Engine) -> None:
    engine.flow("shipping", {"slug": "pack"})
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})
    engine.start("orders", {})
    [child] = engine.all("select run_id from pgflow.runs where flow_slug = 'shipping'")

    engine.call("delete_flow_and_data", "orders")

    run = engine.run(child["run_id"])
    assert (run["status"], run["parent_run_id"], run["parent_step_slug"]) == (
        "cancelled",
        None,
        None,
    )
    assert run["cancel_reason"] == 'Its parent run was deleted with flow "orders".'
    assert engine.queued_messages("shipping") == []
