"""Engine throughput next to raw PGMQ, measured in the same run on the same server.

Raw PGMQ loop (one client): send a batch, read it, archive it. Engine loop (one worker): read a
batch from the flow queue, claim it with claim_tasks, complete the claimed tasks with one
complete_tasks call (as the worker reports the results it collected), for RUNS runs of a 3-step
sequential flow started beforehand (3 * RUNS tasks). Also measured: the same loop completing each
task with its own complete_task call; the loop that reads and claims in one call
(read_and_claim, engine 0012); and the loop that completes a batch and claims the next one in
one pipelined transaction. Every other call is its own autocommit transaction, as a real
worker's. Prints tasks/s, msg/s and their ratios per batch size.

    .venv/bin/python benchmarks/engine_throughput.py [--runs 2000] [--repeat 3] [--batch 1 10 50]
        [--durable]

Uses a fresh embedded PostgreSQL with fsync, synchronous_commit and full_page_writes off (the
settings of the anchor figures), with `--durable` the server's defaults, or
PGFLOW_BENCH_DATABASE_URL (a role that may create databases).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from benchmarks import output_check
from pgflow_gen.runtime import embedded, migrations

FLOW = "benchChain"
QUEUE = FLOW.lower()
WORKER_ID = uuid.uuid4()


@contextmanager
def server(durable: bool = False) -> Iterator[str]:
    """A fresh embedded server: fast settings (fsync, synchronous_commit and full_page_writes
    off), or with `durable` the server defaults; or PGFLOW_BENCH_DATABASE_URL as it is."""
    external = os.environ.get("PGFLOW_BENCH_DATABASE_URL")
    if external:
        yield external
        return
    base = Path(tempfile.mkdtemp(prefix="pgflow-bench-"))
    instance = embedded.EmbeddedServer(
        base, embedded.default_bin_dir(), fast=not durable, local=False
    )
    try:
        yield instance.ensure_started()
    finally:
        instance.destroy()


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    name = f"pgflow_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(admin_url)
    params["dbname"] = name
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


def raw_pgmq(url: str, total: int, batch: int) -> float:
    """Messages per second of send + read + archive in batches of `batch`."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.ensure_pgmq(conn)
        conn.execute("select pgmq.create('raw')")
        payload = [
            Jsonb(
                {"flow_slug": FLOW, "run_id": str(uuid.uuid4()), "step_slug": "s", "task_index": 0}
            )
        ] * batch
        done = 0
        started = time.perf_counter()
        while done < total:
            conn.execute("select pgmq.send_batch('raw', %s::jsonb[])", (payload,))
            ids = [
                r[0] for r in conn.execute("select msg_id from pgmq.read('raw', 30, %s)", (batch,))
            ]
            conn.execute("select pgmq.archive('raw', %s::bigint[])", (ids,))
            done += len(ids)
        return done / (time.perf_counter() - started)


