"""Run control commands of `pgflow-gen`: `cancel` (one run, several, or every started run of a
flow), `retry` (failed runs, from where they failed), `pause` and `resume` (a step of a flow, in
every run), through the engine's functions, so they work for any flow without its module.

A bulk command shows what it will change and asks first (`cancel` always, `retry` for `--flow`);
`--yes` skips the question, and without a terminal to ask on it refuses rather than guess.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import re
import sys
import uuid
from typing import Any

import psycopg

from pgflow_gen.cli import connecting, existing, run_refs, runs, step_controls
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_OK
from pgflow_gen.cli.output import print_json, table
from pgflow_gen.engine import operator_statements, refusals
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime.client import RetriedRun, operations
from pgflow_gen.words import counted

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def age(text: str) -> datetime.timedelta:
    """An age such as `90s`, `15m`, `1h` or `2d` (argparse type).

    >>> age("1h"), age("90s")
    (datetime.timedelta(seconds=3600), datetime.timedelta(seconds=90))
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"invalid age {text!r}: write a number and a unit, for example 30s, 15m, 1h or 2d"
        )
    return datetime.timedelta(seconds=float(found[1]) * _UNITS[found[2]])


def register(commands: cli_parser.Commands) -> None:
    """Add the run control commands to the `pgflow-gen` parser."""
    cancel = _run_command(
        commands,
        "cancel",
        "cancel started runs: queued tasks never run, running handlers are told to stop",
        "started",
    )
    cancel.add_argument(
        "--status",
        choices=("started",),
        default="started",
        help="the runs --flow selects (only a started run can be cancelled)",
    )
    cancel.add_argument(
        "--older-than",
        type=age,
        metavar="AGE",
        help="only runs started longer ago than AGE (30s, 15m, 1h, 2d)",
    )
    cancel.add_argument("--reason", help="why, stored with each run (runs.cancel_reason)")
    cancel.add_argument("--yes", action="store_true", help="cancel without asking first")
    cancel.set_defaults(handler=_cancel)

    retry = _run_command(
        commands,
        "retry",
        "retry failed runs from where they failed: completed steps keep their outputs",
        "failed",
    )
    retry.add_argument(
        "--failed-since",
        type=age,
        metavar="AGE",
        help="only runs of --flow that failed within AGE (30s, 15m, 1h, 2d)",
    )
    retry.add_argument("--yes", action="store_true", help="retry --flow's runs without asking")
    retry.set_defaults(handler=_retry)

    pause = commands.add(
        "pause",
        "pause a step in every run: none of its tasks starts until it is resumed",
        database=True,
        formats=runs.FORMATS,
    )
    pause.add_argument("flow_slug", metavar="FLOW", help="the flow's slug")
    pause.add_argument("step_slug", metavar="STEP", help="the step's slug")
    pause.add_argument("--reason", help="why, shown by coverage, status and workers")
    pause.set_defaults(handler=_pause)

    resume = commands.add(
        "resume",
        "resume a paused step: its waiting tasks start at once",
        database=True,
        formats=runs.FORMATS,
    )
    resume.add_argument("flow_slug", metavar="FLOW", help="the flow's slug")
    resume.add_argument("step_slug", metavar="STEP", help="the step's slug")
    resume.set_defaults(handler=_resume)


def _run_command(
    commands: cli_parser.Commands, verb: str, description: str, status: str
) -> argparse.ArgumentParser:
    """A command that takes run ids, or every run of a flow in `status` with --flow."""
    command = commands.add(verb, description, database=True, formats=runs.FORMATS)
    command.add_argument(
        "run_ids",
        metavar="RUN_ID",
        nargs="*",
        type=run_refs.argument,
        help=f"the runs to {verb} (each its id, or its first 8 characters or more)",
    )
    command.add_argument(
        "--flow", dest="flow_slug", metavar="SLUG", help=f"every {status} run of this flow"
    )
    return command


