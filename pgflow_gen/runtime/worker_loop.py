"""The worker process: compile or verify the flow, register, then poll one queue until stopped.

Three coroutines share the work, each with its own connection that reconnects after failures:

- the poller reads only as many messages as there are free handler slots, claims them with
  `pgflow.start_tasks` and its exact selector, and starts their handlers; it sleeps until a PGMQ
  insert notification, a freed slot, or the long-poll interval wakes it;
- the reporter sends finished handlers' results (`complete_task` / `fail_task`) and keeps the
  worker alive: a heartbeat every 5 s (deprecation makes the worker drain) and, one worker at a
  time across all workers, `requeue_stalled_tasks()`;
- the listener waits for PGMQ's insert notifications on this worker's queue.

Results wait in memory until the reporter has sent them, so a lost connection loses nothing.
Every database call goes through a `session.Session` (the named engine calls of `queries.py`):
psycopg in production, an in-memory fake in the loop's unit tests
(tests/runtime/test_worker_loop.py).
SIGTERM or SIGINT (or deprecation) stops the polling and drains in-flight handlers for the grace
period; the worker then marks itself stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import signal
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime import errors, startup
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.links import Link, connection_lost, primary_message
from pgflow_gen.runtime.reporting import send_reports
from pgflow_gen.runtime.session import Connector, PsycopgSession, Session
from pgflow_gen.runtime.task_runner import ClaimedTask, Handler, Report, run_task
from pgflow_gen.runtime.worker_config import (
    HEARTBEAT_INTERVAL,
    READ_VISIBILITY,
    Tuning,
)

#: How long a starting worker waits for its database before giving up.
STARTUP_CONNECT_S = 30.0
#: How long a stopping worker tries to mark itself stopped.
MARK_STOPPED_S = 3.0
#: The name prefix of the threads that run synchronous handlers.
HANDLER_THREAD_PREFIX = "pgflow-handler"
#: A listener that heard nothing for this long checks that its session is alive.
LISTEN_CHECK_S = 60.0


@dataclass(frozen=True)
class Assignment:
    """What one worker process serves: one flow, one queue, and in step mode exactly one step."""

    flow: Flow[Any, Any, Any]
    queue_mode: QueueMode
    queue_name: str
    step_slug: str | None
    handlers: Mapping[str, Handler]
    route_map: tuple[Mapping[str, str], ...]

    def describe(self) -> str:
        step = f", step {self.step_slug}" if self.step_slug else ""
        return f"flow {self.flow.slug}{step}, queue {self.queue_name}"


class WorkerLoop:
    """One worker's loop: start, poll, report, drain and stop (see the module docstring)."""

    def __init__(
        self,
        assignment: Assignment,
        tuning: Tuning,
        database_url: str,
        logger: logging.Logger,
        connect: Connector | None = None,
    ) -> None:
        """`connect` opens a database session (default: psycopg on `database_url`); the unit
        tests pass an in-memory fake. Handlers' own `ctx.connection` uses `database_url`."""
        self.assignment = assignment
        self.tuning = tuning
        self.url = database_url
        self.log = logger
        self.worker_id = uuid.uuid4()
        self.name = tuning.worker_name or (
            f"{assignment.flow.slug}-{assignment.step_slug}"
            if assignment.step_slug
            else assignment.flow.slug
        )
        self.shutdown = threading.Event()
        #: Set once the worker has compiled its flow and registered, and polls.
        self.started = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=tuning.max_concurrent, thread_name_prefix=HANDLER_THREAD_PREFIX
        )
        self._roots = startup.takes_run_input(assignment.flow)
        #: Running handlers and their tasks.
        self._inflight: dict[asyncio.Task[Report], ClaimedTask] = {}
        #: Sync handlers' threads still running after their timeout failed their task.
        self._abandoned: set[asyncio.Future[Any]] = set()
        #: When each claimed message's task times out (monotonic), while the task is ours.
        self._deadlines: dict[int, float] = {}
        self._reports: list[Report] = []
        self._draining = False
        self._deadline = 0.0
        self._notifications = tuning.notifications
        # psycopg prepares a statement after 5 executions; None turns that off (PgBouncer).
        self._prepare: int | None = 5 if tuning.prepared_statements else None
        self._connect: Connector = connect or functools.partial(
            PsycopgSession.connect, database_url, self._prepare
        )

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self, stopped_before: Sequence[str] = (), *, handle_signals: bool = True) -> None:
        """Serve until stopped. `stopped_before` names signals that arrived before the loop
        ran (`SIGTERM`): the worker then stops without starting. With `handle_signals`, SIGTERM
        and SIGINT make it drain (a process's own worker; an embedded one leaves the signals to
        its application)."""
        self._wake_poll = asyncio.Event()
        self._wake_report = asyncio.Event()
        self._reporter_done = False
        if handle_signals:
            self._install_signal_handlers()
        for name in stopped_before:
            self.begin_drain(f"received {name}")
        first = await self._connect_for_startup()
        if first is None:
            self._executor.shutdown(wait=False)
            self.log.info("worker %s stopped before it started", self.name)
            return
        try:
            await self._compile(first)
            if self._notifications:
                self._notifications = await self._enable_notifications(first)
            else:
                self.log.info(
                    "insert notifications off; polling every %.2f s", self.tuning.poll_interval
                )
            try:
                await self._register(first)
            except psycopg.Error as exc:
                raise errors.DatabaseError(
                    "The worker could not register.", detail=primary_message(exc)
                ) from exc
        except BaseException:
            await first.close()
            raise
        self.started.set()
        self.log.info(
            "worker %s started (%s, id %s, up to %d handlers at once)",
            self.name,
            self.assignment.describe(),
            self.worker_id,
            self.tuning.max_concurrent,
        )
        self._poll_link: Link[Session] = Link(self._connect, "polling", self.log)
        self._poll_link.adopt(first)
        self._report_link: Link[Session] = Link(
            self._connect, "results", self.log, on_connect=self._register
        )
        reporter = asyncio.create_task(self._report_loop())
        listener = asyncio.create_task(self._listen_loop()) if self._notifications else None
        try:
            await self._poll_loop()
            await self._drain()
        finally:
            self._reporter_done = True
            self._wake_report.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reporter, timeout=max(5.0, self._remaining()))
            if not reporter.done():
                reporter.cancel()
            if self._reports:
                self.log.warning(
                    "worker %s: %d result(s) could not be sent before stopping; stall recovery"
                    " will run those tasks again",
                    self.name,
                    len(self._reports),
                )
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
            await self._mark_stopped()
            await self._poll_link.close()
            await self._report_link.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
        self.log.info("worker %s stopped", self.name)

    def begin_drain(self, reason: str) -> None:
        """Stop polling; in-flight handlers get the grace period to finish."""
        if self._draining:
            self.log.warning("worker %s: %s again, stopping without waiting", self.name, reason)
            self._deadline = time.monotonic()
        else:
            self.log.info(
                "worker %s: %s, draining %d handler(s) for up to %.1f s",
                self.name,
                reason,
                len(self._inflight),
                self.tuning.shutdown_grace,
            )
            self._draining = True
            self._deadline = time.monotonic() + self.tuning.shutdown_grace
            self.shutdown.set()
        self._wake_poll.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for number, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            try:
                loop.add_signal_handler(number, self.begin_drain, f"received {name}")
            except (NotImplementedError, RuntimeError, ValueError):
                return  # not the main thread (or no signals here): the caller stops us

    def _past_deadline(self) -> bool:
        """Whether a stopping reporter should stop reconnecting: past the grace period, or at
        once when it has no results left to send."""
        return self._reporter_done and (self._remaining() <= 0 or not self._reports)

    def _remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    async def _drain(self) -> None:
        # Waits in short slices, so a second signal (which moves the deadline to now) is seen.
        while self._inflight and self._remaining() > 0:
            await asyncio.wait(set(self._inflight), timeout=min(self._remaining(), 0.1))
        if self._inflight:
            pending = set(self._inflight)
            for task in pending:
                task.cancel()
            if pending:
                self.log.warning(
                    "worker %s: %d handler(s) still running after the grace period; their tasks"
                    " stay started and stall recovery will requeue them",
                    self.name,
                    len(pending),
                )

    # -- startup -------------------------------------------------------------------------------
    async def _connect_for_startup(self) -> Session | None:
        """Connect, retrying for a while: a worker may start a little before its database.
        None when the worker is stopped before it has connected."""
        deadline = time.monotonic() + STARTUP_CONNECT_S
        backoff = 0.25
        while not self._draining:
            try:
                return await self._connect()
            except psycopg.OperationalError as exc:
                if self._draining:
                    return None
                if time.monotonic() + backoff > deadline:
                    raise errors.DatabaseError(
                        "The worker cannot connect to the database.",
                        detail=str(exc).strip(),
                        hint="Check PGFLOW_DATABASE_URL (or DATABASE_URL) and that PostgreSQL"
                        " is up.",
                    ) from exc
                self.log.warning("database not reachable yet (%s); retrying", str(exc).strip())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake_poll.wait(), timeout=backoff)
                backoff = min(backoff * 2, 5.0)
        return None

    async def _compile(self, session: Session) -> None:
        a = self.assignment
        status = await session.compile_flow(a.flow, a.queue_mode, a.route_map)
        self.log.info("flow %s %s", a.flow.slug, status)

    async def _enable_notifications(self, session: Session) -> bool:
        """Make PGMQ notify on inserts into this queue; False when this PGMQ (or this role)
        cannot, and the worker long-polls instead."""
        try:
            enabled = await session.enable_notifications(self.assignment.queue_name)
        except psycopg.Error as exc:
            if connection_lost(session, exc):
                raise errors.DatabaseError(
                    "The database connection was lost during startup.", detail=primary_message(exc)
                ) from exc
            self.log.warning(
                "cannot enable PGMQ insert notifications (%s); polling every %.1f s",
                primary_message(exc),
                self.tuning.poll_interval,
            )
            return False
        if not enabled:
            self.log.info(
                "PGMQ has no insert notifications here; polling every %.1f s",
                self.tuning.poll_interval,
            )
        return enabled

    async def _register(self, session: Session) -> None:
        a = self.assignment
        await session.register_worker(
            self.worker_id, a.queue_name, self.name, a.flow.slug, a.step_slug
        )

    # -- polling -------------------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        while not self._draining:
            self._wake_poll.clear()
            # Unsent results hold their slots too: no new claims while reporting is stuck.
            # Threads abandoned past their timeout still hold a thread of the pool.
            free = (
                self.tuning.max_concurrent
                - len(self._inflight)
                - len(self._reports)
                - len(self._abandoned)
            )
            if free > 0:
                wanted = min(self.tuning.batch_size, free)
                session = await self._poll_link.get(give_up=lambda: self._draining)
                if session is None or self._draining:
                    break
                try:
                    read = await self._read_and_claim(session, wanted)
                except psycopg.Error as exc:
                    if connection_lost(session, exc):
                        await self._poll_link.broken(exc)
                        continue
                    # A statement error: log it and try again after the poll interval.
                    self.log.error(
                        "polling queue %s failed: %s",
                        self.assignment.queue_name,
                        primary_message(exc),
                    )
                    read = 0
                if read == wanted and not self._draining:
                    continue  # there may be more waiting
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_poll.wait(), timeout=self.tuning.poll_interval)

    async def _read_and_claim(self, session: Session, wanted: int) -> int:
        a = self.assignment
        ids = await session.read_messages(a.queue_name, READ_VISIBILITY, wanted)
        if not ids:
            return 0
        claimed = await session.claim_tasks(
            a.flow.slug, ids, self.worker_id, a.queue_name, a.step_slug
        )
        # Handlers first: the claim is committed, so nothing below may keep them from starting.
        now = time.monotonic()
        for task in claimed:
            self._deadlines[task.msg_id] = now + task.timeout
            self._start_handler(task)
        unclaimed = sorted(set(ids) - {task.msg_id for task in claimed})
        own = await self._keep_own_messages_hidden(session, unclaimed)
        foreign = [msg_id for msg_id in unclaimed if msg_id not in own]
        if foreign:
            self.log.warning(
                "left %d message(s) in queue %s unclaimed, ids %s: no queued task of %s matches"
                " them (already started or finished, or not this flow's or step's); this worker"
                " does not touch them",
                len(foreign),
                a.queue_name,
                ", ".join(map(str, foreign)),
                f"flow {a.flow.slug} step {a.step_slug}" if a.step_slug else f"flow {a.flow.slug}",
            )
        return len(ids)

    async def _keep_own_messages_hidden(self, session: Session, unclaimed: list[int]) -> set[int]:
        """Of the messages read but not claimed, the ones of this worker's own tasks (a handler
        still running, or a result not sent yet): reading made them visible again sooner than
        their lease said, so they get it back (the time to their timeout + 2 s, at least the
        read's 10 s). Nothing is logged about them."""
        ours = {task.msg_id for task in self._inflight.values()}
        ours |= {report.task.msg_id for report in self._reports}
        for msg_id in list(self._deadlines):
            if msg_id not in ours:
                del self._deadlines[msg_id]
        own = [msg_id for msg_id in unclaimed if msg_id in ours]
        now = time.monotonic()
        offsets = [
            max(READ_VISIBILITY, math.ceil(self._deadlines.get(msg_id, now) - now) + 2)
            for msg_id in own
        ]
        extend = [(m, o) for m, o in zip(own, offsets, strict=True) if o > READ_VISIBILITY]
        if extend:
            await session.set_visibility(
                self.assignment.queue_name, [m for m, _ in extend], [o for _, o in extend]
            )
        return set(own)

    def _start_handler(self, task: ClaimedTask) -> None:
        handler = self.assignment.handlers[task.step_slug]
        running = asyncio.create_task(
            run_task(
                task,
                handler,
                executor=self._executor,
                worker_id=self.worker_id,
                shutdown=self.shutdown,
                logger=self.log.getChild(task.step_slug),
                database_url=self.url,
                prepare_threshold=self._prepare,
                root=task.step_slug in self._roots,
                on_abandoned=self._thread_abandoned,
            )
        )
        self._inflight[running] = task
        running.add_done_callback(self._handler_finished)

    def _thread_abandoned(self, thread: asyncio.Future[Any]) -> None:
        self._abandoned.add(thread)
        thread.add_done_callback(self._thread_returned)
        if len(self._abandoned) >= self.tuning.max_concurrent:
            self.log.warning(
                "worker %s: all %d handler threads are still running handlers that ran past"
                " their timeout; no new task is claimed until one returns",
                self.name,
                len(self._abandoned),
            )

    def _thread_returned(self, thread: asyncio.Future[Any]) -> None:
        self._abandoned.discard(thread)
        self._wake_poll.set()

    def _handler_finished(self, running: asyncio.Task[Report]) -> None:
        self._inflight.pop(running, None)
        if not running.cancelled():
            report = running.result()
            if report.error is not None:
                # The error opens with `Type: message`, then the handler's traceback.
                self.log.warning(
                    "task %s/%s[%d] attempt %d failed: %s",
                    report.task.run_id,
                    report.task.step_slug,
                    report.task.task_index,
                    report.task.attempt,
                    report.error,
                )
            self._reports.append(report)
            self._wake_report.set()
        self._wake_poll.set()

    # -- results, heartbeats, recovery -----------------------------------------------------------
    async def _report_loop(self) -> None:
        next_heartbeat = time.monotonic() + HEARTBEAT_INTERVAL
        next_recovery = time.monotonic() + random.uniform(0, self.tuning.recovery_interval)
        while True:
            self._wake_report.clear()
            session = await self._report_link.get(give_up=self._past_deadline)
            if session is None:
                return  # stopping, and the database is unreachable: the results stay unsent
            try:
                await self._send_reports(session)
                now = time.monotonic()
                if now >= next_heartbeat:
                    next_heartbeat = now + HEARTBEAT_INTERVAL
                    await self._heartbeat(session)
                if now >= next_recovery:
                    next_recovery = now + self.tuning.recovery_interval
                    if not self._draining:
                        await self._recover_stalled(session)
            except psycopg.Error as exc:
                if connection_lost(session, exc):
                    await self._report_link.broken(exc)
                    continue
                # A statement error (a heartbeat or sweep refused): log it and go on after a
                # pause, so results, heartbeats and recovery keep their chance.
                self.log.error("reporting failed: %s", primary_message(exc))
                await asyncio.sleep(1.0)
                continue
            if self._reporter_done and not self._reports:
                return
            timeout = max(0.0, min(next_heartbeat, next_recovery) - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_report.wait(), timeout=timeout)

    async def _send_reports(self, session: Session) -> None:
        if not self._reports:
            return
        try:
            await send_reports(session, self._reports, self.log)
        finally:
            self._wake_poll.set()  # sent results free their slots for the poller

    async def _heartbeat(self, session: Session) -> None:
        try:
            deprecated = await session.heartbeat(self.worker_id)
        except psycopg.errors.NoDataFound:
            # Our row was pruned (a long outage): register again.
            await self._register(session)
            return
        if deprecated and not self._draining:
            self.begin_drain("deprecated by an operator")

    async def _recover_stalled(self, session: Session) -> None:
        requeued = await session.requeue_stalled()
        if requeued:
            self.log.info("requeued %d stalled task(s)", requeued)

    async def _mark_stopped(self) -> None:
        """Set `stopped_at`, trying for at most MARK_STOPPED_S: when the database is down the
        worker exits anyway, and its heartbeat going stale tells the others it is gone."""
        deadline = time.monotonic() + MARK_STOPPED_S
        reason: str | None = None
        try:
            async with asyncio.timeout(MARK_STOPPED_S):
                session = await self._report_link.get(give_up=lambda: time.monotonic() > deadline)
                if session is not None:
                    await session.mark_stopped(self.worker_id)
                    return
        except psycopg.Error as exc:
            reason = primary_message(exc)
        except TimeoutError:
            pass
        self.log.warning(
            "could not mark worker %s stopped within %.0f s (%s); other workers and"
            " `pgflow-gen workers` see it gone once its heartbeat is stale",
            self.name,
            MARK_STOPPED_S,
            reason or self._report_link.last_error or "the database did not answer",
        )

    # -- notifications -------------------------------------------------------------------------
    async def _listen_loop(self) -> None:
        channel = f"pgmq.q_{self.assignment.queue_name}.INSERT"
        link: Link[Session] = Link(self._connect, "notifications", self.log)
        try:
            while True:
                session = await link.get()
                if session is None:
                    return
                try:
                    await session.listen(channel)
                    self._wake_poll.set()  # anything sent while we were not listening
                    while True:
                        async for _notify in session.notifies(LISTEN_CHECK_S):
                            self._wake_poll.set()
                        # Quiet for a while: make sure the session is still alive.
                        await session.ping()
                except psycopg.Error as exc:
                    await link.broken(exc)
        finally:
            await link.close()
