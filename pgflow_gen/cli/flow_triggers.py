"""The table triggers `pgflow-gen flows` lists under each flow's steps, and the starts they
skipped (`pgflow-gen flows --skips`), from engine 0032 on: an older engine has none."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import psycopg

from pgflow_gen.cli import connecting
from pgflow_gen.cli.exits import EXIT_OK
from pgflow_gen.cli.output import first_line, print_json, table
from pgflow_gen.engine import operator_statements, statements, support
from pgflow_gen.errors import UsageError

#: The most characters of a skipped start's error a table cell shows (JSON has all of it).
MESSAGE_CHARS = 80


def listed(conn: psycopg.Connection[Any], flow_slug: str | None) -> list[dict[str, Any]]:
    """The table triggers of `flow_slug` (None: of every flow), in flow and name order."""
    if not statements.has_triggers(support.version(conn)):
        return []
    rows = conn.execute(operator_statements.FLOW_TRIGGERS, {"flow": flow_slug}).fetchall()
    return [
        {"flow_slug": r["flow_slug"], "name": r["trigger_name"], "table": r["table_name"],
         "on": r["definition"]["on"], "when": r["definition"]["when"],
         "condition": r["condition"], "input": r["definition"]["input"],
         "on_error": r["on_error"], "applied_at": r["applied_at"]}
        for r in rows
    ]  # fmt: skip


def print_table(triggers: list[dict[str, Any]]) -> None:
    """The triggers as a table for people: their `when` as the SQL the database tests."""
    if not triggers:
        return
    print(file=sys.stdout)
    table(
        [
            (t["flow_slug"], t["name"], t["table"], " or ".join(t["on"]), t["condition"],
             ", ".join(f"{key}={column}" for key, column in sorted(t["input"].items())),
             t["on_error"])
            for t in triggers
        ],
        ["flow", "trigger", "table", "on", "when", "input", "on error"],
        sys.stdout,
    )  # fmt: skip


def skips(args: argparse.Namespace) -> int:
    """`pgflow-gen flows --skips`: the latest starts triggers with on_error skip could not make,
    with their input and error, latest first."""
    if args.limit < 1:
        raise UsageError("--limit must be at least 1.")
    with connecting.connect(args) as conn:  # a deleted flow's skips stay: no flow check
        rows = (
            conn.execute(
                operator_statements.TRIGGER_SKIPS, {"flow": args.flow_slug, "limit": args.limit}
            ).fetchall()
            if statements.has_triggers(support.version(conn))
            else []
        )
    if args.format == "json":
        print_json({"skips": rows})
        return EXIT_OK
    if not rows:
        print("No start was skipped.")
        return EXIT_OK
    table(
        [
            (r["skipped_at"], r["flow_slug"], r["trigger_name"], r["table_name"],
             r["operation"].lower(), r["input"], r["sqlstate"],
             first_line(r["message"], MESSAGE_CHARS))
            for r in rows
        ],
        ["skipped at", "flow", "trigger", "table", "write", "input", "sqlstate", "error"],
        sys.stdout,
    )  # fmt: skip
    return EXIT_OK
