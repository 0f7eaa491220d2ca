"""A flow's input JSON Schema is stored with it by ensure_flow_compiled (engine 0006): on
compilation, recompilation and verification; never compared; kept when a shape has none."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.engine import Engine, shape_step

NAMED: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}
AGED: dict[str, Any] = {
    **NAMED,
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
}


def ensure(engine: Engine, schema: Any = None, *, steps: int = 1) -> str:
    shape: dict[str, Any] = {"steps": [shape_step(f"s{i}") for i in range(steps)]}
    if schema is not None:
        shape["inputSchema"] = schema
    result = engine.value("select pgflow.ensure_flow_compiled('typed', %s)", Jsonb(shape))
    return str(result["status"])


def stored(engine: Engine) -> Any:
    return engine.value("select input_schema from pgflow.flows where flow_slug = 'typed'")


def test_compiling_stores_the_schema(engine: Engine) -> None:
    assert ensure(engine, NAMED) == "compiled"
    assert stored(engine) == NAMED


def test_a_new_schema_for_the_same_steps_is_verified_and_stored(engine: Engine) -> None:
    ensure(engine, NAMED)
    assert ensure(engine, AGED) == "verified"
    assert stored(engine) == AGED


def test_a_shape_without_a_schema_keeps_the_stored_one(engine: Engine) -> None:
    # A worker from before engine 0006 compiles without one.
    ensure(engine, NAMED)
    assert ensure(engine) == "verified"
    assert stored(engine) == NAMED


def test_a_mismatch_changes_no_schema(engine: Engine) -> None:
    ensure(engine, NAMED)
    assert ensure(engine, AGED, steps=2) == "mismatch"
    assert stored(engine) == NAMED


def test_a_local_recompilation_stores_the_new_schema(engine: Engine) -> None:
    ensure(engine, NAMED)
    engine.conn.execute("set pgflow.local = 'on'")
    assert ensure(engine, AGED, steps=2) == "recompiled"
    assert stored(engine) == AGED


@pytest.mark.parametrize("schema", [[1], "object", True, 3])
def test_a_schema_that_is_not_an_object_is_refused(engine: Engine, schema: Any) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='"inputSchema" must be'):
        ensure(engine, schema)
    assert engine.value("select count(*) from pgflow.flows") == 0
