"""Upgrading 0013 to 0014 (fewer statements per task, completion and claim in one call): the
messages 0013's complete_task left for the next claim to archive are archived by the upgrade,
and work claimed before it completes after it through the calls earlier workers make."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import migrations
from tests.engine import WORKER_ID, Engine


@pytest.fixture
def version_13(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0013")]
        assert applied[-1] == "0013"
        yield Engine(conn)


def read_and_claim(engine: Engine, queue: str) -> list[tuple[Any, ...]]:
    return engine.conn.execute(
        "select run_id, step_slug, task_index, attempt, msg_id"
        " from pgflow.read_and_claim(%s, %s, %s, 10, 30)",
        (queue, queue, WORKER_ID),
    ).fetchall()


def test_completed_messages_left_for_the_next_claim_are_archived(version_13: Engine) -> None:
    engine = version_13
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    engine.start("chain")
    engine.register("chain")
    [(run_id, step, index, attempt, msg_id)] = read_and_claim(engine, "chain")
    engine.conn.execute(
        "select pgflow.complete_task(%s, %s, %s, %s, %s)",
        (run_id, step, index, Jsonb("done"), attempt),
    )
    assert engine.value("select count(*) from pgflow.archivable_messages") == 1

    assert [m.version for m in migrations.migrate(engine.conn, target="0014")] == ["0014"]

    assert engine.value("select count(*) from pgflow.archivable_messages") == 0
    assert engine.archived_ids("chain") == {msg_id}


def test_work_claimed_before_the_upgrade_completes_after_it(version_13: Engine) -> None:
    engine = version_13
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    run_id = engine.start("chain", {})
    engine.register("chain")
    [(_, step, index, attempt, _)] = read_and_claim(engine, "chain")

    migrations.migrate(engine.conn, target="0014")

    engine.conn.execute(
        "select pgflow.complete_task(%s, %s, %s, %s, %s)",
        (run_id, step, index, Jsonb("done"), attempt),
    )
    [(_, second, index, attempt, _)] = read_and_claim(engine, "chain")
    assert second == "second"
    engine.conn.execute(
        "select pgflow.complete_task(%s, %s, %s, %s, %s)",
        (run_id, second, index, Jsonb("also done"), attempt),
    )
    assert engine.run(run_id)["status"] == "completed"
    assert engine.queued_messages("chain") == []
