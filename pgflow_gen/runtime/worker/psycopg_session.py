"""`PsycopgSession`: the `Session` a worker runs on, one autocommit psycopg connection sending
the engine gateway's worker statements, with what each claim's notices said
(`claim_notices`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from pgflow_gen.engine import statements, worker_statements
from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.flow import Flow
from pgflow_gen.runtime.reconnecting import CONNECT_OPTIONS
from pgflow_gen.runtime.worker import startup
from pgflow_gen.runtime.worker.claim_notices import ClaimNotices
from pgflow_gen.runtime.worker.liveness import Liveness
from pgflow_gen.runtime.worker.session import (
    LOCK_NAMESPACE,
    NOTIFY_SETUP_LOCK,
    RECOVERY_LOCK,
    SWEEP_LOCK_TIMEOUT,
    Claim,
    Completion,
    TaskRow,
)


class PsycopgSession:
    """A `Session` on one autocommit psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        #: What the engine's notices say of the claim under way.
        self.notices = ClaimNotices()
        conn.add_notice_handler(self.notices.hear)

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
    ) -> startup.Compilation:
        return await startup.compile_flow(self.conn, flow, mode, route_map)

    async def enable_notifications(self, queue: str) -> None:
        """Make inserts into `queue` notify its listeners, once per statement (engine 0013).
        One worker at a time (an advisory lock)."""
        async with self.conn.transaction():
            await self.conn.execute(
                worker_statements.LOCK_FOR_TRANSACTION, (LOCK_NAMESPACE, NOTIFY_SETUP_LOCK)
            )
            await self.conn.execute(worker_statements.ENABLE_STATEMENT_NOTIFICATIONS, (queue,))

    async def liveness(self) -> Liveness:
        try:
            cursor = await self.conn.execute(worker_statements.WORKER_LIVENESS)
        except psycopg.DataError as exc:  # class 22: a setting that is no interval, or out of range
            raise errors.ConfigError(
                "The database's worker liveness settings cannot be used.",
                detail=exc.diag.message_primary,
                hint=exc.diag.message_hint
                or "pgflow.heartbeat_interval, pgflow.live_within and pgflow.stalled_after are"
                " intervals, such as '30 s'.",
            ) from None
        row = await cursor.fetchone()
        assert row is not None
        return Liveness(heartbeat_interval=row[0], live_within=row[1], stalled_after=row[2])

    async def register_worker(
        self, worker_id: uuid.UUID, queue: str, name: str, flow_slug: str, step_slug: str | None
    ) -> None:
        await self.conn.execute(
            worker_statements.REGISTER_WORKER, (worker_id, queue, name, flow_slug, step_slug)
        )

    async def read_and_claim(
        self,
        flow_slug: str,
        queue: str,
        worker_id: uuid.UUID,
        limit: int,
        visibility: int,
        step_slug: str | None,
    ) -> Claim:
        self.notices.clear()
        async with self.conn.cursor(row_factory=class_row(ClaimedTask)) as claim:
            await claim.execute(
                worker_statements.READ_AND_CLAIM,
                (flow_slug, queue, worker_id, limit, visibility, step_slug),
            )
            tasks = await claim.fetchall()
        return self.notices.claim(tasks)

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
        results = _result_columns(tasks, outputs)
        self.notices.clear()
        async with self.conn.cursor(row_factory=class_row(ClaimedTask)) as claim:
            await claim.execute(
                worker_statements.COMPLETE_AND_CLAIM,
                (flow_slug, queue, worker_id, limit, visibility, step_slug, *results),
            )
            claimed = await claim.fetchall()
        rows: list[TaskRow] = [(task.attempt, "completed") for task in tasks]
        for position, attempts_count, status in self.notices.ignored:
            if 1 <= position <= len(rows):
                rows[position - 1] = (attempts_count, status)
        return Completion(rows, self.notices.claim(claimed))

    async def set_visibility(self, queue: str, msg_ids: list[int], seconds: list[int]) -> None:
        await self.conn.execute(worker_statements.SET_VISIBILITY, (queue, msg_ids, seconds))

    async def complete_task(self, task: ClaimedTask, output: Any) -> TaskRow:
        key = (task.run_id, task.step_slug, task.task_index)
        return await self._row(worker_statements.COMPLETE_TASK, (*key, Jsonb(output), task.attempt))

    async def fail_task(
        self, task: ClaimedTask, error: str, not_retried: str | None = None
    ) -> TaskRow:
        key = (task.run_id, task.step_slug, task.task_index)
        if not_retried is not None:
            return await self._row(
                worker_statements.FAIL_TASK_PERMANENTLY, (*key, error, task.attempt, not_retried)
            )
        return await self._row(worker_statements.FAIL_TASK, (*key, error, task.attempt))

    async def complete_tasks(self, tasks: list[ClaimedTask], outputs: list[Any]) -> list[TaskRow]:
        cursor = await self.conn.execute(
            worker_statements.COMPLETE_TASKS, _result_columns(tasks, outputs)
        )
        return [(row[0], row[1]) for row in await cursor.fetchall()]

    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        return await self._true(worker_statements.HEARTBEAT, (worker_id,))

    async def renew_leases(self, worker_id: uuid.UUID, tasks: Sequence[ClaimedTask]) -> int:
        if not tasks:
            return 0
        cursor = await self.conn.execute(
            worker_statements.RENEW_LEASES,
            (
                worker_id,
                [t.run_id for t in tasks],
                [t.step_slug for t in tasks],
                [t.task_index for t in tasks],
                [t.attempt for t in tasks],
            ),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row and row[0] else 0

    async def requeue_stalled(self, timeout_s: float) -> int:
        async with self.conn.transaction():
            await self.conn.execute(
                worker_statements.LIMIT_TRANSACTION,
                (f"{round(timeout_s * 1000)}ms", SWEEP_LOCK_TIMEOUT),
            )
            cursor = await self.conn.execute(
                worker_statements.REQUEUE_STALLED, (LOCK_NAMESPACE, RECOVERY_LOCK)
            )
            row = await cursor.fetchone()
        return int(row[0]) if row and row[0] else 0

    async def mark_stopped(self, worker_id: uuid.UUID) -> None:
        await self.conn.execute(worker_statements.MARK_STOPPED, (worker_id,))

    async def trace_contexts(self, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, str | None]:
        cursor = await self.conn.execute(worker_statements.TRACE_CONTEXTS, (run_ids,))
        return {row[0]: row[1] for row in await cursor.fetchall()}

    async def listen(self, channel: str) -> None:
        await self.conn.execute(statements.listen(channel))

    async def notifies(self, timeout: float) -> AsyncGenerator[str]:
        """The payloads of the first notifications that arrive within `timeout` seconds: all
        of those that arrive together (psycopg reads them in one batch, and a batch cut short
        is lost), then it ends."""
        async for notify in self.conn.notifies(timeout=timeout, stop_after=1):
            yield notify.payload

    async def cancelled_runs(self, run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        cursor = await self.conn.execute(worker_statements.CANCELLED_RUNS, (run_ids,))
        return [row[0] for row in await cursor.fetchall()]

    async def ping(self) -> None:
        await self.conn.execute(worker_statements.PING)

    async def _true(self, query: LiteralString, params: tuple[Any, ...]) -> bool:
        cursor = await self.conn.execute(query, params)
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _row(self, query: LiteralString, params: tuple[Any, ...]) -> TaskRow:
        cursor = await self.conn.execute(query, params)
        row = await cursor.fetchone()
        return None if row is None else (row[0], row[1])


def _result_columns(tasks: list[ClaimedTask], outputs: list[Any]) -> tuple[list[Any], ...]:
    """The arrays complete_tasks and complete_and_claim take: run ids, step slugs, task
    indexes, outputs and attempts. (An output JSON cannot hold raises TypeError or ValueError
    when the statement is sent.)"""
    return (
        [t.run_id for t in tasks],
        [t.step_slug for t in tasks],
        [t.task_index for t in tasks],
        [Jsonb(output) for output in outputs],
        [t.attempt for t in tasks],
    )
