"""send_signal: a signal step waits, runs no task, and completes with the payload it is sent as
its output; a signal sent before its step is ready is kept until it is; a second signal, a payload
that does not match the step's schema, a step that is not a signal step and a run that is not
started are refused and change nothing."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "by": {"type": "string"}},
    "required": ["approved"],
}


def approval_flow(engine: Engine, mode: str = "flow", **approval: Any) -> str:
    """draft -> approval (a signal step) -> publish."""
    engine.compile(
        "review",
        [
            {"slug": "draft"},
            {"slug": "approval", "deps": ["draft"], "stepType": "signal", "payloadSchema": APPROVAL,
             **approval},
            {"slug": "publish", "deps": ["approval"]},
        ],
        mode=mode,
    )  # fmt: skip
    return "review"


def signals(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.all("select * from pgflow.signals where run_id = %s", run_id)


def test_a_waiting_step_completes_with_the_payload_and_the_run_moves_on(engine: Engine) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    [draft] = engine.poll("review")
    engine.complete(draft, "text")
    waiting = engine.state(run_id, "approval")
    assert (waiting["status"], waiting["remaining_tasks"]) == ("started", 1)
    assert engine.tasks(run_id, "approval") == []  # no task, no message
    assert engine.poll("review") == []

    [signal] = engine.call("send_signal", run_id, "approval", {"approved": True, "by": "ada"})

    assert signal["used_at"] is not None
    assert engine.state(run_id, "approval")["status"] == "completed"
    assert engine.state(run_id, "approval")["output"] == {"approved": True, "by": "ada"}
    [publish] = engine.poll("review")
    assert publish.input == {"approval": {"approved": True, "by": "ada"}}
    engine.complete(publish, "published")
    assert engine.run(run_id)["status"] == "completed"


def test_a_signal_sent_early_is_kept_until_its_step_is_ready(engine: Engine) -> None:
    approval_flow(engine)
    run_id = engine.start("review")

    [signal] = engine.call("send_signal", run_id, "approval", {"approved": False})

    assert signal["used_at"] is None
    assert engine.state(run_id, "approval")["status"] == "created"
    [draft] = engine.poll("review")
    engine.complete(draft, "text")
    # The step took the kept signal the moment it became ready: publish is queued at once.
    assert engine.state(run_id, "approval")["output"] == {"approved": False}
    assert signals(engine, run_id)[0]["used_at"] is not None
    [publish] = engine.poll("review")
    assert publish.step_slug == "publish"


def test_a_root_signal_step_waits_from_the_start(engine: Engine) -> None:
    engine.compile(
        "gate",
        [{"slug": "go", "stepType": "signal"}, {"slug": "then", "deps": ["go"]}],
        mode="flow",
    )
    run_id = engine.start("gate")
    assert engine.state(run_id, "go")["status"] == "started"
    engine.call("send_signal", run_id, "go", Jsonb([1, 2]))  # no schema: any JSON
    [then] = engine.poll("gate")
    assert then.input == {"go": [1, 2]}


@pytest.mark.parametrize("early", [True, False])
def test_a_second_signal_is_refused_and_changes_nothing(engine: Engine, early: bool) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    if not early:
        [draft] = engine.poll("review")
        engine.complete(draft, "text")
    engine.call("send_signal", run_id, "approval", {"approved": True})
    before = (signals(engine, run_id), engine.state(run_id, "approval"))

    with pytest.raises(psycopg.errors.UniqueViolation) as refused:
        engine.call("send_signal", run_id, "approval", {"approved": False})

    assert refused.value.diag.message_primary is not None
    assert refused.value.diag.message_primary.startswith(
        f'Step "approval" of run {run_id} has its signal already (received at '
    )
    assert (signals(engine, run_id), engine.state(run_id, "approval")) == before


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        ({"by": "ada"}, '$: "approved" is required'),
        ({"approved": "yes"}, "$.approved: expected boolean, got string"),
        ("approved", "$: expected object, got string"),
    ],
)
def test_a_payload_that_does_not_match_the_schema_is_refused(
    engine: Engine, payload: Any, detail: str
) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    [draft] = engine.poll("review")
    engine.complete(draft, "text")

    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        engine.call("send_signal", run_id, "approval", Jsonb(payload))

    assert refused.value.diag.message_primary == (
        'The payload does not match the schema of signal step "approval" of flow "review".'
    )
    assert refused.value.diag.message_detail == detail
    assert signals(engine, run_id) == []
    assert engine.state(run_id, "approval")["status"] == "started"


def test_a_step_that_is_not_a_signal_step_is_refused(engine: Engine) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        engine.call("send_signal", run_id, "draft", {"approved": True})
    assert (
        refused.value.diag.message_detail
        == '"draft" is a single step: its tasks report its output.'
    )
    assert (
        refused.value.diag.message_hint
        == 'Its signal steps: "approval" (slugs are case-sensitive).'
    )
    with pytest.raises(psycopg.errors.NoDataFound, match='has no signal step "Approval"'):
        engine.call("send_signal", run_id, "Approval", {"approved": True})
    with pytest.raises(psycopg.errors.NoDataFound, match="does not exist"):
        engine.call("send_signal", uuid.uuid4(), "approval", {"approved": True})
    assert signals(engine, run_id) == []


@pytest.mark.parametrize("finish", ["cancel", "fail"])
def test_a_run_that_is_not_started_takes_no_signal(engine: Engine, finish: str) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    if finish == "cancel":
        engine.call("cancel_run", run_id)
    else:
        engine.conn.execute("update pgflow.flows set opt_max_attempts = 1")
        [draft] = engine.poll("review")
        engine.fail(draft)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="so it takes no signal"):
        engine.call("send_signal", run_id, "approval", {"approved": True})
    assert signals(engine, run_id) == []


def test_a_skipped_signal_step_takes_no_signal(engine: Engine) -> None:
    approval_flow(
        engine, requiredInputPattern={"defined": True, "value": {"draft": "needs review"}}
    )
    run_id = engine.start("review")
    [draft] = engine.poll("review")
    engine.complete(draft, "fine as it is")
    assert engine.state(run_id, "approval")["status"] == "skipped"
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        engine.call("send_signal", run_id, "approval", {"approved": True})
    assert refused.value.diag.message_detail == "condition_unmet"


def test_a_signal_is_one_event(engine: Engine, db_url: str) -> None:
    approval_flow(engine)
    run_id = engine.start("review")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"listen pgflow_run_{run_id.hex}")
        engine.call("send_signal", run_id, "approval", {"approved": True})
        events = [json.loads(n.payload) for n in listener.notifies(timeout=10, stop_after=1)]
    assert [(e["event"], e["step_slug"], e["status"]) for e in events] == [
        ("signal:received", "approval", "created")
    ]


def test_in_step_mode_a_signal_step_has_no_queue_and_needs_no_worker(engine: Engine) -> None:
    approval_flow(engine, mode="step")
    queues = {row["queue_name"] for row in engine.all("select queue_name from pgmq.list_queues()")}
    assert queues == {"review__draft", "review__publish"}
    coverage = engine.all("select step_slug from pgflow.queue_coverage()")
    assert [row["step_slug"] for row in coverage] == ["draft", "publish"]
    assert approval_flow(engine, mode="step") == "review"  # verified again, nothing to create

    run_id = engine.start("review")
    [draft] = engine.poll("review", queue="review__draft", step="draft")
    engine.complete(draft, "text")
    engine.call("send_signal", run_id, "approval", {"approved": True})
    [publish] = engine.poll("review", queue="review__publish", step="publish")
    engine.complete(publish, "done")
    assert engine.run(run_id)["output"] == {"publish": "done"}


def test_a_signal_step_cannot_be_paused(engine: Engine) -> None:
    approval_flow(engine)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is a signal step"):
        engine.call("pause_step", "review", "approval", "no")
    assert engine.value("select count(*) from pgflow.step_pauses") == 0


def test_a_new_payload_schema_is_adopted_with_the_flow_description(engine: Engine) -> None:
    approval_flow(engine)
    approval_flow(engine, payloadSchema={"type": "string"})
    assert engine.value("select payload_schema from pgflow.steps where step_slug = 'approval'") == {
        "type": "string"
    }
    run_id = engine.start("review")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        engine.call("send_signal", run_id, "approval", {"approved": True})
    engine.call("send_signal", run_id, "approval", Jsonb("approved"))
