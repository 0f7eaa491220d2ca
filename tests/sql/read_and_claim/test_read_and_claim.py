"""read_and_claim: reads a batch and claims its tasks in one statement, with claim_tasks's
selector rules (checked before anything is read), leases and notices; the messages it read and
did not claim are named in a notice of their own."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime.claimed_task import ClaimedTask
from tests.engine import WORKER_ID, Engine

Notice = tuple[str, str]


def read_and_claim(
    engine: Engine, flow: str, queue: str, qty: int = 10, step: str | None = None
) -> tuple[list[ClaimedTask], list[Notice]]:
    """The call with its notices' (message, detail)."""
    notices: list[Notice] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:  # valid only during the call
        notices.append((diag.message_primary or "", diag.message_detail or ""))

    engine.conn.add_notice_handler(heard)
    engine.register(queue)
    try:
        rows = engine.conn.execute(
            "select * from pgflow.read_and_claim(%s, %s, %s, %s, %s, %s)",
            (flow, queue, WORKER_ID, qty, 30, step),
        ).fetchall()
    finally:
        engine.conn.remove_notice_handler(heard)
    return [ClaimedTask(*row) for row in rows], notices


def detail(notices: list[Notice], start: str) -> dict[str, Any]:
    [found] = [text for message, text in notices if message.startswith(start)]
    return dict(json.loads(found))


def test_it_reads_and_claims_in_one_call_as_the_two_step_claim_does(engine: Engine) -> None:
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    runs = [engine.start("chain", {"n": n}) for n in range(3)]

    claimed, notices = read_and_claim(engine, "chain", "chain", qty=2)

    assert len(claimed) == 2
    assert notices == []
    assert {t.run_id for t in claimed} < set(runs)
    assert all(
        (t.step_slug, t.attempt, t.timeout, t.task_index) == ("first", 1, 60, 0) for t in claimed
    )
    assert [t.msg_id for t in claimed] == sorted(t.msg_id for t in claimed)
    assert [t.flow_input for t in claimed] == [engine.run(t.run_id)["input"] for t in claimed]
    # The claim's lease: the step's timeout + 2 s, as claim_tasks sets it.
    leases = engine.all(
        "select extract(epoch from vt - now())::int as left from pgmq.q_chain"
        " where msg_id = any(%s)",
        [t.msg_id for t in claimed],
    )
    assert all(61 <= row["left"] <= 62 for row in leases)
    rest, _ = read_and_claim(engine, "chain", "chain")
    assert len(rest) == 1
    nothing, notices = read_and_claim(engine, "chain", "chain")
    assert nothing == []
    # Only the claimed tasks' messages are hidden: they show again at their lease's end.
    assert 60 < detail(notices, "read_and_claim: the next message")["next_visible_in_s"] <= 62
    for task in [*claimed, *rest]:
        engine.complete(task, "done", fenced=True)
    [second] = read_and_claim(engine, "chain", "chain", qty=1)[0]
    assert second.input == {"first": "done"}


def test_a_wrong_selector_raises_before_anything_is_read(engine: Engine) -> None:
    engine.compile("stepped", [{"slug": "a"}, {"slug": "b", "deps": ["a"]}], mode="step")
    engine.start("stepped")
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match='is routed to queue "stepped__a"'
    ):
        read_and_claim(engine, "stepped", "stepped__b", step="a")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="needs the step slug"):
        read_and_claim(engine, "stepped", "stepped__a")
    # Nothing was read: the message is visible to the right claim at once.
    [task], _ = read_and_claim(engine, "stepped", "stepped__a", step="a")
    assert task.step_slug == "a"


def test_messages_it_read_and_did_not_claim_are_named(engine: Engine) -> None:
    engine.flow("single", {"slug": "only"})
    engine.start("single")
    [foreign] = engine.conn.execute(
        "select pgmq.send('single', %s)", (Jsonb({"not": "a task"}),)
    ).fetchone() or [None]

    claimed, notices = read_and_claim(engine, "single", "single")

    assert len(claimed) == 1
    assert detail(notices, "read_and_claim left 1 message(s)") == {
        "unclaimed_message_ids": [foreign]
    }
    # Left alone, hidden for the read's visibility like any message read.
    assert engine.value("select count(*) from pgmq.q_single where msg_id = %s", foreign) == 1


def test_a_paused_steps_messages_are_held_and_named_unclaimed_too(engine: Engine) -> None:
    engine.flow("single", {"slug": "only"})
    engine.start("single")
    engine.call("pause_step", "single", "only", "maintenance")

    claimed, notices = read_and_claim(engine, "single", "single")

    assert claimed == []
    held = detail(notices, "claim_tasks held")["held_message_ids"]
    assert detail(notices, "read_and_claim left")["unclaimed_message_ids"] == held
    assert (
        engine.task(engine.all("select run_id from pgflow.runs")[0]["run_id"], "only")[
            "attempts_count"
        ]
        == 0
    )


def test_a_short_read_says_when_the_next_hidden_message_shows_again(engine: Engine) -> None:
    engine.flow("later", {"slug": "only", "start_delay": 30})
    engine.start("later")

    claimed, notices = read_and_claim(engine, "later", "later")

    assert claimed == []
    waits = detail(notices, "read_and_claim: the next message")["next_visible_in_s"]
    assert 28 < waits <= 30
    engine.make_visible("later")
    [task], notices = read_and_claim(engine, "later", "later", qty=1)
    assert task.step_slug == "only"
    assert notices == []  # a full read says nothing: the worker polls again at once


def lease_left(engine: Engine, queue: str, msg_id: int) -> float:
    return float(
        engine.value(
            f"select extract(epoch from vt - clock_timestamp()) from pgmq.q_{queue}"
            " where msg_id = %s",
            msg_id,
        )
    )


def test_it_reads_with_the_lease_its_claim_sets(engine: Engine) -> None:
    engine.flow("leased", {"slug": "only", "timeout": 90})
    engine.start("leased")
    [task], _ = read_and_claim(engine, "leased", "leased")
    assert task.timeout == 90
    assert 91 < lease_left(engine, "leased", task.msg_id) <= 92
    # The read set it, and only the read: the message was updated once (read_ct counts reads).
    assert engine.value("select read_ct from pgmq.q_leased where msg_id = %s", task.msg_id) == 1


def test_steps_with_other_timeouts_each_get_their_own_lease(engine: Engine) -> None:
    engine.flow("mixed", {"slug": "quick", "timeout": 5}, {"slug": "slow", "timeout": 300})
    engine.start("mixed")

    claimed, _ = read_and_claim(engine, "mixed", "mixed")

    leases = {t.step_slug: lease_left(engine, "mixed", t.msg_id) for t in claimed}
    assert 6 < leases["quick"] <= 7
    assert 301 < leases["slow"] <= 302


def test_a_message_it_read_and_did_not_claim_is_hidden_for_the_reads_visibility(
    engine: Engine,
) -> None:
    engine.flow("single", {"slug": "only"})
    engine.start("single")
    [foreign] = engine.conn.execute(
        "select pgmq.send('single', %s)", (Jsonb({"not": "a task"}),)
    ).fetchone() or [None]

    claimed, _ = read_and_claim(engine, "single", "single")

    assert 61 < lease_left(engine, "single", claimed[0].msg_id) <= 62
    assert 29 < lease_left(engine, "single", foreign) <= 30  # vt, not the claim's lease
