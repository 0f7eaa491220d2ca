"""The seam between the worker loop and the database: a `Session` is one connection seen as the
engine calls the loop makes, by name. `PsycopgSession` is the real one; the unit tests drive the
loop's logic (slots, leases, drain, reconnects, deprecation) with an in-memory fake of it, the
way procrastinate tests its worker against an in-memory connector.

A session raises psycopg's errors, the fake too: `links.connection_lost` tells a lost connection
(reconnect) from a failed statement.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime import queries, startup
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.links import CONNECT_OPTIONS
from pgflow_gen.runtime.task_runner import ClaimedTask

#: Advisory lock keys in namespace 2 (namespace 1 belongs to migrations).
LOCK_NAMESPACE = 2
RECOVERY_LOCK = 3
NOTIFY_SETUP_LOCK = 4

#: A task's row after a callback: (attempts_count, status); None when there is no such task.
TaskRow = tuple[int, str] | None


class Session(Protocol):
    @property
    def closed(self) -> bool: ...
    @property
    def broken(self) -> bool: ...
    async def close(self) -> None: ...

    # startup
    async def compile_flow(
        self, flow: Flow[Any, Any, Any], mode: QueueMode, route_map: Sequence[Mapping[str, str]]
    ) -> str: ...
    async def enable_notifications(self, queue: str) -> bool: ...
    async def register_worker(
        self, worker_id: uuid.UUID, queue: str, name: str, flow_slug: str, step_slug: str | None
    ) -> None: ...

    # polling
    async def read_messages(self, queue: str, visibility: int, limit: int) -> list[int]: ...
    async def claim_tasks(
        self,
        flow_slug: str,
        msg_ids: list[int],
        worker_id: uuid.UUID,
        queue: str,
        step_slug: str | None,
    ) -> list[ClaimedTask]: ...
    async def set_visibility(self, queue: str, msg_ids: list[int], seconds: list[int]) -> None: ...

    # results
    async def complete_task(self, task: ClaimedTask, output: Any) -> TaskRow: ...
    async def fail_task(self, task: ClaimedTask, error: str) -> TaskRow: ...
    async def complete_tasks(
        self, tasks: list[ClaimedTask], outputs: list[Any]
    ) -> list[TaskRow]: ...

    # upkeep
    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        """Whether the worker was deprecated; raises NoDataFound when its row is gone."""
        ...

    async def requeue_stalled(self) -> int:
        """Requeue stalled tasks unless another worker is doing it (then 0)."""
        ...

    async def mark_stopped(self, worker_id: uuid.UUID) -> None: ...

    # notifications
    async def listen(self, channel: str) -> None: ...
    def notifies(self, timeout: float) -> AsyncIterator[object]: ...
    async def ping(self) -> None: ...


#: Opens a new session (the loop reconnects through it).
Connector = Callable[[], Awaitable[Session]]


class PsycopgSession:
    """A `Session` on one autocommit psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, url: str, prepare_threshold: int | None = 5) -> PsycopgSession:
        conn = await psycopg.AsyncConnection.connect(
            url, autocommit=True, prepare_threshold=prepare_threshold, **CONNECT_OPTIONS
        )
        return cls(conn)

    @property
    def closed(self) -> bool:
        return self.conn.closed

    @property
    def broken(self) -> bool:
        return self.conn.broken

    async def close(self) -> None:
        await self.conn.close()

    async def compile_flow(
        self, flow: Flow[Any, Any, Any], mode: QueueMode, route_map: Sequence[Mapping[str, str]]
    ) -> str:
        return await startup.compile_flow(self.conn, flow, mode, route_map)

    async def enable_notifications(self, queue: str) -> bool:
        """Make PGMQ notify on inserts into `queue`; False when this PGMQ has no notifications.
        One worker at a time (an advisory lock), each queue once."""
        async with self.conn.transaction():
            await self.conn.execute(
                queries.LOCK_FOR_TRANSACTION, (LOCK_NAMESPACE, NOTIFY_SETUP_LOCK)
            )
            if not await self._true(queries.PGMQ_HAS_NOTIFICATIONS, ()):
                return False
            if not await self._true(queries.QUEUE_NOTIFIES, (queue,)):
                await self.conn.execute(queries.ENABLE_NOTIFICATIONS, (queue,))
        return True

    async def register_worker(
        self, worker_id: uuid.UUID, queue: str, name: str, flow_slug: str, step_slug: str | None
    ) -> None:
        await self.conn.execute(
            queries.REGISTER_WORKER, (worker_id, queue, name, flow_slug, step_slug)
        )

    async def read_messages(self, queue: str, visibility: int, limit: int) -> list[int]:
        cursor = await self.conn.execute(queries.READ_MESSAGES, (queue, visibility, limit))
        return [row[0] for row in await cursor.fetchall()]

    async def claim_tasks(
        self,
        flow_slug: str,
        msg_ids: list[int],
        worker_id: uuid.UUID,
        queue: str,
        step_slug: str | None,
    ) -> list[ClaimedTask]:
        async with self.conn.cursor(row_factory=class_row(ClaimedTask)) as claim:
            if step_slug is None:
                await claim.execute(queries.CLAIM_TASKS, (flow_slug, msg_ids, worker_id, queue))
            else:
                await claim.execute(
                    queries.CLAIM_STEP_TASKS, (flow_slug, msg_ids, worker_id, queue, step_slug)
                )
            return await claim.fetchall()

    async def set_visibility(self, queue: str, msg_ids: list[int], seconds: list[int]) -> None:
        await self.conn.execute(queries.SET_VISIBILITY, (queue, msg_ids, seconds))

    async def complete_task(self, task: ClaimedTask, output: Any) -> TaskRow:
        key = (task.run_id, task.step_slug, task.task_index)
        return await self._row(queries.COMPLETE_TASK, (*key, Jsonb(output), task.attempt))

    async def fail_task(self, task: ClaimedTask, error: str) -> TaskRow:
        key = (task.run_id, task.step_slug, task.task_index)
        return await self._row(queries.FAIL_TASK, (*key, error, task.attempt))

    async def complete_tasks(self, tasks: list[ClaimedTask], outputs: list[Any]) -> list[TaskRow]:
        cursor = await self.conn.execute(
            queries.COMPLETE_TASKS,
            (
                [t.run_id for t in tasks],
                [t.step_slug for t in tasks],
                [t.task_index for t in tasks],
                [Jsonb(output) for output in outputs],
                [t.attempt for t in tasks],
            ),
        )
        return [(row[0], row[1]) for row in await cursor.fetchall()]

    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        return await self._true(queries.HEARTBEAT, (worker_id,))

    async def requeue_stalled(self) -> int:
        cursor = await self.conn.execute(queries.REQUEUE_STALLED, (LOCK_NAMESPACE, RECOVERY_LOCK))
        row = await cursor.fetchone()
        return int(row[0]) if row and row[0] else 0

    async def mark_stopped(self, worker_id: uuid.UUID) -> None:
        await self.conn.execute(queries.MARK_STOPPED, (worker_id,))

    async def listen(self, channel: str) -> None:
        await self.conn.execute(sql.SQL("listen {}").format(sql.Identifier(channel)))

    async def notifies(self, timeout: float) -> AsyncIterator[object]:
        async for notify in self.conn.notifies(timeout=timeout):
            yield notify

    async def ping(self) -> None:
        await self.conn.execute(queries.PING)

    async def _true(self, query: queries.Query, params: tuple[Any, ...]) -> bool:
        cursor = await self.conn.execute(query, params)
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _row(self, query: queries.Query, params: tuple[Any, ...]) -> TaskRow:
        cursor = await self.conn.execute(query, params)
        row = await cursor.fetchone()
        return None if row is None else (row[0], row[1])
