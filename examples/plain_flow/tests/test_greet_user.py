"""Tests of flow greetUser with the testing kit: the whole flow in process, and one handler."""

from __future__ import annotations

import asyncio

from app import handlers
from app.pgflow.greet_user import FLOW, GreetingDeps, Handlers, Input

from pgflow_gen.testing import FlowDatabase, fake_context

HANDLERS: Handlers = {"fullName": handlers.full_name, "greeting": handlers.greeting}


def test_greets_a_user_by_full_name(pgflow: FlowDatabase) -> None:
    run = pgflow.run_flow(FLOW, handlers=HANDLERS, input=Input(first="Ada", last="Lovelace"))
    assert run.status == "completed"
    assert run.output == {"greeting": "Hello, Ada Lovelace!"}


def test_full_name_joins_first_and_last() -> None:
    flow_input = Input(first="Grace", last="Hopper")
    assert handlers.full_name(flow_input, fake_context(flow_input)) == "Grace Hopper"


def test_greeting_is_async_and_uses_the_full_name() -> None:
    deps = GreetingDeps(fullName="Grace Hopper")
    ctx = fake_context(Input(first="Grace", last="Hopper"), step_slug="greeting")
    assert asyncio.run(handlers.greeting(deps, ctx)) == "Hello, Grace Hopper!"
