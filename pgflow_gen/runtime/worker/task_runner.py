"""Running one claimed task: call its handler (async directly, sync in a thread) and turn the
outcome into a report for the engine: an output to complete the task with, or an error message.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import psycopg

from pgflow_gen.runtime import errors, tracing
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.reconnecting import CONNECT_OPTIONS
from pgflow_gen.runtime.worker import permanent
from pgflow_gen.runtime.worker.context import Context, _Lazy

Handler = Callable[..., Any]


#: The most characters of a failure the engine stores: the exception's type and message (at
#: most MAX_SUMMARY_CHARS), then as much of the end of its traceback as fits.
MAX_ERROR_CHARS = 8192
MAX_SUMMARY_CHARS = 1024
# Frames of the machinery that calls a handler, left out of the tracebacks users read.
_MACHINERY = (__file__, f"{os.sep}concurrent{os.sep}futures{os.sep}", f"{os.sep}asyncio{os.sep}")


@dataclass(frozen=True)
class Report:
    """A finished handler: `error` is None for success (then `output` completes the task).

    A failure's `error` opens with one line, the exception's type and message (`summary`), and
    may go on with the traceback of the handler's code. A failure with `not_retried` (why) is
    permanent: the engine fails the task at once, whatever attempts are left. A `discarded`
    report says why nothing is sent (the task's run was cancelled: the engine has closed the
    task already).
    """

    task: ClaimedTask
    output: Any = None
    error: str | None = None
    discarded: str | None = None
    not_retried: str | None = None

    @property
    def summary(self) -> str | None:
        return None if self.error is None else self.error.split("\n", 1)[0]


class RunCancellation:
    """Set when the engine says a task's run was cancelled; whoever waits on it hears at once
    (callbacks run in the event loop's thread, where `set` is called)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.is_set = False

    def set(self) -> None:
        if self.is_set:
            return
        self.is_set = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        if self.is_set:
            callback()
        else:
            self._callbacks.append(callback)


async def run_task(
    task: ClaimedTask,
    handler: Handler,
    *,
    executor: Executor,
    worker_id: uuid.UUID,
    shutdown: threading.Event,
    logger: logging.Logger,
    database_url: str,
    prepare_threshold: int | None = 5,
    root: bool = False,
    on_abandoned: Callable[[asyncio.Future[Any]], None] | None = None,
    check_output: Callable[[Any], list[str]] | None = None,
    cancellation: RunCancellation | None = None,
    not_on: Sequence[permanent.NotRetried] = (),
    queue_name: str = "",
) -> Report:
    """Run `handler` for `task`; never raises (a failure becomes the report's error), except
    the cancellation of a worker that stops past its grace period.

    A handler's PermanentError, or an exception of a class in `not_on` (the step's
    `retry.not_on`), makes a permanent failure: the report says why it is `not_retried`.

    `check_output` names what is wrong with an output for the step's output type (`$.total:
    expected number, got string`); an output it finds fault with fails the attempt with an
    OutputValidationError, as one that is not JSON does.

    A root single step (`root`) gets the run input; every other task its assembled `input`.
    The step's timeout (`task.timeout`, from the claim) is enforced: at the deadline an async
    handler is cancelled; a sync handler's thread cannot be stopped, so it is abandoned (its
    `ctx.cancelled` is set, its late result discarded, and `on_abandoned` gets its future, which
    finishes when the thread does). Either way the task fails with a HandlerTimeoutError.

    When `cancellation` is set (the run was cancelled) the handler is stopped the same way, at
    once, and the report is `discarded`: the engine closed the task, so there is nothing to send.

    While an application traces (runtime/tracing.py), the attempt is one span, current while
    the handler runs, ended with its outcome.
    """
    with tracing.task_span(task, queue_name, worker_id) as span:
        try:
            report = await _run_task(
                task, handler, executor=executor, worker_id=worker_id, shutdown=shutdown,
                logger=logger, database_url=database_url, prepare_threshold=prepare_threshold,
                root=root, on_abandoned=on_abandoned, check_output=check_output,
                cancellation=cancellation or RunCancellation(), not_on=not_on,
            )  # fmt: skip
        except Exception as exc:  # the machinery around the handler failed: still a report
            logger.error("running task %s/%s[%d] failed", task.run_id, task.step_slug,
                         task.task_index, exc_info=exc)  # fmt: skip
            report = Report(
                task, error=f"The worker could not run the handler: {describe_failure(exc)}"
            )
        outcome = "stopped" if report.discarded else "failed" if report.error else "completed"
        tracing.end_task(span, outcome, report.error)
        return report


async def _run_task(
    task: ClaimedTask,
    handler: Handler,
    *,
    executor: Executor,
    worker_id: uuid.UUID,
    shutdown: threading.Event,
    logger: logging.Logger,
    database_url: str,
    prepare_threshold: int | None,
    root: bool,
    on_abandoned: Callable[[asyncio.Future[Any]], None] | None,
    check_output: Callable[[Any], list[str]] | None,
    cancellation: RunCancellation,
    not_on: Sequence[permanent.NotRetried],
) -> Report:
    options: dict[str, Any] = {
        "autocommit": True,
        "prepare_threshold": prepare_threshold,
        **CONNECT_OPTIONS,
    }
    lazy = _Lazy(
        functools.partial(psycopg.connect, database_url, **options),
        functools.partial(psycopg.AsyncConnection.connect, database_url, **options),
    )
    loop = asyncio.get_running_loop()
    cancelled = threading.Event()
    context: Context[Any] = Context(
        run_id=task.run_id,
        step_slug=task.step_slug,
        task_index=task.task_index,
        worker_id=worker_id,
        shutdown=shutdown,
        logger=logger,
        cancelled=cancelled,
        deadline=time.monotonic() + task.timeout,
        _flow_input=task.flow_input,
        _lazy=lazy,
        _attempt=task.attempt,
    )
    handler_input = task.flow_input if root else task.input
    running: asyncio.Future[Any] | None = None  # a sync handler's thread
    abandoned: asyncio.Future[Any] | None = None
    stopped: asyncio.Future[None] = loop.create_future()  # done when the run is cancelled

    def stop() -> None:  # ctx.cancelled first: a handler may look at it when it is cancelled
        cancelled.set()
        if not stopped.done():
            stopped.set_result(None)

    cancellation.on_set(stop)
    try:
        if inspect.iscoroutinefunction(handler):
            result = await _until_stopped(handler(handler_input, context), task.timeout, stopped)
        else:
            # In a copy of this task's context: the handler's thread sees its span (and any
            # other context variable), as asyncio.to_thread would show them.
            running = loop.run_in_executor(
                executor,
                contextvars.copy_context().run,
                functools.partial(handler, handler_input, context),
            )
            await asyncio.wait({running, stopped}, timeout=task.timeout,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if not running.done():
                abandoned = running
                raise _Stopped if stopped.done() else _Expired
            result = running.result()
            if inspect.isawaitable(result):
                result = await _until_stopped(result, context.time_left(), stopped)
        if stopped.done():
            raise _Stopped
    except _Stopped:
        cancelled.set()
        how = "abandoned" if abandoned is not None else "returned" if running else "cancelled"
        return Report(task, discarded=_cancelled(how))
    except _Expired:
        cancelled.set()
        return Report(task, error=_timed_out(task, abandoned is not None))
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            # The worker cancelled it (after the grace period): a sync handler's thread runs on.
            cancelled.set()
            if running is not None and not running.done():
                abandoned = running
            raise
        # The handler itself was cancelled (say, a future it awaited): that is its failure.
        return Report(task, error="CancelledError: the handler was cancelled")
    except (Exception, SystemExit) as exc:  # a handler's failure is the task's failure
        return Report(task, error=describe_failure(exc), not_retried=permanent.reason(exc, not_on))
    finally:
        stopped.cancel()  # no-op once done; a pending one is never awaited again
        if abandoned is not None:
            # The thread may still use the connection: close it when the thread is done.
            abandoned.add_done_callback(lambda _: lazy.close())
            if on_abandoned is not None:
                on_abandoned(abandoned)
        elif lazy.opened:
            await asyncio.to_thread(lazy.close)
        await context._close_async()
    problem = _json_problem(result)
    if problem is not None:
        return Report(task, error=f"The handler's output is not JSON: {problem}.")
    found = check_output(result) if check_output is not None else []
    if found:
        return Report(task, error=_invalid_output(task, found))
    return Report(task, output=result)


def _invalid_output(task: ClaimedTask, found: list[str]) -> str:
    more = f" ({len(found) - 1} more: {'; '.join(found[1:])})" if len(found) > 1 else ""
    error = errors.OutputValidationError(
        f'Step "{task.step_slug}" returned an output that does not match its type: {found[0]}'
        f"{more}."
    )
    return f"{type(error).__name__}: {error.message}"


class _Expired(Exception):
    """The step's timeout passed while its handler ran."""


class _Stopped(Exception):
    """The task's run was cancelled while its handler ran."""


async def _until_stopped(
    work: Awaitable[Any], timeout: float, stopped: asyncio.Future[None]
) -> Any:
    """Await `work` (an async handler, in this task, so it sees the cancellation at its next
    await), cancelling it at `timeout` (_Expired) or once `stopped` is done (_Stopped)."""
    limit = asyncio.timeout(timeout)
    awaiting = True

    def expire(_: object = None) -> None:
        if awaiting and not stopped.cancelled():
            limit.reschedule(-1)  # a deadline in the past: the timeout expires now

    try:
        async with limit:
            stopped.add_done_callback(expire)  # scheduled at once when it is done already
            try:
                return await work
            finally:
                awaiting = False
                stopped.remove_done_callback(expire)
    except TimeoutError:
        if limit.expired():
            raise (_Stopped if stopped.done() and not stopped.cancelled() else _Expired) from None
        raise  # the handler's own TimeoutError: its failure, as any exception


def _cancelled(how: str) -> str:
    what = {
        "abandoned": "its thread cannot be stopped and was abandoned (ctx.cancelled is set)",
        "returned": "its result is discarded",
        "cancelled": "it was cancelled",
    }[how]
    return f"the run was cancelled: {what}"


def _timed_out(task: ClaimedTask, abandoned: bool) -> str:
    what = (
        "its thread cannot be stopped and was abandoned; ctx.cancelled is set and its result"
        " will be discarded"
        if abandoned
        else "it was cancelled"
    )
    error = errors.HandlerTimeoutError(
        f'Step "{task.step_slug}" ran past its timeout of {task.timeout} s'
        f" (attempt {task.attempt}): {what}."
    )
    return f"{type(error).__name__}: {error.message}"


def describe_failure(exc: BaseException) -> str:
    """What the engine stores for a handler's exception: `Type: message` on the first line (the
    message's lines joined, cut at MAX_SUMMARY_CHARS), a blank line, then the traceback from the
    handler's own code on, its end kept when it is long; at most MAX_ERROR_CHARS in all. No
    local variables, so the task's input or output appear only where the message quotes them.
    """
    message = " ".join(str(exc).split("\n")).strip()
    summary = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[: MAX_SUMMARY_CHARS - 3] + "..."
    trace = "".join(traceback.format_exception(type(exc), exc, _handler_frames(exc.__traceback__)))
    room = MAX_ERROR_CHARS - len(summary) - 2
    if len(trace) > room:
        keep = room - 60
        trace = f"... ({len(trace) - keep} characters of the traceback left out)\n" + trace[-keep:]
    return f"{summary}\n\n{trace.rstrip()}"


def _handler_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is not the machinery calling the handler."""
    while tb is not None and any(part in tb.tb_frame.f_code.co_filename for part in _MACHINERY):
        tb = tb.tb_next
    return tb


def _json_problem(value: Any) -> str | None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    except RecursionError:
        return "it is nested too deeply"
    return None
