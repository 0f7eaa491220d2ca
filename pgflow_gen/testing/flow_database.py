"""`FlowDatabase`: what the `pgflow` fixture gives a test, one fresh database with the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, overload

import psycopg

from pgflow_gen.runtime.client import Client, Run
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow
from pgflow_gen.runtime.worker.settings import WorkerSettings
from pgflow_gen.testing import runner
from pgflow_gen.testing.runner import AnyFlow

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


class FlowDatabase:
    """A database of one test, with PGMQ and the engine installed, and flows run in process.

    `url` is its connection string, `client` a `Client` on it (start runs that real worker
    processes pick up, read runs back), `connect()` a new autocommit connection.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = Client(url)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    @overload
    def run_flow(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        *,
        handlers: Mapping[str, object],
        input: InputT,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[OutputT]: ...

    @overload
    def run_flow(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        *,
        handlers: Mapping[str, object],
        input: InputT,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[OutputT]: ...

    def run_flow(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        *,
        handlers: Mapping[str, object],
        input: Any,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[Any]:
        """Run `flow` with `input` to its end in this process, through the real engine, and
        return the finished run (`status`, `output`, and for a failed run `failure`).

        Every step runs here, one task at a time, with the engine's claims and completions;
        retries run at once (no backoff sleep); conditions, skips, maps and step timeouts behave
        as with workers. `handlers` maps every step slug to its handler: annotate it with the
        flow's generated `Handlers` TypedDict and mypy checks each one. Raises ConfigError
        (handlers do not match the steps), InvalidRunInputError (no run started),
        RunStuckError, or TimeoutError after `timeout` seconds. `settings` (a `WorkerSettings`)
        turn off the output check as for workers (`check_outputs=False`). `signals` maps each
        signal step to its payload, sent as the run starts (its step takes it when ready).
        `subflows` pairs each flow the run's subflow steps run (however deep) with its handlers,
        `[(shipping.FLOW, shipping_handlers)]`: the child runs' tasks run here too. In an async
        test, await `run_flow_async` instead.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "run_flow blocks, and this thread runs an event loop: await"
                " pgflow.run_flow_async(...) in an async test."
            )
        return asyncio.run(
            runner.run_flow_async(
                self.url,
                flow,
                handlers=handlers,
                input=input,
                timeout=timeout,
                settings=settings,
                signals=signals,
                subflows=subflows,
            )
        )

    @overload
    async def run_flow_async(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        *,
        handlers: Mapping[str, object],
        input: InputT,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[OutputT]: ...

    @overload
    async def run_flow_async(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        *,
        handlers: Mapping[str, object],
        input: InputT,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[OutputT]: ...

    async def run_flow_async(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        *,
        handlers: Mapping[str, object],
        input: Any,
        timeout: float = 60.0,
        settings: WorkerSettings | None = None,
        signals: Mapping[str, Any] | None = None,
        subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
    ) -> Run[Any]:
        """`run_flow` for async tests: the same run, awaited on the test's event loop."""
        return await runner.run_flow_async(
            self.url,
            flow,
            handlers=handlers,
            input=input,
            timeout=timeout,
            settings=settings,
            signals=signals,
            subflows=subflows,
        )
