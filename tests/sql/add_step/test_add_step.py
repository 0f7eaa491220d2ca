from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.engine import Engine


@pytest.fixture
def flow(engine: Engine) -> str:
    return engine.flow("orders")


def test_numbers_steps_in_the_order_they_are_added(engine: Engine, flow: str) -> None:
    for slug in ("a", "b", "c"):
        engine.call("add_step", flow, slug)
    rows = engine.all("select step_slug, step_index from pgflow.steps order by step_index")
    assert [(r["step_slug"], r["step_index"]) for r in rows] == [("a", 0), ("b", 1), ("c", 2)]


def test_routes_every_step_to_the_flow_queue(engine: Engine) -> None:
    engine.flow("Orders", {"slug": "Fetch"})
    assert engine.value("select queue_name from pgflow.steps") == "orders"


def test_records_dependencies_and_their_count(engine: Engine, flow: str) -> None:
    engine.call("add_step", flow, "a")
    engine.call("add_step", flow, "b")
    [step] = engine.call("add_step", flow, "c", deps_slugs=["a", "b"])
    assert step["deps_count"] == 2
    deps = engine.all("select dep_slug from pgflow.deps where step_slug = 'c' order by dep_slug")
    assert [d["dep_slug"] for d in deps] == ["a", "b"]


def test_rejects_a_dependency_on_a_step_not_yet_added(engine: Engine, flow: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        engine.call("add_step", flow, "b", deps_slugs=["later"])
    assert 'depends on unknown step "later"' in str(raised.value)
    assert raised.value.diag.message_hint is not None
    assert "dependency order" in raised.value.diag.message_hint
    assert engine.value("select count(*) from pgflow.steps") == 0


def test_rejects_a_map_step_with_two_dependencies(engine: Engine, flow: str) -> None:
    engine.call("add_step", flow, "a")
    engine.call("add_step", flow, "b")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most one dependency"):
        engine.call("add_step", flow, "m", deps_slugs=["a", "b"], step_type="map")


@pytest.mark.parametrize("pattern", [[1, 2], "text", 3])
def test_rejects_a_condition_pattern_that_is_not_an_object(
    engine: Engine, flow: str, pattern: Any
) -> None:
    from psycopg.types.json import Jsonb

    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be JSON objects"):
        engine.call("add_step", flow, "a", required_input_pattern=Jsonb(pattern))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be JSON objects"):
        engine.call("add_step", flow, "a", forbidden_input_pattern=Jsonb(pattern))
    assert engine.value("select count(*) from pgflow.steps") == 0


def test_rejects_a_step_of_an_unknown_flow(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.NoDataFound, match='Flow "ghost" does not exist'):
        engine.call("add_step", "ghost", "a")


def test_returns_an_identical_existing_step_unchanged(engine: Engine, flow: str) -> None:
    engine.call("add_step", flow, "a")
    first = engine.call("add_step", flow, "b", deps_slugs=["a"], timeout=10)
    again = engine.call("add_step", flow, "b", deps_slugs=["a"], timeout=10)
    assert first == again
    assert engine.value("select count(*) from pgflow.deps") == 1


@pytest.mark.parametrize(
    "change",
    [{"deps_slugs": []}, {"timeout": 11}, {"when_exhausted": "skip"}, {"step_type": "map"}],
)
def test_refuses_to_change_an_existing_step(
    engine: Engine, flow: str, change: dict[str, Any]
) -> None:
    engine.call("add_step", flow, "a")
    engine.call("add_step", flow, "b", deps_slugs=["a"], timeout=10)
    with pytest.raises(psycopg.errors.UniqueViolation, match="different definition"):
        engine.call("add_step", flow, "b", **{"deps_slugs": ["a"], "timeout": 10, **change})


@pytest.mark.parametrize("slug", ["1st", "with-dash", "run", ""])
def test_rejects_an_invalid_step_slug(engine: Engine, flow: str, slug: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Invalid step slug"):
        engine.call("add_step", flow, slug)


def test_rejects_a_dependency_on_itself(engine: Engine, flow: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot depend on itself"):
        engine.call("add_step", flow, "a", deps_slugs=["a"])


def test_rejects_a_dependency_listed_twice(engine: Engine, flow: str) -> None:
    engine.call("add_step", flow, "a")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lists a dependency twice"):
        engine.call("add_step", flow, "b", deps_slugs=["a", "a"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("step_type", "loop", "Invalid step type"),
        ("when_unmet", "ignore", "Invalid when_unmet"),
        ("when_exhausted", "retry", "Invalid when_exhausted"),
        ("max_attempts", 0, "Invalid options"),
        ("base_delay", -1, "Invalid options"),
        ("timeout", 0, "Invalid options"),
        ("start_delay", -3, "Invalid options"),
    ],
)
def test_rejects_unknown_modes_and_out_of_range_options(
    engine: Engine, flow: str, option: str, value: Any, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        engine.call("add_step", flow, "a", **{option: value})
    assert engine.value("select count(*) from pgflow.steps") == 0


def test_rejects_a_null_dependency(engine: Engine, flow: str) -> None:
    engine.call("add_step", flow, "a")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="NULL dependency"):
        engine.call("add_step", flow, "b", deps_slugs=["a", None])
