"""The `pgflow-gen` command line, one module per command group: `specs` (init, validate, build,
graph), `db` (the embedded server, the engine, the flow migrations), `runs` (start, status,
runs, flows, workers, coverage) and `dev` (with the dev loop and the worker supervisor beside
it). `app` parses and runs a command (`main`), and is the only place that turns errors into messages
and exit statuses (`exits`); the statements every command sends are named in the engine gateway
(`pgflow_gen.engine.operator_statements` and the shared ones).
"""

from __future__ import annotations

from pgflow_gen.cli.app import main
from pgflow_gen.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
)

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
]
