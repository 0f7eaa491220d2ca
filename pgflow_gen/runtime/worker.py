"""Starting a worker process: `start_worker` (the process loop arrives with the runtime issue).

A plain flow is served by one worker for all its steps (`handlers`); a step-queued flow needs one
worker per step (`step_slug` from the flow's Literal union, and that step's `handler`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

from pgflow_gen.runtime.flow import Flow, StepQueuedFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")

Handler = Callable[..., Any]


@overload
def start_worker(
    flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
    *,
    step_slug: StepSlugT,
    handler: Handler,
    database_url: str | None = None,
    max_concurrent: int | None = None,
    batch_size: int | None = None,
    poll_interval: float | None = None,
    shutdown_grace: float | None = None,
    worker_name: str | None = None,
) -> None: ...


@overload
def start_worker(
    flow: Flow[StepSlugT, InputT, OutputT],
    *,
    # The generated `Handlers` TypedDict (one typed handler per step) is what callers pass.
    handlers: Mapping[str, object],
    database_url: str | None = None,
    max_concurrent: int | None = None,
    batch_size: int | None = None,
    poll_interval: float | None = None,
    shutdown_grace: float | None = None,
    worker_name: str | None = None,
) -> None: ...


def start_worker(
    flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
    *,
    step_slug: str | None = None,
    handler: Handler | None = None,
    handlers: Mapping[str, object] | None = None,
    database_url: str | None = None,
    max_concurrent: int | None = None,
    batch_size: int | None = None,
    poll_interval: float | None = None,
    shutdown_grace: float | None = None,
    worker_name: str | None = None,
) -> None:
    """Run a worker until it is stopped (SIGTERM/SIGINT) or deprecated."""
    raise NotImplementedError(
        "The worker process loop is not built yet (runtime issue); generated entry files and"
        " their types are ready for it."
    )
