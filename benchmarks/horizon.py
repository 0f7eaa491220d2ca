"""A pinned horizon under steady traffic, and what the server waits on.

    .venv/bin/python benchmarks/horizon.py [--rate 400] [--clients 4] [--phase-s 60] [--durable]

The 3-step chain of `e2e.py` (`benchChain`, real worker processes from the generated entry
files, one per step) while CLIENTS clients (an application's connections) start RATE runs per
second together, one `start_flow` call and transaction each, through three phases of PHASE_S
seconds:

1. before: nothing else runs;
2. pinned: another session holds a transaction open with a transaction id, so vacuum can
   remove no row version that dies meanwhile (the long report, the forgotten `BEGIN`);
3. after: that transaction has committed.

Per phase: runs started and the start rate reached, the backlog at its end (runs started and
not yet completed) and its largest value (sampled every second), the claim latency p50 and p99
(a task's claim minus the moment it became ready: its run's start for the first step, its
dependency's completion for the others; by the phase its run started in), the dead row
versions in the engine's and the queues' tables at its end, what one read of the first step's
queue costs then (buffers and time, from EXPLAIN ANALYZE), and what the server's active
backends waited on: pg_stat_activity sampled every 10 ms, each wait event's share of the
samples (`CPU` is a backend on the CPU). `Lock:object` is the database-wide lock a
transaction that sent a NOTIFY holds from before its commit record until its commit is done.
Then how long the backlog took to drain.

Uses a fresh embedded PostgreSQL (fast settings; `--durable` the server's defaults) and a fresh
database, or PGFLOW_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.e2e import CHAIN, count, migrated, percentile, until, workers
from benchmarks.engine_throughput import fresh_database, server

PHASES = ("before", "pinned", "after")
#: How often the wait events are sampled.
SAMPLE_S = 0.01


@dataclass
class Phase:
    name: str
    first: int = 0  # the input `i` of the phase's first run
    runs: int = 0
    seconds: float = 0.0
    backlog_end: int = 0
    backlog_max: int = 0
    dead: int = 0
    read: tuple[int, float] = (0, 0.0)
    waits: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        samples = sum(self.waits.values())
        top = ", ".join(
            f"{event} {100 * n / samples:.1f} %" for event, n in self.waits.most_common(6)
        )
        lock = 100 * self.waits["Lock:object"] / samples if samples else 0.0
        lat = self.latencies
        return [
            f"{self.name}: {self.runs:,} runs started at {self.runs / self.seconds:,.0f}/s;"
            f" backlog at the end {self.backlog_end:,} runs, at most {self.backlog_max:,};"
            f" claim latency p50 {percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms;"
            f" dead row versions {self.dead:,}; a read of the first step's queue then walked"
            f" {self.read[0]:,} buffers in {self.read[1]:.2f} ms",
            f"  waits ({samples:,} samples of active backends): Lock:object {lock:.1f} %; {top}",
        ]


class Sampler(threading.Thread):
    """Counts the wait events of the database's active backends into the current phase's
    counter, every SAMPLE_S, until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="wait-sampler")
        self.url = url
        self.into: Counter[str] | None = None
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.wait(SAMPLE_S):
                    rows = conn.execute(
                        "select coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                        " from pg_stat_activity"
                        " where datname = current_database() and state = 'active'"
                        " and pid <> pg_backend_pid()"
                    ).fetchall()
                    if self.into is not None:
                        self.into.update(row[0] for row in rows)
        except BaseException as exc:  # reported by the main thread, not lost with the thread
            self.error = exc


class Starter(threading.Thread):
    """One of the clients that start runs of benchChain, one start_flow call each: together
    they start run i (its input's `i`) i / `rate` seconds after they began, until stopped
    (a client that falls behind starts the next run at once)."""

    def __init__(self, url: str, clock: Clock) -> None:
        super().__init__(name="starter")
        self.url = url
        self.clock = clock
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while (i := self.clock.next()) is not None:
                    conn.execute("select pgflow.start_flow('benchChain', %s)", (Jsonb({"i": i}),))
                    self.clock.done()
        except BaseException as exc:  # reported by the main thread, not lost with the thread
            self.error = exc
            self.clock.stopping.set()


