"""Running a whole flow in the test's own process, through the real engine: the flow is compiled,
a run started, and every task read from its queue, claimed, handled and reported with the same
engine calls a worker makes (`pgflow.read_and_claim`, then `complete_task` / `fail_task`), one
task at a time, until the run completes or fails.

Retries run at once: when nothing is ready but a retry waits out its backoff, its message is
made visible now instead of sleeping. Conditions, skips, maps and timeouts behave as with
workers, because the engine decides them. A flow with subflow steps runs its subflows' tasks
here too, with the handlers given for each subflow.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgflow_gen import naming
from pgflow_gen.engine import client_statements, worker_statements
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.client import Client, Run
from pgflow_gen.runtime.flow import Flow, StepQueuedFlow
from pgflow_gen.runtime.worker import settings as worker_config
from pgflow_gen.runtime.worker import startup
from pgflow_gen.runtime.worker.permanent import NotRetried
from pgflow_gen.runtime.worker.process import assignment_for
from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from pgflow_gen.runtime.worker.results import send_reports
from pgflow_gen.runtime.worker.settings import WorkerSettings
from pgflow_gen.runtime.worker.task_runner import Handler, run_task
from pgflow_gen.words import counted

log = logging.getLogger("pgflow_gen.testing")

#: Messages read from a queue at once.
_BATCH = 100


class RunStuckError(errors.PgflowError):
    """A run in process is still started, but no task of it can run: a message or task was
    changed by hand, or another worker on the same database holds its tasks."""

    code = "run_stuck"


@dataclass(frozen=True)
class _Queue:
    name: str
    step_slug: str | None  # the one step of a step-queued flow's queue
    worker_id: uuid.UUID


AnyFlow = Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any]


@dataclass
class _Served:
    """A flow run here: its handlers checked, its queues, and what its tasks need."""

    flow: Flow[Any, Any, Any]
    mode: naming.QueueMode
    route_map: list[Mapping[str, str]]
    handlers: Mapping[str, Handler]
    not_on: Mapping[str, Sequence[NotRetried]]
    queues: list[_Queue]
    roots: frozenset[str]
    output_checks: Mapping[str, Any]


def _served(flow: AnyFlow, handlers: Mapping[str, object], settings: WorkerSettings) -> _Served:
    """Check `handlers` against the flow's steps (ConfigError) and name its queues."""
    plain = flow.flow if isinstance(flow, StepQueuedFlow) else flow
    checked = assignment_for(plain, step_slug=None, handler=None, handlers=handlers)
    route_map: list[Mapping[str, str]]
    if isinstance(flow, StepQueuedFlow):
        mode: naming.QueueMode = "step"
        route_map = list(flow.route_map())
        handled = set(plain.handled_steps)  # a signal or subflow step has no queue
        queues = [
            _Queue(r.queue_name, r.step_slug, uuid.uuid4())
            for r in flow.routes
            if r.step_slug in handled
        ]
    else:
        mode, route_map = "flow", list(checked.route_map)
        queues = [_Queue(checked.queue_name, None, uuid.uuid4())]
    return _Served(
        flow=plain,
        mode=mode,
        route_map=route_map,
        handlers=checked.handlers,
        not_on=checked.not_on,
        queues=queues,
        roots=startup.takes_run_input(plain),
        output_checks=startup.output_checks(plain) if settings.check_outputs else {},
    )


def _check_subflows(flow: Flow[Any, Any, Any], served: Mapping[str, _Served]) -> None:
    """Every flow a subflow step runs (however deep) is served, and every served one is run."""
    pending, used = [flow], {flow.slug}
    while pending:
        current = pending.pop()
        for step in current.steps:
            if step.subflow_slug is None:
                continue
            child = served.get(step.subflow_slug)
            if child is None:
                raise errors.ConfigError(
                    f'Step "{step.slug}" of flow "{current.slug}" runs flow'
                    f' "{step.subflow_slug}", which run_flow was not given.',
                    hint="Pass subflows=[(<its FLOW>, <its handlers>)] to run_flow, for every"
                    " flow the run's subflow steps run.",
                )
            if child.flow.slug not in used:
                used.add(child.flow.slug)
                pending.append(child.flow)
    unused = sorted(set(served) - used)
    if unused:
        raise errors.ConfigError(
            f'run_flow was given subflows that flow "{flow.slug}" does not run: '
            + ", ".join(f'"{slug}"' for slug in unused)
            + ".",
            hint="Pass only the flows its subflow steps run (however deep).",
        )


