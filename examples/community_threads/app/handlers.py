"""Handlers of flow communityThreadsV1: each `@Steps.<step>` decorator checks its handler against
the step's generated Protocol, so mypy and pyright report a mistake on the handler itself."""

from __future__ import annotations

from app.pgflow.community_threads_v1 import (
    ClassifyOutput,
    DeliverSlackDeps,
    Input,
    ListHelpersDeps,
    Steps,
    ThankHelpersItem,
)
from pgflow_gen.runtime import Context, Json


@Steps.classify
def classify(flow_input: Input, ctx: Context[Input], /) -> ClassifyOutput:
    text = flow_input["text"].lower()
    if "help" in text:
        return {"route": "help"}
    return {"route": "spam" if "buy now" in text else "other"}


@Steps.deliver_slack
async def deliver_slack(deps: DeliverSlackDeps, ctx: Context[Input], /) -> str:
    return f"posted thread needing help (route {deps['classify']['route']})"


@Steps.list_helpers
def list_helpers(deps: ListHelpersDeps, ctx: Context[Input], /) -> list[str]:
    return ["ada", "grace"] if deps["classify"]["route"] == "help" else []


@Steps.thank_helpers
def thank_helper(item: ThankHelpersItem, ctx: Context[Input], /) -> Json:
    return f"thanks, {item}!"
