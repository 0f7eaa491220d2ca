"""Upgrading 0017 to 0018 (fair concurrency per key): work queued and claimed on 0017 finishes
after the upgrade, a flow that gains a concurrency key keeps its earlier tasks unkeyed and parks
the new ones, and a flow without a key runs as before."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import migrations
from tests.engine import Engine, shape_step


@pytest.fixture
def version_17(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0017")]
        assert applied[-1] == "0017"
        yield Engine(conn)


def test_work_from_0017_finishes_and_a_new_key_parks_only_new_tasks(version_17: Engine) -> None:
    engine = version_17
    plain = {"steps": [shape_step("render")], "options": {"maxAttempts": 3}}
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(plain))
    before = [engine.start("reports", {"tenant": "a"}) for _ in range(4)]
    claimed = engine.poll("reports", qty=1)

    assert [m.version for m in migrations.migrate(engine.conn, target="0018")] == ["0018"]

    keyed = {
        "steps": [
            shape_step("render", options={"concurrencyKey": "$.tenant", "concurrencyLimit": 1})
        ],
        "options": {"maxAttempts": 3},
    }
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(keyed))
    after = [engine.start("reports", {"tenant": "a"}) for _ in range(3)]

    assert [engine.task(r, "render")["concurrency_key"] for r in before + after] == [None] * 4 + [
        "a"
    ] * 3
    assert [engine.task(r, "render")["message_id"] is None for r in after] == [False, True, True]
    for task in claimed:
        engine.complete(task, "done")
    while tasks := engine.poll("reports"):
        for task in tasks:
            engine.complete(task, "done")
    assert {engine.run(r)["status"] for r in before + after} == {"completed"}
    assert engine.value("select count(*) from pgflow.concurrency_keys") == 0
    assert engine.value("select count(*) from pgflow.parked_tasks") == 0
