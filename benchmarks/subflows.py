"""What a subflow costs: a parent mapping N documents through N child runs of a 2-step flow, end to
end with worker processes, beside the same work as one flow with two maps, and raw PGMQ in the
same run.

    .venv/bin/python benchmarks/subflows.py [--children 1000] [--repeat 3] [--durable]

- subflow: `benchDocsSubflow`, a map step with `flow: benchDoc` over N integers (N child runs of
  parse -> store), then a sum; a worker process for benchDoc and one for the parent.
- map: `benchDocsMap`, the same 2N tasks in one run (map parse, map store over it), then the
  sum; one worker process.
- raw PGMQ: 2N messages sent, read and archived in batches of 10 by one client, the same number
  of queue messages as the tasks.

Each repeat starts one run (its N children become visible at once) and times it until it
completes. Printed per repeat: seconds, tasks per second, the subflow's cost per child over the
map ((subflow - map) / N) and each as a share of raw PGMQ's messages per second. Workers run
with `max_concurrent` 100 (the specs' `workers:`). Uses a fresh embedded PostgreSQL (fsync,
synchronous_commit and full_page_writes off; `--durable`: the server's defaults) and a fresh
database per measurement, or PGFLOW_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.e2e import migrated, until, workers
from benchmarks.engine_throughput import fresh_database, raw_pgmq, server

#: Messages per raw batch, as the workers read (up to their free slots).
RAW_BATCH = 10


def one_run(url: str, flow: str, modules: tuple[str, ...], children: int) -> float:
    """Seconds from the start of one run of `flow` over `children` integers to its completion,
    with a worker process for each of `modules`."""
    migrated(url)
    with workers(url, *modules), psycopg.connect(url, autocommit=True) as conn:
        began = time.perf_counter()
        [(run_id,)] = conn.execute(
            "select run_id from pgflow.start_flow(%s, %s)",
            (flow, Jsonb(list(range(children)))),
        ).fetchall()
        until(lambda: _finished(conn, run_id), f"the {flow} run")
        elapsed = time.perf_counter() - began
        run = conn.execute(
            "select status, output from pgflow.runs where run_id = %s", (run_id,)
        ).fetchone()
        assert run == ("completed", {"total": sum(range(children))}), run
        return elapsed


def _finished(conn: psycopg.Connection[Any], run_id: Any) -> bool:
    row = conn.execute("select status from pgflow.runs where run_id = %s", (run_id,)).fetchone()
    return row is not None and row[0] != "started"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--children", type=int, default=1000, help="children (documents) per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    if args.children < 1 or args.repeat < 1:
        parser.error("--children and --repeat must be at least 1")
    tasks = 2 * args.children
    print(
        ("durable (server defaults)" if args.durable else "fast settings")
        + f", {args.children} documents, {tasks} tasks per run",
        flush=True,
    )
    costs = []
    with server(args.durable) as admin:
        for repeat in range(1, args.repeat + 1):
            with fresh_database(admin) as url:
                raw = raw_pgmq(url, tasks, RAW_BATCH).rate
            with fresh_database(admin) as url:
                mapped = one_run(url, "benchDocsMap", ("bench_docs_map.worker",), args.children)
            with fresh_database(admin) as url:
                sub = one_run(
                    url,
                    "benchDocsSubflow",
                    ("bench_doc.worker", "bench_docs_subflow.worker"),
                    args.children,
                )
            per_child = 1e6 * (sub - mapped) / args.children
            costs.append(per_child)
            print(
                f"repeat {repeat}: raw PGMQ {raw:,.0f} msg/s;"
                f" map {mapped:.2f} s ({tasks / mapped:,.0f} tasks/s,"
                f" {100 * tasks / mapped / raw:.1f} % of raw);"
                f" subflow {sub:.2f} s ({tasks / sub:,.0f} tasks/s,"
                f" {100 * tasks / sub / raw:.1f} % of raw);"
                f" subflow cost {per_child:,.0f} us per child over the map",
                flush=True,
            )
    print(f"median cost per child: {statistics.median(costs):,.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
