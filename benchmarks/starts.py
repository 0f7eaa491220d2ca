"""How fast runs start: one `pgflow.start_flow` call per run (its own transaction, as a client
starting runs one by one), the same with an idempotency key of its own per run, next to
`pgflow.start_flows` (engine 0014) with chunks of 100, 1,000 and 10,000 inputs per call, and
`Client.start_flows` (which also validates every input against the flow's input type first), in
the same run on the same server.

The flow is the 3-step chain of `engine_throughput.py` (its first step starts with each run),
RUNS runs per measurement, a fresh database each time. Prints runs/s per repeat and their
median, and each bulk rate as a multiple of the single-call rate measured in the same repeat.
pgflow 0.8.1's `start_flow` on the same chain is measured in each repeat too (its SQL from npm,
see `pgflow_reference.py`; `--no-pgflow` leaves it out), and our single start as a multiple of it.

    .venv/bin/python benchmarks/starts.py [--runs 10000] [--repeat 3] [--durable]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from typing_extensions import TypedDict

from benchmarks import pgflow_reference
from benchmarks.engine_throughput import (
    FLOW,
    STEPS,
    backend_cpu,
    define_chain,
    fresh_database,
    server,
)
from pgflow_gen.runtime import Client, Flow, Step, migrations

CHUNKS = (100, 1000, 10_000)
PGFLOW_SINGLE = "pgflow 0.8.1 start_flow, one per run"
KEYED = "start_flow with an idempotency key"
SINGLE = "start_flow, one call per run"


class ChainInput(TypedDict):
    i: int


CHAIN: Flow[Any, ChainInput, Any] = Flow(
    slug=FLOW,
    steps=tuple(
        Step(slug=step, dependencies=(STEPS[index - 1],) if index else ())
        for index, step in enumerate(STEPS)
    ),
    input_type=ChainInput,
)


def prepared(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        define_chain(conn, 1, step_queues=False)


#: Runs per second, and the server process's CPU time per run in us (None where it cannot be read).
Single = tuple[float, float | None]


def single(url: str, runs: int, keyed: bool = False) -> Single:
    """One start_flow call per run; with `keyed`, each with an idempotency key of its own (so
    each starts a run: the key's lookup and its unique index entry are the difference)."""
    prepared(url)
    return one_by_one(url, runs, keyed)


def one_by_one(url: str, runs: int, keyed: bool = False) -> Single:
    """One `pgflow.start_flow` call per run, whichever engine is there."""
    with psycopg.connect(url, autocommit=True) as conn:
        cpu = backend_cpu(conn)
        started = time.perf_counter()
        for i in range(runs):
            if keyed:
                conn.execute(
                    "select from pgflow.start_flow(%s, %s, idempotency_key => %s)",
                    (FLOW, Jsonb({"i": i}), f"order-{i}"),
                )
            else:
                conn.execute("select from pgflow.start_flow(%s, %s)", (FLOW, Jsonb({"i": i})))
        rate = runs / (time.perf_counter() - started)
        after = backend_cpu(conn)
    if cpu is None or after is None:
        return rate, None
    return rate, (after - cpu) / runs * 1e6


def pgflow_single(url: str, runs: int) -> Single:
    """pgflow's own start_flow, one call per run."""
    with psycopg.connect(url, autocommit=True) as conn:
        pgflow_reference.install(conn)
        pgflow_reference.define_chain(conn, FLOW, STEPS)
    return one_by_one(url, runs)


def bulk(url: str, runs: int, chunk: int) -> float:
    """Runs per second of start_flows with `chunk` inputs per call."""
    prepared(url)
    inputs = [Jsonb({"i": i}) for i in range(runs)]
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        for at in range(0, runs, chunk):
            conn.execute(
                "select from pgflow.start_flows(%s, %s::jsonb[])", (FLOW, inputs[at : at + chunk])
            )
        return runs / (time.perf_counter() - started)


def client(url: str, runs: int, chunk: int = 1000) -> float:
    """Runs per second of Client.start_flows, validation included, `chunk` inputs per call."""
    prepared(url)
    inputs: list[ChainInput] = [{"i": i} for i in range(runs)]
    with Client(url) as pgflow:
        started = time.perf_counter()
        for at in range(0, runs, chunk):
            pgflow.start_flows(CHAIN, inputs[at : at + chunk])
        return runs / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--durable", action="store_true", help="the server's durable defaults (fsync on)"
    )
    parser.add_argument(
        "--no-pgflow", action="store_true", help="leave out pgflow 0.8.1's start_flow"
    )
    args = parser.parse_args(argv)
    figures: dict[str, list[float]] = {}
    server_us: dict[str, list[float]] = {}

    def record(name: str, measured: Single) -> None:
        figures.setdefault(name, []).append(measured[0])
        if measured[1] is not None:
            server_us.setdefault(name, []).append(measured[1])

    if not args.no_pgflow:
        try:
            pgflow_reference.migration_files()
        except pgflow_reference.ReferenceUnavailable as error:
            print(f"pgflow left out: {error}", file=sys.stderr)
            args.no_pgflow = True
    with server(args.durable) as admin:
        print(
            f"{args.runs:,} runs per measurement, median of {args.repeat},"
            f" {'durable (server defaults)' if args.durable else 'fast settings'}",
            flush=True,
        )
        for _ in range(args.repeat):
            with fresh_database(admin) as url:
                record(SINGLE, single(url, args.runs))
            with fresh_database(admin) as url:
                record(KEYED, single(url, args.runs, keyed=True))
            if not args.no_pgflow:
                with fresh_database(admin) as url:
                    record(PGFLOW_SINGLE, pgflow_single(url, args.runs))
            for chunk in CHUNKS:
                with fresh_database(admin) as url:
                    figures.setdefault(f"start_flows, {chunk:,} per call", []).append(
                        bulk(url, args.runs, chunk)
                    )
            with fresh_database(admin) as url:
                figures.setdefault("Client.start_flows, 1,000 per call", []).append(
                    client(url, args.runs)
                )
    base = figures[SINGLE]
    for name, rates in figures.items():
        times = [r / b for r, b in zip(rates, base, strict=True)]
        print(
            f"{name:<36} {statistics.median(rates):>9,.0f} runs/s"
            f" ({statistics.median(times):5.1f}x); per repeat "
            + ", ".join(f"{r:,.0f}" for r in rates),
            flush=True,
        )
    for name, cpu in server_us.items():
        print(
            f"{name}: server CPU {statistics.median(cpu):,.0f} us per run; per repeat "
            + ", ".join(f"{c:,.0f}" for c in cpu),
            flush=True,
        )
    if PGFLOW_SINGLE in figures:
        times = [b / p for b, p in zip(base, figures[PGFLOW_SINGLE], strict=True)]
        print(
            f"start_flow against pgflow's: {statistics.median(times):.2f}x; per repeat "
            + ", ".join(f"{t:.2f}x" for t in times),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