def engine(
    url: str,
    runs: int,
    batch: int,
    per_task: bool = False,
    one_call: bool = False,
    one_transaction: bool = False,
) -> tuple[float, float]:
    """(tasks per second of read + claim_tasks + complete_tasks, runs started per second);
    with per_task, one complete_task call per task instead; with one_call, read_and_claim
    (engine 0012) reads and claims in one call; with one_transaction, the batch's completion
    and the next read_and_claim go in one transaction, pipelined (one round trip, one commit)."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        conn.execute("select pgflow.create_flow(%s)", (FLOW,))
        previous: list[str] = []
        for step in ("one", "two", "three"):
            conn.execute("select pgflow.add_step(%s, %s, %s)", (FLOW, step, previous))
            previous = [step]
        conn.execute("select pgflow.register_worker(%s, %s, 'bench')", (WORKER_ID, QUEUE))

        started = time.perf_counter()
        for i in range(runs):
            conn.execute("select pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i})))
        start_rate = runs / (time.perf_counter() - started)

        output = Jsonb({"ok": True})
        total = 3 * runs
        done = 0
        started = time.perf_counter()
        if one_transaction:
            rate = _one_transaction_loop(conn, total, batch, output)
            _assert_completed(conn, runs)
            return rate, start_rate
        while done < total:
            if one_call:
                tasks = conn.execute(
                    "select run_id, step_slug, task_index, attempt"
                    " from pgflow.read_and_claim(%s, %s, %s, %s, 30)",
                    (FLOW, QUEUE, WORKER_ID, batch),
                ).fetchall()
            else:
                ids = [
                    r[0]
                    for r in conn.execute(
                        "select msg_id from pgmq.read(%s, 30, %s)", (QUEUE, batch)
                    )
                ]
                tasks = conn.execute(
                    "select run_id, step_slug, task_index, attempt"
                    " from pgflow.claim_tasks(%s, %s, %s, %s)",
                    (FLOW, ids, WORKER_ID, QUEUE),
                ).fetchall()
            if per_task:
                for run_id, step_slug, task_index, attempt in tasks:
                    conn.execute(
                        "select 1 from pgflow.complete_task(%s, %s, %s, %s, %s)",
                        (run_id, step_slug, task_index, output, attempt),
                    )
            elif tasks:
                complete_batch(conn, tasks, output)
            done += len(tasks)
        elapsed = time.perf_counter() - started
        _assert_completed(conn, runs)
        return total / elapsed, start_rate


def complete_batch(conn: psycopg.Connection[Any], tasks: list[Any], output: Jsonb) -> None:
    """One complete_tasks call for claimed (run_id, step_slug, task_index, attempt) rows."""
    conn.execute(
        "select 1 from pgflow.complete_tasks(%s, %s, %s, %s::jsonb[], %s::int[])",
        (
            [task[0] for task in tasks],
            [task[1] for task in tasks],
            [task[2] for task in tasks],
            [output] * len(tasks),
            [task[3] for task in tasks],
        ),
    )


def _assert_completed(conn: psycopg.Connection[Any], runs: int) -> None:
    completed = conn.execute(
        "select count(*) from pgflow.runs where status = 'completed'"
    ).fetchone()
    assert completed == (runs,), f"only {completed} of {runs} runs completed"


def _one_transaction_loop(
    conn: psycopg.Connection[Any], total: int, batch: int, output: Jsonb
) -> float:
    """Tasks per second when each completion shares its transaction (and round trip) with the
    next claim."""
    claim = (
        "select run_id, step_slug, task_index, attempt"
        " from pgflow.read_and_claim(%s, %s, %s, %s, 30)"
    )
    done = 0
    started = time.perf_counter()
    tasks = conn.execute(claim, (FLOW, QUEUE, WORKER_ID, batch)).fetchall()
    while done < total:
        done += len(tasks)
        with conn.pipeline(), conn.transaction():
            if tasks:
                complete_batch(conn, tasks, output)
            cursor = conn.execute(claim, (FLOW, QUEUE, WORKER_ID, batch))
        tasks = cursor.fetchall()
    return total / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=2000, help="runs of the 3-step flow (default 2000)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="measurements per figure; the median is shown"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)

    with server(args.durable) as admin_url:
        with psycopg.connect(admin_url) as conn:
            version = conn.execute("show server_version").fetchone()
        print(
            f"PostgreSQL {version[0] if version else '?'}, PGMQ {migrations.pgmq_sql()[1]}, "
            f"{args.runs} runs x 3 steps, median of {args.repeat},"
            f" {'durable (server defaults)' if args.durable else 'fast settings'}",
            flush=True,
        )
        for batch in args.batch:
            raw, eng, single, starts, one, joint = [], [], [], [], [], []
            for _ in range(args.repeat):
                with fresh_database(admin_url) as url:
                    raw.append(raw_pgmq(url, 3 * args.runs, batch))
                with fresh_database(admin_url) as url:
                    tasks_per_s, start_rate = engine(url, args.runs, batch)
                    eng.append(tasks_per_s)
                    starts.append(start_rate)
                with fresh_database(admin_url) as url:
                    single.append(engine(url, args.runs, batch, per_task=True)[0])
                with fresh_database(admin_url) as url:
                    one.append(engine(url, args.runs, batch, one_call=True)[0])
                with fresh_database(admin_url) as url:
                    joint.append(engine(url, args.runs, batch, one_transaction=True)[0])
            # Each repeat measures raw PGMQ and the engine back to back, so the ratio is taken
            # per repeat (the machine's speed drifts between repeats) and its median shown.
            ratio = statistics.median(e / r for e, r in zip(eng, raw, strict=True))
            single_ratio = statistics.median(e / r for e, r in zip(single, raw, strict=True))
            print(
                f"batch {batch:>3}: raw PGMQ {statistics.median(raw):>8,.0f} msg/s"
                f" | engine {statistics.median(eng):>8,.0f} tasks/s, ratio {ratio:6.1%}"
                f" | per-task complete_task {statistics.median(single):>7,.0f} tasks/s,"
                f" ratio {single_ratio:6.1%}"
                f" | start_flow {statistics.median(starts):>6,.0f} runs/s",
                flush=True,
            )
            ratios = ", ".join(f"{e / r:.1%}" for e, r in zip(eng, raw, strict=True))
            print(f"           engine ratio per repeat: {ratios}", flush=True)
            one_ratio = statistics.median(e / r for e, r in zip(one, raw, strict=True))
            one_ratios = ", ".join(f"{e / r:.1%}" for e, r in zip(one, raw, strict=True))
            print(
                f"           read_and_claim (one call) {statistics.median(one):>8,.0f} tasks/s,"
                f" ratio {one_ratio:6.1%}; per repeat: {one_ratios}",
                flush=True,
            )
            joint_ratio = statistics.median(e / r for e, r in zip(joint, raw, strict=True))
            joint_ratios = ", ".join(f"{e / r:.1%}" for e, r in zip(joint, raw, strict=True))
            print(
                f"           complete + read_and_claim in one transaction"
                f" {statistics.median(joint):>8,.0f} tasks/s, ratio {joint_ratio:6.1%};"
                f" per repeat: {joint_ratios}",
                flush=True,
            )
            task_us = 1e6 / statistics.median(eng)
    # What the worker's output check adds, next to the engine's time per task (last batch size).
    for line in output_check.lines(task_us):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
