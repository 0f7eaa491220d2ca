"""Operations commands of `pgflow-gen`: start runs (`starting`, `bulk`), show a run (`status`),
list runs, flows and workers, check queue coverage.

They work for any compiled flow without its Python module.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from pgflow_gen import run_ids
from pgflow_gen.cli import (
    bulk,
    connecting,
    existing,
    flow_triggers,
    run_refs,
    starting,
    step_controls,
)
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_OK
from pgflow_gen.cli.output import cell, first_line, print_json, table
from pgflow_gen.engine import operator_statements, statements, support
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.client import calls, run_calls
from pgflow_gen.words import counted

#: The most characters of an error a table cell shows (`status` prints the whole error below).
NOTE_CHARS = 80
#: Every command here prints a table for people, or JSON for scripts (docs/cli.md).
FORMATS = ("table", "json")


def register(commands: cli_parser.Commands) -> None:
    """Add the operations commands to the `pgflow-gen` parser."""
    start = commands.add("start", "start a run of a flow", database=True, formats=FORMATS)
    start.add_argument("flow_slug", metavar="SLUG", help="the flow's slug")
    start.add_argument(
        "--input",
        default="{}",
        help="the run input as JSON, checked against the flow's input schema",
    )
    start.add_argument(
        "--key",
        metavar="KEY",
        help="an idempotency key: when a run of the flow has it, that run is the answer and"
        " nothing starts",
    )
    start.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="0 (the default, the lowest) to 1000: tasks of runs with a higher priority are"
        " claimed first in their queues (engine 0031)",
    )
    start.add_argument("--wait", action="store_true", help="wait until the run finishes")
    start.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="seconds --wait waits"
    )
    bulk.add_arguments(start)
    start.set_defaults(handler=starting.start)

    status = commands.add(
        "status", "show a run, its steps and their last errors", database=True, formats=FORMATS
    )
    status.add_argument(
        "run_id", metavar="RUN_ID", type=run_refs.argument, help="the run's id (8+ characters)"
    )
    status.set_defaults(handler=_status)

    runs = commands.add("runs", "list recent runs, newest first", database=True, formats=FORMATS)
    runs.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only runs of this flow")
    runs.add_argument(
        "--status",
        choices=("started", "completed", "failed", "cancelled"),
        help="only runs with this status (failed runs show their failed step and its error,"
        " cancelled ones their reason)",
    )
    runs.add_argument(
        "--parent",
        metavar="RUN_ID",
        type=run_refs.argument,
        help="only the subflow runs this run started (its id, or 8+ characters of it)",
    )
    runs.add_argument("--limit", type=int, default=20, help="most runs listed")
    runs.add_argument(
        "--pending",
        action="store_true",
        help="list the debounced starts whose runs have not started yet instead, the soonest"
        " first (engine 0030)",
    )
    runs.set_defaults(handler=_runs)

    flows = commands.add(
        "flows",
        "list compiled flows, their steps and the options they run with, and their table triggers",
        database=True,
        formats=FORMATS,
    )
    flows.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only this flow")
    flows.add_argument(
        "--skips",
        action="store_true",
        help="list the starts table triggers with on_error skip could not make instead, the"
        " latest first (engine 0032)",
    )
    flows.add_argument("--limit", type=int, default=20, help="most skipped starts listed")
    flows.set_defaults(handler=_flows)

    workers = commands.add(
        "workers", "list workers and their heartbeats", database=True, formats=FORMATS
    )
    workers.add_argument(
        "--all",
        action="store_true",
        help="also the workers stopped more than an hour ago or restarted since (the others"
        " show by default)",
    )
    workers.set_defaults(handler=_workers)

    coverage = commands.add(
        "coverage",
        "does every queue route have a live worker? (exit 1 when not)",
        database=True,
        formats=FORMATS,
    )
    coverage.add_argument(
        "--freshness",
        type=float,
        metavar="S",
        help="max heartbeat age in seconds (default: the engine's liveness rule, 15 s)",
    )
    coverage.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only this flow")
    coverage.set_defaults(handler=_coverage)


def _status(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        run_id = run_refs.resolve(conn, args.run_id)
        run = conn.execute(operator_statements.RUN_ROW, (run_id,)).fetchone()
        if run is None:
            raise errors.PgflowError(f"Run {run_id} does not exist.")
        version = support.version(conn)
        steps = conn.execute(operator_statements.run_step_status(version), (run_id,)).fetchall()
        subflow_runs = (
            conn.execute(statements.RUN_SUBFLOWS, (run_id,)).fetchall()
            if statements.has_subflows(version)
            else []
        )
        pauses = step_controls.paused_steps(conn)
        limits = step_controls.step_limits(conn)
    active = run["status"] == "started"
    for s in steps:
        unfinished = s["status"] in ("created", "started")
        pause = pauses.get((run["flow_slug"], s["step_slug"]))
        s["pause"] = pause if active and unfinished else None
        s["limits"] = limits.get((run["flow_slug"], s["step_slug"]))
        if s["pause"] is not None:
            s["note"] = "; ".join(filter(None, [step_controls.pause_cell(pause), s["note"]]))
        if not active and unfinished:  # a finished run's step that never finished
            s["note"] = f"the run is {run['status']}: nothing more runs here"
        elif s["limits"] is not None and unfinished:
            limited = f"limited: {step_controls.limits_cell(s['limits'])}"
            s["note"] = "; ".join(filter(None, [limited, s["note"]]))
        if s["step_type"] == "signal" or s["subflow_slug"] is not None:
            s["queue_name"] = None  # a signal or subflow step has no queue
        if s["subflow_slug"] is not None and s["note"] is None:
            s["note"] = f"runs flow {s['subflow_slug']}"
        if s["waiting_since"] is not None:
            until = f" until {cell(s['waiting_until'])}" if s["waiting_until"] else ""
            s["note"] = f"waiting for a signal{until}"
    waiting = [s["step_slug"] for s in steps if s["waiting_since"] is not None]
    if args.format == "json":
        print_json({
            "run": {
                key: run.get(key)
                for key in ("run_id", "flow_slug", "status", "input", "output", "started_at",
                            "completed_at", "failed_at", "cancelled_at", "cancel_reason",
                            "retry_count", "retried_at", "parent_run_id", "parent_step_slug",
                            "parent_task_index", "forked_from_run_id", "forked_from_step",
                            "priority")
            },
            "subflow_runs": [
                {key: r[key] for key in ("run_id", "flow_slug", "status", "depth",
                                         "parent_run_id", "parent_step_slug", "parent_task_index",
                                         "retry_count")}
                for r in subflow_runs
            ],
            "waiting_for_signals": waiting,
            "steps": [
                {
                    "step_slug": s["step_slug"],
                    "status": s["status"],
                    "queue_name": s["queue_name"],
                    "tasks": s["initial_tasks"],
                    "attempts": s["attempts"],
                    "note": s["note"],
                    "paused": step_controls.pause_json(s["pause"]),
                    "limits": step_controls.limits_json(s["limits"]),
                    "step_type": s["step_type"],
                    "subflow_slug": s["subflow_slug"],
                    "waiting": None if s["waiting_since"] is None else {
                        "since": s["waiting_since"], "until": s["waiting_until"],
                    },
                    "last_error": None if s["error_message"] is None else {
                        "task_index": s["task_index"],
                        "attempt": s["error_attempt"],
                        "task_status": s["task_status"],
                        "error": s["error_message"],
                    },
                }
                for s in steps
            ],
        })  # fmt: skip
        return EXIT_OK
    print(f"run:     {run['run_id']}")
    print(f"flow:    {run['flow_slug']}")
    if run.get("forked_from_run_id") is not None:
        print(
            f"forked:  from run {run['forked_from_run_id']}, at its step {run['forked_from_step']}"
        )
    if run.get("parent_run_id") is not None:
        print(
            f"parent:  {run['parent_run_id']} (its step {run['parent_step_slug']},"
            f" task {run['parent_task_index']})"
        )
    waits = f" (waiting for a signal: {', '.join(waiting)})" if waiting else ""
    print(f"status:  {run['status']}{waits}")
    if run.get("priority"):
        print(f"priority: {run['priority']}")
    print(f"started: {cell(run['started_at'])}")
    if run.get("retry_count"):
        print(f"retried: {counted(run['retry_count'], 'time')}, last at {cell(run['retried_at'])}")
    finished = run["completed_at"] or run["failed_at"] or run.get("cancelled_at")
    if finished is not None:
        print(f"ended:   {cell(finished)}")
    if run["status"] == "cancelled":
        print(f"reason:  {cell(run.get('cancel_reason')) or 'none given'}")
    print(f"input:   {cell(run['input'])}")
    print(f"output:  {cell(run['output'])}")
    print()
    table(
        [
            (s["step_slug"], s["status"], s["queue_name"], s["initial_tasks"], s["attempts"],
             first_line(s["note"], NOTE_CHARS))
            for s in steps
        ],
        ["step", "status", "queue", "tasks", "attempts", "note"],
        sys.stdout,
    )  # fmt: skip
    if subflow_runs:
        print("\nsubflow runs:")
    for child in subflow_runs:
        retried = (
            f", retried {counted(child['retry_count'], 'time')}" if child["retry_count"] else ""
        )
        print(
            f"{'  ' * child['depth']}{child['parent_step_slug']}[{child['parent_task_index']}]:"
            f" subflow run {child['run_id']} of {child['flow_slug']}: {child['status']}{retried}"
        )
    for slug in waiting:
        print(f"\nsend step {slug} its signal: pgflow-gen signal {run['run_id']} {slug} --payload"
              " '<JSON>'")  # fmt: skip
    failed = [s for s in steps if s["error_message"] is not None]
    if failed:
        print("\nlast errors:")
    for s in failed:
        # A task that completed later recovered from the error: say on which attempt.
        outcome = (
            f"then completed on attempt {s['error_attempt'] + 1}"
            if s["task_status"] == "completed"
            else s["task_status"]
        )
        print(
            f'  step "{s["step_slug"]}" task {s["task_index"]}, attempt {s["error_attempt"]}'
            f" ({outcome}): {first_line(s['error_message'])}"
        )
        details = s["error_message"].split("\n", 1)[1:]
        for line in "".join(details).strip("\n").splitlines():
            print(f"    {line}" if line else "")
    if run["status"] == "failed":
        print(f"\nretry it from where it failed: pgflow-gen retry {run_ids.short(run['run_id'])}")
    return EXIT_OK


def _inherited(own: int | None, flows: int) -> dict[str, Any]:
    """An option as JSON: the value a step runs with, and whether it is the flow's."""
    return {"value": own if own is not None else flows, "from_flow": own is None}


