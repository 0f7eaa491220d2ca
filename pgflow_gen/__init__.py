"""pgflow-gen: durable, typed workflows on PostgreSQL + PGMQ, generated from YAML specs."""

from __future__ import annotations

from pgflow_gen.runtime.errors import ConfigError, DatabaseError, MigrationError, PgflowError

__all__ = ["ConfigError", "DatabaseError", "MigrationError", "PgflowError"]
