"""complete_tasks: a batch of completions in one call behaves as complete_task one after another.

The equivalence tests drive twin flows (same definition, same run inputs) to the end: one
completing every polled task with complete_task, the other completing each polled batch with one
complete_tasks call; every run, step state, task and event must come out the same."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task
from tests.engine import Engine

Output = Callable[[Task], Any]


def diamond(slug: str) -> tuple[dict[str, Any], ...]:
    return (
        {"slug": "top"},
        {"slug": "side"},
        {"slug": "left", "deps_slugs": ["top"]},
        {"slug": "right", "deps_slugs": ["top"]},
        {"slug": "bottom", "deps_slugs": ["left", "right", "side"]},
    )


def mixed(slug: str) -> tuple[dict[str, Any], ...]:
    """A step with a map child, a plain child and a conditional child (general path)."""
    return (
        {"slug": "top"},
        {"slug": "squares", "deps_slugs": ["top"], "step_type": "map"},
        {"slug": "note", "deps_slugs": ["top"]},
        {
            "slug": "gate",
            "deps_slugs": ["top"],
            "required_input_pattern": {"top": [1]},
            "when_unmet": "skip-cascade",
        },
        {"slug": "after", "deps_slugs": ["gate"]},
        {"slug": "last", "deps_slugs": ["squares", "note"]},
    )


def root_map(slug: str) -> tuple[dict[str, Any], ...]:
    return ({"slug": "each", "step_type": "map"}, {"slug": "total", "deps_slugs": ["each"]})


def fan_out(slug: str) -> tuple[dict[str, Any], ...]:
    """A dependent map whose elements are polled a few at a time (batches that do not finish
    their step), next to a plain chain in the same batches."""
    return (
        {"slug": "items"},
        {"slug": "each", "deps_slugs": ["items"], "step_type": "map"},
        {"slug": "total", "deps_slugs": ["each"]},
        {"slug": "side"},
        {"slug": "after", "deps_slugs": ["side"]},
    )


def fan_out_output(task: Task) -> Any:
    return list(range(7)) if task.step_slug == "items" else [task.step_slug, task.task_index]


def mixed_output(task: Task) -> Any:
    if task.step_slug != "top":
        return {"step": task.step_slug, "index": task.task_index}
    n = task.flow_input["n"] if task.flow_input else 0
    return "not an array" if n == 5 else ([1, 2] if n % 2 == 0 else [3])


CASES: dict[str, tuple[Callable[[str], tuple[dict[str, Any], ...]], list[Any], Output]] = {
    "diamond": (diamond, [{"n": n} for n in range(6)], lambda t: {"from": t.step_slug}),
    "mixed": (mixed, [{"n": n} for n in range(7)], mixed_output),
    "root_map": (root_map, [[1, 2, 3], [], [4], [5, 6]], lambda t: t.task_index * 10),
    "fan_out": (fan_out, [{"n": 1}, {"n": 2}], fan_out_output),
}
#: How many tasks each poll takes, per case (default: every visible one).
POLL_QTY = {"fan_out": 3}


def drive(
    engine: Engine,
    flow: str,
    inputs: list[Any],
    output: Output,
    batched: bool,
    run_ids: list[uuid.UUID] | None = None,
) -> list[uuid.UUID]:
    """Start a run per input (with the given run ids), then poll and complete until done."""
    run_ids = run_ids or [uuid.uuid4() for _ in inputs]
    for run_id, value in zip(run_ids, inputs, strict=True):
        engine.call("start_flow", flow, Jsonb(value), run_id=run_id)
    for _ in range(50):
        tasks = engine.poll(flow, qty=POLL_QTY.get(flow.rsplit("_", 1)[0], 50))
        if not tasks:
            return run_ids
        outputs = [output(task) for task in tasks]
        if batched:
            engine.complete_batch(tasks, outputs)
        else:
            for task, value in zip(tasks, outputs, strict=True):
                engine.complete(task, value)
    raise AssertionError(f"{flow} did not finish")


def outcome(engine: Engine, run_id: uuid.UUID) -> dict[str, Any]:
    """Everything observable about a run, without ids and timestamps."""
    run = engine.run(run_id)
    states = engine.all(
        "select step_slug, status, output, skip_reason, error_message, remaining_tasks,"
        " remaining_deps, initial_tasks, started_at is not null as started,"
        " completed_at is not null as completed"
        " from pgflow.step_states where run_id = %s order by step_slug",
        run_id,
    )
    tasks = engine.all(
        "select step_slug, task_index, status, output, error_message, attempts_count"
        " from pgflow.step_tasks where run_id = %s order by step_slug, task_index",
        run_id,
    )
    return {
        "run": (run["status"], run["output"], run["remaining_steps"]),
        "states": states,
        "tasks": tasks,
    }


def events(listener: psycopg.Connection[Any]) -> dict[str, list[tuple[str, str | None]]]:
    """Each run's events, in the order its channel received them."""
    received: dict[str, list[tuple[str, str | None]]] = {}
    for notify in listener.notifies(timeout=0.5):
        event = json.loads(notify.payload)
        received.setdefault(event["run_id"], []).append((event["event"], event["step_slug"]))
    return received


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_batch_over_many_runs_ends_as_completing_one_by_one(
    engine: Engine, db_url: str, case: str
) -> None:
    steps, inputs, output = CASES[case]
    results = {}
    for batched in (False, True):
        flow = f"{case}_{'batched' if batched else 'single'}"
        engine.flow(flow, *steps(flow))
        results[batched] = drive(engine, flow, inputs, output, batched)

    single = [outcome(engine, run_id) for run_id in results[False]]
    batched_ = [outcome(engine, run_id) for run_id in results[True]]
    assert batched_ == single
    assert {o["run"][0] for o in single} >= {"completed"}


