"""Who may set a flow's table triggers and who starts runs through them (engine 0032), with real
login roles: an admin who may put triggers on the table sets them; no other role does, and no
admin without the TRIGGER privilege; a role that only writes the table starts runs through them
without being a client; nobody borrows the trigger function for a table of their own."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.roles import Logins, refused

TRIGGERS = Jsonb([{"name": "paid", "table": "public.orders", "input": {"order_id": "id"}}])
SET = "select pgflow.set_flow_triggers('orderFlow', %s)"


@pytest.fixture
def orders(engine: Engine) -> Engine:
    engine.flow("orderFlow", {"slug": "charge"})
    engine.conn.execute(
        "create table public.orders (id int generated always as identity, note text)"
    )
    return engine


def grant(engine: Engine, privilege: str, role: str) -> None:
    engine.conn.execute(
        sql.SQL("grant {} on public.orders to {}").format(sql.SQL(privilege), sql.Identifier(role))
    )


def test_an_admin_with_the_trigger_privilege_sets_triggers_and_no_other_role(
    orders: Engine, logins: Logins
) -> None:
    for kind in ("client", "worker", "reader"):
        grant(orders, "trigger", logins.login_role(kind))
        assert "permission denied for function set_flow_triggers" in refused(
            logins.login(kind), SET, TRIGGERS
        )
    admin = logins.login("admin")
    error = refused(admin, SET, TRIGGERS)
    assert error == (
        f'Flow "orderFlow" trigger "paid": role {logins.login_role("admin")} may not put triggers'
        " on table public.orders."
    )
    assert orders.value("select count(*) from pgflow.flow_triggers") == 0

    grant(orders, "trigger", logins.login_role("admin"))
    assert admin.execute(SET, (TRIGGERS,)).fetchone() is not None
    assert orders.value("select count(*) from pgflow.flow_triggers") == 1


def test_a_role_that_only_writes_the_table_starts_runs_through_its_trigger(
    orders: Engine, logins: Logins
) -> None:
    orders.value(SET, TRIGGERS)
    writer = logins.create_login(f"{logins.prefix}_app")
    grant(orders, "insert, update", writer)
    app = logins.connect(writer)
    app.execute("insert into public.orders (note) values ('x')")
    assert orders.all("select input from pgflow.runs") == [{"input": {"order_id": 1}}]
    # It reads and calls nothing of the engine's itself.
    refused(app, "select * from pgflow.runs")
    refused(app, "select pgflow.start_flow('orderFlow', '{}')")


def test_nobody_borrows_the_trigger_function_for_a_table_of_their_own(
    orders: Engine, logins: Logins
) -> None:
    orders.value(SET, TRIGGERS)
    # A client that owns a table: it may use the schema pgflow, and call start_flow.
    owner = logins.create_login(f"{logins.prefix}_owner", member_of=logins.names.of("client"))
    orders.conn.execute(
        sql.SQL("grant create on schema public to {}").format(sql.Identifier(owner))
    )
    conn = logins.connect(owner)
    conn.execute("create table public.mine (id int)")
    assert "_table_trigger" in refused(
        conn,
        "create trigger borrow after insert on public.mine for each row"
        " execute function pgflow._table_trigger('orderFlow', 'paid')",
    )
    # Even one the engine's owner made by hand starts nothing: the definition is for orders.
    orders.conn.execute(
        "create trigger borrow after insert on public.mine for each row"
        " execute function pgflow._table_trigger('orderFlow', 'paid')"
    )
    conn.execute("insert into public.mine values (1)")
    assert orders.value("select count(*) from pgflow.runs") == 0
    orders.conn.execute("drop table public.mine")


def test_the_trigger_tables_are_for_readers_to_read_and_nobody_to_write(
    orders: Engine, logins: Logins
) -> None:
    orders.value(SET, TRIGGERS)
    reader = logins.login("reader")
    assert reader.execute("select trigger_name from pgflow.flow_triggers").fetchall() == [("paid",)]
    assert reader.execute("select count(*) from pgflow.trigger_skips").fetchone() == (0,)
    for kind in ("client", "worker", "admin"):
        conn: psycopg.Connection[tuple[object, ...]] = logins.login(kind)
        refused(conn, "update pgflow.flow_triggers set on_error = 'skip'")
        refused(
            conn,
            "insert into pgflow.trigger_skips (flow_slug, trigger_name, table_name, operation,"
            " sqlstate, message) values ('f', 't', 'x', 'INSERT', '0', 'm')",
        )
