from __future__ import annotations

import psycopg
import pytest

from tests.engine import Engine

CHAIN = ({"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
DIAMOND = (
    {"slug": "top"},
    {"slug": "left", "deps_slugs": ["top"]},
    {"slug": "right", "deps_slugs": ["top"]},
    {"slug": "bottom", "deps_slugs": ["left", "right"]},
)


def test_stores_the_output(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    row = engine.complete(task, {"ok": True})
    assert (row["status"], row["output"]) == ("completed", {"ok": True})
    assert engine.state(run_id, "first")["output"] == {"ok": True}


def test_deletes_the_tasks_message(engine: Engine) -> None:
    # The task row records the completion (engine 0025): the archive does not repeat it.
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    engine.complete(task, 1)
    assert engine.archived_ids("chain") == set()
    assert task.msg_id not in {m["msg_id"] for m in engine.queued_messages("chain")}
    assert engine.task(run_id, task.step_slug)["message_id"] == task.msg_id
    assert engine.value("select count(*) from pgflow.archivable_messages") == 0


def test_completing_a_step_starts_its_dependents(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    engine.complete(task, 1)
    second = engine.state(run_id, "second")
    assert (second["status"], second["remaining_deps"]) == ("started", 0)
    assert engine.run(run_id)["remaining_steps"] == 1


def test_completes_the_run_with_the_outputs_of_its_leaf_steps(engine: Engine) -> None:
    engine.flow("diamond", *DIAMOND)
    run = engine.run_to_end("diamond", {"top": 1, "left": 2, "right": 3, "bottom": 4})
    assert (run["status"], run["output"], run["remaining_steps"]) == (
        "completed",
        {"bottom": 4},
        0,
    )
    assert run["completed_at"] is not None


def test_every_root_step_is_a_leaf_of_a_flow_without_dependencies(engine: Engine) -> None:
    engine.flow("fan", {"slug": "a"}, {"slug": "b"})
    run = engine.run_to_end("fan", {"a": "A", "b": "B"})
    assert run["output"] == {"a": "A", "b": "B"}


def test_a_step_with_two_dependencies_waits_for_both(engine: Engine) -> None:
    engine.flow("diamond", *DIAMOND)
    run_id = engine.start("diamond")
    [top] = engine.poll("diamond")
    engine.complete(top, "t")
    left, right = sorted(engine.poll("diamond"), key=lambda t: t.step_slug)
    engine.complete(left, "L")
    assert engine.state(run_id, "bottom")["status"] == "created"
    engine.complete(right, "R")
    [bottom] = engine.poll("diamond")
    assert bottom.input == {"left": "L", "right": "R"}


def test_a_second_completion_changes_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    engine.complete(task, "first answer")
    again = engine.complete(task, "second answer")
    assert (again["status"], again["output"]) == ("completed", "first answer")
    assert engine.state(run_id, "first")["output"] == "first answer"
    assert engine.run(run_id)["remaining_steps"] == 1


def test_completing_a_task_that_was_never_claimed_changes_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    row = engine.call("complete_task", run_id, "first", 0, {"x": 1})[0]
    assert (row["status"], row["output"]) == ("queued", None)
    assert engine.archived_ids("chain") == set()


def test_completing_a_task_of_a_failed_run_changes_nothing(engine: Engine) -> None:
    engine.flow("pair", {"slug": "a", "max_attempts": 1}, {"slug": "b"})
    run_id = engine.start("pair")
    tasks = {t.step_slug: t for t in engine.poll("pair")}
    engine.fail(tasks["a"])
    row = engine.complete(tasks["b"], "late")
    assert (row["status"], row["output"]) == ("cancelled", None)
    assert engine.run(run_id)["status"] == "failed"


def test_rejects_an_unknown_task(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        engine.call("complete_task", run_id, "nope", 0, {})
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        engine.call("complete_task", run_id, "first", 5, {})


def test_rejects_an_unknown_run(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.NoDataFound, match=r"Run .* does not exist"):
        engine.call("complete_task", "00000000-0000-0000-0000-000000000000", "a", 0, {})


def test_accepts_a_null_output(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    engine.start("chain")
    [first] = engine.poll("chain")
    engine.complete(first, None)
    [second] = engine.poll("chain")
    assert second.input == {"first": None}


def test_a_single_step_feeding_a_map_must_return_an_array(engine: Engine) -> None:
    engine.flow(
        "typed",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
        {"slug": "other"},
    )
    run_id = engine.start("typed")
    tasks = {t.step_slug: t for t in engine.poll("typed")}
    row = engine.complete(tasks["list"], {"not": "an array"})
    assert row["status"] == "failed"
    assert row["output"] == {"not": "an array"}
    assert row["error_message"] == "[TYPE_VIOLATION] Produced object instead of array"
    state = engine.state(run_id, "list")
    assert state["status"] == "failed"
    assert (
        "Map step each expects array input but dependency list produced object"
        in (state["error_message"])
    )
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "other")["status"] == "cancelled"
    assert engine.queued_messages("typed") == []


def test_the_type_violation_ignores_when_exhausted(engine: Engine) -> None:
    engine.flow(
        "typed",
        {"slug": "list", "when_exhausted": "skip"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
    )
    run_id = engine.start("typed")
    [task] = engine.poll("typed")
    engine.complete(task, "text")
    assert engine.run(run_id)["status"] == "failed"
