"""`pgflow-gen fork`: start runs again from a step (engine 0029). Each named run, or each failed
run of a flow, gets a new run of its flow with its input: the steps before `--from` are copied
as they ended, `--from` and everything downstream of it run again with the handlers' code as it
is now (after a fix). Handlers run again, so it asks first (`--yes` does not)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from pgflow_gen.cli import connecting, control, run_refs, runs
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_OK
from pgflow_gen.cli.output import print_json, table
from pgflow_gen.engine import operator_statements, refusals
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime.client import operations
from pgflow_gen.runtime.client.models import ForkedRun
from pgflow_gen.words import counted


def register(commands: cli_parser.Commands) -> None:
    """Add `fork` to the `pgflow-gen` parser."""
    fork = commands.add(
        "fork",
        "start runs again from a step: earlier steps keep their outputs, the rest run again",
        database=True,
        formats=runs.FORMATS,
    )
    fork.add_argument(
        "run_ids",
        metavar="RUN_ID",
        nargs="*",
        type=run_refs.argument,
        help="the runs to fork (each its id, or its first 8 characters or more)",
    )
    fork.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        required=True,
        help="the step to run again, with every step downstream of it",
    )
    fork.add_argument(
        "--flow", dest="flow_slug", metavar="SLUG", help="every failed run of this flow"
    )
    fork.add_argument(
        "--failed-since",
        type=control.age,
        metavar="AGE",
        help="only runs of --flow that failed within AGE (30s, 15m, 1h, 2d)",
    )
    fork.add_argument("--yes", action="store_true", help="fork without asking first")
    fork.set_defaults(handler=_fork)


def _fork(args: argparse.Namespace) -> int:
    if bool(args.run_ids) == (args.flow_slug is not None):
        raise UsageError(
            "Name the runs to fork, or a flow with --flow, not both.",
            hint="For example `pgflow-gen fork RUN_ID --from parse` or `pgflow-gen fork --flow"
            " ingest --failed-since 1h --from parse`.",
        )
    if args.failed_since is not None and args.flow_slug is None:
        raise UsageError("--failed-since selects the failed runs of --flow.")
    forked: list[ForkedRun] = []
    refused: list[dict[str, Any]] = []
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            control.require_step(conn, args.flow_slug, args.from_step)
            chosen = conn.execute(
                operator_statements.FAILED_RUNS_OF_FLOW,
                {"flow": args.flow_slug, "age": args.failed_since},
            ).fetchall()
        else:
            ids = list(dict.fromkeys(run_refs.resolve(conn, ref) for ref in args.run_ids))
            chosen = [
                row
                for row in (conn.execute(operator_statements.RUN_ROW, (i,)).fetchone() for i in ids)
                if row is not None
            ]
            refused += [
                {"run_id": i, "why": f"Run {i} does not exist."}
                for i in ids
                if i not in {row["run_id"] for row in chosen}
            ]
            for flow_slug in sorted({row["flow_slug"] for row in chosen}):
                control.require_step(conn, flow_slug, args.from_step)
        if chosen and not args.yes:
            _confirm(chosen, args.from_step)
        for run in chosen:
            try:
                row = connecting.perform(conn, operations.fork_run(run["run_id"], args.from_step))
            except (refusals.RunNotForkableError, refusals.RunNotFoundError) as error:
                refused.append({"run_id": run["run_id"], "why": error.message})
                continue
            forked.append(row)
            if args.format != "json":
                print(f"forked run {row.forked_from_run_id} of {row.flow_slug} from step"
                      f" {row.forked_from_step}: new run {row.run_id} ({row.status})")  # fmt: skip
    if args.format == "json":
        print_json({
            "forked": [dataclasses.asdict(r) for r in forked],
            "not_forked": [{"run_id": r["run_id"], "reason": r["why"]} for r in refused],
        })  # fmt: skip
    else:
        for run in refused:
            print(f"error: {run['why']}", file=sys.stderr)
        if not chosen and not refused:
            since = f" that failed within {args.failed_since}" if args.failed_since else ""
            print(f"no failed run of {args.flow_slug}{since} to fork")
    return EXIT_FAILURE if refused else EXIT_OK


def _confirm(chosen: list[dict[str, Any]], from_step: str) -> None:
    """Show the runs and ask whether to fork them; UsageError without a terminal to ask on, or
    without a yes."""
    if not sys.stdin.isatty():
        raise UsageError(
            f"fork would start {counted(len(chosen), 'run')} again from step {from_step} (their"
            " handlers run again) and asks first, but there is no terminal to ask on.",
            hint="Pass --yes to fork without asking.",
        )
    table(
        [(r["run_id"], r["flow_slug"], r["status"]) for r in chosen],
        ["run", "flow", "status"],
        sys.stderr,
    )
    these = "this run" if len(chosen) == 1 else f"these {len(chosen):,} runs"
    print(f"fork {these} from step {from_step}: it and the steps after it run again? [y/N] ",
          end="", file=sys.stderr, flush=True)  # fmt: skip
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise UsageError("Nothing was forked.")
