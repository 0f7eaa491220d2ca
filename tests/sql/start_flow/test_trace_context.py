"""start_flow and start_flows keep the caller's W3C trace context (engine 0016), read from the
transaction's `pgflow.traceparent` setting; anything that is not a traceparent is ignored."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def traced_start(engine: Engine, setting: str | None, *, many: bool = False) -> list[object]:
    with engine.conn.transaction():
        if setting is not None:
            engine.conn.execute("select set_config('pgflow.traceparent', %s, true)", (setting,))
        if many:
            rows = engine.conn.execute(
                "select traceparent from pgflow.start_flows('traced', %s::jsonb[])",
                ([Jsonb({}), Jsonb({})],),
            ).fetchall()
        else:
            rows = engine.conn.execute(
                "select traceparent from pgflow.start_flow('traced', '{}')"
            ).fetchall()
    return [row[0] for row in rows]


def test_a_run_keeps_the_callers_traceparent(engine: Engine) -> None:
    engine.flow("traced", {"slug": "a"})
    assert traced_start(engine, PARENT) == [PARENT]
    assert traced_start(engine, PARENT, many=True) == [PARENT, PARENT]


def test_without_one_or_after_the_transaction_a_run_has_none(engine: Engine) -> None:
    engine.flow("traced", {"slug": "a"})
    assert traced_start(engine, None) == [None]
    traced_start(engine, PARENT)
    assert traced_start(engine, None) == [None]  # the setting ended with its transaction


@pytest.mark.parametrize(
    "setting",
    ["", "garbage", PARENT.upper(), PARENT + "-extra", "00-0af7651916cd43dd-b7ad6b7169203331-01"],
)
def test_anything_else_is_ignored_never_an_error(engine: Engine, setting: str) -> None:
    engine.flow("traced", {"slug": "a"})
    assert traced_start(engine, setting) == [None]
