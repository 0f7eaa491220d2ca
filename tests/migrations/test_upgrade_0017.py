"""Upgrading 0016 to 0017 (flow control): tasks claimed on 0016 finish after the upgrade, a flow
without limits claims as before, and a cap set after the upgrade counts the tasks already
started (claimed before there were limits)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import migrations
from tests.engine import Engine, shape_step


@pytest.fixture
def version_16(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0016")]
        assert applied[-1] == "0016"
        yield Engine(conn)


def test_work_claimed_on_0016_finishes_and_counts_against_a_new_cap(version_16: Engine) -> None:
    engine = version_16
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    runs = [engine.start("chain") for _ in range(4)]
    claimed = engine.poll("chain", qty=2)

    assert [m.version for m in migrations.migrate(engine.conn, target="0017")] == ["0017"]

    engine.call("set_step_limits", "chain", "first", max_in_flight=3)
    [usage] = engine.all("select in_flight from pgflow.step_limit_usage('chain')")
    assert usage == {"in_flight": 2}
    [third] = engine.poll("chain")
    assert third.step_slug == "first"
    assert engine.poll("chain") == []
    for task in [*claimed, third]:
        engine.complete(task, "one")
    engine.call("set_step_limits", "chain", "first")  # cleared
    engine.make_visible("chain")  # the message held back for a second
    while tasks := engine.poll("chain"):
        for task in tasks:
            engine.complete(task, "done")
    assert {engine.run(r)["status"] for r in runs} == {"completed"}


def test_a_flow_compiled_on_0016_takes_its_schedules_on_0017(version_16: Engine) -> None:
    engine = version_16
    shape: dict[str, Any] = {"steps": [shape_step("build")], "options": {"maxAttempts": 3}}
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(shape))

    assert [m.version for m in migrations.migrate(engine.conn, target="0017")] == ["0017"]

    again = engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(shape))
    assert again == {"status": "verified", "mismatchKind": None, "differences": []}  # same hash
    shape["schedules"] = [{"name": "nightly", "cron": "0 2 * * *", "input": {}}]
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(shape))
    assert engine.all("select schedule_name, catch_up, timezone from pgflow.schedules") == [
        {"schedule_name": "nightly", "catch_up": "none", "timezone": "UTC"}
    ]
