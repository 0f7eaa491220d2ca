"""What grows with the work: a big fan-out drained by real workers, a long history and its
pruning, many flows, many idle workers. Each figure next to a baseline measured in the same run.

    .venv/bin/python benchmarks/growth.py [--only fanout history breadth idle] [--durable]
        [--elements 10000] [--history 1000000] [--flows 500] [--idle-workers 50]

1. fanout: one run of `benchFan` (project/flows/fan.yaml): its first step returns ELEMENTS
   integers, the map step's one worker process runs 100 at a time, then a step adds them up.
   How soon the first element starts after the fan-out commits (the commit's time is when a
   listener hears the map queue's insert notification), the drain rate, and how soon the
   aggregating step starts after the last element (from the engine's timestamps). Baselines:
   the 3-step chain with a worker process per step, its runs started at once (as `e2e.py
   throughput`), and `fanout.py`'s fan-out call next to a `pgmq.send_batch` of as many.
2. history: the engine loop of `engine_throughput.py` (read_and_claim, batch 10) on a database
   holding HISTORY finished runs of the chain (written set-based, as if they had run a day
   ago), next to the same loop on an empty database; then the same loop while
   `prune_data_older_than('1 hour', 10000)` deletes that history in calls of 10,000 runs (as
   `pgflow-gen prune` does), and again (the history written anew) in one call: throughput, and
   the longest and p99 time of a claim meanwhile; and the dead tuples left after pruning and
   after a VACUUM. The loops with and without the history alternate, three times.
3. breadth: the same loop for one flow among FLOWS step-queued flows of 5 steps (5 * FLOWS
   queues), next to the one-flow case.
4. idle: IDLE_WORKERS worker processes with nothing to do for 20 s: the database's CPU time
   (its processes' from /proc) and committed transactions per second.

Uses a fresh embedded PostgreSQL (fast settings; with `--durable` the server's defaults), a
fresh database per measurement, or PGFLOW_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks import fanout as fanout_benchmark
from benchmarks.e2e import (
    CHAIN,
    DEADLINE_S,
    count,
    migrated,
    percentile,
    throughput,
    until,
    workers,
)
from benchmarks.engine_throughput import (
    FLOW,
    Route,
    define_chain,
    engine_loop,
    fresh_database,
    server,
)
from pgflow_gen import naming
from pgflow_gen.runtime import migrations

FAN = ("bench_fan.items", "bench_fan.each", "bench_fan.total")


# 1. A big fan-out, drained by real workers


def fanout(url: str, elements: int) -> dict[str, float]:
    migrated(url)
    committed: list[float] = []
    listening = threading.Event()

    def hear_the_commit() -> None:
        # The map queue's insert notification arrives when the fan-out commits.
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute(f'listen "{naming.pgmq_insert_channel("benchfan__each")}"')
            listening.set()
            for _ in listener.notifies(timeout=DEADLINE_S, stop_after=1):
                committed.append(time.time())

    hearing = threading.Thread(target=hear_the_commit)
    with workers(url, *FAN), psycopg.connect(url, autocommit=True) as conn:
        hearing.start()
        listening.wait(timeout=60)
        row = conn.execute(
            "select run_id from pgflow.start_flow('benchFan', %s)", (Jsonb({"n": elements}),)
        ).fetchone()
        assert row is not None
        run_id = row[0]
        until(
            lambda: count(
                conn, "select count(*) from pgflow.runs where run_id = %s and status = 'completed'",
                run_id,
            ) == 1,
            "the fan-out run",
        )  # fmt: skip
        hearing.join()
        assert committed, "the fan-out's insert notification never came"
        first_start = conn.execute(
            "select extract(epoch from min(started_at)) from pgflow.step_tasks"
            " where run_id = %s and step_slug = 'each'",
            (run_id,),
        ).fetchone()
        assert first_start is not None
        times = conn.execute(
            """
            select
              extract(epoch from (select min(t.started_at) from pgflow.step_tasks as t
                where t.run_id = r.run_id and t.step_slug = 'each') - i.completed_at) * 1000,
              extract(epoch from (select max(t.completed_at) - min(t.started_at)
                from pgflow.step_tasks as t where t.run_id = r.run_id and t.step_slug = 'each')),
              extract(epoch from a.started_at - (select max(t.completed_at)
                from pgflow.step_tasks as t where t.run_id = r.run_id and t.step_slug = 'each'))
                * 1000,
              extract(epoch from r.completed_at - r.started_at)
            from pgflow.runs as r
            join pgflow.step_states as i on i.run_id = r.run_id and i.step_slug = 'items'
            join pgflow.step_states as a on a.run_id = r.run_id and a.step_slug = 'total'
            where r.run_id = %s
            """,
            (run_id,),
        ).fetchone()
        output = conn.execute("select output from pgflow.runs where run_id = %s", (run_id,))
        assert output.fetchone() == ({"total": elements * (elements - 1) // 2},)
    assert times is not None
    first_ms, drain_s, aggregate_ms, total_s = (float(t) for t in times)
    return {
        "fan-out, from its step's completion to its commit (ms)": 1000
        * (committed[0] - (float(first_start[0]) - first_ms / 1000)),
        "first element starts after the fan-out commits (ms)": 1000
        * (float(first_start[0]) - committed[0]),
        "drain (tasks/s)": elements / drain_s,
        "aggregating step starts after the last element (ms)": aggregate_ms,
        "run, end to end (s)": total_s,
    }


# 2. A long history, and pruning it under load


def write_history(url: str, runs: int) -> float:
    """Seconds to write `runs` finished runs of the chain, completed a day ago (set-based, as
    the engine leaves them; their messages archived long since)."""
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(
            """
            insert into pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps,
              started_at, completed_at)
            select gen_random_uuid(), %(flow)s, 'completed', jsonb_build_object('i', i),
              '{"three": 3}', 0, now() - interval '1 day', now() - interval '1 day'
            from generate_series(1, %(runs)s) as i
            """,
            {"flow": FLOW, "runs": runs},
        )
        conn.execute(
            """
            insert into pgflow.step_states (run_id, flow_slug, step_slug, status, output,
              remaining_deps, remaining_tasks, initial_tasks, created_at, started_at, completed_at)
            select r.run_id, r.flow_slug, s.step_slug, 'completed', '1', 0, 0, 1,
              r.started_at, r.started_at, r.completed_at
            from pgflow.runs as r cross join pgflow.steps as s
            where s.flow_slug = r.flow_slug and r.status = 'completed'
              and r.completed_at < now() - interval '12 hours'  -- only the runs just written
            """
        )
        conn.execute(
            """
            insert into pgflow.step_tasks (run_id, flow_slug, step_slug, task_index, status,
              attempts_count, message_id, queue_name, output, queued_at, started_at, completed_at)
            select ss.run_id, ss.flow_slug, ss.step_slug, 0, 'completed', 1, null, s.queue_name,
              '1', ss.started_at, ss.started_at, ss.completed_at
            from pgflow.step_states as ss
            join pgflow.steps as s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
            where ss.completed_at < now() - interval '12 hours'
            """
        )
        conn.execute("vacuum analyze")
        wrote = time.perf_counter() - started
        conn.execute("checkpoint")  # the written pages go out now, not during the measurement
        return wrote


def chain_loop(url: str, runs: int, batch: int = 10) -> tuple[float, list[float]]:
    """(tasks/s of the read_and_claim loop on `runs` new runs, each claim's seconds)."""
    with psycopg.connect(url, autocommit=True) as conn:
        run_ids = [
            row[0]
            for i in range(runs)
            for row in conn.execute(
                "select run_id from pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i}))
            )
        ]
        [(worker_id, queue)] = conn.execute(
            "select worker_id, queue_name from pgflow.workers"
        ).fetchall()

    def finished(conn: psycopg.Connection[Any]) -> bool:
        # By run id: a scan for started runs would read the whole history.
        row = conn.execute(
            "select count(*) from pgflow.runs where run_id = any(%s) and status = 'started'",
            (run_ids,),
        ).fetchone()
        return row == (0,)

    claims: list[float] = []
    loop = engine_loop("read_and_claim", Route(queue, None, worker_id), batch, claims, finished)
    with psycopg.connect(url, autocommit=True) as conn:  # in this process: claims are kept here
        started = time.perf_counter()
        done = loop(conn)
        return done / (time.perf_counter() - started), claims


def dead_tuples(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("select pg_stat_force_next_flush()")
        row = conn.execute(
            "select sum(n_dead_tup) from pg_stat_user_tables where schemaname = 'pgflow'"
        ).fetchone()
    return int(row[0] or 0) if row else 0


@contextmanager
def chain_database(admin: str, other_flows: int = 0) -> Iterator[str]:
    """A fresh database with the engine, `other_flows` step-queued flows of 5 steps, and the
    chain of `engine_throughput.py` with its one worker registered."""
    with fresh_database(admin) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
            many_flows(conn, other_flows)
            define_chain(conn, 1, step_queues=False)
        yield url


def history(admin: str, runs: int, repeat: int = 3) -> list[str]:
    lines = []
    with chain_database(admin) as empty_url, chain_database(admin) as url:
        wrote = write_history(url, runs)
        ratios, fulls = [], []
        for _ in range(repeat):  # alternating, so that the machine's drift hits both alike
            empty, _ = chain_loop(empty_url, 1000)
            full, _ = chain_loop(url, 1000)
            ratios.append(full / empty)
            fulls.append(full)
        full = statistics.median(fulls)
        lines.append(
            f"history: {runs:,} finished runs written in {wrote:.0f} s; the loop (batch 10):"
            f" {full:,.0f} tasks/s, {statistics.median(ratios):.1%} of an empty database"
            f" (median of {repeat}; per repeat {', '.join(f'{r:.1%}' for r in ratios)})"
        )
        lines.extend(prune_under_load(url, full, PRUNE_BATCH))
        write_history(url, runs)
        lines.extend(prune_under_load(url, full, None))
        after = dead_tuples(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("vacuum")
        lines.append(
            f"  dead tuples in pgflow's tables after pruning {after:,}, after a VACUUM"
            f" {dead_tuples(url):,}"
        )
    return lines


PRUNE_BATCH = 10_000  # pgflow-gen prune's default


def prune_under_load(url: str, baseline: float, batch: int | None) -> list[str]:
    """Prune the history (in calls of `batch` runs, as `pgflow-gen prune` does, or in one call)
    while the loop runs: its throughput against `baseline` and its claims' times."""
    pruned: dict[str, Any] = {"calls": 0, "runs": 0}

    def prune() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.perf_counter()
            done = False
            while not done:
                row = conn.execute(
                    "select pgflow.prune_data_older_than('1 hour', %s)", (batch,)
                ).fetchone()
                assert row is not None
                pruned["calls"] += 1
                pruned["runs"] += row[0]["runs"]
                done = row[0]["done"]
            pruned["seconds"] = time.perf_counter() - started

    pruning = threading.Thread(target=prune)
    pruning.start()
    during, claims = chain_loop(url, 3000)
    pruning.join()
    how = "in one call" if batch is None else f"in calls of {batch:,} runs"
    return [
        f"  pruning it {how} ({pruned['runs']:,} runs, {pruned['calls']:,} call(s)) took"
        f" {pruned['seconds']:.1f} s; the loop meanwhile {during:,.0f} tasks/s"
        f" ({during / baseline:.1%} of the loop with the history); claims p99"
        f" {1000 * percentile(claims, 99):.1f} ms, longest {1000 * max(claims):.1f} ms"
    ]


# 3. Many flows


def many_flows(conn: psycopg.Connection[Any], flows: int) -> None:
    shape = {
        "steps": [
            {
                "slug": f"s{index}",
                "stepType": "single",
                "dependencies": [f"s{index - 1}"] if index else [],
                "whenUnmet": "skip",
                "whenExhausted": "fail",
                "requiredInputPattern": {"defined": False},
                "forbiddenInputPattern": {"defined": False},
            }
            for index in range(5)
        ]
    }
    for number in range(flows):
        slug = f"other{number}"
        route_map = [{"stepSlug": f"s{i}", "queueName": f"{slug}__s{i}"} for i in range(5)]
        conn.execute(
            "select pgflow.ensure_flow_compiled(%s, %s, 'step', %s)",
            (slug, Jsonb(shape), Jsonb(route_map)),
        )


def breadth(admin: str, flows: int) -> str:
    with chain_database(admin) as url:
        alone, _ = chain_loop(url, 1000)
    started = time.perf_counter()
    with chain_database(admin, flows) as url:
        compiled = time.perf_counter() - started
        with psycopg.connect(url, autocommit=True) as conn:
            queues = count(conn, "select count(*) from pgmq.meta")
        among, _ = chain_loop(url, 1000)
    return (
        f"breadth: {flows} more flows ({queues:,} queues, set up in {compiled:.0f} s); the loop"
        f" {among:,.0f} tasks/s, {among / alone:.1%} of {alone:,.0f} with one flow"
    )


# 4. Many idle workers


def server_cpu(conn: psycopg.Connection[Any]) -> float:
    """CPU seconds of every process of the server (the postmaster's children and itself)."""
    row = conn.execute("select pg_postmaster_start_time(), pg_backend_pid()").fetchone()
    assert row is not None
    me = row[1]
    parent = int(Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[1])
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == parent or int(fields[1]) == parent:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def idle(url: str, count_workers: int, seconds: float = 20.0) -> str:
    migrated(url)
    modules = [CHAIN[i % len(CHAIN)] for i in range(count_workers)]
    with workers(url, *modules), psycopg.connect(url, autocommit=True) as conn:
        time.sleep(3)  # let startup settle before the measured window
        dbname = conn.info.dbname

        def commits() -> int:
            conn.execute("select pg_stat_clear_snapshot()")
            return count(
                conn, "select xact_commit from pg_stat_database where datname = %s", dbname
            )

        before_cpu, before = server_cpu(conn), commits()
        time.sleep(seconds)  # the measured idle window
        after_cpu, after = server_cpu(conn), commits()
    own = 6  # this function's own statements inside the window
    return (
        f"idle: {count_workers} idle workers cost the database"
        f" {100 * (after_cpu - before_cpu) / seconds:.2f} % of a core and"
        f" {max(0, after - before - own) / seconds:.1f} transactions/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", nargs="+", default=["fanout", "history", "breadth", "idle"],
        choices=["fanout", "history", "breadth", "idle"],
    )  # fmt: skip
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--flows", type=int, default=500)
    parser.add_argument("--idle-workers", type=int, default=50)
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    print("durable (server defaults)" if args.durable else "fast settings", flush=True)
    with server(args.durable) as admin:
        if "fanout" in args.only:
            with fresh_database(admin) as url:
                chain, _ = throughput(url, 1500)
            with fresh_database(admin) as url:
                figures = fanout(url, args.elements)
            with fresh_database(admin) as url:
                cost = fanout_benchmark.fan_out(url, args.elements, "statement_trigger")
            with fresh_database(admin) as url:
                send_batch = fanout_benchmark.send_batch(url, args.elements)
            print(f"fanout of {args.elements:,} elements:", flush=True)
            for name, value in figures.items():
                print(f"  {name}: {value:,.1f}", flush=True)
            print(
                f"  the fan-out's complete_task alone (fanout.py): {1000 * cost:,.1f} ms,"
                f" {cost / send_batch:.1f}x a pgmq.send_batch of as many ({1000 * send_batch:,.1f}"
                " ms)",
                flush=True,
            )
            print(f"  baseline, the 3-step chain with a worker per step: {chain:,.0f} tasks/s")
        if "history" in args.only:
            for line in history(admin, args.history):
                print(line, flush=True)
        if "breadth" in args.only:
            print(breadth(admin, args.flows), flush=True)
        if "idle" in args.only:
            with fresh_database(admin) as url:
                print(idle(url, args.idle_workers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
