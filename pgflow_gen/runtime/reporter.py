"""The reporter: sends finished handlers' results (`reporting.send_reports`) and keeps the worker
alive, on its own connection: a heartbeat every few seconds (deprecation makes the worker drain)
and, one worker at a time across all workers, stall recovery. It also marks the worker stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable

import psycopg

from pgflow_gen.runtime import worker_config
from pgflow_gen.runtime.links import Link, connection_lost, primary_message
from pgflow_gen.runtime.reporting import send_reports
from pgflow_gen.runtime.session import Session
from pgflow_gen.runtime.slots import Slots

#: How long a stopping worker tries to mark itself stopped.
MARK_STOPPED_S = 3.0


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
        register: Callable[[Session], Awaitable[None]],
        draining: Callable[[], bool],
        begin_drain: Callable[[str], None],
        remaining: Callable[[], float],
    ) -> None:
        self.slots = slots
        self.worker_id = worker_id
        self.name = name
        self.recovery_interval = recovery_interval
        self.link = link
        self.log = logger
        self.register = register
        self.draining = draining
        self.begin_drain = begin_drain
        self.remaining = remaining
        self.done = False

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
        next_heartbeat = time.monotonic() + worker_config.HEARTBEAT_INTERVAL
        next_recovery = time.monotonic() + random.uniform(0, self.recovery_interval)
        while True:
            slots.wake_report.clear()
            session = await self.link.get(give_up=self.past_deadline)
            if session is None:
                return  # stopping, and the database is unreachable: the results stay unsent
            try:
                await self._send(session)
                now = time.monotonic()
                if now >= next_heartbeat:
                    next_heartbeat = now + worker_config.HEARTBEAT_INTERVAL
                    await self._heartbeat(session)
                if now >= next_recovery:
                    next_recovery = now + self.recovery_interval
                    if not self.draining():
                        await self._recover_stalled(session)
            except psycopg.Error as exc:
                if connection_lost(session, exc):
                    await self.link.broken(exc)
                    continue
                # A statement error (a heartbeat or sweep refused): log it and go on after a
                # pause, so results, heartbeats and recovery keep their chance.
                self.log.error("reporting failed: %s", primary_message(exc))
                await asyncio.sleep(1.0)
                continue
            if self.done and not slots.reports:
                return
            timeout = max(0.0, min(next_heartbeat, next_recovery) - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.wake_report.wait(), timeout=timeout)

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

    async def _send(self, session: Session) -> None:
        if not self.slots.reports:
            return
        try:
            await send_reports(session, self.slots.reports, self.log)
        finally:
            self.slots.wake_poll.set()  # sent results free their slots for the poller

    async def _heartbeat(self, session: Session) -> None:
        try:
            deprecated = await session.heartbeat(self.worker_id)
        except psycopg.errors.NoDataFound:
            # Our row was pruned (a long outage): register again.
            await self.register(session)
            return
        if deprecated and not self.draining():
            self.begin_drain("deprecated by an operator")

    async def _recover_stalled(self, session: Session) -> None:
        requeued = await session.requeue_stalled()
        if requeued:
            self.log.info("requeued %d stalled task(s)", requeued)