def _runs(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1.")
    if args.pending:
        return _pending(args)
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
        parent = None if args.parent is None else run_refs.resolve(conn, args.parent)
        rows = conn.execute(
            operator_statements.runs(support.version(conn)),
            {"flow": args.flow_slug, "status": args.status, "parent": parent, "limit": args.limit},
        ).fetchall()
    if args.format == "json":
        print_json({
            "runs": [
                {"run_id": r["run_id"], "flow_slug": r["flow_slug"], "status": r["status"],
                 "parent_run_id": r["parent_run_id"],
                 "started_at": r["started_at"], "ended_at": r["ended"],
                 "failed_step": r["failed_step"], "error": first_line(r["error_message"]),
                 "cancel_reason": r["cancel_reason"], "waiting_for_signals": r["waiting_signals"]}
                for r in rows
            ]
        })  # fmt: skip
        return EXIT_OK
    table(
        [
            (r["run_id"], r["flow_slug"], r["status"], r["started_at"], r["ended"],
             r["failed_step"], _why(r))
            for r in rows
        ],
        ["run", "flow", "status", "started", "ended", "failed step", "error or reason"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _pending(args: argparse.Namespace) -> int:
    if args.status is not None or args.parent is not None:
        raise UsageError(
            "--pending lists starts, not runs: it takes no --status or --parent.",
            hint="pgflow-gen runs --pending [--flow SLUG] [--limit N]",
        )
    with connecting.connect(args) as conn:
        version = support.version(conn)
        if not statements.has_debounce(version):
            raise UsageError(
                f"The engine is at migration {version}; debounced starts need migration 0030.",
                hint=support.MIGRATE_HINT,
            )
        if args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
        pending = calls.run(conn, run_calls.pending_starts(args.flow_slug))[: args.limit]
    if args.format == "json":
        print_json({"pending": [dataclasses.asdict(p) for p in pending]})
        return EXIT_OK
    table(
        [
            (p.flow_slug, p.debounce_key, p.starts, p.first_at, p.last_at, p.start_at,
             p.deadline_at)
            for p in pending
        ],
        ["flow", "debounce key", "starts", "first", "last", "run starts", "deadline"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _why(run: dict[str, Any]) -> str | None:
    """Why a run is where it is: its error's first line, the reason it was cancelled, or the
    signals it waits for."""
    if run["waiting_signals"]:
        return f"waiting for a signal: {', '.join(run['waiting_signals'])}"
    return first_line(run["error_message"] or run["cancel_reason"], NOTE_CHARS)


def _flows(args: argparse.Namespace) -> int:
    if args.skips:
        return flow_triggers.skips(args)
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
        steps = operator_statements.flow_steps(support.version(conn))
        rows = conn.execute(steps, {"flow": args.flow_slug}).fetchall()
        triggers = flow_triggers.listed(conn, args.flow_slug)

    if args.format == "json":
        print_json({
            "steps": [
                {"flow_slug": r["flow_slug"], "queue_mode": r["queue_mode"],
                 "step_slug": r["step_slug"], "step_type": r["step_type"],
                 "subflow_slug": r["subflow_slug"],
                 "queue_name": r["queue_name"]
                 if r["step_type"] != "signal" and r["subflow_slug"] is None else None,
                 # A signal step runs no task: its one option is how long it waits.
                 "options": {"timeout": {"value": r["opt_timeout"], "from_flow": False}}
                 if r["step_type"] == "signal" else {
                     # A subflow step's tasks are child runs: only its retries apply.
                     "max_attempts": _inherited(r["opt_max_attempts"], r["flow_max_attempts"]),
                     "base_delay": _inherited(r["opt_base_delay"], r["flow_base_delay"]),
                 } if r["subflow_slug"] is not None else {
                     "max_attempts": _inherited(r["opt_max_attempts"], r["flow_max_attempts"]),
                     "base_delay": _inherited(r["opt_base_delay"], r["flow_base_delay"]),
                     "timeout": _inherited(r["opt_timeout"], r["flow_timeout"]),
                     "start_delay": _inherited(r["opt_start_delay"], 0),
                 }}
                for r in rows
            ],
            "triggers": triggers,
        })  # fmt: skip
        return EXIT_OK

    def option(step: Any, flow: Any) -> str:
        # The value the step runs with; "(flow)" when it inherits the flow's.
        return str(step) if step is not None else f"{flow} (flow)"

    def row(r: Any) -> tuple[Any, ...]:
        if r["step_type"] == "signal":  # no queue, no task: it waits for its signal
            waits = f"{r['opt_timeout']} (wait)" if r["opt_timeout"] else "none (waits for ever)"
            return (r["flow_slug"], r["queue_mode"], r["step_slug"], "signal", "-", "-", "-",
                    waits, "-")  # fmt: skip
        if r["subflow_slug"] is not None:  # no queue: its tasks are runs of another flow
            kind = f"{r['step_type']} of {r['subflow_slug']}"
            return (r["flow_slug"], r["queue_mode"], r["step_slug"], kind, "-",
                    option(r["opt_max_attempts"], r["flow_max_attempts"]),
                    option(r["opt_base_delay"], r["flow_base_delay"]), "-", "-")  # fmt: skip
        return (r["flow_slug"], r["queue_mode"], r["step_slug"], r["step_type"], r["queue_name"],
                option(r["opt_max_attempts"], r["flow_max_attempts"]),
                option(r["opt_base_delay"], r["flow_base_delay"]),
                option(r["opt_timeout"], r["flow_timeout"]),
                option(r["opt_start_delay"], 0))  # fmt: skip

    table(
        [row(r) for r in rows],
        ["flow", "mode", "step", "type", "queue", "max attempts", "base delay", "timeout",
         "start delay"],
        sys.stdout,
    )  # fmt: skip
    flow_triggers.print_table(triggers)
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        rows = conn.execute(statements.workers(support.version(conn)), (args.all,)).fetchall()
        pauses = step_controls.paused_steps(conn)
    for r in rows:  # the paused steps a worker serves: its own, or any of its flow's
        r["paused_steps"] = [
            step for flow, step in pauses
            if flow == r["flow_slug"] and r["step_slug"] in (None, step)
        ]  # fmt: skip
    if args.format == "json":
        print_json({
            "workers": [
                {"worker_id": r["worker_id"], "name": r["function_name"], "state": r["state"],
                 "flow_slug": r["flow_slug"], "step_slug": r["step_slug"],
                 "queue_name": r["queue_name"], "last_heartbeat_at": r["last_heartbeat_at"],
                 "paused_steps": r["paused_steps"]}
                for r in rows
            ]
        })  # fmt: skip
        return EXIT_OK
    paused = any(r["paused_steps"] for r in rows)  # the column shows only when it says something
    table(
        [
            (r["function_name"], r["state"], r["queue_name"], r["step_slug"],
             r["last_heartbeat_at"], r["worker_id"],
             *([", ".join(r["paused_steps"]) or None] if paused else []))
            for r in rows
        ],
        ["worker", "state", "queue", "step", "last heartbeat", "id",
         *(["paused steps"] if paused else [])],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _coverage(args: argparse.Namespace) -> int:
    if args.freshness is not None and args.freshness <= 0:
        raise UsageError("--freshness must be above 0 seconds.")
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            existing.require_flow(conn, args.flow_slug)
        rule = conn.execute(operator_statements.FRESHNESS, (args.freshness,)).fetchone()
        assert rule is not None
        freshness = rule["seconds"]
        rows = conn.execute(
            operator_statements.QUEUE_COVERAGE, (freshness, args.flow_slug, args.flow_slug)
        ).fetchall()
        pauses = step_controls.paused_steps(conn)
        limits = step_controls.step_limits(conn)
    uncovered = [r for r in rows if not r["covered"]]
    steps = [step_controls.step_of(r) for r in rows]
    for r, step in zip(rows, steps, strict=True):
        r["paused"] = step_controls.pause_json(pauses.get(step))
        r["limits"] = step_controls.limits_json(limits.get(step))
    if args.format == "json":
        print_json({"ok": not uncovered, "freshness_s": freshness, "routes": rows})
    else:
        # The paused and limits columns show only when they say something.
        paused = any(r["paused"] for r in rows)
        limited = any(r["limits"] for r in rows)
        table(
            [
                (r["flow_slug"], r["step_slug"], r["queue_name"], r["live_workers"],
                 "yes" if r["covered"] else "NO",
                 *([step_controls.pause_cell(pauses.get(step))] if paused else []),
                 *([step_controls.limits_cell(limits.get(step))] if limited else []))
                for r, step in zip(rows, steps, strict=True)
            ],
            ["flow", "step", "queue", "live workers", "covered", *(["paused"] if paused else []),
             *(["limits"] if limited else [])],
            sys.stdout,
        )  # fmt: skip
        print(
            f"\n{len(rows) - len(uncovered)} of {counted(len(rows), 'route')} covered"
            f" (heartbeat within {freshness:g} s)"
        )
    return EXIT_FAILURE if uncovered else EXIT_OK
