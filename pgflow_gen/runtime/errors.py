"""Typed runtime errors: a message, optionally a detail and a hint, as PostgreSQL reports them."""

from __future__ import annotations

from pgflow_gen.errors import (
    ConfigError,
    DatabaseError,
    InvalidRunInputError,
    MigrationError,
    PgflowError,
)

__all__ = [
    "ConfigError",
    "DatabaseError",
    "FlowCompilationError",
    "FlowMismatchError",
    "FlowRoutingMismatchError",
    "FlowShapeMismatchError",
    "HandlerTimeoutError",
    "InvalidRunInputError",
    "MigrationError",
    "OutputValidationError",
    "PgflowError",
    "WorkerFailedError",
]


class FlowCompilationError(PgflowError):
    """The engine refused to compile a flow (a queue collision, an invalid definition)."""

    code = "flow_compilation_error"


class FlowMismatchError(PgflowError):
    """A flow differs from its definition in the database; nothing was changed."""

    code = "flow_mismatch"

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
        flow_slug: str,
        differences: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, detail=detail, hint=hint)
        self.flow_slug = flow_slug
        self.differences = differences


class FlowShapeMismatchError(FlowMismatchError):
    """The steps, dependencies, types or conditions differ."""

    code = "flow_shape_mismatch"


class FlowRoutingMismatchError(FlowMismatchError):
    """The queue mode or a step's queue route differs."""

    code = "flow_routing_mismatch"


class OutputValidationError(PgflowError):
    """A handler returned an output that does not match its step's output type: the worker
    failed that attempt (the task retries per its policy). Stored as the task's error; never
    raised to callers."""

    code = "invalid_step_output"


class HandlerTimeoutError(PgflowError):
    """A handler ran past its step's timeout: the worker failed that attempt (the task retries
    per its policy). Stored as the task's error; never raised to callers."""

    code = "handler_timeout"


class WorkerFailedError(PgflowError):
    """A part of a running worker (its poller, reporter, heartbeat or listener) failed
    unexpectedly: the worker drained, marked itself stopped and ended with this error."""

    code = "worker_failed"
