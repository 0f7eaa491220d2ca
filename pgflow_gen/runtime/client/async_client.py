"""The AsyncClient: `Client`'s API for asyncio applications (FastAPI, Starlette, aiohttp) on
psycopg's async pool. Each call is `Client`'s own (`run_calls`, `operations`), driven on an async
connection: the same statements, results and errors.

    async with AsyncClient() as client:
        run = await client.start_flow(FLOW, {"first": "Ada", "last": "Lovelace"})
        done = await run.wait(timeout=30)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import psycopg
import psycopg_pool

from pgflow_gen import errors
from pgflow_gen.engine import support
from pgflow_gen.runtime import database, tracing
from pgflow_gen.runtime.client import calls, connections, operations, run_calls
from pgflow_gen.runtime.client.calls import Call, Row
from pgflow_gen.runtime.client.connections import POOL_IDLE_S, POOL_SIZE, POOL_WAIT_S
from pgflow_gen.runtime.client.models import PendingStart, SentSignal, StepLimits, StepPause
from pgflow_gen.runtime.client.run_calls import AnyFlow
from pgflow_gen.runtime.client.runs import AsyncRun
from pgflow_gen.runtime.flow import Flow, Signal, StepQueuedFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
PayloadT = TypeVar("PayloadT")
T = TypeVar("T")

AsyncPool = psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]


class AsyncClient:
    """`Client` for asyncio: every call is a coroutine, every run an `AsyncRun`, the errors are
    `Client`'s. Share one per event loop; `pool_size` connections at most are open at once.
    Close it with `await client.close()` or `async with AsyncClient() as client:`."""

    def __init__(self, database_url: str | None = None, *, pool_size: int = POOL_SIZE) -> None:
        connections.check_pool_size(pool_size)
        self._database_url = database_url
        self._pool_size = pool_size
        self._pool: AsyncPool | None = None
        self._lock = asyncio.Lock()
        #: The engine's version, read with the pool's first connection (engine/support.py).
        self._version = support.OLDEST

    @functools.cached_property
    def url(self) -> str:
        return database.resolve_url(self._database_url)

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        """A new connection of the caller's own (autocommit), for a long-lived use such as
        LISTEN; short calls use `connection()`."""
        try:
            return await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        except psycopg.Error as exc:
            failed = connections.connect_failed(exc)
            if failed is exc:
                raise
            raise failed from (None if isinstance(failed, errors.ConfigError) else exc)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection (autocommit) for the statements of one call."""
        pool = await self._open_pool()
        try:
            async with pool.connection(timeout=POOL_WAIT_S) as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            raise connections.pool_timed_out(exc) from exc

    async def close(self) -> None:
        """Close the pooled connections now. A later call opens new ones."""
        async with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def _open_pool(self) -> AsyncPool:
        async with self._lock:
            if self._pool is not None:
                return self._pool
            # As Client's: one connection first says at once what is wrong.
            async with await self.connect() as first:
                self._version = await support.require_async(first)
            pool: AsyncPool = psycopg_pool.AsyncConnectionPool(
                self.url,
                min_size=0,
                max_size=self._pool_size,
                max_idle=POOL_IDLE_S,
                kwargs=connections.CONNECTION_KWARGS,
                check=psycopg_pool.AsyncConnectionPool.check_connection,
                name="pgflow-gen async client",
                num_workers=1,
                open=False,
            )
            await pool.open()
            self._pool = pool
            return pool

    @overload
    async def start_flow(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> AsyncRun[OutputT]: ...

    @overload
    async def start_flow(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> AsyncRun[OutputT]: ...

    @overload
    async def start_flow(
        self,
        flow: str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> AsyncRun[Any]: ...

    async def start_flow(
        self,
        flow: AnyFlow | str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> AsyncRun[Any]:
        """`Client.start_flow`; `connection` is the application's open async connection."""
        call = run_calls.start_flow(flow, input, run_id, idempotency_key, priority)
        return self._run(await self._start(call, connection))

    @overload
    async def start_flows(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[AsyncRun[OutputT]]: ...

    @overload
    async def start_flows(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[AsyncRun[OutputT]]: ...

    async def start_flows(
        self,
        flow: AnyFlow,
        inputs: Sequence[Any],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[AsyncRun[Any]]:
        """`Client.start_flows`."""
        call = run_calls.start_flows(flow, inputs, idempotency_keys, priority)
        if not inputs:
            return []
        return [self._run(row) for row in await self._start(call, connection)]

    @overload
    async def debounce_start(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart: ...

    @overload
    async def debounce_start(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart: ...

    async def debounce_start(
        self,
        flow: AnyFlow,
        input: Any,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart:
        """`Client.debounce_start`."""
        call = run_calls.debounce_start(flow, input, key, period_s, max_wait_s)
        return await self._call(call)

    async def pending_starts(self, flow: AnyFlow | None = None) -> list[PendingStart]:
        """`Client.pending_starts`."""
        slug = None if flow is None else run_calls.flow_slug(flow)
        return await self._call(run_calls.pending_starts(slug))

    async def cancel_run(self, run_id: uuid.UUID, reason: str | None = None) -> AsyncRun[Any]:
        """`Client.cancel_run`."""
        return await self._act_on_run(operations.cancel_run(run_id, reason), run_id)

    async def retry_run(self, run_id: uuid.UUID) -> AsyncRun[Any]:
        """`Client.retry_run`."""
        return await self._act_on_run(operations.retry_run(run_id), run_id)

    async def fork_run(self, run_id: uuid.UUID, from_step: str) -> AsyncRun[Any]:
        """`Client.fork_run`."""
        return await self._act_on_run(operations.fork_run(run_id, from_step), None)

    @overload
    async def send_signal(
        self, run_id: uuid.UUID, signal: Signal[PayloadT], payload: PayloadT
    ) -> SentSignal: ...

    @overload
    async def send_signal(self, run_id: uuid.UUID, signal: str, payload: Any) -> SentSignal: ...

    async def send_signal(
        self, run_id: uuid.UUID, signal: Signal[Any] | str, payload: Any
    ) -> SentSignal:
        """`Client.send_signal`."""
        step_slug = signal if isinstance(signal, str) else signal.step_slug
        action = operations.send_signal(run_id, step_slug, payload)
        return await self._call(operations.as_call(action))

    async def pause_step(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
        reason: str | None = None,
    ) -> StepPause:
        """`Client.pause_step`."""
        action = operations.pause_step(run_calls.flow_slug(flow), step_slug, reason)
        return await self._call(operations.as_call(action))

    async def resume_step(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> int:
        """`Client.resume_step`."""
        action = operations.resume_step(run_calls.flow_slug(flow), step_slug)
        return await self._call(operations.as_call(action))

    async def set_step_limits(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
        *,
        max_in_flight: int | None = None,
        rate_limit: int | None = None,
        rate_period_s: int | None = None,
    ) -> StepLimits | None:
        """`Client.set_step_limits`."""
        slug = run_calls.flow_slug(flow)
        action = operations.set_step_limits(
            slug, step_slug, max_in_flight, rate_limit, rate_period_s
        )
        return await self._call(run_calls.set_limits(self._version, action, slug, step_slug))

    async def reset_step_limits(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> StepLimits | None:
        """`Client.reset_step_limits`."""
        slug = run_calls.flow_slug(flow)
        action = operations.reset_step_limits(slug, step_slug)
        return await self._call(run_calls.set_limits(self._version, action, slug, step_slug))

    async def step_limits(self, flow: AnyFlow | None = None) -> list[StepLimits]:
        """`Client.step_limits`."""
        slug = None if flow is None else run_calls.flow_slug(flow)
        return await self._call(run_calls.step_limits(self._version, slug))

    async def get_run(self, run_id: uuid.UUID) -> AsyncRun[Any]:
        return self._run(await self._call(run_calls.read_run(run_id)))

    async def read_run(
        self, conn: psycopg.AsyncConnection[Any], run_id: uuid.UUID
    ) -> AsyncRun[Any]:
        """The run as `conn` sees it now (AsyncRun.wait reads it on its listening connection)."""
        return self._run(await calls.run_async(conn, run_calls.read_run(run_id)))

    async def _call(self, call: Call[T]) -> T:
        async with self.connection() as conn:
            return await calls.run_async(conn, call)

    async def _start(self, call: Call[T], connection: psycopg.AsyncConnection[Any] | None) -> T:
        """`Client._start`, awaited."""
        parent = tracing.traceparent()
        if connection is not None:
            connections.check_joinable(connection)
            traced = run_calls.traced(call, parent, reset=True)
            return await calls.run_async(connection, traced, own_loaders=True)
        async with self.connection() as conn:
            traced = run_calls.traced(call, parent, reset=False)
            return await calls.run_async(conn, traced, transaction=parent is not None)

    async def _act_on_run(
        self, action: operations.Action[Any], run_id: uuid.UUID | None
    ) -> AsyncRun[Any]:
        """`Client._act_on_run`, awaited."""
        async with self.connection() as conn:
            done = await calls.run_async(conn, operations.as_call(action))
            row = await calls.run_async(conn, run_calls.read_run(run_id or done.run_id))
        return self._run(row)

    def _run(self, row: Row) -> AsyncRun[Any]:
        return AsyncRun(**row, client=self)
