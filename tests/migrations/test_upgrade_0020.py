"""Upgrading 0019 to 0020 (engine integrity): work claimed on 0019 finishes with the attempts it
was claimed with; a task 0019 parked for ever (stalled 4 times) is decided by the next sweep, so
its run ends and can be retried; step roles made on 0019 keep exactly their step; a schedule a
caller pushed to infinity starts again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine, shape_step
from tests.roles import Logins, logins_on, refused
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_19(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0019") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0020")


def test_work_claimed_on_0019_finishes(version_19: Engine) -> None:
    engine = version_19
    claimed_work_finishes(engine, upgrade)
    assert engine.value("select max(attempts_before_retry) from pgflow.step_tasks") == 0


def test_a_task_0019_parked_for_ever_is_decided_by_the_next_sweep(version_19: Engine) -> None:
    engine = version_19
    engine.flow("stall", {"slug": "slow", "timeout": 10})  # 3 attempts
    run_id = engine.start("stall")
    for _ in range(4):
        engine.poll("stall")
        engine.backdate_started(run_id, "slow", 41)
        engine.value("select pgflow.requeue_stalled_tasks()")
    parked = engine.task(run_id, "slow")
    assert (parked["status"], parked["requeued_count"]) == ("started", 3)
    assert parked["permanently_stalled_at"] is not None

    upgrade(engine)

    task = engine.task(run_id, "slow")
    assert task["permanently_stalled_at"] is None
    assert task["message_id"] != parked["message_id"]
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1
    task = engine.task(run_id, "slow")
    assert (task["status"], task["error_message"]) == (
        "failed",
        "Stalled 4 times: no live worker kept it",
    )
    assert engine.run(run_id)["status"] == "failed"
    engine.call("retry_run", run_id)
    [again] = engine.poll("stall")
    assert again.attempt == 5
    engine.complete(again, "done", fenced=True)
    assert engine.run(run_id)["status"] == "completed"


def test_a_schedule_pushed_past_now_starts_again(version_19: Engine) -> None:
    engine = version_19
    shape = {
        "steps": [shape_step("build")],
        "options": {},
        "schedules": [
            {
                "name": "nightly",
                "cron": "0 2 * * *",
                "timezone": "UTC",
                "input": {},
                "catchUp": "none",
            }
        ],
    }
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(shape))
    engine.value(
        "select count(*) from pgflow.start_scheduled_runs('reports', 'nightly', '{}', 'infinity')"
    )
    assert engine.value("select last_slot_at = 'infinity' from pgflow.schedules") is True

    upgrade(engine)

    assert engine.value("select last_slot_at <= now() from pgflow.schedules") is True


@pytest.fixture
def roles_on_19(version_19: Engine, empty_db_url: str) -> Iterator[tuple[Engine, Logins]]:
    engine = version_19
    engine.compile("orders", [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}])
    engine.flow("plain", {"slug": "only"})
    yield from ((engine, logins) for logins in logins_on(engine.conn, empty_db_url))


def test_step_roles_made_on_0019_keep_exactly_their_step(
    roles_on_19: tuple[Engine, Logins],
) -> None:
    engine, logins = roles_on_19
    made = {r.step_slug: r.role for r in logins.add_step_roles("orders")}

    upgrade(engine)

    mail = logins.connect(made["mail"])
    plain = engine.start("plain", {"secret": 1})
    refused(mail, "select pgflow.run_input(%s)", plain)
    refused(
        mail,
        "select pgflow.register_worker(gen_random_uuid(), 'orders__charge', 'x',"
        " 'orders', 'charge')",
    )
    mail.execute(
        "select pgflow.register_worker(gen_random_uuid(), 'orders__mail', 'x', 'orders', 'mail')"
    )
    row: Any = engine.one("select * from pgflow.step_roles where role_name = %s", made["mail"])
    assert (row["flow_slug"], row["step_slug"]) == ("orders", "mail")
