"""What one worker serves: one flow, one queue, and in step mode exactly one step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.worker import permanent
from pgflow_gen.runtime.worker.task_runner import Handler


@dataclass(frozen=True)
class Assignment:
    flow: Flow[Any, Any, Any]
    queue_mode: QueueMode
    queue_name: str
    step_slug: str | None
    handlers: Mapping[str, Handler]
    route_map: tuple[Mapping[str, str], ...]
    #: For each step served, the exception classes that fail its tasks at once.
    not_on: Mapping[str, tuple[permanent.NotRetried, ...]]

    def describe(self) -> str:
        step = f", step {self.step_slug}" if self.step_slug else ""
        return f"flow {self.flow.slug}{step}, queue {self.queue_name}"


def not_retried(
    flow: Flow[Any, Any, Any], steps: Iterable[str]
) -> dict[str, tuple[permanent.NotRetried, ...]]:
    """The exception classes each of `steps` does not retry (its `retry_not_on`, else the
    flow's), imported now; raises ConfigError for a name that does not import."""
    found = {}
    for slug in steps:
        names = flow.step(slug).options.retry_not_on
        found[slug] = permanent.resolve(flow.options.retry_not_on if names is None else names)
    return found
