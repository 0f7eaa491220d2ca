"""The support window: the engine versions this release works with, read once per connection.

A release runs on its own engine migrations and the previous release's (OLDEST), so workers,
clients and the CLI of either release keep working while a deploy upgrades the engine
(`pgflow-gen db migrate`) and then the processes; it has no fallbacks for older engines. A
process that finds an engine older than the window, or none, stops with one line saying to
migrate (`docs/operations/upgrading.md`, "The support window"). The version is the newest row of
`pgflow.schema_migrations`, which every migration writes (`pgflow-gen db migrate`, `db sql`).
A statement that differs across the window is chosen by `version(conn)`, read once per
connection (`statements.workers`, `statements.step_limit_usage`).

>>> check("0023")
>>> check("0019")
Traceback (most recent call last):
...
pgflow_gen.errors.DatabaseError: The database has no pgflow engine (or an older one).
DETAIL: Its engine is at migration 0019; this release works with migration 0020 and later.
HINT: Run `pgflow-gen db migrate` against this database first.
"""

from __future__ import annotations

import weakref
from typing import Any, Final, LiteralString, NoReturn

import psycopg
from psycopg.rows import tuple_row

from pgflow_gen import errors

#: What to do about a database without this release's engine, wherever it is said.
MIGRATE_HINT: Final = "Run `pgflow-gen db migrate` against this database first."

#: The oldest engine migration this release works with: the previous release's. (This release
#: brings 0021 to 0029.)
OLDEST: Final = "0020"
#: A function engine migration OLDEST added: how a role that may not read the migrations table
#: (a worker whose grants an older release made) still tells OLDEST from an older engine. Later
#: migrations keep its signature while a release that checks it is supported.
OLDEST_MARKER: Final = "pgflow.cancelled_runs(uuid[])"

#: () -> whether the migrations table exists, whether this role may read it, whether the engine
#: has OLDEST_MARKER: catalog lookups any role may make, which never fail.
PROBE: Final[LiteralString] = (
    "select to_regclass('pgflow.schema_migrations') is not null,"
    " coalesce(has_table_privilege(to_regclass('pgflow.schema_migrations'), 'select'), false),"
    " to_regprocedure(%s) is not null"
)
NEWEST_MIGRATION: Final[LiteralString] = "select max(version) from pgflow.schema_migrations"

#: The version each open connection read (`require`), so `version` reads it once per connection.
_VERSIONS: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def check(version: str | None) -> None:
    """Raise DatabaseError unless `version` (None: no engine) is inside the support window."""
    if version is None:
        _refuse("It has no engine migrations (pgflow.schema_migrations).")
    elif version < OLDEST:
        _refuse(
            f"Its engine is at migration {version}; this release works with migration"
            f" {OLDEST} and later."
        )


def decide(probe: tuple[Any, ...], newest: str | None) -> str:
    """The engine's version from PROBE's row and, when the role may read it, the newest
    migration; raises DatabaseError outside the window."""
    exists, readable, has_marker = probe
    if exists and not readable:  # a role without the grant: the catalog says enough
        if not has_marker:
            _refuse(f"Its engine is older than migration {OLDEST}, which this release needs.")
        return OLDEST
    version = newest if exists else None
    check(version)
    assert version is not None
    return version


def require(conn: psycopg.Connection[Any]) -> str:
    """The engine's version, checked against the window (DatabaseError outside it)."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        probe = cursor.execute(PROBE, (OLDEST_MARKER,)).fetchone()
        assert probe is not None
        newest = None
        if probe[0] and probe[1]:
            row = cursor.execute(NEWEST_MIGRATION).fetchone()
            newest = row[0] if row else None
    _VERSIONS[conn] = found = decide(probe, newest)
    return found


def version(conn: psycopg.Connection[Any]) -> str:
    """The engine's version as `conn` read it with `require`, or reads it now (DatabaseError
    outside the window)."""
    return _VERSIONS.get(conn) or require(conn)


async def require_async(conn: psycopg.AsyncConnection[Any]) -> str:
    """`require` on an async connection."""
    async with conn.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(PROBE, (OLDEST_MARKER,))
        probe = await cursor.fetchone()
        assert probe is not None
        newest = None
        if probe[0] and probe[1]:
            await cursor.execute(NEWEST_MIGRATION)
            row = await cursor.fetchone()
            newest = row[0] if row else None
    _VERSIONS[conn] = found = decide(probe, newest)
    return found


async def version_async(conn: psycopg.AsyncConnection[Any]) -> str:
    """`version` on an async connection."""
    return _VERSIONS.get(conn) or await require_async(conn)


def _refuse(detail: str) -> NoReturn:
    raise missing_engine_error(detail)


def missing_engine_error(detail: str) -> errors.DatabaseError:
    """What every part says of a database without this release's engine: one line, why, and
    the hint to migrate."""
    return errors.DatabaseError(
        "The database has no pgflow engine (or an older one).", detail=detail, hint=MIGRATE_HINT
    )


def engine_missing(exc: psycopg.Error) -> bool:
    """Whether `exc` says a table, function or schema of the engine does not exist here."""
    missing = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    return isinstance(exc, missing) and "pgflow" in (exc.diag.message_primary or "")
