"""Operations commands of `pgflow-gen`: start and watch runs, list workers, check queue coverage.

They talk to the database in SQL only, so they work for any flow without its Python module.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgflow_gen.cli import bulk, connecting, project
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK
from pgflow_gen.cli.output import cell, print_json, table
from pgflow_gen.engine import operator_statements, statements
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import Client, Run, errors
from pgflow_gen.runtime import client as client_module

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
    start.add_argument("--wait", action="store_true", help="wait until the run finishes")
    start.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="seconds --wait waits"
    )
    bulk.add_arguments(start)
    start.set_defaults(handler=_start)

    status = commands.add(
        "status", "show a run, its steps and their last errors", database=True, formats=FORMATS
    )
    status.add_argument("run_id", metavar="RUN_ID", type=uuid.UUID, help="the run's id")
    status.set_defaults(handler=_status)

    runs = commands.add("runs", "list recent runs, newest first", database=True, formats=FORMATS)
    runs.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only runs of this flow")
    runs.add_argument(
        "--status",
        choices=("started", "completed", "failed", "cancelled"),
        help="only runs with this status (failed runs show their failed step and its error,"
        " cancelled ones their reason)",
    )
    runs.add_argument("--limit", type=int, default=20, help="most runs listed")
    runs.set_defaults(handler=_runs)

    flows = commands.add(
        "flows",
        "list compiled flows, their steps and the options they run with",
        database=True,
        formats=FORMATS,
    )
    flows.add_argument("--flow", dest="flow_slug", metavar="SLUG", help="only this flow")
    flows.set_defaults(handler=_flows)

    workers = commands.add(
        "workers", "list workers and their heartbeats", database=True, formats=FORMATS
    )
    workers.add_argument("--all", action="store_true", help="include stopped workers")
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


def require_flow(conn: psycopg.Connection[Any], flow_slug: str) -> None:
    """Raise UsageError when no flow `flow_slug` is compiled (a typo would look like no data)."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        known = [row[0] for row in cursor.execute(statements.FLOW_SLUGS)]
    if flow_slug in known:
        return
    near = near_match(flow_slug, known)
    listed = f"Compiled flows: {', '.join(known) or '(none)'}." + (
        ""
        if known
        else " A flow is compiled by its generated migration (`pgflow-gen db apply`)"
        " or when its worker starts."
    )
    raise UsageError(
        f'No flow "{flow_slug}" is compiled in this database.',
        hint=f'Did you mean "{near}"? Slugs are exact. {listed}' if near else listed,
    )


def require_member(
    flow_slug: str, kind: str, name: str, known: list[str], exact: str = "Names"
) -> None:
    """Raise UsageError unless `name` is among the flow's `known` ones of `kind` ("step",
    "schedule"), naming a near one and listing them all (`exact`: what is exact, "Slugs")."""
    if name in known:
        return
    near = near_match(name, known)
    listed = f"{kind.capitalize()}s of {flow_slug}: {', '.join(known) or '(none)'}."
    raise UsageError(
        f'Flow "{flow_slug}" has no {kind} "{name}".',
        hint=f'Did you mean "{near}"? {exact} are exact. {listed}' if near else listed,
    )


def near_match(slug: str, known: list[str]) -> str | None:
    """The known slug `slug` is most likely a typo of: the same but for case, else the closest."""
    near = [candidate for candidate in known if candidate.lower() == slug.lower()]
    near = near or difflib.get_close_matches(slug, known, n=1)
    return near[0] if near else None


Pauses = dict[tuple[str, str], dict[str, Any]]


def paused_steps(conn: psycopg.Connection[dict[str, Any]]) -> Pauses:
    """The paused steps by (flow, step), with their reason and since when."""
    return {
        (r["flow_slug"], r["step_slug"]): r for r in conn.execute(operator_statements.STEP_PAUSES)
    }


Limits = dict[tuple[str, str], dict[str, Any]]


def step_limits(conn: psycopg.Connection[dict[str, Any]]) -> Limits:
    """The limited steps by (flow, step), with their limits and use now, and the keyed ones
    with their keys."""
    limits = {
        (r["flow_slug"], r["step_slug"]): r
        for r in conn.execute(statements.STEP_LIMIT_USAGE, (None,))
    }
    return client_module.with_concurrency(limits, conn.execute(statements.CONCURRENCY_USAGE))


def limits_json(limits: dict[str, Any] | None) -> dict[str, Any] | None:
    """A step's limits and their use as JSON (None: no limits)."""
    if limits is None:
        return None
    return {
        key: limits[key]
        for key in ("max_in_flight", "in_flight", "rate_limit", "rate_period_s",
                    "window_starts", "set_by", *client_module.CONCURRENCY_FIELDS)
        if key in limits
    }  # fmt: skip


