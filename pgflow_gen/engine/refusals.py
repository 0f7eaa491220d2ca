"""What the engine refused, as typed errors: the errors of its calls (a run or flow not found, a
run finished or not failed, a signal refused...) and the translation of a psycopg error into
them, with the engine's hint or the missing privilege's. The client, the CLI and the dashboard
say the same things through it."""

from __future__ import annotations

import psycopg

from pgflow_gen import errors
from pgflow_gen.engine import roles, support


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


class RunNotForkableError(errors.PgflowError):
    """`fork_run` of a run whose steps to copy did not all end well (completed or skipped), or
    whose flow has changed since it started (or no longer accepts its input): nothing was
    started."""

    code = "run_not_forkable"


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


class InvalidStepLimitsError(errors.PgflowError):
    """Step limits the engine refuses: not a whole number from 1, a rate limit without its
    period, or a signal step (it runs no task)."""

    code = "invalid_step_limits"


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
            hint=support.MIGRATE_HINT,
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
