"""Supervision of a worker's parts: the poller, the reporter, the heartbeat and the listener run
inside one `asyncio.TaskGroup` (none outlives the worker), each under `guard`: an unexpected error
is logged with its traceback and makes the worker drain and stop, instead of leaving it running
without that part. `cleanup` runs every shutdown step even when an earlier one raises, and
`raise_failure` then ends the worker with a typed error naming the part that failed."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence

from pgflow_gen.runtime import errors

#: A shutdown step: what it does (for the log) and the call, sync or async.
Step = tuple[str, Callable[[], Awaitable[None] | None]]


class Supervisor:
    def __init__(self, name: str, logger: logging.Logger, stop: Callable[[str], None]) -> None:
        """`stop(reason)` makes the worker drain (the part that failed cannot do its job)."""
        self.name = name
        self.log = logger
        self.stop = stop
        #: What failed, in order: (the part or shutdown step, its error).
        self.failures: list[tuple[str, Exception]] = []

    async def guard(self, part: str, work: Awaitable[None]) -> None:
        """Run `work`; an error is logged and stops the worker instead of propagating (so the
        other parts go on draining). Cancellation propagates."""
        try:
            await work
        except Exception as exc:
            self.log.error(
                "worker %s: its %s failed unexpectedly; stopping the worker",
                self.name,
                part,
                exc_info=exc,
            )
            self.failures.append((f"its {part}", exc))
            self.stop(f"its {part} failed")

    async def cleanup(self, steps: Sequence[Step]) -> None:
        """Run every step in order; one that raises is logged and the next runs all the same.
        A cancellation meanwhile (a second stop of an embedded worker) lets the remaining steps
        run too (each is bounded in time), then propagates."""
        cancelled: asyncio.CancelledError | None = None
        for what, step in steps:
            try:
                outcome = step()
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError as exc:
                cancelled = exc
            except Exception as exc:
                self.log.error("worker %s: %s failed", self.name, what, exc_info=exc)
                self.failures.append((what, exc))
        if cancelled is not None:
            raise cancelled

    def raise_failure(self) -> None:
        """Raise WorkerFailedError for the first failure, if any (the tracebacks are logged)."""
        if not self.failures:
            return
        part, exc = self.failures[0]
        message = " ".join(str(exc).split())
        raise errors.WorkerFailedError(
            f"Worker {self.name} stopped because {part} failed: {type(exc).__name__}"
            + (f": {message}" if message else "")
            + ".",
            hint="The traceback is in the log above; the tasks it had not reported are run"
            " again by stall recovery.",
        )
