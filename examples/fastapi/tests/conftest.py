"""The example's database: a fresh one with the engine (the testing kit's `pgflow`), the flow
registered by its generated migration as a deploy does (`pgflow-gen db apply`), and the
application's orders table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from app.main import SCHEMA

from pgflow_gen.testing import FlowDatabase

EXAMPLE = Path(__file__).resolve().parents[1]


@pytest.fixture
def orders_db(pgflow: FlowDatabase) -> FlowDatabase:
    subprocess.run(
        [Path(sys.executable).parent / "pgflow-gen", "db", "apply"],
        cwd=EXAMPLE, env={**os.environ, "PGFLOW_DATABASE_URL": pgflow.url},
        check=True, capture_output=True,
    )  # fmt: skip
    with pgflow.connect() as conn:
        conn.execute(SCHEMA)
    return pgflow
