"""The AsyncClient against the real engine: the Client's calls, awaited, with the Client's
results and errors; `AsyncRun.wait` woken by the engine's notifications and cancellable."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.engine import client_statements
from pgflow_gen.runtime import (
    AsyncClient,
    AsyncRun,
    Client,
    Flow,
    FlowNotFoundError,
    InvalidRunInputError,
    InvalidSignalPayloadError,
    RunFinishedError,
    RunNotFailedError,
    RunNotFoundError,
    Step,
    StepFailure,
    StepNotFoundError,
)
from pgflow_gen.runtime.errors import ConfigError, DatabaseError
from tests.e2e.harness import eventually
from tests.engine import Engine
from tests.runtime.test_client import ADA, FLOW, GreetInput

T = Any
#: FLOW as a caller without its types holds it: mistakes reach the checks at run time.
LOOSE: Flow[Any, Any, Any] = FLOW


@pytest.fixture
def compiled(conn: psycopg.Connection[Any]) -> Engine:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    return Engine(conn)


def with_client(db_url: str, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Run `body` with an AsyncClient on a fresh event loop, and close the client after."""

    async def main() -> T:
        async with AsyncClient(db_url) as client:
            return await body(client)

    return asyncio.run(main())


def listening(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> None:
    """Wait until the waiter sleeps: it listens on a connection of its own, then reads the run,
    so once a second backend beside the pool's has read the run last, it is past its LISTEN."""
    eventually(
        lambda: (
            conn.execute(
                "select count(*) >= 2 from pg_stat_activity where query = %s and state = 'idle'",
                (client_statements.READ_RUN.replace("%s", "$1"),),
            ).fetchone()
            == (True,)
        ),
        f"the waiter for run {run_id} to listen",
    )


def test_start_get_and_wait_return_the_run_the_engine_completed(
    compiled: Engine, conn: psycopg.Connection[Any], db_url: str
) -> None:
    async def body(client: AsyncClient) -> tuple[AsyncRun[Any], AsyncRun[Any], AsyncRun[Any]]:
        run = await client.start_flow(FLOW, ADA)
        waiter = asyncio.create_task(run.wait(timeout=30))
        await asyncio.to_thread(listening, conn, run.run_id)
        for _ in range(2):  # the waiter sleeps on LISTEN meanwhile
            [task] = await asyncio.to_thread(compiled.poll, "greetUser")
            await asyncio.to_thread(compiled.complete, task, "done")
        done = await waiter
        return run, done, await client.get_run(run.run_id)

    run, done, read = with_client(db_url, body)

    assert (run.status, run.input, run.output) == ("started", ADA, None)
    assert (done.status, done.output) == ("completed", {"greeting": "done"})
    assert read == done
    assert isinstance(done, AsyncRun)


def test_the_same_run_reads_the_same_through_both_clients(compiled: Engine, db_url: str) -> None:
    async def body(client: AsyncClient) -> AsyncRun[Any]:
        return await client.start_flow(FLOW, ADA, idempotency_key="ada")

    started = with_client(db_url, body)
    with Client(db_url) as client:
        read = client.get_run(started.run_id)
        again = client.start_flow(FLOW, ADA, idempotency_key="ada")
    assert again.run_id == started.run_id
    assert {**vars(read), "client": None} == {**vars(started), "client": None}


def test_cancelling_the_waiting_task_stops_the_wait_and_closes_its_connection(
    compiled: Engine, conn: psycopg.Connection[Any], db_url: str
) -> None:
    async def body(client: AsyncClient) -> uuid.UUID:
        run = await client.start_flow(FLOW, ADA)
        waiter = asyncio.create_task(run.wait(timeout=600))
        await asyncio.to_thread(listening, conn, run.run_id)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return run.run_id

    run_id = with_client(db_url, body)

    eventually(
        lambda: (
            not conn.execute("select 1 from pg_stat_activity where query like 'LISTEN%'").fetchone()
        ),
        "the waiting connection to close",
    )
    assert compiled.run(run_id)["status"] == "started"  # cancelling the wait cancels no run


def test_wait_gives_up_after_its_timeout(compiled: Engine, db_url: str) -> None:
    async def body(client: AsyncClient) -> None:
        run = await client.start_flow(FLOW, ADA)
        seconds: list[int] = []
        with pytest.raises(TimeoutError, match=f"Run {run.run_id} is still running after"):
            await run.wait(timeout=0.3, every_second=lambda: seconds.append(1))
        assert seconds  # called while the run went on

    with_client(db_url, body)


def test_the_errors_are_the_clients(compiled: Engine, db_url: str) -> None:
    missing = uuid.uuid4()
    not_compiled: Flow[Any, Any, Any] = Flow(slug="notCompiled", steps=(Step(slug="only"),))

    async def body(client: AsyncClient) -> None:
        with pytest.raises(InvalidRunInputError, match=r"\$\.last"):
            await client.start_flow(LOOSE, {"first": "Ada"})
        with pytest.raises(FlowNotFoundError, match='Flow "notCompiled" does not exist'):
            await client.start_flow(not_compiled, {})
        with pytest.raises(RunNotFoundError, match=f"Run {missing} does not exist."):
            await client.get_run(missing)
        run = await client.start_flow(FLOW, ADA)
        await client.cancel_run(run.run_id, "done with it")
        with pytest.raises(RunFinishedError, match="is cancelled already"):
            await client.cancel_run(run.run_id)
        with pytest.raises(RunNotFailedError):
            await client.retry_run(run.run_id)
        with pytest.raises(InvalidSignalPayloadError, match="not JSON-serialisable"):
            await client.send_signal(run.run_id, "approval", object())
        with pytest.raises(StepNotFoundError):
            await client.pause_step(LOOSE, "nope")

    with_client(db_url, body)
    assert compiled.value("select count(*) from pgflow.runs") == 1


def test_start_flows_limits_and_pauses(compiled: Engine, db_url: str) -> None:
    grace: GreetInput = {"first": "Grace", "last": "Hopper"}

    async def body(client: AsyncClient) -> None:
        runs = await client.start_flows(FLOW, [ADA, grace], idempotency_keys=["a", None])
        assert [run.input for run in runs] == [ADA, grace]
        assert await client.start_flows(FLOW, []) == []
        pause = await client.pause_step(FLOW, "fullName", "maintenance")
        assert (pause.step_slug, pause.reason) == ("fullName", "maintenance")
        assert await client.resume_step(FLOW, "fullName") == 0
        limits = await client.set_step_limits(FLOW, "fullName", max_in_flight=2)
        assert limits is not None
        assert limits.in_words == "0/2 in flight"
        assert await client.step_limits() == [limits]
        assert await client.reset_step_limits(FLOW, "fullName") is None

    with_client(db_url, body)


def test_a_failed_runs_failure_and_its_retry(compiled: Engine, db_url: str) -> None:
    compiled.conn.execute("update pgflow.flows set opt_max_attempts = 1")

    async def body(client: AsyncClient) -> None:
        run = await client.start_flow(FLOW, ADA)
        [task] = await asyncio.to_thread(compiled.poll, "greetUser")
        await asyncio.to_thread(compiled.fail, task, "KeyError: 'first'", fenced=True)
        failed = await run.wait(timeout=30)
        assert failed.failure == StepFailure("fullName", 0, 1, "KeyError: 'first'")
        retried = await client.retry_run(run.run_id)
        assert (retried.status, retried.retry_count) == ("started", 1)

    with_client(db_url, body)


def test_a_bad_url_and_an_unreachable_database_say_so() -> None:
    with pytest.raises(ConfigError, match="pool_size=0"):
        AsyncClient(pool_size=0)

    async def start(url: str) -> None:
        async with AsyncClient(url) as client:
            await client.start_flow(FLOW, ADA)

    with pytest.raises(DatabaseError, match="Cannot connect to the database"):
        asyncio.run(start("postgresql://nobody@127.0.0.1:1/x?connect_timeout=2"))
    with pytest.raises(ConfigError, match="The database URL is not valid") as bad:
        asyncio.run(start("postgresql://ada:secret@127.0.0.1/x?sslmode=bogus"))
    assert "secret" not in str(bad.value)
