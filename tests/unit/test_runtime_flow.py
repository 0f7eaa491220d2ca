"""Runtime flow types: immutable definitions, checked routes, the shape workers send to SQL."""

from __future__ import annotations

import dataclasses

import pytest

from pgflow_gen import naming
from pgflow_gen.runtime import Flow, Step, StepOptions, with_step_queues


def flow() -> Flow[str, object, object]:
    return Flow(
        slug="routeTicket",
        steps=(
            Step(slug="classify"),
            Step(
                slug="billing",
                dependencies=("classify",),
                required_input_pattern={"classify": {"route": ["billing"]}},
                options=StepOptions(timeout=9),
            ),
        ),
    )


def test_the_step_order_is_a_tuple_that_cannot_change() -> None:
    f = flow()
    assert f.step_order == ("classify", "billing")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.steps = ()  # type: ignore[misc]


def test_patterns_are_read_only_copies() -> None:
    source = {"classify": {"route": "billing"}}
    step = Step(slug="billing", dependencies=["classify"], required_input_pattern=source)  # type: ignore[arg-type]
    source["classify"]["route"] = "changed"
    assert step.shape()["requiredInputPattern"] == {
        "defined": True, "value": {"classify": {"route": "billing"}},
    }  # fmt: skip
    assert step.required_input_pattern is not None
    with pytest.raises(TypeError):
        step.required_input_pattern["classify"] = {}  # type: ignore[index]
    assert step.dependencies == ("classify",)


def test_with_step_queues_fixes_the_checked_routes() -> None:
    routed = with_step_queues(flow())
    assert [r.queue_name for r in routed.routes] == [
        "routeticket__classify",
        "routeticket__billing",
    ]
    assert isinstance(routed.routes, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        routed.routes = ()  # type: ignore[misc]
    assert routed.route_map() == [
        {"stepSlug": "classify", "queueName": "routeticket__classify"},
        {"stepSlug": "billing", "queueName": "routeticket__billing"},
    ]


def test_with_step_queues_raises_the_typed_errors_at_once() -> None:
    with pytest.raises(naming.EmptyStepQueuedFlowError):
        with_step_queues(Flow(slug="emptyFlow"))
    with pytest.raises(naming.FlowQueueNameError):
        with_step_queues(Flow(slug="f" * 45, steps=(Step(slug="a"),)))


def test_an_invalid_or_duplicate_step_slug_is_rejected_when_the_flow_is_built() -> None:
    with pytest.raises(naming.InvalidSlugError):
        Flow(slug="ok", steps=(Step(slug="bad__slug"),))
    with pytest.raises(naming.DuplicateStepSlugError):
        Flow(slug="ok", steps=(Step(slug="a"), Step(slug="A")))


def test_an_unknown_step_names_the_valid_ones() -> None:
    with pytest.raises(naming.FlowSpecError, match="Valid step slugs: classify, billing"):
        with_step_queues(flow()).route("nope")


def test_the_shape_matches_the_engine_format() -> None:
    shape = flow().shape()
    assert shape["steps"][1] == {
        "slug": "billing",
        "stepType": "single",
        "dependencies": ["classify"],
        "whenUnmet": "skip",
        "whenExhausted": "fail",
        "requiredInputPattern": {"defined": True, "value": {"classify": {"route": ["billing"]}}},
        "forbiddenInputPattern": {"defined": False},
        "options": {"timeout": 9},
    }
    assert shape["options"] == {"maxAttempts": 3, "baseDelay": 5, "timeout": 60}
