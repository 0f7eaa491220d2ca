"""Per-step credentials fail closed (engine 0020): who is a step role, and for which step, is
decided by role membership, so a role made `in role` a step role is held to that step too; a step
role whose flow is deleted or recompiled keeps its binding, works on nothing while its step is
gone, and never falls back to a plain worker. Each case failed on engine 0019."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.engine import Engine
from tests.roles import Logins, refused

STEPS: list[dict[str, Any]] = [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}]
CHARGE, MAIL = "orders__charge", "orders__mail"
CLAIMED = "select run_id, step_slug, attempt from pgflow.read_and_claim(%s, %s, %s, 10, 30, %s)"


@pytest.fixture
def orders(engine: Engine, logins: Logins) -> dict[str, str]:
    """The flow "orders", its step roles, and a plain flow "plain"; {step: role}."""
    engine.compile("orders", STEPS)
    engine.flow("plain", {"slug": "only"})
    return {r.step_slug: r.role for r in logins.add_step_roles("orders")}


def register(conn: psycopg.Connection[Any], queue: str, flow: str, step: str | None) -> uuid.UUID:
    worker_id = uuid.uuid4()
    conn.execute(
        "select pgflow.register_worker(%s, %s, 'app', %s, %s)", (worker_id, queue, flow, step)
    )
    return worker_id


def test_a_step_role_of_a_deleted_flow_works_on_nothing(
    engine: Engine, logins: Logins, orders: dict[str, str]
) -> None:
    mail = logins.connect(orders["mail"])
    plain_worker = register(logins.login("worker"), "plain", "plain", None)
    run_id = engine.start("plain", {"secret": 1})
    notices: list[str] = []
    engine.conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))

    engine.value("select count(*) from pgflow.delete_flow_and_data('orders')")

    assert notices == [
        f'Step roles of flow "orders" stay bound to their steps: {orders["charge"]}, '
        f"{orders['mail']}."
    ]
    assert engine.value("select count(*) from pgflow.step_roles") == 2
    message = refused(mail, CLAIMED, "plain", "plain", plain_worker, None)
    assert message.endswith('may not work on step "(any)" of flow "plain".')
    refused(mail, "select pgflow.register_worker(%s, 'plain', 'x', 'plain')", uuid.uuid4())
    refused(mail, "select pgflow.run_input(%s)", run_id)
    refused(mail, "select pgflow.complete_task(%s, 'only', 0, '{}', 1)", run_id)
    message = refused(mail, "select pgflow.requeue_stalled_tasks()")
    assert message.endswith("is bound to a step that does not exist.")
    assert mail.execute("select * from pgflow.run_trace_contexts(array[%s]::uuid[])", (run_id,))
    assert engine.task(run_id, "only")["status"] == "queued"


def test_a_step_role_of_a_reapplied_flow_works_on_its_own_step_again_and_only_there(
    engine: Engine, logins: Logins, orders: dict[str, str]
) -> None:
    engine.value("select count(*) from pgflow.delete_flow_and_data('orders')")
    engine.compile("orders", STEPS)
    mail = logins.connect(orders["mail"])
    run_id = engine.start("orders", {"card": "4242"})

    refused(
        mail, "select pgflow.register_worker(%s, %s, 'x', 'orders', 'charge')", uuid.uuid4(), CHARGE
    )
    mailer = register(mail, MAIL, "orders", "mail")
    refused(mail, CLAIMED, "orders", CHARGE, mailer, "charge")
    assert engine.task(run_id, "charge")["status"] == "queued"
    assert mail.execute(CLAIMED, ("orders", MAIL, mailer, "mail")).fetchall() == []


def test_a_role_in_a_step_role_is_held_to_that_step(
    engine: Engine, logins: Logins, orders: dict[str, str]
) -> None:
    app = logins.create_login(f"{logins.prefix}_charge_app", member_of=orders["charge"])
    charge_app = logins.connect(app)
    other = engine.start("plain", {"secret": 1})
    mine = engine.start("orders", {"card": "4242"})

    refused(charge_app, "select pgflow.run_input(%s)", other)
    plain_worker = register(logins.login("worker"), "plain", "plain", None)
    refused(charge_app, CLAIMED, "plain", "plain", plain_worker, None)
    refused(
        charge_app,
        "select pgflow.register_worker(%s, %s, 'x', 'orders', 'mail')",
        uuid.uuid4(),
        MAIL,
    )
    assert charge_app.execute(
        "select * from pgflow.run_trace_contexts(array[%s, %s]::uuid[])", (other, mine)
    ).fetchall() == [(mine, None)]
    # Its own step works as for the step role itself.
    charger = register(charge_app, CHARGE, "orders", "charge")
    [task] = charge_app.execute(CLAIMED, ("orders", CHARGE, charger, "charge")).fetchall()
    assert task[:2] == (mine, "charge")
    assert charge_app.execute("select pgflow.run_input(%s)", (mine,)).fetchone() == (
        {"card": "4242"},
    )


def test_a_role_that_does_not_inherit_its_step_role_is_held_too(
    engine: Engine, logins: Logins, orders: dict[str, str]
) -> None:
    """Membership without inheritance still binds: SET ROLE would reach the step role. (A
    NOINHERIT login in the step role and the worker group, acting as the worker group.)"""
    app = logins.create_login(f"{logins.prefix}_noinherit", member_of=orders["mail"])
    for statement in ("alter role {} noinherit", "grant {} to {}"):
        names = [app] if "alter" in statement else [logins.names.of("worker"), app]
        engine.conn.execute(sql.SQL(statement).format(*map(sql.Identifier, names)))
    other = engine.start("plain", {"secret": 1})
    conn = logins.connect(app)
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(logins.names.of("worker"))))
    message = refused(conn, "select pgflow.run_input(%s)", other)
    assert message == f'Role "{app}" may not read the input of run {other}.'


def test_the_owner_and_superusers_are_never_step_roles(
    engine: Engine, orders: dict[str, str]
) -> None:
    run_id = engine.start("plain", {"secret": 1})
    assert engine.value("select pgflow._session_is_step_role()") is False
    assert engine.value("select pgflow.run_input(%s)", run_id) == {"secret": 1}
