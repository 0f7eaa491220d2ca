"""Typed runtime errors: a message, optionally a detail and a hint, as PostgreSQL reports them."""

from __future__ import annotations

from pgflow_gen.errors import PgflowError

__all__ = ["ConfigError", "DatabaseError", "MigrationError", "PgflowError"]


class ConfigError(PgflowError):
    """Invalid configuration: a missing database, a bad option value."""

    code = "config_error"


class DatabaseError(PgflowError):
    """The database could not be reached, started or used."""

    code = "database_error"


class MigrationError(PgflowError):
    """An engine migration could not be applied, or an applied one was changed afterwards."""

    code = "migration_error"