def _cancel(args: argparse.Namespace) -> int:
    if bool(args.run_ids) == (args.flow_slug is not None):
        raise UsageError(
            "Name the runs to cancel, or a flow with --flow, not both.",
            hint="For example `pgflow-gen cancel RUN_ID` or `pgflow-gen cancel --flow greetUser"
            " --older-than 1h`.",
        )
    as_json = args.format == "json"
    with connecting.connect(args) as conn:
        chosen, refused = _choose(conn, args)
        if chosen and not args.yes:
            because = f" ({args.reason})" if args.reason else ""
            _confirm("cancel", chosen, "started_at", because)
        cancelled: list[dict[str, Any]] = []
        for run in chosen:
            try:
                connecting.perform(conn, operations.cancel_run(run["run_id"], args.reason))
            except refusals.RunFinishedError:
                refused.append({**run, "status": _status(conn, run["run_id"])})
                continue
            cancelled.append(run)
            if not as_json:
                print(f"cancelled run {run['run_id']} of {run['flow_slug']}")
    if as_json:
        print_json({
            "cancelled": [{"run_id": r["run_id"], "flow_slug": r["flow_slug"]} for r in cancelled],
            "not_cancelled": [
                {"run_id": r["run_id"], "status": r["status"]} for r in refused
            ],
        })  # fmt: skip
    else:
        for run in refused:
            why = "does not exist" if run["status"] is None else f"is {run['status']} already"
            print(f"error: run {run['run_id']} {why}; only a started run can be cancelled",
                  file=sys.stderr)  # fmt: skip
        if not chosen and not refused:
            print(f"no started run of {args.flow_slug} to cancel")
    return EXIT_FAILURE if refused else EXIT_OK


