"""Test harness: the testing kit's plugin (`pgflow_gen.testing`) provides one PostgreSQL server
per session and a migrated template database; each test gets a fresh clone (STRATEGY WAL_LOG:
about 25 ms here, where FILE_COPY forces a checkpoint per clone and takes about 170 ms).

The server is the embedded wheel's unless `PGFLOW_TEST_DATABASE_URL` names an external one (its
user must be allowed to create databases); `PGFLOW_TEST_PG_BIN` runs the embedded-style server
from another `bin/` directory, e.g. Debian's PostgreSQL 15.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgflow_gen.runtime import embedded, migrations
from pgflow_gen.testing import clones
from tests import roles as roles_fixture
from tests.roles import Logins


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that touches the database is marked `db`, so `pytest -m "not db"` stays fast.
    for item in items:
        if "pgflow_server_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


@pytest.fixture(scope="session")
def admin_url(pgflow_server_url: str) -> str:
    """URL of a maintenance database on the session's server (the testing kit's)."""
    return pgflow_server_url


@pytest.fixture(scope="session")
def template_name(pgflow_template: str) -> str:
    """A migrated database named by a hash of the PGMQ and engine SQL, built once per server."""
    return pgflow_template


@pytest.fixture
def db_url(admin_url: str, template_name: str) -> Iterator[str]:
    """A fresh, fully migrated database for this test only."""
    with clones.fresh_database(admin_url, template_name) as url:
        yield url


@pytest.fixture
def empty_db_url(admin_url: str) -> Iterator[str]:
    """A fresh database without PGMQ or the engine."""
    name = f"pgflow_empty_{uuid.uuid4().hex[:12]}"
    url = clones.create_database(admin_url, name)
    try:
        yield url
    finally:
        clones.drop_database(admin_url, name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def logins(conn: psycopg.Connection[tuple[object, ...]], db_url: str) -> Iterator[Logins]:
    """The engine's group roles under this test's own prefix, with login roles in them."""
    yield from roles_fixture.logins_on(conn, db_url)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    """A migrated embedded server of this test's own, which the test may stop and start."""
    server = embedded.EmbeddedServer.for_project(tmp_path / "project")
    with psycopg.connect(server.ensure_started(), autocommit=True) as conn:
        migrations.migrate(conn)
    yield server
    server.destroy()