def limits_cell(limits: dict[str, Any] | None) -> str | None:
    """A step's limits and their use in a few words ("3/4 in flight"; None: no limits)."""
    return None if limits is None else client_module.limits_in_words(limits)


def _pause_json(pause: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if pause is None else {"reason": pause["reason"], "paused_at": pause["paused_at"]}


def _pause_cell(pause: dict[str, Any] | None) -> str | None:
    if pause is None:
        return None
    return f"paused: {pause['reason']}" if pause["reason"] else "paused"


def _start(args: argparse.Namespace) -> int:
    bulk.check_arguments(args)
    if args.inputs is not None:
        with connecting.connect(args) as conn:
            require_flow(conn, args.flow_slug)
            return bulk.start_many(args, conn)
    try:
        run_input = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--input is not JSON: {exc}", hint='For example --input \'{"name": "Ada"}\'.'
        ) from None
    url = connecting.database_url(args.database_url)
    with Client(url, pool_size=1) as client:
        with client.connection() as conn:
            require_flow(conn, args.flow_slug)
        wanted = uuid.uuid4()
        try:
            run = client.start_flow(
                args.flow_slug, run_input, run_id=wanted, idempotency_key=args.key
            )
        except errors.InvalidRunInputError as exc:
            raise UsageError(exc.message, detail=exc.detail, hint=exc.hint) from None
        return _started(args, client, run, created=run.run_id == wanted)


