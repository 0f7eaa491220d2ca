"""`pgflow-gen signal RUN STEP --payload JSON`: give a signal step of a run its payload, which
becomes the step's output. The engine checks the payload against the step's `signal.payload`
schema; a step that is not ready yet keeps the signal until it is."""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg

from pgflow_gen.cli import connecting, existing, run_refs, runs
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import print_json
from pgflow_gen.engine import operator_statements, refusals, support
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.client import operations

#: What `signal --format json` prints of the signal the engine took.
JSON_KEYS = ("run_id", "step_slug", "received_at", "used_at")


def register(commands: cli_parser.Commands) -> None:
    """Add `signal` to the `pgflow-gen` parser."""
    signal = commands.add(
        "signal",
        "give a run's signal step its payload: the run goes on from there",
        database=True,
        formats=runs.FORMATS,
    )
    signal.add_argument(
        "run_id", metavar="RUN_ID", type=run_refs.argument, help="the run (8+ characters)"
    )
    signal.add_argument("step_slug", metavar="STEP", help="its signal step")
    signal.add_argument(
        "--payload",
        required=True,
        metavar="JSON",
        help="the payload, as the step's signal.payload schema describes it",
    )
    signal.set_defaults(handler=_signal)


def _signal(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--payload is not JSON: {exc}", hint="For example --payload '{\"approved\": true}'."
        ) from None
    with connecting.connect(args) as conn:
        args.run_id = run_refs.resolve(conn, args.run_id)
        run = conn.execute(operator_statements.RUN_ROW, (args.run_id,)).fetchone()
        if run is None:
            raise errors.PgflowError(f"Run {args.run_id} does not exist.")
        _require_signal_step(conn, run["flow_slug"], args.step_slug)
        try:
            sent = connecting.perform(
                conn, operations.send_signal(args.run_id, args.step_slug, payload)
            )
        except refusals.InvalidSignalPayloadError as error:
            raise UsageError(error.message, detail=error.detail, hint=error.hint) from error
        except refusals.SignalRefusedError as error:
            if run["status"] != "failed":
                raise
            # The engine's hint names its SQL function; here the command says what to run.
            raise refusals.SignalRefusedError(
                error.message,
                detail=error.detail,
                hint=f"Nothing was changed. Retry the run first (`pgflow-gen retry"
                f" {args.run_id}`), then send the signal.",
            ) from error
    if args.format == "json":
        print_json({key: getattr(sent, key) for key in JSON_KEYS})
    elif sent.used_at is not None:
        print(f"step {args.step_slug} of run {args.run_id} took the signal: the run goes on")
    else:
        print(
            f"run {args.run_id} keeps the signal until step {args.step_slug} is ready (it waits"
            " for the steps before it)"
        )
    return EXIT_OK


def _require_signal_step(conn: psycopg.Connection[dict[str, Any]], flow: str, step: str) -> None:
    """Raise UsageError unless the flow has the signal step, naming a near one."""
    rows = conn.execute(
        operator_statements.flow_steps(support.version(conn)), {"flow": flow}
    ).fetchall()
    signals = [r["step_slug"] for r in rows if r["step_type"] == "signal"]
    if step in signals:
        return
    if not signals:
        raise UsageError(f'Flow "{flow}" has no signal step.', hint="Nothing was sent.")
    near = existing.near_match(step, signals)
    listed = f"Signal steps of {flow}: {', '.join(signals)}."
    if step in {r["step_slug"] for r in rows}:
        message = (
            f'Step "{step}" of flow "{flow}" is not a signal step: its tasks report its output.'
        )
    else:
        message = f'Flow "{flow}" has no signal step "{step}".'
    raise UsageError(
        message, hint=f'Did you mean "{near}"? Slugs are exact. {listed}' if near else listed
    )
