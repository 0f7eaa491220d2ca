"""Run priority (engine 0031): start_flow and start_flows take a priority from 0 to 1000; within
a queue read_and_claim reads the ready tasks of higher-priority runs first, and runs of equal
priority first in, first out. Subflow runs take their parent's priority, forked runs their
source's."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import WORKER_ID, Engine


def claim(engine: Engine, flow: str, qty: int, step: str | None = None) -> list[Any]:
    """One read_and_claim of the flow's queue: (run_id, step_slug, task_index) in claim order."""
    engine.register(flow)
    rows = engine.conn.execute(
        "select run_id, step_slug, task_index from pgflow.read_and_claim(%s, %s, %s, %s, %s, %s)",
        (flow, flow, WORKER_ID, qty, 30, step),
    ).fetchall()
    return [tuple(row) for row in rows]


def priority(engine: Engine, run_id: uuid.UUID) -> int:
    return int(engine.value("select priority from pgflow.runs where run_id = %s", run_id))


def test_a_run_has_priority_0_unless_it_is_started_with_one(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    assert priority(engine, engine.start("plain")) == 0
    assert priority(engine, engine.start("plain", priority=7)) == 7


def test_higher_priority_runs_are_claimed_first_and_equals_in_the_order_they_came(
    engine: Engine,
) -> None:
    engine.flow("plain", {"slug": "only"})
    backlog = [engine.start("plain", {"n": n}) for n in range(4)]
    urgent_a = engine.start("plain", priority=5)
    top = engine.start("plain", priority=10)
    urgent_b = engine.start("plain", priority=5)

    # A claim returns its batch in message order; which tasks make the batch is what counts.
    assert [run for run, _, _ in claim(engine, "plain", 1)] == [top]
    assert [run for run, _, _ in claim(engine, "plain", 1)] == [urgent_a]
    # The last prioritised run, then the backlog first in, first out.
    assert {run for run, _, _ in claim(engine, "plain", 3)} == {urgent_b, backlog[0], backlog[1]}
    assert [run for run, _, _ in claim(engine, "plain", 10)] == backlog[2:]


def test_a_prioritised_run_overtakes_a_backlog_in_every_later_step(engine: Engine) -> None:
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    backlog = [engine.start("chain", {"n": n}) for n in range(3)]
    urgent = engine.start("chain", priority=1)

    [(run, step, _)] = claim(engine, "chain", 1)
    assert (run, step) == (urgent, "first")
    engine.call("complete_task", urgent, "first", 0, Jsonb({"ok": True}))

    # Its second step is queued behind the backlog's first steps, and still comes first.
    [(run, step, _)] = claim(engine, "chain", 1)
    assert (run, step) == (urgent, "second")
    assert {run for run, _, _ in claim(engine, "chain", 10)} == set(backlog)


def test_a_finished_prioritised_run_leaves_the_claims_first_in_first_out(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    urgent = engine.start("plain", priority=3)
    [(run, _, _)] = claim(engine, "plain", 1)
    engine.call("complete_task", run, "only", 0, Jsonb(1))
    assert engine.run(urgent)["status"] == "completed"
    assert not engine.value(
        "select exists (select 1 from pgflow.runs where priority > 0 and status = 'started')"
    )

    later = [engine.start("plain", {"n": n}) for n in range(3)]
    assert [run for run, _, _ in claim(engine, "plain", 3)] == later


def test_a_hidden_task_of_a_prioritised_run_waits_its_turn_and_does_not_block(
    engine: Engine,
) -> None:
    engine.flow("plain", {"slug": "only"})
    backlog = [engine.start("plain", {"n": n}) for n in range(2)]
    urgent = engine.start("plain", priority=9)
    # Its message hidden for a minute, as a retry's delay or a lease would hide it.
    engine.conn.execute(
        "update pgmq.q_plain set vt = now() + interval '60 seconds' where message ? 'priority'"
    )
    assert [run for run, _, _ in claim(engine, "plain", 5)] == backlog
    engine.conn.execute("update pgmq.q_plain set vt = now() where message ? 'priority'")
    assert [run for run, _, _ in claim(engine, "plain", 5)] == [urgent]


def test_a_step_queue_claim_takes_its_own_steps_prioritised_task_first(engine: Engine) -> None:
    engine.compile("split", [{"slug": "a"}, {"slug": "b"}])
    engine.start("split")
    urgent = engine.start("split", priority=4)
    for step, queue in [("a", "split__a"), ("b", "split__b")]:
        engine.register(queue)
        rows = engine.conn.execute(
            "select run_id, step_slug from pgflow.read_and_claim('split', %s, %s, 1, 30, %s)",
            (queue, WORKER_ID, step),
        ).fetchall()
        assert [tuple(r) for r in rows] == [(urgent, step)]


@pytest.mark.parametrize("bad", [-1, 1001])
def test_a_priority_out_of_range_is_refused_and_starts_nothing(engine: Engine, bad: int) -> None:
    engine.flow("plain", {"slug": "only"})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="between 0 and 1000"):
        engine.start("plain", priority=bad)
    engine.conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="between 0 and 1000"):
        engine.call("start_flows", "plain", [Jsonb(1)], priority=bad)
    engine.conn.rollback()
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_start_flows_gives_every_new_run_its_priority(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    backlog = engine.start("plain")
    runs = engine.call("start_flows", "plain", [Jsonb(1), Jsonb(2)], priority=6)
    assert [r["priority"] for r in runs] == [6, 6]
    assert {run for run, _, _ in claim(engine, "plain", 2)} == {r["run_id"] for r in runs}
    assert [run for run, _, _ in claim(engine, "plain", 2)] == [backlog]


def test_a_run_returned_for_its_idempotency_key_keeps_its_own_priority(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    [first] = engine.call("start_flow", "plain", Jsonb(1), idempotency_key="k", priority=2)
    [again] = engine.call("start_flow", "plain", Jsonb(1), idempotency_key="k", priority=9)
    assert (again["run_id"], again["priority"]) == (first["run_id"], 2)


def test_subflow_runs_take_their_parents_priority(engine: Engine) -> None:
    engine.flow("shipping", {"slug": "pack"})
    engine.flow("orders", {"slug": "ship", "step_type": "subflow", "subflow_slug": "shipping"})
    parent = engine.start("orders", {"id": 1}, priority=8)
    [child] = engine.all(
        "select run_id, priority from pgflow.runs where parent_run_id = %s", parent
    )
    assert child["priority"] == 8


def test_a_forked_run_takes_its_sources_priority(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    source = engine.start("plain", priority=3)
    [task] = engine.poll("plain")
    engine.complete(task, 1)
    [fork] = engine.call("fork_run", source, "only")
    assert fork["priority"] == 3


def messages(engine: Engine, queue: str) -> list[dict[str, Any]]:
    return [
        row["message"] for row in engine.all(f"select message from pgmq.q_{queue} order by msg_id")
    ]


def test_only_the_messages_of_prioritised_runs_carry_their_priority(engine: Engine) -> None:
    engine.flow(
        "fan",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
        {"slug": "after", "deps_slugs": ["list"]},
    )
    plain = engine.start("fan")
    urgent = engine.start("fan", priority=6)
    assert [m.get("priority") for m in messages(engine, "fan")] == [None, 6]
    for run in (plain, urgent):
        [task] = [t for t in engine.poll("fan", qty=1) if t.run_id == run]
        engine.complete(task, [1, 2])
    # The map's tasks (one insert per task) and the single dependent (complete_tasks's insert).
    queued = engine.all(
        "select q.message, t.step_slug from pgmq.q_fan as q"
        " join pgflow.step_tasks as t on t.message_id = q.msg_id and t.status = 'queued'"
    )
    by_run = {(str(r["message"]["run_id"]), r["step_slug"]): r["message"] for r in queued}
    assert {k: m.get("priority") for k, m in by_run.items() if k[0] == str(urgent)} == {
        (str(urgent), "each"): 6,
        (str(urgent), "after"): 6,
    }
    assert all("priority" not in m for k, m in by_run.items() if k[0] == str(plain))


def test_a_retried_run_queues_its_tasks_again_with_its_priority(engine: Engine) -> None:
    engine.flow("once", {"slug": "only"}, max_attempts=1)
    run_id = engine.start("once", priority=2)
    [task] = engine.poll("once")
    engine.fail(task, "down")
    engine.call("retry_run", run_id)
    backlog = engine.start("once")
    assert [run for run, _, _ in claim(engine, "once", 1)] == [run_id]
    assert [run for run, _, _ in claim(engine, "once", 1)] == [backlog]


def test_a_keyed_task_gets_its_runs_priority_when_it_is_unparked(engine: Engine) -> None:
    engine.compile(
        "fair",
        [{"slug": "call", "options": {"concurrencyKey": "$.tenant", "concurrencyLimit": 1}}],
        mode="flow",
        options={},
    )
    first = engine.start("fair", {"tenant": "a"})
    parked = engine.start("fair", {"tenant": "a"}, priority=5)  # waits for the key's place
    [(run, _, _)] = claim(engine, "fair", 1)
    assert run == first
    engine.call("complete_task", first, "call", 0, Jsonb(1))
    assert [m.get("priority") for m in messages(engine, "fair")] == [5]
    assert [run for run, _, _ in claim(engine, "fair", 1)] == [parked]


def test_every_queue_has_the_index_the_prioritised_read_walks(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    engine.compile("split", [{"slug": "a"}, {"slug": "b"}])
    indexed = engine.all(
        "select tablename from pg_indexes where schemaname = 'pgmq'"
        " and indexname like 'pgflow_priority_%%' order by 1"
    )
    assert [r["tablename"] for r in indexed] == ["q_plain", "q_split__a", "q_split__b"]
    for n in range(200):
        engine.start("plain", {"n": n}, priority=n % 3)
    engine.conn.execute("analyze pgmq.q_plain")
    plan = engine.conn.execute(
        "explain (format text) select msg_id from pgmq.q_plain where message ? 'priority'"
        " and vt <= clock_timestamp() order by (message ->> 'priority')::int desc, msg_id limit 10"
    ).fetchall()
    assert "Index Scan using pgflow_priority_" in "\n".join(row[0] for row in plan)
