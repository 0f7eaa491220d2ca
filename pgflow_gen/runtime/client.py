"""Starting runs and reading them back, typed by the generated flow module.

>>> from app.pgflow.greet_user import FLOW                       # doctest: +SKIP
>>> run = Client().start_flow(FLOW, {"first": "Ada", "last": "Lovelace"})  # doctest: +SKIP
>>> run.wait(timeout=30).output                                 # doctest: +SKIP
{'greeting': 'Hello, Ada Lovelace!'}

A Client keeps a small pool of connections (psycopg_pool) for its short calls, opened as calls
need them; `Run.wait` listens on a connection of its own. `close()` (or `with Client() as
client:`) releases them at once; otherwise they go when the Client is garbage collected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Generic, Literal, TypeVar, overload

import psycopg
import psycopg_pool
import pydantic
from psycopg import sql
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from pgflow_gen import shape as shapes
from pgflow_gen.engine import statements, support
from pgflow_gen.runtime import database, errors, inputs, queries, roles, tracing
from pgflow_gen.runtime.errors import InvalidRunInputError
from pgflow_gen.runtime.flow import Flow, Signal, StepQueuedFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")
PayloadT = TypeVar("PayloadT")

RunStatus = Literal["started", "completed", "failed", "cancelled"]

#: Connections a Client keeps at most (opened as calls need them, closed after POOL_IDLE_S idle).
POOL_SIZE = 4
POOL_IDLE_S = 300.0
#: How long a call waits for a pooled connection (the database restarting, every one in use).
POOL_WAIT_S = 10.0


class RunNotFoundError(errors.PgflowError):
    code = "run_not_found"


class RunFinishedError(errors.PgflowError):
    """`cancel_run` on a run that is not started (completed, failed or cancelled already):
    nothing changed."""

    code = "run_finished"


class RunNotFailedError(errors.PgflowError):
    """`retry_run` on a run that is not failed, or whose flow has gained a step since it
    started: nothing changed."""

    code = "run_not_failed"


class SignalRefusedError(errors.PgflowError):
    """`send_signal` to a run that is not started, a step that finished or stopped waiting,
    or a step that has its signal already: nothing changed."""

    code = "signal_refused"


class InvalidSignalPayloadError(errors.PgflowError):
    """`send_signal` with a payload that does not match the signal step's payload schema (the
    detail names the place): nothing changed."""

    code = "invalid_signal_payload"


class RunExistsError(errors.PgflowError):
    """`start_flow` with a `run_id` that a run already has: nothing was started."""

    code = "run_exists"


class FlowNotFoundError(errors.PgflowError):
    """No flow of that slug is compiled in the database (compile it: run its worker once, or
    apply its generated migration)."""

    code = "flow_not_found"


class StepNotFoundError(FlowNotFoundError):
    """The flow has no step of that slug (slugs are case-sensitive)."""

    code = "step_not_found"


@dataclass(frozen=True)
class StepPause:
    """A paused step (`Client.pause_step`): no task of it starts until it is resumed."""

    flow_slug: str
    step_slug: str
    reason: str | None
    paused_at: datetime.datetime


class InvalidStepLimitsError(errors.PgflowError):
    """Step limits the engine refuses: not a whole number from 1, a rate limit without its
    period, or a signal step (it runs no task)."""

    code = "invalid_step_limits"


@dataclass(frozen=True)
class StepLimits:
    """A step's limits (`Client.set_step_limits`, engine 0017) and their use now: tasks started
    against `max_in_flight`, task starts in the last `rate_period_s` seconds against
    `rate_limit`. None: no such limit. `set_by` is "spec" or "operator"."""

    flow_slug: str
    step_slug: str
    queue_name: str
    max_in_flight: int | None
    rate_limit: int | None
    rate_period_s: int | None
    set_by: str
    in_flight: int
    window_starts: int
    updated_at: datetime.datetime

    @property
    def in_words(self) -> str:
        """ "3/4 in flight, 42/100 starts per 60 s"."""
        return limits_in_words(dataclasses.asdict(self))


def limits_in_words(limits: Mapping[str, Any]) -> str:
    """A step's limits and their use (step_limit_usage's columns) in a few words, as the CLI,
    the dashboard and `StepLimits.in_words` say them.

    >>> limits_in_words({"max_in_flight": 4, "in_flight": 3, "rate_limit": 100,
    ...                  "rate_period_s": 60, "window_starts": 42})
    '3/4 in flight, 42/100 starts per 60 s'
    """
    parts = []
    if limits["max_in_flight"] is not None:
        parts.append(f"{limits['in_flight']}/{limits['max_in_flight']} in flight")
    if limits["rate_limit"] is not None:
        parts.append(
            f"{limits['window_starts']}/{limits['rate_limit']} starts per"
            f" {limits['rate_period_s']} s"
        )
    if limits.get("limit_per_key") is not None:
        waiting = limits["keys_waiting"]
        parts.append(
            f"{limits['limit_per_key']} per {limits['key_path']}: {limits['keys_active']} keys"
            f" in flight, {waiting} waiting"
            + (
                f" ({limits['parked']:,} tasks, most for {limits['busiest_key']!r})"
                if waiting
                else ""
            )
        )
    return ", ".join(parts)


#: What a step's limits hold when only its concurrency key limits it (engine 0018).
NO_STEP_LIMITS: Final[Mapping[str, Any]] = {
    "max_in_flight": None,
    "in_flight": 0,
    "rate_limit": None,
    "rate_period_s": None,
    "window_starts": 0,
    "set_by": "spec",
}
#: pgflow.concurrency_usage's columns that join a step's limits.
CONCURRENCY_FIELDS = ("key_path", "limit_per_key", "keys_active", "keys_waiting", "admitted",
                      "parked", "busiest_key", "busiest_parked")  # fmt: skip


def with_concurrency(
    limits: Mapping[tuple[str, str], Mapping[str, Any]], usage: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], dict[str, Any]]:
    """Steps' limits by (flow, step), each keyed step's concurrency use
    (pgflow.concurrency_usage's rows) joined in: `limits_in_words` then says its keys too."""
    merged = {key: dict(value) for key, value in limits.items()}
    for row in usage:
        key = (row["flow_slug"], row["step_slug"])
        merged[key] = {
            **NO_STEP_LIMITS,
            "flow_slug": row["flow_slug"],
            "step_slug": row["step_slug"],
            "queue_name": row["queue_name"],
            **merged.get(key, {}),
            **{field: row[field] for field in CONCURRENCY_FIELDS},
        }
    return merged


@dataclass(frozen=True)
class StepFailure:
    """Why a run failed: its first failed step, and the failed task's attempts and error.

    `error` is what the engine stored: `Type: message` on its first line (`summary`), then the
    handler's traceback when there was one. A step failed without a task failure (a condition
    with `when_unmet: fail`, an output of the wrong type) has `task_index` None and 0 attempts.
    """

    step_slug: str
    task_index: int | None
    attempts: int
    error: str | None

    @property
    def summary(self) -> str:
        return (self.error or "no error message").split("\n", 1)[0]

    def describe(self) -> str:
        """One line: `step "greet" task 0, attempt 3: KeyError: 'name'`."""
        where = f'step "{self.step_slug}"'
        if self.task_index is not None:
            where += f" task {self.task_index}, attempt {self.attempts}"
        return f"{where}: {self.summary}"


@dataclass(frozen=True)
class SentSignal:
    """A signal the engine took (`Client.send_signal`): `used_at` is when its step took it as
    its output, None while the step is not ready yet (it takes it the moment it is)."""

    run_id: uuid.UUID
    step_slug: str
    payload: Any
    received_at: datetime.datetime
    used_at: datetime.datetime | None


@dataclass(frozen=True)
class WaitingSignal:
    """A signal step of a run that waits for its signal now; `deadline` None: for ever."""

    step_slug: str
    waiting_since: datetime.datetime
    deadline: datetime.datetime | None


@dataclass(frozen=True)
class UnservedStep:
    """A step of a run with queued tasks and no live worker on its queue."""

    step_slug: str
    queue_name: str
    queued_tasks: int


@dataclass(frozen=True)
class Run(Generic[OutputT]):
    """A run as last read from the database; `wait()` returns a fresher one."""

    run_id: uuid.UUID
    flow_slug: str
    status: RunStatus
    input: Any
    output: OutputT | None
    started_at: datetime.datetime
    completed_at: datetime.datetime | None
    failed_at: datetime.datetime | None
    client: Client = field(repr=False, compare=False)
    #: For a cancelled run: when, and the reason given (None when none was).
    cancelled_at: datetime.datetime | None = None
    cancel_reason: str | None = None
    #: The key it was started with (`start_flow(..., idempotency_key=...)`), if any.
    idempotency_key: str | None = None
    #: How often it was retried (`retry_run`), and when last.
    retry_count: int = 0
    retried_at: datetime.datetime | None = None
    #: For a failed run: which step failed and why (None otherwise).
    failure: StepFailure | None = None

    @property
    def finished(self) -> bool:
        return self.status != "started"

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
            conn.execute(
                sql.SQL("listen {}").format(sql.Identifier(f"pgflow_run_{self.run_id.hex}"))
            )
            while True:
                # Read after LISTEN and after every event, so no transition slips in between.
                current: Run[OutputT] = self.client.read_run(conn, self.run_id)
                if current.finished:
                    return current
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"Run {self.run_id} is still running after {timeout} s.")
                if every_second is not None:
                    every_second()
                    remaining = min(remaining, 1.0)
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
        with conn.cursor(row_factory=class_row(WaitingSignal)) as cur:
            return cur.execute(queries.WAITING_SIGNALS, (self.run_id,)).fetchall()

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
        with conn.cursor(row_factory=class_row(UnservedStep)) as cur:
            return cur.execute(queries.UNSERVED_STEPS, (freshness, self.run_id)).fetchall()


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
                support.require(first)
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

    def start_flow(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        input: Any,
        *,
        run_id: uuid.UUID | None = None,
        idempotency_key: str | None = None,
    ) -> Run[Any]:
        """Validate `input` against the flow's input type, then start a run of it.

        With an `idempotency_key`, a run of this flow started with that key before is returned
        as it is (whatever its input and status) and nothing starts, also when several callers
        race; its `run_id` then differs from one passed here. A key lives as long as its run.

        Raises InvalidRunInputError (nothing written), FlowNotFoundError when the flow is not
        compiled in the database, DatabaseError for anything else the database refuses.
        """
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        validate_input(plain, input)
        with self.connection() as conn, _traced(conn):
            try:
                if idempotency_key is None:
                    row = conn.execute(
                        statements.START_FLOW, (plain.slug, Jsonb(input), run_id)
                    ).fetchone()
                else:
                    row = conn.execute(
                        statements.START_FLOW_WITH_KEY,
                        (plain.slug, Jsonb(input), run_id, idempotency_key),
                    ).fetchone()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
            if row is None:
                raise errors.DatabaseError(f'pgflow.start_flow returned no run for "{plain.slug}".')
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
                validate_input(plain, value)
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
                        queries.START_FLOWS, (plain.slug, [Jsonb(i) for i in inputs], keys)
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
            try:
                conn.execute(queries.CANCEL_RUN, (run_id, reason))
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
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
            try:
                conn.execute(statements.RETRY_RUN, (run_id,))
            except psycopg.Error as exc:
                raise engine_error(exc, refused=RunNotFailedError) from exc
            return self.read_run(conn, run_id)

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
        with self.connection() as conn, conn.cursor(row_factory=class_row(SentSignal)) as cur:
            try:
                row = cur.execute(
                    queries.SEND_SIGNAL, (run_id, step_slug, Jsonb(payload))
                ).fetchone()
            except (TypeError, ValueError) as exc:  # not JSON: nothing was sent
                raise InvalidSignalPayloadError(
                    f'The payload of signal "{step_slug}" is not JSON-serialisable: {exc}.'
                ) from exc
            except psycopg.Error as exc:
                raise signal_error(exc) from exc
        assert row is not None  # send_signal returns its row or raises
        return row

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
        with self.connection() as conn, conn.cursor(row_factory=class_row(StepPause)) as cur:
            try:
                row = cur.execute(queries.PAUSE_STEP, (plain.slug, step_slug, reason)).fetchone()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
        assert row is not None  # pause_step returns its row or raises
        return row

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
            try:
                row = conn.execute(queries.RESUME_STEP, (plain.slug, step_slug)).fetchone()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
        return int(row[0]) if row else 0

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
        clears a limit; the limits afterwards, None when all are cleared. A limit the flow's
        spec sets comes back when its migration is applied again (docs/flow-control.md).

        Raises InvalidStepLimitsError (a value below 1, a rate without its period, a signal
        step), FlowNotFoundError or StepNotFoundError, DatabaseError for anything else.
        """
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            try:
                conn.execute(
                    statements.SET_STEP_LIMITS,
                    (plain.slug, step_slug, max_in_flight, rate_limit, rate_period_s),
                )
            except psycopg.errors.InvalidParameterValue as exc:
                diag = exc.diag
                raise InvalidStepLimitsError(
                    diag.message_primary or str(exc), hint=diag.message_hint
                ) from exc
            except psycopg.Error as exc:
                raise engine_error(exc) from exc
            found = self._step_limits(conn, plain.slug)
        return next((limits for limits in found if limits.step_slug == step_slug), None)

    def step_limits(
        self, flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any] | None = None
    ) -> list[StepLimits]:
        """The limited steps (of `flow`, or of every flow) with their limits and use now."""
        plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
        with self.connection() as conn:
            return self._step_limits(conn, None if plain is None else plain.slug)

    @staticmethod
    def _step_limits(conn: psycopg.Connection[Any], flow_slug: str | None) -> list[StepLimits]:
        with conn.cursor(row_factory=class_row(StepLimits)) as cur:
            try:
                return cur.execute(statements.STEP_LIMIT_USAGE, (flow_slug,)).fetchall()
            except psycopg.Error as exc:
                raise engine_error(exc) from exc

    def get_run(self, run_id: uuid.UUID) -> Run[Any]:
        with self.connection() as conn:
            return self.read_run(conn, run_id)

    def read_run(self, conn: psycopg.Connection[Any], run_id: uuid.UUID) -> Run[Any]:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(queries.READ_RUN, (run_id,)).fetchone()
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
        conn.execute(queries.SET_TRACEPARENT, (parent,))
        yield


def read_failure(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> StepFailure | None:
    """The first failed step of a run, with its failed task's attempts and error."""
    with conn.cursor(row_factory=class_row(StepFailure)) as cur:
        return cur.execute(queries.READ_FAILURE, (run_id,)).fetchone()