def _started(args: argparse.Namespace, client: Client, run: Run[Any], *, created: bool) -> int:
    """Say what `start` did; with --wait, follow the run to its end and say how it ended."""
    run_id = run.run_id
    said = (
        f"started run {run_id} of {args.flow_slug}"
        if created
        else f"run {run_id} of {args.flow_slug} has the key {args.key!r} already ({run.status});"
        " nothing started"
    )
    as_json = args.format == "json"
    if not args.wait:
        if as_json:
            print_json({"run_id": run_id, "flow_slug": args.flow_slug, "status": run.status,
                        "created": created})  # fmt: skip
        else:
            print(said)
        return EXIT_OK
    with _ctrl_c() as pressed:
        if not as_json:  # from here on, Ctrl-C says how to follow the run
            print(said, flush=True)
        try:
            run = _wait_with_progress(client, run_id, args.timeout, pressed.is_set)
        except _StoppedWaiting:
            print(
                f"\nstopped waiting; run {run_id} keeps going: follow it with"
                f" `pgflow-gen status {run_id}`",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
    if as_json:
        print_json({
            "run_id": run_id,
            "flow_slug": args.flow_slug,
            "status": run.status,
            "created": created,
            "output": run.output,
            "cancel_reason": run.cancel_reason,
            "failure": None if run.failure is None else {
                "step_slug": run.failure.step_slug,
                "task_index": run.failure.task_index,
                "attempts": run.failure.attempts,
                "error": run.failure.error,
            },
        })  # fmt: skip
        return EXIT_OK if run.status == "completed" else EXIT_FAILURE
    if run.status == "completed":
        print(f"completed: {json.dumps(run.output)}")
        return EXIT_OK
    if run.status == "cancelled":
        print(f"cancelled: {run.cancel_reason or 'no reason given'}")
        print(f"(the run and every step: pgflow-gen status {run_id})")
        return EXIT_FAILURE
    failure = run.failure
    print(f"failed: {failure.describe() if failure else 'no failed step recorded'}")
    if failure is not None and failure.error and "\n" in failure.error:
        details = failure.error.split("\n", 1)[1].strip("\n")
        print("\n".join(f"  {line}" if line else "" for line in details.splitlines()))
    print(f"(the run and every step: pgflow-gen status {run_id})")
    return EXIT_FAILURE


#: Without a terminal, --wait prints a progress line this often (seconds).
PROGRESS_EVERY_S = 10


class _StoppedWaiting(Exception):
    """Ctrl-C during `start --wait`."""


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """An event Ctrl-C (SIGINT) sets while the block runs, so the wait stops between two
    statements (a KeyboardInterrupt inside one could leave the connection pool in a state its
    close waits on). A second Ctrl-C interrupts at once. Outside the main thread, SIGINT keeps
    its default."""
    pressed = threading.Event()

    def press(number: int, frame: object) -> None:
        if pressed.is_set():
            raise KeyboardInterrupt
        pressed.set()

    try:
        previous = signal.signal(signal.SIGINT, press)
    except ValueError:  # not the main thread
        yield pressed
        return
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def _wait_with_progress(
    client: Client, run_id: uuid.UUID, timeout: float, stopped: Callable[[], bool]
) -> Run[Any]:
    """Wait for the run (events, plus a read every second, which also works behind a
    transaction pooler). Every second it checks that each step with queued tasks has a live
    worker, and warns once per step that has none, saying how to start one; and says once per
    signal step that waits for its signal how to send it. A terminal shows
    the elapsed time; otherwise a progress line comes every PROGRESS_EVERY_S seconds."""
    started = time.monotonic()
    show = sys.stderr.isatty()
    warned: set[str] = set()
    told: set[str] = set()  # the signal steps it said it waits for
    run = client.get_run(run_id)
    last_line = 0

    checks = client.connect()  # one connection for the checks of every second

    def tick() -> None:
        nonlocal last_line
        if stopped():
            raise _StoppedWaiting
        for step in run.unserved_steps(conn=checks):
            if step.step_slug not in warned:
                warned.add(step.step_slug)
                if show:
                    print(file=sys.stderr)
                _warn_unserved(run.flow_slug, step)
        for waiting in run.waiting_signals(conn=checks):
            if waiting.step_slug not in told:
                told.add(waiting.step_slug)
                if show:
                    print(file=sys.stderr)
                until = f" until {cell(waiting.deadline)}" if waiting.deadline else ""
                print(
                    f"step {waiting.step_slug} waits for a signal{until}: send it with"
                    f" `pgflow-gen signal {run_id} {waiting.step_slug} --payload '<JSON>'`",
                    file=sys.stderr,
                )
        elapsed = time.monotonic() - started
        if show:
            print(f"\rwaiting for run {run_id} ... {elapsed:4.0f} s", end="", file=sys.stderr)
        elif elapsed - last_line >= PROGRESS_EVERY_S:
            last_line = int(elapsed)
            print(f"waiting for run {run_id} ... {elapsed:.0f} s", file=sys.stderr)

    try:
        return run.wait(timeout, every_second=tick)
    except TimeoutError:
        raise errors.PgflowError(
            f"Run {run_id} is still running after {timeout:g} s.",
            hint=f"Check it later with `pgflow-gen status {run_id}`.",
        ) from None
    finally:
        checks.close()
        if show:
            print(file=sys.stderr)


def _warn_unserved(flow_slug: str, step: client_module.UnservedStep) -> None:
    try:
        command = project.worker_command(Path.cwd(), flow_slug, step.step_slug)
    except (UsageError, OSError):  # a broken pyproject.toml must not end the wait
        command = None
    how = (
        f"start it with `{command}`"
        if command
        else "start its worker (the generated entry file of the step; see the Procfile)"
    )
    print(
        f'warning: step "{step.step_slug}" has {step.queued_tasks} queued task(s) and no live'
        f" worker on queue {step.queue_name}; {how}",
        file=sys.stderr,
    )


def _status(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        run = conn.execute(operator_statements.RUN_ROW, (args.run_id,)).fetchone()
        if run is None:
            raise errors.PgflowError(f"Run {args.run_id} does not exist.")
        steps = conn.execute(operator_statements.RUN_STEP_STATUS, (args.run_id,)).fetchall()
        pauses = paused_steps(conn)
        limits = step_limits(conn)
    for s in steps:
        pause = pauses.get((run["flow_slug"], s["step_slug"]))
        s["pause"] = pause if s["status"] in ("created", "started") else None
        s["limits"] = limits.get((run["flow_slug"], s["step_slug"]))
        if s["pause"] is not None:
            s["note"] = "; ".join(filter(None, [_pause_cell(pause), s["note"]]))
        if s["limits"] is not None and s["status"] in ("created", "started"):
            limited = f"limited: {limits_cell(s['limits'])}"
            s["note"] = "; ".join(filter(None, [limited, s["note"]]))
        if s["step_type"] == "signal":
            s["queue_name"] = None  # a signal step has no queue
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
                            "retry_count", "retried_at")
            },
            "waiting_for_signals": waiting,
            "steps": [
                {
                    "step_slug": s["step_slug"],
                    "status": s["status"],
                    "queue_name": s["queue_name"],
                    "tasks": s["initial_tasks"],
                    "attempts": s["attempts"],
                    "note": s["note"],
                    "paused": _pause_json(s["pause"]),
                    "limits": limits_json(s["limits"]),
                    "step_type": s["step_type"],
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
    waits = f" (waiting for a signal: {', '.join(waiting)})" if waiting else ""
    print(f"status:  {run['status']}{waits}")
    print(f"started: {cell(run['started_at'])}")
    if run.get("retry_count"):
        print(f"retried: {run['retry_count']} time(s), last at {cell(run['retried_at'])}")
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
             _first_line(s["note"], NOTE_CHARS))
            for s in steps
        ],
        ["step", "status", "queue", "tasks", "attempts", "note"],
        sys.stdout,
    )  # fmt: skip
    for slug in waiting:
        print(f"\nsend step {slug} its signal: pgflow-gen signal {run['run_id']} {slug} --payload"
              " '<JSON>'")  # fmt: skip
    failed = [s for s in steps if s["error_message"] is not None]
    if failed:
        print("\nlast errors:")
    for s in failed:
        print(
            f'  step "{s["step_slug"]}" task {s["task_index"]}, attempt {s["error_attempt"]}'
            f" ({s['task_status']}): {_first_line(s['error_message'])}"
        )
        details = s["error_message"].split("\n", 1)[1:]
        for line in "".join(details).strip("\n").splitlines():
            print(f"    {line}" if line else "")
    return EXIT_OK


