"""debounce_start and start_debounced_runs (engine 0030): starts with one key, each within
period_s of the one before, collapse into one run, started period_s after the last with the last
input (never later than max_wait_s after the first); exactly one run per burst, whoever calls.
The clock is the tests' own: pgflow._debounce_start and pgflow._start_debounced_runs take it."""

from __future__ import annotations

import datetime
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.roles import Logins, refused

T0 = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def debounce(
    engine: Engine,
    key: str,
    input: Any,
    now: float,
    period: float = 10,
    max_wait: float | None = None,
) -> dict[str, Any]:
    return engine.one(
        "select * from pgflow._debounce_start('digest', %s, %s, %s, %s, %s)",
        Jsonb(input), key, period, max_wait, at(now),
    )  # fmt: skip


def fire(engine: Engine, now: float) -> list[dict[str, Any]]:
    return engine.all(
        "select * from pgflow._start_debounced_runs(%s) order by debounce_key", at(now)
    )


def runs(engine: Engine) -> list[dict[str, Any]]:
    return engine.all("select input, idempotency_key from pgflow.runs order by started_at")


@pytest.fixture
def digest(engine: Engine) -> Engine:
    engine.flow("digest", {"slug": "send"})
    return engine


def test_a_burst_starts_one_run_a_period_after_its_last_start_with_its_last_input(
    digest: Engine,
) -> None:
    first = debounce(digest, "user-7", {"n": 1}, now=0)
    assert (first["starts"], first["start_at"], first["deadline_at"]) == (1, at(10), None)
    debounce(digest, "user-7", {"n": 2}, now=6)
    last = debounce(digest, "user-7", {"n": 3}, now=12)
    assert (last["starts"], last["first_at"], last["last_at"], last["start_at"]) == (
        3, at(0), at(12), at(22),
    )  # fmt: skip

    assert fire(digest, now=21.9) == []  # not due yet
    [started] = fire(digest, now=22)
    assert (started["debounce_key"], started["starts"]) == ("user-7", 3)
    assert runs(digest) == [
        {"input": {"n": 3}, "idempotency_key": "debounce:user-7:2026-12-07T12:00:00.000000Z"}
    ]
    assert digest.value("select count(*) from pgflow.debounced_starts") == 0
    [task] = digest.poll("digest")
    assert task.run_id == started["run_id"]
    assert fire(digest, now=100) == []  # once


def test_max_wait_bounds_a_burst_that_goes_on(digest: Engine) -> None:
    for second in range(0, 30, 5):  # each within the period of the one before
        pending = debounce(digest, "k", {"at": second}, now=second, period=10, max_wait=30)
    assert (pending["start_at"], pending["deadline_at"]) == (at(30), at(30))
    [started] = fire(digest, now=30)
    assert started["starts"] == 6
    assert runs(digest)[0]["input"] == {"at": 25}


def test_a_start_after_a_due_burst_starts_its_run_and_opens_a_new_burst(digest: Engine) -> None:
    debounce(digest, "k", {"n": 1}, now=0)
    pending = debounce(digest, "k", {"n": 2}, now=15)  # the scheduler never came by
    assert (pending["starts"], pending["first_at"], pending["start_at"]) == (1, at(15), at(25))
    assert [run["input"] for run in runs(digest)] == [{"n": 1}]
    fire(digest, now=25)
    assert [run["input"] for run in runs(digest)] == [{"n": 1}, {"n": 2}]


def test_keys_and_flows_debounce_apart(digest: Engine) -> None:
    digest.flow("other", {"slug": "only"})
    debounce(digest, "a", {"key": "a"}, now=0)
    debounce(digest, "b", {"key": "b"}, now=1)
    digest.one("select * from pgflow._debounce_start('other', '{}', 'a', 5, null, %s)", at(0))
    started = fire(digest, now=11)
    assert [(s["flow_slug"], s["debounce_key"]) for s in started] == [
        ("digest", "a"), ("other", "a"), ("digest", "b"),
    ]  # fmt: skip


def test_eight_concurrent_callers_make_one_burst_and_one_run(digest: Engine, db_url: str) -> None:
    barrier = threading.Barrier(8)
    answers: list[dict[str, Any]] = []

    def call(n: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait(timeout=30)
            row = conn.execute(
                "select starts, input from pgflow.debounce_start('digest', %s, 'burst', 60)",
                (Jsonb({"n": n}),),
            ).fetchone()
            assert row is not None
            answers.append({"starts": row[0], "input": row[1]})

    callers = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=60)
    assert sorted(a["starts"] for a in answers) == list(range(1, 9))
    last = next(a["input"] for a in answers if a["starts"] == 8)
    assert digest.value("select count(*) from pgflow.debounced_starts") == 1
    far = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
    digest.all("select * from pgflow._start_debounced_runs(%s)", far)
    assert [run["input"] for run in runs(digest)] == [last]


