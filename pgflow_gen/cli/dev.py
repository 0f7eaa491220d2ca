"""`pgflow-gen dev`: build, migrate and run every worker of the project, rebuilding and
restarting what a change affects (devloop.py; the worker processes: supervisor.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pgflow_gen.cli import devloop
from pgflow_gen.cli import parser as cli_parser


def register(commands: cli_parser.Commands) -> None:
    """Add `dev` to the `pgflow-gen` parser."""
    dev = commands.add(
        "dev", "build, migrate and run every worker; rebuild and restart on changes", database=True
    )
    dev.set_defaults(handler=_dev)


def _dev(args: argparse.Namespace) -> int:
    settings = devloop.Settings.of(Path.cwd())
    return devloop.DevLoop(settings, args.database_url).run()
