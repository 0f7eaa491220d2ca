"""The recipes of docs/starting-runs.md (app/recipes/) against the example's database: the run
starts with the ORM's commit, and a rollback leaves neither the order nor the run."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from app.recipes import django_orders, sqlalchemy_orders
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgflow_gen.runtime import AsyncClient
from pgflow_gen.testing import FlowDatabase


class Refused(Exception):
    """The application fails after the start, before its commit."""


def orders_and_runs(db: FlowDatabase) -> tuple[list[Any], list[Any]]:
    with db.connect() as conn:
        orders = conn.execute("select customer from orders order by id").fetchall()
        runs = conn.execute("select run_id, input->>'customer' from pgflow.runs").fetchall()
    return [row[0] for row in orders], runs


def test_a_sqlalchemy_session_starts_the_run_with_its_commit(orders_db: FlowDatabase) -> None:
    # The kit's URL (a Unix socket) by way of psycopg; an application passes its own URL.
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(orders_db.url))
    try:
        with Session(engine) as session, session.begin():
            kept = sqlalchemy_orders.place_order(session, orders_db.client, "Ada", 4200)

        def refused() -> None:
            with Session(engine) as session, session.begin():
                sqlalchemy_orders.place_order(session, orders_db.client, "Grace", 100)
                raise Refused

        with pytest.raises(Refused):
            refused()
    finally:
        engine.dispose()
    assert orders_and_runs(orders_db) == (["Ada"], [(kept, "Ada")])


def test_an_async_sqlalchemy_session_starts_the_run_with_its_commit(
    orders_db: FlowDatabase,
) -> None:
    async def main() -> uuid.UUID:
        engine = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(orders_db.url),
        )
        try:
            async with AsyncClient(orders_db.url) as client:
                async with AsyncSession(engine) as session, session.begin():
                    kept = await sqlalchemy_orders.place_order_async(session, client, "Ada", 1)

                async def refused() -> None:
                    async with AsyncSession(engine) as session, session.begin():
                        await sqlalchemy_orders.place_order_async(session, client, "Grace", 2)
                        raise Refused

                with pytest.raises(Refused):
                    await refused()
        finally:
            await engine.dispose()
        return kept

    kept = asyncio.run(main())
    assert orders_and_runs(orders_db) == (["Ada"], [(kept, "Ada")])


def test_a_django_atomic_block_starts_the_run_with_its_commit(orders_db: FlowDatabase) -> None:
    import django
    from django.conf import settings
    from django.db import connections, transaction

    params = conninfo_to_dict(orders_db.url)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params["dbname"],
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
            }
        },
        USE_TZ=True,
    )
    django.setup()
    try:
        kept = django_orders.place_order(orders_db.client, "Ada", 4200)

        def refused() -> None:
            with transaction.atomic():
                django_orders.place_order(orders_db.client, "Grace", 100)  # in a savepoint
                raise Refused

        with pytest.raises(Refused):
            refused()
    finally:
        connections.close_all()
    assert orders_and_runs(orders_db) == (["Ada"], [(kept, "Ada")])
