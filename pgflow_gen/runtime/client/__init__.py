"""Starting runs and reading them back, typed by the generated flow module.

>>> from app.pgflow.greet_user import FLOW                       # doctest: +SKIP
>>> run = Client().start_flow(FLOW, {"first": "Ada", "last": "Lovelace"})  # doctest: +SKIP
>>> run.wait(timeout=30).output                                 # doctest: +SKIP
{'greeting': 'Hello, Ada Lovelace!'}

A Client keeps a small pool of connections (psycopg_pool) for its short calls, opened as calls
need them; `Run.wait` listens on a connection of its own. `close()` (or `with Client() as
client:`) releases them at once; otherwise they go when the Client is garbage collected.

Four modules: `client` (the Client and its pool), `models` (what its calls return),
`operations` (the operator's actions, which the CLI and the dashboard perform too) and
`run_inputs` (checking an input before it is written). Its typed errors, and the translation of
what the engine refused into them, are the engine gateway's (`pgflow_gen.engine.refusals`).
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
from pgflow_gen.runtime.client.client import (
    POOL_IDLE_S,
    POOL_SIZE,
    POOL_WAIT_S,
    Client,
    read_failure,
)
from pgflow_gen.runtime.client.models import (
    CONCURRENCY_FIELDS,
    NO_STEP_LIMITS,
    RetriedRun,
    Run,
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

__all__ = [
    "CONCURRENCY_FIELDS",
    "NO_STEP_LIMITS",
    "POOL_IDLE_S",
    "POOL_SIZE",
    "POOL_WAIT_S",
    "Client",
    "FlowNotFoundError",
    "InvalidSignalPayloadError",
    "InvalidStepLimitsError",
    "RetriedRun",
    "Run",
    "RunExistsError",
    "RunFinishedError",
    "RunNotFailedError",
    "RunNotForkableError",
    "RunNotFoundError",
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
    "read_failure",
    "signal_error",
    "spec_limits_in_words",
    "validate_input",
    "with_concurrency",
]
