"""The clients' calls (`calls.py`), each written once: starting runs (and debouncing starts),
reading a run back with its failure, what a run waits on, and steps' limits. `Client` and
`AsyncClient` drive them.

A start's input is checked when the call is made, before any connection is taken: a bad input
raises InvalidRunInputError and nothing is sent.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any, Final, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.engine import client_statements, refusals, statements, worker_statements
from pgflow_gen.engine.refusals import RunNotFoundError
from pgflow_gen.errors import DatabaseError, PgflowError, UsageError
from pgflow_gen.runtime import inputs
from pgflow_gen.runtime.client import run_inputs
from pgflow_gen.runtime.client.calls import Call, Query, Row
from pgflow_gen.runtime.client.models import (
    PendingStart,
    RunRecord,
    StepFailure,
    StepLimits,
    UnservedStep,
    WaitingSignal,
)
from pgflow_gen.runtime.client.operations import Action, as_call
from pgflow_gen.runtime.errors import InvalidRunInputError
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow

T = TypeVar("T")
AnyFlow = Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any]


#: The highest priority a run can have; 0, the default, is the lowest (engine 0031).
MAX_PRIORITY: Final = 1000


def check_priority(priority: int) -> None:
    """UsageError unless `priority` is a whole number from 0 to MAX_PRIORITY, as the engine
    requires; checked before anything is sent."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not 0 <= priority <= MAX_PRIORITY
    ):
        raise UsageError(
            f"A run's priority must be a whole number from 0 to {MAX_PRIORITY}, got {priority!r}.",
            hint="0 is the default and the lowest; a run with a higher one has its tasks claimed"
            " first (docs/starting-runs.md).",
        )


def start_flow(
    flow: AnyFlow | str,
    input: Any,
    run_id: uuid.UUID | None,
    idempotency_key: str | None,
    priority: int = 0,
) -> Call[Row]:
    """Start a run of `flow` (checked against its input type, or for a slug against the schema
    it was compiled with); the run's row as `read_run` returns it."""
    check_priority(priority)
    if isinstance(flow, str):
        run_inputs.require_json(flow, input)
        return _start_flow(flow, input, run_id, idempotency_key, priority, check_compiled=True)
    run_inputs.validate_input(_plain(flow), input)
    return _start_flow(flow.slug, input, run_id, idempotency_key, priority, check_compiled=False)


def _start_flow(
    slug: str,
    input: Any,
    run_id: uuid.UUID | None,
    idempotency_key: str | None,
    priority: int,
    *,
    check_compiled: bool,
) -> Call[Row]:
    if check_compiled:
        found = yield Query(statements.FLOW_INPUT_SCHEMA, (slug,))
        if found and found[0]["schema"] is not None:
            inputs.check(slug, found[0]["schema"], input)
    if priority:
        rows = yield Query(
            client_statements.START_FLOW_WITH_PRIORITY,
            (slug, Jsonb(input), run_id, idempotency_key, priority),
            _priority_refusal,
        )
    elif idempotency_key is None:
        rows = yield Query(client_statements.START_FLOW, (slug, Jsonb(input), run_id))
    else:
        rows = yield Query(
            client_statements.START_FLOW_WITH_KEY, (slug, Jsonb(input), run_id, idempotency_key)
        )
    if not rows:
        raise DatabaseError(f'pgflow.start_flow returned no run for "{slug}".')
    return (yield from read_run(rows[0]["run_id"]))


def start_flows(
    flow: AnyFlow,
    inputs_: Sequence[Any],
    idempotency_keys: Sequence[str | None] | None,
    priority: int = 0,
) -> Call[list[Row]]:
    """Start a run of `flow` for each input in one statement; the runs' rows in input order.
    Raises at once InvalidRunInputError naming the first bad input's position from 1, ValueError
    when the keys do not pair with the inputs, UsageError for a priority out of range."""
    check_priority(priority)
    plain = _plain(flow)
    if idempotency_keys is not None and len(idempotency_keys) != len(inputs_):
        raise ValueError(
            f"{len(idempotency_keys)} idempotency keys for {len(inputs_)} inputs; pass one"
            " per input (None for none)."
        )
    for position, value in enumerate(inputs_, start=1):
        try:
            run_inputs.validate_input(plain, value)
        except InvalidRunInputError as exc:
            raise InvalidRunInputError(
                f"Input {position} of {len(inputs_)}: {exc.message}",
                detail=exc.detail,
                hint=exc.hint,
            ) from None
    keys = None if idempotency_keys is None else list(idempotency_keys)
    return _start_flows(plain.slug, [Jsonb(value) for value in inputs_], keys, priority)


def _start_flows(
    slug: str, inputs_: list[Jsonb], keys: list[str | None] | None, priority: int
) -> Call[list[Row]]:
    if not inputs_:
        return []
    if priority:
        rows = yield Query(
            client_statements.START_FLOWS_WITH_PRIORITY,
            (slug, inputs_, keys, priority),
            _priority_refusal,
        )
    else:
        rows = yield Query(client_statements.START_FLOWS, (slug, inputs_, keys))
    runs = [_run_fields(row) for row in rows]
    for run in runs:
        run["failure"] = (yield from _failure(run["run_id"])) if run["status"] == "failed" else None
    return runs


