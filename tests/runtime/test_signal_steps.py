"""Signal steps in the runtime: they have no handler and no worker (asking for one is a
ConfigError before anything connects), the testing kit sends their signals inside `run_flow`, and
a run that waits for a signal it was not given says so."""

from __future__ import annotations

from typing import Any

import pytest

from pgflow_gen.runtime import (
    Context,
    Flow,
    Step,
    StepOptions,
    errors,
    start_worker,
    with_step_queues,
)
from pgflow_gen.testing import FlowDatabase, RunStuckError

REVIEW: Flow[Any, Any, Any] = Flow(
    slug="kitReview",
    steps=(
        Step(slug="draft"),
        Step(
            slug="approval",
            step_type="signal",
            dependencies=("draft",),
            options=StepOptions(timeout=60),
            payload_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
        ),
        Step(slug="publish", dependencies=("draft", "approval")),
    ),
)
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


def draft(flow_input: Any, ctx: Context[Any], /) -> str:
    return f"about {flow_input['topic']}"


def publish(deps: dict[str, Any], ctx: Context[Any], /) -> str:
    return deps["draft"] if deps["approval"]["ok"] else "rejected"


HANDLERS = {"draft": draft, "publish": publish}


@pytest.mark.parametrize("flow", [REVIEW, with_step_queues(REVIEW)], ids=["flow", "step"])
def test_run_flow_sends_the_signals_it_is_given(pgflow: FlowDatabase, flow: Any) -> None:
    run = pgflow.run_flow(
        flow, handlers=HANDLERS, input={"topic": "owls"}, signals={"approval": {"ok": True}}
    )
    assert (run.status, run.output) == ("completed", {"publish": "about owls"})


def test_a_run_that_waits_for_a_signal_it_was_not_given_says_which(pgflow: FlowDatabase) -> None:
    with pytest.raises(RunStuckError) as stuck:
        pgflow.run_flow(REVIEW, handlers=HANDLERS, input={"topic": "owls"})
    assert 'waits for the signal of step "approval"' in stuck.value.message
    assert stuck.value.hint == 'Pass signals={...} to run_flow with a payload for "approval".'


def test_a_signal_step_has_no_handler(pgflow: FlowDatabase) -> None:
    with pytest.raises(errors.ConfigError) as refused:
        pgflow.run_flow(REVIEW, handlers={**HANDLERS, "approval": publish}, input={"topic": "owls"})
    assert refused.value.message == (
        'The handlers of flow "kitReview" do not match its steps: unknown "approval"'
        ' ("approval" signal step).'
    )
    assert refused.value.hint == 'Steps with handlers: "draft", "publish".'


def test_no_worker_serves_a_signal_step() -> None:
    with pytest.raises(errors.ConfigError) as refused:
        start_worker(
            with_step_queues(REVIEW), step_slug="approval", handler=publish, database_url=NOWHERE
        )
    assert refused.value.message == (
        'Step "approval" of flow "kitReview" is a signal step: it runs no task, so no worker'
        " serves it."
    )
    assert refused.value.hint == 'Steps with workers: "draft", "publish".'
