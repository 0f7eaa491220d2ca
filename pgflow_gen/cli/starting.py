"""`pgflow-gen start FLOW --input JSON [--wait]`: one run, started through the `Client` (the
input checked against the flow's compiled schema first); `--wait` follows it to its end with a
progress display and says how it ended. Many runs from a file: `bulk`."""

from __future__ import annotations

import argparse
import contextlib
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

from pgflow_gen.cli import bulk, connecting, existing, project
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK
from pgflow_gen.cli.output import cell, print_json
from pgflow_gen.engine import statements
from pgflow_gen.errors import PgflowError, UsageError
from pgflow_gen.runtime import Client, Run, errors, input_examples
from pgflow_gen.runtime import client as client_module
from pgflow_gen.runtime.client import run_calls
from pgflow_gen.words import counted


def start(args: argparse.Namespace) -> int:
    """Start one run (`--input`) or one per line of a file (`--inputs`, `bulk`)."""
    bulk.check_arguments(args)
    run_calls.check_priority(args.priority)
    if args.inputs is not None:
        with connecting.connect(args) as conn:
            existing.require_flow(conn, args.flow_slug)
            return bulk.start_many(args, conn)
    url = connecting.database_url(args.database_url)
    try:
        run_input = json.loads(args.input)
    except json.JSONDecodeError as exc:
        example = _example_input(url, args.flow_slug)
        hint = (
            f"For example --input '{example}' (an input of {args.flow_slug})."
            if example
            else "Pass the run input as one JSON value, quoted for your shell."
        )
        raise UsageError(f"--input is not JSON: {exc}", hint=hint) from None
    # Checked as every command checks its flow: the same words for a database it cannot reach.
    with connecting.connect_to(url) as conn:
        existing.require_flow(conn, args.flow_slug)
        schema = conn.execute(statements.FLOW_INPUT_SCHEMA, (args.flow_slug,)).fetchone()
    example = input_examples.example_text(schema["schema"] if schema else None)
    with Client(url, pool_size=1) as client:
        wanted = uuid.uuid4()
        try:
            run = client.start_flow(
                args.flow_slug,
                run_input,
                run_id=wanted,
                idempotency_key=args.key,
                priority=args.priority,
            )
        except errors.InvalidRunInputError as exc:
            shown = f"{exc.hint} For example --input '{example}'." if example else exc.hint
            raise UsageError(exc.message, detail=exc.detail, hint=shown) from None
        return _started(args, client, run, created=run.run_id == wanted)


def _example_input(url: str, flow_slug: str) -> str | None:
    """An input of the flow for a hint, from its compiled schema; None when there is none, or
    when the database cannot tell (the hint does without: the input's own error comes first)."""
    try:
        with connecting.connect_to(url) as conn:
            row = conn.execute(statements.FLOW_INPUT_SCHEMA, (flow_slug,)).fetchone()
    except (PgflowError, psycopg.Error):
        return None
    return input_examples.example_text(row["schema"] if row else None)


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
        f'warning: step "{step.step_slug}" has {counted(step.queued_tasks, "queued task")}'
        f" and no live worker on queue {step.queue_name}; {how}",
        file=sys.stderr,
    )
