"""Upgrading 0014 to 0015 (pruning in batches): a schedule's one-argument call keeps working
and prunes as before, and the batched call is there after the upgrade."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgflow_gen.runtime import migrations
from tests.engine import Engine


@pytest.fixture
def version_14(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0014")]
        assert applied[-1] == "0014"
        yield Engine(conn)


def test_a_scheduled_one_argument_prune_works_before_and_after_the_upgrade(
    version_14: Engine,
) -> None:
    engine = version_14
    engine.flow("old", {"slug": "a"})
    for i in range(3):
        engine.run_to_end("old", {"a": i})
    engine.conn.execute("update pgflow.runs set completed_at = now() - interval '10 days'")
    prune = "select pgflow.prune_data_older_than(interval '7 days')"
    assert engine.value(prune) == {"runs": 3, "workers": 0, "archived_messages": 0}

    assert [m.version for m in migrations.migrate(engine.conn, target="0015")] == ["0015"]

    engine.run_to_end("old", {"a": 9})
    engine.conn.execute("update pgflow.runs set completed_at = now() - interval '10 days'")
    assert engine.value(prune) == {"runs": 1, "workers": 0, "archived_messages": 0, "done": True}
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_the_batched_prune_exists_only_from_0015(version_14: Engine) -> None:
    batched = "select to_regprocedure('pgflow.prune_data_older_than(interval, integer)')"
    assert version_14.value(batched) is None
    migrations.migrate(version_14.conn, target="0015")
    assert version_14.value(batched) is not None
