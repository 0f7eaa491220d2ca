"""Upgrading 0012 to 0013 (one insert notification per statement): a queue that notified through
PGMQ's per-row trigger notifies through the engine's statement trigger after the upgrade, keeps
PGMQ's throttle row (which workers of earlier releases look for), and its listeners still hear
every insert."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgflow_gen.runtime import migrations
from tests.engine import Engine


@pytest.fixture
def version_12(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0012")]
        assert applied[-1] == "0012"
        yield Engine(conn)


def test_queues_with_pgmqs_trigger_get_the_engines(version_12: Engine, empty_db_url: str) -> None:
    engine = version_12
    engine.flow("listened", {"slug": "only"})
    engine.flow("quiet", {"slug": "only"})
    engine.value("select pgmq.enable_notify_insert('listened', 0)")  # as a 0012 worker did

    assert [m.version for m in migrations.migrate(engine.conn, target="0013")] == ["0013"]

    def triggers(queue: str) -> list[str]:
        return [
            r["tgname"]
            for r in engine.all(
                "select tgname from pg_trigger where tgrelid = %s::regclass and not tgisinternal",
                f"pgmq.q_{queue}",
            )
        ]

    assert triggers("listened") == ["pgflow_notify_insert"]
    assert triggers("quiet") == []  # nobody listened: a worker adds it when it starts
    assert (
        engine.value(
            "select count(*) from pgmq.notify_insert_throttle where queue_name = 'listened'"
        )
        == 1
    )
    with psycopg.connect(empty_db_url, autocommit=True) as listener:
        listener.execute('listen "pgmq.q_listened.INSERT"')
        engine.start("listened", {})
        assert len(list(listener.notifies(timeout=5, stop_after=1))) == 1
