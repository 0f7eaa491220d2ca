"""Upgrading a populated 0009 database to 0010 (cancelling runs): queued and running work is
kept and then completes through the calls workers of the previous release make; runs started
before the upgrade can be cancelled after it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import Client, Flow, Step, migrations
from pgflow_gen.runtime.errors import DatabaseError
from tests.engine import Engine


@pytest.fixture
def version_9(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0009")]
        assert applied[-1] == "0009"
        yield Engine(conn)


def test_work_in_flight_survives_the_upgrade_and_completes(version_9: Engine) -> None:
    engine = version_9
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    running = engine.start("chain", {"n": 1})
    queued = engine.start("chain", {"n": 2})
    [claimed] = engine.poll("chain", qty=1)
    before: list[dict[str, Any]] = engine.all(
        "select run_id, step_slug, status, attempts_count from pgflow.step_tasks order by 1, 2"
    )

    assert [m.version for m in migrations.migrate(engine.conn, target="0010")] == ["0010"]

    assert (
        engine.all(
            "select run_id, step_slug, status, attempts_count from pgflow.step_tasks order by 1, 2"
        )
        == before
    )
    assert engine.run(claimed.run_id)["cancelled_at"] is None
    # The calls of the previous release's workers: fenced callbacks and the batched completion.
    engine.complete(claimed, "one", fenced=True)
    for task in engine.poll("chain"):
        engine.complete_batch([task], ["two"], fenced=True)
    for task in engine.poll("chain"):
        engine.complete(task, "three", fenced=True)
    finished = {engine.run(run_id)["status"] for run_id in (running, queued)}
    assert finished == {"completed"}


def test_a_run_started_before_the_upgrade_can_be_cancelled(version_9: Engine) -> None:
    engine = version_9
    engine.flow("single", {"slug": "only"})
    run_id = engine.start("single", {})
    migrations.migrate(engine.conn)
    [row] = engine.call("cancel_run", run_id, "after the upgrade")
    assert (row["status"], row["cancel_reason"]) == ("cancelled", "after the upgrade")
    assert engine.poll("single") == []


def test_a_client_of_this_release_on_0009_is_refused_before_it_reads_or_cancels(
    version_9: Engine, empty_db_url: str
) -> None:
    # 0009 is older than this release's support window (engine/support.py): refused up front.
    version_9.flow("single", {"slug": "only"})
    run_id = version_9.start("single", {})
    with Client(empty_db_url) as client:
        calls: list[Callable[[], object]] = [
            lambda: client.get_run(run_id),
            lambda: client.cancel_run(run_id),
        ]
        for call in calls:
            with pytest.raises(DatabaseError) as refused:
                call()
            assert refused.value.message == "The database has no pgflow engine (or an older one)."
            assert refused.value.detail == (
                "Its engine is at migration 0009; this release works with migration 0020 and later."
            )
            assert refused.value.hint == "Run `pgflow-gen db migrate` against this database first."
    assert version_9.run(run_id)["status"] == "started"


def test_a_client_of_this_release_on_0009_starts_nothing(
    version_9: Engine, empty_db_url: str
) -> None:
    version_9.flow("single", {"slug": "only"})
    flow: Flow[Any, Any, Any] = Flow(slug="single", steps=(Step(slug="only"),))
    with Client(empty_db_url) as client:
        for key in (None, "k"):
            with pytest.raises(DatabaseError, match="no pgflow engine"):
                client.start_flow(flow, {}, idempotency_key=key)
    assert version_9.value("select count(*) from pgflow.runs") == 0
