"""The worker process: compile or verify the flow, register, then poll one queue until stopped.

`WorkerLoop` owns start and drain, and wires the parts, each with its own connection that
reconnects after failures:

- the poller (`poller.py`) reads only as many messages as there are free handler slots
  (`slots.py`), claims their tasks with `pgflow.claim_tasks` and its exact selector, and starts
  their handlers; it sleeps until a PGMQ insert notification, a freed slot, or the long-poll
  interval wakes it;
- the reporter (`reporter.py`) sends finished handlers' results (`complete_task` / `fail_task`;
  a busy worker's successes with the next claim, through the poller, in one
  `complete_and_claim` call) and, one worker at a time across all workers, runs
  `requeue_stalled_tasks()`;
- the heartbeat (`heartbeat.py`) beats at the engine's liveness rule's interval (`liveness.py`),
  never behind a result or a sweep; deprecation makes the worker drain;
- the listener (`listener.py`) waits for PGMQ's insert notifications on this worker's queue;
- the scheduler (`scheduler.py`) starts the flows' scheduled runs, one worker per database at a
  time (setting `schedules`).

They run in one TaskGroup under a `supervision.Supervisor`: a part that fails unexpectedly is
logged and stops the worker, which drains and ends with `WorkerFailedError`. Results wait in
memory until the reporter has sent them, so a lost connection or a failed statement loses
nothing. Every database call goes through a `session.Session` (the named engine calls of
`engine/worker_statements.py`): psycopg in production, an in-memory fake in the loop's unit tests
(tests/runtime/test_worker_loop.py). SIGTERM or SIGINT (or deprecation) stops the polling and
drains in-flight handlers for the grace period; the worker then marks itself stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import psycopg

from pgflow_gen.engine import roles
from pgflow_gen.runtime import database, errors
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.reconnecting import Link, Outage, connection_lost, primary_message
from pgflow_gen.runtime.worker.assignment import Assignment
from pgflow_gen.runtime.worker.heartbeat import Heartbeat
from pgflow_gen.runtime.worker.listener import listen
from pgflow_gen.runtime.worker.liveness import DEFAULT, Liveness
from pgflow_gen.runtime.worker.metrics import MetricsServer, WorkerMetrics
from pgflow_gen.runtime.worker.poller import Poller
from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from pgflow_gen.runtime.worker.reporter import Reporter
from pgflow_gen.runtime.worker.scheduler import Scheduler
from pgflow_gen.runtime.worker.session import Connector, Session
from pgflow_gen.runtime.worker.settings import WorkerSettings
from pgflow_gen.runtime.worker.slots import HANDLER_THREAD_PREFIX, Slots
from pgflow_gen.runtime.worker.supervision import Supervisor
from pgflow_gen.words import counted

__all__ = ["HANDLER_THREAD_PREFIX", "Assignment", "WorkerLoop"]

#: How long results that cannot be sent keep their tasks' leases: past it stall recovery may run
#: those tasks again elsewhere (their late results then change nothing), so a result the
#: database keeps refusing for an unknown reason never holds its task for ever.
MAX_LEASE_RENEWAL_S = 300.0


class WorkerLoop:
    """One worker: start, poll, report, drain and stop (see the module docstring)."""

    def __init__(
        self,
        assignment: Assignment,
        settings: WorkerSettings,
        database_url: str,
        logger: logging.Logger,
        connect: Connector | None = None,
    ) -> None:
        """`connect` opens a database session (default: psycopg on `database_url`); the unit
        tests pass an in-memory fake. Handlers' own `ctx.connection` uses `database_url`."""
        self.assignment = assignment
        self.settings = settings
        self.log = logger
        self.worker_id = uuid.uuid4()
        self.name = settings.worker_name or (
            f"{assignment.flow.slug}-{assignment.step_slug}"
            if assignment.step_slug
            else assignment.flow.slug
        )
        #: Set once the worker has compiled its flow and registered, and polls.
        self.started = asyncio.Event()
        # psycopg prepares a statement after 5 executions; None turns that off (PgBouncer).
        prepare: int | None = 5 if settings.prepared_statements else None
        self._connect: Connector = connect or functools.partial(
            PsycopgSession.connect, database_url, prepare
        )
        #: The flows' schedules and debounced starts are started from a connection of their
        #: own (a real database: not with an injected connector, the unit tests' in-memory fake).
        self._schedules: Scheduler | None = (
            Scheduler(logger) if settings.schedules and connect is None else None
        )
        self._scheduler: Callable[[], Awaitable[None]] | None = (
            None
            if self._schedules is None
            else functools.partial(self._schedules.run, database_url, prepare)
        )
        #: This worker's Prometheus metrics (served when settings.metrics_port is set).
        self.metrics = WorkerMetrics(assignment.flow.slug, assignment.queue_name)
        self.metrics_server: MetricsServer | None = None
        self.slots = Slots(
            flow=assignment.flow,
            handlers=assignment.handlers,
            max_concurrent=settings.max_concurrent,
            worker_id=self.worker_id,
            name=self.name,
            database_url=database_url,
            prepare_threshold=prepare,
            logger=logger,
            check_outputs=settings.check_outputs,
            not_on=assignment.not_on,
            metrics=self.metrics,
            queue_name=assignment.queue_name,
        )
        self._draining = False
        self._deadline = 0.0
        self._notifications = settings.notifications
        #: The engine's liveness rule, read at startup.
        self.liveness: Liveness = DEFAULT
        #: The heartbeat, once the worker serves (the tests watch its beats).
        self.heartbeat: Heartbeat | None = None
        self._renewal_given_up = False

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self, stopped_before: Sequence[str] = (), *, handle_signals: bool = True) -> None:
        """Serve until stopped. `stopped_before` names signals that arrived before the loop
        ran (`SIGTERM`): the worker then stops without starting. With `handle_signals`, SIGTERM
        and SIGINT make it drain (a process's own worker; an embedded one leaves the signals to
        its application)."""
        if handle_signals:
            self._install_signal_handlers()
        for name in stopped_before:
            self.begin_drain(f"received {name}")
        if self.settings.metrics_port is not None:
            # Before connecting: a port in use is a configuration error, said at once.
            self.metrics_server = MetricsServer(
                self.settings.metrics_host, self.settings.metrics_port
            )
            self.metrics_server.start()
            self.log.info(
                "metrics at http://%s:%d/metrics", self.settings.metrics_host,
                self.metrics_server.bound_port,
            )  # fmt: skip
        try:
            await self._start_and_serve()
        finally:
            if self.metrics_server is not None:
                self.metrics_server.stop()

    async def _start_and_serve(self) -> None:
        first = await self._connect_for_startup()
        if first is None:
            self.slots.close()
            self.log.info("worker %s stopped before it started", self.name)
            return
        try:
            await self._compile(first)
            self.liveness = await first.liveness()
            if self._notifications:
                self._notifications = await self._enable_notifications(first)
            else:
                self.log.info(
                    "insert notifications off; polling every %.2f s", self.settings.poll_interval
                )
            try:
                await self._register(first)
            except psycopg.Error as exc:
                raise errors.DatabaseError(
                    "The worker could not register.",
                    detail=primary_message(exc),
                    hint=roles.refusal_hint(exc),
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
            self.settings.max_concurrent,
        )
        await self._serve(first)
        self.log.info("worker %s stopped", self.name)

    async def _serve(self, first: Session) -> None:
        counted = self.metrics.reconnected
        outage = Outage(self.log)  # one line when the database goes, one when it is back
        poll_link: Link[Session] = Link(
            self._connect, "polling", self.log, on_reconnect=counted, outage=outage
        )
        poll_link.adopt(first)
        report_link: Link[Session] = Link(
            self._connect, "results", self.log, on_reconnect=counted, outage=outage
        )
        beat_link: Link[Session] = Link(
            self._connect, "heartbeats", self.log, on_connect=self._register,
            on_reconnect=counted, outage=outage,
        )  # fmt: skip
        poller = Poller(
            slots=self.slots,
            assignment=self.assignment,
            worker_id=self.worker_id,
            batch_size=self.settings.batch_size,
            poll_interval=self.settings.poll_interval,
            read_visibility=self.settings.read_visibility,
            link=poll_link,
            logger=self.log,
            stopping=lambda: self._draining,
        )
        reporter = Reporter(
            slots=self.slots,
            worker_id=self.worker_id,
            name=self.name,
            recovery_interval=self.settings.recovery_interval,
            link=report_link,
            logger=self.log,
            draining=lambda: self._draining,
            remaining=self._remaining,
            claimer=poller,
        )
        self.heartbeat = Heartbeat(
            link=beat_link,
            worker_id=self.worker_id,
            name=self.name,
            interval=self.liveness.heartbeat_interval,
            logger=self.log,
            draining=lambda: self._draining,
            begin_drain=self.begin_drain,
            held=functools.partial(self._held, reporter),
        )
        crew = Supervisor(self.name, self.log, self._stop_for_failure)
        async with asyncio.TaskGroup() as group:
            reporting = group.create_task(crew.guard("reporter", reporter.run()))
            beating = group.create_task(crew.guard("heartbeat", self.heartbeat.run()))
            listening = (
                group.create_task(
                    crew.guard(
                        "listener",
                        listen(
                            self._connect,
                            self.assignment.queue_name,
                            self.slots.wake_poll,
                            self.log,
                            on_cancelled=self._run_cancelled,
                            on_reconnect=counted,
                            holds=self.slots.holds_run,
                            outage=outage,
                            on_debounced=None if self._schedules is None else self._schedules.nudge,
                        ),
                    )
                )
                if self._notifications
                else None
            )
            scheduling = (
                group.create_task(crew.guard("scheduler", self._scheduler()))
                if self._scheduler is not None
                else None
            )
            try:
                await crew.guard("poller", poller.run())
            finally:
                await crew.cleanup([
                    ("draining the handlers", lambda: self.slots.drain(self._remaining)),
                    ("sending the last results", lambda: self._last_results(reporter, reporting)),
                    ("stopping the heartbeat", lambda: _cancel(beating)),
                    ("stopping the listener", lambda: _cancel(listening)),
                    ("stopping the scheduler", lambda: _cancel(scheduling)),
                    ("marking the worker stopped", reporter.mark_stopped),
                    ("closing the polling connection", poll_link.close),
                    ("closing the results connection", report_link.close),
                    ("closing the heartbeat connection", beat_link.close),
                    ("shutting down the handler threads", self.slots.close),
                ])  # fmt: skip
        crew.raise_failure()

    def _run_cancelled(self, run_id: uuid.UUID) -> None:
        stopping = self.slots.cancel_run(run_id)
        if stopping:
            self.log.info("run %s was cancelled: stopping %s", run_id, counted(stopping, "handler"))

    def _held(self, reporter: Reporter) -> list[ClaimedTask]:
        """The tasks whose leases the heartbeat renews: those of unsent results, unless sending
        has been failing for longer than MAX_LEASE_RENEWAL_S."""
        if reporter.stuck_for() <= MAX_LEASE_RENEWAL_S:
            self._renewal_given_up = False
            return self.slots.unsent()
        if not self._renewal_given_up:
            self._renewal_given_up = True
            self.log.warning(
                "worker %s: results could not be sent for %.0f s; their tasks' leases are no"
                " longer renewed, so stall recovery may run them again",
                self.name,
                MAX_LEASE_RENEWAL_S,
            )
        return []

    async def _last_results(self, reporter: Reporter, reporting: asyncio.Task[None]) -> None:
        """Let the reporter send what is left (within the grace period, at least 5 s)."""
        reporter.finish()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reporting), timeout=max(5.0, self._remaining()))
        await _cancel(reporting)
        if self.slots.reports:
            self.log.warning(
                "worker %s: %s could not be sent before stopping; stall recovery"
                " will run those tasks again",
                self.name,
                counted(len(self.slots.reports), "result"),
            )

    def _stop_for_failure(self, reason: str) -> None:
        """Drain after a part failed; a drain under way keeps its grace period."""
        if not self._draining:
            self.begin_drain(reason)

    def begin_drain(self, reason: str) -> None:
        """Stop polling; in-flight handlers get the grace period to finish."""
        if self._draining:
            self.log.warning(
                "worker %s: %s again, stopping without waiting for %s; their tasks"
                " stay started and stall recovery will requeue them",
                self.name,
                reason,
                counted(len(self.slots.inflight), "handler"),
            )
            self.slots.hurried = True
            self._deadline = time.monotonic()
        else:
            self.log.info(
                "worker %s: %s, draining %s for up to %.1f s",
                self.name,
                reason,
                counted(len(self.slots.inflight), "handler"),
                self.settings.shutdown_grace,
            )
            self._draining = True
            self._deadline = time.monotonic() + self.settings.shutdown_grace
            self.slots.shutdown.set()
        self.slots.wake_poll.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for number, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            try:
                loop.add_signal_handler(number, self.begin_drain, f"received {name}")
            except (NotImplementedError, RuntimeError, ValueError):
                return  # not the main thread (or no signals here): the caller stops us

    def _remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    # -- startup -------------------------------------------------------------------------------
    async def _connect_for_startup(self) -> Session | None:
        """Connect, retrying for a while: a worker may start a little before its database.
        None when the worker is stopped before it has connected."""
        deadline = time.monotonic() + self.settings.connect_timeout
        backoff = 0.25
        while not self._draining:
            try:
                return await self._connect()
            except psycopg.Error as exc:
                problem = database.config_problem(exc)
                if problem is not None:
                    raise problem from None  # no retry can fix it
                if not isinstance(exc, psycopg.OperationalError):
                    raise
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
                    await asyncio.wait_for(self.slots.wake_poll.wait(), timeout=backoff)
                backoff = min(backoff * 2, 5.0)
        return None

    async def _compile(self, session: Session) -> None:
        a = self.assignment
        compiled = await session.compile_flow(a.flow, a.queue_mode, a.route_map)
        if compiled.description_kept:
            self.log.warning(
                "flow %s %s (this worker's spec is older: rebuild it, or apply the flow's generated"
                " migration to adopt its options and input schema again)",
                a.flow.slug,
                compiled.summary,
            )
        else:
            self.log.info("flow %s %s", a.flow.slug, compiled.summary)

    async def _enable_notifications(self, session: Session) -> bool:
        """Make inserts into this queue notify the worker; False when the engine refuses (this
        role may not), and the worker long-polls instead."""
        try:
            await session.enable_notifications(self.assignment.queue_name)
        except psycopg.Error as exc:
            if connection_lost(session, exc):
                raise errors.DatabaseError(
                    "The database connection was lost during startup.", detail=primary_message(exc)
                ) from exc
            self.log.warning(
                "cannot enable PGMQ insert notifications (%s); polling every %.1f s",
                primary_message(exc),
                self.settings.poll_interval,
            )
            return False
        return True

    async def _register(self, session: Session) -> None:
        a = self.assignment
        await session.register_worker(
            self.worker_id, a.queue_name, self.name, a.flow.slug, a.step_slug
        )


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait until it has ended (a cancellation of the caller propagates)."""
    if task is None or task.done():
        return
    task.cancel()
    await asyncio.wait({task})
