"""complete_and_claim: a worker's results and its next claim in one call: completes as
complete_tasks does, then reads and claims as read_and_claim does, in one transaction."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask as Task
from tests.engine import WORKER_ID, Engine

Notice = tuple[str, str]


def complete_and_claim(
    engine: Engine,
    flow: str,
    done: list[Task],
    outputs: list[Any],
    qty: int = 10,
    queue: str | None = None,
    step: str | None = None,
) -> tuple[list[Task], list[Notice]]:
    """The call with its notices' (message, detail)."""
    queue = queue or flow.lower()
    notices: list[Notice] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append((diag.message_primary or "", diag.message_detail or ""))

    engine.register(queue)
    engine.conn.add_notice_handler(heard)
    try:
        rows = engine.conn.execute(
            "select * from pgflow.complete_and_claim(%s, %s, %s, %s, 30, %s, %s, %s, %s,"
            " %s::jsonb[], %s::int[])",
            (
                flow,
                queue,
                WORKER_ID,
                qty,
                step,
                [t.run_id for t in done],
                [t.step_slug for t in done],
                [t.task_index for t in done],
                [Jsonb(o) for o in outputs],
                [t.attempt for t in done],
            ),
        ).fetchall()
    finally:
        engine.conn.remove_notice_handler(heard)
    return [Task(*row) for row in rows], notices


CHAIN = ({"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})


def test_it_completes_the_results_and_claims_what_they_started(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    runs = [engine.start("chain", {"n": n}) for n in range(2)]
    first = engine.poll("chain")
    assert [t.step_slug for t in first] == ["first", "first"]

    claimed, notices = complete_and_claim(engine, "chain", first, ["a", "b"])

    assert notices == []
    assert all(engine.task(r, "first")["status"] == "completed" for r in runs)
    assert not {m["msg_id"] for m in engine.queued_messages("chain")} & {t.msg_id for t in first}
    assert engine.archived_ids("chain") == set()
    # The second steps started by the completion are claimed in the same call.
    assert sorted((t.run_id, t.step_slug, t.attempt) for t in claimed) == sorted(
        (r, "second", 1) for r in runs
    )
    assert {t.run_id: t.input for t in claimed} == {
        runs[0]: {"first": "a"},
        runs[1]: {"first": "b"},
    }
    done, _ = complete_and_claim(engine, "chain", claimed, ["x", "y"])
    assert done == []
    assert [engine.run(r)["status"] for r in runs] == ["completed", "completed"]


def test_it_claims_from_a_step_queue_with_the_step_selector(engine: Engine) -> None:
    engine.compile("stepped", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], mode="step")
    run_id = engine.start("stepped")
    engine.start("stepped")
    [one] = engine.poll("stepped", "stepped__a", qty=1, step="a")

    claimed, _ = complete_and_claim(engine, "stepped", [one], [1], queue="stepped__a", step="a")

    assert [t.step_slug for t in claimed] == ["a"]  # the other run's; b has its own queue
    assert engine.task(run_id, "a")["status"] == "completed"
    assert len(engine.queued_messages("stepped__b")) == 1


def test_a_stale_result_changes_nothing_and_is_named(engine: Engine) -> None:
    engine.flow("solo", {"slug": "only"})
    run_id = engine.start("solo")
    [task] = engine.poll("solo")
    engine.fail(task, "lost the connection", fenced=True)  # retried: attempt 1 is stale now
    engine.make_visible("solo")
    [retry] = engine.poll("solo")
    assert retry.attempt == 2

    claimed, notices = complete_and_claim(engine, "solo", [task], ["late"])

    assert claimed == []
    [(message, detail)] = [n for n in notices if n[0].startswith("complete_and_claim")]
    assert message == "complete_and_claim ignored 1 result(s)."
    assert json.loads(detail) == {"ignored_results": [[1, 2, "started"]]}
    assert engine.task(run_id, "only")["status"] == "started"


def test_a_refused_result_changes_nothing_and_claims_nothing(engine: Engine) -> None:
    engine.flow("pair", {"slug": "one"}, {"slug": "two"})
    run_id = engine.start("pair")
    engine.start("pair")
    tasks = engine.poll("pair", qty=2)
    unknown = dataclasses.replace(tasks[1], task_index=7)  # no such task

    with pytest.raises(psycopg.errors.NoDataFound, match="Task 7"):
        complete_and_claim(engine, "pair", [tasks[0], unknown], [1, 2])

    assert engine.task(run_id, tasks[0].step_slug)["status"] == "started"
    assert len(engine.poll("pair")) == 2  # the other run's messages were not read


def test_a_zero_quantity_completes_and_reads_nothing(engine: Engine) -> None:
    engine.flow("chain", *CHAIN)
    run_id = engine.start("chain")
    [task] = engine.poll("chain")

    claimed, _ = complete_and_claim(engine, "chain", [task], ["a"], qty=0)

    assert claimed == []
    assert engine.task(run_id, "first")["status"] == "completed"
    [second] = engine.poll("chain")
    assert second.step_slug == "second"