def debounce_start(
    flow: AnyFlow, input: Any, key: str, period_s: float, max_wait_s: float | None
) -> Call[PendingStart]:
    """Add a start of `flow` to the burst of `key` (engine 0030); the burst as it is now. The
    input is checked as start_flow checks it, when the call is made."""
    run_inputs.validate_input(_plain(flow), input)
    return _debounce_start(_plain(flow).slug, input, key, period_s, max_wait_s)


def _debounce_start(
    slug: str, input: Any, key: str, period_s: float, max_wait_s: float | None
) -> Call[PendingStart]:
    rows = yield Query(
        client_statements.DEBOUNCE_START,
        (slug, Jsonb(input), key, period_s, max_wait_s),
        _debounce_refusal,
    )
    return PendingStart(**rows[0])


def _debounce_refusal(exc: psycopg.Error) -> PgflowError:
    """A key or a period out of bounds is the caller's mistake (UsageError); the rest as for
    any call."""
    message = exc.diag.message_primary or ""
    if isinstance(exc, psycopg.errors.InvalidParameterValue) and not message.startswith(
        "A debounced start needs an input"
    ):
        return UsageError(message, hint="Nothing was started or changed.")
    return refusals.engine_error(exc)


def priority_unsupported() -> UsageError:
    """What a start with a priority gets from an engine before 0031."""
    return UsageError(
        "Run priorities need engine 0031 or later; nothing was started.",
        hint="Upgrade the engine with `pgflow-gen db migrate`, or start without a priority.",
    )


def _priority_refusal(exc: psycopg.Error) -> PgflowError:
    """An engine without priorities (before 0031) has no start with one: say so, not that a
    function is missing; the rest as for any call."""
    if isinstance(exc, psycopg.errors.UndefinedFunction) and "priority" in str(exc):
        return priority_unsupported()
    return refusals.engine_error(exc)


def pending_starts(flow_slug: str | None) -> Call[list[PendingStart]]:
    """The pending debounced starts (of one flow, or of every flow), the soonest first."""
    rows = yield Query(client_statements.PENDING_STARTS, (flow_slug, flow_slug))
    return [PendingStart(**row) for row in rows]


def read_run(run_id: uuid.UUID) -> Call[Row]:
    """A run's row, as `Run` takes it, with `failure` (its first failed step) when it failed.
    RunNotFoundError when there is no such run."""
    rows = yield Query(client_statements.READ_RUN, (run_id,))
    if not rows:
        raise RunNotFoundError(f"Run {run_id} does not exist.")
    row = _run_fields(rows[0])
    row["failure"] = (yield from _failure(run_id)) if row["status"] == "failed" else None
    return row


#: The columns of pgflow.runs that `Run` holds; an engine has those of its version (a column
#: it does not have keeps the field's default) and others that `Run` does not show.
_RUN_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(RunRecord) if f.name != "failure")


def _run_fields(row: Row) -> Row:
    """The fields of a run's row that `Run` takes."""
    return {key: value for key, value in row.items() if key in _RUN_FIELDS}


def _failure(run_id: uuid.UUID) -> Call[StepFailure | None]:
    rows = yield Query(client_statements.READ_FAILURE, (run_id,))
    return StepFailure(**rows[0]) if rows else None


def traced(call: Call[T], parent: str | None, *, reset: bool) -> Call[T]:
    """`call` with the caller's trace context handed to the engine (its runs' tasks join the
    caller's trace; runtime/tracing.py). The setting lasts to the end of the transaction, so
    the driver runs this in a transaction; `reset` clears it again after the call, for the
    caller's own transaction, whose later statements are not ours."""
    if parent is None:
        return (yield from call)
    yield Query(worker_statements.SET_TRACEPARENT, (parent,))
    result = yield from call
    if reset:
        yield Query(worker_statements.SET_TRACEPARENT, ("",))
    return result


def step_limits(version: str, flow_slug: str | None) -> Call[list[StepLimits]]:
    """The limited steps (of `flow_slug`, or of every flow) with their limits and use now."""
    rows = yield Query(statements.step_limit_usage(version), (flow_slug,))
    return [StepLimits(**row) for row in rows]


def set_limits(
    version: str, action: Action[Any], flow_slug: str, step_slug: str
) -> Call[StepLimits | None]:
    """Set or reset a step's limits (`action`); the step's limits afterwards, None when it has
    none."""
    yield from as_call(action)
    found = yield from step_limits(version, flow_slug)
    return next((limits for limits in found if limits.step_slug == step_slug), None)


def waiting_signals(run_id: uuid.UUID) -> Call[list[WaitingSignal]]:
    """The signal steps of a run that wait for their signal now, in step order."""
    rows = yield Query(client_statements.WAITING_SIGNALS, (run_id,))
    return [WaitingSignal(**row) for row in rows]


def unserved_steps(run_id: uuid.UUID, freshness: float | None) -> Call[list[UnservedStep]]:
    """The steps of a run whose tasks are queued while no live worker serves their queue."""
    rows = yield Query(client_statements.UNSERVED_STEPS, (freshness, run_id))
    return [UnservedStep(**row) for row in rows]


def flow_slug(flow: AnyFlow) -> str:
    return _plain(flow).slug


def _plain(flow: AnyFlow) -> Flow[Any, Any, Any]:
    return flow.flow if isinstance(flow, StepQueuedFlow) else flow
