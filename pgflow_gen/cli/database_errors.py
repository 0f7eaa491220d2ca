"""What a command prints when the database (or libpq) refuses it: one line, its detail and a
hint, never a password the URL holds. `app` sends every psycopg error here."""

from __future__ import annotations

import sys

import psycopg

from pgflow_gen.cli.exits import EXIT_FAILURE
from pgflow_gen.engine import roles, support
from pgflow_gen.runtime import database


def report(exc: psycopg.Error) -> int:
    """Print what the database (or libpq) refused, without any password the URL holds."""
    problem = database.config_problem(exc)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
    elif support.engine_missing(exc):
        # As a worker says it: the command reached a database without the engine's objects.
        print(
            f"error: The database has no pgflow engine (or an older one):"
            f" {exc.diag.message_primary}.\nHINT: {support.MIGRATE_HINT}",
            file=sys.stderr,
        )
    elif isinstance(exc, psycopg.errors.InsufficientPrivilege):
        diag = exc.diag
        print(f"error: {diag.message_primary or exc}", file=sys.stderr)
        if diag.message_detail:
            print(f"  detail: {diag.message_detail}", file=sys.stderr)
        print(f"  hint: {roles.refusal_hint(exc)}", file=sys.stderr)
    elif isinstance(exc, psycopg.OperationalError):
        reason = database.redact(str(exc)).rstrip()
        print(f"error: cannot reach the database: {reason}", file=sys.stderr)
    else:
        diag = exc.diag
        print(f"error: {diag.message_primary or exc}", file=sys.stderr)
        for label, text in (("detail", diag.message_detail), ("hint", diag.message_hint)):
            if text:
                print(f"  {label}: {text}", file=sys.stderr)
    return EXIT_FAILURE
