"""The runtime: flow definitions, workers, the client, database provisioning and engine
migrations.

It imports nothing from `pgflow_gen.spec` or `pgflow_gen.codegen` and talks to PostgreSQL through
psycopg only. Generated code imports only this package.

Each public name is imported when it is first used (PEP 562's module `__getattr__`): a flow
definition does not load the worker, and `pgflow-gen --version` loads neither. Type checkers read
the imports below as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Generated modules take TypedDict from here: pydantic (which validates run inputs) needs
    # the typing_extensions class before Python 3.12, and one import block keeps their
    # formatting stable.
    from typing_extensions import TypedDict

    from pgflow_gen.naming import Route
    from pgflow_gen.runtime.client import (
        AsyncClient,
        AsyncRun,
        Client,
        FlowNotFoundError,
        InvalidSignalPayloadError,
        InvalidStepLimitsError,
        PendingStart,
        Run,
        RunExistsError,
        RunFinishedError,
        RunNotFailedError,
        RunNotForkableError,
        RunNotFoundError,
        SentSignal,
        SignalRefusedError,
        StepFailure,
        StepLimits,
        StepNotFoundError,
        StepPause,
        WaitingSignal,
    )
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
    from pgflow_gen.runtime.worker.app_worker import Worker, run_worker
    from pgflow_gen.runtime.worker.context import Context
    from pgflow_gen.runtime.worker.permanent import PermanentError
    from pgflow_gen.runtime.worker.process import handler_import_failed, run_main, start_worker
    from pgflow_gen.runtime.worker.settings import WorkerSettings

#: Where each public name lives.
_HOMES: dict[str, str] = {
    "Route": "pgflow_gen.naming",
    "Worker": "pgflow_gen.runtime.worker.app_worker",
    "run_worker": "pgflow_gen.runtime.worker.app_worker",
    "AsyncClient": "pgflow_gen.runtime.client",
    "AsyncRun": "pgflow_gen.runtime.client",
    "Client": "pgflow_gen.runtime.client",
    "FlowNotFoundError": "pgflow_gen.runtime.client",
    "InvalidSignalPayloadError": "pgflow_gen.runtime.client",
    "InvalidStepLimitsError": "pgflow_gen.runtime.client",
    "PendingStart": "pgflow_gen.runtime.client",
    "Run": "pgflow_gen.runtime.client",
    "RunExistsError": "pgflow_gen.runtime.client",
    "RunFinishedError": "pgflow_gen.runtime.client",
    "RunNotFailedError": "pgflow_gen.runtime.client",
    "RunNotForkableError": "pgflow_gen.runtime.client",
    "RunNotFoundError": "pgflow_gen.runtime.client",
    "SentSignal": "pgflow_gen.runtime.client",
    "SignalRefusedError": "pgflow_gen.runtime.client",
    "StepFailure": "pgflow_gen.runtime.client",
    "StepLimits": "pgflow_gen.runtime.client",
    "StepNotFoundError": "pgflow_gen.runtime.client",
    "StepPause": "pgflow_gen.runtime.client",
    "WaitingSignal": "pgflow_gen.runtime.client",
    "Context": "pgflow_gen.runtime.worker.context",
    "InvalidRunInputError": "pgflow_gen.runtime.errors",
    "Flow": "pgflow_gen.runtime.flow",
    "FlowOptions": "pgflow_gen.runtime.flow",
    "Json": "pgflow_gen.runtime.flow",
    "MaybeAwaitable": "pgflow_gen.runtime.flow",
    "Schedule": "pgflow_gen.runtime.flow",
    "Signal": "pgflow_gen.runtime.flow",
    "Step": "pgflow_gen.runtime.flow",
    "StepOptions": "pgflow_gen.runtime.flow",
    "StepQueuedFlow": "pgflow_gen.runtime.flow",
    "with_step_queues": "pgflow_gen.runtime.flow",
    "PermanentError": "pgflow_gen.runtime.worker.permanent",
    "handler_import_failed": "pgflow_gen.runtime.worker.process",
    "run_main": "pgflow_gen.runtime.worker.process",
    "start_worker": "pgflow_gen.runtime.worker.process",
    "WorkerSettings": "pgflow_gen.runtime.worker.settings",
    "TypedDict": "typing_extensions",
}

__all__ = [
    "AsyncClient",
    "AsyncRun",
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
    "PendingStart",
    "PermanentError",
    "Route",
    "Run",
    "RunExistsError",
    "RunFinishedError",
    "RunNotFailedError",
    "RunNotForkableError",
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


if not TYPE_CHECKING:  # type checkers see the imports above, and no other name

    def __getattr__(name: str) -> Any:
        """Import a public name from its module the first time it is asked for."""
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
