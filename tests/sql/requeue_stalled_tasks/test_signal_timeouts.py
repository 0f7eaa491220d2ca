"""A signal step waits at most its timeout: the stall-recovery sweep fails it (and its run), or
skips it with when_exhausted skip or skip-cascade, once the timeout has passed; send_signal
refuses a signal for a wait that ran out even before the sweep. A step without a timeout waits
for ever, and a retried run waits anew."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def waiting(engine: Engine, timeout: int | None = 60, **approval: Any) -> uuid.UUID:
    """A run of draft -> approval (a signal step) -> publish whose approval waits now."""
    options = {} if timeout is None else {"options": {"timeout": timeout}}
    engine.compile(
        "review",
        [
            {"slug": "draft"},
            {"slug": "approval", "deps": ["draft"], "stepType": "signal", **options, **approval},
            {"slug": "publish", "deps": ["approval"]},
        ],
        mode="flow",
    )
    run_id = engine.start("review")
    [draft] = engine.poll("review")
    engine.complete(draft, "text")
    return run_id


def age(engine: Engine, run_id: uuid.UUID, seconds: int) -> None:
    engine.conn.execute(
        "update pgflow.step_states set started_at = now() - make_interval(secs => %s)"
        " where run_id = %s and step_slug = 'approval'",
        (seconds, run_id),
    )


def test_a_wait_that_ran_out_fails_the_step_and_the_run(engine: Engine) -> None:
    run_id = waiting(engine, timeout=60)
    age(engine, run_id, 59)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    assert engine.state(run_id, "approval")["status"] == "started"

    age(engine, run_id, 61)
    engine.value("select pgflow.requeue_stalled_tasks()")

    state = engine.state(run_id, "approval")
    assert (state["status"], state["error_message"]) == (
        "failed",
        "No signal came within 60 s, the step's timeout.",
    )
    assert engine.run(run_id)["status"] == "failed"


@pytest.mark.parametrize("mode", ["skip", "skip-cascade"])
def test_a_wait_that_ran_out_skips_the_step_when_asked(engine: Engine, mode: str) -> None:
    run_id = waiting(engine, timeout=60, whenExhausted=mode)
    age(engine, run_id, 61)
    engine.value("select pgflow.requeue_stalled_tasks()")

    state = engine.state(run_id, "approval")
    assert (state["status"], state["skip_reason"]) == ("skipped", "signal_timed_out")
    if mode == "skip":
        [publish] = engine.poll("review")
        assert publish.input == {}
        engine.complete(publish, "anyway")
        assert engine.run(run_id)["status"] == "completed"
    else:
        assert engine.state(run_id, "publish")["skip_reason"] == "dependency_skipped"
        assert engine.run(run_id)["status"] == "completed"


def test_a_signal_for_a_wait_that_ran_out_is_refused_before_the_sweep(engine: Engine) -> None:
    run_id = waiting(engine, timeout=60)
    age(engine, run_id, 61)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        engine.call("send_signal", run_id, "approval", {"ok": True})
    assert refused.value.diag.message_detail == (
        "It waits 60 s for its signal; the next stall-recovery sweep fails it."
    )
    assert engine.value("select count(*) from pgflow.signals") == 0
    assert engine.state(run_id, "approval")["status"] == "started"


def test_a_step_without_a_timeout_waits_for_ever(engine: Engine) -> None:
    run_id = waiting(engine, timeout=None)
    age(engine, run_id, 10 * 365 * 24 * 3600)
    engine.value("select pgflow.requeue_stalled_tasks()")
    assert engine.state(run_id, "approval")["status"] == "started"
    engine.call("send_signal", run_id, "approval", {"ok": True})
    assert engine.state(run_id, "approval")["status"] == "completed"


def test_a_run_failed_by_a_wait_waits_anew_when_retried(engine: Engine) -> None:
    run_id = waiting(engine, timeout=60)
    age(engine, run_id, 61)
    engine.value("select pgflow.requeue_stalled_tasks()")
    assert engine.run(run_id)["status"] == "failed"

    engine.call("retry_run", run_id)

    state = engine.state(run_id, "approval")
    assert (state["status"], state["error_message"]) == ("started", None)
    engine.call("send_signal", run_id, "approval", {"ok": True})
    [publish] = engine.poll("review")
    engine.complete(publish, "late but fine")
    assert engine.run(run_id)["status"] == "completed"


def test_a_run_locked_by_someone_else_is_left_for_the_next_sweep(
    engine: Engine, db_url: str
) -> None:
    run_id = waiting(engine, timeout=60)
    age(engine, run_id, 61)
    with psycopg.connect(db_url) as other:
        other.execute("select 1 from pgflow.runs where run_id = %s for update", (run_id,))
        engine.value("select pgflow.requeue_stalled_tasks()")
        assert engine.state(run_id, "approval")["status"] == "started"
    engine.value("select pgflow.requeue_stalled_tasks()")
    assert engine.state(run_id, "approval")["status"] == "failed"
