"""A claimed task as the engine hands it to a worker (a row of `pgflow.read_and_claim`): what
the task runner runs, the session reports on and tracing names its span after."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClaimedTask:
    """One row of `pgflow.claim_tasks`: the task, its input, and the attempt this claim started
    (its callbacks pass it back, so a stale one changes nothing) with the step's timeout."""

    flow_slug: str
    run_id: uuid.UUID
    step_slug: str
    input: Any
    msg_id: int
    task_index: int
    flow_input: Any
    attempt: int
    timeout: int
    #: The W3C trace context the run was started in, read only while tracing (runtime/tracing.py).
    traceparent: str | None = None
