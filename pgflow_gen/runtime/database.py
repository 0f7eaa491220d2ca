"""Where the database is: `--database-url`, `PGFLOW_DATABASE_URL`, `DATABASE_URL`, else embedded."""

from __future__ import annotations

import os
from pathlib import Path

from pgflow_gen.runtime import embedded

ENV_VARS = ("PGFLOW_DATABASE_URL", "DATABASE_URL")


def configured_url(explicit: str | None = None) -> str | None:
    """The URL the user configured, or None when the embedded default applies."""
    if explicit:
        return explicit
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def resolve_url(explicit: str | None = None, *, project: Path | None = None) -> str:
    """The URL to connect to, starting the project's embedded server when nothing is configured.

    >>> resolve_url("postgresql://localhost/app")
    'postgresql://localhost/app'
    """
    url = configured_url(explicit)
    if url is not None:
        return url
    server = embedded.EmbeddedServer.for_project(project or Path.cwd())
    return server.ensure_started()
