"""Upgrading 0031 to 0032 (table triggers): work claimed on 0031 finishes; a generated flow
migration without triggers applies on 0031 and on 0032, one with triggers is refused on 0031
with what to do, changing nothing, and installs its triggers once the engine is migrated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to

GOLDEN = Path(__file__).parents[1] / "golden" / "cases"
PLAIN = GOLDEN / "plain_flow" / "expected" / "migrations" / "greetUser.sql"
TRIGGERED = GOLDEN / "table_triggers" / "expected" / "migrations" / "orderPaid.sql"
TABLES = """
create table public.orders (id int primary key, status text, total numeric, customer_email text);
create schema shop;
create table shop.imported_orders (id int primary key, status text, amount numeric,
  refunded_at timestamptz);
"""


@pytest.fixture
def version_31(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0031") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0032")


def apply(engine: Engine, migration: Path) -> None:
    with engine.conn.transaction():
        engine.conn.execute(migration.read_text(encoding="utf-8").encode())


def test_work_claimed_on_0031_finishes(version_31: Engine) -> None:
    claimed_work_finishes(version_31, upgrade)


def test_flow_migrations_with_triggers_wait_for_0032_and_those_without_apply_on_both(
    version_31: Engine,
) -> None:
    engine = version_31
    engine.conn.execute(TABLES)
    apply(engine, PLAIN)
    with pytest.raises(psycopg.errors.RaiseException) as caught:
        apply(engine, TRIGGERED)
    assert caught.value.diag.message_primary == (
        'Flow "orderPaid" has table triggers, which need engine 0032 or later.'
    )
    assert caught.value.diag.message_hint == "Migrate the engine first: pgflow-gen db migrate."
    assert engine.value("select count(*) from pgflow.flows where flow_slug = 'orderPaid'") == 0

    upgrade(engine)
    apply(engine, PLAIN)
    apply(engine, TRIGGERED)
    engine.conn.execute("insert into shop.imported_orders values (7, 'paid', 12.5, null)")
    engine.conn.execute("insert into public.orders values (8, 'new', 3, 'a@example.com')")
    engine.conn.execute("update public.orders set status = 'paid'")
    runs = engine.all("select input from pgflow.runs order by started_at")
    assert [r["input"] for r in runs] == [
        {"order_id": 7, "total": 12.5},
        {"order_id": 8, "total": 3, "email": "a@example.com"},
    ]
