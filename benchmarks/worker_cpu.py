"""A worker's own CPU per task, apart from the server's: what `e2e.py` cannot separate on a
machine where the workers and the server share the cores.

    .venv/bin/python benchmarks/worker_cpu.py [--tasks 20000] [--repeats 3]

1. slots: the handler's path without a database, from the claim to its report: `Slots.start`
   runs `benchChain`'s step `two` (an async handler that returns a number, its output checked)
   for batches of 10 tasks, and the reports are taken.
2. session: the worker's psycopg session against a fresh embedded PostgreSQL (fast settings):
   `complete_and_claim` in a loop, 10 tasks per call, as a busy worker sends them; this
   process's CPU per task (the server's is not counted).
3. round trip: psycopg's `select 1`, async (as the worker sends its statements) and sync.

Each is this process's CPU time (`time.process_time`), every repeat printed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import time
import uuid
from typing import Any

import psycopg

from benchmarks.e2e import PROJECT, migrated, workers
from benchmarks.engine_throughput import fresh_database, server
from pgflow_gen.runtime.claimed_task import ClaimedTask
from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from pgflow_gen.runtime.worker.slots import Slots

BATCH = 10


def claimed(count: int) -> list[ClaimedTask]:
    """Tasks of step `two` as a claim hands them over (no database behind them)."""
    return [
        ClaimedTask("benchChain", uuid.uuid4(), "two", {"one": i}, i, 0, {"i": i}, 1, 30)
        for i in range(count)
    ]


async def slots_path(tasks: int) -> float:
    """CPU us per task of Slots.start -> handler -> report, in batches of BATCH."""
    bench_chain, handlers = _project()
    slots = Slots(
        flow=bench_chain.FLOW, handlers={"two": handlers.two}, max_concurrent=BATCH,
        worker_id=uuid.uuid4(), name="bench", database_url="postgresql:///unused",
        prepare_threshold=5, logger=logging.getLogger("bench"),
    )  # fmt: skip
    batch = claimed(tasks)
    began = time.process_time()
    for first in range(0, tasks, BATCH):
        for task in batch[first : first + BATCH]:
            slots.start(task)
        while slots.inflight:
            await asyncio.sleep(0)  # let the handlers run; nothing else is scheduled
        slots.reports.clear()
    used = time.process_time() - began
    slots.close()
    return 1e6 * used / tasks


def _project() -> tuple[Any, Any]:
    """The benchmark project's generated flow module and its handlers (imported from its folder,
    as its workers do)."""
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))
    return importlib.import_module("app.pgflow.bench_chain"), importlib.import_module(
        "app.handlers"
    )


async def session_path(url: str, tasks: int) -> float:
    """CPU us per task of this process for complete_and_claim, BATCH tasks per call."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select pgflow.start_flow('benchChain', jsonb_build_object('i', i))"
            " from generate_series(1, %s) as i",
            (tasks,),
        )
    session = await PsycopgSession.connect(url, 5)
    worker, queue = uuid.uuid4(), "benchchain__one"
    try:
        await session.register_worker(worker, queue, "bench", "benchChain", "one")
        claim = await session.read_and_claim("benchChain", queue, worker, BATCH, 30, "one")
        batch, done = list(claim.tasks), 0
        began = time.process_time()
        while batch:
            completion = await session.complete_and_claim(
                batch, [1] * len(batch), "benchChain", queue, worker, BATCH, 30, "one"
            )
            done += len(batch)
            batch = list(completion.claim.tasks)
        used = time.process_time() - began
    finally:
        await session.close()
    return 1e6 * used / done


async def round_trips(url: str, calls: int = 3000) -> tuple[float, float]:
    """CPU us per `select 1`: (async, sync)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
        began = time.process_time()
        for _ in range(calls):
            await (await aconn.execute("select 1")).fetchall()
        async_us = 1e6 * (time.process_time() - began) / calls
    with psycopg.connect(url, autocommit=True) as conn:
        began = time.process_time()
        for _ in range(calls):
            conn.execute("select 1").fetchall()
        sync_us = 1e6 * (time.process_time() - began) / calls
    return async_us, sync_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for repeat in range(1, args.repeats + 1):
        print(f"slots, repeat {repeat}: {asyncio.run(slots_path(args.tasks)):.1f} us per task")
    with server(False) as admin:
        for repeat in range(1, args.repeats + 1):
            with fresh_database(admin) as url:
                migrated(url)
                with workers(url, "bench_chain.one"):
                    pass  # a worker compiles the flow and creates its queues, then stops
                session_us = asyncio.run(session_path(url, args.tasks))
                async_us, sync_us = asyncio.run(round_trips(url))
            print(
                f"session, repeat {repeat}: complete_and_claim {session_us:.1f} us per task"
                f" ({BATCH} per call); select 1: async {async_us:.0f} us, sync {sync_us:.0f} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
