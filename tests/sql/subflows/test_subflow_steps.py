"""Subflow steps (engine 0028): a step that starts runs of another flow. Its tasks have no message
and no worker: the engine starts the child run(s) when the step is ready, in that transaction, and
the child's completion completes the parent's task in the transaction that completed the child
(a map gathers the children's outputs in element order)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.engine import Engine


def shipping_flow(engine: Engine) -> str:
    """pack -> label: the child flow."""
    return engine.flow(
        "shipping",
        {"slug": "pack"},
        {"slug": "label", "deps_slugs": ["pack"]},
        max_attempts=1,
    )


def order_flow(engine: Engine, **ship: Any) -> str:
    """validate -> ship (a subflow step running "shipping") -> notify."""
    return engine.flow(
        "orders",
        {"slug": "validate"},
        {
            "slug": "ship",
            "deps_slugs": ["validate"],
            "step_type": "subflow",
            "subflow_slug": "shipping",
            **ship,
        },
        {"slug": "notify", "deps_slugs": ["ship"]},
    )


def children(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.all(
        "select * from pgflow.runs where parent_run_id = %s order by parent_task_index", run_id
    )


def finish_shipping(engine: Engine, label: str = "L-1") -> None:
    """Run the one shipping run that is waiting to its end."""
    [pack] = engine.poll("shipping")
    engine.complete(pack, {"box": 3})
    [stamp] = engine.poll("shipping")
    engine.complete(stamp, label)


def test_a_ready_subflow_step_starts_its_child_run_with_the_steps_input(engine: Engine) -> None:
    shipping_flow(engine)
    order_flow(engine)
    run_id = engine.start("orders", {"order": 7})
    [validate] = engine.poll("orders")

    engine.complete(validate, {"address": "1 Main St"})

    [child] = children(engine, run_id)
    assert (child["flow_slug"], child["status"], child["input"]) == (
        "shipping",
        "started",
        {"address": "1 Main St"},  # the one dependency's output, as it is
    )
    assert (child["parent_step_slug"], child["parent_task_index"]) == ("ship", 0)
    task = engine.task(run_id, "ship")
    # No message, no worker: the task is started with its first attempt, its child running.
    assert (task["status"], task["attempts_count"], task["message_id"]) == ("started", 1, None)
    assert engine.state(run_id, "ship")["status"] == "started"
    assert engine.poll("orders") == []  # nothing for the parent's workers meanwhile


def test_the_childs_completion_completes_the_parents_task_with_the_childs_output(
    engine: Engine,
) -> None:
    shipping_flow(engine)
    order_flow(engine)
    run_id = engine.start("orders", {"order": 7})
    [validate] = engine.poll("orders")
    engine.complete(validate, {"address": "1 Main St"})

    finish_shipping(engine, "L-1")

    [child] = children(engine, run_id)
    assert (child["status"], child["output"]) == ("completed", {"label": "L-1"})
    task = engine.task(run_id, "ship")
    assert (task["status"], task["output"]) == ("completed", {"label": "L-1"})
    [notify] = engine.poll("orders")
    assert (notify.step_slug, notify.input) == ("notify", {"ship": {"label": "L-1"}})
    engine.complete(notify, "sent")
    assert engine.run(run_id)["status"] == "completed"


def test_a_root_subflow_step_gives_its_child_the_run_input(engine: Engine) -> None:
    shipping_flow(engine)
    engine.flow("direct", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})

    run_id = engine.start("direct", {"address": "2 High St"})

    [child] = children(engine, run_id)
    assert child["input"] == {"address": "2 High St"}
    finish_shipping(engine, "L-2")
    # The subflow step is the parent's only leaf: the run's output is the child's output.
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"ship": {"label": "L-2"}})


def test_a_map_subflow_step_starts_one_child_per_element_and_gathers_outputs_in_order(
    engine: Engine,
) -> None:
    engine.flow("double", {"slug": "times_two"})
    engine.flow("fanout", {"slug": "each", "step_type": "map", "subflow_slug": "double"})
    run_id = engine.start("fanout", [1, 2, 3])

    kids = children(engine, run_id)
    assert [(k["parent_task_index"], k["input"]) for k in kids] == [(0, 1), (1, 2), (2, 3)]
    tasks = {t.run_id: t for t in engine.poll("double")}
    # Completed out of order: the step's output follows the elements' order.
    for kid in reversed(kids):
        engine.complete(tasks[kid["run_id"]], kid["input"] * 2)

    assert engine.state(run_id, "each")["output"] == [
        {"times_two": 2},
        {"times_two": 4},
        {"times_two": 6},
    ]
    assert engine.run(run_id)["status"] == "completed"


def test_a_dependent_map_subflow_step_maps_its_dependencys_array(engine: Engine) -> None:
    engine.flow("double", {"slug": "times_two"})
    engine.flow(
        "listed",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map", "subflow_slug": "double"},
    )
    run_id = engine.start("listed")
    [listing] = engine.poll("listed")
    engine.complete(listing, [{"n": 1}, {"n": 2}])

    assert [k["input"] for k in children(engine, run_id)] == [{"n": 1}, {"n": 2}]


def test_an_empty_map_subflow_step_completes_at_once_without_a_child(engine: Engine) -> None:
    engine.flow("double", {"slug": "times_two"})
    engine.flow("fanout", {"slug": "each", "step_type": "map", "subflow_slug": "double"})

    run_id = engine.start("fanout", [])

    assert children(engine, run_id) == []
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"each": []})


def test_a_child_that_finishes_at_once_completes_the_parents_task_in_the_same_start(
    engine: Engine,
) -> None:
    # The child's only step has a condition its input never meets: it is skipped, so the child
    # completes inside the parent's start, and so does the parent.
    engine.flow(
        "noop",
        {"slug": "maybe", "required_input_pattern": {"go": True}},
    )
    engine.flow("wrapper", {"slug": "call", "step_type": "subflow", "subflow_slug": "noop"})

    run_id = engine.start("wrapper", {"go": False})

    [child] = children(engine, run_id)
    assert (child["status"], child["output"]) == ("completed", None)
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"call": None})


def test_a_batch_completion_that_completes_a_child_completes_its_parents_task(
    engine: Engine,
) -> None:
    # complete_tasks completes plain single steps set-based, runs included (engine 0025): a
    # child completed there still completes its parent's task.
    engine.flow("single", {"slug": "only"})
    engine.flow("fanout", {"slug": "each", "step_type": "map", "subflow_slug": "single"})
    run_id = engine.start("fanout", ["a", "b"])
    tasks = engine.poll("single")
    assert len(tasks) == 2

    engine.complete_batch(tasks, ["A", "B"], fenced=True)

    assert [k["status"] for k in children(engine, run_id)] == ["completed", "completed"]
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == (
        "completed",
        {"each": [{"only": "A"}, {"only": "B"}]},
    )


def test_a_subflow_runs_steps_in_its_own_queue_and_its_parent_never_gets_a_message(
    engine: Engine,
) -> None:
    shipping_flow(engine)
    order_flow(engine)
    run_id = engine.start("orders")
    [validate] = engine.poll("orders")
    engine.complete(validate, {})

    assert [m["message"]["flow_slug"] for m in engine.queued_messages("shipping")] == ["shipping"]
    assert engine.queued_messages("orders") == [
        m for m in engine.queued_messages("orders") if m["message"]["step_slug"] != "ship"
    ]
    assert engine.task(run_id, "ship")["queue_name"] == "orders"  # the route, never used


def test_a_child_run_joins_its_parents_trace(engine: Engine) -> None:
    engine.flow("single", {"slug": "only"})
    engine.flow("wrapper", {"slug": "call", "step_type": "subflow", "subflow_slug": "single"})
    traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with engine.conn.transaction():
        engine.conn.execute("select set_config('pgflow.traceparent', %s, true)", (traced,))
        with_context = engine.start("wrapper", {})
    without = engine.start("wrapper", {})

    def child_trace(run_id: uuid.UUID) -> str:
        return str(children(engine, run_id)[0]["traceparent"])

    assert child_trace(with_context) == traced  # the caller's context, stored with the parent
    # A parent without one: the context workers derive from its run id (trace id: the run id,
    # parent span: its low 64 bits), so the child's spans join the parent's trace.
    assert child_trace(without) == f"00-{without.hex}-{without.hex[16:]}-01"
