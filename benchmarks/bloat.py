"""Table and index bloat under steady traffic with pruning: a day of a small production's runs,
compressed into minutes.

Runs of the 3-step chain of `engine_throughput.py` start one by one at RATE runs/s; WORKERS
engine loops (read_and_claim, then complete_and_claim, batch 10, each on its own connection)
run them; every PRUNE_EVERY seconds `prune_data_older_than(RETENTION)` deletes the finished
runs older than the retention. So the tables hold about RATE * (RETENTION + PRUNE_EVERY) runs
at any time, and every row written is deleted again. Every SAMPLE seconds it prints, for the
engine's tables (schema pgflow) and the chain's queue and archive (schema pgmq): live and dead
tuples, their size on disk with indexes and TOAST, and how often autovacuum has run on them.
The last lines compare the size in the second half of the run with the first sample after the
tables filled (a bounded size stays level) and name the largest table and index.

With the defaults below, 30 minutes at 300 runs/s is 540,000 runs (1.6 million tasks), the
traffic of a day at 6 runs/s.

    .venv/bin/python benchmarks/bloat.py [--minutes 30] [--rate 300] [--retention 300]
        [--prune-every 60] [--durable] [--autovacuum default|eager]

`--autovacuum eager` sets the per-table storage parameters that docs/scaling.md recommends
for a database that prunes often (see EAGER below) on the engine's tables and the queue's.
Uses a fresh embedded PostgreSQL (fast settings; with `--durable` the server's defaults) or
PGFLOW_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import FLOW, Route, engine_loop, server
from benchmarks.growth import chain_database

# Vacuum a table once 2 % of it is dead (the default waits for 20 %), and without the cost
# delay's pauses, so a prune's deletions are reclaimed before the next prune.
EAGER = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_analyze_scale_factor": "0.05",
    "autovacuum_vacuum_cost_delay": "0",
}

SAMPLE_SQL = """
select t.schemaname, t.relname, t.n_live_tup, t.n_dead_tup,
  pg_total_relation_size(t.relid), t.autovacuum_count
