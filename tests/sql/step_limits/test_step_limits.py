"""Step limits (engine 0017): set_step_limits checks what it is given; a claim starts no more
tasks of a limited step than max_in_flight and rate_limit allow, across claims, and what it
leaves uses no attempt; the spec's limits apply with the flow's options, and an operator's stay
over them until reset_step_limits (engine 0023); step_limit_usage reports both and their use."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime.claimed_task import ClaimedTask
from tests.engine import WORKER_ID, Engine

QUEUE = "capped__call"
Notice = tuple[str, str]


@pytest.fixture
def capped(engine: Engine) -> Engine:
    """A step-queued flow with one step, "call", on its own queue."""
    engine.compile("capped", [{"slug": "call"}])
    engine.register(QUEUE)
    return engine


def limits(engine: Engine, **values: Any) -> dict[str, Any] | None:
    [row] = engine.all(
        "select (pgflow.set_step_limits('capped', 'call', %s, %s, %s)).*",
        values.get("max_in_flight"),
        values.get("rate_limit"),
        values.get("rate_period_s"),
    )
    return None if row["flow_slug"] is None else row


def read_and_claim(
    engine: Engine, qty: int = 10, conn: psycopg.Connection[Any] | None = None
) -> tuple[list[ClaimedTask], list[Notice]]:
    """read_and_claim on the step's queue, with its notices' (message, detail)."""
    conn = conn or engine.conn
    notices: list[Notice] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append((diag.message_primary or "", diag.message_detail or ""))

    conn.add_notice_handler(heard)
    try:
        rows = conn.execute(
            "select * from pgflow.read_and_claim('capped', %s, %s, %s, 30, 'call')",
            (QUEUE, WORKER_ID, qty),
        ).fetchall()
    finally:
        conn.remove_notice_handler(heard)
    return [ClaimedTask(*row) for row in rows], notices


def detail(notices: list[Notice], start: str) -> dict[str, Any]:
    [found] = [text for message, text in notices if message.startswith(start)]
    return dict(json.loads(found))


def started(engine: Engine) -> int:
    return int(engine.value("select count(*) from pgflow.step_tasks where status = 'started'"))


def usage(engine: Engine) -> dict[str, Any]:
    [row] = engine.all("select * from pgflow.step_limit_usage('capped')")
    return row


# -- set_step_limits ---------------------------------------------------------------------------


def test_limits_are_set_changed_and_cleared(capped: Engine) -> None:
    row = limits(capped, max_in_flight=4)
    assert row is not None
    assert (row["max_in_flight"], row["rate_limit"], row["set_by"]) == (4, None, "operator")
    row = limits(capped, rate_limit=10, rate_period_s=60)
    assert row is not None
    assert (row["max_in_flight"], row["rate_limit"], row["rate_period_s"]) == (None, 10, 60)
    assert limits(capped) is None
    assert capped.value("select count(*) from pgflow.step_limits") == 0


@pytest.mark.parametrize(
    ("args", "sqlstate", "message"),
    [
        (("nope", "call", 1), "P0002", 'Flow "nope" does not exist.'),
        (("capped", "Call", 1), "P0002", 'Flow "capped" has no step "Call".'),
        (("capped", "call", 0), "22023", "Step limits must be whole numbers from 1"),
        (("capped", "call", None, -5, 60), "22023", "Step limits must be whole numbers from 1"),
        (("capped", "call", None, 5), "22023", "A rate limit needs both rate_limit"),
        (("capped", "call", None, None, 60), "22023", "A rate limit needs both rate_limit"),
    ],
    ids=["unknown-flow", "unknown-step", "zero-cap", "negative-rate", "no-period", "no-rate"],
)
def test_wrong_limits_raise_and_change_nothing(
    capped: Engine, args: tuple[Any, ...], sqlstate: str, message: str
) -> None:
    placeholders = ", ".join(["%s"] * len(args))
    with pytest.raises(psycopg.Error) as raised:
        capped.conn.execute(f"select pgflow.set_step_limits({placeholders})", args)
    assert raised.value.sqlstate == sqlstate
    assert str(raised.value.diag.message_primary).startswith(message)
    assert capped.value("select count(*) from pgflow.step_limits") == 0


def test_a_signal_step_takes_no_limit(engine: Engine) -> None:
    engine.compile(
        "approve", [{"slug": "wait", "stepType": "signal"}, {"slug": "go", "deps": ["wait"]}]
    )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="signal step"):
        engine.call("set_step_limits", "approve", "wait", max_in_flight=1)


# -- max_in_flight -----------------------------------------------------------------------------


def test_a_cap_reads_only_as_many_as_there_is_room_for(capped: Engine) -> None:
    limits(capped, max_in_flight=3)
    for n in range(8):
        capped.start("capped", {"n": n})

    claimed, notices = read_and_claim(capped)

    assert len(claimed) == 3
    assert detail(notices, "read_and_claim limited") == {
        "limited_step": "call",
        "wanted": 10,
        "allowed": 3,
    }
    # The rest stay in the queue untouched, in order, and use no attempt.
    waiting = [m for m in capped.queued_messages(QUEUE) if m["read_ct"] == 0]
    assert len(waiting) == 5
    assert capped.value(f"select bool_and(vt <= now()) from pgmq.q_{QUEUE} where read_ct = 0")
    assert (
        capped.value("select max(attempts_count) from pgflow.step_tasks where status = 'queued'")
        == 0
    )

    again, notices = read_and_claim(capped)
    assert again == []
    assert detail(notices, "read_and_claim limited")["allowed"] == 0
    # The worker is told to ask again soon: a task in flight frees its place when it ends.
    assert 0 < detail(notices, "read_and_claim: the next message")["next_visible_in_s"] <= 0.25

    capped.complete(claimed[0], "done", fenced=True)
    [next_one], _ = read_and_claim(capped)
    assert next_one.msg_id == waiting[0]["msg_id"]  # the oldest waiting message
    assert started(capped) == 3


def test_a_failed_attempt_waiting_for_its_retry_frees_its_place(capped: Engine) -> None:
    limits(capped, max_in_flight=1)
    capped.start("capped", {})
    capped.start("capped", {})
    [first], _ = read_and_claim(capped)
    assert read_and_claim(capped)[0] == []
    capped.fail(first, fenced=True)  # retried after its delay: queued again, not in flight
    [second], _ = read_and_claim(capped)
    assert second.run_id != first.run_id


def test_concurrent_claims_never_start_more_than_the_cap(capped: Engine, db_url: str) -> None:
    limits(capped, max_in_flight=3)
    for n in range(20):
        capped.start("capped", {"n": n})
    barrier = threading.Barrier(4)
    claimed: list[int] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                barrier.wait()
                tasks, _ = read_and_claim(capped, qty=5, conn=conn)
                claimed.append(len(tasks))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sum(claimed) == 3
    assert started(capped) == 3


def test_a_cap_set_while_tasks_run_counts_them(capped: Engine) -> None:
    for n in range(5):
        capped.start("capped", {"n": n})
    first, _ = read_and_claim(capped, qty=2)
    limits(capped, max_in_flight=3)
    assert usage(capped)["in_flight"] == 2
    [third], _ = read_and_claim(capped)
    assert third.msg_id not in {t.msg_id for t in first}
    assert read_and_claim(capped)[0] == []


def test_cleared_limits_claim_everything_again(capped: Engine) -> None:
    limits(capped, max_in_flight=1)
    for n in range(4):
        capped.start("capped", {"n": n})
    assert len(read_and_claim(capped)[0]) == 1
    limits(capped)
    claimed, notices = read_and_claim(capped)
    assert len(claimed) == 3
    assert [m for m, _ in notices if m.startswith("read_and_claim limited")] == []
    assert capped.value("select count(*) from pgflow.step_slots") == 0


def test_a_paused_limited_step_is_held_by_its_pause(capped: Engine) -> None:
    limits(capped, max_in_flight=5)
    capped.start("capped", {})
    capped.call("pause_step", "capped", "call")
    claimed, notices = read_and_claim(capped)
    assert claimed == []
    assert detail(notices, "claim_tasks held")["held_message_ids"]
    assert [m for m, _ in notices if m.startswith("claim_tasks limited")] == []


# -- rate_limit --------------------------------------------------------------------------------


def test_a_rate_limit_counts_starts_in_the_window_and_says_when_it_frees(capped: Engine) -> None:
    limits(capped, rate_limit=2, rate_period_s=60)
    for n in range(5):
        capped.start("capped", {"n": n})
    claimed, _ = read_and_claim(capped)
    assert len(claimed) == 2
    for task in claimed:  # finished tasks still count: they started in the window
        capped.complete(task, "done", fenced=True)

    again, notices = read_and_claim(capped)
    assert again == []
    assert 58 < detail(notices, "read_and_claim: the next message")["next_visible_in_s"] <= 60

    capped.conn.execute(
        "update pgflow.step_slots set started_at = started_at - interval '61 seconds'"
    )
    assert len(read_and_claim(capped)[0]) == 2
    assert usage(capped)["window_starts"] == 2
    # The starts that left the window are gone; the new ones stay.
    assert capped.value("select count(*) from pgflow.step_slots") == 2


def test_every_attempt_is_a_start(capped: Engine) -> None:
    limits(capped, rate_limit=2, rate_period_s=60)
    capped.start("capped", {})
    [first], _ = read_and_claim(capped)
    capped.fail(first, fenced=True)
    capped.make_visible(QUEUE)
    [retry], _ = read_and_claim(capped)
    assert (retry.run_id, retry.attempt) == (first.run_id, 2)
    capped.fail(retry, fenced=True)
    capped.make_visible(QUEUE)
    assert read_and_claim(capped)[0] == []  # a third attempt waits for the window


def test_both_limits_take_the_smaller_room(capped: Engine) -> None:
    limits(capped, max_in_flight=3, rate_limit=100, rate_period_s=60)
    for n in range(5):
        capped.start("capped", {"n": n})
    assert len(read_and_claim(capped)[0]) == 3
    limits(capped, max_in_flight=3, rate_limit=4, rate_period_s=60)
    assert read_and_claim(capped)[0] == []
    assert usage(capped) | {"updated_at": None, "overridden_at": None} == {
        "flow_slug": "capped",
        "step_slug": "call",
        "queue_name": QUEUE,
        "max_in_flight": 3,
        "rate_limit": 4,
        "rate_period_s": 60,
        "set_by": "operator",
        "in_flight": 3,
        "window_starts": 3,
        "updated_at": None,
        "spec_max_in_flight": None,  # the spec sets none: the operator's override them
        "spec_rate_limit": None,
        "spec_rate_period_s": None,
        "overridden_at": None,
        "overridden_by": capped.value("select session_user"),
    }


# -- claims of messages read elsewhere: held back --------------------------------------------


def test_a_shared_queue_holds_back_what_it_read_beyond_a_limit(engine: Engine) -> None:
    engine.flow("pair", {"slug": "slow"}, {"slug": "fast"})
    engine.call("set_step_limits", "pair", "slow", max_in_flight=1)
    runs = [engine.start("pair", {"n": n}) for n in range(3)]
    heard: list[dict[str, Any]] = []
    engine.conn.add_notice_handler(
        lambda diag: (
            heard.append(json.loads(diag.message_detail or "{}"))
            if (diag.message_primary or "").startswith("claim_tasks limited")
            else None
        )
    )

    claimed = engine.poll("pair")

    assert sorted(t.step_slug for t in claimed) == ["fast", "fast", "fast", "slow"]
    [slow] = [t for t in claimed if t.step_slug == "slow"]
    held = sorted(engine.task(r, "slow")["message_id"] for r in runs if r != slow.run_id)
    assert heard == [{"limited_message_ids": held}]
    assert all(engine.task(r, "slow")["attempts_count"] == 0 for r in runs if r != slow.run_id)
    assert slow.msg_id < min(held)  # the oldest message goes first
    hidden = engine.all(
        "select extract(epoch from vt - now()) as s from pgmq.q_pair where msg_id = any(%s)", held
    )
    assert all(0 < h["s"] <= 1.0 for h in hidden)  # back soon


def test_read_and_claim_on_a_shared_queue_keeps_the_hold(engine: Engine) -> None:
    engine.flow("pair", {"slug": "slow"}, {"slug": "fast"})
    engine.call("set_step_limits", "pair", "slow", rate_limit=1, rate_period_s=30)
    engine.start("pair", {})
    engine.start("pair", {})
    engine.register("pair")
    rows = engine.conn.execute(
        "select * from pgflow.read_and_claim('pair', 'pair', %s, 10, 5)", (WORKER_ID,)
    ).fetchall()
    assert sorted(ClaimedTask(*r).step_slug for r in rows) == ["fast", "fast", "slow"]
    hidden_for = engine.value(
        "select extract(epoch from q.vt - now()) from pgmq.q_pair as q"
        " join pgflow.step_tasks as t on t.message_id = q.msg_id and t.queue_name = 'pair'"
        " where t.status = 'queued'"
    )
    assert 25 < hidden_for <= 30  # the rate window's, not the read's 5 s


# -- the spec's limits -------------------------------------------------------------------------


def spec(
    engine: Engine, call: dict[str, Any] | None, store: dict[str, Any] | None = None
) -> dict[str, Any]:
    return engine.compile(
        "specced",
        [
            {"slug": "call", **({"options": call} if call else {})},
            {"slug": "store", "deps": ["call"], **({"options": store} if store else {})},
        ],
        options={"maxAttempts": 3},
    )


def spec_limits(engine: Engine) -> dict[str, Any]:
    return {
        r["step_slug"]: (r["max_in_flight"], r["rate_limit"], r["rate_period_s"], r["set_by"])
        for r in engine.all("select * from pgflow.step_limits where flow_slug = 'specced'")
    }


def test_the_spec_sets_changes_and_drops_its_limits(engine: Engine) -> None:
    spec(engine, {"maxInFlight": 4})
    assert spec_limits(engine) == {"call": (4, None, None, "spec")}

    result = spec(engine, {"maxInFlight": 2, "rateLimit": 10, "ratePeriod": 60})
    assert result["optionsUpdated"] == [
        {"step": "call", "option": "maxInFlight", "from": 4, "to": 2},
        {"step": "call", "option": "rateLimit", "from": None, "to": 10},
        {"step": "call", "option": "ratePeriod", "from": None, "to": 60},
    ]
    assert spec_limits(engine) == {"call": (2, 10, 60, "spec")}

    result = spec(engine, None)
    assert [c["option"] for c in result["optionsUpdated"]] == [
        "maxInFlight",
        "rateLimit",
        "ratePeriod",
    ]
    assert spec_limits(engine) == {}


def usage_of(engine: Engine, step: str) -> dict[str, Any]:
    [row] = engine.all(
        "select * from pgflow.step_limit_usage('specced') where step_slug = %s", step
    )
    return row


def test_an_operators_limits_stay_over_the_spec_until_reset(engine: Engine) -> None:
    spec(engine, {"maxInFlight": 4})
    engine.call("set_step_limits", "specced", "store", max_in_flight=1)
    engine.call("set_step_limits", "specced", "call", max_in_flight=1)

    assert spec(engine, {"maxInFlight": 4}).get("optionsUpdated") is None  # a worker's start
    assert spec_limits(engine) == {
        "call": (1, None, None, "operator"),
        "store": (1, None, None, "operator"),
    }
    call = usage_of(engine, "call")
    assert (call["spec_max_in_flight"], call["overridden_by"]) == (4, engine.value(
        "select session_user"))  # fmt: skip
    assert usage_of(engine, "store")["spec_max_in_flight"] is None

    [reset] = engine.call("reset_step_limits", "specced", "call")
    assert (reset["max_in_flight"], reset["set_by"]) == (4, "spec")
    [cleared] = engine.call("reset_step_limits", "specced", "store")
    assert cleared["flow_slug"] is None  # the spec limits it not: no limits
    assert spec_limits(engine) == {"call": (4, None, None, "spec")}
    assert engine.value("select count(*) from pgflow.step_limit_overrides") == 0


def test_a_spec_change_under_an_override_says_which_value_stays(engine: Engine) -> None:
    spec(engine, {"maxInFlight": 4})
    engine.call("set_step_limits", "specced", "call", max_in_flight=9)

    result = spec(engine, {"maxInFlight": 6})

    assert result["optionsUpdated"] == [
        {"step": "call", "option": "maxInFlight", "from": 4, "to": 6, "override": 9},
    ]
    assert result["summary"] == (
        'verified; options updated: step "call" maxInFlight 4 -> 6 (an operator\'s 9 stays'
        " until `pgflow-gen limits specced call --reset`)"
    )
    assert spec_limits(engine) == {"call": (9, None, None, "operator")}
    assert usage_of(engine, "call")["spec_max_in_flight"] == 6
    engine.call("reset_step_limits", "specced", "call")
    assert spec_limits(engine) == {"call": (6, None, None, "spec")}


def test_an_operator_who_lifts_the_spec_limits_keeps_them_lifted(engine: Engine) -> None:
    spec(engine, {"maxInFlight": 4, "rateLimit": 10, "ratePeriod": 60})
    [cleared] = engine.call("set_step_limits", "specced", "call")
    assert cleared["flow_slug"] is None

    spec(engine, {"maxInFlight": 4, "rateLimit": 10, "ratePeriod": 60})

    assert spec_limits(engine) == {}  # no limits apply
    lifted = usage_of(engine, "call")  # but the step is listed: an override stands
    assert (lifted["max_in_flight"], lifted["rate_limit"], lifted["set_by"]) == (
        None, None, "operator")  # fmt: skip
    assert (lifted["spec_max_in_flight"], lifted["spec_rate_limit"]) == (4, 10)
    engine.call("reset_step_limits", "specced", "call")
    assert spec_limits(engine) == {"call": (4, 10, 60, "spec")}


def test_no_limits_over_a_spec_without_limits_is_no_override(engine: Engine) -> None:
    spec(engine, None)
    engine.call("set_step_limits", "specced", "call", max_in_flight=2)
    engine.call("set_step_limits", "specced", "call")
    assert engine.value("select count(*) from pgflow.step_limit_overrides") == 0
    assert engine.all("select * from pgflow.step_limit_usage('specced')") == []


def test_an_override_and_its_reset_are_recorded_with_who_and_what(engine: Engine) -> None:
    spec(engine, {"maxInFlight": 4})
    engine.conn.execute("set pgflow.action_label = 'pgflow-gen (ada@ops)'")
    engine.call("set_step_limits", "specced", "call", max_in_flight=2)
    override = engine.one("select * from pgflow.step_limit_overrides")
    assert (override["max_in_flight"], override["label"]) == (2, "pgflow-gen (ada@ops)")

    engine.call("reset_step_limits", "specced", "call")
    engine.call("reset_step_limits", "specced", "call")  # nothing left to reset: recorded too
    actions = engine.all(
        "select action, detail, label from pgflow.operator_actions order by action_id"
    )
    assert [(a["action"], a["detail"].get("removed")) for a in actions] == [
        ("limits", None),
        ("reset_limits", {"max_in_flight": 2, "rate_limit": None, "rate_period_s": None}),
        ("reset_limits", None),
    ]
    assert {a["label"] for a in actions} == {"pgflow-gen (ada@ops)"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope", "call"), 'Flow "nope" does not exist.'),
        (("specced", "Call"), 'Flow "specced" has no step "Call".'),
    ],
)
def test_resetting_an_unknown_step_raises(
    engine: Engine, args: tuple[str, str], message: str
) -> None:
    spec(engine, {"maxInFlight": 4})
    with pytest.raises(psycopg.errors.NoDataFound, match=message):
        engine.call("reset_step_limits", *args)


def test_deleting_the_flow_deletes_its_limits(capped: Engine) -> None:
    limits(capped, max_in_flight=1)
    capped.start("capped", {})
    read_and_claim(capped)
    capped.call("delete_flow_and_data", "capped")
    assert capped.value("select count(*) from pgflow.step_limits") == 0
    assert capped.value("select count(*) from pgflow.step_slots") == 0


def test_usage_is_empty_without_limits(capped: Engine) -> None:
    assert capped.all("select * from pgflow.step_limit_usage()") == []