class Clock:
    """Hands the starters the number of the next run when it is due; `started` counts the
    runs whose start_flow returned."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.began = time.perf_counter()
        self.stopping = threading.Event()
        self.started = 0
        self._next = 0
        self._lock = threading.Lock()

    def next(self) -> int | None:
        with self._lock:
            i, self._next = self._next, self._next + 1
        wait = self.began + i / self.rate - time.perf_counter()
        if wait > 0:
            self.stopping.wait(wait)  # the arrival rate of the measurement, not a synchronisation
        return None if self.stopping.is_set() else i

    def done(self) -> None:
        with self._lock:
            self.started += 1


def unfinished(conn: psycopg.Connection[Any], started: int) -> int:
    done = count(conn, "select count(*) from pgflow.runs where status = 'completed'")
    return started - done


def dead_rows(conn: psycopg.Connection[Any]) -> int:
    return count(
        conn,
        "select coalesce(sum(n_dead_tup), 0) from pg_stat_user_tables"
        " where schemaname in ('pgflow', 'pgmq')",
    )


def read_cost(conn: psycopg.Connection[Any]) -> tuple[int, float]:
    """(buffers, ms) of the read a claim makes on the first step's queue (PGMQ's: the oldest
    visible messages by id, locked, skipping locked ones), with EXPLAIN ANALYZE, rolled back.
    Under a pinned horizon its index scan walks every message deleted since the pin."""
    with conn.transaction(force_rollback=True):
        plan = conn.execute(
            "explain (analyze, buffers, format json) select msg_id from pgmq.q_benchchain__one"
            " where vt <= clock_timestamp() order by msg_id limit 10 for update skip locked"
        ).fetchone()
    assert plan is not None
    top = plan[0][0]
    return int(
        top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    ), float(top["Execution Time"])


def claim_latencies(conn: psycopg.Connection[Any], first: int, last: int) -> list[float]:
    """Milliseconds from each task's becoming ready to its claim, for runs `first` <= i < `last`."""
    rows = conn.execute(
        "select extract(epoch from (t.started_at - coalesce(d.completed_at, r.started_at))) * 1000"
        " from pgflow.runs as r"
        " join pgflow.step_tasks as t on t.run_id = r.run_id"
        " left join pgflow.deps as dep"
        " on dep.flow_slug = t.flow_slug and dep.step_slug = t.step_slug"
        " left join pgflow.step_tasks as d on d.run_id = t.run_id and d.step_slug = dep.dep_slug"
        " where (r.input ->> 'i')::int >= %s and (r.input ->> 'i')::int < %s",
        (first, last),
    ).fetchall()
    return [float(r[0]) for r in rows]


def measure(url: str, rate: float, phase_s: float, clients: int) -> tuple[list[Phase], float]:
    """The three phases, and the seconds the backlog took to drain after them."""
    migrated(url)
    phases = [Phase(name) for name in PHASES]
    sampler = Sampler(url)
    with (
        workers(url, *CHAIN),
        psycopg.connect(url, autocommit=True) as conn,
        psycopg.connect(url) as pin,
    ):
        clock = Clock(rate)  # counts from here, once the workers have started
        starters = [Starter(url, clock) for _ in range(clients)]
        sampler.start()
        for starter in starters:
            starter.start()
        try:
            for phase in phases:
                if phase.name == "pinned":
                    pin.execute("select pg_current_xact_id()")  # holds the horizon from here
                phase.first, sampler.into = clock.started, phase.waits
                begin = time.perf_counter()
                while (elapsed := time.perf_counter() - begin) < phase_s:
                    time.sleep(min(1.0, phase_s - elapsed))  # the sampling period of the backlog
                    phase.backlog_max = max(phase.backlog_max, unfinished(conn, clock.started))
                    if clock.stopping.is_set() or sampler.error:
                        break
                phase.seconds = time.perf_counter() - begin
                phase.runs = clock.started - phase.first
                phase.backlog_end = unfinished(conn, clock.started)
                phase.dead = dead_rows(conn)
                phase.read = read_cost(conn)
                if phase.name == "pinned":
                    pin.commit()
        finally:
            clock.stopping.set()
            for starter in starters:
                starter.join()
            sampler.into = None
            sampler.stopping.set()
            sampler.join()
        errors = [(t.name, t.error) for t in starters] + [(sampler.name, sampler.error)]
        for name, error in errors:
            if error is not None:
                raise SystemExit(f"the {name} failed: {error}")
        drain_began = time.perf_counter()
        until(lambda: unfinished(conn, clock.started) == 0, "the backlog to drain")
        drained = time.perf_counter() - drain_began
        ends = [p.first for p in phases[1:]] + [clock.started]
        for phase, end in zip(phases, ends, strict=True):
            phase.latencies = claim_latencies(conn, phase.first, end)
    return phases, drained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=400.0, help="runs started per second")
    parser.add_argument(
        "--clients", type=int, default=4, help="clients starting runs, each on its connection"
    )
    parser.add_argument("--phase-s", type=float, default=60.0, help="seconds per phase")
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    args = parser.parse_args(argv)
    print(
        f"{'durable (server defaults)' if args.durable else 'fast settings'}: benchChain at"
        f" {args.rate:g} runs/s by {args.clients} clients, {args.phase_s:g} s per phase,"
        " 3 worker processes",
        flush=True,
    )
    with server(args.durable) as admin, fresh_database(admin) as url:
        phases, drained = measure(url, args.rate, args.phase_s, args.clients)
    for phase in phases:
        print("\n".join(phase.lines()))
    print(f"drained {drained:.1f} s after the last phase")
    return 0


if __name__ == "__main__":
    sys.exit(main())