def _choose(
    conn: psycopg.Connection[dict[str, Any]], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The started runs to cancel, oldest first, and the named ones that are not started."""
    if args.flow_slug is not None:
        existing.require_flow(conn, args.flow_slug)
        rows = conn.execute(
            operator_statements.STARTED_RUNS_OF_FLOW,
            {"flow": args.flow_slug, "age": args.older_than},
        ).fetchall()
        return rows, []
    ids = list(dict.fromkeys(run_refs.resolve(conn, ref) for ref in args.run_ids))
    found = {
        row["run_id"]: row
        for row in conn.execute(
            operator_statements.RUNS_BY_ID, {"ids": ids, "age": args.older_than}
        )
    }
    chosen, refused = [], []
    for run_id in ids:
        run = found.get(run_id) or {"run_id": run_id, "flow_slug": None, "status": None}
        if run["status"] != "started":
            refused.append(run)
        elif run["young"]:
            print(f"run {run_id} started less than --older-than ago: left alone", file=sys.stderr)
        else:
            chosen.append(run)
    return chosen, refused


def _confirm(verb: str, chosen: list[dict[str, Any]], when: str, because: str = "") -> None:
    """Show the runs (with the time in column `when`) and ask whether to `verb` them; raise
    UsageError when there is no terminal to ask on, or the answer is not yes."""
    if not sys.stdin.isatty():
        raise UsageError(
            f"{verb} would {verb} {counted(len(chosen), 'run')} and asks first, but there is no"
            " terminal to ask on.",
            hint=f"Pass --yes to {verb} without asking.",
        )
    table(
        [(r["run_id"], r["flow_slug"], r[when]) for r in chosen],
        ["run", "flow", when.removesuffix("_at")],
        sys.stderr,
    )
    these = "this run" if len(chosen) == 1 else f"these {len(chosen):,} runs"
    print(f"{verb} {these}{because}? [y/N] ", end="", file=sys.stderr,
          flush=True)  # fmt: skip
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise UsageError(f"Nothing was {'cancelled' if verb == 'cancel' else 'retried'}.")


def _retry(args: argparse.Namespace) -> int:
    if bool(args.run_ids) == (args.flow_slug is not None):
        raise UsageError(
            "Name the runs to retry, or a flow with --flow, not both.",
            hint="For example `pgflow-gen retry RUN_ID` or `pgflow-gen retry --flow greetUser"
            " --failed-since 1h`.",
        )
    if args.failed_since is not None and args.flow_slug is None:
        raise UsageError(
            "--failed-since selects the failed runs of --flow; named runs are retried as named."
        )
    as_json = args.format == "json"
    retried: list[RetriedRun] = []
    refused: list[dict[str, Any]] = []
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
            chosen = conn.execute(
                operator_statements.FAILED_RUNS_OF_FLOW,
                {"flow": args.flow_slug, "age": args.failed_since},
            ).fetchall()
            if chosen and not args.yes:
                _confirm("retry", chosen, "failed_at")
        else:
            ids = (run_refs.resolve(conn, ref) for ref in args.run_ids)
            chosen = [{"run_id": run_id} for run_id in dict.fromkeys(ids)]
        for run in chosen:
            try:
                row = connecting.perform(conn, operations.retry_run(run["run_id"]))
            except (refusals.RunNotFailedError, refusals.RunNotFoundError) as error:
                status = _status(conn, run["run_id"])
                refused.append({"run_id": run["run_id"], "status": status, "why": error.message})
                continue
            retried.append(row)
            if not as_json:
                print(f"retried run {row.run_id} of {row.flow_slug} ({row.status};"
                      f" retry {row.retry_count})")  # fmt: skip
    if as_json:
        print_json({
            "retried": [dataclasses.asdict(r) for r in retried],
            "not_retried": [
                {"run_id": r["run_id"], "status": r["status"], "reason": r["why"]} for r in refused
            ],
        })  # fmt: skip
    else:
        for run in refused:
            print(f"error: {run['why']}", file=sys.stderr)
        if not chosen:
            since = f" that failed within {args.failed_since}" if args.failed_since else ""
            print(f"no failed run of {args.flow_slug}{since} to retry")
    return EXIT_FAILURE if refused else EXIT_OK


def _status(conn: psycopg.Connection[dict[str, Any]], run_id: uuid.UUID) -> str | None:
    row = conn.execute(operator_statements.RUN_ROW, (run_id,)).fetchone()
    return None if row is None else str(row["status"])


def require_step(conn: psycopg.Connection[dict[str, Any]], flow_slug: str, step_slug: str) -> None:
    """Raise UsageError unless the compiled flow has the step, naming a near one."""
    existing.require_flow(conn, flow_slug)
    known = [r["step_slug"] for r in conn.execute(operator_statements.STEP_SLUGS, (flow_slug,))]
    existing.require_member(flow_slug, "step", step_slug, known, exact="Slugs")


def _pause(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        require_step(conn, args.flow_slug, args.step_slug)
        pause = connecting.perform(
            conn, operations.pause_step(args.flow_slug, args.step_slug, args.reason)
        )
    if args.format == "json":
        print_json(dataclasses.asdict(pause))
    else:
        because = f" ({pause.reason})" if pause.reason else ""
        print(f"paused step {args.step_slug} of {args.flow_slug}{because}: its tasks wait until"
              f" `pgflow-gen resume {args.flow_slug} {args.step_slug}`")  # fmt: skip
    return EXIT_OK


def _resume(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        require_step(conn, args.flow_slug, args.step_slug)
        was_paused = (args.flow_slug, args.step_slug) in step_controls.paused_steps(conn)
        shown = connecting.perform(conn, operations.resume_step(args.flow_slug, args.step_slug))
    if args.format == "json":
        print_json({"flow_slug": args.flow_slug, "step_slug": args.step_slug,
                    "was_paused": was_paused, "held_messages_shown": shown})  # fmt: skip
    elif was_paused:
        print(f"resumed step {args.step_slug} of {args.flow_slug}:"
              f" {counted(shown, 'held task')} can"
              " start now")  # fmt: skip
    else:
        print(f"step {args.step_slug} of {args.flow_slug} was not paused; nothing changed")
    return EXIT_OK
