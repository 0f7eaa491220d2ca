"""The Client's retry_run and send_signal against the real engine: a failed run retried runs again
and `wait` sees it finish; a signal completes its waiting step, typed by the flow's `Signals`;
every refusal is a typed error that changes nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, Final

import psycopg
import pytest
from psycopg.types.json import Jsonb
from typing_extensions import TypedDict

from pgflow_gen.runtime import (
    Client,
    Flow,
    FlowOptions,
    InvalidSignalPayloadError,
    RunNotFailedError,
    RunNotForkableError,
    RunNotFoundError,
    Signal,
    SignalRefusedError,
    Step,
    StepNotFoundError,
    StepOptions,
)
from tests.engine import Engine


class ApprovalPayload(TypedDict):
    approved: bool


class Signals:
    approval: Final[Signal[ApprovalPayload]] = Signal("approval")


REVIEW: Flow[Any, Any, Any, Signals] = Flow(
    slug="reviewDoc",
    options=FlowOptions(max_attempts=1),
    steps=(
        Step(slug="draft"),
        Step(
            slug="approval",
            step_type="signal",
            dependencies=("draft",),
            options=StepOptions(timeout=3600),
            payload_schema={
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            },
        ),
        Step(slug="publish", dependencies=("approval",)),
    ),
    signals=Signals(),
)


@pytest.fixture
def client(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Client]:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (REVIEW.slug, Jsonb(REVIEW.shape())))
    with Client(db_url) as client:
        yield client


def test_a_failed_run_retried_runs_again_and_wait_sees_it_complete(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    engine = Engine(conn)
    run = client.start_flow(REVIEW, {})
    [draft] = engine.poll("reviewDoc")
    engine.fail(draft, "ValueError: no text")
    failed = client.get_run(run.run_id)
    assert (failed.status, failed.retry_count) == ("failed", 0)

    retried = client.retry_run(run.run_id)

    assert (retried.status, retried.retry_count, retried.failure) == ("started", 1, None)
    assert retried.retried_at is not None
    finished: list[Any] = []
    waiter = threading.Thread(target=lambda: finished.append(retried.wait(timeout=30)))
    waiter.start()
    [draft] = engine.poll("reviewDoc")
    engine.complete(draft, "text")
    client.send_signal(run.run_id, REVIEW.signals.approval, ApprovalPayload(approved=True))
    [publish] = engine.poll("reviewDoc")
    engine.complete(publish, "out")
    waiter.join(timeout=60)
    assert [r.status for r in finished] == ["completed"]


def test_retrying_a_run_that_is_not_failed_is_a_typed_error(client: Client) -> None:
    run = client.start_flow(REVIEW, {})
    with pytest.raises(RunNotFailedError) as refused:
        client.retry_run(run.run_id)
    assert (
        refused.value.message == f"Run {run.run_id} is started; only a failed run can be retried."
    )
    assert refused.value.hint == "Nothing was changed."
    with pytest.raises(RunNotFoundError):
        client.retry_run(uuid.uuid4())


def test_a_signal_completes_its_waiting_step(client: Client, conn: psycopg.Connection[Any]) -> None:
    engine = Engine(conn)
    run = client.start_flow(REVIEW, {})
    [draft] = engine.poll("reviewDoc")
    engine.complete(draft, "text")
    [waiting] = run.waiting_signals()
    assert waiting.step_slug == "approval"
    assert waiting.deadline is not None
    assert (waiting.deadline - waiting.waiting_since).total_seconds() == 3600

    sent = client.send_signal(run.run_id, REVIEW.signals.approval, ApprovalPayload(approved=True))

    assert (sent.run_id, sent.step_slug, sent.payload) == (
        run.run_id,
        "approval",
        {"approved": True},
    )
    assert sent.used_at is not None
    assert run.waiting_signals() == []
    [publish] = engine.poll("reviewDoc")
    assert publish.input == {"approval": {"approved": True}}


def test_a_signal_sent_early_is_kept(client: Client) -> None:
    run = client.start_flow(REVIEW, {})
    sent = client.send_signal(run.run_id, "approval", {"approved": False})
    assert sent.used_at is None
    assert run.waiting_signals() == []  # not ready yet, so not waiting either


def test_every_refused_signal_is_a_typed_error_and_changes_nothing(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    run = client.start_flow(REVIEW, {})
    with pytest.raises(InvalidSignalPayloadError) as invalid:
        client.send_signal(run.run_id, "approval", {"approved": "yes"})
    assert invalid.value.detail == "$.approved: expected boolean, got string"
    with pytest.raises(InvalidSignalPayloadError, match="not JSON-serialisable"):
        client.send_signal(run.run_id, "approval", {"approved": object()})
    with pytest.raises(StepNotFoundError) as not_a_signal:
        client.send_signal(run.run_id, "draft", {"approved": True})
    assert not_a_signal.value.hint == 'Its signal steps: "approval" (slugs are case-sensitive).'
    with pytest.raises(StepNotFoundError):
        client.send_signal(run.run_id, "aproval", {"approved": True})
    with pytest.raises(RunNotFoundError):
        client.send_signal(uuid.uuid4(), "approval", {"approved": True})
    assert conn.execute("select count(*) from pgflow.signals").fetchone() == (0,)

    client.send_signal(run.run_id, "approval", {"approved": True})
    with pytest.raises(SignalRefusedError, match="has its signal already"):
        client.send_signal(run.run_id, "approval", {"approved": False})
    client.cancel_run(run.run_id)
    with pytest.raises(SignalRefusedError, match="is cancelled, so it takes no signal"):
        client.send_signal(run.run_id, "approval", {"approved": False})
    assert conn.execute("select count(*) from pgflow.signals").fetchone() == (1,)


def test_fork_run_starts_a_new_run_from_a_step_and_refusals_are_typed(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    engine = Engine(conn)
    run = client.start_flow(REVIEW, {})
    [draft] = engine.poll("reviewDoc")
    engine.complete(draft, "text")
    with pytest.raises(RunNotForkableError) as refused:  # approval waits: it cannot be copied
        client.fork_run(run.run_id, "publish")
    assert refused.value.message == (
        f'Run {run.run_id} cannot be forked from step "publish": step "approval", which it would'
        " copy, is started."
    )
    with pytest.raises(StepNotFoundError):
        client.fork_run(run.run_id, "publsh")
    with pytest.raises(RunNotFoundError):
        client.fork_run(uuid.uuid4(), "draft")

    forked = client.fork_run(run.run_id, "approval")

    assert (forked.flow_slug, forked.status, forked.input) == ("reviewDoc", "started", {})
    assert forked.run_id != run.run_id
    assert [w.step_slug for w in forked.waiting_signals()] == ["approval"]  # waits anew
