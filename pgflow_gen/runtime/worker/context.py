"""What a handler gets besides its input: who and where it runs, and how to stop early."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psycopg

from pgflow_gen.engine import worker_statements

InputT = TypeVar("InputT")


class _Lazy:
    """Opens the task's own database connection and loads the run input on first use."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        connect_async: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = None,
    ) -> None:
        self._connect = connect
        self._connect_async = connect_async
        self._connection: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._connection is not None

    def connection(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._connection is None:
                self._connection = self._connect()
            return self._connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    async def connect_async(self) -> psycopg.AsyncConnection[Any]:
        if self._connect_async is None:
            raise RuntimeError("This context has no async database connection.")
        return await self._connect_async()


class _AsyncLazy:
    """The task's own async database connection, opened on first use (async handlers)."""

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]) -> None:
        self._connect = connect
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._lock:
            if self._connection is None:
                self._connection = await self._connect()
            return self._connection

    async def close(self) -> None:
        async with self._lock:
            if self._connection is not None:
                await self._connection.close()
                self._connection = None


@dataclass(frozen=True)
class Context(Generic[InputT]):
    """The second argument of every handler.

    `flow_input()` returns the run input (loaded on first use: map tasks and dependent steps do
    not carry it); `attempt` counts this task's claims, 1 on the first try (known from the
    claim, so reading it runs no query); `shutdown` is set when the worker drains, so long
    handlers can stop early; `cancelled` is set when the step's timeout passes (the attempt
    has failed: a sync handler should stop, its result is discarded), `deadline` is that moment
    on `time.monotonic()`'s clock and `time_left()` the seconds until it; `connection` is a
    database connection for the handler's own queries (opened on first use, closed when the
    handler returns; it is in autocommit mode).

    Async handlers use `await ctx.flow_input_async()` and `await ctx.connection_async()` (an
    `AsyncConnection`): unlike `flow_input()` and `connection`, they do not block the worker's
    event loop while the database answers.
    """

    run_id: uuid.UUID
    step_slug: str
    task_index: int
    worker_id: uuid.UUID
    shutdown: threading.Event
    logger: logging.Logger
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)
    deadline: float = math.inf
    _flow_input: Any = field(default=None, repr=False)
    _lazy: _Lazy | None = field(default=None, repr=False, compare=False)
    _attempt: int = field(default=1, repr=False, compare=False)
    _async_lazy: _AsyncLazy | None = field(default=None, repr=False, compare=False)

    def time_left(self) -> float:
        """Seconds until the step's timeout (0 once it passed)."""
        return max(0.0, self.deadline - time.monotonic())

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._lazy is None:
            raise RuntimeError("This context has no database connection.")
        return self._lazy.connection()

    @property
    def attempt(self) -> int:
        return self._attempt

    def flow_input(self) -> InputT:
        if self._flow_input is not None:
            return self._flow_input  # type: ignore[no-any-return]
        row = self.connection.execute(worker_statements.RUN_INPUT, (self.run_id,)).fetchone()
        value: Any = row[0] if row else None
        object.__setattr__(self, "_flow_input", value)
        return value  # type: ignore[no-any-return]

    async def flow_input_async(self) -> InputT:
        """`flow_input()` for async handlers: a first read runs in a thread, so the worker's
        event loop (other handlers, heartbeats) goes on while the database answers."""
        if self._flow_input is not None:
            return self._flow_input  # type: ignore[no-any-return]
        return await asyncio.to_thread(self.flow_input)

    async def connection_async(self) -> psycopg.AsyncConnection[Any]:
        """An async database connection for the handler's own queries (autocommit), opened on
        first use and closed when the handler returns."""
        if self._lazy is None:
            raise RuntimeError("This context has no database connection.")
        if self._async_lazy is None:
            object.__setattr__(self, "_async_lazy", _AsyncLazy(self._lazy.connect_async))
        assert self._async_lazy is not None
        return await self._async_lazy.connection()

    async def _close_async(self) -> None:
        if self._async_lazy is not None:
            await self._async_lazy.close()
