"""`pgflow-gen`'s entry point: the parser of every command group, and the one place that turns
errors into messages and exit statuses (exits.py).

A user's mistake is one line and exit 2, a failure one line and exit 1; an internal error (a
bug) is one line and exit 70, with the traceback under --debug or PGFLOW_DEBUG=1; Ctrl-C is 130.
A closed pipe (`... | head`) ends the command quietly, as coreutils tools do.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Sequence

import psycopg

from pgflow_gen import naming
from pgflow_gen.cli import (
    control,
    dashboard,
    db,
    dev,
    limits,
    prune,
    runs,
    schedules,
    signals,
    specs,
)
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
)
from pgflow_gen.engine import roles
from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import database, errors
from pgflow_gen.runtime.sql import shipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False)) or os.environ.get("PGFLOW_DEBUG", "") not in (
        "",
        "0",
    )
    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        message = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"internal error: {type(exc).__name__}: {message}; rerun with --debug for the"
            " traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the command; the user's mistakes and the environment's failures become messages."""
    try:
        cli_parser.settle(args)
        code: int = args.handler(args)
    except (UsageError, naming.FlowSpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # a file or folder of the user's that cannot be read or written
        if isinstance(exc, BrokenPipeError):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        return _database_error(exc)
    return code


def _database_error(exc: psycopg.Error) -> int:
    """Print what the database (or libpq) refused, without any password the URL holds."""
    problem = database.config_problem(exc)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
    elif _engine_missing(exc):
        # As a worker says it: the command reached a database without the engine's objects.
        print(
            f"error: The database has no pgflow engine (or an older one):"
            f" {exc.diag.message_primary}.\nHINT: Run `pgflow-gen db migrate` against this"
            " database first.",
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


def _engine_missing(exc: psycopg.Error) -> bool:
    """A table, function or schema of the engine does not exist here."""
    missing = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    return isinstance(exc, missing) and "pgflow" in (exc.diag.message_primary or "")


def _parser() -> argparse.ArgumentParser:
    parser = cli_parser.parser(
        prog="pgflow-gen", description="Typed, durable workflows on PostgreSQL + PGMQ."
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = cli_parser.Commands(parser.add_subparsers(title="commands"))

    for group in (specs, dev, db, runs, control, limits, schedules, signals, prune, dashboard):
        group.register(commands)
    cli_parser.accept_everywhere(parser, "--debug", help="show the traceback of an internal error")
    return parser


def _version() -> str:
    try:
        version = importlib.metadata.version("pgflow-gen")
    except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
        version = "unknown"
    engine = shipped.available()[-1].version
    return f"pgflow-gen {version} (engine {engine})"
