"""Handlers of the subflow benchmark (benchmarks/subflows.py): empty work, so the engine's
cost is what is measured."""

from __future__ import annotations

from typing import Any

from app.pgflow import bench_doc, bench_docs_map, bench_docs_subflow
from pgflow_gen.runtime import Context


async def parse(flow_input: int, ctx: Context[int], /) -> int:
    return flow_input


async def store(deps: bench_doc.StoreDeps, ctx: Context[int], /) -> int:
    return deps["parse"]


async def parse_item(item: int, ctx: Context[Any], /) -> int:
    return item


async def store_item(item: int, ctx: Context[Any], /) -> int:
    return item


async def total_of_runs(
    deps: bench_docs_subflow.TotalDeps, ctx: Context[bench_docs_subflow.Input], /
) -> int:
    return sum(run["store"] for run in deps["each"])


async def total_of_map(
    deps: bench_docs_map.TotalDeps, ctx: Context[bench_docs_map.Input], /
) -> int:
    return sum(deps["store"])
