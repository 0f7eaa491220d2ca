"""Handlers of the benchmark flows: as cheap as possible, except `slow`, which sleeps."""

from __future__ import annotations

import asyncio
import time

from app.pgflow import bench_fair, bench_fair_plain, bench_fan, bench_retry, iso_flow, iso_steps
from app.pgflow.bench_chain import Input, ThreeDeps, TwoDeps
from pgflow_gen.runtime import Context

SLOW_SECONDS = 0.05


async def one(flow_input: Input, ctx: Context[Input], /) -> int:
    return flow_input["i"]


async def two(deps: TwoDeps, ctx: Context[Input], /) -> int:
    return deps["one"] + 1


async def three(deps: ThreeDeps, ctx: Context[Input], /) -> int:
    return deps["two"] + 1


def slow(item: int, ctx: Context[iso_steps.Input] | Context[iso_flow.Input], /) -> int:
    time.sleep(SLOW_SECONDS)
    return item


async def fast(
    flow_input: list[int], ctx: Context[iso_steps.Input] | Context[iso_flow.Input], /
) -> str:
    return "fast"


def flaky(flow_input: bench_retry.Input, ctx: Context[bench_retry.Input], /) -> float:
    """Fails its first attempt, saying when; returns when its retry started (the worker's clock)."""
    if ctx.attempt == 1:
        raise RuntimeError(f"failed at {time.time():.6f}")
    return time.time()


async def items(flow_input: bench_fan.Input, ctx: Context[bench_fan.Input], /) -> list[int]:
    return list(range(flow_input["n"]))


async def each(item: int, ctx: Context[bench_fan.Input], /) -> int:
    return item


async def total(deps: bench_fan.TotalDeps, ctx: Context[bench_fan.Input], /) -> int:
    return sum(deps["each"])


async def tenant_work(
    flow_input: bench_fair.Input | bench_fair_plain.Input,
    ctx: Context[bench_fair.Input] | Context[bench_fair_plain.Input],
    /,
) -> str:
    """Works `ms` milliseconds (0: none) for the run's tenant."""
    if flow_input["ms"]:
        await asyncio.sleep(flow_input["ms"] / 1000)
    return flow_input["tenant"]
