from __future__ import annotations

import psycopg
import pytest

from tests.engine import Engine


def test_a_root_map_runs_one_task_per_input_element(engine: Engine) -> None:
    engine.flow("squares", {"slug": "square", "step_type": "map"})
    run_id = engine.start("squares", [1, 2, 3])
    tasks = engine.poll("squares")
    assert [(t.task_index, t.input, t.flow_input) for t in tasks] == [
        (0, 1, None),
        (1, 2, None),
        (2, 3, None),
    ]
    assert engine.state(run_id, "square")["initial_tasks"] == 3


def test_a_root_map_needs_an_array_input(engine: Engine) -> None:
    engine.flow("squares", {"slug": "square", "step_type": "map"})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a JSON array"):
        engine.start("squares", {"not": "array"})
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_map_output_follows_task_order_not_completion_order(engine: Engine) -> None:
    engine.flow("squares", {"slug": "square", "step_type": "map"})
    run_id = engine.start("squares", [1, 2, 3])
    tasks = engine.poll("squares")
    for task in reversed(tasks):
        engine.complete(task, task.input * task.input)
    assert engine.state(run_id, "square")["output"] == [1, 4, 9]
    assert engine.run(run_id)["output"] == {"square": [1, 4, 9]}


def test_an_empty_root_map_completes_at_once(engine: Engine) -> None:
    engine.flow("squares", {"slug": "square", "step_type": "map"})
    run_id = engine.start("squares", [])
    state = engine.state(run_id, "square")
    assert (state["status"], state["output"], state["remaining_tasks"]) == ("completed", [], 0)
    assert engine.run(run_id)["status"] == "completed"
    assert engine.queued_messages("squares") == []


def test_emptiness_cascades_through_a_chain_of_maps(engine: Engine) -> None:
    engine.flow(
        "chain",
        {"slug": "m1", "step_type": "map"},
        {"slug": "m2", "deps_slugs": ["m1"], "step_type": "map"},
        {"slug": "m3", "deps_slugs": ["m2"], "step_type": "map"},
        {"slug": "total", "deps_slugs": ["m3"]},
    )
    run_id = engine.start("chain", [])
    assert [engine.state(run_id, s)["status"] for s in ("m1", "m2", "m3")] == ["completed"] * 3
    [total] = engine.poll("chain")
    assert total.input == {"m3": []}


def test_a_dependent_map_sizes_itself_from_its_dependency(engine: Engine) -> None:
    engine.flow(
        "fanout",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
    )
    run_id = engine.start("fanout")
    assert engine.state(run_id, "each")["initial_tasks"] is None
    [listing] = engine.poll("fanout")
    engine.complete(listing, ["a", "b"])
    tasks = engine.poll("fanout")
    assert [(t.task_index, t.input) for t in tasks] == [(0, "a"), (1, "b")]
    assert engine.state(run_id, "each")["initial_tasks"] == 2


def test_a_map_after_a_map_gets_one_task_per_element(engine: Engine) -> None:
    engine.flow(
        "double",
        {"slug": "first", "step_type": "map"},
        {"slug": "second", "deps_slugs": ["first"], "step_type": "map"},
    )
    run = engine.run_to_end(
        "double",
        {"first": lambda t: t.input + 1, "second": lambda t: t.input * 10},
        input=[1, 2],
    )
    assert run["output"] == {"second": [20, 30]}


def test_a_single_step_after_a_map_gets_the_whole_array(engine: Engine) -> None:
    engine.flow(
        "reduce",
        {"slug": "each", "step_type": "map"},
        {"slug": "sum", "deps_slugs": ["each"]},
    )
    run = engine.run_to_end(
        "reduce", {"each": lambda t: t.input, "sum": lambda t: sum(t.input["each"])}, input=[1, 2]
    )
    assert run["output"] == {"sum": 3}


def test_map_elements_can_be_any_json_value(engine: Engine) -> None:
    engine.flow("any", {"slug": "echo", "step_type": "map"})
    values = [None, [1, [2]], {"k": "v"}, "s", 1.5, True]
    run = engine.run_to_end("any", {"echo": lambda t: t.input}, input=values)
    assert run["output"] == {"echo": values}


def test_map_output_keeps_null_outputs(engine: Engine) -> None:
    engine.flow("nulls", {"slug": "each", "step_type": "map"})
    run = engine.run_to_end("nulls", {"each": None}, input=[1, 2])
    assert run["output"] == {"each": [None, None]}


def test_a_single_element_map_still_outputs_an_array(engine: Engine) -> None:
    engine.flow("one", {"slug": "each", "step_type": "map"})
    run = engine.run_to_end("one", {"each": "x"}, input=[1])
    assert run["output"] == {"each": ["x"]}


def test_a_map_step_finishes_only_after_its_last_task(engine: Engine) -> None:
    engine.flow(
        "wait", {"slug": "each", "step_type": "map"}, {"slug": "after", "deps_slugs": ["each"]}
    )
    run_id = engine.start("wait", [1, 2])
    first, second = engine.poll("wait")
    engine.complete(first, 1)
    state = engine.state(run_id, "each")
    assert (state["status"], state["remaining_tasks"]) == ("started", 1)
    engine.complete(second, 2)
    assert engine.state(run_id, "after")["status"] == "started"
