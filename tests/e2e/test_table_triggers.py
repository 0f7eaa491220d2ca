"""Table triggers end to end (engine 0032): an admin applies the flow's generated migration, an
application role that may only write its table places orders, and the flow's generated worker
process, with the worker role, runs the runs the committed writes started: one per placed
order, none for a draft, none for a write rolled back."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from tests.e2e.harness import PROJECT, Db, Workers, eventually
from tests.roles import Logins

MIGRATION = PROJECT / "app" / "pgflow" / "migrations" / "e2eOrdered.sql"


def test_a_placed_order_starts_a_run_that_the_worker_completes(
    workers: Workers, db: Db, logins: Logins
) -> None:
    # The `db` fixture made the application's table, public.e2e_orders (app/schema.sql).
    admin = logins.login_role("admin")
    db.conn.execute(
        sql.SQL("grant trigger on public.e2e_orders to {}").format(sql.Identifier(admin))
    )
    logins.connect(admin).execute(MIGRATION.read_text())

    writer = logins.create_login(f"{logins.prefix}_shop")
    db.conn.execute(
        sql.SQL("grant select, insert, update on public.e2e_orders to {}").format(
            sql.Identifier(writer)
        )
    )
    shop = logins.connect(writer)
    with shop.transaction(force_rollback=True):
        shop.execute("insert into public.e2e_orders (customer, status) values ('gone', 'placed')")
    shop.execute("insert into public.e2e_orders (customer) values ('draft')")
    shop.execute("insert into public.e2e_orders (customer, status) values ('ada', 'placed')")
    shop.execute("update public.e2e_orders set status = 'placed' where customer = 'draft'")

    worker_url = logins.url_of(logins.login_role("worker"))
    workers.start("e2e_ordered", "worker", PGFLOW_DATABASE_URL=worker_url)

    def finished() -> list[dict[str, Any]] | None:
        rows = db.all("select input, status, output from pgflow.runs")
        return rows if all(r["status"] == "completed" for r in rows) else None

    runs = eventually(finished, "every run the orders started completed")
    # The rolled-back order (id 1) took its run with it; the draft (id 2) started none, even
    # once an update placed it: the trigger is on inserts.
    assert runs == [
        {"input": {"order_id": 3, "customer": "ada"}, "status": "completed",
         "output": {"confirm": "order 3 for ada confirmed"}},
    ]  # fmt: skip
