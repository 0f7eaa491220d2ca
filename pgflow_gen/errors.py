"""The base of every error pgflow-gen raises on purpose: a message, and optionally a detail and a
hint, as PostgreSQL reports errors. Spec errors (`naming.FlowSpecError`) and runtime errors
(`runtime.errors`) build on it. The errors the package exports live here, a leaf module, so that
`import pgflow_gen` loads neither the runtime nor psycopg."""

from __future__ import annotations

from typing import ClassVar

EXCERPT_LENGTH = 60


def excerpt(text: str, limit: int = EXCERPT_LENGTH) -> str:
    """`text` as a message shows it: cut to `limit` characters, so a huge value from a user's
    input never floods the terminal.

    >>> excerpt("x" * 100)
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx… (100 characters)'
    """
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(text):,} characters)"


class PgflowError(Exception):
    code: ClassVar[str] = "pgflow_error"

    def __init__(self, message: str, *, detail: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


class UsageError(PgflowError):
    """A command was called wrongly: a bad option value, an unknown flow, a broken config file.
    The CLI exits 2 for it, as for an invalid spec."""

    code = "usage_error"


class ConfigError(PgflowError):
    """Invalid configuration: a missing database, a bad option value."""

    code = "config_error"


class DatabaseError(PgflowError):
    """The database could not be reached, started or used."""

    code = "database_error"


class MigrationError(PgflowError):
    """An engine migration could not be applied, or an applied one was changed afterwards."""

    code = "migration_error"


class InvalidRunInputError(PgflowError):
    """A run input that does not match the flow's input type or schema; nothing was written."""

    code = "invalid_run_input"