def _inherited(own: int | None, flows: int) -> dict[str, Any]:
    """An option as JSON: the value a step runs with, and whether it is the flow's."""
    return {"value": own if own is not None else flows, "from_flow": own is None}


def _first_line(text: str | None, limit: int | None = None) -> str | None:
    """The first line of a stored error (its `Type: message`), cut at `limit` characters."""
    if text is None:
        return None
    line = text.split("\n", 1)[0]
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


def _runs(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1.")
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            require_flow(conn, args.flow_slug)
        rows = conn.execute(
            operator_statements.RUNS,
            {"flow": args.flow_slug, "status": args.status, "limit": args.limit},
        ).fetchall()
    if args.format == "json":
        print_json({
            "runs": [
                {"run_id": r["run_id"], "flow_slug": r["flow_slug"], "status": r["status"],
                 "started_at": r["started_at"], "ended_at": r["ended"],
                 "failed_step": r["failed_step"], "error": _first_line(r["error_message"]),
                 "cancel_reason": r["cancel_reason"]}
                for r in rows
            ]
        })  # fmt: skip
        return EXIT_OK
    table(
        [
            (r["run_id"], r["flow_slug"], r["status"], r["started_at"], r["ended"],
             r["failed_step"], _first_line(r["error_message"] or r["cancel_reason"], NOTE_CHARS))
            for r in rows
        ],
        ["run", "flow", "status", "started", "ended", "failed step", "error or reason"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK


def _flows(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        if args.flow_slug is not None:
            require_flow(conn, args.flow_slug)
        rows = conn.execute(operator_statements.FLOW_STEPS, {"flow": args.flow_slug}).fetchall()

    if args.format == "json":
        print_json({
            "steps": [
                {"flow_slug": r["flow_slug"], "queue_mode": r["queue_mode"],
                 "step_slug": r["step_slug"], "step_type": r["step_type"],
                 "queue_name": r["queue_name"] if r["step_type"] != "signal" else None,
                 # A signal step runs no task: its one option is how long it waits.
                 "options": {"timeout": {"value": r["opt_timeout"], "from_flow": False}}
                 if r["step_type"] == "signal" else {
                     "max_attempts": _inherited(r["opt_max_attempts"], r["flow_max_attempts"]),
                     "base_delay": _inherited(r["opt_base_delay"], r["flow_base_delay"]),
                     "timeout": _inherited(r["opt_timeout"], r["flow_timeout"]),
                     "start_delay": _inherited(r["opt_start_delay"], 0),
                 }}
                for r in rows
            ]
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
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    with connecting.connect(args) as conn:
        rows = conn.execute(statements.WORKERS, (args.all,)).fetchall()
        pauses = paused_steps(conn)
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
            require_flow(conn, args.flow_slug)
        rule = conn.execute(operator_statements.FRESHNESS, (args.freshness,)).fetchone()
        assert rule is not None
        freshness = rule["seconds"]
        rows = conn.execute(
            operator_statements.QUEUE_COVERAGE, (freshness, args.flow_slug, args.flow_slug)
        ).fetchall()
        pauses = paused_steps(conn)
        limits = step_limits(conn)
    uncovered = [r for r in rows if not r["covered"]]
    for r in rows:
        r["paused"] = _pause_json(pauses.get((r["flow_slug"], r["step_slug"])))
        r["limits"] = limits_json(limits.get((r["flow_slug"], r["step_slug"])))
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
                 *([_pause_cell(pauses.get((r["flow_slug"], r["step_slug"])))] if paused else []),
                 *([limits_cell(limits.get((r["flow_slug"], r["step_slug"])))] if limited else []))
                for r in rows
            ],
            ["flow", "step", "queue", "live workers", "covered", *(["paused"] if paused else []),
             *(["limits"] if limited else [])],
            sys.stdout,
        )  # fmt: skip
        print(
            f"\n{len(rows) - len(uncovered)} of {len(rows)} route(s) covered"
            f" (heartbeat within {freshness:g} s)"
        )
    return EXIT_FAILURE if uncovered else EXIT_OK
