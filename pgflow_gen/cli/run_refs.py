"""Run ids as the run commands take them (`status`, `cancel`, `retry`, `signal`): the whole id,
or its first 8 characters or more, as the dashboard's search box takes them. A prefix that one
run has is that run; one that several have is a usage error listing them; one that none has is
an error, as an unknown whole id is."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import psycopg

from pgflow_gen import run_ids
from pgflow_gen.cli.output import cell
from pgflow_gen.engine import operator_statements
from pgflow_gen.errors import PgflowError, UsageError

#: The candidates an ambiguous prefix lists at most.
LISTED = 10

Ref = uuid.UUID | str


def argument(text: str) -> Ref:
    """argparse's type for a RUN_ID argument."""
    try:
        return run_ids.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolve(conn: psycopg.Connection[dict[str, Any]], ref: Ref) -> uuid.UUID:
    """The run `ref` names (a whole id is taken as it is: the command says if it exists)."""
    if isinstance(ref, uuid.UUID):
        return ref
    rows = conn.execute(operator_statements.RUNS_IN_ID_RANGE, run_ids.id_range(ref)).fetchall()
    if not rows:
        raise PgflowError(f"No run id starts with {ref}.")
    if len(rows) == 1:
        found: uuid.UUID = rows[0]["run_id"]
        return found
    many = f"{len(rows)}" if len(rows) <= LISTED else f"More than {LISTED}"
    raise UsageError(
        f"{many} runs have ids that start with {ref}; nothing was done.",
        detail="\n".join(
            f"{r['run_id']}  {r['flow_slug']}  {r['status']}  started {cell(r['started_at'])}"
            for r in rows[:LISTED]
        ),
        hint="Give more characters of the id (or the whole id).",
    )
