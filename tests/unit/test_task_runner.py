"""Running one claimed task: inputs, outcomes and failures, without a database."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pgflow_gen.runtime import inputs
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.worker.task_runner import (
    MAX_ERROR_CHARS,
    MAX_SUMMARY_CHARS,
    Handler,
    Report,
    RunCancellation,
    run_task,
)


def task(input: Any = None, flow_input: Any = None, timeout: int = 60) -> ClaimedTask:
    return ClaimedTask("f", uuid.uuid4(), "s", input, 1, 0, flow_input, attempt=1, timeout=timeout)


def run(
    handler: Handler,
    claimed: ClaimedTask,
    *,
    root: bool,
    on_abandoned: Callable[[asyncio.Future[Any]], None] | None = None,
    check_output: Callable[[Any], list[str]] | None = None,
    cancellation: RunCancellation | None = None,
    loops: list[asyncio.AbstractEventLoop] | None = None,
) -> Report:
    """Run the task in a new event loop (appended to `loops`, for handlers that call into it)."""

    async def main() -> Report:
        if loops is not None:
            loops.append(asyncio.get_running_loop())
        with ThreadPoolExecutor(max_workers=2) as executor:
            return await run_task(
                claimed,
                handler,
                executor=executor,
                worker_id=uuid.uuid4(),
                shutdown=threading.Event(),
                logger=logging.getLogger("test"),
                database_url="postgresql://nowhere/never-opened",
                root=root,
                on_abandoned=on_abandoned,
                check_output=check_output,
                cancellation=cancellation,
            )

    return asyncio.run(main())


def echo(value: Any, ctx: Any, /) -> Any:
    return value


async def async_echo(value: Any, ctx: Any, /) -> Any:
    return value


@pytest.mark.parametrize("handler", [echo, async_echo])
def test_a_root_step_gets_the_run_input_even_a_json_null(handler: Handler) -> None:
    assert run(handler, task(input={}, flow_input=None), root=True).output is None
    assert run(handler, task(input={}, flow_input={"a": 1}), root=True).output == {"a": 1}


def test_other_steps_get_their_assembled_input() -> None:
    report = run(echo, task(input={"dep": 2}, flow_input=None), root=False)
    assert (report.output, report.error) == ({"dep": 2}, None)


def test_an_exception_becomes_the_error_with_its_type_message_and_traceback() -> None:
    def boom(value: Any, ctx: Any, /) -> Any:
        raise ValueError("no good")

    report = run(boom, task(), root=False)
    assert report.summary == "ValueError: no good"
    assert report.error is not None
    lines = report.error.splitlines()
    assert lines[:3] == ["ValueError: no good", "", "Traceback (most recent call last):"]
    # The traceback starts in the handler's own code, not in the worker's machinery.
    assert lines[3].startswith(f'  File "{__file__}", line ')
    assert lines[3].endswith(", in boom")
    assert lines[4:] == ['    raise ValueError("no good")', "ValueError: no good"]


@pytest.mark.parametrize("handler_is_async", [False, True])
def test_the_stored_error_never_holds_the_input_and_is_bounded(handler_is_async: bool) -> None:
    # Alternating frames, which Python does not fold into "[Previous line repeated ...]".
    def deep(value: Any, depth: int) -> Any:
        return deeper(value, depth - 1) if depth else value["name"]  # KeyError: 'name'

    def deeper(value: Any, depth: int) -> Any:
        return deep(value, depth - 1)

    def sync_handler(value: Any, ctx: Any, /) -> Any:
        return deep(value, 400)

    async def async_handler(value: Any, ctx: Any, /) -> Any:
        return deep(value, 400)

    handler = async_handler if handler_is_async else sync_handler
    report = run(handler, task(input={"password": "hunter2"}), root=False)
    assert report.error is not None
    assert report.summary == "KeyError: 'name'"
    assert "hunter2" not in report.error
    assert len(report.error) <= MAX_ERROR_CHARS
    assert "characters of the traceback left out" in report.error
    assert report.error.endswith("KeyError: 'name'")  # the end of the traceback is kept


def test_a_long_message_is_cut_to_one_summary_line() -> None:
    def loud(value: Any, ctx: Any, /) -> Any:
        raise RuntimeError("line one\n" + "x" * 100_000)

    report = run(loud, task(), root=False)
    assert report.error is not None
    assert report.summary is not None
    assert report.summary.startswith("RuntimeError: line one xxx")
    assert len(report.summary) == MAX_SUMMARY_CHARS
    assert len(report.error) <= MAX_ERROR_CHARS


def test_a_non_json_output_fails_clearly() -> None:
    def not_json(value: Any, ctx: Any, /) -> Any:
        return {"when": object()}

    error = run(not_json, task(), root=False).error
    assert error is not None
    assert error.startswith("The handler's output is not JSON: Object of type object")


def test_a_sync_handler_returning_an_awaitable_is_awaited() -> None:
    def deferred(value: Any, ctx: Any, /) -> Any:
        return async_echo(value, ctx)

    assert run(deferred, task(input=[1, 2]), root=False).output == [1, 2]


def test_a_handler_cancelled_from_inside_fails_its_task() -> None:
    async def cancelled(value: Any, ctx: Any, /) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    assert run(cancelled, task(), root=False).error == "CancelledError: the handler was cancelled"


def test_sys_exit_in_a_handler_fails_its_task() -> None:
    def leave(value: Any, ctx: Any, /) -> Any:
        raise SystemExit(3)

    assert run(leave, task(), root=False).summary == "SystemExit: 3"


def test_an_async_handler_past_its_timeout_is_cancelled_and_fails_its_task() -> None:
    seen: list[str] = []

    async def forever(value: Any, ctx: Any, /) -> Any:
        try:
            await asyncio.Event().wait()  # never set: only the timeout ends it
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    report = run(forever, task(timeout=1), root=False)
    assert report.error == (
        'HandlerTimeoutError: Step "s" ran past its timeout of 1 s (attempt 1): it was cancelled.'
    )
    assert seen == ["cancelled"]


def test_a_sync_handler_past_its_timeout_is_abandoned_told_and_its_result_discarded() -> None:
    finished = threading.Event()
    observed: list[bool] = []

    def stubborn(value: Any, ctx: Any, /) -> Any:
        observed.append(ctx.cancelled.wait(timeout=30))  # set at the deadline
        finished.wait(timeout=30)
        return "late result"

    abandoned: list[asyncio.Future[Any]] = []

    def abandon(thread: asyncio.Future[Any]) -> None:
        abandoned.append(thread)
        finished.set()  # let the thread return now: its result must still be discarded

    report = run(stubborn, task(timeout=1), root=False, on_abandoned=abandon)
    assert report.error is not None
    assert report.error.startswith(
        'HandlerTimeoutError: Step "s" ran past its timeout of 1 s (attempt 1): its thread'
        " cannot be stopped and was abandoned"
    )
    assert report.output is None
    assert observed == [True]
    assert len(abandoned) == 1


def test_a_cancelled_run_stops_an_async_handler_at_its_next_await_and_sends_nothing() -> None:
    cancellation = RunCancellation()
    seen: list[str] = []

    async def forever(value: Any, ctx: Any, /) -> Any:
        cancellation.set()  # as the listener does when the engine says so
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append(f"cancelled, ctx.cancelled={ctx.cancelled.is_set()}")
            raise

    report = run(forever, task(timeout=60), root=False, cancellation=cancellation)
    assert (report.discarded, report.error, report.output) == (
        "the run was cancelled: it was cancelled", None, None,
    )  # fmt: skip
    assert seen == ["cancelled, ctx.cancelled=True"]  # told first, then cancelled


def test_a_cancelled_run_abandons_a_sync_handler_and_tells_it() -> None:
    cancellation = RunCancellation()
    observed: list[bool] = []
    abandoned: list[asyncio.Future[Any]] = []
    loops: list[asyncio.AbstractEventLoop] = []

    finished = threading.Event()

    def stubborn(value: Any, ctx: Any, /) -> Any:
        loops[0].call_soon_threadsafe(cancellation.set)  # the listener runs in the loop
        observed.append(ctx.cancelled.wait(timeout=30))
        finished.wait(timeout=30)  # still busy when the worker gives up on it
        return "late result"

    def abandon(thread: asyncio.Future[Any]) -> None:
        abandoned.append(thread)
        finished.set()

    report = run(stubborn, task(timeout=60), root=False, on_abandoned=abandon,
                 cancellation=cancellation, loops=loops)  # fmt: skip
    assert report.discarded == (
        "the run was cancelled: its thread cannot be stopped and was abandoned"
        " (ctx.cancelled is set)"
    )
    assert (report.error, report.output) == (None, None)
    assert observed == [True]
    assert len(abandoned) == 1


def test_a_sync_handler_that_returns_once_told_has_its_result_discarded() -> None:
    cancellation = RunCancellation()
    loops: list[asyncio.AbstractEventLoop] = []

    def obliging(value: Any, ctx: Any, /) -> Any:
        loops[0].call_soon_threadsafe(cancellation.set)
        ctx.cancelled.wait(timeout=30)
        return "a result nobody wants"

    report = run(obliging, task(timeout=60), root=False, cancellation=cancellation, loops=loops)
    assert report.discarded in (
        "the run was cancelled: its result is discarded",
        # The worker gave up on the thread a moment before it returned.
        "the run was cancelled: its thread cannot be stopped and was abandoned"
        " (ctx.cancelled is set)",
    )
    assert report.output is None


def test_a_run_cancelled_before_the_handler_starts_never_reports() -> None:
    cancellation = RunCancellation()
    cancellation.set()
    report = run(async_echo, task(input=1), root=False, cancellation=cancellation)
    assert report.discarded is not None
    assert report.output is None


def test_a_handlers_own_timeout_error_is_an_ordinary_failure() -> None:
    async def own(value: Any, ctx: Any, /) -> Any:
        raise TimeoutError("the API did not answer")

    assert run(own, task(), root=False).summary == "TimeoutError: the API did not answer"


def test_the_context_knows_its_deadline_and_attempt() -> None:
    def look(value: Any, ctx: Any, /) -> Any:
        return [ctx.attempt, 0 < ctx.time_left() <= 60, ctx.cancelled.is_set()]

    assert run(look, task(timeout=60), root=False).output == [1, True, False]


def test_a_deeply_nested_output_fails_its_task_instead_of_raising() -> None:
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    report = run(lambda value, ctx, /: nested, task(), root=True)
    assert report.error == "The handler's output is not JSON: it is nested too deeply."


def test_a_failure_around_the_handler_still_becomes_a_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def handler(value: Any, ctx: Any, /) -> Any:
        raise Unprintable  # describing the failure itself fails

    report = run(handler, task(), root=True)
    assert report.error is not None
    assert report.error.startswith("The worker could not run the handler: RuntimeError: no text")
    assert "running task" in caplog.text


def test_an_output_that_does_not_match_its_type_fails_its_attempt() -> None:
    schema = {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["n"]}
    check = inputs.checker(schema)
    report = run(lambda value, ctx, /: {"total": "9"}, task(), root=True, check_output=check)
    assert report.error == (
        'OutputValidationError: Step "s" returned an output that does not match its type:'
        " $.n: missing (required) (1 more: $.total: expected number, got string)."
    )
    good = run(lambda value, ctx, /: {"total": 9, "n": 1}, task(), root=True, check_output=check)
    assert (good.error, good.output) == (None, {"total": 9, "n": 1})
