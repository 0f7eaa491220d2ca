"""Databases for tests: one PostgreSQL server per test session, a template database with PGMQ
and the engine installed (built once per server and engine version), and a fresh clone of it per
test (`CREATE DATABASE ... TEMPLATE ... STRATEGY WAL_LOG`, some tens of milliseconds).

The server is a throwaway embedded one (deleted at the end) unless `PGFLOW_TEST_DATABASE_URL`
names a server whose user may create databases; `PGFLOW_TEST_PG_BIN` runs the embedded-style
server from another PostgreSQL `bin/` directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgflow_gen.engine import admin_statements
from pgflow_gen.runtime import embedded, migrations
from pgflow_gen.runtime.sql import shipped

#: A server URL (its user may create databases) to use instead of a throwaway embedded server.
SERVER_URL_VARIABLE = "PGFLOW_TEST_DATABASE_URL"
#: Another PostgreSQL `bin/` directory for the throwaway server (say, Debian's PostgreSQL 15).
PG_BIN_VARIABLE = "PGFLOW_TEST_PG_BIN"


@contextlib.contextmanager
def session_server(environ: Mapping[str, str] | None = None) -> Iterator[str]:
    """Yield the URL of a maintenance database on the tests' server: the one named by
    PGFLOW_TEST_DATABASE_URL, or a throwaway embedded server, deleted afterwards."""
    environ = os.environ if environ is None else environ
    external = environ.get(SERVER_URL_VARIABLE)
    if external:
        yield external
        return
    bin_dir = Path(environ.get(PG_BIN_VARIABLE) or embedded.default_bin_dir())
    base = Path(tempfile.mkdtemp(prefix="pgflow-test-"))
    server = embedded.EmbeddedServer(base, bin_dir, fast=True, local=False)
    try:
        yield server.ensure_started()
    finally:
        server.destroy()


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    """Create database `name` (a clone of `template` when given) and return its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(admin_statements.create_database(name, template))
    return with_dbname(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(admin_statements.drop_database(name))


def engine_fingerprint() -> str:
    """A hash of the PGMQ and engine SQL: a template built from other SQL has another name."""
    digest = hashlib.sha256()
    script, version = migrations.pgmq_sql()
    digest.update(version.encode() + script.encode())
    for migration in shipped.available():
        digest.update(migration.version.encode() + migration.sql.encode())
    return digest.hexdigest()[:16]


def engine_template(admin_url: str) -> str:
    """The name of a database with PGMQ and the engine installed, built unless it exists.

    Built under a temporary name and renamed when complete, so concurrent test processes (say,
    pytest-xdist) never clone a half-built template; they may both build one, and one rename
    wins.
    """
    name = f"pgflow_tpl_{engine_fingerprint()}"
    if _exists(admin_url, name):
        return name
    building = f"{name}_building_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, building)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(admin_statements.rename_database(building, name))
    except psycopg.errors.DuplicateDatabase:
        pass  # another process finished first: use its template
    finally:
        drop_database(admin_url, building)
    return name


@contextlib.contextmanager
def fresh_database(admin_url: str, template: str, prefix: str = "pgflow_test") -> Iterator[str]:
    """Yield the URL of a new clone of `template`, dropped afterwards (with its connections)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


def _exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute(admin_statements.DATABASE_EXISTS, (name,)).fetchone()
    return row is not None