@pytest.mark.parametrize(("case", "in_order"), [("diamond", True), ("mixed", False)])
def test_both_ways_announce_the_same_events(
    engine: Engine, db_url: str, case: str, in_order: bool
) -> None:
    """Plain steps announce in exactly the one-by-one order; with the general path in the
    batch (map tasks, conditional children), in some one-by-one order."""
    steps, inputs, output = CASES[case]
    announced = []
    for batched in (False, True):
        flow = f"{case}_{'batched' if batched else 'single'}"
        engine.flow(flow, *steps(flow))
        run_ids = [uuid.uuid4() for _ in inputs]
        with psycopg.connect(db_url, autocommit=True) as listener:
            for run_id in run_ids:
                listener.execute(f"listen pgflow_run_{run_id.hex}")
            drive(engine, flow, inputs, output, batched, run_ids)
            received = events(listener)
        per_run = [received[str(run_id)] for run_id in run_ids]
        announced.append(per_run if in_order else [sorted(e, key=str) for e in per_run])
    assert announced[1] == announced[0]
    assert sum(map(len, announced[0])) > 30


def test_a_child_whose_dependencies_all_finish_in_the_batch_starts_once(engine: Engine) -> None:
    engine.flow("twin", {"slug": "a"}, {"slug": "b"}, {"slug": "joined", "deps_slugs": ["a", "b"]})
    run_id = engine.start("twin")
    tasks = engine.poll("twin")
    assert sorted(t.step_slug for t in tasks) == ["a", "b"]
    engine.complete_batch(tasks, [1, 2])
    joined = engine.state(run_id, "joined")
    assert (joined["status"], joined["remaining_deps"], joined["remaining_tasks"]) == (
        "started",
        0,
        1,
    )
    [task] = engine.poll("twin")
    assert (task.step_slug, task.input) == ("joined", {"a": 1, "b": 2})


def test_children_on_different_queues_each_get_their_message(engine: Engine) -> None:
    engine.compile(
        "fan",
        [{"slug": "top"}, {"slug": "mail", "deps": ["top"]}, {"slug": "sms", "deps": ["top"]}],
    )
    run_ids = [engine.start("fan", {"n": n}) for n in range(3)]
    tops = engine.poll("fan", "fan__top", step="top")
    engine.complete_batch(tops, [{"n": n} for n in range(3)])
    for step in ("mail", "sms"):
        claimed = engine.poll("fan", f"fan__{step}", step=step)
        assert sorted(t.run_id for t in claimed) == sorted(run_ids)
        assert {t.step_slug for t in claimed} == {step}


def test_a_started_child_waits_for_its_start_delay(engine: Engine) -> None:
    engine.flow(
        "later", {"slug": "now"}, {"slug": "then", "deps_slugs": ["now"], "start_delay": 60}
    )
    engine.start("later")
    engine.start("later")
    engine.complete_batch(engine.poll("later"), [1, 2])
    assert engine.poll("later") == []
    delays = engine.all(
        "select extract(epoch from vt - now()) as seconds from pgmq.q_later"
        " where message ->> 'step_slug' = 'then'"
    )
    assert len(delays) == 2
    assert all(55 < d["seconds"] <= 60 for d in delays)


