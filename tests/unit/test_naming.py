"""The Python resolver against the shared vectors (the SQL resolver reads the same file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pgflow_gen import naming

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "queue_names.json").read_text())
ROUTE_CASES = VECTORS["routes"]


@pytest.mark.parametrize("case", VECTORS["slugs"], ids=lambda c: repr(c["slug"])[:40])
def test_slug_rules_match_the_vectors(case: dict[str, Any]) -> None:
    assert naming.is_valid_slug(case["slug"]) is case["valid"]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[c["name"] for c in ROUTE_CASES])
def test_routes_match_the_vectors(case: dict[str, Any]) -> None:
    def resolve() -> tuple[naming.Route, ...]:
        return naming.resolve_queue_routes(
            case["flow_slug"], case["step_slugs"], case["queue_mode"]
        )

    if "routes" in case:
        routes = resolve()
        assert [r.queue_name for r in routes] == case["routes"]
        assert [r.step_slug for r in routes] == case["step_slugs"]
        assert [r.step_index for r in routes] == list(range(len(case["step_slugs"])))
        return
    expected = case["error"]
    with pytest.raises(naming.FlowSpecError) as raised:
        resolve()
    error = raised.value
    assert error.code == expected["code"]
    assert error.message == expected["message"]
    for field in ("detail", "hint", "step_slug", "step_index"):
        if field in expected:
            assert getattr(error, field) == expected[field], field
    assert error.flow_slug == case["flow_slug"]


def test_length_errors_carry_both_candidate_names() -> None:
    flow = "Orders" + "x" * 38
    steps = [f"s{i:02d}" for i in range(11)]
    with pytest.raises(naming.StepQueueNameError) as raised:
        naming.resolve_queue_routes(flow, steps, "step")
    error = raised.value
    assert (error.readable_name, error.fallback_name) == (
        f"{flow.lower()}__s10",
        f"{flow.lower()}__10",
    )
    assert (error.readable_length, error.fallback_length, error.max_length) == (49, 48, 47)


def test_every_naming_error_is_a_flow_spec_error_with_a_code() -> None:
    classes: list[type[naming.FlowSpecError]] = [
        naming.InvalidSlugError,
        naming.DuplicateStepSlugError,
        naming.EmptyStepQueuedFlowError,
        naming.FlowQueueNameError,
        naming.StepQueueNameError,
        naming.DuplicateQueueRouteError,
    ]
    codes = {cls.code for cls in classes}
    assert len(codes) == len(classes)
    assert all(issubclass(cls, naming.FlowSpecError) for cls in classes)


def test_an_unknown_queue_mode_is_rejected() -> None:
    with pytest.raises(naming.FlowSpecError, match='Unknown queue mode "steps"'):
        naming.resolve_queue_routes("orders", ["a"], "steps")  # type: ignore[arg-type]


def test_routes_are_immutable() -> None:
    [route] = naming.resolve_queue_routes("orders", ["a"], "step")
    with pytest.raises(AttributeError):
        route.queue_name = "other"  # type: ignore[misc]


def test_the_error_text_reads_like_postgresql() -> None:
    with pytest.raises(naming.FlowQueueNameError) as raised:
        naming.resolve_queue_routes("Orders" + "x" * 39, ["a"], "step")
    assert str(raised.value).splitlines()[1:] == [
        f'DETAIL: The shortest required queue "{"orders" + "x" * 39}__0" is 48 characters;'
        " PGMQ allows at most 47.",
        "HINT: Shorten the concrete flow slug or use the default single queue.",
    ]
