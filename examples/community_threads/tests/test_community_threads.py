"""Tests of flow communityThreadsV1 with the testing kit: the condition on deliverSlack and the
map over the helpers, each step from its own queue as in production."""

from __future__ import annotations

from app import handlers
from app.pgflow.community_threads_v1 import STEP_QUEUED_FLOW, Handlers, Input

from pgflow_gen.testing import FlowDatabase

HANDLERS: Handlers = {
    "classify": handlers.classify,
    "deliverSlack": handlers.deliver_slack,
    "listHelpers": handlers.list_helpers,
    "thankHelpers": handlers.thank_helper,
}


def test_a_thread_asking_for_help_is_posted_and_its_helpers_thanked(
    pgflow: FlowDatabase,
) -> None:
    run = pgflow.run_flow(
        STEP_QUEUED_FLOW, handlers=HANDLERS, input=Input(thread_id="t1", text="Help me, please")
    )
    assert run.status == "completed"
    assert run.output == {
        "deliverSlack": "posted thread needing help (route help)",
        "thankHelpers": ["thanks, ada!", "thanks, grace!"],
    }


def test_spam_skips_slack_and_thanks_nobody(pgflow: FlowDatabase) -> None:
    run = pgflow.run_flow(
        STEP_QUEUED_FLOW, handlers=HANDLERS, input=Input(thread_id="t2", text="BUY NOW")
    )
    assert run.status == "completed"
    assert run.output == {"thankHelpers": []}
