"""Upgrading 0029 to 0030 (debounce_start, start_debounced_runs and pgflow.debounced_starts):
work claimed on 0029 finishes, and a flow compiled on 0029 debounces its starts on 0030; deleting
the flow takes its pending starts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_29(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0029") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0030")


def test_work_claimed_on_0029_finishes(version_29: Engine) -> None:
    claimed_work_finishes(version_29, upgrade)


def test_a_flow_compiled_on_0029_debounces_on_0030(version_29: Engine) -> None:
    engine = version_29
    engine.flow("digest", {"slug": "send"})

    upgrade(engine)

    for n in (1, 2, 3):
        engine.one(
            "select * from pgflow._debounce_start('digest', %s::jsonb, 'k', 5, null,"
            " '2026-12-07 12:00:00+00'::timestamptz + make_interval(secs => %s))",
            f'{{"n": {n}}}', n,
        )  # fmt: skip
    [started] = engine.all("select * from pgflow._start_debounced_runs('2026-12-07 12:00:08+00')")
    assert started["starts"] == 3
    assert engine.run(started["run_id"])["input"] == {"n": 3}
    engine.one("select * from pgflow.debounce_start('digest', '{}', 'later', 60)")
    engine.conn.execute("select pgflow.delete_flow_and_data('digest')")
    assert engine.value("select count(*) from pgflow.debounced_starts") == 0