def signal_error(exc: psycopg.Error) -> errors.PgflowError:
    """The typed error for a signal the engine refused."""
    diag = exc.diag
    if isinstance(
        exc, psycopg.errors.UniqueViolation | psycopg.errors.ObjectNotInPrerequisiteState
    ):
        kind: type[errors.PgflowError] = SignalRefusedError
    elif (
        isinstance(exc, psycopg.errors.InvalidParameterValue)
        and diag.message_detail
        and ("has no signal step" in (diag.message_primary or ""))
    ):
        kind = StepNotFoundError
    elif isinstance(exc, psycopg.errors.InvalidParameterValue | psycopg.errors.NullValueNotAllowed):
        kind = InvalidSignalPayloadError
    else:
        return engine_error(exc)
    return kind(diag.message_primary or str(exc).strip(), detail=diag.message_detail,
                hint=diag.message_hint)  # fmt: skip


def engine_error(
    exc: psycopg.Error, *, refused: type[errors.PgflowError] = RunFinishedError
) -> errors.PgflowError:
    """The typed error for what the engine refused, keeping its message, detail and hint;
    `refused` for a run in the wrong state for the call."""
    diag = exc.diag
    message = diag.message_primary or str(exc).strip()
    kind: type[errors.PgflowError] = errors.DatabaseError
    if isinstance(exc, psycopg.errors.NoDataFound) and (
        " has no step " in message or " has no signal step " in message
    ):
        kind = StepNotFoundError
    elif isinstance(exc, psycopg.errors.NoDataFound) and message.startswith("Flow "):
        kind = FlowNotFoundError
    elif isinstance(exc, psycopg.errors.NoDataFound) and message.startswith("Run "):
        kind = RunNotFoundError
    elif isinstance(exc, psycopg.errors.ObjectNotInPrerequisiteState) and message.startswith(
        "Run "
    ):
        kind = refused
    elif isinstance(exc, psycopg.errors.UndefinedFunction) and "pgflow." in message:
        return errors.DatabaseError(
            "The database's pgflow engine is too old for this call.",
            detail=message,
            hint="Run `pgflow-gen db migrate` against this database first.",
        )
    elif isinstance(exc, psycopg.errors.InvalidParameterValue | psycopg.errors.NullValueNotAllowed):
        kind = errors.InvalidRunInputError
    elif isinstance(exc, psycopg.errors.UniqueViolation) and diag.constraint_name == "runs_pkey":
        return RunExistsError(
            "A run with this run_id exists already; nothing was started.",
            detail=diag.message_detail,
            hint="Pass a new run_id, or none (the engine makes one).",
        )
    elif isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return errors.DatabaseError(
            message, detail=diag.message_detail, hint=roles.refusal_hint(exc)
        )
    return kind(message, detail=diag.message_detail, hint=diag.message_hint)


def validate_input(flow: Flow[Any, Any, Any], value: Any) -> None:
    """Raise InvalidRunInputError, naming the offending value's JSON path, unless `value` fits
    the flow: JSON, then its input JSON Schema (as `pgflow-gen start` checks it), then its
    `Input` type (pydantic, strict)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRunInputError(
            f'The input of flow "{flow.slug}" is not JSON-serialisable: {exc}.'
        ) from exc
    if flow.input_schema is not None:
        inputs.check(flow.slug, shapes.plain(flow.input_schema), value)
    if flow.input_type is None:
        return
    try:
        _adapter(flow.input_type).validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        problems = [f"{inputs.json_path(error['loc'])}: {error['msg']}" for error in exc.errors()]
        raise InvalidRunInputError(
            f'Invalid input for flow "{flow.slug}": {problems[0]}.',
            detail="; ".join(problems),
            hint="The input must match the flow's Input type (see the generated module).",
        ) from exc


@functools.cache
def _adapter(input_type: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(input_type)
