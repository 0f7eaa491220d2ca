"""Workers inside your own asyncio application (a FastAPI lifespan, a service that does more).

`Worker(...)` takes what `start_worker` takes (a `WorkerSettings` and its fields as keywords)
and checks it the same way, at once and before anything connects (`ConfigError`). Then:

    async with Worker(STEP_QUEUED_FLOW, step_slug="classify", handler=classify):
        ...  # the worker polls in the background; leaving the block drains and stops it

or `await worker.start()` / `await worker.stop()`, or `await run_worker(...)`, which serves until
its task is cancelled (and then drains). Startup errors (`DatabaseError`,
`FlowShapeMismatchError`, ...) are raised by `start()` / `async with`. Several workers may run in
one process and one event loop, each with its own queue, handler slots and thread pool; they
leave SIGTERM and SIGINT to your application (stop them from its shutdown). Settings come from
the arguments only, not from `PGFLOW_*` environment variables; the database URL is resolved as
everywhere (`database_url`, `PGFLOW_DATABASE_URL`, `DATABASE_URL`, the embedded server).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar, overload

from typing_extensions import Unpack

from pgflow_gen.runtime import database
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow
from pgflow_gen.runtime.worker import settings as worker_config
from pgflow_gen.runtime.worker.loop import WorkerLoop
from pgflow_gen.runtime.worker.process import Handler, assignment_for
from pgflow_gen.runtime.worker.settings import SettingKeywords, WorkerSettings

StepSlugT = TypeVar("StepSlugT", bound=str)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")

log = logging.getLogger("pgflow_gen.worker")


class Worker:
    """A worker that runs in the current event loop; see the module docstring.

    >>> worker = Worker(STEP_QUEUED_FLOW, step_slug="classify", handler=classify)  # doctest: +SKIP
    >>> async with worker:                                                          # doctest: +SKIP
    ...     await serve_http()
    """

    @overload
    def __init__(
        self,
        flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
        *,
        step_slug: StepSlugT,
        handler: Handler,
        database_url: str | None = None,
        settings: WorkerSettings | None = None,
        **keywords: Unpack[SettingKeywords],
    ) -> None: ...

    @overload
    def __init__(
        self,
        flow: Flow[StepSlugT, InputT, OutputT],
        *,
        handlers: Mapping[str, object],
        database_url: str | None = None,
        settings: WorkerSettings | None = None,
        **keywords: Unpack[SettingKeywords],
    ) -> None: ...

    def __init__(
        self,
        flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
        *,
        step_slug: str | None = None,
        handler: Handler | None = None,
        handlers: Mapping[str, object] | None = None,
        database_url: str | None = None,
        settings: WorkerSettings | None = None,
        **keywords: Unpack[SettingKeywords],
    ) -> None:
        self._assignment = assignment_for(
            flow, step_slug=step_slug, handler=handler, handlers=handlers
        )
        self._settings = worker_config.settings(settings, keywords)
        self._database_url = database_url
        self._loop: WorkerLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def worker_id(self) -> uuid.UUID | None:
        """This worker's id in `pgflow.workers` once started (None before)."""
        return self._loop.worker_id if self._loop is not None else None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Compile or verify the flow, register and begin polling in the background; return
        once the worker polls. Raises the typed startup errors of `start_worker`."""
        if self._task is not None:
            raise RuntimeError("This worker was started already; make a new Worker to run again.")
        url = await asyncio.to_thread(database.resolve_url, self._database_url)
        database.check_url(url)
        self._loop = WorkerLoop(self._assignment, self._settings, url, log)
        self._task = asyncio.create_task(
            self._loop.run(handle_signals=False), name=f"pgflow worker {self._loop.name}"
        )
        started = asyncio.create_task(self._loop.started.wait())
        await asyncio.wait({self._task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if self._task.done():
            self._task.result()  # a startup error, raised here

    async def stop(self) -> None:
        """Stop polling, give running handlers the grace period, send their results, mark the
        worker stopped; return when all that is done."""
        if self._loop is None or self._task is None:
            return
        if not self._task.done():
            self._loop.begin_drain("stopped by its application")
        await self._task

    async def run(self) -> None:
        """Start and serve until `stop()` is called, the worker is deprecated, or this call
        is cancelled (which drains first, then re-raises the cancellation)."""
        await self.start()
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            await self.stop()
            raise

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()


@overload
async def run_worker(
    flow: StepQueuedFlow[StepSlugT, InputT, OutputT],
    *,
    step_slug: StepSlugT,
    handler: Handler,
    database_url: str | None = None,
    settings: WorkerSettings | None = None,
    **keywords: Unpack[SettingKeywords],
) -> None: ...


@overload
async def run_worker(
    flow: Flow[StepSlugT, InputT, OutputT],
    *,
    handlers: Mapping[str, object],
    database_url: str | None = None,
    settings: WorkerSettings | None = None,
    **keywords: Unpack[SettingKeywords],
) -> None: ...


async def run_worker(flow: Any, **arguments: Any) -> None:
    """`await Worker(flow, ...).run()`: serve until cancelled (then drain) or deprecated."""
    await Worker(flow, **arguments).run()
