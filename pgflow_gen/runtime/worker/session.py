"""The seam between the worker loop and the database: a `Session` is one connection seen as the
engine calls the loop makes, by name. `psycopg_session.PsycopgSession` is the real one; the unit
tests drive the loop's logic (slots, leases, drain, reconnects, deprecation) with an in-memory
fake of it, the way procrastinate tests its worker against an in-memory connector.

A session raises psycopg's errors, the fake too: `reconnecting.connection_lost` tells a lost
connection (reconnect) from a failed statement.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from pgflow_gen.naming import QueueMode
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.flow import Flow
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
    def notifies(self, timeout: float) -> AsyncGenerator[str]:
        """The first notifications that arrive within `timeout` seconds (all that arrive
        together), then it ends; read it to its end, or some are lost."""
        ...

    async def ping(self) -> None: ...

    async def cancelled_runs(self, run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """The runs among `run_ids` the engine has cancelled (engine 0020): a run:cancelled
        notification is only a hint."""
        ...


#: Opens a new session (the loop reconnects through it).
Connector = Callable[[], Awaitable[Session]]
