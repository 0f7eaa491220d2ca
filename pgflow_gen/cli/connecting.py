"""Which database a command talks to (the URL given, the environment's, else the embedded server
of the project root), a connection to it inside the support window, and an operator's action
recorded with the CLI's label."""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from pgflow_gen.engine import support
from pgflow_gen.errors import ConfigError
from pgflow_gen.runtime import database, embedded, project_root
from pgflow_gen.runtime.client import operations

T = TypeVar("T")


def database_url(explicit: str | None) -> str:
    """The database a command uses: `explicit`, the environment, else the embedded server of the
    project of the current folder (found from a subfolder too), saying on stderr which project
    when it starts that server. Outside a project, with no URL, a ConfigError says where it
    looked: a command never starts a server in a folder that is not a project."""

    def say(root: Path) -> None:
        print(f"starting the embedded PostgreSQL of {root}", file=sys.stderr)

    if database.configured_url(explicit) is not None:
        return database.resolve_url(explicit)
    here = Path.cwd()
    project = project_root.find_project(here)
    if project is None:
        raise ConfigError(
            "No database URL, and no pgflow-gen project here to start one for.",
            detail=f"Looked in {here} and every folder above it for a pyproject.toml with"
            " [tool.pgflow-gen] or an embedded server (`pgflow-gen db start`).",
            hint="Run it from your project's folder, pass --database-url (or set"
            " PGFLOW_DATABASE_URL), or create a project with `pgflow-gen init`.",
        )
    return database.resolve_url(explicit, project=project, on_start=say)


def server_root() -> Path:
    """The project root whose embedded server commands use (runtime/project_root.py)."""
    return project_root.find(Path.cwd())


def embedded_server() -> embedded.EmbeddedServer:
    return embedded.EmbeddedServer.for_project(server_root())


def connect(args: argparse.Namespace) -> psycopg.Connection[dict[str, Any]]:
    """A connection to the command's database, whose engine is inside this release's support
    window (DatabaseError otherwise: one line saying to migrate)."""
    return connect_to(database_url(args.database_url))


def connect_to(url: str) -> psycopg.Connection[dict[str, Any]]:
    """`connect` for a URL resolved already."""
    conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
    try:
        support.require(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def perform(conn: psycopg.Connection[dict[str, Any]], action: operations.Action[T]) -> T:
    """An operator's action in its own transaction, which the engine records in
    `pgflow.operator_actions` with the login role as the actor and the CLI's label beside it
    (`pgflow-gen (user@host)`, what this process says of itself)."""
    return operations.perform(conn, action, label=_operator_label())


def _operator_label() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment nor the password database
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"pgflow-gen ({user}@{socket.gethostname()})"
