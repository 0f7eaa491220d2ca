"""What a worker role (or a step role) can bend with the functions it is granted (engine 0020): it
touches only its flows' queues, registers only real routes with sane sizes, acts only as the
worker ids it registered, starts no schedule's runs beyond the clock and the catch-up maximum,
and cannot shorten the stall rule in its own session. Real login roles; each case failed on
engine 0019."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import psycopg
import pytest

from tests.engine import Engine
from tests.roles import Logins, refused

CLAIMED = "select run_id, attempt from pgflow.read_and_claim(%s, %s, %s, 10, 30, %s)"
UTC = datetime.UTC
#: A stall rule far shorter than the default (heartbeat 5 s, live 15 s, stalled after 30 s).
SHORT_RULE = {"heartbeat_interval": "0.1s", "live_within": "0.2s", "stalled_after": "0.2s"}


def register(conn: psycopg.Connection[Any], queue: str, flow: str | None = None) -> uuid.UUID:
    worker_id = uuid.uuid4()
    conn.execute("select pgflow.register_worker(%s, %s, 'app', %s)", (worker_id, queue, flow))
    return worker_id


def test_a_flow_mode_claim_reads_only_its_flows_queue(engine: Engine, logins: Logins) -> None:
    engine.flow("plain", {"slug": "only"})
    engine.conn.execute("select pgmq.create('emails')")
    engine.conn.execute("select pgmq.send('emails', '{\"to\": \"ada\"}')")
    worker = logins.login("worker")
    worker_id = register(worker, "plain", "plain")

    message = refused(worker, CLAIMED, "plain", "emails", worker_id, None)

    assert message == 'Flow "plain" uses queue "plain", not "emails".'
    assert engine.value("select count(*) from pgmq.q_emails where vt <= now() and read_ct = 0") == 1


def test_a_worker_registers_only_real_routes_with_sane_sizes(
    engine: Engine, logins: Logins
) -> None:
    engine.compile("orders", [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}])
    engine.conn.execute("select pgmq.create('emails')")
    worker = logins.login("worker")
    before = engine.all("select * from pgflow.queue_coverage()")

    assert refused(worker, "select pgflow.register_worker(%s, 'emails', 'x')", uuid.uuid4()) == (
        'Queue "emails" is not a queue of the engine\'s flows.'
    )
    for flow, step, queue, error in [
        ("nowhere", None, "orders__mail", psycopg.errors.NoDataFound),
        ("orders", "ghost", "orders__mail", psycopg.errors.InvalidParameterValue),
        ("orders", "charge", "orders__mail", psycopg.errors.InvalidParameterValue),
        (None, "mail", "orders__mail", psycopg.errors.InvalidParameterValue),
    ]:
        with pytest.raises(error):
            worker.execute(
                "select pgflow.register_worker(%s, %s, 'x', %s, %s)",
                (uuid.uuid4(), queue, flow, step),
            )
    with pytest.raises(psycopg.errors.StringDataRightTruncation, match="at most 200"):
        worker.execute(
            "select pgflow.register_worker(%s, 'orders__mail', %s, 'orders', 'mail')",
            (uuid.uuid4(), "x" * 5000),
        )
    assert engine.value("select count(*) from pgflow.workers") == 0
    assert engine.all("select * from pgflow.queue_coverage()") == before


def test_a_worker_id_belongs_to_the_role_that_registered_it(engine: Engine, logins: Logins) -> None:
    engine.flow("plain", {"slug": "only"})
    engine.start("plain")
    first = logins.login("worker")
    worker_id = register(first, "plain", "plain")
    second = logins.connect(
        logins.create_login(f"{logins.prefix}_second", member_of=logins.names.of("worker"))
    )

    expected = f'belongs to role "{logins.login_role("worker")}"'
    assert expected in refused(second, "select pgflow.heartbeat_worker(%s)", worker_id)
    refused(second, "select pgflow.mark_worker_stopped(%s)", worker_id)
    refused(second, "select pgflow.register_worker(%s, 'plain', 'x', 'plain')", worker_id)
    refused(second, CLAIMED, "plain", "plain", worker_id, None)
    row = engine.one("select * from pgflow.workers where worker_id = %s", worker_id)
    assert (row["stopped_at"], row["registered_by"]) == (None, logins.login_role("worker"))
    assert engine.task(engine.value("select run_id from pgflow.runs"), "only")["status"] == "queued"
    # Its own role goes on as before, and an operator (the owner here) may act for it.
    assert first.execute("select pgflow.heartbeat_worker(%s)", (worker_id,)).fetchone() == (False,)
    engine.call("mark_worker_stopped", worker_id)


def compile_nightly(engine: Engine) -> None:
    engine.compile(
        "reports",
        [{"slug": "build"}],
        options={},
        schedules=[
            {
                "name": "nightly",
                "cron": "0 2 * * *",
                "timezone": "UTC",
                "input": {},
                "catchUp": "all",
            }
        ],
    )


def test_a_caller_cannot_start_a_schedules_runs_beyond_the_clock_or_the_catch_up_maximum(
    engine: Engine, logins: Logins
) -> None:
    compile_nightly(engine)
    worker = logins.login("worker")
    start = datetime.datetime(2020, 1, 1, 2, 0, tzinfo=UTC)
    slots = [start + datetime.timedelta(days=d) for d in range(500)]
    call = "select * from pgflow.start_scheduled_runs('reports', 'nightly', %s, %s)"
    started = worker.execute(call, (slots, None)).fetchall()
    assert len(started) == 100  # the latest 100: the documented catch-up maximum
    assert min(row[0] for row in started) == slots[400]
    assert engine.value("select count(*) from pgflow.runs") == 100
    assert engine.value("select last_slot_at from pgflow.schedules") == slots[-1]

    # Slots the cron expression does not name start nothing (engine 0021): "0 2 * * *" names
    # 02:00 UTC, neither the seconds after it nor the other whole minutes of the following days.
    between = [slots[-1] + datetime.timedelta(seconds=s) for s in range(1, 60)]
    minutes = [slots[-1] + datetime.timedelta(minutes=m) for m in range(1, 24 * 60 * 3, 7)]
    assert worker.execute(call, (between + minutes, None)).fetchall() == []
    assert engine.value("select last_slot_at from pgflow.schedules") == slots[-1]

    # Nor does a slot later than now, and the last slot never moves past now.
    future = [datetime.datetime(2090, 1, 1, tzinfo=UTC)]
    assert worker.execute(call, (future, "infinity")).fetchall() == []
    assert engine.value("select last_slot_at from pgflow.schedules") <= datetime.datetime.now(UTC)
    assert engine.value("select count(*) from pgflow.runs") == 100


def test_a_step_role_starts_no_other_flows_schedules(engine: Engine, logins: Logins) -> None:
    compile_nightly(engine)
    engine.compile("orders", [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}])
    [charge, _] = logins.add_step_roles("orders")
    message = refused(
        logins.connect(charge.role),
        "select * from pgflow.start_scheduled_runs('reports', 'nightly', %s)",
        [datetime.datetime(2020, 1, 1, tzinfo=UTC)],
    )
    assert message == f'Role "{charge.role}" may not work on flow "reports".'
    assert engine.value("select count(*) from pgflow.runs") == 0
    assert (
        logins.connect(charge.role).execute("select * from pgflow.list_schedules()").fetchall()
        == []
    )


def test_a_worker_cannot_shorten_the_stall_rule_in_its_session(
    engine: Engine, logins: Logins
) -> None:
    engine.flow("plain", {"slug": "only"})
    run_id = engine.start("plain")
    worker = logins.login("worker")
    holder = register(worker, "plain", "plain")
    [claimed] = worker.execute(CLAIMED, ("plain", "plain", holder, None)).fetchall()
    # The holder's last heartbeat was 5 s ago: live by the database's rule (stalled after 30 s).
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '5 s'")
    sweeper = logins.connect(
        logins.create_login(f"{logins.prefix}_sweeper", member_of=logins.names.of("worker"))
    )
    for setting, value in SHORT_RULE.items():
        sweeper.execute(f"set pgflow.{setting} = '{value}'")

    assert sweeper.execute("select pgflow.requeue_stalled_tasks()").fetchone() == (0,)
    assert sweeper.execute("select stalled_after from pgflow.worker_liveness()").fetchone() == (
        datetime.timedelta(seconds=30),
    )
    assert engine.task(run_id, "only")["status"] == "started"
    # The database's setting applies to every session; an operator's own session may set one.
    for setting, value in SHORT_RULE.items():
        engine.conn.execute(f"set pgflow.{setting} = '{value}'")
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    assert claimed[1] == 1


def test_a_worker_sees_the_databases_stall_rule_whatever_its_session_says(
    engine: Engine, logins: Logins
) -> None:
    database = engine.value("select current_database()")
    engine.conn.execute(f"alter database \"{database}\" set pgflow.stalled_after = '60s'")
    worker = logins.login("worker")  # a new session: it starts with the database's value
    rule = "select stalled_after from pgflow.worker_liveness()"
    assert worker.execute(rule).fetchone() == (datetime.timedelta(seconds=60),)
    for cleared in ("''", "'30s'"):  # emptied (the 30 s default) or shortened: both ignored
        worker.execute(f"set pgflow.stalled_after = {cleared}")
        assert worker.execute(rule).fetchone() == (datetime.timedelta(seconds=60),)
    # An operator's session may try a rule of its own.
    engine.conn.execute("set pgflow.stalled_after = '45s'")
    assert engine.value(rule) == datetime.timedelta(seconds=45)


def test_a_workers_role_settings_and_a_reset_do_not_bend_the_stall_rule(
    engine: Engine, logins: Logins
) -> None:
    # With no setting anywhere a claim skips the catalog (engine 0021); a value the worker's role
    # carries, or one its session set and reset, is no database's setting: the defaults hold.
    worker_role = logins.login_role("worker")
    engine.conn.execute(f"alter role \"{worker_role}\" set pgflow.stalled_after = '0.2s'")
    rule = "select live_within, stalled_after from pgflow.worker_liveness()"
    defaults = (datetime.timedelta(seconds=15), datetime.timedelta(seconds=30))
    with_role_setting = logins.connect(worker_role)
    assert with_role_setting.execute("show pgflow.stalled_after").fetchone() == ("0.2s",)
    assert with_role_setting.execute(rule).fetchone() == defaults
    engine.conn.execute(f'alter role "{worker_role}" reset pgflow.stalled_after')
    worker = logins.connect(worker_role)
    assert worker.execute(rule).fetchone() == defaults
    worker.execute("set pgflow.live_within = '0.2s'")
    worker.execute("reset pgflow.live_within")
    assert worker.execute(rule).fetchone() == defaults
