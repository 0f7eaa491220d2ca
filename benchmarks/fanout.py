"""The cost of a map's fan-out with workers listening, next to `pgmq.send_batch` of as many
messages in the same run.

A step whose output is an array of N elements completes, and its dependent map step sends N
messages in one statement. With insert notifications on, PGMQ's own per-row trigger
(`pgmq.enable_notify_insert`) updates one throttle row per message, and a statement that updates
a row N times pays O(N^2). Engine 0013's trigger (`pgflow.enable_insert_notifications`, what
workers of that release install) notifies once per statement. Measured per N: the
`complete_task` call that fans out, with no notifications, with PGMQ's trigger and with the
engine's; and `pgmq.send_batch` of N messages into a queue with the engine's trigger.

    .venv/bin/python benchmarks/fanout.py [--sizes 1000 3000 10000] [--repeat 3]

Uses a fresh embedded PostgreSQL (fsync, synchronous_commit and full_page_writes off), a fresh
database per measurement, or PGFLOW_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import fresh_database, server
from pgflow_gen.runtime import migrations

MODES = ("none", "pgmq_row_trigger", "statement_trigger")


def fan_out(url: str, size: int, mode: str) -> float:
    """Seconds of the complete_task call whose output a map step fans out into `size` tasks."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        conn.execute("select pgflow.create_flow('fan')")
        conn.execute("select pgflow.add_step('fan', 'items')")
        conn.execute("select pgflow.add_step('fan', 'each', array['items'], step_type => 'map')")
        if mode == "pgmq_row_trigger":
            conn.execute("select pgmq.enable_notify_insert('fan', 0)")
        elif mode == "statement_trigger":
            conn.execute("select pgflow.enable_insert_notifications('fan')")
        worker = uuid.uuid4()
        conn.execute("select pgflow.register_worker(%s, 'fan', 'bench')", (worker,))
        conn.execute("select pgflow.start_flow('fan', '{}')")
        [task] = conn.execute(
            "select run_id, step_slug, task_index, attempt"
            " from pgflow.read_and_claim('fan', 'fan', %s, 1, 30)",
            (worker,),
        ).fetchall()
        output = Jsonb(list(range(size)))
        started = time.perf_counter()
        conn.execute("select 1 from pgflow.complete_task(%s, %s, %s, %s, %s)", (*task[:3], output,
                     task[3]))  # fmt: skip
        elapsed = time.perf_counter() - started
        queued = conn.execute(
            "select count(*) from pgmq.q_fan where message ->> 'step_slug' = 'each'"
        ).fetchone()
        assert queued == (size,), f"{queued} messages instead of {size}"
        return elapsed


def send_batch(url: str, size: int) -> float:
    """Seconds of one pgmq.send_batch of `size` messages into a queue that notifies."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        conn.execute("select pgmq.create('raw')")
        conn.execute("select pgflow.enable_insert_notifications('raw')")
        messages: list[Any] = [Jsonb({"task_index": i}) for i in range(size)]
        started = time.perf_counter()
        conn.execute("select pgmq.send_batch('raw', %s::jsonb[])", (messages,))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with server() as admin:
        for size in args.sizes:
            timings: dict[str, list[float]] = {"send_batch": [], **{m: [] for m in MODES}}
            for _ in range(args.repeat):
                with fresh_database(admin) as url:
                    timings["send_batch"].append(send_batch(url, size))
                for mode in MODES:
                    with fresh_database(admin) as url:
                        timings[mode].append(fan_out(url, size, mode))
            base = statistics.median(timings["send_batch"])
            for name, values in timings.items():
                median = statistics.median(values)
                each = ", ".join(f"{1000 * v:.0f}" for v in values)
                print(
                    f"{size:>6} {name:<18} {1000 * median:>8.1f} ms ({median / base:5.1f}x"
                    f" send_batch; per repeat {each} ms)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