async def run_flow_async(
    database_url: str,
    flow: Flow[Any, Any, Any] | StepQueuedFlow[Any, Any, Any],
    *,
    handlers: Mapping[str, object],
    input: Any,
    timeout: float = 60.0,
    settings: WorkerSettings | None = None,
    signals: Mapping[str, Any] | None = None,
    subflows: Sequence[tuple[AnyFlow, Mapping[str, object]]] = (),
) -> Run[Any]:
    """Run `flow` with `input` to its end in this process and return the finished run.

    `handlers` maps every step slug to its handler (the generated `Handlers` TypedDict; a
    signal or subflow step has none). `signals` maps signal steps to their payloads: each is
    sent as the run starts, and its step takes it when it is ready. `subflows` pairs each flow
    the run's subflow steps run (however deep) with its handlers: their child runs' tasks run
    here too. `settings` are a worker's; the ones that apply to tasks run here are
    `check_outputs` and `read_visibility` (tasks run one at a time, with no polling).
    Raises ConfigError for handlers that do not match the steps (or subflows that do not
    match the subflow steps), InvalidRunInputError for a wrong input (no run started),
    StepNotFoundError or InvalidSignalPayloadError for a wrong signal, RunStuckError (a
    signal step waits for a signal not given), or TimeoutError after `timeout` seconds.
    """
    settings = worker_config.settings(settings, {})
    top = _served(flow, handlers, settings)
    children = {}
    for child_flow, child_handlers in subflows:
        child = _served(child_flow, child_handlers, settings)
        children[child.flow.slug] = child
    _check_subflows(top.flow, children)
    served = [*children.values(), top]  # children compiled first, as a build's migrations are
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # The same engine calls as a worker's, through the worker's own session.
        session = PsycopgSession(conn)
        for item in served:
            await session.compile_flow(item.flow, item.mode, item.route_map)
            for queue in item.queues:
                await session.register_worker(
                    queue.worker_id, queue.name, "in-process", item.flow.slug, queue.step_slug
                )
        with Client(database_url, pool_size=1) as client:
            started = await asyncio.to_thread(client.start_flow, top.flow, input)
            for step_slug, payload in (signals or {}).items():
                await asyncio.to_thread(client.send_signal, started.run_id, step_slug, payload)
            runner = _Runner(session, database_url, top.flow, started.run_id, settings)
            runner.has_subflows = bool(children)
            try:
                await runner.run_to_end(served, deadline)
            finally:
                runner.close()
                for item in served:
                    for queue in item.queues:
                        await session.mark_stopped(queue.worker_id)
            return await asyncio.to_thread(client.get_run, started.run_id)


class _Runner:
    def __init__(
        self,
        session: PsycopgSession,
        database_url: str,
        flow: Flow[Any, Any, Any],
        run_id: uuid.UUID,
        settings: WorkerSettings,
    ) -> None:
        self.session = session
        self.conn = session.conn
        self.url = database_url
        self.flow = flow
        self.run_id = run_id
        self.read_visibility = settings.read_visibility
        #: Whether the run may have subflow runs (engine 0028), whose messages wait too.
        self.has_subflows = False
        # Tasks run one at a time; more threads only so that a sync handler abandoned at its
        # timeout (its thread cannot be stopped) does not hold up the next task.
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pgflow-test")
        self.shutdown = threading.Event()

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def run_to_end(self, served: list[_Served], deadline: float) -> None:
        hurried = False
        while await self._status() == "started":
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} of flow {self.flow.slug} is still running")
            ran = 0
            for item in served:
                for queue in item.queues:
                    ran += await self._run_ready_tasks(item, queue)
            if ran:
                hurried = False
                continue
            if hurried or not await self._hurry([q for item in served for q in item.queues]):
                waiting = await self._waiting_signals()
                if waiting:
                    names = ", ".join(f'"{slug}"' for slug in waiting)
                    steps = "step" if len(waiting) == 1 else "steps"
                    raise RunStuckError(
                        f"Run {self.run_id} of flow {self.flow.slug} waits for the signal of"
                        f" {steps} {names}, which run_flow was not given.",
                        hint=f"Pass signals={{...}} to run_flow with a payload for {names}.",
                    )
                raise RunStuckError(
                    f"Run {self.run_id} of flow {self.flow.slug} is started, but none of its"
                    " tasks is queued.",
                    detail=await self._step_states(),
                    hint="Is another worker running on this database?",
                )
            hurried = True

    async def _status(self) -> str:
        cursor = await self.conn.execute(worker_statements.RUN_STATUS, (self.run_id,))
        row = await cursor.fetchone()
        return str(row[0]) if row else "missing"

    async def _run_ready_tasks(self, item: _Served, queue: _Queue) -> int:
        claim = await self.session.read_and_claim(
            item.flow.slug, queue.name, queue.worker_id, _BATCH, self.read_visibility,
            queue.step_slug,
        )  # fmt: skip
        claimed = claim.tasks
        for task in claimed:
            report = await run_task(
                task,
                item.handlers[task.step_slug],
                executor=self.executor,
                worker_id=queue.worker_id,
                shutdown=self.shutdown,
                logger=log.getChild(task.step_slug),
                database_url=self.url,
                root=task.step_slug in item.roots,
                check_output=item.output_checks.get(task.step_slug),
                not_on=item.not_on.get(task.step_slug, ()),
            )
            if report.error is not None:
                log.info(
                    "task %s[%d] attempt %d failed: %s",
                    task.step_slug,
                    task.task_index,
                    task.attempt,
                    report.summary,
                )
            await send_reports(self.session, [report], log)
        return len(claimed)

    async def _hurry(self, queues: list[_Queue]) -> bool:
        """Make the messages of this run and its subflow runs that wait (a retry's backoff, a
        start delay) visible now; False when there are none."""
        hurried = 0
        run_ids = [str(self.run_id)]
        if self.has_subflows:
            cursor = await self.conn.execute(worker_statements.RUN_TREE, (self.run_id,))
            run_ids = [str(row[0]) for row in await cursor.fetchall()]
        for queue in queues:
            cursor = await self.conn.execute(
                sql.SQL(worker_statements.SHOW_WAITING_MESSAGES).format(
                    sql.Identifier(naming.pgmq_table(queue.name))
                ),
                (run_ids,),
            )
            hurried += cursor.rowcount
        return hurried > 0

    async def _waiting_signals(self) -> list[str]:
        cursor = await self.conn.execute(client_statements.WAITING_SIGNALS, (self.run_id,))
        return [row[0] for row in await cursor.fetchall()]

    async def _step_states(self) -> str:
        cursor = await self.conn.execute(worker_statements.STEP_STATES, (self.run_id,))
        return "\n".join(
            f"step {slug}: {status}, {counted(remaining, 'task')} remaining"
            for slug, status, remaining in await cursor.fetchall()
        )
