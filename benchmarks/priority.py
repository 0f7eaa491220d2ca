"""Run priority (engine 0031): does an urgent run overtake a backlog, and what do priorities cost
the backlog's throughput?

Each repeat, on fresh databases of one server: raw PGMQ (send + read + archive, in batches of
--batch) as the yardstick, then BACKLOG runs of the 3-step chain of `engine_throughput.py`
(their first tasks queued before any worker reads) drained by one worker with read_and_claim
and complete_tasks in batches of --batch, in four settings:

- `0030, backlog`: the engine before priorities (the released migrations up to 0030): today's;
- `0031, backlog`: the same on engine 0031, every run at priority 0;
- `0031, backlog + urgent`: the same, and one run with priority 10 started after the backlog;
  the batches that claimed its steps are printed (its first step must be in the first batch,
  each later step in the batch after its dependency completed);
- `0031, all prioritised`: every run of the backlog at priority 1, so that every claim reads
  through the queue's index of prioritised messages first.

Then --starts plain `start_flow` calls (no priority, one transaction each) on 0030 and on 0031.

Rates are tasks per second over the whole drain, with the ratio to raw PGMQ measured in the
same repeat, and the server's CPU time per task (every server process, as `engine_throughput.py`
counts it: steadier than the rate on a shared machine). Every repeat is printed, then the
medians. The settings take turns to go first (each repeat starts one later), and each drain
starts after a checkpoint.

    .venv/bin/python benchmarks/priority.py [--backlog 5000] [--batch 10] [--repeat 3]
        [--starts 2000] [--durable]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import (
    CLAIMED,
    FLOW,
    complete,
    define_chain,
    fresh_database,
    raw_pgmq,
    server,
    server_cpu,
)
from pgflow_gen.runtime import migrations

SETTINGS = ("0030, backlog", "0031, backlog", "0031, backlog + urgent", "0031, all prioritised")
URGENT_PRIORITY = 10
CHUNK = 1000


@dataclass(frozen=True)
class Drain:
    """Tasks per second over the drain, the server's CPU time per task in us (None when its
    processes cannot be read from here), and the batches (from 1) that claimed the urgent run's
    steps, in step order (empty without an urgent run)."""

    rate: float
    server_us: float | None
    urgent_batches: list[int]


def drain(url: str, engine: str, backlog: int, batch: int, setting: str) -> Drain:
    """Start `backlog` runs (and the urgent one) on engine `engine`, then drain them."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, target=engine)
        [route] = define_chain(conn, 1, False)
        priority = 1 if setting == "0031, all prioritised" else 0
        for first in range(0, backlog, CHUNK):
            inputs = [Jsonb({"i": i}) for i in range(first, min(first + CHUNK, backlog))]
            if priority:
                conn.execute(
                    "select 1 from pgflow.start_flows(%s, %s::jsonb[], priority => %s)",
                    (FLOW, inputs, priority),
                )
            else:
                conn.execute("select 1 from pgflow.start_flows(%s, %s::jsonb[])", (FLOW, inputs))
        urgent = None
        if setting == "0031, backlog + urgent":
            row = conn.execute(
                "select run_id from pgflow.start_flow(%s, %s, priority => %s)",
                (FLOW, Jsonb({"i": -1}), URGENT_PRIORITY),
            ).fetchone()
            assert row is not None
            urgent = row[0]
        conn.execute("checkpoint")  # no dirty pages of the setup (or an earlier drain) left
        batches: dict[str, int] = {}
        tasks_done = 0
        number = 0
        cpu_before = server_cpu(conn)
        started = time.perf_counter()
        while True:
            tasks = conn.execute(
                CLAIMED + "pgflow.read_and_claim(%s, %s, %s, %s, 30, %s)",
                (FLOW, route.queue, route.worker_id, batch, route.step),
            ).fetchall()
            if not tasks:
                break
            number += 1
            for task in tasks:
                if task[0] == urgent:
                    batches[task[1]] = number
            complete(conn, tasks)
            tasks_done += len(tasks)
        seconds = time.perf_counter() - started
        cpu_after = server_cpu(conn)
        finished = conn.execute(
            "select count(*) from pgflow.runs where status = 'completed'"
        ).fetchone()
    runs = backlog + (urgent is not None)
    assert finished == (runs,), f"{finished} of {runs} runs completed"
    assert tasks_done == 3 * runs
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Drain(
        tasks_done / seconds,
        None if cpu is None else cpu / tasks_done * 1e6,
        [batches[step] for step in ("one", "two", "three") if urgent],
    )


