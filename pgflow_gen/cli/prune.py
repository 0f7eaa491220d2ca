"""`pgflow-gen prune --older-than AGE`: deletes finished runs (with their steps, tasks and any
message still queued for them), archived messages and silent workers older than AGE, through
`pgflow.prune_data_older_than` in batches (engine 0015), one short transaction each, with a
progress line on a terminal. It says what it will delete and asks first; `--yes` skips the
question (for a scheduler), and without a terminal to ask on it refuses rather than guess.
`--dry-run` says what would go, by flow and status, and deletes nothing; answering no prunes
nothing and is no error.

An interrupted prune keeps what its finished batches deleted; running it again goes on.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from typing import Any, TextIO

import psycopg

from pgflow_gen.cli import connecting, control, runs
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import print_json, table
from pgflow_gen.engine import operator_statements, support
from pgflow_gen.errors import UsageError
from pgflow_gen.words import counted

DEFAULT_BATCH = 10_000


def register(commands: cli_parser.Commands) -> None:
    """Add `prune` to the `pgflow-gen` parser."""
    prune = commands.add(
        "prune",
        "remove finished runs, archived messages and silent workers older than an age",
        database=True,
        formats=runs.FORMATS,
    )
    prune.add_argument(
        "--older-than",
        type=control.age,
        required=True,
        metavar="AGE",
        help="what finished (or was archived, or last heard from) longer ago than AGE goes"
        " (30s, 15m, 1h, 7d)",
    )
    prune.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help="runs (and archived messages per queue) deleted per transaction",
    )
    prune.add_argument("--yes", action="store_true", help="prune without asking first")
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="say which finished runs would go, by flow and status, and delete nothing",
    )
    prune.set_defaults(handler=_prune)


def _prune(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError("--batch must be at least 1.", hint=f"The default is {DEFAULT_BATCH:,}.")
    with connecting.connect(args) as conn:
        if args.dry_run:
            return _dry_run(args, conn)
        prunable = operator_statements.prunable_runs(support.version(conn))
        found = conn.execute(prunable, {"age": args.older_than}).fetchone()
        assert found is not None
        if not args.yes and not _confirmed(found, args.older_than):
            print("nothing pruned")
            return EXIT_OK
        progress = Progress(found["runs"], sys.stderr)
        totals = {"runs": 0, "subflow_runs": 0, "archived_messages": 0, "workers": 0, "batches": 0}
        done = False
        while not done:
            row = conn.execute(operator_statements.PRUNE, (args.older_than, args.batch)).fetchone()
            assert row is not None
            result: dict[str, Any] = row["pruned"]
            for key in ("runs", "subflow_runs", "archived_messages", "workers"):
                totals[key] += int(result.get(key, 0))
            totals["batches"] += 1
            done = bool(result["done"])
            progress.show(totals)
        progress.end()
    if args.format == "json":
        print_json({**totals, "older_than_s": args.older_than.total_seconds()})
    else:
        below = totals["subflow_runs"]
        print(
            f"pruned {counted(totals['runs'], 'finished run')}"
            + (f" (and {counted(below, 'subflow run')} of theirs)" if below else "")
            + ","
            f" {counted(totals['archived_messages'], 'archived message')} and"
            f" {counted(totals['workers'], 'silent worker')} older than"
            f" {_age(args.older_than)} in {counted(totals['batches'], 'batch', 'batches')},"
            f" {progress.elapsed():.1f} s"
        )
    return EXIT_OK


def _dry_run(args: argparse.Namespace, conn: psycopg.Connection[dict[str, Any]]) -> int:
    """What a prune with these arguments would delete, by flow and status; deletes nothing."""
    by_flow = operator_statements.prunable_by_flow(support.version(conn))
    rows = conn.execute(by_flow, {"age": args.older_than}).fetchall()
    total = sum(row["runs"] for row in rows)
    if args.format == "json":
        print_json({"dry_run": True, "runs": total, "by_flow": rows,
                    "older_than_s": args.older_than.total_seconds()})  # fmt: skip
        return EXIT_OK
    age = _age(args.older_than)
    print(f"would prune {counted(total, 'finished run')} older than {age}, with their steps and"
          " tasks" + (":" if rows else ""))  # fmt: skip
    if rows:
        table([(r["flow_slug"], r["status"], f"{r['runs']:,}") for r in rows],
              ["flow", "status", "runs"], sys.stdout)  # fmt: skip
    print(f"and the archived messages and silent workers older than {age}; nothing was deleted")
    return EXIT_OK


def _confirmed(found: dict[str, Any], older_than: datetime.timedelta) -> bool:
    """Say what will go and ask whether to; UsageError without a terminal to ask on."""
    if not sys.stdin.isatty():
        raise UsageError(
            "prune deletes data and asks first, but there is no terminal to ask on.",
            hint="Pass --yes to prune without asking (as a scheduled job does).",
        )
    below = found.get("subflow_runs") or 0
    print(
        f"{counted(found['runs'], 'finished run')} older than {_age(older_than)} (completed"
        f" {found['completed']:,}, failed {found['failed']:,}, cancelled {found['cancelled']:,})"
        + (f" and {counted(below, 'subflow run')} of theirs" if below else "")
        + " will be deleted with their steps and tasks, and with them archived messages and"
        " silent workers older than that.",
        file=sys.stderr,
    )
    print("prune? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _age(delta: datetime.timedelta) -> str:
    """`7d`, `36h`, `90m` or `45s`: the largest unit that divides the age."""
    seconds = delta.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


class Progress:
    """`pruned 40,000/1,000,000 runs (4 %), 120,000 archived messages` on a terminal, rewritten
    in place; nothing otherwise (the summary line says it all)."""

    def __init__(self, total_runs: int, out: TextIO) -> None:
        self.total_runs = total_runs
        self.out = out
        self.shown = out.isatty()
        self.began = time.monotonic()
        self.written = False

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def show(self, totals: dict[str, int]) -> None:
        if not self.shown:
            return
        # Runs that finished since the count make the total grow rather than pass 100 %.
        total = max(self.total_runs, totals["runs"])
        share = f" ({100 * totals['runs'] / total:.0f} %)" if total else ""
        self.out.write(
            f"\rpruned {totals['runs']:,}/{total:,} runs{share},"
            f" {totals['archived_messages']:,} archived messages"
        )
        self.out.flush()
        self.written = True

    def end(self) -> None:
        if self.written:
            self.out.write("\n")
            self.out.flush()
