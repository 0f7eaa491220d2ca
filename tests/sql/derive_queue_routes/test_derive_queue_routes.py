"""The SQL resolver against the shared naming vectors (the Python resolver reads the same file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.engine import Engine

VECTORS = json.loads((Path(__file__).parents[2] / "vectors" / "queue_names.json").read_text())


def derive(engine: Engine, flow_slug: str, step_slugs: list[str], mode: str) -> list[Any]:
    return engine.all(
        "select * from pgflow.derive_queue_routes(%s, %s::text[], %s)", flow_slug, step_slugs, mode
    )


@pytest.mark.parametrize("case", VECTORS["routes"], ids=[c["name"] for c in VECTORS["routes"]])
def test_routes_match_the_vectors(engine: Engine, case: dict[str, Any]) -> None:
    args = (case["flow_slug"], case["step_slugs"], case["queue_mode"])
    if "routes" in case:
        rows = derive(engine, *args)
        assert [r["queue_name"] for r in rows] == case["routes"]
        assert [r["step_slug"] for r in rows] == case["step_slugs"]
        assert [r["step_index"] for r in rows] == list(range(len(case["step_slugs"])))
        return
    expected = case["error"]
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        derive(engine, *args)
    diag = raised.value.diag
    assert diag.message_primary == expected["message"]
    if "detail" in expected:
        assert diag.message_detail == expected["detail"]
    if "hint" in expected:
        assert diag.message_hint == expected["hint"]


def test_the_spec_example_texts_word_for_word(engine: Engine) -> None:
    flow = "f" * 44
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        derive(engine, flow, [f"s{i}" for i in range(10)] + ["deliverSlack"], "step")
    diag = raised.value.diag
    assert diag.message_primary == (
        f'Cannot derive a queue for step "deliverSlack" at index 10 in flow "{flow}".'
    )
    assert diag.message_detail == (
        "The readable name is 58 characters and the index fallback is 48; PGMQ allows at most 47."
    )
    assert diag.message_hint == (
        "Shorten the concrete flow slug, shorten the step slug enough for the readable name,"
        " or use the default single queue."
    )


def test_is_pure(engine: Engine) -> None:
    before = engine.value("select count(*) from pgmq.meta")
    derive(engine, "communityThreadsV1", ["classify", "deliverSlack"], "step")
    assert engine.value("select count(*) from pgmq.meta") == before
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_asks_pgmq_to_validate_every_name(engine: Engine) -> None:
    # This database only: make PGMQ's own validation refuse one name, and the resolver follows.
    engine.conn.execute(
        """create or replace function pgmq.validate_queue_name(queue_name text) returns void
        language plpgsql as $$ begin
          if queue_name = 'orders__fetch' then raise exception 'pgmq refuses %', queue_name; end if;
        end $$"""
    )
    with pytest.raises(psycopg.errors.RaiseException, match="pgmq refuses orders__fetch"):
        derive(engine, "orders", ["store", "fetch"], "step")


def test_rejects_an_unknown_queue_mode(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='Unknown queue mode "steps"'):
        derive(engine, "orders", ["fetch"], "steps")
