"""Where the database is: `--database-url`, `PGFLOW_DATABASE_URL`, `DATABASE_URL`, else embedded."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import conninfo

from pgflow_gen.runtime import embedded, errors, project_root

ENV_VARS = ("PGFLOW_DATABASE_URL", "DATABASE_URL")
#: What libpq says of a setting it cannot use (it says it when connecting, before any I/O).
_BAD_SETTING = re.compile(r"^invalid \S+ (value|number)\b|for connection option")
#: libpq's own prefixes to its connection errors, as psycopg passes them on.
_PREFIXES = ("connection is bad: ", "connection failed: ")
_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*):[^@\s]*@")
_PASSWORD_SETTING = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def configured_url(explicit: str | None = None) -> str | None:
    """The URL the user configured, or None when the embedded default applies."""
    if explicit:
        return explicit
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def resolve_url(
    explicit: str | None = None,
    *,
    project: Path | None = None,
    on_start: Callable[[Path], None] | None = None,
) -> str:
    """The URL to connect to, starting the project's embedded server when nothing is configured
    (`project`, else the project root of the current folder: runtime/project_root.py);
    `on_start(root)` is called first when that server has to be started.

    >>> resolve_url("postgresql://localhost/app")
    'postgresql://localhost/app'
    """
    url = configured_url(explicit)
    if url is not None:
        return url
    root = project or project_root.find(Path.cwd())
    server = embedded.EmbeddedServer.for_project(root)
    if on_start is not None and not server.is_running():
        on_start(root)
    return server.ensure_started()


def check_url(url: str) -> None:
    """Raise ConfigError for a database URL (or key=value string) libpq cannot parse, before
    anything connects.

    >>> check_url("postgresql://app@localhost:5432/app")
    >>> check_url("postgresq://app@localhost/app")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    pgflow_gen.errors.ConfigError: The database URL is not valid: missing "=" after ...
    """
    try:
        conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise bad_url(exc) from None


def config_problem(exc: psycopg.Error) -> errors.ConfigError | None:
    """The ConfigError for a failed connection attempt that no retry can fix (a malformed URL,
    a setting libpq rejects such as `sslmode=bogus`); None for a real connection failure (the
    server is down or unreachable), which is worth retrying. An error the server sent (it has a
    SQLSTATE: a missing table, a refused statement) is none of these."""
    if exc.sqlstate is not None:
        return None
    if isinstance(exc, psycopg.ProgrammingError):
        return bad_url(exc)
    if isinstance(exc, psycopg.OperationalError) and _BAD_SETTING.search(_libpq_message(exc)):
        return bad_url(exc)
    return None


def bad_url(exc: psycopg.Error) -> errors.ConfigError:
    return errors.ConfigError(
        f"The database URL is not valid: {redact(_libpq_message(exc))}.",
        hint="Check --database-url, PGFLOW_DATABASE_URL and DATABASE_URL (the first one set is"
        " used); a URL looks like postgresql://user:password@host:5432/dbname.",
    )


def redact(text: str) -> str:
    """`text` with any password in a URL or key=value string in it replaced by ***.

    >>> redact('bad "postgresql://app:s3cret@db/app" and password=s3cret')
    'bad "postgresql://app:***@db/app" and password=***'
    """
    return _PASSWORD_SETTING.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1:***@", text))


def _libpq_message(exc: psycopg.Error) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    return text.rstrip(".")
