"""Sending results to the real engine: batches of successes, one bad output among them, failures."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from pgflow_gen.runtime.worker.results import send_reports
from pgflow_gen.runtime.worker.task_runner import Report
from tests.engine import WORKER_ID, Engine

LOG = logging.getLogger("tests.reporting")


def send(db_url: str, reports: list[Report]) -> list[Report]:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await send_reports(PsycopgSession(conn), reports, LOG)

    asyncio.run(go())
    return reports


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    engine = Engine(conn)
    engine.flow("fanIn", {"slug": "work", "max_attempts": 1})
    return engine


def test_successes_are_completed_together_and_leave_the_list(engine: Engine, db_url: str) -> None:
    run_ids = [engine.start("fanIn", {"n": n}) for n in range(3)]
    tasks = engine.poll("fanIn")
    reports = [Report(task, output={"n": i}) for i, task in enumerate(tasks)]

    assert send(db_url, reports) == []
    for run_id in run_ids:
        assert engine.run(run_id)["status"] == "completed"


def test_an_output_the_engine_refuses_fails_only_its_own_task(
    engine: Engine, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_ids = [engine.start("fanIn", {"n": n}) for n in range(3)]
    tasks = sorted(engine.poll("fanIn"), key=lambda t: run_ids.index(t.run_id))
    # JSON allows \u0000 in a string, PostgreSQL's jsonb does not: the whole batch is refused.
    outputs = ["fine", "nul \x00 byte", "also fine"]
    reports = [Report(task, output=out) for task, out in zip(tasks, outputs, strict=True)]

    assert send(db_url, reports) == []
    good, bad, other = (engine.run(run_id) for run_id in run_ids)
    assert (good["status"], other["status"]) == ("completed", "completed")
    assert bad["status"] == "failed"
    message = engine.task(run_ids[1], "work")["error_message"]
    assert message.startswith("The engine refused the handler's output:")
    assert "\x00" not in caplog.text


def test_failures_are_reported_one_by_one_between_successes(engine: Engine, db_url: str) -> None:
    run_ids = [engine.start("fanIn", {"n": n}) for n in range(4)]
    tasks = sorted(engine.poll("fanIn"), key=lambda t: run_ids.index(t.run_id))
    reports = [
        Report(tasks[0], output=0),
        Report(tasks[1], output=1),
        Report(tasks[2], error="handler raised"),
        Report(tasks[3], output=3),
    ]

    assert send(db_url, reports) == []
    statuses = [engine.run(run_id)["status"] for run_id in run_ids]
    assert statuses == ["completed", "completed", "failed", "completed"]
    assert engine.task(run_ids[2], "work")["error_message"] == "handler raised"


def test_a_report_for_a_task_that_does_not_exist_is_logged_and_dropped(
    engine: Engine, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = engine.start("fanIn", {"n": 1})
    [task] = engine.poll("fanIn")
    ghost = dataclasses.replace(task, step_slug="gone", msg_id=0)

    with caplog.at_level(logging.ERROR, logger=LOG.name):
        assert send(db_url, [Report(ghost, output=1), Report(task, output=2)]) == []
    assert 'Task 0 of step "gone"' in caplog.text
    assert engine.run(run_id)["status"] == "completed"


def test_a_stale_result_is_logged_once_and_changes_nothing(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker lost its connection after sending; the task was retried and claimed again.
    engine = Engine(conn)
    engine.flow("resend", {"slug": "work", "base_delay": 0}, max_attempts=3)
    run_ids = [engine.start("resend", {"n": n}) for n in range(2)]
    first = sorted(engine.poll("resend"), key=lambda t: run_ids.index(t.run_id))
    engine.fail(first[0], "lost reply", fenced=True)
    [retry] = engine.poll("resend")

    with caplog.at_level(logging.WARNING, logger=LOG.name):
        resent = [Report(first[0], error="lost reply"), Report(first[0], output="late")]
        assert send(db_url, [*resent, Report(first[1], output="fine")]) == []

    stale = [r.getMessage() for r in caplog.records if "ignored the" in r.getMessage()]
    key = f"{retry.run_id}/work[0] attempt 1: the task is on attempt 2 (started) since"
    assert stale == [
        f"ignored the failure of task {key}; a result of an earlier attempt changes nothing",
        f"ignored the result of task {key}; a result of an earlier attempt changes nothing",
    ]
    assert engine.task(retry.run_id, "work")["status"] == "started"
    assert engine.run(run_ids[1])["status"] == "completed"


def test_a_stale_result_inside_a_batch_is_logged_and_the_rest_complete(
    conn: psycopg.Connection[Any], db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(conn)
    engine.flow("resend", {"slug": "work", "base_delay": 0}, max_attempts=3)
    run_ids = [engine.start("resend", {"n": n}) for n in range(3)]
    tasks = sorted(engine.poll("resend"), key=lambda t: run_ids.index(t.run_id))
    engine.fail(tasks[1], "lost reply", fenced=True)
    engine.poll("resend")

    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert send(db_url, [Report(task, output=i) for i, task in enumerate(tasks)]) == []

    assert [engine.run(r)["status"] for r in run_ids] == ["completed", "started", "completed"]
    assert sum("ignored the result of task" in r.getMessage() for r in caplog.records) == 1


def test_a_failure_message_the_engine_cannot_store_is_stored_made_storable(
    engine: Engine, db_url: str
) -> None:
    run_id = engine.start("fanIn", {"n": 1})
    [task] = engine.poll("fanIn")

    assert send(db_url, [Report(task, error="ValueError: a NUL \x00 in the message")]) == []
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "work")["error_message"] == "ValueError: a NUL \\0 in the message"


@pytest.mark.parametrize("batch", [False, True])
def test_a_lock_timeout_raises_and_keeps_every_report(
    engine: Engine, db_url: str, batch: bool
) -> None:
    run_ids = [engine.start("fanIn", {"n": n}) for n in range(2)]
    tasks = sorted(engine.poll("fanIn"), key=lambda t: run_ids.index(t.run_id))
    reports = [Report(task, output=i) for i, task in enumerate(tasks)]
    if not batch:
        reports = reports[:1]
    waiting = list(reports)

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("set lock_timeout = '50ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await send_reports(PsycopgSession(conn), reports, LOG)

    with psycopg.connect(db_url) as holder:
        holder.execute("select 1 from pgflow.runs where run_id = %s for update", (run_ids[0],))
        asyncio.run(go())
    assert reports == waiting  # every report kept, none turned into a failure
    assert [engine.run(r)["status"] for r in run_ids] == ["started", "started"]


def test_results_and_the_next_claim_go_in_one_call(engine: Engine, db_url: str) -> None:
    engine.flow("pair", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    run_id = engine.start("pair", {})
    [task] = engine.poll("pair")
    other = engine.start("pair", {})
    [stale] = engine.poll("pair")  # the other run's: failed, then claimed again
    engine.fail(stale, "lost", fenced=True)
    engine.make_visible("pair")
    [again] = engine.poll("pair")
    assert (again.run_id, again.attempt) == (other, 2)

    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            return await PsycopgSession(conn).complete_and_claim(
                [task, stale], ["one", "late"], "pair", "pair", WORKER_ID, 10, 30, None
            )

    done = asyncio.run(go())
    assert done is not None
    # The stale result's row says which attempt the task is on, as complete_tasks's would.
    assert done.rows == [(1, "completed"), (2, "started")]
    assert [(t.run_id, t.step_slug, t.attempt) for t in done.claim.tasks] == [(run_id, "second", 1)]
