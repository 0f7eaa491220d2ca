"""Interleavings soak: the random walks of tests/sql/interleavings (claims, completions,
failures, crashes, stall recovery, cancels, retries, pauses, signals, stale resends) for minutes
on a fresh embedded PostgreSQL, each walk from a fresh seed, the engine's promise checked after
every action: every started run has something that will move it, and every run finishes once its
workers come back. `make test` runs 8 fixed seeds of 200 actions; this runs as many as fit.

    .venv/bin/python benchmarks/interleavings.py [--minutes 5] [--steps 200] [--seed N]

Prints a line per minute and, at the end, the walks, actions, checks and the runs' outcomes.
Exits 1 with the failing seed and its last actions if the promise breaks (replay it with
--seed N --minutes 0).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

import psycopg

from benchmarks.engine_throughput import fresh_database, server
from pgflow_gen.runtime import migrations
from tests.engine import Engine
from tests.sql.interleavings.machine import Figures, Walk, define


def soak(url: str, minutes: float, steps: int, first_seed: int) -> Figures:
    figures = Figures()
    with psycopg.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        engine = Engine(conn)
        define(engine)
        started = time.monotonic()
        next_report = started + 60
        seed = first_seed
        while True:
            Walk(engine, figures, seed).walk(steps)
            seed += 1
            now = time.monotonic()
            if now >= next_report:
                print(f"  {(now - started) / 60:4.1f} min: {_summary(figures)}", flush=True)
                next_report += 60
            if now - started >= minutes * 60:
                return figures


def _summary(figures: Figures) -> str:
    outcomes = ", ".join(f"{n:,} {status}" for status, n in sorted(figures.outcomes.items()))
    return (
        f"{figures.walks:,} walks, {figures.steps:,} actions, {figures.checks:,} checks;"
        f" runs: {outcomes}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=200, help="actions per walk")
    parser.add_argument("--seed", type=int, default=None, help="the first walk's seed")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"interleavings: {args.minutes} min, {args.steps} actions a walk, seeds from {seed}")
    began = time.monotonic()
    try:
        with server() as admin_url, fresh_database(admin_url) as url:
            figures = soak(url, args.minutes, args.steps, seed)
    except AssertionError as broken:
        print(f"BROKEN: {broken}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - began
    actions: Any = ", ".join(f"{name} {n:,}" for name, n in figures.actions.most_common())
    print(f"done in {elapsed / 60:.1f} min: {_summary(figures)}")
    print(f"actions: {actions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