from pg_stat_user_tables as t
where t.schemaname = 'pgflow' or (t.schemaname = 'pgmq' and t.relname like any (%s))
order by pg_total_relation_size(t.relid) desc
"""


@dataclass(frozen=True)
class Sample:
    elapsed_s: float
    started_runs: int
    live: int
    dead: int
    size_bytes: int
    autovacuums: int
    tables: list[tuple[str, str, int, int, int, int]]


def queue_patterns(queue: str) -> list[str]:
    return [f"q_{queue.lower()}", f"a_{queue.lower()}"]


def tune(conn: psycopg.Connection[Any], queue: str) -> None:
    """EAGER's storage parameters on every engine table and the queue's two tables."""
    rows = conn.execute(
        "select schemaname, relname from pg_stat_user_tables"
        " where schemaname = 'pgflow' or (schemaname = 'pgmq' and relname = any (%s))",
        (queue_patterns(queue),),
    ).fetchall()
    options = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(key), sql.Literal(value))
        for key, value in EAGER.items()
    )
    for schema, table in rows:
        conn.execute(
            sql.SQL("alter table {}.{} set ({})").format(
                sql.Identifier(schema), sql.Identifier(table), options
            )
        )


def sample(conn: psycopg.Connection[Any], queue: str, elapsed: float, started: int) -> Sample:
    tables = [
        (r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5]))
        for r in conn.execute(SAMPLE_SQL, (queue_patterns(queue),))
    ]
    return Sample(
        elapsed_s=elapsed,
        started_runs=started,
        live=sum(t[2] for t in tables),
        dead=sum(t[3] for t in tables),
        size_bytes=sum(t[4] for t in tables),
        autovacuums=sum(t[5] for t in tables),
        tables=tables,
    )


def largest_index(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(
        "select schemaname || '.' || indexrelname, pg_relation_size(indexrelid)"
        " from pg_stat_user_indexes where schemaname in ('pgflow', 'pgmq')"
        " order by 2 desc limit 1"
    ).fetchone()
    return f"{row[0]} {row[1] / 2**20:.1f} MiB" if row else "none"


def soak(url: str, args: argparse.Namespace) -> list[Sample]:
    stop = threading.Event()
    started = [0]
    errors: list[BaseException] = []
    with psycopg.connect(url, autocommit=True) as conn:
        [(worker_id, queue)] = conn.execute(
            "select worker_id, queue_name from pgflow.workers"
        ).fetchall()
        if args.autovacuum == "eager":
            tune(conn, queue)
        settings = conn.execute(
            "select string_agg(name || ' = ' || setting || coalesce(unit, ''), ', ' order by name)"
            " from pg_settings where name in ('autovacuum', 'autovacuum_naptime',"
            " 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_cost_delay', 'fsync')"
        ).fetchone()
        print(f"server: {settings[0] if settings else '?'}", flush=True)

    def guarded(target: Any) -> Any:
        def run() -> None:
            try:
                target()
            except BaseException as error:  # reported by the main thread
                errors.append(error)
                stop.set()

        return run

    def starter() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            begin = time.monotonic()
            while not stop.is_set():
                due = begin + started[0] / args.rate
                if due > time.monotonic():
                    stop.wait(due - time.monotonic())  # the pace of the traffic
                    continue
                conn.execute("select from pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": 1})))
                started[0] += 1

    def idle_or_done(conn: psycopg.Connection[Any]) -> bool:
        return stop.wait(0.01)  # an empty claim: wait for the next runs, or the end

    def worker() -> None:
        loop = engine_loop(
            "complete_and_claim", Route(queue, None, worker_id), 10, finished=idle_or_done
        )
        with psycopg.connect(url, autocommit=True) as conn:
            loop(conn)

    def pruner() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.wait(args.prune_every):
                conn.execute(
                    "select pgflow.prune_data_older_than(make_interval(secs => %s))",
                    (args.retention,),
                )

    threads = [threading.Thread(target=guarded(t)) for t in (starter, pruner)]
    threads += [threading.Thread(target=guarded(worker)) for _ in range(args.workers)]
    samples: list[Sample] = []
    begin = time.monotonic()
    end = begin + 60 * args.minutes
    with psycopg.connect(url, autocommit=True) as conn:
        for thread in threads:
            thread.start()
        try:
            while not stop.wait(min(args.sample, max(0.0, end - time.monotonic()))):
                now = time.monotonic()
                samples.append(sample(conn, queue, now - begin, started[0]))
                print_sample(samples[-1])
                if now >= end:
                    break
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        if errors:
            raise errors[0]
        print(f"largest index at the end: {largest_index(conn)}")
    return samples


def print_sample(s: Sample) -> None:
    print(
        f"{s.elapsed_s / 60:5.1f} min  {s.started_runs:>9,} runs started"
        f"  live {s.live:>10,}  dead {s.dead:>9,}  size {s.size_bytes / 2**20:7.1f} MiB"
        f"  autovacuums {s.autovacuums:>4}",
        flush=True,
    )


def verdict(samples: list[Sample], args: argparse.Namespace) -> None:
    filled = args.retention + 2 * args.prune_every  # the first prune past the retention is done
    steady = [s for s in samples if s.elapsed_s >= filled]
    if len(steady) < 2:
        print("too short to judge: run longer than the retention plus two prunes")
        return
    half = [s for s in steady if s.elapsed_s >= samples[-1].elapsed_s / 2]
    first = steady[0]
    rate = samples[-1].started_runs / samples[-1].elapsed_s
    print(
        f"started {samples[-1].started_runs:,} runs ({rate:,.0f}/s), the runs of a day at"
        f" {samples[-1].started_runs / 86_400:,.1f} runs/s"
    )
    print(
        f"size once full (at {first.elapsed_s / 60:.1f} min): {first.size_bytes / 2**20:.1f} MiB;"
        f" second half: median {statistics.median(s.size_bytes for s in half) / 2**20:.1f},"
        f" max {max(s.size_bytes for s in half) / 2**20:.1f},"
        f" last {samples[-1].size_bytes / 2**20:.1f} MiB"
        f" ({samples[-1].size_bytes / first.size_bytes:.2f}x the first)"
    )
    print(
        f"dead tuples once full: median {statistics.median(s.dead for s in steady):,.0f},"
        f" max {max(s.dead for s in steady):,} (live median"
        f" {statistics.median(s.live for s in steady):,.0f})"
    )
    print("per table at the end (live, dead, MiB, autovacuums):")
    for schema, table, live, dead, size, vacuums in samples[-1].tables:
        print(f"  {schema}.{table:<32} {live:>10,} {dead:>9,} {size / 2**20:8.1f} {vacuums:>5}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=300.0, help="runs started per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--retention", type=float, default=300.0, help="seconds")
    parser.add_argument("--prune-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--autovacuum", choices=("default", "eager"), default="default")
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    print(
        f"{args.minutes:g} min at {args.rate:g} runs/s, {args.workers} workers, retention"
        f" {args.retention:g} s, pruned every {args.prune_every:g} s, autovacuum"
        f" {args.autovacuum}, {'durable (server defaults)' if args.durable else 'fast settings'}",
        flush=True,
    )
    with server(args.durable) as admin, chain_database(admin) as url:
        verdict(soak(url, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
