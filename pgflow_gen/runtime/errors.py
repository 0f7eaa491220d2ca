"""Typed runtime errors: a message, optionally a detail and a hint, as PostgreSQL reports them."""

from __future__ import annotations


class PgflowError(Exception):
    """Base of every error pgflow-gen raises on purpose."""

    code = "pgflow_error"

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


class ConfigError(PgflowError):
    """Invalid configuration: a missing database, a bad option value."""

    code = "config_error"


class DatabaseError(PgflowError):
    """The database could not be reached, started or used."""

    code = "database_error"


class MigrationError(PgflowError):
    """An engine migration could not be applied, or an applied one was changed afterwards."""

    code = "migration_error"
