"""The operator's actions (`runtime/client/operations`) that the Client, the CLI and the dashboard
all perform, against the real engine: the sync and the async runner give the same typed result
and the same typed refusal for each action, a label is recorded beside the login role, and a
refused action changes and records nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.engine import refusals
from pgflow_gen.errors import PgflowError
from pgflow_gen.runtime import Flow, FlowOptions, Step
from pgflow_gen.runtime.client import RetriedRun, SentSignal, StepPause, operations
from tests.engine import Engine

REVIEW: Flow[Any, Any, Any] = Flow(
    slug="review",
    options=FlowOptions(max_attempts=1),
    steps=(Step(slug="draft"), Step(slug="approval", step_type="signal", dependencies=("draft",))),
)


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    conn.execute("select pgflow.ensure_flow_compiled('review', %s)", (Jsonb(REVIEW.shape()),))
    return Engine(conn)


def both(db_url: str, make: Any, label: str | None = None) -> list[Any]:
    """Perform the action `make()` builds once with each runner, each on a fresh connection:
    the two results, or the two typed errors."""
    outcomes: list[Any] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        try:
            outcomes.append(operations.perform(conn, make(), label=label))
        except PgflowError as error:
            outcomes.append(error)

    async def run_async() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            try:
                outcomes.append(await operations.perform_async(aconn, make(), label=label))
            except PgflowError as error:
                outcomes.append(error)

    asyncio.run(run_async())
    return outcomes


def test_a_refusal_is_the_same_typed_error_from_either_runner(engine: Engine, db_url: str) -> None:
    nowhere = uuid.UUID(int=1)
    for make, kind in [
        (lambda: operations.cancel_run(nowhere), refusals.RunNotFoundError),
        (lambda: operations.retry_run(nowhere), refusals.RunNotFoundError),
        (lambda: operations.pause_step("review", "nope"), refusals.StepNotFoundError),
        (lambda: operations.pause_step("nope", "draft"), refusals.FlowNotFoundError),
        (
            lambda: operations.set_step_limits("review", "approval", 2, None, None),
            refusals.InvalidStepLimitsError,
        ),
        (
            lambda: operations.set_step_limits("review", "draft", 0, None, None),
            refusals.InvalidStepLimitsError,
        ),
    ]:
        sync, in_async = both(db_url, make)
        assert (type(sync), type(in_async)) == (kind, kind), (sync, in_async)
        assert (sync.message, sync.hint) == (in_async.message, in_async.hint)


def test_retry_of_a_started_run_is_refused_and_changes_nothing(engine: Engine, db_url: str) -> None:
    run_id = engine.start("review")
    sync, in_async = both(db_url, lambda: operations.retry_run(run_id), label="test")
    assert isinstance(sync, refusals.RunNotFailedError)
    assert isinstance(in_async, refusals.RunNotFailedError)
    assert engine.conn.execute("select count(*) from pgflow.operator_actions").fetchone() == (0,)
    row = engine.conn.execute(
        "select status, retry_count from pgflow.runs where run_id = %s", (run_id,)
    ).fetchone()
    assert row == ("started", 0)


def test_each_runner_gives_the_typed_result(engine: Engine, db_url: str) -> None:
    paused = both(db_url, lambda: operations.pause_step("review", "draft", "deploy"))
    assert [type(p) for p in paused] == [StepPause, StepPause]
    assert [(p.step_slug, p.reason) for p in paused] == [("draft", "deploy")] * 2

    resumed = both(db_url, lambda: operations.resume_step("review", "draft"))
    assert resumed == [0, 0]  # nothing was held; the second finds the step not paused

    run_id = engine.start("review")
    [draft] = engine.poll("review")
    engine.complete(draft, {})
    sent, refused = both(
        db_url, lambda: operations.send_signal(run_id, "approval", {"approved": True})
    )
    assert isinstance(sent, SentSignal)
    assert sent.used_at is not None
    assert isinstance(refused, refusals.SignalRefusedError)  # it has its signal already

    failing = engine.start("review")
    [task] = engine.poll("review")
    engine.fail(task, "boom")
    retried, again = both(db_url, lambda: operations.retry_run(failing))
    assert retried == RetriedRun(
        run_id=failing, flow_slug="review", status="started", retry_count=1
    )
    assert isinstance(again, refusals.RunNotFailedError)

    cancelled, twice = both(db_url, lambda: operations.cancel_run(failing, "done"))
    assert cancelled == failing
    assert isinstance(twice, refusals.RunFinishedError)


def test_a_label_is_recorded_beside_the_login_role(engine: Engine, db_url: str) -> None:
    run_id = engine.start("review")
    [cancelled, _] = both(db_url, lambda: operations.cancel_run(run_id), label="ops (here)")
    assert cancelled == run_id
    rows = engine.conn.execute(
        "select action, label, actor = current_user from pgflow.operator_actions"
    ).fetchall()
    assert rows == [("cancel", "ops (here)", True)]


def test_a_payload_that_is_not_json_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(refusals.InvalidSignalPayloadError, match="not JSON-serialisable"):
        operations.send_signal(uuid.UUID(int=1), "approval", {"when": object()})
