"""start_flows: many runs of one flow in one call, as start_flow would start each, in input
order; idempotency keys; every input checked before anything is written."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.engine import Engine

CHAIN = ({"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})


def start_flows(
    engine: Engine, flow: str, inputs: list[Any], keys: list[str | None] | None = None
) -> list[dict[str, Any]]:
    with engine.conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            "select * from pgflow.start_flows(%s, %s::jsonb[], %s::text[])",
            (flow, [Jsonb(i) for i in inputs], keys),
        )
        return cur.fetchall()


def snapshot(engine: Engine, run_id: Any) -> dict[str, Any]:
    """A run as start_flow leaves it: its row, states and tasks, without ids and times."""
    run = engine.run(run_id)
    states = engine.all(
        "select step_slug, status, remaining_deps, remaining_tasks, initial_tasks"
        " from pgflow.step_states where run_id = %s order by step_slug",
        run_id,
    )
    tasks = engine.all(
        "select t.step_slug, t.task_index, t.status, q.message - 'run_id' as message"
        " from pgflow.step_tasks as t join pgmq.q_chain as q on q.msg_id = t.message_id"
        " where t.run_id = %s order by 1, 2",
        run_id,
    )
    return {
        "run": (run["status"], run["input"], run["remaining_steps"]),
        "states": states,
        "tasks": tasks,
    }


def test_it_starts_each_run_as_start_flow_does_in_input_order(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    single = engine.start("chain", {"n": 0})

    runs = start_flows(engine, "chain", [{"n": 1}, {"n": 2}, {"n": 3}])

    assert [r["input"] for r in runs] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert len({r["run_id"] for r in runs}) == 3
    expected = snapshot(engine, single)
    for run in runs:
        got = snapshot(engine, run["run_id"])
        assert got["states"] == expected["states"]
        assert got["tasks"] == expected["tasks"]
        assert got["run"][0::2] == expected["run"][0::2]
    # The runs go on as any other: the first steps are claimed and complete them.
    tasks = engine.poll("chain")
    assert sorted(t.run_id for t in tasks) == sorted([single, *(r["run_id"] for r in runs)])


def test_each_run_announces_its_start_and_its_first_step(engine: Engine, db_url: str) -> None:
    engine.flow("chain", *CHAIN)
    with psycopg.connect(db_url) as starter, psycopg.connect(db_url, autocommit=True) as listener:
        rows = starter.execute(
            "select run_id from pgflow.start_flows('chain', array['{}', '{}']::jsonb[])"
        ).fetchall()
        for (run_id,) in rows:
            listener.execute(f"listen pgflow_run_{run_id.hex}")
        starter.commit()  # the events go out now, to the channels listened to by then
        events = [json.loads(n.payload) for n in listener.notifies(timeout=10, stop_after=4)]
    for (run_id,) in rows:
        assert [(e["event"], e["step_slug"]) for e in events if e["run_id"] == str(run_id)] == [
            ("run:started", None),
            ("step:started", "first"),
        ]


def test_a_root_map_and_a_condition_take_the_general_path(engine: Engine) -> None:
    engine.flow("mapped", {"slug": "items", "step_type": "map"})
    engine.flow("gated", {"slug": "maybe", "required_input_pattern": Jsonb({"go": True})})

    mapped = start_flows(engine, "mapped", [[1, 2], [], [3]])
    gated = start_flows(engine, "gated", [{"go": True}, {"go": False}])

    assert [engine.state(r["run_id"], "items")["remaining_tasks"] for r in mapped] == [2, 0, 1]
    assert engine.run(mapped[1]["run_id"])["status"] == "completed"  # an empty map: at once
    assert [engine.state(r["run_id"], "maybe")["status"] for r in gated] == ["started", "skipped"]


def test_a_key_a_run_already_has_returns_that_run_and_starts_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    [first] = start_flows(engine, "chain", [{"n": 1}], ["order-1"])

    runs = start_flows(
        engine, "chain", [{"n": 9}, {"n": 2}, {"n": 3}], ["order-1", "order-2", None]
    )

    assert runs[0]["run_id"] == first["run_id"]
    assert runs[0]["input"] == {"n": 1}  # as it is
    assert [r["idempotency_key"] for r in runs] == ["order-1", "order-2", None]
    assert engine.value("select count(*) from pgflow.runs") == 3
    assert len(engine.queued_messages("chain")) == 3


def test_a_key_repeated_in_one_call_starts_one_run(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    runs = start_flows(engine, "chain", [{"n": 1}, {"n": 2}], ["same", "same"])
    assert runs[0]["run_id"] == runs[1]["run_id"]
    assert runs[1]["input"] == {"n": 1}
    assert engine.value("select count(*) from pgflow.runs") == 1


@pytest.mark.parametrize(
    ("flow", "inputs", "error", "match"),
    [
        ("chain", [{}, None], psycopg.errors.NullValueNotAllowed, "Input 2 of the runs"),
        ("mapped", [[1], {"not": "an array"}], psycopg.errors.InvalidParameterValue, "input 2"),
        ("nothing", [{}], psycopg.errors.NoDataFound, 'Flow "nothing" does not exist'),
    ],
)
def test_a_bad_input_raises_with_its_position_and_starts_nothing(
    engine: Engine, flow: str, inputs: list[Any], error: type[Exception], match: str
) -> None:
    engine.flow("chain", *CHAIN)
    engine.flow("mapped", {"slug": "each", "step_type": "map"})
    with engine.conn.cursor() as cur, pytest.raises(error, match=match):
        cur.execute(
            "select * from pgflow.start_flows(%s, %s::jsonb[])",
            (flow, [None if i is None else Jsonb(i) for i in inputs]),
        )
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_keys_must_pair_with_inputs(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="one key per input"):
        start_flows(engine, "chain", [{}, {}], ["only one"])


def test_no_inputs_start_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    assert start_flows(engine, "chain", []) == []
