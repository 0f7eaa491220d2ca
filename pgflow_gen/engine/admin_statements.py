"""Every statement that administers an engine, by name: applying its migrations, the embedded
server's settings and the testing kit's databases. Literal strings with bound parameters; the
few that need an identifier or a literal composed in say so and are composed with
`psycopg.sql`.
"""

from __future__ import annotations

from typing import Final, LiteralString

from psycopg import sql

# -- engine migrations ---------------------------------------------------------------------------
#: Whether PGMQ is there, as SQL or as an extension.
HAS_PGMQ: Final[LiteralString] = (
    "select exists (select 1 from pg_namespace where nspname = 'pgmq')"
    " or exists (select 1 from pg_extension where extname = 'pgmq')"
)
#: Whether any engine migration was applied.
HAS_MIGRATIONS: Final[LiteralString] = "select to_regclass('pgflow.schema_migrations') is not null"
#: The applied engine migrations: (version, checksum) rows.
APPLIED_MIGRATIONS: Final[LiteralString] = "select version, checksum from pgflow.schema_migrations"
#: The same as a line of the engine script for other migration tools: literals composed in.
RECORD_MIGRATION_SCRIPT: Final[LiteralString] = (
    "insert into pgflow.schema_migrations (version, name, checksum) values ({}, {}, {});"
)
#: One migrator at a time, for the whole session: (namespace, key).
LOCK_FOR_SESSION: Final[LiteralString] = "select pg_advisory_lock(%s, %s)"
#: (namespace, key).
UNLOCK_FOR_SESSION: Final[LiteralString] = "select pg_advisory_unlock(%s, %s)"
#: (version, name, checksum).
RECORD_MIGRATION: Final[LiteralString] = (
    "insert into pgflow.schema_migrations (version, name, checksum) values (%s, %s, %s)"
)


def set_lock_timeout(timeout: str) -> sql.Composed:
    """Bound this transaction's waits for locks to `timeout` (as '5s')."""
    return sql.SQL("set local lock_timeout = {}").format(sql.Literal(timeout))


def comment_on_pgmq(comment: str) -> sql.Composed:
    """Say on the pgmq schema who installed it."""
    return sql.SQL("comment on schema pgmq is {}").format(sql.Literal(comment))


# -- the embedded server -------------------------------------------------------------------------
#: Marks the embedded server's database as local (`pgflow.local`), for the engine's checks.
MARK_LOCAL: Final[LiteralString] = "alter database postgres set pgflow.local = 'on'"

# -- the testing kit's databases -----------------------------------------------------------------
#: (name) -> a row if the database exists.
DATABASE_EXISTS: Final[LiteralString] = "select 1 from pg_database where datname = %s"


def create_database(name: str, template: str | None = None) -> sql.Composed:
    """CREATE DATABASE `name`, as a copy of `template` when one is given."""
    statement = sql.SQL("create database {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" template {} strategy wal_log").format(sql.Identifier(template))
    return statement


def drop_database(name: str) -> sql.Composed:
    """Drop `name` if it exists, ending its sessions."""
    return sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))


def rename_database(old: str, new: str) -> sql.Composed:
    return sql.SQL("alter database {} rename to {}").format(
        sql.Identifier(old), sql.Identifier(new)
    )
