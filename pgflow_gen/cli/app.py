"""`pgflow-gen`'s entry point: the parser of every command group, and the one place that turns
errors into messages and exit statuses (exits.py).

A user's mistake is one line and exit 2, a failure one line and exit 1; an internal error (a
bug) is one line and exit 70, with the traceback under --debug or PGFLOW_DEBUG=1; Ctrl-C is 130.
A closed pipe (`... | head`) ends the command quietly, as coreutils tools do.

Only the command group of the command asked for is imported (all of them for `--help` or an
unknown command), so `--version`, `validate` and `build` load no database driver; a database
error can then only come from a group that did (`database_errors`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Final

from pgflow_gen import naming
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
)
from pgflow_gen.errors import PgflowError, UsageError
from pgflow_gen.runtime.sql import shipped

#: The command groups, modules of `pgflow_gen.cli` with a `register(commands)`, in help order.
GROUPS: Final = (
    "specs", "dev", "db", "runs", "control", "fork", "limits", "schedules", "signals", "prune",
    "dashboard",
)  # fmt: skip
#: The group that registers each command (a test checks it against what they register).
GROUP_OF: Final = {
    **dict.fromkeys(("init", "validate", "build", "graph"), "specs"),
    "dev": "dev",
    "db": "db",
    **dict.fromkeys(("start", "status", "runs", "flows", "workers", "coverage"), "runs"),
    **dict.fromkeys(("cancel", "retry", "pause", "resume"), "control"),
    "fork": "fork",
    "limits": "limits",
    "schedules": "schedules",
    "signal": "signals",
    "prune": "prune",
    "dashboard": "dashboard",
    "metrics": "dashboard",
}
#: The global options that take a value (`--format json status`).
_VALUED: Final = ("--database-url", "--format")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(_groups_for(argv))
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
    except PgflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # a file or folder of the user's that cannot be read or written
        if isinstance(exc, BrokenPipeError):
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:
        # Only a command group that imported the database driver can fail in it.
        driver = sys.modules.get("psycopg")
        if driver is None or not isinstance(exc, driver.Error):
            raise
        from pgflow_gen.cli import database_errors  # imports the driver too: only now

        code = database_errors.report(exc)
    return code


def _groups_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The command groups `argv` needs: the one of its command, none for `--version` alone, all
    for help, no command or an unknown one."""
    command = _named_command(argv)
    if command in GROUP_OF:
        return (GROUP_OF[command],)
    if command is None and "--version" in argv and not {"-h", "--help"} & set(argv):
        return ()
    return GROUPS


def _named_command(argv: Sequence[str]) -> str | None:
    """The first word of `argv` that is neither a global option nor an option's value."""
    words = iter(argv)
    for word in words:
        if word in _VALUED:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _parser(groups: Sequence[str] = GROUPS) -> argparse.ArgumentParser:
    parser = cli_parser.parser(
        prog="pgflow-gen", description="Typed, durable workflows on PostgreSQL + PGMQ."
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = cli_parser.Commands(parser.add_subparsers(title="commands"))
    for group in groups:
        importlib.import_module(f"pgflow_gen.cli.{group}").register(commands)
    cli_parser.accept_everywhere(parser, "--debug", help="show the traceback of an internal error")
    return parser


def _version() -> str:
    try:
        version = importlib.metadata.version("pgflow-gen")
    except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
        version = "unknown"
    engine = shipped.available()[-1].version
    return f"pgflow-gen {version} (engine {engine})"
