"""Handlers of the chaos soak (`benchmarks/chaos.py`). Each notes every execution it starts in
the file `PGFLOW_CHAOS_MARKS` names (one line per execution, appended atomically), so the soak
counts executions per task; each works a little while (`PGFLOW_CHAOS_WORK_S`), so the kills find
handlers in flight."""

from __future__ import annotations

import asyncio
import os
import random

from app.pgflow.chaos_flow import Input, JoinDeps, SplitOutput
from pgflow_gen.runtime import Context


def _mark(ctx: Context[Input]) -> None:
    line = f"{ctx.run_id} {ctx.step_slug} {ctx.task_index} {ctx.attempt}\n".encode()
    descriptor = os.open(os.environ["PGFLOW_CHAOS_MARKS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(descriptor, line)  # one write of a short line: atomic with O_APPEND
    finally:
        os.close(descriptor)


async def _work() -> None:
    await asyncio.sleep(random.uniform(0, 2 * float(os.environ.get("PGFLOW_CHAOS_WORK_S", "0.05"))))


async def split(flow_input: Input, ctx: Context[Input], /) -> SplitOutput:
    _mark(ctx)
    await _work()
    return [flow_input["n"] + i for i in range(flow_input["width"])]


async def square(item: int, ctx: Context[Input], /) -> int:
    _mark(ctx)
    await _work()
    return item * item


def side(flow_input: Input, ctx: Context[Input], /) -> int:
    _mark(ctx)
    asyncio.run(_work())
    return flow_input["n"]


async def join(deps: JoinDeps, ctx: Context[Input], /) -> int:
    _mark(ctx)
    await _work()
    return deps["side"] + sum(deps["square"])