def test_racing_schedulers_start_each_burst_once(digest: Engine, db_url: str) -> None:
    for n in range(20):
        debounce(digest, f"k{n}", {"n": n}, now=0)
    barrier = threading.Barrier(4)
    started: list[uuid.UUID] = []

    def scheduler() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait(timeout=30)
            rows = conn.execute(
                "select run_id from pgflow._start_debounced_runs(%s)", (at(60),)
            ).fetchall()
            started.extend(row[0] for row in rows)

    threads = [threading.Thread(target=scheduler) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(started) == len(set(started)) == 20
    assert digest.value("select count(*) from pgflow.runs") == 20


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("('nope', '{}', 'k', 10)", 'Flow "nope" does not exist.'),
        ("('digest', null, 'k', 10)", "A debounced start needs an input"),
        ("('digest', '{}', '', 10)", "A debounce key is text of 1 to 200 characters."),
        ("('digest', '{}', 'k', 0)", "period_s must be more than 0 and at most 2592000"),
        ("('digest', '{}', 'k', 2592001)", "period_s must be more than 0 and at most 2592000"),
        ("('digest', '{}', 'k', 10, -1)", "max_wait_s must be null or more than 0"),
    ],
)
def test_wrong_arguments_are_refused_and_change_nothing(
    digest: Engine, call: str, message: str
) -> None:
    with pytest.raises(psycopg.Error) as raised:
        digest.conn.execute(f"select pgflow.debounce_start{call}")
    assert str(raised.value.diag.message_primary).startswith(message)
    assert digest.value("select count(*) from pgflow.debounced_starts") == 0


def test_a_client_debounces_a_worker_starts_and_neither_bends_the_clock(
    digest: Engine, logins: Logins
) -> None:
    client = logins.login("client")
    worker = logins.login("worker")
    reader = logins.login("reader")
    assert client.execute(
        "select starts from pgflow.debounce_start('digest', '{}', 'k', 600)"
    ).fetchone() == (1,)
    refused(reader, "select pgflow.debounce_start('digest', '{}', 'k', 10)")
    refused(client, "select pgflow.start_debounced_runs()")
    refused(worker, "select pgflow._start_debounced_runs(now() + interval '1 day')")
    refused(client, "select pgflow._debounce_start('digest', '{}', 'k', 10, null, now())")
    digest.one(
        "select * from pgflow._debounce_start('digest', '{}', 'due', 10, null,"
        " clock_timestamp() - interval '1 hour')"
    )  # a burst due for 59 minutes, beside the client's, due in 10
    [(flow, key, starts, run_id)] = worker.execute(
        "select * from pgflow.start_debounced_runs()"
    ).fetchall()
    assert (flow, key, starts) == ("digest", "due", 1)
    assert digest.run(run_id)["status"] == "started"
    assert digest.value("select debounce_key from pgflow.debounced_starts") == "k"  # not early


def test_a_step_role_neither_debounces_nor_starts_once_its_flow_is_gone(
    digest: Engine, logins: Logins
) -> None:
    digest.compile("mine", [{"slug": "work"}])
    [role] = logins.add_step_roles("mine")
    own = logins.connect(role.role)
    refused(own, "select pgflow.debounce_start('mine', '{}', 'k', 10)")  # a worker, no client
    assert own.execute("select count(*) from pgflow.start_debounced_runs()").fetchone() == (0,)
    digest.conn.execute("select pgflow.delete_flow_and_data('mine')")
    refused(own, "select pgflow.start_debounced_runs()")


def test_due_in_says_when_the_earliest_burst_is_due_and_null_without_one(digest: Engine) -> None:
    assert digest.value("select pgflow.debounced_starts_due_in()") is None
    digest.conn.execute("select pgflow.debounce_start('digest', '{}', 'later', 300)")
    assert 290 < digest.value("select pgflow.debounced_starts_due_in()") <= 300
    digest.one(
        "select * from pgflow._debounce_start('digest', '{}', 'past', 10, null,"
        " clock_timestamp() - interval '1 hour')"
    )  # due for 59 minutes
    assert digest.value("select pgflow.debounced_starts_due_in()") == 0
