from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import PROJECT, Db, Workers

PLAIN_MIGRATION = PROJECT / "app" / "pgflow" / "migrations" / "e2ePlain.sql"
#: The application's own tables, made before any flow migration is applied.
APP_SCHEMA = PROJECT / "app" / "schema.sql"


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(db_url, tmp_path)
    yield started
    started.close()


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    """The test database, with the e2e application's own tables."""
    database = Db(db_url)
    database.conn.execute(APP_SCHEMA.read_bytes())
    yield database
    database.close()


@pytest.fixture
def plain(db: Db) -> Db:
    """The test database with e2ePlain compiled by its generated migration."""
    db.conn.execute(PLAIN_MIGRATION.read_text())
    return db
