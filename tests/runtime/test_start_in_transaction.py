"""Starting runs inside the application's own transaction (`start_flow(..., connection=conn)`):
the run starts when the application commits, a rollback leaves nothing, and workers see no task
before the commit, whichever client starts it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg.types.string import TextLoader

from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import AsyncClient, Client, Flow, FlowNotFoundError, Step, tracing
from tests.engine import Engine
from tests.runtime.test_client import ADA, FLOW

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    conn.execute("create table orders (id int primary key, customer text not null)")
    return Engine(conn)


@pytest.fixture
def client(db_url: str) -> Iterator[Client]:
    with Client(db_url) as client:
        yield client


def runs(engine: Engine) -> list[dict[str, Any]]:
    return engine.all("select run_id, idempotency_key from pgflow.runs order by started_at")


def test_the_run_starts_with_the_applications_commit(
    engine: Engine, client: Client, db_url: str
) -> None:
    with psycopg.connect(db_url) as app:  # out of autocommit, as applications' connections are
        app.execute("insert into orders values (1, 'Ada')")
        run = client.start_flow(FLOW, ADA, connection=app, idempotency_key="order-1")

        assert (run.status, run.input) == ("started", ADA)  # read inside the transaction
        assert runs(engine) == []  # no other session sees it yet
        assert engine.poll("greetUser") == []  # a worker reads no task of it
        app.commit()

    assert runs(engine) == [{"run_id": run.run_id, "idempotency_key": "order-1"}]
    [task] = engine.poll("greetUser")
    assert (task.run_id, task.step_slug) == (run.run_id, "fullName")
    assert engine.value("select count(*) from orders") == 1


def test_a_rollback_leaves_no_run_no_task_and_no_key_taken(
    engine: Engine, client: Client, db_url: str
) -> None:
    with psycopg.connect(db_url) as app:
        app.execute("insert into orders values (2, 'Grace')")
        gone = client.start_flow(FLOW, ADA, connection=app, idempotency_key="order-2")
        app.rollback()

    assert runs(engine) == []
    assert engine.poll("greetUser") == []
    assert engine.value("select count(*) from pgmq.q_greetuser") == 0
    assert engine.value("select count(*) from orders") == 0
    again = client.start_flow(FLOW, ADA, idempotency_key="order-2")  # the key is free
    assert again.run_id != gone.run_id
    assert runs(engine) == [{"run_id": again.run_id, "idempotency_key": "order-2"}]


def test_an_autocommit_connection_joins_its_transaction_block(
    engine: Engine, client: Client, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as app:

        def failing() -> None:
            with app.transaction():
                client.start_flows(FLOW, [ADA, ADA], connection=app)
                raise ZeroDivisionError  # the application fails after the start: all rolls back

        with pytest.raises(ZeroDivisionError):
            failing()
        assert runs(engine) == []
        with app.transaction():
            [run] = client.start_flows(FLOW, [ADA], connection=app)
    assert [row["run_id"] for row in runs(engine)] == [run.run_id]


def test_a_connection_with_no_transaction_to_join_is_refused(
    engine: Engine, client: Client, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as app, pytest.raises(UsageError) as refused:
        client.start_flow(FLOW, ADA, connection=app)
    assert str(refused.value) == (
        "start_flow(connection=...) needs a transaction to join, and the connection is in"
        " autocommit mode outside one; nothing was started.\n"
        "HINT: Start inside `with conn.transaction():` (Django: `transaction.atomic()`), or leave"
        " out `connection=` to start the run in a transaction of its own."
    )
    with psycopg.connect(db_url) as app:
        with pytest.raises(psycopg.errors.DivisionByZero):
            app.execute("select 1 / 0")
        with pytest.raises(UsageError, match="has failed already; nothing was started"):
            client.start_flows(FLOW, [ADA], connection=app)
    assert runs(engine) == []


def test_a_refused_start_fails_the_applications_transaction_with_the_typed_error(
    engine: Engine, client: Client, db_url: str
) -> None:
    not_compiled: Flow[Any, Any, Any] = Flow(slug="notCompiled", steps=(Step(slug="only"),))
    with psycopg.connect(db_url) as app:
        app.execute("insert into orders values (3, 'Ada')")
        with pytest.raises(FlowNotFoundError, match='Flow "notCompiled" does not exist'):
            client.start_flow(not_compiled, {}, connection=app)
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    assert engine.value("select count(*) from orders") == 0


def test_the_applications_own_json_loaders_change_nothing_it_reads(
    engine: Engine, client: Client, db_url: str
) -> None:
    with psycopg.connect(db_url) as app:
        app.adapters.register_loader("jsonb", TextLoader)  # as Django's connections do
        run = client.start_flow(FLOW, ADA, connection=app)
        assert run.input == ADA
        assert app.execute("select '{\"a\": 1}'::jsonb").fetchone() == ('{"a": 1}',)
        app.commit()
    assert client.get_run(run.run_id).input == ADA


def test_the_callers_trace_goes_with_the_run_and_no_further(
    engine: Engine, client: Client, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "traceparent", lambda: TRACEPARENT)
    with psycopg.connect(db_url) as app:
        run = client.start_flow(FLOW, ADA, connection=app)
        assert app.execute("select current_setting('pgflow.traceparent', true)").fetchone() == ("",)
        app.commit()
    assert engine.value("select traceparent from pgflow.runs where run_id = %s", run.run_id) == (
        TRACEPARENT
    )


def test_the_async_client_starts_in_the_applications_transaction(
    engine: Engine, db_url: str
) -> None:
    async def main() -> tuple[uuid.UUID, uuid.UUID]:
        async with AsyncClient(db_url) as client:
            async with await psycopg.AsyncConnection.connect(db_url) as app:
                await app.execute("insert into orders values (4, 'Ada')")
                kept = await client.start_flow(FLOW, ADA, connection=app)
                assert runs(engine) == []
                await app.commit()
                await app.execute("insert into orders values (5, 'Grace')")
                [gone] = await client.start_flows(FLOW, [ADA], connection=app)
                await app.rollback()
                await app.set_autocommit(True)
                with pytest.raises(UsageError, match="needs a transaction to join"):
                    await client.start_flow(FLOW, ADA, connection=app)
            return kept.run_id, gone.run_id

    kept, gone = asyncio.run(main())
    assert [row["run_id"] for row in runs(engine)] == [kept]
    assert gone != kept
    [task] = engine.poll("greetUser")
    assert task.run_id == kept
    assert engine.value("select array_agg(id) from orders") == [4]
