"""A run as a client returns it: `Run` from `Client`, `AsyncRun` from `AsyncClient`. Both hold
the same record (`models.RunRecord`) and read themselves again through the client that made them:
`wait()` sleeps on the engine's notifications for the run until it finishes."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg

from pgflow_gen.engine import statements
from pgflow_gen.runtime.client import calls, run_calls
from pgflow_gen.runtime.client.models import RunRecord, UnservedStep, WaitingSignal

OutputT = TypeVar("OutputT")


class RunSource(Protocol):
    """What a Run reads itself again with: the Client that made it."""

    def connect(self) -> psycopg.Connection[Any]: ...
    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]: ...
    def read_run(self, conn: psycopg.Connection[Any], run_id: uuid.UUID) -> Run[Any]: ...


class AsyncRunSource(Protocol):
    """What an AsyncRun reads itself again with: the AsyncClient that made it."""

    async def connect(self) -> psycopg.AsyncConnection[Any]: ...
    def connection(
        self,
    ) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...
    async def read_run(
        self, conn: psycopg.AsyncConnection[Any], run_id: uuid.UUID
    ) -> AsyncRun[Any]: ...


@dataclass(frozen=True)
class Run(RunRecord[OutputT]):
    """A run as last read from the database; `wait()` returns a fresher one."""

    client: RunSource = field(repr=False, compare=False, kw_only=True)

    def wait(
        self, timeout: float = 60.0, *, every_second: Callable[[], None] | None = None
    ) -> Run[OutputT]:
        """Block until the run completes, fails or is cancelled, woken by the engine's
        notifications, and return it; a failed run's `failure` says which step failed, its
        attempts and its error, a cancelled one's `cancel_reason` why.

        With `every_second`, it is also called (and the run read again) once a second while the
        run goes on: a progress display, or a fallback where notifications do not arrive.
        Raises TimeoutError when it is still running after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        with self.client.connect() as conn:
            conn.execute(statements.listen(f"pgflow_run_{self.run_id.hex}"))
            while True:
                # Read after LISTEN and after every event, so no transition slips in between.
                current: Run[OutputT] = self.client.read_run(conn, self.run_id)
                remaining = _wait_left(current, deadline, timeout, every_second)
                if remaining is None:
                    return current
                for _event in conn.notifies(timeout=remaining, stop_after=1):
                    pass

    def waiting_signals(
        self, *, conn: psycopg.Connection[Any] | None = None
    ) -> list[WaitingSignal]:
        """The signal steps of this run that wait for their signal now, in step order (the run
        goes on at each once `Client.send_signal` gives it its payload)."""
        if conn is None:
            with self.client.connection() as pooled:
                return self.waiting_signals(conn=pooled)
        return calls.run(conn, run_calls.waiting_signals(self.run_id))

    def unserved_steps(
        self, freshness: float | None = None, *, conn: psycopg.Connection[Any] | None = None
    ) -> list[UnservedStep]:
        """The steps of this run whose tasks are queued while no live worker (a heartbeat within
        `freshness` seconds; default: the engine's liveness rule, 15 s) serves their queue: the
        run cannot go on until one starts. A caller that asks repeatedly passes its own
        connection."""
        if conn is None:
            with self.client.connection() as pooled:
                return self.unserved_steps(freshness, conn=pooled)
        return calls.run(conn, run_calls.unserved_steps(self.run_id, freshness))


@dataclass(frozen=True)
class AsyncRun(RunRecord[OutputT]):
    """A run as `AsyncClient` last read it; `await wait()` returns a fresher one."""

    client: AsyncRunSource = field(repr=False, compare=False, kw_only=True)

    async def wait(
        self, timeout: float = 60.0, *, every_second: Callable[[], None] | None = None
    ) -> AsyncRun[OutputT]:
        """`Run.wait`, awaited: the task sleeps on the engine's notifications, and cancelling
        it stops the wait and closes its connection."""
        deadline = time.monotonic() + timeout
        async with await self.client.connect() as conn:
            await conn.execute(statements.listen(f"pgflow_run_{self.run_id.hex}"))
            while True:
                current: AsyncRun[OutputT] = await self.client.read_run(conn, self.run_id)
                remaining = _wait_left(current, deadline, timeout, every_second)
                if remaining is None:
                    return current
                async for _event in conn.notifies(timeout=remaining, stop_after=1):
                    pass

    async def waiting_signals(self) -> list[WaitingSignal]:
        """`Run.waiting_signals`, awaited."""
        async with self.client.connection() as conn:
            return await calls.run_async(conn, run_calls.waiting_signals(self.run_id))

    async def unserved_steps(self, freshness: float | None = None) -> list[UnservedStep]:
        """`Run.unserved_steps`, awaited."""
        async with self.client.connection() as conn:
            return await calls.run_async(conn, run_calls.unserved_steps(self.run_id, freshness))


def _wait_left(
    current: RunRecord[Any],
    deadline: float,
    timeout: float,
    every_second: Callable[[], None] | None,
) -> float | None:
    """How long a wait sleeps before it reads the run again; None: it has finished. Raises
    TimeoutError once the deadline has passed."""
    if current.finished:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"Run {current.run_id} is still running after {timeout} s.")
    if every_second is not None:
        every_second()
        remaining = min(remaining, 1.0)
    return remaining
