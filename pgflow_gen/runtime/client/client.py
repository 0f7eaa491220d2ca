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
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from pgflow_gen.engine import client_statements, statements, support, worker_statements
from pgflow_gen.engine.refusals import RunNotFoundError, engine_error
from pgflow_gen.runtime import database, errors, tracing
from pgflow_gen.runtime.client import operations, run_inputs
from pgflow_gen.runtime.client.models import (
    Run,
    SentSignal,
    StepFailure,
    StepLimits,
    StepPause,
)
from pgflow_gen.runtime.errors import InvalidRunInputError
from pgflow_gen.runtime.flow import Flow, Signal, StepQueuedFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
PayloadT = TypeVar("PayloadT")


#: Connections a Client keeps at most (opened as calls need them, closed after POOL_IDLE_S idle).
POOL_SIZE = 4
POOL_IDLE_S = 300.0
#: How long a call waits for a pooled connection (the database restarting, every one in use).
POOL_WAIT_S = 10.0


class Client:
    """Starts and reads runs. The database: `database_url`, else the environment (see docs).

    Safe to share between threads; `pool_size` connections at most are open at once.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = POOL_SIZE) -> None:
        if pool_size < 1:
            raise errors.ConfigError(
                f"Invalid pool_size={pool_size!r}.", hint="pool_size must be at least 1."
            )
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
            problem = database.config_problem(exc)
            if problem is not None:
                raise problem from None
            if not isinstance(exc, psycopg.OperationalError):
                raise
            raise errors.DatabaseError(
                "Cannot connect to the database.",
                detail=str(exc).strip(),
                hint="Check PGFLOW_DATABASE_URL (or DATABASE_URL) and that PostgreSQL is up.",
            ) from exc

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit) for the statements of one call. A connection the
        database dropped (a restart, an idle timeout) is replaced before it is handed out."""
        pool = self._open_pool()
        try:
            with pool.connection(timeout=POOL_WAIT_S) as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            raise errors.DatabaseError(
                "Cannot connect to the database.",
                detail=f"No connection within {POOL_WAIT_S:g} s: {exc}",
                hint="Check that PostgreSQL is up; the client connects again once it is.",
            ) from exc

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
                    # Unprepared, as a connection per call was: safe behind any PgBouncer.
                    kwargs={"autocommit": True, "prepare_threshold": None},
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
    ) -> Run[OutputT]: ...

    @overload
    def start_flow(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        input: InputT,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> Run[OutputT]: ...

    @overload
    def start_flow(
        self,
        flow: str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> Run[Any]: ...

    def start_flow(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any] | str,
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> Run[Any]:
        """Validate `input` against the flow's input type, then start a run of it.

        `flow` is a generated module's flow, or a compiled flow's slug for a caller without the
        generated module (`pgflow-gen start`, a script): its input is then checked against the
        input schema the flow was compiled with, and the run is untyped.

        With an `idempotency_key`, a run of this flow started with that key before is returned
        as it is (whatever its input and status) and nothing starts, also when several callers
        race; its `run_id` then differs from one passed here. A key lives as long as its run.

        Raises InvalidRunInputError (nothing written), FlowNotFoundError when the flow is not
        compiled in the database, DatabaseError for anything else the database refuses.
        """
        if not isinstance(flow, str):
            run_inputs.validate_input(
                flow.flow if isinstance(flow, StepQueuedFlow) else flow, input
            )
        slug = flow if isinstance(flow, str) else flow.slug
        with self.connection() as conn, _traced(conn):
            if isinstance(flow, str):
                run_inputs.check_against_compiled_schema(conn, slug, input)
            try:
                if idempotency_key is None:
                    row = conn.execute(
                        client_statements.START_FLOW, (slug, Jsonb(input), run_id)
                    ).fetchone()
                else:
                    row = conn.execute(
                        client_statements.START_FLOW_WITH_KEY,
                        (slug, Jsonb(input), run_id, idempotency_key),
                    ).fetchone()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
            if row is None:
                raise errors.DatabaseError(f'pgflow.start_flow returned no run for "{slug}".')
            return self.read_run(conn, row[0])

    @overload
    def start_flows(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[Run[OutputT]]: ...

    @overload
    def start_flows(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        inputs: Sequence[InputT],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[Run[OutputT]]: ...

    def start_flows(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        inputs: Sequence[Any],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[Run[Any]]:
        """Validate every input against the flow's input type, then start a run of the flow
        for each, in one call and one transaction (engine 0014): many times faster than
        `start_flow` in a loop. Returns the runs in input order.

        With `idempotency_keys` (one per input; None for none), an input whose key a run of
        this flow already has returns that run as it is and starts nothing, so a batch sent
        again after a failure starts only what is missing.

            runs = client.start_flows(FLOW, [{"name": "Ada"}, {"name": "Grace"}])

        Raises InvalidRunInputError naming the first bad input's position from 1 (nothing
        written), ValueError when the keys do not pair with the inputs, FlowNotFoundError when
        the flow is not compiled in the database, DatabaseError for anything else the database
        refuses.
        """
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        if idempotency_keys is not None and len(idempotency_keys) != len(inputs):
            raise ValueError(
                f"{len(idempotency_keys)} idempotency keys for {len(inputs)} inputs; pass one"
                " per input (None for none)."
            )
        for position, value in enumerate(inputs, start=1):
            try:
                run_inputs.validate_input(plain, value)
            except InvalidRunInputError as exc:
                raise InvalidRunInputError(
                    f"Input {position} of {len(inputs)}: {exc.message}",
                    detail=exc.detail,
                    hint=exc.hint,
                ) from None
        if not inputs:
            return []
        keys = None if idempotency_keys is None else list(idempotency_keys)
        with self.connection() as conn, _traced(conn):
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    rows = cur.execute(
                        client_statements.START_FLOWS,
                        (plain.slug, [Jsonb(i) for i in inputs], keys),
                    ).fetchall()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
            return [
                Run(
                    **row,
                    client=self,
                    failure=read_failure(conn, row["run_id"])
                    if row["status"] == "failed"
                    else None,
                )
                for row in rows
            ]

    def cancel_run(self, run_id: uuid.UUID, reason: str | None = None) -> Run[Any]:
        """Cancel a started run and return it (status `cancelled`): its queued tasks never
        run, its running handlers are told to stop (`ctx.cancelled`), and their late results
        change nothing.

        Raises RunNotFoundError, RunFinishedError when it is not started (nothing changed),
        DatabaseError for anything else the database refuses.
        """
        with self.connection() as conn:
            operations.perform(conn, operations.cancel_run(run_id, reason))
            return self.read_run(conn, run_id)

    def retry_run(self, run_id: uuid.UUID) -> Run[Any]:
        """Retry a failed run from where it failed and return it (status `started`): its failed
        and unfinished tasks run again with their whole retry budget (their attempt numbers go
        on, so a late result from before is ignored), completed steps keep their outputs
        and do not run again (in a map, only the failed and unfinished elements run).

        Raises RunNotFoundError, RunNotFailedError when it is not failed or its flow has changed
        since (nothing changed), DatabaseError for anything else the database refuses.
        """
        with self.connection() as conn:
            operations.perform(conn, operations.retry_run(run_id))
            return self.read_run(conn, run_id)

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
        with self.connection() as conn:
            forked = operations.perform(conn, operations.fork_run(run_id, from_step))
            return self.read_run(conn, forked.run_id)

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
        action = operations.send_signal(run_id, step_slug, payload)
        with self.connection() as conn:
            return operations.perform(conn, action)

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
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            return operations.perform(conn, operations.pause_step(plain.slug, step_slug, reason))

    def resume_step(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> int:
        """Resume a paused step: the messages its claims held are visible again at once, and
        its tasks start as workers claim them. Returns how many were held (0 for a step that
        was not paused). Raises as `pause_step` does."""
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            return operations.perform(conn, operations.resume_step(plain.slug, step_slug))

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
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        action = operations.set_step_limits(
            plain.slug, step_slug, max_in_flight, rate_limit, rate_period_s
        )
        with self.connection() as conn:
            operations.perform(conn, action)
            found = self._step_limits(conn, plain.slug)
        return next((limits for limits in found if limits.step_slug == step_slug), None)

    def reset_step_limits(
        self,
        flow: Flow[StepSlugT, Any, Any] | StepQueuedFlow[StepSlugT, Any, Any],
        step_slug: StepSlugT,
    ) -> StepLimits | None:
        """Give a step back the limits its flow's spec sets, removing an operator's (engine
        0023): the limits afterwards, None when the spec sets none. Raises FlowNotFoundError or
        StepNotFoundError, DatabaseError for anything else."""
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            operations.perform(conn, operations.reset_step_limits(plain.slug, step_slug))
            found = self._step_limits(conn, plain.slug)
        return next((limits for limits in found if limits.step_slug == step_slug), None)

    def step_limits(
        self, flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any] | None = None
    ) -> list[StepLimits]:
        """The limited steps (of `flow`, or of every flow) with their limits and use now."""
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            return self._step_limits(conn, None if plain is None else plain.slug)

    def _step_limits(
        self, conn: psycopg.Connection[Any], flow_slug: str | None
    ) -> list[StepLimits]:
        usage = statements.step_limit_usage(self._version)
        with conn.cursor(row_factory=class_row(StepLimits)) as cur:
            try:
                return cur.execute(usage, (flow_slug,)).fetchall()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc

    def get_run(self, run_id: uuid.UUID) -> Run[Any]:
        with self.connection() as conn:
            return self.read_run(conn, run_id)

    def read_run(self, conn: psycopg.Connection[Any], run_id: uuid.UUID) -> Run[Any]:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(client_statements.READ_RUN, (run_id,)).fetchone()
        if row is None:
            raise RunNotFoundError(f"Run {run_id} does not exist.")
        failure = read_failure(conn, run_id) if row["status"] == "failed" else None
        return Run(**row, client=self, failure=failure)


@contextlib.contextmanager
def _traced(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """While the caller is traced (runtime/tracing.py), its starts run in a transaction that
    hands its trace context to the engine, so that the runs' tasks join its trace; otherwise
    nothing changes (one statement, autocommit)."""
    parent = tracing.traceparent()
    if parent is None:
        yield
        return
    with conn.transaction():
        conn.execute(worker_statements.SET_TRACEPARENT, (parent,))
        yield


def read_failure(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> StepFailure | None:
    """The first failed step of a run, with its failed task's attempts and error."""
    with conn.cursor(row_factory=class_row(StepFailure)) as cur:
        return cur.execute(client_statements.READ_FAILURE, (run_id,)).fetchone()
