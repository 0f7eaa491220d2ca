"""The pytest plugin of the testing kit (registered as `pgflow` under `pytest11`).

It does nothing until a test asks for its `pgflow` fixture: then one PostgreSQL server starts
for the test session (a throwaway embedded one, or `PGFLOW_TEST_DATABASE_URL`), a template
database with the engine is built once, and each test gets a fresh clone of it. Disable the
plugin with `-p no:pgflow`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgflow_gen.testing import clones
from pgflow_gen.testing.flow_database import FlowDatabase


@pytest.fixture(scope="session")
def pgflow_server_url() -> Iterator[str]:
    """URL of a maintenance database on the test session's PostgreSQL server."""
    with clones.session_server() as url:
        yield url


@pytest.fixture(scope="session")
def pgflow_template(pgflow_server_url: str) -> str:
    """Name of the template database with PGMQ and the engine, built once per server."""
    return clones.engine_template(pgflow_server_url)


@pytest.fixture
def pgflow(pgflow_server_url: str, pgflow_template: str) -> Iterator[FlowDatabase]:
    """A fresh database with the engine for this test, and `run_flow` to run flows in it."""
    with clones.fresh_database(pgflow_server_url, pgflow_template) as url:
        database = FlowDatabase(url)
        yield database
        database.client.close()
