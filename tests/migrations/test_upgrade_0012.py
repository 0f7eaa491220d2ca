"""Upgrading 0011 to 0012 (the claim in one call): messages queued before the upgrade are read
and claimed by read_and_claim after it; a worker of this release on 0011, older than its support
window, is refused before it claims anything (here through the testing kit, which starts as a
worker does)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import Context, Flow, Step, migrations
from pgflow_gen.runtime.errors import DatabaseError
from pgflow_gen.testing import runner
from tests.engine import WORKER_ID, Engine


@pytest.fixture
def version_11(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target="0011")]
        assert applied[-1] == "0011"
        yield Engine(conn)


def test_work_queued_before_the_upgrade_is_claimed_in_one_call_after_it(
    version_11: Engine,
) -> None:
    engine = version_11
    engine.flow("single", {"slug": "only"})
    run_id = engine.start("single", {})
    assert [m.version for m in migrations.migrate(engine.conn, target="0012")] == ["0012"]
    engine.register("single")
    [row] = engine.conn.execute(
        "select run_id, attempt from pgflow.read_and_claim('single', 'single', %s, 10, 30)",
        (WORKER_ID,),
    ).fetchall()
    assert row == (run_id, 1)


def test_a_worker_of_this_release_on_0011_is_refused_before_it_claims(
    version_11: Engine, empty_db_url: str
) -> None:
    def shout(flow_input: Any, ctx: Context[Any], /) -> str:
        return str(flow_input["name"]).upper()

    flow: Flow[Any, Any, Any] = Flow(slug="shouting", steps=(Step(slug="shout"),))
    with pytest.raises(DatabaseError) as refused:
        asyncio.run(
            runner.run_flow_async(
                empty_db_url, flow, handlers={"shout": shout}, input={"name": "ada"}
            )
        )
    assert refused.value.detail == (
        "Its engine is at migration 0011; this release works with migration 0020 and later."
    )
    assert version_11.value("select count(*) from pgflow.flows") == 0
