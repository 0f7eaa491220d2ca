"""Handlers of flow greetUser (queue mode flow: one worker runs both)."""

from __future__ import annotations

from app.pgflow.greet_user import GreetingDeps, Input, Steps
from pgflow_gen.runtime import Context


@Steps.full_name
def full_name(flow_input: Input, ctx: Context[Input], /) -> str:
    return f"{flow_input['first']} {flow_input['last']}"


@Steps.greeting
async def greeting(deps: GreetingDeps, ctx: Context[Input], /) -> str:
    return f"Hello, {deps['fullName']}!"