def test_a_batch_deletes_its_tasks_messages_at_once(engine: Engine) -> None:
    # The task rows record the completions (engine 0025): the archive does not repeat them.
    engine.flow("pair", {"slug": "one"}, {"slug": "two"})
    run_id = engine.start("pair")
    tasks = engine.poll("pair")
    engine.complete_batch(tasks, [1, 2])
    assert engine.queued_messages("pair") == []
    assert engine.archived_ids("pair") == set()
    assert {
        (t["message_id"], t["status"]) for s in ("one", "two") for t in engine.tasks(run_id, s)
    } == {(t.msg_id, "completed") for t in tasks}
    assert engine.value("select count(*) from pgflow.archivable_messages") == 0


def test_returns_each_task_afterwards_in_input_order(engine: Engine) -> None:
    engine.flow("pair", {"slug": "one"}, {"slug": "two"})
    engine.start("pair")
    tasks = sorted(engine.poll("pair"), key=lambda t: t.step_slug, reverse=True)
    rows = engine.complete_batch(tasks, [{"v": "two"}, {"v": "one"}])
    assert [(r["step_slug"], r["status"], r["output"]) for r in rows] == [
        ("two", "completed", {"v": "two"}),
        ("one", "completed", {"v": "one"}),
    ]


def test_a_task_named_twice_is_completed_once(engine: Engine) -> None:
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    run_id = engine.start("chain")
    [task] = engine.poll("chain")
    rows = engine.complete_batch([task, task], [{"v": 1}, {"v": 2}])
    assert [r["output"] for r in rows] == [{"v": 1}, {"v": 1}]
    assert len(engine.tasks(run_id, "second")) == 1
    assert engine.run(run_id)["remaining_steps"] == 1


def test_late_callbacks_in_a_batch_change_nothing(engine: Engine) -> None:
    engine.flow("pair", {"slug": "good"}, {"slug": "bad", "max_attempts": 1})
    failing = engine.start("pair")
    healthy = engine.start("pair")
    tasks = engine.poll("pair")
    [bad] = [t for t in tasks if t.run_id == failing and t.step_slug == "bad"]
    engine.fail(bad)
    assert engine.run(failing)["status"] == "failed"

    rows = engine.complete_batch(tasks, [{"late": True}] * len(tasks))
    by_key = {(r["run_id"], r["step_slug"]): r for r in rows}
    assert by_key[(failing, "good")]["status"] == "cancelled"
    assert by_key[(failing, "bad")]["status"] == "failed"
    assert by_key[(failing, "good")]["output"] is None
    assert engine.run(healthy)["status"] == "completed"


def test_a_missing_task_raises_and_changes_nothing(engine: Engine) -> None:
    engine.flow("pair", {"slug": "one"}, {"slug": "two"})
    run_id = engine.start("pair")
    tasks = engine.poll("pair")
    ghost = Task("pair", run_id, "three", None, 0, 0, None, 1, 60)
    with pytest.raises(psycopg.errors.NoDataFound, match='Task 0 of step "three"'):
        engine.complete_batch([*tasks, ghost], [1, 2, 3])
    assert {t["status"] for t in engine.all("select status from pgflow.step_tasks")} == {"started"}

    stranger = Task("pair", uuid.uuid4(), "one", None, 0, 0, None, 1, 60)
    with pytest.raises(psycopg.errors.NoDataFound, match=r"Run .* does not exist"):
        engine.complete_batch([*tasks, stranger], [1, 2, 3])


def test_arrays_of_different_lengths_are_rejected(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="arrays of one length"):
        engine.value(
            "select count(*) from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[])",
            [uuid.uuid4()],
            ["a", "b"],
            [0],
            [None],
        )


def test_arrays_must_start_at_index_one(engine: Engine) -> None:
    engine.flow("pair", {"slug": "one"}, {"slug": "two"})
    run_id = engine.start("pair")
    engine.poll("pair")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="start at index 1"):
        engine.value(
            "select count(*) from pgflow.complete_tasks(%s, '{one,two}', '{0,0}',"
            " '[0:1]={1,2}'::jsonb[])",
            [run_id, run_id],
        )
    assert engine.value("select count(*) from pgflow.step_tasks where status = 'completed'") == 0


def test_an_empty_batch_does_nothing(engine: Engine) -> None:
    assert engine.value("select count(*) from pgflow.complete_tasks('{}', '{}', '{}', '{}')") == 0
