"""pgflow-gen: durable, typed workflows on PostgreSQL + PGMQ, generated from YAML specs."""

from __future__ import annotations

from pgflow_gen.errors import ConfigError, DatabaseError, MigrationError, PgflowError
from pgflow_gen.naming import (
    MAX_PGMQ_QUEUE_NAME_LENGTH,
    DuplicateQueueRouteError,
    DuplicateStepSlugError,
    EmptyStepQueuedFlowError,
    FlowQueueNameError,
    FlowSpecError,
    InvalidSlugError,
    Route,
    StepQueueNameError,
    is_valid_slug,
    resolve_queue_routes,
)

__all__ = [
    "MAX_PGMQ_QUEUE_NAME_LENGTH",
    "ConfigError",
    "DatabaseError",
    "DuplicateQueueRouteError",
    "DuplicateStepSlugError",
    "EmptyStepQueuedFlowError",
    "FlowQueueNameError",
    "FlowSpecError",
    "InvalidSlugError",
    "MigrationError",
    "PgflowError",
    "Route",
    "StepQueueNameError",
    "is_valid_slug",
    "resolve_queue_routes",
]
