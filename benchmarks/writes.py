"""Rows written, dead row versions, table growth and WAL per run and per task, for raw PGMQ and
two engine versions side by side on one server.

Raw PGMQ sends, reads and archives one message per "run". Each engine version gets a fresh
database with a one-step flow or the 3-step chain of `engine_throughput.py`, `--runs` runs started
one `start_flow` at a time, then one worker drives every task through `complete_and_claim` in
batches of `--batch`, as a busy worker does. Counted from `pg_stat_user_tables` (the tables of
schemas `pgflow` and `pgmq`, a queue's `q_` and `a_` tables summed over queues) around the starts
and the work:

- inserts, updates (of which HOT) and deletes per run, and per table with `--tables`;
- dead row versions made (every update and every delete leaves one);
- table growth (`pg_total_relation_size` of those tables, indexes and TOAST included) and WAL
  per run.

    .venv/bin/python benchmarks/writes.py [--steps 1 3] [--batch 1 10] [--runs 2000]
        [--against 0024] [--durable] [--tables] [--keyed]

Fast settings by default (fsync, synchronous_commit and full_page_writes off); `--durable` the
server's defaults. `--keyed` gives every step a concurrency key whose limit no run reaches (what
a keyed task writes besides: its parked row, its key's events and count). Writes do not depend
on the machine's speed, so one repeat says it all; autovacuum may run during a measurement and
shrink growth, never the counts.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks import engine_throughput as et
from pgflow_gen.runtime import migrations

#: The counters read per table: inserts, updates, HOT updates, deletes.
COUNTERS = ("ins", "upd", "hot", "del")

TABLE_STATS = """
select case
    when schemaname = 'pgmq' and relname like 'q\\_%' then 'pgmq.q_<queue>'
    when schemaname = 'pgmq' and relname like 'a\\_%' then 'pgmq.a_<queue>'
    else schemaname || '.' || relname
  end,
  sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_hot_upd), sum(n_tup_del),
  sum(pg_total_relation_size(relid))
from pg_stat_user_tables
where schemaname in ('pgflow', 'pgmq')
group by 1
"""


@dataclass
class Snapshot:
    """Per table: the counters and the bytes; and the server's WAL position."""

    tables: dict[str, tuple[int, ...]]
    wal: int


@dataclass
class Measured:
    """What one loop wrote, per run."""

    name: str
    runs: int
    tasks: int
    tables: dict[str, tuple[float, ...]] = field(default_factory=dict)
    wal: float = 0.0

    def total(self, counter: int) -> float:
        return sum(row[counter] for row in self.tables.values())