def single_starts(url: str, engine: str, runs: int) -> float:
    """Runs per second of `runs` plain `start_flow` calls without a priority (one transaction
    each, as a client starting runs one by one) on engine `engine`."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, target=engine)
        define_chain(conn, 1, False)
        conn.execute("checkpoint")
        started = time.perf_counter()
        for i in range(runs):
            conn.execute("select 1 from pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i})))
        return runs / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=5000, help="runs queued before the drain")
    parser.add_argument("--batch", type=int, default=10, help="tasks a claim asks for")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--starts", type=int, default=2000, help="plain start_flow calls timed on each engine"
    )
    parser.add_argument("--durable", action="store_true", help="server defaults (fsync on)")
    args = parser.parse_args(argv)
    cpu_us: dict[str, list[float | None]] = {name: [] for name in SETTINGS}
    rates: dict[str, list[float]] = {
        name: [] for name in ("raw", *SETTINGS, "start_flow 0030", "start_flow 0031")
    }
    with server(args.durable) as admin_url:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            version = conn.execute("show server_version").fetchone()
        settings = "durable (server defaults)" if args.durable else "fast settings"
        print(
            f"PostgreSQL {version[0] if version else '?'}, {args.backlog} runs x 3 steps,"
            f" batch {args.batch}, {settings}"
        )
        for repeat in range(1, args.repeat + 1):
            with fresh_database(admin_url) as url:
                raw = raw_pgmq(url, 3 * args.backlog, args.batch).rate
            rates["raw"].append(raw)
            line = [f"repeat {repeat}: raw PGMQ {raw:,.0f} msg/s"]
            # Each repeat starts one setting later, so no setting always follows the same one.
            shift = (repeat - 1) % len(SETTINGS)
            for setting in SETTINGS[shift:] + SETTINGS[:shift]:
                engine = "0030" if setting.startswith("0030") else "0031"
                with fresh_database(admin_url) as url:
                    result = drain(url, engine, args.backlog, args.batch, setting)
                rates[setting].append(result.rate)
                cpu_us[setting].append(result.server_us)
                urgent = (
                    f" (urgent run's steps in batches {', '.join(map(str, result.urgent_batches))})"
                    if result.urgent_batches
                    else ""
                )
                cpu = (
                    ""
                    if result.server_us is None
                    else f", {result.server_us:,.0f} us server CPU each"
                )
                line.append(
                    f"  {setting:<24} {result.rate:7,.0f} tasks/s,"
                    f" {result.rate / raw:6.1%} of raw{cpu}{urgent}"
                )
            for engine in ("0030", "0031")[:: -1 if repeat % 2 else 1]:
                with fresh_database(admin_url) as url:
                    rate = single_starts(url, engine, args.starts)
                rates[f"start_flow {engine}"].append(rate)
                line.append(f"  start_flow on {engine}       {rate:7,.0f} runs/s, one call per run")
            print("\n".join(line), flush=True)
    print("median of the repeats' ratios to raw PGMQ, and to 0030's backlog in the same repeat:")
    for setting in SETTINGS:
        to_raw = statistics.median(
            r / raw for r, raw in zip(rates[setting], rates["raw"], strict=True)
        )
        to_today = statistics.median(
            r / today for r, today in zip(rates[setting], rates["0030, backlog"], strict=True)
        )
        known = [us for us in cpu_us[setting] if us is not None]
        cpu = f", {statistics.median(known):,.0f} us server CPU a task" if known else ""
        print(f"  {setting:<24} {to_raw:6.1%} of raw, {to_today:5.2f}x 0030's backlog{cpu}")
    starts = statistics.median(
        new / old
        for new, old in zip(rates["start_flow 0031"], rates["start_flow 0030"], strict=True)
    )
    print(f"  start_flow on 0031        {starts:5.2f}x 0030's rate in the same repeat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
