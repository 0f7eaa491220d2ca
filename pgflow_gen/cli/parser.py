"""The `pgflow-gen` argument parser's conventions, in one place.

- Global options (`--database-url`, `--format`, `--debug`) go before or after the command:
  `pgflow-gen --format json coverage` is `pgflow-gen coverage --format json`. After the command
  they win. A global option the command does not take is a usage error, not silently ignored.
- Every option's help shows its default.
- `Commands.add(...)` makes a subcommand that takes the database URL and an output format when
  asked, and records its name for messages.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from pgflow_gen.errors import UsageError

DATABASE_URL_HELP = (
    "PostgreSQL URL (default: $PGFLOW_DATABASE_URL, else $DATABASE_URL, else the project's"
    " embedded server)"
)


class HelpFormatter(argparse.HelpFormatter):
    """Adds `(default: X)` to an option's help unless there is no default to show or the help
    already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default in (None, False, argparse.SUPPRESS)
            or "default" in text
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def parser(**kwargs: Any) -> argparse.ArgumentParser:
    """The top-level parser with the global options."""
    top = argparse.ArgumentParser(formatter_class=HelpFormatter, **kwargs)
    top.add_argument("--database-url", help=DATABASE_URL_HELP)
    top.add_argument(
        "--format", help="output format of the command (see its --help for the choices)"
    )
    top.add_argument("--debug", action="store_true", help="show the traceback of an internal error")
    return top


class Commands:
    """Adds subcommands that follow the conventions above."""

    def __init__(self, subparsers: Any, prefix: str = "") -> None:
        self._subparsers = subparsers
        self._prefix = prefix

    def add(
        self,
        name: str,
        help: str,
        *,
        database: bool = False,
        formats: Sequence[str] = (),
        format_help: str = "output format",
    ) -> argparse.ArgumentParser:
        command = f"{self._prefix}{name}"
        sub: argparse.ArgumentParser = self._subparsers.add_parser(
            name, help=help, description=help, formatter_class=HelpFormatter
        )
        if database:
            # SUPPRESS: given before the command, the top-level value stays.
            sub.add_argument("--database-url", default=argparse.SUPPRESS, help=DATABASE_URL_HELP)
        if formats:
            sub.add_argument(
                "--format",
                choices=formats,
                default=argparse.SUPPRESS,
                help=f"{format_help}: {', '.join(formats)} (default: {formats[0]})",
            )
        sub.set_defaults(
            command=command, takes_database_url=database, format_choices=tuple(formats)
        )
        return sub

    def group(self, name: str, help: str) -> Commands:
        """A command with subcommands of its own (`pgflow-gen db migrate`)."""
        sub = self._subparsers.add_parser(
            name, help=help, description=help, formatter_class=HelpFormatter
        )
        return Commands(sub.add_subparsers(title=f"{name} commands"), f"{self._prefix}{name} ")


def settle(args: argparse.Namespace) -> None:
    """Check the global options against the command and fill in its default format; raises
    UsageError for a global option the command does not take."""
    command = getattr(args, "command", "this command")
    choices: tuple[str, ...] = getattr(args, "format_choices", ())
    if args.format is None:
        args.format = choices[0] if choices else None
    elif not choices:
        raise UsageError(f"pgflow-gen {command} has no --format option.")
    elif args.format not in choices:
        raise UsageError(
            f"--format {args.format} is not a format of pgflow-gen {command}.",
            hint=f"Choose one of: {', '.join(choices)}.",
        )
    if args.database_url is not None and not getattr(args, "takes_database_url", False):
        raise UsageError(f"pgflow-gen {command} does not use a database (--database-url).")


def accept_everywhere(top: argparse.ArgumentParser, flag: str, help: str) -> None:
    """Let every subcommand take the boolean `flag` too (`pgflow-gen build --debug ...`)."""
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                # SUPPRESS: a subcommand without the flag keeps the main parser's value.
                subparser.add_argument(
                    flag, action="store_true", default=argparse.SUPPRESS, help=help
                )
                accept_everywhere(subparser, flag, help)
