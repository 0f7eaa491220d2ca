"""Per-call time of the claim paths on two engine versions, side by side on one server.

An earlier engine version (`--against`, default 0019) and the latest one each get a fresh database
on one embedded server, with the same runs of `engine_throughput.py`'s 3-step chain queued; then
one client drives both, one task at a time (`--batch N`: N at a time), in alternating chunks of
100 calls (ABBA, so drift in this shared machine's speed falls on both alike), and prints each
version's time per call as Python sees it and its backend's CPU time per call (from `/proc`),
for each repeat:

    .venv/bin/python benchmarks/engine_per_call.py [--loop complete_and_claim|read_and_claim]
        [--against 0019] [--runs 3000] [--repeat 2] [--batch 1] [--keyed] [--durable]
        [--database-settings]

`complete_and_claim` reports a task and claims the next in one call, as a busy worker does;
`read_and_claim` claims with one call and reports with `complete_task` (`complete_tasks` for a
batch), as a worker with a lone result does (both calls are timed together). `--keyed` gives
every step a concurrency key whose limit no run reaches, as `engine_throughput.py --keyed` does.
`--database-settings` sets `pgflow.live_within` on each database (`alter database ... set`), the
case where the engine must tell the database's liveness settings from a session's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from benchmarks import engine_throughput as et
from pgflow_gen.runtime import migrations

#: Calls per version before the other version's turn.
CHUNK = 100

COMPLETE_AND_CLAIM = (
    et.CLAIMED + "pgflow.complete_and_claim(%s, %s, %s, %s, 30, null,"
    " %s, %s, %s, %s::jsonb[], %s::int[])"
)
READ_AND_CLAIM = et.CLAIMED + "pgflow.read_and_claim(%s, %s, %s, %s, 30, null)"


@dataclass
class Version:
    """One engine version's database, its client connection, and what was measured on it."""

    name: str
    conn: psycopg.Connection[Any]
    route: et.Route
    batch: int
    tasks: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu_per_call: list[float] = field(default_factory=list)


def prepare(url: str, name: str, target: str | None, args: argparse.Namespace) -> Version:
    """A database migrated to `target` (None: the latest) with `args.runs` runs of the chain
    queued (keyed with `args.keyed`)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if args.database_settings:
            conn.execute(
                sql.SQL("alter database {} set pgflow.live_within = '15s'").format(
                    sql.Identifier(conn.info.dbname)
                )
            )
    conn = psycopg.connect(url, autocommit=True)
    migrations.migrate(conn, target=target)
    (route,) = et.define_chain(conn, 1, False)
    if args.keyed:
        et.key_every_step(conn)
    for i in range(args.runs):
        conn.execute("select pgflow.start_flow(%s, %s)", (et.FLOW, Jsonb({"i": i})))
    version = Version(name, conn, route, args.batch)
    version.tasks = conn.execute(READ_AND_CLAIM, selector(version)).fetchall()
    return version


def selector(version: Version) -> tuple[Any, ...]:
    return (et.FLOW, version.route.queue, version.route.worker_id, version.batch)


def complete_and_claim(version: Version) -> list[Any]:
    return version.conn.execute(
        COMPLETE_AND_CLAIM, (*selector(version), *et._columns(version.tasks))
    ).fetchall()


def read_and_claim(version: Version) -> list[Any]:
    et.complete(version.conn, version.tasks)
    return version.conn.execute(READ_AND_CLAIM, selector(version)).fetchall()


LOOPS: dict[str, Callable[[Version], list[Any]]] = {
    "complete_and_claim": complete_and_claim,
    "read_and_claim": read_and_claim,
}


def chunk(version: Version, call: Callable[[Version], list[Any]]) -> None:
    before = et.backend_cpu(version.conn)
    for _ in range(CHUNK):
        started = time.perf_counter()
        version.tasks = call(version)
        version.seconds.append(time.perf_counter() - started)
        assert version.tasks, f"{version.name}: no task left to claim"
    after = et.backend_cpu(version.conn)
    if before is not None and after is not None:
        version.cpu_per_call.append((after - before) / CHUNK)


def measure(args: argparse.Namespace) -> list[Version]:
    call = LOOPS[args.loop]
    with (
        et.server(durable=args.durable) as admin,
        et.fresh_database(admin) as older_url,
        et.fresh_database(admin) as newer_url,
    ):
        versions = [
            prepare(older_url, args.against, args.against, args),
            prepare(newer_url, "latest", None, args),
        ]
        try:
            # Every task of the chain but the last claimed batch, in whole chunks.
            for round_ in range((args.runs * 3 - args.batch) // (CHUNK * args.batch)):
                order = versions if round_ % 4 in (0, 3) else versions[::-1]
                for version in order:
                    chunk(version, call)
        finally:
            for version in versions:
                version.conn.close()
    return versions


def report(version: Version) -> str:
    seconds = sorted(version.seconds)
    cpu = version.cpu_per_call
    server = f", server CPU {statistics.fmean(cpu) * 1e6:,.0f} us a call" if cpu else ""
    return (
        f"{version.name:>7}: {len(seconds):,} calls, median {statistics.median(seconds) * 1e6:,.0f}"
        f" us, mean {statistics.fmean(seconds) * 1e6:,.0f} us,"
        f" p90 {seconds[int(len(seconds) * 0.9)] * 1e6:,.0f} us{server}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loop", choices=sorted(LOOPS), default="complete_and_claim")
    parser.add_argument("--against", default="0019", help="the earlier engine version")
    parser.add_argument("--runs", type=int, default=3000, help="runs of the 3-step chain")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="tasks claimed and completed a call")
    parser.add_argument("--keyed", action="store_true", help="every step keyed (never full)")
    parser.add_argument("--durable", action="store_true", help="the server's default settings")
    parser.add_argument("--database-settings", action="store_true")
    args = parser.parse_args(argv)
    print(
        f"{args.loop}, batch {args.batch}{', every step keyed' if args.keyed else ''},"
        f" {'durable' if args.durable else 'fast'} server,"
        f" {args.runs} runs x 3 steps, engine {args.against} against the latest"
        + (", pgflow.live_within set per database" if args.database_settings else ""),
        flush=True,
    )
    for repeat in range(1, args.repeat + 1):
        older, newer = measure(args)
        change = statistics.median(newer.seconds) / statistics.median(older.seconds) - 1
        print(f"repeat {repeat}: median change {change:+.1%}")
        print("  " + report(older))
        print("  " + report(newer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
