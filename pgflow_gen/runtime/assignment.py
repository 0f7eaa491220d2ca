"""What one worker serves: one flow, one queue, and in step mode exactly one step."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.task_runner import Handler


@dataclass(frozen=True)
class Assignment:
    flow: Flow[Any, Any, Any]
    queue_mode: QueueMode
    queue_name: str
    step_slug: str | None
    handlers: Mapping[str, Handler]
    route_map: tuple[Mapping[str, str], ...]

    def describe(self) -> str:
        step = f", step {self.step_slug}" if self.step_slug else ""
        return f"flow {self.flow.slug}{step}, queue {self.queue_name}"
