"""A worker's handler slots: the handlers running, the results not sent yet, the threads of sync
handlers abandoned at their timeout, and the lease deadline of every message whose task is the
worker's own. The poller fills slots, the reporter empties them; both wake each other here."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.worker import permanent, startup
from pgflow_gen.runtime.worker.metrics import WorkerMetrics
from pgflow_gen.runtime.worker.task_runner import (
    Handler,
    Report,
    RunCancellation,
    describe_failure,
    run_task,
)
from pgflow_gen.words import counted

#: The name prefix of the threads that run synchronous handlers.
HANDLER_THREAD_PREFIX = "pgflow-handler"


class Slots:
    def __init__(
        self,
        *,
        flow: Flow[Any, Any, Any],
        handlers: Mapping[str, Handler],
        max_concurrent: int,
        worker_id: uuid.UUID,
        name: str,
        database_url: str,
        prepare_threshold: int | None,
        logger: logging.Logger,
        check_outputs: bool = True,
        not_on: Mapping[str, Sequence[permanent.NotRetried]] | None = None,
        metrics: WorkerMetrics | None = None,
        queue_name: str = "",
    ) -> None:
        """`check_outputs` checks each output against its step's output type (off: any JSON);
        `not_on` names for each step the exception classes that fail its tasks at once;
        `metrics` counts claims and handlers' ends (default: for this flow, queue unknown)."""
        self.max_concurrent = max_concurrent
        self.handlers = handlers
        self.worker_id = worker_id
        self.name = name
        self.url = database_url
        self.prepare_threshold = prepare_threshold
        self.log = logger
        self.roots = startup.takes_run_input(flow)
        self.output_checks = startup.output_checks(flow) if check_outputs else {}
        self.not_on = not_on or {}
        self.queue_name = queue_name
        self.metrics = metrics or WorkerMetrics(flow.slug, queue_name)
        #: When each running handler started (monotonic), for its duration.
        self._began: dict[asyncio.Task[Report], float] = {}
        #: Set when the worker drains: long handlers may watch `ctx.shutdown`.
        self.shutdown = threading.Event()
        #: Set by a second stop signal: the drain ends now, and the worker said so already.
        self.hurried = False
        #: Running handlers and their tasks.
        self.inflight: dict[asyncio.Task[Report], ClaimedTask] = {}
        #: What tells each running handler that its run was cancelled.
        self.cancellations: dict[asyncio.Task[Report], RunCancellation] = {}
        #: Finished handlers' results, in order, until the engine has them.
        self.reports: list[Report] = []
        #: Sync handlers' threads still running after their timeout failed their task.
        self.abandoned: set[asyncio.Future[Any]] = set()
        #: When each claimed message's task times out (monotonic), while the task is ours.
        self.deadlines: dict[int, float] = {}
        #: The poller waits on this: a slot came free, a notification, a drain.
        self.wake_poll = asyncio.Event()
        #: The reporter waits on this: a result to send, a stop.
        self.wake_report = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=max_concurrent, thread_name_prefix=HANDLER_THREAD_PREFIX
        )

    def free(self) -> int:
        """Slots to claim into. Unsent results hold theirs (no new claims while reporting is
        stuck), and so do threads abandoned past their timeout."""
        return self.max_concurrent - len(self.inflight) - len(self.reports) - len(self.abandoned)

    def unsent(self) -> list[ClaimedTask]:
        """The tasks whose handlers finished and whose results wait to be sent."""
        return [report.task for report in self.reports]

    def own_message_ids(self) -> set[int]:
        """Messages of tasks still ours (running, or their result unsent); forgets the lease
        deadlines of the others."""
        ours = {task.msg_id for task in self.inflight.values()}
        ours |= {report.task.msg_id for report in self.reports}
        for msg_id in list(self.deadlines):
            if msg_id not in ours:
                del self.deadlines[msg_id]
        return ours

    def start(self, task: ClaimedTask) -> None:
        """Run `task`'s handler; its report joins `reports` when it finishes."""
        self.deadlines[task.msg_id] = time.monotonic() + task.timeout
        cancellation = RunCancellation()
        running = asyncio.create_task(
            run_task(
                task,
                self.handlers[task.step_slug],
                executor=self._executor,
                worker_id=self.worker_id,
                shutdown=self.shutdown,
                logger=self.log.getChild(task.step_slug),
                database_url=self.url,
                prepare_threshold=self.prepare_threshold,
                root=task.step_slug in self.roots,
                on_abandoned=self._thread_abandoned,
                check_output=self.output_checks.get(task.step_slug),
                cancellation=cancellation,
                not_on=self.not_on.get(task.step_slug, ()),
                queue_name=self.queue_name,
            )
        )
        self.inflight[running] = task
        self.cancellations[running] = cancellation
        self._began[running] = time.monotonic()
        self.metrics.claimed(task.step_slug)
        running.add_done_callback(self._handler_finished)

    async def drain(self, remaining: Callable[[], float]) -> None:
        """Wait for running handlers while `remaining()` seconds are left, then cancel the rest."""
        # Waits in short slices, so a second signal (which moves the deadline to now) is seen.
        while self.inflight and remaining() > 0:
            await asyncio.wait(set(self.inflight), timeout=min(remaining(), 0.1))
        pending = set(self.inflight)
        for task in pending:
            task.cancel()
        if pending and not self.hurried:  # a second signal said so already
            self.log.warning(
                "worker %s: %s still running after the grace period; their tasks"
                " stay started and stall recovery will requeue them",
                self.name,
                counted(len(pending), "handler"),
            )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _thread_abandoned(self, thread: asyncio.Future[Any]) -> None:
        self.abandoned.add(thread)
        thread.add_done_callback(self._thread_returned)
        if len(self.abandoned) >= self.max_concurrent:
            self.log.warning(
                "worker %s: all %d handler threads are still running handlers that ran past"
                " their timeout; no new task is claimed until one returns",
                self.name,
                len(self.abandoned),
            )

    def _thread_returned(self, thread: asyncio.Future[Any]) -> None:
        self.abandoned.discard(thread)
        self.wake_poll.set()

    def holds_run(self, run_id: uuid.UUID) -> bool:
        """Whether a handler of this run is running here (a cancellation would stop it)."""
        return any(task.run_id == run_id for task in self.inflight.values())

    def cancel_run(self, run_id: uuid.UUID) -> int:
        """Stop the running handlers of a cancelled run (the engine closed their tasks); how
        many there were."""
        stopping = [
            self.cancellations[running]
            for running, task in self.inflight.items()
            if task.run_id == run_id and running in self.cancellations
        ]
        for cancellation in stopping:
            cancellation.set()
        return len(stopping)

    def _handler_finished(self, running: asyncio.Task[Report]) -> None:
        task = self.inflight.pop(running, None)
        self.cancellations.pop(running, None)
        began = self._began.pop(running, None)
        if task is not None and began is not None:
            self.metrics.finished(task.step_slug, _outcome(running), time.monotonic() - began)
        if not running.cancelled():
            failure = running.exception()
            if failure is not None and task is not None:
                # run_task never raises; should it all the same, the task still gets a report.
                self.log.error("task %s/%s[%d] ended without a report", task.run_id,
                               task.step_slug, task.task_index, exc_info=failure)  # fmt: skip
                report = Report(task, error=describe_failure(failure))
            else:
                report = running.result()
            if report.discarded is not None:
                self.log.info(
                    "task %s/%s[%d] attempt %d stopped: %s; nothing is sent",
                    report.task.run_id,
                    report.task.step_slug,
                    report.task.task_index,
                    report.task.attempt,
                    report.discarded,
                )
                self.wake_poll.set()
                return
            if report.error is not None:
                # The error opens with `Type: message`, then the handler's traceback.
                self.log.warning(
                    "task %s/%s[%d] attempt %d failed%s: %s",
                    report.task.run_id,
                    report.task.step_slug,
                    report.task.task_index,
                    report.task.attempt,
                    "" if report.not_retried is None else f" (not retried: {report.not_retried})",
                    report.error,
                )
            self.reports.append(report)
            self.wake_report.set()
        self.wake_poll.set()


def _outcome(running: asyncio.Task[Report]) -> str:
    """How a handler ended, as the metrics say it: completed, failed or stopped."""
    if running.cancelled():
        return "stopped"  # still running when the drain's grace period ended
    if running.exception() is not None:
        return "failed"
    report = running.result()
    if report.discarded is not None:
        return "stopped"
    return "completed" if report.error is None else "failed"