def snapshot(url: str) -> Snapshot:
    """The counters as of now: a fresh session, after every earlier session flushed its own."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(TABLE_STATS).fetchall()
        wal = conn.execute("select pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    return Snapshot({r[0]: tuple(int(x) for x in r[1:]) for r in rows}, int(wal[0]) if wal else 0)


def difference(name: str, before: Snapshot, after: Snapshot, runs: int, tasks: int) -> Measured:
    measured = Measured(name, runs, tasks, wal=(after.wal - before.wal) / runs)
    for table, values in after.tables.items():
        earlier = before.tables.get(table, (0,) * len(values))
        measured.tables[table] = tuple((a - b) / runs for a, b in zip(values, earlier, strict=True))
    return measured


def flushed(url: str, work: Callable[[psycopg.Connection[Any]], int]) -> int:
    """Run `work` on a connection of its own and flush its statistics before it closes (the
    flush happens before the server says it is ready for the next statement)."""
    with psycopg.connect(url, autocommit=True) as conn:
        result = work(conn)
        conn.execute("select pg_stat_force_next_flush()")
        conn.execute("select 1")
    return result


def raw(url: str, runs: int, batch: int) -> Measured:
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.ensure_pgmq(conn)
        conn.execute("select pgmq.create('raw')")
    before = snapshot(url)
    loop = et._raw_loop("raw", runs, batch)
    flushed(url, loop)
    return difference("raw PGMQ", before, snapshot(url), runs, runs)


def engine(
    url: str, name: str, target: str | None, steps: int, runs: int, batch: int, keyed: bool
) -> Measured:
    """`runs` runs of a chain of `steps` steps on engine `target` (None: the latest), every step
    keyed with `keyed`."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn, target=target)
        conn.execute("select pgflow.create_flow(%s)", (et.FLOW,))
        previous: list[str] = []
        for step in et.STEPS[:steps]:
            conn.execute("select pgflow.add_step(%s, %s, %s)", (et.FLOW, step, previous))
            previous = [step]
        if keyed:
            et.key_every_step(conn)
        route = et.Route(et.FLOW.lower(), None, uuid.uuid4())
        conn.execute(
            "select pgflow.register_worker(%s, %s, 'bench', %s, null)",
            (route.worker_id, route.queue, et.FLOW),
        )
    before = snapshot(url)

    def start(conn: psycopg.Connection[Any]) -> int:
        for i in range(runs):
            conn.execute("select pgflow.start_flow(%s, %s)", (et.FLOW, Jsonb({"i": i})))
        return runs

    flushed(url, start)
    tasks = flushed(url, et.engine_loop("complete_and_claim", route, batch))
    after = snapshot(url)
    with psycopg.connect(url, autocommit=True) as conn:
        completed = conn.execute(
            "select count(*) from pgflow.runs where status = 'completed'"
        ).fetchone()
    assert completed == (runs,), f"{name}: only {completed} of {runs} runs completed"
    return difference(name, before, after, runs, tasks)


def line(measured: Measured, steps: int) -> str:
    ins, upd, hot, dele = (measured.total(i) for i in range(4))
    growth = measured.total(4)
    per_task = steps if measured.name != "raw PGMQ" else 1
    return (
        f"  {measured.name:>12}: {ins:5.2f} ins, {upd:5.2f} upd ({hot:5.2f} HOT), {dele:5.2f} del;"
        f" {upd + dele:5.2f} dead; {growth:7,.0f} B growth, {measured.wal:7,.0f} B WAL"
        f" a run ({(ins + upd + dele) / per_task:5.2f} rows, {measured.wal / per_task:6,.0f} B WAL"
        " a task)"
    )


def tables(measured: Measured) -> list[str]:
    rows = []
    for table, values in sorted(measured.tables.items()):
        if any(values[:4]):
            counts = ", ".join(f"{c} {v:.2f}" for c, v in zip(COUNTERS, values, strict=False))
            rows.append(f"      {table:<28} {counts}; {values[4]:,.0f} B growth")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 3], choices=[1, 2, 3])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--against", default="0024", help="the earlier engine version")
    parser.add_argument("--durable", action="store_true", help="the server's default settings")
    parser.add_argument("--tables", action="store_true", help="print the counts per table")
    parser.add_argument("--keyed", action="store_true", help="every step keyed (never full)")
    args = parser.parse_args(argv)
    print(
        f"{args.runs} runs, {'durable' if args.durable else 'fast'} server,"
        f" engine {args.against} against the latest"
        f"{', every step keyed' if args.keyed else ''}; per run (per task)",
        flush=True,
    )
    with et.server(durable=args.durable) as admin:
        for steps in args.steps:
            for batch in args.batch:
                print(f"{steps}-step flow, batch {batch}:", flush=True)
                results = []
                with et.fresh_database(admin) as url:
                    results.append(raw(url, args.runs, batch))
                for name, target in ((args.against, args.against), ("latest", None)):
                    with et.fresh_database(admin) as url:
                        results.append(
                            engine(url, name, target, steps, args.runs, batch, args.keyed)
                        )
                for measured in results:
                    print(line(measured, steps), flush=True)
                    if args.tables:
                        print("\n".join(tables(measured)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
