"""The seam between the worker loop and the database: a `Session` is one connection seen as the
engine calls the loop makes, by name. `PsycopgSession` is the real one; the unit tests drive the
loop's logic (slots, leases, drain, reconnects, deprecation) with an in-memory fake of it, the
way procrastinate tests its worker against an in-memory connector.

A session raises psycopg's errors, the fake too: `reconnecting.connection_lost` tells a lost
connection (reconnect) from a failed statement.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, LiteralString, NamedTuple, Protocol

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
from pgflow_gen.runtime.worker.liveness import Liveness

#: Advisory lock keys in namespace 2 (namespace 1 belongs to migrations).
LOCK_NAMESPACE = 2
RECOVERY_LOCK = 3
NOTIFY_SETUP_LOCK = 4

#: The longest a stall-recovery sweep waits for one lock.
SWEEP_LOCK_TIMEOUT = "1s"

#: A task's row after a callback: (attempts_count, status); None when there is no such task.
TaskRow = tuple[int, str] | None
#: How claim_tasks (engine 0008) names the messages it archived: its warning's first words.
ARCHIVED_NOTICE = "claim_tasks archived"
#: The start of the notice in which claim_tasks names the messages of paused steps it held.
HELD_NOTICE = "claim_tasks held"
#: The start of the notice in which read_and_claim (engine 0012) names what it left unclaimed.
UNCLAIMED_NOTICE = "read_and_claim left"
#: The start of its notice of when the queue's next hidden message shows again.
NEXT_VISIBLE_NOTICE = "read_and_claim: the next message"
#: The start of the notice in which complete_and_claim (engine 0014) names the results it
#: ignored (a stale attempt, a cancelled task).
IGNORED_NOTICE = "complete_and_claim ignored"
#: The start of the notice in which a claim (engine 0017) names the messages it held back
#: because their step was at a limit (max_in_flight or rate_limit).
LIMITED_NOTICE = "claim_tasks limited"
#: The start of read_and_claim's notice that a limit let it read fewer than it was asked for.
LIMITED_READ_NOTICE = "read_and_claim limited"


class Claim(NamedTuple):
    """What one claim did: the tasks it claimed, the messages read that it archived because
    their task no longer exists (a run deleted or pruned earlier), and those it held because
    their step is paused (engine 0010); a claim that read its messages itself also names every
    message it read and did not claim (those archived and held among them)."""

    tasks: list[ClaimedTask]
    archived: list[int]
    held: list[int]
    unclaimed: tuple[int, ...] = ()
    #: When it read fewer than it asked for: in how many seconds the queue's next hidden
    #: message (a retry's delay, a start delay, a lease) shows again; None when none is hidden
    #: or the engine does not say.
    next_visible_in: float | None = None
    #: The messages it held back because their step was at a limit (engine 0017).
    limited: tuple[int, ...] = ()
    #: Whether a step's limit let it read fewer than it asked for (engine 0017).
    cut_short: bool = False


class Completion(NamedTuple):
    """What one complete_and_claim call did: the row of each result's task afterwards, in the
    order sent (as complete_tasks returns them), and the claim that followed."""

    rows: list[TaskRow]
    claim: Claim


class Session(Protocol):
    @property
    def closed(self) -> bool: ...
    @property
    def broken(self) -> bool: ...
    async def close(self) -> None: ...

    # startup
    async def compile_flow(
        self, flow: Flow[Any, Any, Any], mode: QueueMode, route_map: Sequence[Mapping[str, str]]
    ) -> startup.Compilation: ...
    async def enable_notifications(self, queue: str) -> None: ...
    async def liveness(self) -> Liveness:
        """The engine's worker liveness rule."""
        ...

    async def register_worker(
        self, worker_id: uuid.UUID, queue: str, name: str, flow_slug: str, step_slug: str | None
    ) -> None: ...

    # polling
    async def read_and_claim(
        self,
        flow_slug: str,
        queue: str,
        worker_id: uuid.UUID,
        limit: int,
        visibility: int,
        step_slug: str | None,
    ) -> Claim:
        """Read up to `limit` messages and claim their tasks in one call."""
        ...

    async def set_visibility(self, queue: str, msg_ids: list[int], seconds: list[int]) -> None: ...

    # results
    async def complete_task(self, task: ClaimedTask, output: Any) -> TaskRow: ...
    async def fail_task(
        self, task: ClaimedTask, error: str, not_retried: str | None = None
    ) -> TaskRow:
        """Fail the task's attempt; with `not_retried` (why) permanently, whatever attempts
        are left."""
        ...

    async def complete_tasks(
        self, tasks: list[ClaimedTask], outputs: list[Any]
    ) -> list[TaskRow]: ...
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
        """Complete `tasks` with `outputs` and read and claim up to `limit` tasks, in one call
        and one transaction."""
        ...

    # upkeep
    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        """Whether the worker was deprecated; raises NoDataFound when its row is gone."""
        ...

    async def renew_leases(self, worker_id: uuid.UUID, tasks: Sequence[ClaimedTask]) -> int:
        """Keep the leases of `tasks` (results not sent yet), so stall recovery leaves them
        alone; how many were renewed."""
        ...

    async def requeue_stalled(self, timeout_s: float) -> int:
        """Requeue stalled tasks unless another worker is doing it (then 0); the sweep is
        cancelled after `timeout_s` seconds (QueryCanceled) or a lock wait of a second
        (LockNotAvailable)."""
        ...

    async def mark_stopped(self, worker_id: uuid.UUID) -> None: ...

    # tracing
    async def trace_contexts(self, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, str | None]:
        """Each run's stored trace context (`runs.traceparent`, engine 0016)."""
        ...

    # notifications
    async def listen(self, channel: str) -> None: ...
    def notifies(self, timeout: float) -> AsyncGenerator[str]: ...
    async def ping(self) -> None: ...

    async def cancelled_runs(self, run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """The runs among `run_ids` the engine has cancelled (engine 0020): a run:cancelled
        notification is only a hint."""
        ...


#: Opens a new session (the loop reconnects through it).
Connector = Callable[[], Awaitable[Session]]


class PsycopgSession:
    """A `Session` on one autocommit psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self._archived: list[int] = []
        self._held: list[int] = []
        self._unclaimed: list[int] = []
        self._limited: list[int] = []
        self._cut_short = False
        self._next_visible_in: float | None = None
        self._ignored: list[tuple[int, int, str]] = []
        conn.add_notice_handler(self._notice)

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
        self._archived, self._held, self._unclaimed, self._limited = [], [], [], []
        self._next_visible_in, self._cut_short = None, False
        async with self.conn.cursor(row_factory=class_row(ClaimedTask)) as claim:
            await claim.execute(
                worker_statements.READ_AND_CLAIM,
                (flow_slug, queue, worker_id, limit, visibility, step_slug),
            )
            tasks = await claim.fetchall()
        return self._claim(tasks)

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
        self._archived, self._held, self._unclaimed, self._ignored = [], [], [], []
        self._limited, self._next_visible_in, self._cut_short = [], None, False
        async with self.conn.cursor(row_factory=class_row(ClaimedTask)) as claim:
            await claim.execute(
                worker_statements.COMPLETE_AND_CLAIM,
                (flow_slug, queue, worker_id, limit, visibility, step_slug, *results),
            )
            claimed = await claim.fetchall()
        rows: list[TaskRow] = [(task.attempt, "completed") for task in tasks]
        for position, attempts_count, status in self._ignored:
            if 1 <= position <= len(rows):
                rows[position - 1] = (attempts_count, status)
        return Completion(rows, self._claim(claimed))

    def _claim(self, tasks: list[ClaimedTask]) -> Claim:
        """A claim's tasks with what its notices said."""
        return Claim(
            tasks,
            self._archived,
            self._held,
            tuple(self._unclaimed),
            self._next_visible_in,
            tuple(self._limited),
            self._cut_short,
        )

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """Collect the ids claim_tasks names in its archived-messages warning, its
        held-messages and limited-messages notices, and read_and_claim in its
        unclaimed-messages notice (JSON details)."""
        primary = diag.message_primary or ""
        if primary.startswith(NEXT_VISIBLE_NOTICE):
            # Another detail than this release writes: the worker polls as before.
            with contextlib.suppress(ValueError, TypeError, KeyError):
                detail = json.loads(diag.message_detail or "")
                self._next_visible_in = float(detail["next_visible_in_s"])
            return
        if primary.startswith(IGNORED_NOTICE):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                self._ignored = [
                    (int(position), int(attempts_count), str(status))
                    for position, attempts_count, status in json.loads(diag.message_detail or "")[
                        "ignored_results"
                    ]
                ]
            return
        if primary.startswith(LIMITED_READ_NOTICE):
            self._cut_short = True
            return
        if primary.startswith(ARCHIVED_NOTICE):
            into, key = self._archived, "archived_message_ids"
        elif primary.startswith(LIMITED_NOTICE):
            into, key = self._limited, "limited_message_ids"
        elif primary.startswith(HELD_NOTICE):
            into, key = self._held, "held_message_ids"
        elif primary.startswith(UNCLAIMED_NOTICE):
            into, key = self._unclaimed, "unclaimed_message_ids"
        else:
            return
        try:
            into.extend(int(i) for i in json.loads(diag.message_detail or "")[key])
        except (ValueError, TypeError, KeyError):
            return  # not the detail this release writes: nothing to add

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
        """The payloads of the notifications that arrive within `timeout` seconds."""
        async for notify in self.conn.notifies(timeout=timeout):
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
