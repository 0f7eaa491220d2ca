"""Starting runs and reading them back, typed by the generated flow module.

>>> from app.pgflow.greet_user import FLOW                       # doctest: +SKIP
>>> run = Client().start_flow(FLOW, {"first": "Ada", "last": "Lovelace"})  # doctest: +SKIP
>>> run.wait(timeout=30).output                                 # doctest: +SKIP
{'greeting': 'Hello, Ada Lovelace!'}

A Client keeps a small pool of connections (psycopg_pool) for its short calls, opened as calls
need them; `Run.wait` listens on a connection of its own. `close()` (or `with Client() as
client:`) releases them at once; otherwise they go when the Client is garbage collected.

`AsyncClient` is the same API for asyncio: `await client.start_flow(...)`, `await run.wait()`.
Each call is written once, as a generator of statements (`calls`), and both clients drive it.

The modules: `client` and `async_client` (the two clients and their pools), `connections` (the
pools' settings, and the checks on an application's connection a start joins), `calls` (a call
and its two drivers), `run_calls` (starting and reading runs), `operations` (the operator's
actions, which the CLI and the dashboard perform too), `runs` (`Run` and `AsyncRun`), `models`
(what calls return) and `run_inputs` (checking an input before it is written). Its typed errors,
and the translation of what the engine refused into them, are the engine gateway's
(`pgflow_gen.engine.refusals`).
"""

from __future__ import annotations

from pgflow_gen.engine.refusals import (
    FlowNotFoundError,
    InvalidSignalPayloadError,
    InvalidStepLimitsError,
    RunExistsError,
    RunFinishedError,
    RunNotFailedError,
    RunNotForkableError,
    RunNotFoundError,
    SignalRefusedError,
    StepNotFoundError,
    engine_error,
    signal_error,
)
from pgflow_gen.runtime.client.async_client import AsyncClient
from pgflow_gen.runtime.client.client import Client
from pgflow_gen.runtime.client.connections import POOL_IDLE_S, POOL_SIZE, POOL_WAIT_S
from pgflow_gen.runtime.client.models import (
    CONCURRENCY_FIELDS,
    NO_STEP_LIMITS,
    PendingStart,
    RetriedRun,
    RunRecord,
    RunStatus,
    SentSignal,
    StepFailure,
    StepLimits,
    StepPause,
    UnservedStep,
    WaitingSignal,
    limits_in_words,
    override_in_words,
    overrides_spec,
    spec_limits_in_words,
    with_concurrency,
)
from pgflow_gen.runtime.client.run_inputs import validate_input
from pgflow_gen.runtime.client.runs import AsyncRun, Run

__all__ = [
    "CONCURRENCY_FIELDS",
    "NO_STEP_LIMITS",
    "POOL_IDLE_S",
    "POOL_SIZE",
    "POOL_WAIT_S",
    "AsyncClient",
    "AsyncRun",
    "Client",
    "FlowNotFoundError",
    "InvalidSignalPayloadError",
    "InvalidStepLimitsError",
    "PendingStart",
    "RetriedRun",
    "Run",
    "RunExistsError",
    "RunFinishedError",
    "RunNotFailedError",
    "RunNotForkableError",
    "RunNotFoundError",
    "RunRecord",
    "RunStatus",
    "SentSignal",
    "SignalRefusedError",
    "StepFailure",
    "StepLimits",
    "StepNotFoundError",
    "StepPause",
    "UnservedStep",
    "WaitingSignal",
    "engine_error",
    "limits_in_words",
    "override_in_words",
    "overrides_spec",
    "signal_error",
    "spec_limits_in_words",
    "validate_input",
    "with_concurrency",
]
