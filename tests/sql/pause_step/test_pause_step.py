"""pause_step / resume_step: while a step is paused no task of it starts (its messages are held,
use no attempt, and are named to the worker), started tasks finish and other steps go on; resume
shows exactly the held messages again at once. Both queue modes."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def two_roots(engine: Engine) -> None:
    engine.flow("pair", {"slug": "slow"}, {"slug": "fast"}, base_delay=30)


def notices(engine: Engine) -> list[Any]:
    found: list[Any] = []
    engine.conn.add_notice_handler(
        lambda diag: (
            found.append(json.loads(diag.message_detail or "{}"))
            if (diag.message_primary or "").startswith("claim_tasks held")
            else None
        )
    )
    return found


def test_a_paused_step_starts_no_task_and_the_other_steps_go_on(engine: Engine) -> None:
    two_roots(engine)
    [pause] = engine.call("pause_step", "pair", "slow", "the API is down")
    assert (pause["step_slug"], pause["reason"]) == ("slow", "the API is down")
    heard = notices(engine)
    run_id = engine.start("pair", {})

    claimed = engine.poll("pair")

    assert [t.step_slug for t in claimed] == ["fast"]
    slow = engine.task(run_id, "slow")
    assert (slow["status"], slow["attempts_count"]) == ("queued", 0)
    assert heard == [{"held_message_ids": [slow["message_id"]]}]
    assert engine.all("select queue_name, message_id, step_slug from pgflow.held_messages") == [
        {"queue_name": "pair", "message_id": slow["message_id"], "step_slug": "slow"}
    ]
    hidden_for = engine.value(
        "select extract(epoch from vt - now()) from pgmq.q_pair where msg_id = %s",
        slow["message_id"],
    )
    assert 50 < hidden_for <= 60
    engine.complete(claimed[0], "done")
    assert engine.poll("pair") == []  # the held message stays out of sight
    assert engine.run(run_id)["status"] == "started"


def test_resume_shows_the_held_messages_at_once_and_their_tasks_run(engine: Engine) -> None:
    two_roots(engine)
    engine.call("pause_step", "pair", "slow")
    run_id = engine.start("pair", {})
    [fast] = engine.poll("pair")

    [row] = engine.call("resume_step", "pair", "slow")

    assert row == {"resume_step": 1}
    [slow] = engine.poll("pair")
    assert (slow.step_slug, slow.attempt) == ("slow", 1)
    assert engine.value("select count(*) from pgflow.held_messages") == 0
    assert engine.value("select count(*) from pgflow.step_pauses") == 0
    engine.complete(fast, "f")
    engine.complete(slow, "s")
    assert engine.run(run_id)["status"] == "completed"


def test_a_task_started_before_the_pause_finishes(engine: Engine) -> None:
    two_roots(engine)
    run_id = engine.start("pair", {})
    tasks = {t.step_slug: t for t in engine.poll("pair")}
    engine.call("pause_step", "pair", "slow")
    engine.complete(tasks["slow"], "finished while paused")
    engine.complete(tasks["fast"], "f")
    assert engine.run(run_id)["status"] == "completed"


def test_resume_leaves_a_retry_waiting_for_its_delay(engine: Engine) -> None:
    two_roots(engine)
    retrying = engine.start("pair", {})
    first = {t.step_slug: t for t in engine.poll("pair")}
    engine.fail(first["slow"], "try again in 30 s")  # base_delay 30: hidden for a while
    waiting = engine.start("pair", {})
    engine.call("pause_step", "pair", "slow")
    engine.poll("pair")  # holds the new run's slow message, claims its fast one

    [row] = engine.call("resume_step", "pair", "slow")

    assert row == {"resume_step": 1}
    [shown] = [t for t in engine.poll("pair") if t.step_slug == "slow"]
    assert shown.run_id == waiting
    assert engine.task(retrying, "slow")["status"] == "queued"  # still waiting for its delay


def test_a_step_of_a_step_queued_flow_pauses_on_its_own_queue(engine: Engine) -> None:
    engine.compile("queued", [{"slug": "a"}, {"slug": "b"}])
    engine.call("pause_step", "queued", "a")
    engine.start("queued", {})
    assert engine.poll("queued", queue="queued__a", step="a") == []
    assert [t.step_slug for t in engine.poll("queued", queue="queued__b", step="b")] == ["b"]
    engine.call("resume_step", "queued", "a")
    assert [t.step_slug for t in engine.poll("queued", queue="queued__a", step="a")] == ["a"]


def test_pausing_twice_keeps_the_start_and_takes_the_new_reason(engine: Engine) -> None:
    two_roots(engine)
    [first] = engine.call("pause_step", "pair", "slow", "one")
    [second] = engine.call("pause_step", "pair", "slow", "two")
    assert (second["paused_at"], second["reason"]) == (first["paused_at"], "two")
    assert engine.call("resume_step", "pair", "slow") == [{"resume_step": 0}]
    assert engine.call("resume_step", "pair", "slow") == [{"resume_step": 0}]  # not paused


@pytest.mark.parametrize(
    ("flow", "step", "message"),
    [
        ("nope", "slow", 'Flow "nope" does not exist.'),
        ("pair", "Slow", 'Flow "pair" has no step "Slow".'),
    ],
)
@pytest.mark.parametrize("function", ["pause_step", "resume_step"])
def test_an_unknown_flow_or_step_is_no_data_found(
    engine: Engine, function: str, flow: str, step: str, message: str
) -> None:
    two_roots(engine)
    with pytest.raises(psycopg.errors.NoDataFound) as refused:
        engine.call(function, flow, step)
    assert refused.value.diag.message_primary == message
    assert engine.value("select count(*) from pgflow.step_pauses") == 0


def test_deleting_the_flow_deletes_its_pauses(engine: Engine) -> None:
    two_roots(engine)
    engine.call("pause_step", "pair", "slow")
    engine.start("pair", {})
    engine.poll("pair")
    engine.call("delete_flow_and_data", "pair")
    assert engine.value("select count(*) from pgflow.step_pauses") == 0
    assert engine.value("select count(*) from pgflow.held_messages") == 0
