"""Upgrading 0018 to 0019 (least privilege): a deployment without roles (the owner everywhere,
here a superuser) keeps working: work claimed on 0018 completes, new runs run, flows still
compile, and nothing runs for PUBLIC any more; then roles can be granted."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import migrations
from tests.engine import Engine, shape_step


@pytest.fixture
def version_18(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0018")]
        assert applied[-1] == "0018"
        yield Engine(conn)


def test_work_from_0018_finishes_as_the_owner(version_18: Engine) -> None:
    engine = version_18
    shape = {"steps": [shape_step("fetch"), shape_step("store", ("fetch",))]}
    engine.value("select pgflow.ensure_flow_compiled('sync', %s)", Jsonb(shape))
    before = [engine.start("sync", {"page": n}) for n in range(3)]
    claimed = engine.poll("sync", qty=2)
    assert engine.value(
        "select has_function_privilege('public', 'pgflow.start_flow(text, jsonb, uuid, text)',"
        " 'execute')"
    )

    assert [m.version for m in migrations.migrate(engine.conn, target="0019")] == ["0019"]

    after = [engine.start("sync", {"page": n}) for n in range(3, 5)]
    for task in claimed:
        engine.complete(task, {"rows": 1})
    while tasks := engine.poll("sync"):
        for task in tasks:
            engine.complete(task, {"rows": 1})
    assert {engine.run(r)["status"] for r in before + after} == {"completed"}
    assert (
        engine.value("select pgflow.ensure_flow_compiled('sync', %s) ->> 'status'", Jsonb(shape))
        == "verified"
    )
    assert (
        engine.value(
            "select count(*) from pg_proc where pronamespace = 'pgflow'::regnamespace"
            " and has_function_privilege('public', oid, 'execute')"
        )
        == 0
    )
    assert engine.value("select count(*) from pgflow.engine_roles") == 0
