"""Applying the engine's SQL (`runtime/sql/shipped.py` reads the files) to a database.

`migrate()` installs PGMQ as plain SQL when the database has no `pgmq` schema, then applies every
pending engine migration in its own transaction, recording its checksum. Concurrent callers are
serialised by advisory locks, so two `pgflow-gen db migrate` runs at once are safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from pgflow_gen.engine import admin_statements, worker_statements
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.sql import shipped

# Advisory lock keys (two-int form; namespace 1 is used by the engine for flow definitions).
_LOCK_NAMESPACE = 2
_PGMQ_INSTALL_LOCK = 1
_MIGRATE_LOCK = 2
LOCK_TIMEOUT = "10s"


def pgmq_sql() -> tuple[str, str]:
    """PGMQ's own install SQL and its version, from the `pgmq` package."""
    from pgmq import install

    return install.get_embedded_install_sql(), install.get_embedded_sql_version()


def ensure_pgmq(conn: psycopg.Connection[Any]) -> str | None:
    """Install PGMQ as SQL unless the database already has it; return the version installed now.

    An existing PGMQ (an extension on managed PostgreSQL, or an earlier SQL install) is used as
    it is. The install runs under an advisory lock, so concurrent callers install it once.
    """
    if _has_pgmq(conn):
        return None
    script, version = pgmq_sql()
    with conn.transaction():
        conn.execute(worker_statements.LOCK_FOR_TRANSACTION, (_LOCK_NAMESPACE, _PGMQ_INSTALL_LOCK))
        if _has_pgmq(conn):
            return None
        conn.execute(trusted(script))
        comment = f"PGMQ {version}, installed as SQL by pgflow-gen"
        conn.execute(admin_statements.comment_on_pgmq(comment))
    return version


def _has_pgmq(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(admin_statements.HAS_PGMQ).fetchone()
    return bool(row and row[0])


def applied(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Applied engine migrations as {version: checksum} (empty before the first migration)."""
    exists = conn.execute(admin_statements.HAS_MIGRATIONS).fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(admin_statements.APPLIED_MIGRATIONS).fetchall()
    return {str(version): str(checksum) for version, checksum in rows}


def pending(conn: psycopg.Connection[Any], target: str | None = None) -> list[shipped.Migration]:
    """Migrations still to apply (up to `target`), after checking applied ones are unchanged."""
    done = applied(conn)
    known = {m.version: m for m in shipped.available()}
    if target is not None and target not in known:
        raise errors.MigrationError(
            f"Unknown migration target {target!r}.",
            hint=f"Known migrations: {', '.join(sorted(known))}.",
        )
    for version, checksum in sorted(done.items()):
        migration = known.get(version)
        if migration is None:
            raise errors.MigrationError(
                f"The database has engine migration {version}, unknown to this pgflow-gen.",
                hint="Upgrade pgflow-gen to the version that migrated this database.",
            )
        if migration.checksum != checksum:
            raise errors.MigrationError(
                f"Applied migration {version}_{migration.name} was edited after it was applied.",
                detail=f"recorded checksum {checksum}, file checksum {migration.checksum}",
                hint="Migrations are append-only: revert the edit and add a new migration.",
            )
    return [
        m
        for m in known.values()
        if m.version not in done and (target is None or m.version <= target)
    ]


def migrate(
    conn: psycopg.Connection[Any],
    *,
    target: str | None = None,
    on_apply: Callable[[shipped.Migration], None] | None = None,
) -> list[shipped.Migration]:
    """Install PGMQ if missing, then apply pending engine migrations; return those applied.

    `conn` must be in autocommit mode: each migration runs in its own transaction with a bounded
    `lock_timeout`, so a busy table makes the migration fail instead of queueing every caller.
    """
    if not conn.autocommit:
        raise errors.MigrationError("migrate() needs an autocommit connection.")
    ensure_pgmq(conn)
    conn.execute(admin_statements.LOCK_FOR_SESSION, (_LOCK_NAMESPACE, _MIGRATE_LOCK))
    try:
        done: list[shipped.Migration] = []
        for migration in pending(conn, target):
            if on_apply is not None:
                on_apply(migration)
            _apply(conn, migration)
            done.append(migration)
        return done
    finally:
        conn.execute(admin_statements.UNLOCK_FOR_SESSION, (_LOCK_NAMESPACE, _MIGRATE_LOCK))


def _apply(conn: psycopg.Connection[Any], migration: shipped.Migration) -> None:
    try:
        with conn.transaction():
            conn.execute(admin_statements.set_lock_timeout(LOCK_TIMEOUT))
            conn.execute(trusted(migration.sql))
            conn.execute(
                admin_statements.RECORD_MIGRATION,
                (migration.version, migration.name, migration.checksum),
            )
    except psycopg.Error as exc:
        diag = exc.diag
        reason = diag.message_primary or str(exc)
        if diag.message_detail:
            reason = f"{reason}\n{diag.message_detail}"
        raise errors.MigrationError(
            f"Engine migration {migration.version}_{migration.name} failed and was rolled back.",
            detail=reason,
            hint=diag.message_hint,
        ) from exc


def engine_script() -> str:
    """All engine migrations as one script that also records them, for other migration tools."""
    parts = []
    for m in shipped.available():
        parts.append(f"-- pgflow-gen engine migration {m.version}_{m.name}\nbegin;\n")
        parts.append(m.sql.rstrip() + "\n")
        record = sql.SQL(admin_statements.RECORD_MIGRATION_SCRIPT).format(
            sql.Literal(m.version), sql.Literal(m.name), sql.Literal(m.checksum)
        )
        parts.append(f"{record.as_string(None)}\ncommit;\n\n")
    return "".join(parts)


def trusted(text: str) -> sql.SQL:
    """SQL text shipped inside this package (never user input)."""
    return sql.SQL(text)
