from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Db, Workers


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(db_url, tmp_path)
    yield started
    started.close()


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    database = Db(db_url)
    yield database
    database.close()
