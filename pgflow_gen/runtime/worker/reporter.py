"""The reporter: sends finished handlers' results (`results.send_reports`) on its own
connection and, one worker at a time across all workers, runs stall recovery (bounded by a
statement timeout). It also marks the worker stopped. The heartbeat has a connection of its own
(`heartbeat.py`), so neither a held-up result nor a slow sweep delays it.

While other handlers are still running, a result waits up to REPORT_LINGER_S for more to finish,
so that a busy worker sends them in one call and one commit; a lone result (nothing else
running) is sent at once. Successes at the head of the results go with a claim into the slots
they free (`Poller.complete_and_claim`), when the queue had more work or the worker serves a
plain flow, so a busy worker completes and claims in one round trip (benchmarks/e2e.py
measures both).

A result whose statement failed stays in memory and is sent again: at once after a reconnect,
after a growing pause (at most MAX_RETRY_PAUSE_S) after any other failure, which is logged once
per episode with its SQLSTATE class."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable

import psycopg

from pgflow_gen.runtime.reconnecting import Link, primary_message
from pgflow_gen.runtime.sqlstate import Kind, classify
from pgflow_gen.runtime.worker.poller import Poller
from pgflow_gen.runtime.worker.results import send_reports
from pgflow_gen.runtime.worker.session import Session
from pgflow_gen.runtime.worker.slots import Slots
from pgflow_gen.words import counted

#: How long a stopping worker tries to mark itself stopped.
MARK_STOPPED_S = 3.0
#: The longest a stall-recovery sweep may run before the database cancels it.
SWEEP_TIMEOUT_S = 5.0
FIRST_RETRY_PAUSE_S = 0.1
MAX_RETRY_PAUSE_S = 5.0
#: The longest a result waits for others to finish, while handlers are still running.
REPORT_LINGER_S = 0.002


class Reporter:
    def __init__(
        self,
        *,
        slots: Slots,
        worker_id: uuid.UUID,
        name: str,
        recovery_interval: float,
        link: Link[Session],
        logger: logging.Logger,
        draining: Callable[[], bool],
        remaining: Callable[[], float],
        claimer: Poller | None = None,
        linger: float | None = None,
    ) -> None:
        """`claimer` claims into the slots sent results free, in the same call (None: the
        poller claims alone); `linger` bounds the wait for more results."""
        self.slots = slots
        self.claimer = claimer
        self.linger = REPORT_LINGER_S if linger is None else linger
        self.worker_id = worker_id
        self.name = name
        self.recovery_interval = recovery_interval
        self.link = link
        self.log = logger
        self.draining = draining
        self.remaining = remaining
        self.done = False
        self._pause = FIRST_RETRY_PAUSE_S
        #: What failed in the current episode of failed sends (None: the last send went through).
        self._failing: str | None = None
        self._failing_since = 0.0
        self._retries = 0

    def finish(self) -> None:
        """Send what is left, then return (within the grace period)."""
        self.done = True
        self.slots.wake_report.set()

    def past_deadline(self) -> bool:
        """Whether a finishing reporter should stop reconnecting: past the grace period, or at
        once when it has no results left to send."""
        return self.done and (self.remaining() <= 0 or not self.slots.reports)

    async def run(self) -> None:
        slots = self.slots
        next_recovery = time.monotonic() + random.uniform(0, self.recovery_interval)
        while True:
            slots.wake_report.clear()
            await self._gather()
            session = await self.link.get(give_up=self.past_deadline)
            if session is None:
                return  # stopping, and the database is unreachable: the results stay unsent
            try:
                await self._send(session)
            except psycopg.Error as exc:
                if await self._send_failed(session, exc):
                    continue
            now = time.monotonic()
            if now >= next_recovery:
                next_recovery = now + self.recovery_interval  # also while draining: no spin
                if not self.draining():
                    try:
                        await self._recover_stalled(session)
                    except psycopg.Error as exc:
                        if classify(session, exc) is Kind.LOST:
                            await self.link.broken(exc)
                            continue
                        self.log.warning("stall recovery failed: %s", primary_message(exc))
            if self.done and not slots.reports:
                return
            timeout = max(0.0, next_recovery - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.wake_report.wait(), timeout=timeout)

    async def _send_failed(self, session: Session, exc: psycopg.Error) -> bool:
        """Note a failed send (its results are kept); True to go round again at once."""
        kind = classify(session, exc)
        if kind is Kind.LOST:
            await self.link.broken(exc)
            return True
        self._retries += 1
        if self._failing is None:
            self._failing = primary_message(exc)
            self._failing_since = time.monotonic()
            self.log.warning(
                "sending %s failed (%s, SQLSTATE %s: %s); keeping them and trying again",
                counted(len(self.slots.reports), "result"),
                kind.value,
                exc.sqlstate or "none",
                self._failing,
            )
        await asyncio.sleep(self._pause)
        self._pause = min(self._pause * 2, MAX_RETRY_PAUSE_S)
        return True

    def stuck_for(self) -> float:
        """How long sending results has been failing without a break (0: it is not)."""
        return 0.0 if self._failing is None else time.monotonic() - self._failing_since

    async def mark_stopped(self) -> None:
        """Set `stopped_at`, trying for at most MARK_STOPPED_S: when the database is down the
        worker exits anyway, and its heartbeat going stale tells the others it is gone."""
        deadline = time.monotonic() + MARK_STOPPED_S
        reason: str | None = None
        try:
            async with asyncio.timeout(MARK_STOPPED_S):
                session = await self.link.get(give_up=lambda: time.monotonic() > deadline)
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
            reason or self.link.last_error or "the database did not answer",
        )

    async def _gather(self) -> None:
        """Let results that finish within `linger` of the first join it, while other handlers
        are still running (a lone result goes at once)."""
        slots = self.slots
        if not slots.reports or self.done or self.linger <= 0:
            return
        deadline = time.monotonic() + self.linger
        while slots.inflight and len(slots.reports) < slots.max_concurrent:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            slots.wake_report.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.wake_report.wait(), timeout=left)

    async def _send(self, session: Session) -> None:
        if not self.slots.reports:
            return
        try:
            if self.claimer is not None and not self.draining():
                await self.claimer.complete_and_claim(session)
            await send_reports(session, self.slots.reports, self.log, self.slots.metrics)
        finally:
            self.slots.wake_poll.set()  # sent results free their slots for the poller
        if self._failing is not None:
            self.log.info(
                "results sent again after %s (%s)",
                counted(self._retries, "failed attempt"),
                self._failing,
            )
        self._failing, self._retries, self._pause = None, 0, FIRST_RETRY_PAUSE_S

    async def _recover_stalled(self, session: Session) -> None:
        requeued = await session.requeue_stalled(SWEEP_TIMEOUT_S)
        if requeued:
            self.log.info("requeued %s", counted(requeued, "stalled task"))
