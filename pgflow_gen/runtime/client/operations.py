"""The operator's actions, each written once: cancel, retry and fork a run, send a signal, pause
and resume a step or a schedule, set a step's limits or give it back the spec's.

An action is a value (`Action`): the engine statement, its parameters, how its row reads as a
typed result, and how what the engine refuses reads as a typed error. `perform` runs one on a
psycopg connection, `perform_async` on an async one; the `Client`, the CLI and the dashboard all
build their actions here, so what an action sends, returns and raises is the same whoever asks.

>>> retry_run(uuid.UUID(int=7)).params
(UUID('00000000-0000-0000-0000-000000000007'),)

With a `label` an action runs in a transaction of its own that first tells the engine who acts
(`pgflow-gen (user@host)`, `dashboard (address)`): the engine records it beside the login role in
`pgflow.operator_actions`. Without one it runs as one statement on the caller's connection.
Both go through the clients' drivers (`calls.py`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.engine import client_statements, refusals
from pgflow_gen.errors import DatabaseError, PgflowError
from pgflow_gen.runtime.client import calls
from pgflow_gen.runtime.client.models import ForkedRun, RetriedRun, SentSignal, StepPause

T = TypeVar("T")
Row = calls.Row


@dataclass(frozen=True)
class Action(Generic[T]):
    """One engine call an operator makes: `read` turns its row (None: no row) into the result,
    `refusal` turns what the engine refused into the typed error the caller sees."""

    query: LiteralString
    params: tuple[Any, ...]
    read: Callable[[Row | None], T]
    refusal: Callable[[psycopg.Error], PgflowError] = refusals.engine_error


def perform(conn: psycopg.Connection[Any], action: Action[T], *, label: str | None = None) -> T:
    """Run `action` on `conn`; raise its typed error when the engine refuses it."""
    return calls.run(conn, as_call(action, label), transaction=label is not None)


async def perform_async(
    conn: psycopg.AsyncConnection[Any], action: Action[T], *, label: str | None = None
) -> T:
    """`perform` on an async connection."""
    return await calls.run_async(conn, as_call(action, label), transaction=label is not None)


def as_call(action: Action[T], label: str | None = None) -> calls.Call[T]:
    """`action` as a client call (`calls.py`); with a `label`, told to the engine first (the
    driver runs it in a transaction, as the label lasts to its end)."""
    if label is not None:
        yield calls.Query(client_statements.SET_ACTION_LABEL, (label,))
    rows = yield calls.Query(action.query, action.params, action.refusal)
    return action.read(rows[0] if rows else None)


def cancel_run(run_id: uuid.UUID, reason: str | None = None) -> Action[uuid.UUID]:
    """Cancel a started run; its id. RunNotFoundError, RunFinishedError (not started)."""
    return Action(client_statements.CANCEL_RUN, (run_id, reason), _column("run_id"))


def retry_run(run_id: uuid.UUID) -> Action[RetriedRun]:
    """Retry a failed run from where it failed. RunNotFoundError, RunNotFailedError."""
    return Action(
        client_statements.RETRY_RUN,
        (run_id,),
        lambda row: RetriedRun(**_present(row)),
        lambda exc: refusals.engine_error(exc, refused=refusals.RunNotFailedError),
    )


def fork_run(run_id: uuid.UUID, from_step: str) -> Action[ForkedRun]:
    """Start a new run of the run's flow with its input from `from_step`: the steps before it
    are copied as they ended, it and the steps after it run again. RunNotFoundError,
    StepNotFoundError, RunNotForkableError."""
    return Action(
        client_statements.FORK_RUN,
        (run_id, from_step),
        lambda row: ForkedRun(**_present(row)),
        lambda exc: refusals.engine_error(exc, refused=refusals.RunNotForkableError),
    )


def send_signal(run_id: uuid.UUID, step_slug: str, payload: Any) -> Action[SentSignal]:
    """Give a signal step of a run its payload. InvalidSignalPayloadError at once for a payload
    that is not JSON; from the engine RunNotFoundError, StepNotFoundError,
    InvalidSignalPayloadError (its schema), SignalRefusedError."""
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:  # not JSON: nothing is sent
        raise refusals.InvalidSignalPayloadError(
            f'The payload of signal "{step_slug}" is not JSON-serialisable: {exc}.'
        ) from exc
    return Action(
        client_statements.SEND_SIGNAL,
        (run_id, step_slug, Jsonb(payload)),
        lambda row: SentSignal(**_present(row)),
        refusals.signal_error,
    )


def pause_step(flow_slug: str, step_slug: str, reason: str | None = None) -> Action[StepPause]:
    """Pause a step in every run. FlowNotFoundError, StepNotFoundError."""
    return Action(
        client_statements.PAUSE_STEP,
        (flow_slug, step_slug, reason),
        lambda row: StepPause(**_present(row)),
    )


def resume_step(flow_slug: str, step_slug: str) -> Action[int]:
    """Resume a paused step; how many held tasks can start (0: it was not paused)."""
    return Action(
        client_statements.RESUME_STEP,
        (flow_slug, step_slug),
        lambda row: int(row["resume_step"]) if row and row["resume_step"] else 0,
    )


def set_step_limits(
    flow_slug: str,
    step_slug: str,
    max_in_flight: int | None,
    rate_limit: int | None,
    rate_period_s: int | None,
) -> Action[None]:
    """Set a step's limits live (None clears one). InvalidStepLimitsError, FlowNotFoundError,
    StepNotFoundError."""
    return Action(
        client_statements.SET_STEP_LIMITS,
        (flow_slug, step_slug, max_in_flight, rate_limit, rate_period_s),
        lambda row: None,
        _limits_refusal,
    )


def reset_step_limits(flow_slug: str, step_slug: str) -> Action[None]:
    """Remove an operator's limits from a step: the spec's apply again (engine 0023).
    FlowNotFoundError, StepNotFoundError."""
    return Action(client_statements.RESET_STEP_LIMITS, (flow_slug, step_slug), lambda row: None)


def pause_schedule(flow_slug: str, name: str) -> Action[Row]:
    """Pause a flow's schedule; its row as `pgflow-gen schedules` reads it."""
    return Action(client_statements.PAUSE_SCHEDULE, (flow_slug, name), _present)


def resume_schedule(flow_slug: str, name: str) -> Action[Row]:
    """Resume a paused schedule; its row (the slots of its pause passed over)."""
    return Action(client_statements.RESUME_SCHEDULE, (flow_slug, name), _present)


def _limits_refusal(exc: psycopg.Error) -> PgflowError:
    if isinstance(exc, psycopg.errors.InvalidParameterValue):  # a signal step, say
        return refusals.InvalidStepLimitsError(
            exc.diag.message_primary or str(exc), hint=exc.diag.message_hint
        )
    return refusals.engine_error(exc)


def _present(row: Row | None) -> Row:
    """The row of a function that returns its row or raises."""
    if row is None:
        raise DatabaseError("The engine answered an action with no row.")
    return row


def _column(name: str) -> Callable[[Row | None], Any]:
    return lambda row: _present(row)[name]
