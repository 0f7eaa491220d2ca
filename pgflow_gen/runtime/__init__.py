"""The runtime: flow definitions, workers, database provisioning and engine migrations.

It imports nothing from `pgflow_gen.spec` or `pgflow_gen.codegen` and talks to PostgreSQL through
psycopg only. Generated code imports only this package.
"""

from __future__ import annotations

# Generated modules take TypedDict from here: pydantic (which validates run inputs) needs the
# typing_extensions class before Python 3.12, and one import block keeps their formatting stable.
from typing_extensions import TypedDict

from pgflow_gen.naming import Route
from pgflow_gen.runtime.app_worker import Worker, run_worker
from pgflow_gen.runtime.client import (
    Client,
    FlowNotFoundError,
    InvalidSignalPayloadError,
    InvalidStepLimitsError,
    Run,
    RunExistsError,
    RunFinishedError,
    RunNotFailedError,
    RunNotFoundError,
    SentSignal,
    SignalRefusedError,
    StepFailure,
    StepLimits,
    StepNotFoundError,
    StepPause,
    WaitingSignal,
)
from pgflow_gen.runtime.context import Context
from pgflow_gen.runtime.errors import InvalidRunInputError
from pgflow_gen.runtime.flow import (
    Flow,
    FlowOptions,
    Json,
    MaybeAwaitable,
    Schedule,
    Signal,
    Step,
    StepOptions,
    StepQueuedFlow,
    with_step_queues,
)
from pgflow_gen.runtime.permanent import PermanentError
from pgflow_gen.runtime.worker import handler_import_failed, run_main, start_worker
from pgflow_gen.runtime.worker_config import WorkerSettings

__all__ = [
    "Client",
    "Context",
    "Flow",
    "FlowNotFoundError",
    "FlowOptions",
    "InvalidRunInputError",
    "InvalidSignalPayloadError",
    "InvalidStepLimitsError",
    "Json",
    "MaybeAwaitable",
    "PermanentError",
    "Route",
    "Run",
    "RunExistsError",
    "RunFinishedError",
    "RunNotFailedError",
    "RunNotFoundError",
    "Schedule",
    "SentSignal",
    "Signal",
    "SignalRefusedError",
    "Step",
    "StepFailure",
    "StepLimits",
    "StepNotFoundError",
    "StepOptions",
    "StepPause",
    "StepQueuedFlow",
    "TypedDict",
    "WaitingSignal",
    "Worker",
    "WorkerSettings",
    "handler_import_failed",
    "run_main",
    "run_worker",
    "start_worker",
    "with_step_queues",
]
