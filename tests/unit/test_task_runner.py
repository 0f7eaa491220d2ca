"""Running one claimed task: inputs, outcomes and failures, without a database."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pgflow_gen.runtime.task_runner import ClaimedTask, Handler, Report, run_task


def task(input: Any = None, flow_input: Any = None) -> ClaimedTask:
    return ClaimedTask("f", uuid.uuid4(), "s", input, 1, 0, flow_input, attempt=1, timeout=60)


def run(handler: Handler, claimed: ClaimedTask, *, root: bool) -> Report:
    async def main() -> Report:
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


def test_an_exception_becomes_the_error_with_its_type_and_message() -> None:
    def boom(value: Any, ctx: Any, /) -> Any:
        raise ValueError("no good")

    assert run(boom, task(), root=False).error == "ValueError: no good"


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

    assert run(leave, task(), root=False).error == "SystemExit: 3"
