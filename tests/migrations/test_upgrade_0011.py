"""Upgrading a populated 0010 database to 0011 (retries, signal steps, permanent failures):
queued and running work is kept and completes through the calls workers of the previous release
make (fail_task with five arguments among them); a run that failed before the upgrade can be
retried after it; descriptions of flows without signal steps hash as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import migrations
from tests.engine import Engine


@pytest.fixture
def version_10(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0010")]
        assert applied[-1] == "0010"
        yield Engine(conn)


def test_work_in_flight_survives_the_upgrade_and_completes(version_10: Engine) -> None:
    engine = version_10
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    running = engine.start("chain", {"n": 1})
    queued = engine.start("chain", {"n": 2})
    [claimed] = engine.poll("chain", qty=1)
    before: list[dict[str, Any]] = engine.all(
        "select run_id, step_slug, status, attempts_count from pgflow.step_tasks order by 1, 2"
    )

    assert [m.version for m in migrations.migrate(engine.conn, target="0011")] == ["0011"]

    assert (
        engine.all(
            "select run_id, step_slug, status, attempts_count from pgflow.step_tasks order by 1, 2"
        )
        == before
    )
    assert engine.run(claimed.run_id)["retry_count"] == 0
    # The previous release's calls: a fenced failure with five arguments, then completions.
    assert engine.fail(claimed, "flaky", fenced=True)["status"] == "queued"
    engine.make_visible("chain")
    for _ in range(3):
        for task in engine.poll("chain"):
            engine.complete(task, "done", fenced=True)
    finished = {engine.run(run_id)["status"] for run_id in (running, queued)}
    assert finished == {"completed"}


def test_a_run_that_failed_before_the_upgrade_can_be_retried(version_10: Engine) -> None:
    engine = version_10
    engine.flow("single", {"slug": "only"}, max_attempts=1)
    run_id = engine.start("single", {})
    [task] = engine.poll("single")
    engine.fail(task, "before")
    migrations.migrate(engine.conn)

    [row] = engine.call("retry_run", run_id)

    assert (row["status"], row["retry_count"]) == ("started", 1)
    [again] = engine.poll("single")
    engine.complete(again, "after", fenced=True)
    assert engine.run(run_id)["output"] == {"only": "after"}


def test_a_flow_description_without_signals_is_the_same_one_after_the_upgrade(
    version_10: Engine,
) -> None:
    engine = version_10
    steps = [{"slug": "only", "options": {"timeout": 9}}]
    engine.compile("described", steps, mode="flow")
    hashes = engine.all("select description_hash from pgflow.flow_descriptions")
    migrations.migrate(engine.conn)

    assert engine.compile("described", steps, mode="flow")["status"] == "verified"
    assert engine.all("select description_hash from pgflow.flow_descriptions") == hashes
