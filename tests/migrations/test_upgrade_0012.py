"""Upgrading 0011 to 0012 (the claim in one call): messages queued before the upgrade are read
and claimed by read_and_claim after it, and a worker of this release on 0011, which has no such
call, reads and claims in two calls instead (here through the testing kit, which claims as a
worker does)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime import Context, Flow, Step, migrations
from pgflow_gen.runtime.session import PsycopgSession
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


def test_a_worker_of_this_release_on_0011_reads_and_claims_in_two_calls(
    version_11: Engine, empty_db_url: str
) -> None:
    async def one_call(url: str) -> Any:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await PsycopgSession(conn).read_and_claim(
                "nothing", "nothing", WORKER_ID, 1, 30, None
            )

    assert asyncio.run(one_call(empty_db_url)) is None  # no such call: the caller falls back

    def shout(flow_input: Any, ctx: Context[Any], /) -> str:
        return str(flow_input["name"]).upper()

    flow: Flow[Any, Any, Any] = Flow(slug="shouting", steps=(Step(slug="shout"),))
    run = asyncio.run(
        runner.run_flow_async(empty_db_url, flow, handlers={"shout": shout}, input={"name": "ada"})
    )
    assert (run.status, run.output) == ("completed", {"shout": "ADA"})
