"""Fair concurrency per key (engine 0018): a keyed step lets at most its limit of tasks per key
value hold a queue message; the rest wait parked, in order, and take a message as their key's
tasks finish, however they finish; another key's task never waits behind a backlog."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import WORKER_ID, Engine

KEYED = {"concurrencyKey": "$.tenant", "concurrencyLimit": 2}


def compile_keyed(engine: Engine, **options: Any) -> None:
    """Flow "fair": a keyed root step "call" then a plain step "after", on one flow queue."""
    engine.compile(
        "fair",
        [{"slug": "call", "options": options or KEYED}, {"slug": "after", "deps": ["call"]}],
        mode="flow",
        options={},
    )


@pytest.fixture
def fair(engine: Engine) -> Engine:
    compile_keyed(engine)
    return engine


def queued_keys(engine: Engine) -> list[tuple[str | None, int]]:
    """The (tenant, n) of each message of step "call" in the queue, in queue order."""
    return [
        (row["tenant"], row["n"])
        for row in engine.all(
            "select r.input ->> 'tenant' as tenant, (r.input ->> 'n')::int as n"
            " from pgmq.q_fair as q"
            " join pgflow.runs as r on r.run_id = (q.message ->> 'run_id')::uuid"
            " where q.message ->> 'step_slug' = 'call' order by q.msg_id"
        )
    ]


def assert_consistent(engine: Engine) -> None:
    """Every key's count is its tasks with a message that have not finished, and the parked
    rows are exactly its tasks queued without one."""
    rows = engine.all(
        "select t.concurrency_key as key,"
        " count(*) filter (where t.message_id is not null"
        "   and t.status in ('queued', 'started')) as live,"
        " count(*) filter (where t.message_id is null and t.status = 'queued') as waiting,"
        " coalesce(max(k.admitted), 0) as admitted,"
        " (select count(*) from pgflow.parked_tasks as p"
        "   where p.concurrency_key = t.concurrency_key) as parked"
        " from pgflow.step_tasks as t"
        " left join pgflow.concurrency_keys as k on k.flow_slug = t.flow_slug"
        "   and k.step_slug = t.step_slug and k.concurrency_key = t.concurrency_key"
        " where t.concurrency_key is not null group by t.concurrency_key"
    )
    for row in rows:
        assert row["live"] == row["admitted"], row
        assert row["waiting"] == row["parked"], row
    assert engine.value("select count(*) from pgflow.concurrency_events") == 0


def start(engine: Engine, tenant: str | None, n: int) -> uuid.UUID:
    return engine.start("fair", {"n": n} if tenant is None else {"tenant": tenant, "n": n})


def test_a_key_holds_at_most_its_limit_of_messages_and_the_rest_wait_in_order(fair: Engine) -> None:
    runs = [start(fair, "a", n) for n in range(5)]
    start(fair, "b", 0)

    assert queued_keys(fair) == [("a", 0), ("a", 1), ("b", 0)]
    assert [fair.task(r, "call")["concurrency_key"] for r in runs] == ["a"] * 5
    assert [fair.task(r, "call")["message_id"] is None for r in runs] == [False] * 2 + [True] * 3
    assert_consistent(fair)


def test_a_finished_task_gives_its_place_to_the_next_of_its_key(fair: Engine) -> None:
    for n in range(4):
        start(fair, "a", n)
    start(fair, "b", 0)
    [first] = fair.poll("fair", qty=1)
    assert first.step_slug == "call"

    fair.complete(first, {"ok": True})

    # b's message came before a's next one: b waits behind two of a's tasks, not four.
    assert queued_keys(fair) == [("a", 1), ("b", 0), ("a", 2)]
    assert_consistent(fair)


def test_every_way_of_finishing_frees_the_place_once(fair: Engine) -> None:
    runs = [start(fair, "a", n) for n in range(6)]
    compile_keyed(fair, concurrencyKey="$.tenant", concurrencyLimit=2)  # same spec: no change
    tasks = fair.poll("fair", qty=2)
    assert len(tasks) == 2
    fair.complete_batch(tasks, [1, 2])  # both in one batch
    assert queued_keys(fair) == [("a", 2), ("a", 3)]
    assert_consistent(fair)

    fair.call("cancel_run", runs[2])  # an admitted task
    assert queued_keys(fair) == [("a", 3), ("a", 4)]
    fair.call("cancel_run", runs[5])  # a parked one leaves the line, and frees nothing
    assert queued_keys(fair) == [("a", 3), ("a", 4)]
    assert fair.value("select count(*) from pgflow.parked_tasks") == 0
    assert_consistent(fair)

    [task] = [t for t in fair.poll("fair", qty=5) if t.run_id == runs[3]]
    fair.fail(task, "no")  # max attempts 3 by default: a retry keeps its place
    assert fair.task(runs[3], "call")["status"] == "queued"
    assert queued_keys(fair) == [("a", 3), ("a", 4)]
    assert_consistent(fair)


def test_a_run_without_the_key_counts_under_the_empty_key(fair: Engine) -> None:
    for n in range(3):
        start(fair, None, n)
    assert queued_keys(fair) == [(None, 0), (None, 1)]
    assert (
        fair.value(
            "select distinct concurrency_key from pgflow.step_tasks where step_slug = 'call'"
        )
        == ""
    )


def test_each_element_of_a_keyed_map_takes_a_place(engine: Engine) -> None:
    engine.compile(
        "fan",
        [
            {
                "slug": "each",
                "stepType": "map",
                "options": {"concurrencyKey": "$[0]", "concurrencyLimit": 2},
            }
        ],
        mode="flow",
        options={},
    )
    run_id = engine.start("fan", ["x", "y", "z", "w"])
    assert engine.value("select count(*) from pgmq.q_fan") == 2
    assert {t["concurrency_key"] for t in engine.tasks(run_id, "each")} == {"x"}
    while tasks := engine.poll("fan"):
        for task in tasks:
            engine.complete(task, task.task_index)
    assert engine.run(run_id)["status"] == "completed"
    assert engine.value("select count(*) from pgflow.concurrency_keys") == 0


def test_a_higher_limit_in_the_spec_admits_the_waiting_tasks_and_none_admits_all(
    fair: Engine,
) -> None:
    for n in range(6):
        start(fair, "a", n)
    compile_keyed(fair, concurrencyKey="$.tenant", concurrencyLimit=4)
    assert [n for _, n in queued_keys(fair)] == [0, 1, 2, 3]
    fair.compile(
        "fair", [{"slug": "call"}, {"slug": "after", "deps": ["call"]}], mode="flow", options={}
    )
    assert [n for _, n in queued_keys(fair)] == [0, 1, 2, 3, 4, 5]
    start(fair, "a", 6)  # a step without a key queues as before
    plain = fair.value("select run_id from pgflow.runs where input ->> 'n' = '6'")
    assert fair.task(plain, "call")["concurrency_key"] is None
    while tasks := fair.poll("fair"):
        for task in tasks:
            fair.complete(task, 1)
    assert fair.value("select count(*) from pgflow.concurrency_keys") == 0
    assert fair.value("select count(*) filter (where status <> 'completed') from pgflow.runs") == 0


def test_a_retried_run_parks_its_keyed_task_again(engine: Engine) -> None:
    engine.compile(
        "fair", [{"slug": "call", "options": {**KEYED}}], mode="flow", options={"maxAttempts": 1}
    )
    failing = start(engine, "a", 0)
    [task] = engine.poll("fair")
    engine.fail(task)
    assert engine.run(failing)["status"] == "failed"
    others = [start(engine, "a", n) for n in (1, 2, 3)]
    assert [n for _, n in queued_keys(engine)] == [1, 2]

    engine.call("retry_run", failing)

    assert engine.task(failing, "call")["message_id"] is None  # behind the two with a place
    assert_consistent(engine)
    while tasks := engine.poll("fair"):
        for task in tasks:
            engine.complete(task, 1)
    assert {engine.run(r)["status"] for r in [failing, *others]} == {"completed"}
    assert_consistent(engine)


def test_batched_starts_and_completions_park_keyed_steps(engine: Engine) -> None:
    engine.compile(
        "fair",
        [{"slug": "first"}, {"slug": "call", "deps": ["first"], "options": KEYED}],
        mode="flow",
        options={},
    )
    runs = [
        r["run_id"]
        for r in engine.all(
            "select * from pgflow.start_flows('fair', %s::jsonb[])",
            [Jsonb({"tenant": "a", "n": n}) for n in range(5)],
        )
    ]
    firsts = engine.poll("fair")
    assert len(firsts) == 5
    engine.complete_batch(firsts, [1] * 5)  # set-based: the keyed children are parked together
    assert queued_keys(engine) == [("a", 0), ("a", 1)]
    assert_consistent(engine)
    while tasks := engine.poll("fair"):
        engine.complete_batch(tasks, [1] * len(tasks))
    assert {engine.run(r)["status"] for r in runs} == {"completed"}


def test_a_batch_that_finishes_both_parents_of_a_keyed_child_parks_it_once(
    engine: Engine,
) -> None:
    """Engine 0027: the set-based path starts a keyed child whose last parents finish in one
    batch once, parked under its key, and announces its start once."""
    engine.compile(
        "fair",
        [
            {"slug": "left"},
            {"slug": "right"},
            {"slug": "call", "deps": ["left", "right"],
             "options": {**KEYED, "concurrencyLimit": 1}},
        ],
        mode="flow",
        options={},
    )  # fmt: skip
    runs = [start(engine, "a", n) for n in range(2)]
    roots = engine.poll("fair")
    assert sorted(t.step_slug for t in roots) == ["left", "left", "right", "right"]
    with engine.conn.cursor() as cur:
        for run in runs:
            cur.execute(f"listen pgflow_run_{run.hex}")
    engine.complete_batch(roots, [1] * len(roots))

    for run in runs:
        assert [t["status"] for t in engine.tasks(run, "call")] == ["queued"]
    assert queued_keys(engine) == [("a", 0)]  # the limit is 1: the second run's task waits
    assert engine.value("select count(*) from pgflow.parked_tasks") == 1
    assert_consistent(engine)
    # Committed already: the timeout only bounds a wait for events that never come.
    events = [json.loads(n.payload) for n in engine.conn.notifies(timeout=30, stop_after=6)]
    assert sorted((e["event"], e["step_slug"]) for e in events) == [
        *[("step:completed", "left")] * 2, *[("step:completed", "right")] * 2,
        *[("step:started", "call")] * 2,
    ]  # fmt: skip
    assert sorted(e["run_id"] for e in events if e["event"] == "step:started") == sorted(
        str(r) for r in runs
    )


def test_a_keyed_child_started_by_a_batch_keeps_its_start_delay(engine: Engine) -> None:
    engine.compile(
        "fair",
        [{"slug": "first"},
         {"slug": "call", "deps": ["first"], "options": {**KEYED, "startDelay": 3600}}],
        mode="flow",
        options={},
    )  # fmt: skip
    runs = [start(engine, "a", n) for n in range(3)]
    firsts = engine.poll("fair")
    engine.complete_batch(firsts, [1] * len(firsts))

    delays = engine.all(
        "select extract(epoch from q.vt - clock_timestamp()) as wait from pgmq.q_fair as q"
        " where q.message ->> 'step_slug' = 'call'"
    )
    assert len(delays) == 2  # two places; the third run's task is parked
    assert all(3500 < row["wait"] <= 3600 for row in delays)
    assert (
        engine.value(
            "select extract(epoch from not_before - clock_timestamp()) from pgflow.parked_tasks"
        )
        > 3500
    )
    assert engine.poll("fair") == []  # nothing is visible before its delay
    assert {engine.run(r)["status"] for r in runs} == {"started"}
    assert_consistent(engine)


def test_concurrency_usage_reports_keys_active_and_waiting(fair: Engine) -> None:
    for n in range(5):
        start(fair, "a", n)
    start(fair, "b", 0)
    [row] = fair.all("select * from pgflow.concurrency_usage('fair')")
    assert row == {
        "flow_slug": "fair",
        "step_slug": "call",
        "queue_name": "fair",
        "key_path": "$.tenant",
        "limit_per_key": 2,
        "keys_active": 2,
        "keys_waiting": 1,
        "admitted": 3,
        "parked": 3,
        "busiest_key": "a",
        "busiest_parked": 3,
    }


def test_a_bad_key_path_or_limit_is_refused(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a JSON path"):
        compile_keyed(engine, concurrencyKey="tenant[", concurrencyLimit=2)
    with pytest.raises(psycopg.errors.CheckViolation):
        compile_keyed(engine, concurrencyKey="$.tenant", concurrencyLimit=0)


def test_concurrent_batches_of_mixed_keys_neither_deadlock_nor_lose_a_place(
    fair: Engine, db_url: str
) -> None:
    """Four connections complete batches holding two keys' tasks in opposite orders; every
    place comes back and every run completes."""
    for n in range(40):
        start(fair, "a" if n % 2 else "b", n)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(reverse: bool) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            engine = Engine(conn)
            barrier.wait()
            deadline = time.monotonic() + 120  # a bound, not a pace: it ends when all is done
            try:
                while time.monotonic() < deadline:
                    tasks = engine.poll("fair", qty=2)
                    if not tasks:
                        if engine.value(
                            "select count(*) from pgflow.runs where status = 'started'"
                        ):
                            continue
                        return
                    tasks.sort(key=lambda t: str(t.run_id), reverse=reverse)
                    engine.complete_batch(tasks, [1] * len(tasks))
            except BaseException as exc:  # reported below
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert fair.value("select count(*) from pgflow.runs where status <> 'completed'") == 0
    assert fair.value("select count(*) from pgflow.concurrency_keys") == 0
    assert_consistent(fair)


def test_a_batch_of_runs_parks_a_keyed_root_step_in_input_order(fair: Engine) -> None:
    inputs = [Jsonb({"tenant": "b" if n == 3 else "a", "n": n}) for n in range(6)]
    fair.all("select * from pgflow.start_flows('fair', %s::jsonb[])", inputs)

    assert queued_keys(fair) == [("a", 0), ("a", 1), ("b", 3)]
    assert fair.value("select array_agg(p.task_index) from pgflow.parked_tasks as p") == [0, 0, 0]
    assert_consistent(fair)


def test_the_completion_that_frees_a_place_lets_the_same_call_claim_its_successor(
    engine: Engine,
) -> None:
    """complete_and_claim: the parked task gets its message in the completing transaction, so
    the claim in that call takes it (no wait for a commit and a poll)."""
    engine.compile(
        "fair", [{"slug": "call", "options": {**KEYED, "concurrencyLimit": 1}}], options={}
    )
    engine.register("fair__call")
    runs = [start(engine, "a", n) for n in range(3)]
    [first] = engine.all(
        "select run_id, step_slug, task_index, attempt"
        " from pgflow.read_and_claim('fair', 'fair__call', %s, 5, 30, 'call')",
        WORKER_ID,
    )
    [second] = engine.all(
        "select run_id from pgflow.complete_and_claim('fair', 'fair__call', %s, 5, 30, 'call',"
        " %s, %s, %s, %s::jsonb[], %s)",
        WORKER_ID,
        [first["run_id"]],
        ["call"],
        [0],
        [Jsonb(1)],
        [first["attempt"]],
    )
    assert [first["run_id"], second["run_id"]] == runs[:2]
    assert_consistent(engine)


def test_a_lower_limit_lets_running_tasks_finish_and_admits_none_until_below_it(
    fair: Engine,
) -> None:
    for n in range(5):
        start(fair, "a", n)
    compile_keyed(fair, concurrencyKey="$.tenant", concurrencyLimit=1)
    tasks = fair.poll("fair", qty=10)
    assert [t.step_slug for t in tasks] == ["call", "call"]  # admitted under the old limit
    fair.complete(tasks[0], 1)
    assert queued_keys(fair) == [("a", 1)]  # 1 left, at the new limit: nothing admitted
    fair.complete(tasks[1], 1)
    assert queued_keys(fair) == [("a", 2)]
    assert_consistent(fair)


def test_deleting_a_flow_takes_its_parked_tasks_and_keys(fair: Engine) -> None:
    for n in range(5):
        start(fair, "a", n)
    assert fair.value("select count(*) from pgflow.parked_tasks") == 3

    fair.call("delete_flow_and_data", "fair")

    assert fair.value("select count(*) from pgflow.parked_tasks") == 0
    assert fair.value("select count(*) from pgflow.concurrency_keys") == 0


def test_a_session_that_clears_the_setting_before_it_commits_still_settles(fair: Engine) -> None:
    """Engine 0019: the commit-time settlement does not trust pgflow.concurrency_events, which
    any session may set; its own transaction's events decide."""
    runs = [start(fair, "a", n) for n in range(3)]
    assert queued_keys(fair) == [("a", 0), ("a", 1)]
    with fair.conn.transaction():
        fair.call("cancel_run", runs[0])  # frees a place when the transaction commits
        fair.conn.execute("select set_config('pgflow.concurrency_events', '', true)")
    assert queued_keys(fair) == [("a", 1), ("a", 2)]
    assert_consistent(fair)
