"""An in-memory stand-in for the engine calls of one queue (the `Session` seam of the worker
loop), for unit tests of the loop's logic: slots, leases, drain, reconnects, deprecation.

It keeps messages with a visibility time and a queued task behind each, as PGMQ and the engine
do, and records what the worker did. `down = True` makes every call (and every new connection)
fail as a lost connection does; `explode["heartbeat"] = RuntimeError(...)` makes that call raise
the error (to the loop, a bug in the part that makes the call). The behaviour of the real engine
is tested against PostgreSQL elsewhere; this fake is only as smart as the loop tests need.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.worker import startup
from pgflow_gen.runtime.worker.liveness import Liveness
from pgflow_gen.runtime.worker.session import Claim, Completion, TaskRow


@dataclass
class FakeEngine:
    flow_slug: str
    step_slug: str
    #: message id -> when it is visible again (time.monotonic()).
    visible_at: dict[int, float] = field(default_factory=dict)
    #: message id -> its queued task (removed when claimed).
    queued: dict[int, ClaimedTask] = field(default_factory=dict)
    #: message id -> every output or error reported for it, in order.
    results: dict[int, list[Any]] = field(default_factory=dict)
    claims: list[list[int]] = field(default_factory=list)
    leases: list[tuple[int, int]] = field(default_factory=list)
    registrations: int = 0
    heartbeats: int = 0
    deprecated: bool = False
    stopped: bool = False
    down: bool = False
    #: Only results fail (their connection is lost, new ones are refused); reads still work.
    results_down: bool = False
    refused_connections: int = 0
    #: What complete_task returns as the task's attempts_count (None: the claimed attempt).
    current_attempt: int | None = None
    #: The liveness rule the engine tells workers (fast beats by default, for quick tests).
    liveness: Liveness = field(default_factory=lambda: Liveness(0.02, 0.06, 0.2))
    #: Whether PGMQ here has insert notifications (then the worker runs its listener).
    notifications: bool = False
    #: Session method name -> the error it raises (once set, on every call).
    explode: dict[str, BaseException] = field(default_factory=dict)
    #: While set to an unset event, results wait for it (a lock held on the rows they need).
    results_gate: asyncio.Event | None = None
    #: Heartbeats get no answer (a half-open connection, a lock on the worker's row).
    heartbeat_hangs: bool = False
    #: The message ids of every lease renewal, in order.
    renewed: list[int] = field(default_factory=list)
    #: What compiling the flow at startup says.
    compilation: startup.Compilation = field(
        default_factory=lambda: startup.Compilation("compiled")
    )
    #: Every session opened, in order.
    sessions: list[FakeSession] = field(default_factory=list)
    #: The number of results sent with each complete_and_claim call, in order.
    joint: list[int] = field(default_factory=list)
    #: The number of successes sent with each complete_task or complete_tasks call, in order.
    batches: list[int] = field(default_factory=list)
    _next_id: int = 1

    def enqueue(self, count: int, timeout: int = 60) -> list[int]:
        ids = []
        for index in range(count):
            msg_id, self._next_id = self._next_id, self._next_id + 1
            self.visible_at[msg_id] = 0.0
            self.queued[msg_id] = ClaimedTask(
                flow_slug=self.flow_slug,
                run_id=uuid.UUID(int=msg_id),
                step_slug=self.step_slug,
                input=index,
                msg_id=msg_id,
                task_index=0,
                flow_input=index,  # a root step: its handler gets the run input
                attempt=1,
                timeout=timeout,
            )
            ids.append(msg_id)
        return ids

    def show(self, msg_id: int) -> None:
        """Make a message visible now (as a read by someone else, or a lease run out, would)."""
        self.visible_at[msg_id] = 0.0

    @property
    def finished(self) -> int:
        return len(self.results)

    async def connect(self) -> FakeSession:
        if self.down or self.results_down:
            self.refused_connections += 1
            raise psycopg.OperationalError("connection refused (the fake engine is down)")
        session = FakeSession(self)
        self.sessions.append(session)
        return session


class FakeSession:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self._closed = False
        self._lost = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def broken(self) -> bool:
        return self.engine.down or self._lost

    async def close(self) -> None:
        self._closed = True

    def _call(self) -> FakeEngine:
        if self.engine.down:
            raise psycopg.OperationalError("server closed the connection (the fake is down)")
        caller = sys._getframe(1).f_code.co_name
        if caller in self.engine.explode:
            raise self.engine.explode[caller]
        return self.engine

    async def compile_flow(
        self, flow: Flow[Any, Any, Any], mode: QueueMode, route_map: Sequence[Mapping[str, str]]
    ) -> startup.Compilation:
        return self._call().compilation

    async def enable_notifications(self, queue: str) -> None:
        if not self._call().notifications:  # as a role the engine refuses it to
            raise psycopg.errors.InsufficientPrivilege("permission denied (the fake's)")

    async def liveness(self) -> Liveness:
        return self._call().liveness

    async def register_worker(
        self, worker_id: uuid.UUID, queue: str, name: str, flow_slug: str, step_slug: str | None
    ) -> None:
        self._call().registrations += 1

    async def read_and_claim(
        self,
        flow_slug: str,
        queue: str,
        worker_id: uuid.UUID,
        limit: int,
        visibility: int,
        step_slug: str | None,
    ) -> Claim:
        """The read and the claim in one call."""
        self._call()
        return self._read_and_claim(limit, visibility)

    def _read_and_claim(self, limit: int, visibility: int) -> Claim:
        engine = self.engine
        now = time.monotonic()
        ids = sorted(m for m, at in engine.visible_at.items() if at <= now)[:limit]
        for msg_id in ids:
            engine.visible_at[msg_id] = now + visibility
        if not ids:
            return Claim([], [], [])
        claimed = [engine.queued.pop(m) for m in ids if m in engine.queued]
        engine.claims.append([task.msg_id for task in claimed])
        taken = {task.msg_id for task in claimed}
        return Claim(claimed, [], [], unclaimed=tuple(m for m in ids if m not in taken))

    async def set_visibility(self, queue: str, msg_ids: list[int], seconds: list[int]) -> None:
        engine = self._call()
        now = time.monotonic()
        for msg_id, offset in zip(msg_ids, seconds, strict=True):
            engine.visible_at[msg_id] = now + offset
            engine.leases.append((msg_id, offset))

    async def complete_task(self, task: ClaimedTask, output: Any) -> TaskRow:
        self._call()
        if self.engine.results_gate is not None:
            await self.engine.results_gate.wait()
        self.engine.batches.append(1)
        return self._finish(task, output)

    async def fail_task(
        self, task: ClaimedTask, error: str, not_retried: str | None = None
    ) -> TaskRow:
        self._call()
        return self._finish(task, error)

    async def complete_tasks(self, tasks: list[ClaimedTask], outputs: list[Any]) -> list[TaskRow]:
        self._call()
        self.engine.batches.append(len(tasks))
        return [self._finish(task, output) for task, output in zip(tasks, outputs, strict=True)]

    async def complete_and_claim(
        self,
        tasks: list[ClaimedTask],
        outputs: list[Any],
        flow_slug: str,
        queue: str,
        worker_id: uuid.UUID,
        limit: int,
        visibility: int,
        step_slug: str | None,
    ) -> Completion:
        """Results and the next claim in one call."""
        self._call()
        if self.engine.results_gate is not None:
            await self.engine.results_gate.wait()
        rows = [self._finish(task, output) for task, output in zip(tasks, outputs, strict=True)]
        self.engine.joint.append(len(tasks))
        claim = Claim([], [], [])
        if limit > 0:
            claim = self._read_and_claim(limit, visibility)
        return Completion(rows, claim)

    def _finish(self, task: ClaimedTask, result: Any) -> TaskRow:
        engine = self.engine
        if engine.results_down:
            self._lost = True
            raise psycopg.OperationalError("server closed the connection (results are down)")
        current = engine.current_attempt or task.attempt
        if current == task.attempt:
            engine.results.setdefault(task.msg_id, []).append(result)
            engine.visible_at.pop(task.msg_id, None)  # archived
        return (current, "completed" if current == task.attempt else "started")

    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        engine = self._call()
        if engine.heartbeat_hangs:
            await asyncio.Event().wait()  # no answer, as on a half-open connection
        engine.heartbeats += 1
        return engine.deprecated

    async def renew_leases(self, worker_id: uuid.UUID, tasks: Sequence[ClaimedTask]) -> int:
        engine = self._call()
        engine.renewed.extend(task.msg_id for task in tasks)
        return len(tasks)

    async def requeue_stalled(self, timeout_s: float) -> int:
        self._call()
        return 0

    async def mark_stopped(self, worker_id: uuid.UUID) -> None:
        self._call().stopped = True

    async def trace_contexts(self, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, str | None]:
        self._call()
        return dict.fromkeys(run_ids)

    async def listen(self, channel: str) -> None:
        self._call()

    async def notifies(self, timeout: float) -> AsyncGenerator[str]:
        self._call()
        await asyncio.sleep(timeout)  # the fake sends no notifications
        return
        yield

    async def cancelled_runs(self, run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        self._call()
        return []

    async def ping(self) -> None:
        self._call()
