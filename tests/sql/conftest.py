from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import Engine


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    return Engine(conn)
