from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import Engine


def step(slug: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {
        "slug": slug,
        "stepType": extra.pop("stepType", "single"),
        "dependencies": list(deps),
        "whenUnmet": "skip",
        "whenExhausted": "fail",
        "requiredInputPattern": {"defined": False},
        "forbiddenInputPattern": {"defined": False},
        **extra,
    }


SHAPE = {"steps": [step("fetch"), step("save", "fetch")], "options": {"maxAttempts": 5}}


def ensure(engine: Engine, shape: dict[str, Any], slug: str = "shaped") -> dict[str, Any]:
    result: dict[str, Any] = engine.value(
        "select pgflow.ensure_flow_compiled(%s, %s)", slug, psycopg.types.json.Jsonb(shape)
    )
    return result


def local(engine: Engine) -> None:
    engine.conn.execute("set pgflow.local = 'on'")


def test_compiles_a_missing_flow_with_its_options(engine: Engine) -> None:
    shape = {
        "steps": [step("fetch", options={"timeout": 9, "startDelay": 2}), step("save", "fetch")],
        "options": {"maxAttempts": 5},
    }
    assert ensure(engine, shape) == {"status": "compiled", "mismatchKind": None, "differences": []}
    assert engine.value("select opt_max_attempts from pgflow.flows") == 5
    fetch = engine.one("select * from pgflow.steps where step_slug = 'fetch'")
    assert (fetch["opt_timeout"], fetch["opt_start_delay"], fetch["step_index"]) == (9, 2, 0)


def test_verifies_an_identical_flow(engine: Engine) -> None:
    ensure(engine, SHAPE)
    assert ensure(engine, SHAPE)["status"] == "verified"


def test_option_differences_are_no_mismatch(engine: Engine) -> None:
    ensure(engine, SHAPE)
    changed = {**SHAPE, "options": {"maxAttempts": 9, "timeout": 5}}
    assert ensure(engine, changed)["status"] == "verified"


def test_fills_defaults_and_ignores_dependency_order(engine: Engine) -> None:
    ensure(engine, {"steps": [step("a"), step("b"), step("c", "a", "b")]})
    terse = {"steps": [{"slug": "a"}, {"slug": "b"}, {"slug": "c", "dependencies": ["b", "a"]}]}
    assert ensure(engine, terse)["status"] == "verified"


def test_compiles_patterns_map_steps_and_modes(engine: Engine) -> None:
    shape = {
        "steps": [
            step(
                "list",
                requiredInputPattern={"defined": True, "value": {"go": True}},
                whenUnmet="skip-cascade",
            ),
            step("each", "list", stepType="map", whenExhausted="skip"),
        ]
    }
    ensure(engine, shape)
    assert ensure(engine, shape)["status"] == "verified"
    each = engine.one("select * from pgflow.steps where step_slug = 'each'")
    assert (each["step_type"], each["when_exhausted"]) == ("map", "skip")


def test_reports_a_mismatch_in_production_and_changes_nothing(engine: Engine) -> None:
    ensure(engine, SHAPE)
    run_id = engine.start("shaped")
    changed = {"steps": [step("fetch"), step("store", "fetch")]}
    result = ensure(engine, changed)
    assert (result["status"], result["mismatchKind"]) == ("mismatch", "shape")
    assert result["differences"] == ['Step at index 1: slug differs "store" vs "save"']
    assert engine.value("select count(*) from pgflow.steps where step_slug = 'save'") == 1
    assert engine.run(run_id)["status"] == "started"


def test_names_each_kind_of_difference(engine: Engine) -> None:
    ensure(engine, SHAPE)
    changed = {
        "steps": [
            step(
                "fetch",
                stepType="map",
                whenUnmet="fail",
                forbiddenInputPattern={"defined": True, "value": {"x": 1}},
            ),
            step("save"),
            step("extra"),
        ]
    }
    differences = ensure(engine, changed)["differences"]
    assert differences[0] == "Step count differs: 3 vs 2"
    joined = "\n".join(differences)
    for fragment in (
        "type differs",
        "whenUnmet differs",
        "forbiddenInputPattern differs",
        "dependencies differ",
        "Step at index 2: missing in second shape",
    ):
        assert fragment in joined


def test_recompiles_destructively_in_a_local_database(engine: Engine) -> None:
    ensure(engine, SHAPE)
    engine.start("shaped")
    local(engine)
    changed = {"steps": [step("only")]}
    result = ensure(engine, changed)
    assert (result["status"], result["mismatchKind"]) == ("recompiled", "shape")
    assert [r["step_slug"] for r in engine.all("select step_slug from pgflow.steps")] == ["only"]
    assert engine.value("select count(*) from pgflow.runs") == 0
    assert ensure(engine, changed)["status"] == "verified"


@pytest.mark.parametrize(
    "shape",
    [
        {"nosteps": []},
        {"steps": {}},
        {"steps": [{"noslug": 1}]},
        {"steps": [{"slug": 1}]},
        {"steps": [{"slug": "a", "dependencies": "b"}]},
    ],
)
def test_rejects_a_malformed_shape(engine: Engine, shape: dict[str, Any]) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Invalid flow shape"):
        ensure(engine, shape)
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_an_invalid_step_leaves_no_partial_definition(engine: Engine) -> None:
    shape = {"steps": [step("good"), step("bad-slug")]}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Invalid step slug"):
        ensure(engine, shape)
    assert engine.value("select count(*) from pgflow.flows") == 0
    assert engine.value("select count(*) from pgmq.meta") == 0


def test_rejects_a_shape_with_a_duplicate_step(engine: Engine) -> None:
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match='step "a" appears more than once'
    ):
        ensure(engine, {"steps": [step("a"), step("a")]})


@pytest.mark.parametrize("value", ["abc", 1.5, None, True])
def test_rejects_options_that_are_not_whole_numbers(engine: Engine, value: Any) -> None:
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match='option "timeout" must be a whole'
    ):
        ensure(engine, {"steps": [step("a", options={"timeout": value})]})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a whole number"):
        ensure(engine, {"steps": [step("a")], "options": {"timeout": value}})
