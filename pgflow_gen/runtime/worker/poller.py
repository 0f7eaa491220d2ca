"""The poller: reads only as many messages as there are free slots, claims their tasks with the
worker's exact selector and starts their handlers; gives its own messages read again their lease
back; sleeps until a notification, a freed slot or the poll interval wakes it.

A busy worker's reporter claims too: it sends its results and claims into the slots they free in
one call (`complete_and_claim`, engine 0014), through this poller, one claim at a time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable

import psycopg

from pgflow_gen.runtime import tracing
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.reconnecting import Link, connection_lost, primary_message
from pgflow_gen.runtime.worker import results
from pgflow_gen.runtime.worker.assignment import Assignment
from pgflow_gen.runtime.worker.session import Claim, Session
from pgflow_gen.runtime.worker.slots import Slots
from pgflow_gen.words import counted

#: How many held message ids the poller remembers, so that it logs each once.
HELD_REMEMBERED = 10_000
#: A poller woken for a hidden message that shows again wakes this much later, so that the
#: message is visible by then (its time and the poller's clock are the database's and ours).
WAKE_MARGIN_S = 0.005


class Poller:
    def __init__(
        self,
        *,
        slots: Slots,
        assignment: Assignment,
        worker_id: uuid.UUID,
        batch_size: int,
        poll_interval: float,
        read_visibility: int,
        link: Link[Session],
        logger: logging.Logger,
        stopping: Callable[[], bool],
    ) -> None:
        self.slots = slots
        self.assignment = assignment
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.read_visibility = read_visibility
        self.link = link
        self.log = logger
        self.stopping = stopping
        #: Held messages of paused steps already logged (see _say_paused).
        self._held_seen: set[int] = set()
        #: Said once: the runs' trace contexts could not be read.
        self._said_untraced = False
        #: Seconds until the queue's next hidden message shows again, from the last poll that
        #: read less than it asked for (None: unknown, or nothing hidden).
        self.next_visible_in: float | None = None
        #: One claim at a time: the poller's, or the reporter's with its results.
        self._claiming = asyncio.Lock()
        #: Whether the last claim read all it asked for (the queue may hold more).
        self._busy = False
        #: When the sleeping poller wakes at the latest (monotonic; 0 while it is awake).
        self._wake_at = 0.0

    async def run(self) -> None:
        """Poll until the worker stops."""
        slots = self.slots
        while not self.stopping():
            slots.wake_poll.clear()
            self.next_visible_in = None
            free = slots.free()
            if free > 0:
                wanted = min(self.batch_size, free)
                session = await self.link.get(give_up=self.stopping)
                if session is None or self.stopping():
                    break
                try:
                    read = await self.read_and_claim(session, wanted)
                except psycopg.Error as exc:
                    if connection_lost(session, exc):
                        await self.link.broken(exc)
                        continue
                    # A statement error: log it and try again after the poll interval.
                    self.log.error(
                        "polling queue %s failed: %s",
                        self.assignment.queue_name,
                        primary_message(exc),
                    )
                    read = 0
                if read == wanted and not self.stopping():
                    continue  # there may be more waiting
            # Asleep until a notification or a freed slot wakes it, or a hidden message (a
            # retry waiting out its delay, say) shows again, or else the poll interval passes.
            timeout = self.poll_interval
            if self.next_visible_in is not None:
                timeout = min(timeout, max(0.0, self.next_visible_in) + WAKE_MARGIN_S)
            self._wake_at = time.monotonic() + timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slots.wake_poll.wait(), timeout=timeout)
            self._wake_at = 0.0

    async def read_and_claim(self, session: Session, wanted: int) -> int:
        """Read up to `wanted` messages (fewer when slots filled meanwhile), claim their tasks
        and start them, in one call; the number read."""
        a = self.assignment
        async with self._claiming:
            wanted = min(wanted, self.slots.free())
            if wanted <= 0:
                return 0
            claim = await session.read_and_claim(
                a.flow.slug, a.queue_name, self.worker_id, wanted, self.read_visibility, a.step_slug
            )
            read = await self._take(session, claim)
            self._busy = read == wanted
            return read

    async def complete_and_claim(self, session: Session) -> bool:
        """Send the results at the head of the reports that are successes and claim into the
        slots they free, in one call; whether they were sent. False (nothing sent, nothing
        claimed) when there are none, the worker is stopping, or the engine refused them
        (`results.send_reports` then finds the one it refuses). Raises the psycopg error of
        a lost connection or a transient failure, with the results kept."""
        slots = self.slots
        a = self.assignment
        # Worth a read when the queue had more than the last claim took, or when the results'
        # next steps come to this very queue (a plain flow's one worker); else the listener's
        # notification wakes the poller when work comes.
        if self.stopping() or not (self._busy or a.step_slug is None):
            return False
        batch = results.leading_successes(slots.reports)
        if not batch:
            return False
        async with self._claiming:
            wanted = max(0, min(self.batch_size, slots.free() + len(batch)))
            try:
                done = await session.complete_and_claim(
                    [r.task for r in batch],
                    [r.output for r in batch],
                    a.flow.slug,
                    a.queue_name,
                    self.worker_id,
                    wanted,
                    self.read_visibility,
                    a.step_slug,
                )
            except Exception as exc:
                if results.refused(session, exc):
                    return False  # the reporter sends them one by one, and finds the bad one
                raise
            results.settle(slots.reports, batch, done.rows, self.log, slots.metrics)
            read = await self._take(session, done.claim)
            self._busy = read == wanted and wanted > 0
        if self._busy:
            slots.wake_poll.set()  # there may be more waiting
        return True

    async def _take(self, session: Session, claim: Claim) -> int:
        """Start what a claim claimed and say what it did not; the number of messages read."""
        a = self.assignment
        claimed, archived, held, unclaimed_read = (
            claim.tasks,
            claim.archived,
            claim.held,
            claim.unclaimed,
        )
        self.next_visible_in = claim.next_visible_in
        if (
            self.next_visible_in is not None
            and time.monotonic() + self.next_visible_in + WAKE_MARGIN_S < self._wake_at
        ):
            self.slots.wake_poll.set()  # the sleeping poller must wake sooner than it planned
        if claimed and tracing.enabled():
            claimed = await self._traced(session, claimed)
        # Handlers first: the claim is committed, so nothing below may keep them from starting.
        for task in claimed:
            self.slots.start(task)
        if archived:
            self.log.warning(
                "archived %s in queue %s, ids %s: their task no longer exists (its"
                " run was deleted or pruned), so they would come back after every lease",
                counted(len(archived), "message"),
                a.queue_name,
                ", ".join(map(str, archived)),
            )
        self._say_paused(held)
        self.slots.metrics.limited(len(claim.limited), claim.cut_short)
        unclaimed = sorted(set(unclaimed_read) - set(archived) - set(held) - set(claim.limited))
        own = await self._keep_own_messages_hidden(session, unclaimed)
        foreign = [msg_id for msg_id in unclaimed if msg_id not in own]
        if foreign:
            self.slots.metrics.unclaimed(len(foreign))
            self.log.warning(
                "left %s in queue %s unclaimed, ids %s: no queued task of %s matches"
                " them (already started or finished, or not this flow's or step's); this worker"
                " does not touch them",
                counted(len(foreign), "message"),
                a.queue_name,
                ", ".join(map(str, foreign)),
                f"flow {a.flow.slug} step {a.step_slug}" if a.step_slug else f"flow {a.flow.slug}",
            )
        return len(claimed) + len(unclaimed_read)

    async def _traced(self, session: Session, claimed: list[ClaimedTask]) -> list[ClaimedTask]:
        """The tasks with their runs' trace contexts (one statement), so their spans join the
        traces their runs were started in; the tasks as they are when that fails (logged once):
        a trace is never worth a task that does not start."""
        try:
            found = await session.trace_contexts(list({task.run_id for task in claimed}))
        except psycopg.Error as exc:
            if not self._said_untraced:
                self._said_untraced = True
                self.log.warning(
                    "cannot read the runs' trace contexts (%s); task spans start traces of"
                    " their own", primary_message(exc),
                )  # fmt: skip
            return claimed
        return [dataclasses.replace(task, traceparent=found.get(task.run_id)) for task in claimed]

    def _say_paused(self, held: list[int]) -> None:
        """Log the messages of paused steps a claim held, each once (held messages come back
        every minute until their step is resumed)."""
        new = [msg_id for msg_id in held if msg_id not in self._held_seen]
        if not new:
            return
        if len(self._held_seen) > HELD_REMEMBERED:
            self._held_seen.clear()
        self._held_seen.update(new)
        self.log.info(
            "held %s in queue %s, ids %s: a step of flow %s is paused (`pgflow-gen"
            " coverage` shows which); they wait, using no attempt, until it is resumed",
            counted(len(new), "message"),
            self.assignment.queue_name,
            ", ".join(map(str, new[:10])) + (" ..." if len(new) > 10 else ""),
            self.assignment.flow.slug,
        )

    async def _keep_own_messages_hidden(self, session: Session, unclaimed: list[int]) -> set[int]:
        """Of the messages read but not claimed, the ones of this worker's own tasks (a handler
        still running, or a result not sent yet): reading made them visible again sooner than
        their lease said, so they get it back (the time to their timeout + 2 s, at least the
        read's visibility). Nothing is logged about them."""
        ours = self.slots.own_message_ids()
        own = [msg_id for msg_id in unclaimed if msg_id in ours]
        now = time.monotonic()
        deadlines = self.slots.deadlines
        offsets = [
            max(self.read_visibility, math.ceil(deadlines.get(msg_id, now) - now) + 2)
            for msg_id in own
        ]
        extend = [(m, o) for m, o in zip(own, offsets, strict=True) if o > self.read_visibility]
        if extend:
            await session.set_visibility(
                self.assignment.queue_name, [m for m, _ in extend], [o for _, o in extend]
            )
        return set(own)
