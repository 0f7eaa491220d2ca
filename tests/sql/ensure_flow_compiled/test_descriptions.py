"""A flow's description (its input schema and options) follows the newest spec, never an older
one (engine 0009): a description the database has not seen is adopted, one it has seen but is
not the current one is kept out (an old worker during a rollback or a rolling deploy), unless
the caller adopts it explicitly, as a generated migration does, or the database is local."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine import Engine
from tests.sql.ensure_flow_compiled.test_ensure_flow_compiled import ensure, local, step

V1_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}
V2_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
}


def spec(version: int) -> dict[str, Any]:
    """Version 1 or 2 of one flow: the same steps, another timeout and input schema."""
    return {
        "steps": [step("fetch", options={"timeout": 10 * version}), step("save", "fetch")],
        "options": {"maxAttempts": 3},
        "inputSchema": V1_SCHEMA if version == 1 else V2_SCHEMA,
    }


def stored(engine: Engine) -> tuple[Any, Any]:
    return (
        engine.value("select input_schema from pgflow.flows where flow_slug = 'shaped'"),
        engine.value("select opt_timeout from pgflow.steps where step_slug = 'fetch'"),
    )


def test_a_new_description_is_adopted(engine: Engine) -> None:
    ensure(engine, spec(1))
    assert ensure(engine, spec(2))["optionsUpdated"] == [
        {"step": "fetch", "option": "timeout", "from": 10, "to": 20}
    ]
    assert stored(engine) == (V2_SCHEMA, 20)


def test_an_older_description_is_kept_out_and_said_so(engine: Engine) -> None:
    ensure(engine, spec(1))
    ensure(engine, spec(2))
    adopted_at = engine.value(
        "select date_trunc('second', max(adopted_at))::text from pgflow.flow_descriptions"
    )
    result = ensure(engine, spec(1))
    assert result == {
        "status": "verified",
        "mismatchKind": None,
        "differences": [],
        "descriptionKept": True,
        "summary": f"verified; kept the options and input schema adopted at {adopted_at}:"
        " this description of the flow is an older one",
    }
    assert stored(engine) == (V2_SCHEMA, 20)
    # The current one still verifies quietly: an old and a new worker side by side never flap.
    quiet: dict[str, Any] = {"status": "verified", "mismatchKind": None, "differences": []}
    assert ensure(engine, spec(2)) == quiet
    assert stored(engine) == (V2_SCHEMA, 20)


def test_an_explicit_adoption_restores_an_older_description(engine: Engine) -> None:
    ensure(engine, spec(1))
    ensure(engine, spec(2))
    with engine.conn.transaction():
        engine.conn.execute("select set_config('pgflow.adopt_description', 'on', true)")
        assert ensure(engine, spec(1))["optionsUpdated"] == [
            {"step": "fetch", "option": "timeout", "from": 20, "to": 10}
        ]
    assert stored(engine) == (V1_SCHEMA, 10)
    # Version 1 is now the current one, so version 2 is the older one.
    assert ensure(engine, spec(2)).get("descriptionKept") is True
    assert stored(engine) == (V1_SCHEMA, 10)


def test_a_local_database_adopts_every_description(engine: Engine) -> None:
    local(engine)
    ensure(engine, spec(1))
    ensure(engine, spec(2))
    assert "descriptionKept" not in ensure(engine, spec(1))
    assert stored(engine) == (V1_SCHEMA, 10)


@pytest.mark.parametrize("change", ["inputSchema", "flow option", "step option"])
def test_each_part_of_the_description_makes_it_another(engine: Engine, change: str) -> None:
    first = spec(1)
    second = spec(1)
    if change == "inputSchema":
        second["inputSchema"] = V2_SCHEMA
    elif change == "flow option":
        second["options"] = {"maxAttempts": 4}
    else:
        second["steps"][1]["options"] = {"startDelay": 3}
    ensure(engine, first)
    ensure(engine, second)
    assert ensure(engine, first).get("descriptionKept") is True


def test_a_flow_compiled_before_0009_adopts_its_next_description(engine: Engine) -> None:
    ensure(engine, spec(2))
    engine.conn.execute("delete from pgflow.flow_descriptions")  # as a flow compiled by 0008
    assert "descriptionKept" not in ensure(engine, spec(1))
    assert stored(engine) == (V1_SCHEMA, 10)


def test_deleting_the_flow_forgets_its_descriptions(engine: Engine) -> None:
    ensure(engine, spec(1))
    ensure(engine, spec(2))
    engine.conn.execute("select pgflow.delete_flow_and_data('shaped')")
    assert engine.value("select count(*) from pgflow.flow_descriptions") == 0
    assert ensure(engine, spec(1))["status"] == "compiled"
    assert stored(engine) == (V1_SCHEMA, 10)
