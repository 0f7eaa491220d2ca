"""Upgrading 0015 to 0016 (operators' actions, runs' trace contexts): work in flight on 0015
completes after the upgrade through the calls earlier workers make, its runs have no trace
context, and starts keep their signatures."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import migrations
from tests.engine import Engine


@pytest.fixture
def version_15(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0015")]
        assert applied[-1] == "0015"
        yield Engine(conn)


def test_a_run_started_on_0015_completes_on_0016(version_15: Engine) -> None:
    engine = version_15
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    run_id = engine.start("chain")
    [task] = engine.poll("chain")

    assert [m.version for m in migrations.migrate(engine.conn, target="0016")] == ["0016"]

    engine.complete(task, "one")
    [task] = engine.poll("chain")
    engine.complete(task, "two")
    run = engine.run(run_id)
    assert (run["status"], run["traceparent"]) == ("completed", None)
    assert engine.value("select count(*) from pgflow.operator_actions") == 0
    again = engine.conn.execute(
        "select run_id from pgflow.start_flow('chain', %s, null, 'key-1')", (Jsonb({}),)
    ).fetchone()
    assert again is not None
