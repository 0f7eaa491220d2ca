"""Fair concurrency per key: how long one tenant's single task waits behind another tenant's
backlog, with and without a concurrency key, and what the key costs the big tenant.

    .venv/bin/python benchmarks/fairness.py [--backlog 5000] [--work-ms 0 20] [--repeat 3]
        [--durable]

Two worker processes from the generated entry files (`max_concurrent: 10` each) run one step,
`work`, which sleeps the run input's `ms` (0: returns at once). Per repeat and work time:

1. idle: tenant B's single run on an idle queue, 20 times one after another; B's latency is its
   task's start minus its run's start (the engine's timestamps), the median is kept.
2. For `benchFairPlain` (no key) and then `benchFair` (key `$.tenant`, at most 20 tasks per
   tenant: the two workers' whole capacity): tenant A starts BACKLOG runs (start_flows, 500 per
   call); once 100 of them completed, B starts one run. B's latency as above; A's throughput is
   its completed tasks per second from its first start to its last completion.

The bound the issue sets: B starts within 3x its idle latency plus one batch (a batch: the mean
time A's tasks held a worker slot, start to completion), and A keeps >= 80 % of its unkeyed
throughput. Raw PGMQ (send, read, archive in batches of 10, one client) is measured in the same
run, and both throughputs are printed as a ratio to it.

Uses a fresh embedded PostgreSQL (fsync, synchronous_commit and full_page_writes off; with
`--durable` the server's defaults) and a fresh database per measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.e2e import count, migrated, until, workers
from benchmarks.engine_throughput import fresh_database, raw_pgmq, server

FLOWS = {
    "plain": ("benchFairPlain", "bench_fair_plain.work"),
    "keyed": ("benchFair", "bench_fair.work"),
}
CHUNK = 500


@dataclass
class Outcome:
    b_latency_ms: float
    a_rate: float
    a_slot_ms: float


def start_run(conn: psycopg.Connection[Any], flow: str, tenant: str, ms: int) -> Any:
    row = conn.execute(
        "select run_id from pgflow.start_flow(%s, %s)", (flow, Jsonb({"tenant": tenant, "ms": ms}))
    ).fetchone()
    assert row is not None
    return row[0]


def start_latency_ms(conn: psycopg.Connection[Any], run_id: Any) -> float:
    until(
        lambda: count(
            conn,
            "select count(*) from pgflow.step_tasks where run_id = %s and started_at is not null",
            run_id,
        ) == 1,
        "B's task to start",
    )  # fmt: skip
    row = conn.execute(
        "select extract(epoch from (t.started_at - r.started_at)) * 1000"
        " from pgflow.step_tasks as t join pgflow.runs as r using (run_id) where t.run_id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def idle_latency_ms(url: str, flow: str, module: str, ms: int, probes: int = 20) -> float:
    migrated(url)
    with workers(url, module, module), psycopg.connect(url, autocommit=True) as conn:
        waits = []
        for _ in range(probes):
            run_id = start_run(conn, flow, "b", ms)
            waits.append(start_latency_ms(conn, run_id))
            until(
                lambda: (
                    count(conn, "select count(*) from pgflow.runs where status <> 'completed'") == 0
                ),
                "the probe to complete",
            )
        return statistics.median(waits)


def backlog(url: str, flow: str, module: str, ms: int, size: int, limit: int) -> Outcome:
    migrated(url)
    with workers(url, module, module), psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "update pgflow.steps set opt_concurrency_limit = %s"
            " where flow_slug = %s and opt_concurrency_key is not null",
            (limit, flow),
        )
        inputs = [Jsonb({"tenant": "a", "ms": ms}) for _ in range(size)]
        for first in range(0, size, CHUNK):
            conn.execute(
                "select count(*) from pgflow.start_flows(%s, %s::jsonb[])",
                (flow, inputs[first : first + CHUNK]),
            )
        until(
            lambda: (
                count(conn, "select count(*) from pgflow.runs where status = 'completed'") >= 100
            ),
            "A's first 100 runs",
        )
        b_run = start_run(conn, flow, "b", ms)
        b_latency = start_latency_ms(conn, b_run)
        until(
            lambda: (
                count(conn, "select count(*) from pgflow.runs where status <> 'completed'") == 0
            ),
            "every run",
        )
        row = conn.execute(
            "select count(*), extract(epoch from max(t.completed_at) - min(t.started_at)),"
            " avg(extract(epoch from t.completed_at - t.started_at)) * 1000"
            " from pgflow.step_tasks as t join pgflow.runs as r using (run_id)"
            " where r.input ->> 'tenant' = 'a'"
        ).fetchone()
        if row is None or row[0] != size:
            raise SystemExit(f"tenant A has {row} tasks, not {size}")
        return Outcome(b_latency, size / float(row[1]), float(row[2]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--work-ms", type=int, nargs="+", default=[0, 20])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--limit",
        type=int,
        default=20,
        help="tasks per tenant at once (the spec's 20; another value is set in pgflow.steps"
        " once the workers compiled the flow, as an edited spec would set it)",
    )
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    print("durable (server defaults)" if args.durable else "fast settings", flush=True)
    with server(args.durable) as admin:
        for ms in args.work_ms:
            for repeat in range(1, args.repeat + 1):
                with fresh_database(admin) as url:
                    raw = raw_pgmq(url, 6000, 10).rate
                with fresh_database(admin) as url:
                    idle = idle_latency_ms(url, *FLOWS["keyed"], ms)
                outcomes = {}
                for kind, (flow, module) in FLOWS.items():
                    with fresh_database(admin) as url:
                        outcomes[kind] = backlog(url, flow, module, ms, args.backlog, args.limit)
                plain, keyed = outcomes["plain"], outcomes["keyed"]
                bound = 3 * idle + keyed.a_slot_ms
                verdict = "within" if keyed.b_latency_ms <= bound else "OVER"
                print(
                    f"work {ms} ms, limit {args.limit}, repeat {repeat}: raw PGMQ {raw:,.0f}"
                    f" msg/s; B idle {idle:.1f} ms; B behind A's {args.backlog:,}: unkeyed"
                    f" {plain.b_latency_ms:,.1f} ms, keyed {keyed.b_latency_ms:,.1f} ms (bound"
                    f" {bound:.1f} ms: {verdict}); A unkeyed {plain.a_rate:,.0f} tasks/s"
                    f" ({100 * plain.a_rate / raw:.1f} % of raw), keyed {keyed.a_rate:,.0f}"
                    f" ({100 * keyed.a_rate / raw:.1f} % of raw,"
                    f" {100 * keyed.a_rate / plain.a_rate:.1f} % of unkeyed)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
