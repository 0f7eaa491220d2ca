"""Table triggers (engine 0032): what does a run started by a write cost the write?

Each repeat, on fresh databases of one server, ORDERS orders are written one transaction each
(as an application writes them), over one connection, five ways:

- `insert`: the order's insert alone (the application's own cost);
- `insert + pgmq.send`: the insert and a raw PGMQ message in the same transaction, the
  yardstick (what a hand-made outbox costs);
- `insert + start_flow`: the insert and an explicit `start_flow` in the same transaction (a
  start in the application's transaction, `start_flow(..., connection=conn)`);
- `insert, trigger starts`: the insert alone, with a table trigger of the flow (`when`
  passes) starting the run;
- `insert, trigger skips`: the same trigger, its `when` failing for every row (what a trigger
  costs the writes that start nothing).

The flow is one step (its first task queued on start). Rates are orders per second, with the
ratio to `insert + pgmq.send` measured in the same repeat. The ways take turns going first, each
starts after a checkpoint, every repeat is printed, then the medians.

    .venv/bin/python benchmarks/table_triggers.py [--orders 3000] [--repeat 3] [--durable]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import fresh_database, server
from pgflow_gen.runtime import migrations

WAYS = (
    "insert",
    "insert + pgmq.send",
    "insert + start_flow",
    "insert, trigger starts",
    "insert, trigger skips",
)
YARDSTICK = "insert + pgmq.send"
FLOW = "benchOrder"
INSERT = "insert into public.orders (customer, total, status) values (%s, %s, %s) returning id"


def prepare(conn: psycopg.Connection[tuple[object, ...]], way: str) -> None:
    """The orders table, the queue or the flow the way needs, and its trigger."""
    migrations.ensure_pgmq(conn)
    migrations.migrate(conn)
    conn.execute(
        "create table public.orders (id bigint generated always as identity primary key,"
        " customer text not null, total numeric not null, status text not null)"
    )
    conn.execute("select pgmq.create('raw')")
    conn.execute("select pgflow.create_flow(%s)", (FLOW,))
    conn.execute("select pgflow.add_step(%s, 'confirm')", (FLOW,))
    if way.startswith("insert, trigger"):
        trigger = {
            "name": "placed",
            "table": "public.orders",
            "when": {"status": {"eq": "placed"}},
            "input": {"order_id": "id", "customer": "customer", "total": "total"},
        }
        conn.execute("select pgflow.set_flow_triggers(%s, %s)", (FLOW, Jsonb([trigger])))


def write(url: str, way: str, orders: int) -> float:
    """Orders per second of `orders` one-transaction writes, the way `way` says."""
    with psycopg.connect(url, autocommit=True) as conn:
        prepare(conn, way)
        status = "draft" if way == "insert, trigger skips" else "placed"
        conn.execute("checkpoint")
        started = time.perf_counter()
        for i in range(orders):
            with conn.transaction():
                row = conn.execute(INSERT, (f"c{i}", i, status)).fetchone()
                assert row is not None
                order = {"order_id": row[0], "customer": f"c{i}", "total": i}
                if way == "insert + pgmq.send":
                    conn.execute("select pgmq.send('raw', %s)", (Jsonb(order),))
                elif way == "insert + start_flow":
                    conn.execute("select 1 from pgflow.start_flow(%s, %s)", (FLOW, Jsonb(order)))
        seconds = time.perf_counter() - started
        runs = conn.execute("select count(*) from pgflow.runs").fetchone()
    expected = orders if way in ("insert + start_flow", "insert, trigger starts") else 0
    assert runs == (expected,), f"{way}: {runs} runs, {expected} expected"
    return orders / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=3000, help="orders written each way")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--durable", action="store_true", help="server defaults (fsync on)")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    with server(args.durable) as admin_url:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            version = conn.execute("show server_version").fetchone()
        settings = "durable (server defaults)" if args.durable else "fast settings"
        print(
            f"PostgreSQL {version[0] if version else '?'}, {args.orders} orders, one transaction"
            f" each, {settings}"
        )
        for repeat in range(1, args.repeat + 1):
            shift = (repeat - 1) % len(WAYS)
            for way in WAYS[shift:] + WAYS[:shift]:
                with fresh_database(admin_url) as url:
                    rates[way].append(write(url, way, args.orders))
            line = [f"repeat {repeat}:"]
            raw = rates[YARDSTICK][-1]
            for way in WAYS:
                rate = rates[way][-1]
                line.append(f"  {way:<24} {rate:7,.0f} orders/s, {rate / raw:6.1%} of {YARDSTICK}")
            print("\n".join(line), flush=True)
    print(f"median of the repeats' ratios to {YARDSTICK} in the same repeat:")
    for way in WAYS:
        ratio = statistics.median(
            r / raw for r, raw in zip(rates[way], rates[YARDSTICK], strict=True)
        )
        print(f"  {way:<24} {ratio:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
