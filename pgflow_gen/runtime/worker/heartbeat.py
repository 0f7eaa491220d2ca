"""The heartbeat: tells the engine every few seconds that the worker is alive, on a connection of
its own, so results held up by a busy lock or a slow stall-recovery sweep never make a live
worker look stalled; and while results wait to be sent, it renews their tasks' leases, so stall
recovery does not run them again past their timeout. An operator's deprecation, read from its
answer, makes the worker drain."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import psycopg

from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.reconnecting import Link, primary_message
from pgflow_gen.runtime.sqlstate import Kind, classify
from pgflow_gen.runtime.worker.session import Session


class Heartbeat:
    def __init__(
        self,
        *,
        link: Link[Session],
        worker_id: uuid.UUID,
        name: str,
        interval: float,
        logger: logging.Logger,
        draining: Callable[[], bool],
        begin_drain: Callable[[str], None],
        held: Callable[[], list[ClaimedTask]] = list,
    ) -> None:
        """`link` registers the worker again on every new connection (its row may be gone);
        `held` names the tasks whose results wait to be sent."""
        self.link = link
        self.worker_id = worker_id
        self.name = name
        self.interval = interval
        self.log = logger
        self.draining = draining
        self.begin_drain = begin_drain
        self.held = held
        #: Heartbeats the engine has taken (the tests watch it).
        self.beats = 0

    async def run(self) -> None:
        """Beat until cancelled; registration has just refreshed the heartbeat."""
        failing: str | None = None
        patience = max(2 * self.interval, 1.0)
        while True:
            await asyncio.sleep(self.interval)
            session = await self.link.get()
            if session is None:
                continue
            try:
                # A beat that gets no answer for two intervals is a dead connection (half-open,
                # or stuck behind a lock): a new one is opened rather than waiting for TCP.
                async with asyncio.timeout(patience):
                    deprecated = await session.heartbeat(self.worker_id)
                    await session.renew_leases(self.worker_id, self.held())
            except TimeoutError:
                silent = f"no answer to the heartbeat within {patience:g} s"
                await self.link.broken(psycopg.OperationalError(silent))
                continue
            except psycopg.errors.NoDataFound:
                # Our row was pruned (a long outage): a new connection registers again.
                await self.link.close()
                continue
            except psycopg.Error as exc:
                if classify(session, exc) is Kind.LOST:
                    await self.link.broken(exc)
                elif failing is None:
                    failing = primary_message(exc)
                    self.log.warning(
                        "worker %s: the heartbeat failed (%s); trying again every %.1f s",
                        self.name,
                        failing,
                        self.interval,
                    )
                continue
            self.beats += 1
            if failing is not None:
                self.log.info("worker %s: the heartbeat is back", self.name)
                failing = None
            if deprecated and not self.draining():
                self.begin_drain("deprecated by an operator")
