"""Mistakes the generated types must catch. Each marked line MUST be a mypy error: the run uses
--warn-unused-ignores, so an ignore that is not needed (a mistake mypy missed) fails the test.
Checked against examples/community_threads by tests/golden/test_typing.py; never executed."""

from __future__ import annotations

from app.pgflow.community_threads_v1 import (
    FLOW,
    STEP_QUEUED_FLOW,
    ClassifyHandler,
    ClassifyOutput,
    DeliverSlackHandler,
    Handlers,
    Input,
    Steps,
)

from pgflow_gen.runtime import Client, Context, start_worker


def returns_wrong_type(flow_input: Input, ctx: Context[Input], /) -> int:
    return 1


def takes_wrong_input(flow_input: str, ctx: Context[Input], /) -> ClassifyOutput:
    return {"route": "help"}


def returns_unknown_route(flow_input: Input, ctx: Context[Input], /) -> ClassifyOutput:
    return {"route": "maybe"}  # type: ignore[typeddict-item]


# The decorator reports a mistake at the handler itself (this line), not in an entry file.
@Steps.classify  # type: ignore[type-var]
def decorated_returns_wrong_type(flow_input: Input, ctx: Context[Input], /) -> int:
    return 1


@Steps.deliver_slack  # type: ignore[type-var]
def decorated_for_the_wrong_step(flow_input: Input, ctx: Context[Input], /) -> ClassifyOutput:
    return {"route": "help"}


def never_called() -> None:
    wrong_output: ClassifyHandler = returns_wrong_type  # type: ignore[assignment]
    wrong_input: ClassifyHandler = takes_wrong_input  # type: ignore[assignment]
    deps_mismatch: DeliverSlackHandler = takes_wrong_input  # type: ignore[assignment]
    start_worker(STEP_QUEUED_FLOW, step_slug="nope", handler=wrong_output)  # type: ignore[misc]
    start_worker(FLOW, step_slug="classify", handler=wrong_output)  # type: ignore[call-overload]
    missing: Handlers = {"classify": wrong_output}  # type: ignore[typeddict-item]
    print(wrong_input, deps_mismatch, missing)
    bad_input: Input = {"thread_id": 1, "text": "hi"}  # type: ignore[typeddict-item]
    run = Client().start_flow(STEP_QUEUED_FLOW, bad_input)
    unchecked = run.output["thankHelpers"]  # type: ignore[index]
    if run.output is not None:
        count: int = run.output["thankHelpers"]  # type: ignore[assignment]
        print(count, unchecked)
    Client().pause_step(STEP_QUEUED_FLOW, "clasify")  # type: ignore[misc]
    Client().resume_step(FLOW, "nope")  # type: ignore[misc]
    Client().start_flow(FLOW, {"thread_id": "t", "text": "x"}, idempotency_key=7)  # type: ignore[call-overload]
