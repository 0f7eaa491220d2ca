"""The runtime: flow definitions, workers, database provisioning and engine migrations.

It imports nothing from `pgflow_gen.spec` or `pgflow_gen.codegen` and talks to PostgreSQL through
psycopg only. Generated code imports only this package.
"""

from __future__ import annotations

from pgflow_gen.naming import Route
from pgflow_gen.runtime.context import Context
from pgflow_gen.runtime.flow import (
    Flow,
    FlowOptions,
    Json,
    MaybeAwaitable,
    Step,
    StepOptions,
    StepQueuedFlow,
    with_step_queues,
)
from pgflow_gen.runtime.worker import start_worker

__all__ = [
    "Context",
    "Flow",
    "FlowOptions",
    "Json",
    "MaybeAwaitable",
    "Route",
    "Step",
    "StepOptions",
    "StepQueuedFlow",
    "start_worker",
    "with_step_queues",
]
