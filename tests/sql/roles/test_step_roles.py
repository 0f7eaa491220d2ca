"""Per-step credentials (engine 0019, `pgflow-gen db roles --per-step FLOW`): a step's own login
role claims, reports on and reads only its own step's tasks, through every function."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.engine import roles
from pgflow_gen.errors import UsageError
from tests.engine import Engine
from tests.roles import Logins, refused

STEPS: list[dict[str, Any]] = [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}]
CHARGE, MAIL = "orders__charge", "orders__mail"
CHARGER = uuid.UUID("00000000-0000-0000-0000-00000000c001")
MAILER = uuid.UUID("00000000-0000-0000-0000-00000000c002")
CLAIMED = (
    "select run_id, step_slug, task_index, attempt, input, flow_input"
    " from pgflow.read_and_claim(%s, %s, %s, 10, 30, %s)"
)


@pytest.fixture
def orders(
    engine: Engine, logins: Logins
) -> tuple[psycopg.Connection[Any], psycopg.Connection[Any]]:
    """The flow, its step roles, and a connection as each: (charge's, mail's)."""
    engine.compile("orders", STEPS)
    made = logins.add_step_roles("orders")
    assert [(r.role, r.step_slug) for r in made] == [
        (f"{logins.prefix}_{CHARGE}", "charge"),
        (f"{logins.prefix}_{MAIL}", "mail"),
    ]
    charge, mail = (logins.connect(r.role) for r in made)
    charge.execute(
        "select pgflow.register_worker(%s, %s, 'charge', 'orders', 'charge')", (CHARGER, CHARGE)
    )
    mail.execute("select pgflow.register_worker(%s, %s, 'mail', 'orders', 'mail')", (MAILER, MAIL))
    return charge, mail


def test_each_step_role_runs_its_own_step(engine: Engine, orders: Any) -> None:
    charge, mail = orders
    run_id = engine.start("orders", {"card": "4242"})
    [task] = charge.execute(CLAIMED, ("orders", CHARGE, CHARGER, "charge")).fetchall()
    assert task[5] == {"card": "4242"}  # a root step gets the run input, handed by the claim
    charge.execute(
        "select pgflow.complete_task(%s, 'charge', 0, %s, %s)",
        (run_id, Jsonb({"paid": 10}), task[3]),
    )
    [task] = mail.execute(CLAIMED, ("orders", MAIL, MAILER, "mail")).fetchall()
    assert task[4] == {"charge": {"paid": 10}}
    # Its own run's input, because the run has a task of its step:
    assert mail.execute("select pgflow.run_input(%s)", (run_id,)).fetchone() == ({"card": "4242"},)
    mail.execute(
        "select pgflow.complete_tasks(array[%s]::uuid[], array['mail'], array[0],"
        " array[%s]::jsonb[], array[%s])",
        (run_id, Jsonb({}), task[3]),
    )
    assert engine.run(run_id)["status"] == "completed"


def test_a_step_role_cannot_claim_another_steps_tasks(engine: Engine, orders: Any) -> None:
    _, mail = orders
    engine.start("orders", {"card": "4242"})
    message = refused(mail, CLAIMED, "orders", CHARGE, MAILER, "charge")
    assert message.endswith('may not work on step "charge" of flow "orders".')
    refused(
        mail,
        "select * from pgflow.claim_tasks('orders', array[1]::bigint[], %s, %s, 'charge')",
        MAILER,
        CHARGE,
    )
    refused(mail, "select * from pgflow.read_and_claim('orders', %s, %s, 10, 30)", CHARGE, MAILER)
    refused(
        mail,
        "select * from pgflow.complete_and_claim('orders', %s, %s, 10, 30, 'charge',"
        " '{}', '{}', '{}', '{}', '{}')",
        CHARGE,
        MAILER,
    )
    refused(
        mail,
        "select * from pgflow.start_tasks('orders', array[1]::bigint[], %s, %s, 'charge')",
        MAILER,
        CHARGE,
    )
    refused(mail, "select * from pgflow.set_vt_batch(%s, array[1]::bigint[], array[600])", CHARGE)
    refused(mail, "select pgflow.enable_insert_notifications(%s)", CHARGE)
    refused(mail, f"select * from pgmq.q_{CHARGE}")
    refused(
        mail, "select pgflow.register_worker(%s, %s, 'x', 'orders', 'charge')", uuid.uuid4(), CHARGE
    )
    refused(mail, "select pgflow.heartbeat_worker(%s)", CHARGER)
    refused(mail, "select pgflow.mark_worker_stopped(%s)", CHARGER)
    # Nothing was taken from charge's queue:
    assert engine.value(f"select read_ct from pgmq.q_{CHARGE}") == 0


def test_a_step_role_cannot_report_on_or_read_another_steps_tasks(
    engine: Engine, orders: Any
) -> None:
    charge, mail = orders
    run_id = engine.start("orders", {"card": "4242"})
    [task] = charge.execute(CLAIMED, ("orders", CHARGE, CHARGER, "charge")).fetchall()
    refused(mail, "select pgflow.complete_task(%s, 'charge', 0, '{}', %s)", run_id, task[3])
    refused(mail, "select pgflow.fail_task(%s, 'charge', 0, 'no', %s)", run_id, task[3])
    refused(
        mail,
        "select pgflow.complete_tasks(array[%s]::uuid[], array['charge'], array[0],"
        " array['{}']::jsonb[], array[%s])",
        run_id,
        task[3],
    )
    refused(
        mail,
        "select pgflow.renew_task_leases(%s, array[%s]::uuid[], array['charge'], array[0],"
        " array[%s])",
        CHARGER,
        run_id,
        task[3],
    )
    # mail has no task in this run yet: the run's input is not its to read.
    refused(mail, "select pgflow.run_input(%s)", run_id)
    refused(mail, "select input from pgflow.runs")
    assert engine.task(run_id, "charge")["status"] == "started"


def test_a_flow_on_one_queue_cannot_have_step_roles(engine: Engine, logins: Logins) -> None:
    engine.flow("single", {"slug": "only"})
    with pytest.raises(UsageError, match="uses one queue for all its steps"):
        roles.step_roles(engine.conn, "single", logins.prefix)
    with pytest.raises(UsageError, match='Flow "nowhere" is not compiled'):
        roles.step_roles(engine.conn, "nowhere", logins.prefix)
