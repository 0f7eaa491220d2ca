"""A handler's `ctx` without a worker or a database, for unit tests of one handler."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import Any, TypeVar

import psycopg

from pgflow_gen.runtime.worker.context import Context, _Lazy

InputT = TypeVar("InputT")


def fake_context(
    flow_input: InputT,
    *,
    step_slug: str = "step",
    task_index: int = 0,
    attempt: int = 1,
    run_id: uuid.UUID | None = None,
    timeout: float | None = None,
    connection: psycopg.Connection[Any] | None = None,
    logger: logging.Logger | None = None,
) -> Context[InputT]:
    """A `Context` as a worker would pass it, for calling a handler directly in a test.

    `ctx.flow_input()` returns `flow_input`; `ctx.attempt` is `attempt`; `ctx.shutdown` and
    `ctx.cancelled` are events the test may set; `timeout` sets `ctx.deadline` (none by default);
    `ctx.connection` is `connection` when given (the test owns it), otherwise an error.

    >>> ctx = fake_context({"first": "Ada"}, attempt=2)
    >>> ctx.flow_input()["first"], ctx.attempt
    ('Ada', 2)
    """
    lazy = None
    if connection is not None:
        given = connection
        lazy = _Lazy(lambda: given)
    return Context(
        run_id=run_id or uuid.uuid4(),
        step_slug=step_slug,
        task_index=task_index,
        worker_id=uuid.uuid4(),
        shutdown=threading.Event(),
        logger=logger or logging.getLogger(f"pgflow_gen.testing.{step_slug}"),
        cancelled=threading.Event(),
        deadline=math.inf if timeout is None else time.monotonic() + timeout,
        _flow_input=flow_input,
        _lazy=lazy,
        _attempt=attempt,
    )
