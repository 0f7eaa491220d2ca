"""The Client: starts, reads, waits for, cancels, retries and signals runs, pauses steps and sets
their limits, on a small pool of connections."""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
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
from pgflow_gen.runtime.client.runs import Run
from pgflow_gen.runtime.flow import Flow, Signal, StepQueuedFlow

__all__ = ["POOL_IDLE_S", "POOL_SIZE", "POOL_WAIT_S", "Client"]

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
PayloadT = TypeVar("PayloadT")
T = TypeVar("T")


class Client:
    """Starts and reads runs. The database: `database_url`, else the environment (see docs).

    Safe to share between threads; `pool_size` connections at most are open at once.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = POOL_SIZE) -> None:
        connections.check_pool_size(pool_size)
        self._database_url = database_url
        self._pool_size = pool_size
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.Lock()
        #: The engine's version, read with the pool's first connection (engine/support.py).
        self._version = support.OLDEST

    @functools.cached_property
    def url(self) -> str:
        return database.resolve_url(self._database_url)

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection of the caller's own (autocommit), for a long-lived use such as
        LISTEN; short calls use `connection()`."""
        try:
            return psycopg.connect(self.url, autocommit=True)
        except psycopg.Error as exc:
            failed = connections.connect_failed(exc)
            if failed is exc:
                raise
            raise failed from (None if isinstance(failed, errors.ConfigError) else exc)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit) for the statements of one call. A connection the
        database dropped (a restart, an idle timeout) is replaced before it is handed out."""
        pool = self._open_pool()
        try:
            with pool.connection(timeout=POOL_WAIT_S) as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            raise connections.pool_timed_out(exc) from exc

    def close(self) -> None:
        """Close the pooled connections now. A later call opens new ones."""
        with self._lock:
            closer, self._pool, self._closer = self._closer, None, None
        if closer is not None:
            closer()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _open_pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        with self._lock:
            if self._pool is not None:
                return self._pool
            # The pool connects in the background and only says "timeout" when it cannot; one
            # connection first says at once what is wrong (a bad URL, a server that is down, an
            # engine outside the support window).
            with self.connect() as first:
                self._version = support.require(first)
            pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
                psycopg_pool.ConnectionPool(
                    self.url,
                    min_size=0,
                    max_size=self._pool_size,
                    max_idle=POOL_IDLE_S,
                    kwargs=connections.CONNECTION_KWARGS,
                    check=psycopg_pool.ConnectionPool.check_connection,
                    name="pgflow-gen client",
                    num_workers=1,
                    open=False,
                )
            )
            pool.open()
            self._closer = weakref.finalize(self, pool.close)
            self._pool = pool
            return pool

    @overload
    def start_flow(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> Run[OutputT]: ...

    @overload
    def start_flow(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> Run[OutputT]: ...

    @overload
    def start_flow(
        self,
        flow: str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> Run[Any]: ...

    def start_flow(
        self,
        flow: AnyFlow | str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> Run[Any]:
        """Validate `input` against the flow's input type, then start a run of it.

        `flow` is a generated module's flow, or a compiled flow's slug for a caller without the
        generated module (`pgflow-gen start`, a script): its input is then checked against the
        input schema the flow was compiled with, and the run is untyped.

        With an `idempotency_key`, a run of this flow started with that key before is returned
        as it is (whatever its input and status) and nothing starts, also when several callers
        race; its `run_id` then differs from one passed here. A key lives as long as its run.

        With a `priority` from 1 to 1000 (engine 0031), the run's tasks are claimed before
        those of runs with a lower one in their queues; 0, the default, is the lowest. Its
        subflow runs take its priority.

        With `connection` (the application's open psycopg connection), the run starts inside
        that connection's transaction: it starts when the application commits, and a rollback
        leaves nothing, no run, no task, no key taken (docs/starting-runs.md).

        Raises InvalidRunInputError (nothing written), FlowNotFoundError when the flow is not
        compiled in the database, UsageError when `connection` has no transaction to join or
        the priority is out of range (or the engine older than 0031), DatabaseError for
        anything else the database refuses.
        """
        call = run_calls.start_flow(flow, input, run_id, idempotency_key, priority)
        return self._run(self._start(call, connection))

    @overload
    def start_flows(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> list[Run[OutputT]]: ...

    @overload
    def start_flows(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> list[Run[OutputT]]: ...

    def start_flows(
        self,
        flow: AnyFlow,
        inputs: Sequence[Any],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priority: int = 0,
        connection: psycopg.Connection[Any] | None = None,
    ) -> list[Run[Any]]:
        """Validate every input against the flow's input type, then start a run of the flow
        for each, in one call and one transaction (engine 0014): many times faster than
        `start_flow` in a loop. Returns the runs in input order.

        With `idempotency_keys` (one per input; None for none), an input whose key a run of
        this flow already has returns that run as it is and starts nothing, so a batch sent
        again after a failure starts only what is missing. Every new run gets `priority`, as
        `start_flow` gives it. With `connection`, the runs start inside its transaction, as
        `start_flow`'s.

            runs = client.start_flows(FLOW, [{"name": "Ada"}, {"name": "Grace"}])

        Raises InvalidRunInputError naming the first bad input's position from 1 (nothing
        written), ValueError when the keys do not pair with the inputs, FlowNotFoundError when
        the flow is not compiled in the database, UsageError when `connection` has no
        transaction to join or the priority is out of range, DatabaseError for anything else
        the database refuses.
        """
        call = run_calls.start_flows(flow, inputs, idempotency_keys, priority)
        if not inputs:
            return []
        return [self._run(row) for row in self._start(call, connection)]

    @overload
    def debounce_start(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart: ...

    @overload
    def debounce_start(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart: ...

    def debounce_start(
        self,
        flow: AnyFlow,
        input: Any,
        *,
        key: str,
        period_s: float,
        max_wait_s: float | None = None,
    ) -> PendingStart:
        """Start a run of `flow` once a burst of starts with `key` is over (engine 0030): starts
        with the key, each within `period_s` seconds of the one before, make one run, started
        `period_s` after the last of them with its input; with `max_wait_s`, no later than that
        after the first, however long the burst goes on. Returns the burst as it is now (when
        its run starts, how many starts it holds). The workers' scheduler starts the run
        (`schedules` setting on; docs/starting-runs.md).

            client.debounce_start(FLOW, {"user_id": 7}, key="digest:7", period_s=60)

        Raises InvalidRunInputError (nothing written), UsageError for a key or a period the
        engine refuses, FlowNotFoundError, DatabaseError for anything else.
        """
        call = run_calls.debounce_start(flow, input, key, period_s, max_wait_s)
        return self._call(call)

    def pending_starts(self, flow: AnyFlow | None = None) -> list[PendingStart]:
        """The debounced bursts whose runs have not started yet (of `flow`, or of every flow),
        the soonest first."""
        slug = None if flow is None else run_calls.flow_slug(flow)
        return self._call(run_calls.pending_starts(slug))

    def cancel_run(self, run_id: uuid.UUID, reason: str | None = None) -> Run[Any]:
        """Cancel a started run and return it (status `cancelled`): its queued tasks never
        run, its running handlers are told to stop (`ctx.cancelled`), and their late results
        change nothing.

        Raises RunNotFoundError, RunFinishedError when it is not started (nothing changed),
        DatabaseError for anything else the database refuses.
        """
        return self._act_on_run(operations.cancel_run(run_id, reason), run_id)

    def retry_run(self, run_id: uuid.UUID) -> Run[Any]:
        """Retry a failed run from where it failed and return it (status `started`): its failed
        and unfinished tasks run again with their whole retry budget (their attempt numbers go
        on, so a late result from before is ignored), completed steps keep their outputs
        and do not run again (in a map, only the failed and unfinished elements run).

        Raises RunNotFoundError, RunNotFailedError when it is not failed or its flow has changed
        since (nothing changed), DatabaseError for anything else the database refuses.
        """
        return self._act_on_run(operations.retry_run(run_id), run_id)

    def fork_run(self, run_id: uuid.UUID, from_step: str) -> Run[Any]:
        """Start a new run of the run's flow with the same input, from `from_step`, and return
        it: every step not downstream of `from_step` is copied as it ended (completed with its
        output, or skipped; none runs again), `from_step` and every step downstream of it run
        fresh, with the handlers' code as it is now. The new run's `forked_from_run_id` and
        `forked_from_step` say where it came from; the old run is left as it was.

        Raises RunNotFoundError, StepNotFoundError, RunNotForkableError when a step to copy did
        not end well or the flow has changed since the run started (nothing was started),
        DatabaseError for anything else the database refuses.
        """
        return self._act_on_run(operations.fork_run(run_id, from_step), None)

    @overload
    def send_signal(
        self, run_id: uuid.UUID, signal: Signal[PayloadT], payload: PayloadT
    ) -> SentSignal: ...

    @overload
    def send_signal(self, run_id: uuid.UUID, signal: str, payload: Any) -> SentSignal: ...

    def send_signal(self, run_id: uuid.UUID, signal: Signal[Any] | str, payload: Any) -> SentSignal:
        """Give a signal step of a run its payload, which becomes the step's output: a step that
        waits completes now and the run goes on; a step that is not ready yet keeps the signal
        until it is. `signal` is the generated `FLOW.signals.<step>` (mypy checks the payload's
        type) or a step slug.

        Raises RunNotFoundError, StepNotFoundError (no such signal step),
        InvalidSignalPayloadError (the engine checks the step's payload schema),
        SignalRefusedError (the run is not started, the step finished or stopped waiting, or
        has its signal already); nothing changed then.
        """
        step_slug = signal if isinstance(signal, str) else signal.step_slug
        return self._call(operations.as_call(operations.send_signal(run_id, step_slug, payload)))

    def pause_step(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
        reason: str | None = None,
    ) -> StepPause:
        """Pause a step of a flow in every run: no task of it starts (its queued tasks wait and
        use no attempt), started ones finish, the other steps go on, until `resume_step`.
        Pausing a paused step keeps when it was paused and takes the new reason.

        Raises FlowNotFoundError or StepNotFoundError, DatabaseError for anything else the
        database refuses.
        """
        action = operations.pause_step(run_calls.flow_slug(flow), step_slug, reason)
        return self._call(operations.as_call(action))

    def resume_step(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> int:
        """Resume a paused step: the messages its claims held are visible again at once, and
        its tasks start as workers claim them. Returns how many were held (0 for a step that
        was not paused). Raises as `pause_step` does."""
        return self._call(
            operations.as_call(operations.resume_step(run_calls.flow_slug(flow), step_slug))
        )

    def set_step_limits(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
        *,
        max_in_flight: int | None = None,
        rate_limit: int | None = None,
        rate_period_s: int | None = None,
    ) -> StepLimits | None:
        """Set a step's limits for every worker, live: at most `max_in_flight` of its tasks
        started at once, at most `rate_limit` task starts in any `rate_period_s` seconds. None
        clears a limit; the limits afterwards, None when all are cleared. They override the
        flow's spec, through worker starts and migrations, until `reset_step_limits`
        (docs/flow-control.md).

        Raises InvalidStepLimitsError (a value below 1, a rate without its period, a signal
        step), FlowNotFoundError or StepNotFoundError, DatabaseError for anything else.
        """
        action = operations.set_step_limits(
            run_calls.flow_slug(flow), step_slug, max_in_flight, rate_limit, rate_period_s
        )
        return self._call(
            run_calls.set_limits(self._version, action, run_calls.flow_slug(flow), step_slug)
        )

    def reset_step_limits(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> StepLimits | None:
        """Give a step back the limits its flow's spec sets, removing an operator's (engine
        0023): the limits afterwards, None when the spec sets none. Raises FlowNotFoundError or
        StepNotFoundError, DatabaseError for anything else."""
        action = operations.reset_step_limits(run_calls.flow_slug(flow), step_slug)
        return self._call(
            run_calls.set_limits(self._version, action, run_calls.flow_slug(flow), step_slug)
        )

    def step_limits(self, flow: AnyFlow | None = None) -> list[StepLimits]:
        """The limited steps (of `flow`, or of every flow) with their limits and use now."""
        flow_slug = None if flow is None else run_calls.flow_slug(flow)
        return self._call(run_calls.step_limits(self._version, flow_slug))

    def get_run(self, run_id: uuid.UUID) -> Run[Any]:
        return self._run(self._call(run_calls.read_run(run_id)))

    def read_run(self, conn: psycopg.Connection[Any], run_id: uuid.UUID) -> Run[Any]:
        """The run as `conn` sees it now (Run.wait reads it on its listening connection)."""
        return self._run(calls.run(conn, run_calls.read_run(run_id)))

    def _call(self, call: Call[T]) -> T:
        with self.connection() as conn:
            return calls.run(conn, call)

    def _start(self, call: Call[T], connection: psycopg.Connection[Any] | None) -> T:
        """Run a start on a pooled connection, or inside `connection`'s transaction; with the
        caller's trace context while it is traced."""
        parent = tracing.traceparent()
        if connection is not None:
            connections.check_joinable(connection)
            traced = run_calls.traced(call, parent, reset=True)
            return calls.run(connection, traced, own_loaders=True)
        with self.connection() as conn:
            traced = run_calls.traced(call, parent, reset=False)
            return calls.run(conn, traced, transaction=parent is not None)

    def _act_on_run(self, action: operations.Action[Any], run_id: uuid.UUID | None) -> Run[Any]:
        """Perform an action on a run and read the run back (`run_id` None: the run the action
        names in its result, as a fork's new run)."""
        with self.connection() as conn:
            done = calls.run(conn, operations.as_call(action))
            row = calls.run(conn, run_calls.read_run(run_id or done.run_id))
        return self._run(row)

    def _run(self, row: Row) -> Run[Any]:
        return Run(**row, client=self)
