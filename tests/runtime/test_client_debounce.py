"""Client.debounce_start and AsyncClient.debounce_start (engine 0030): the input checked as a
start's, the burst as the engine keeps it, the bounds refused as the caller's mistake."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.errors import UsageError
from pgflow_gen.runtime import (
    AsyncClient,
    Client,
    Flow,
    FlowNotFoundError,
    InvalidRunInputError,
    PendingStart,
    Step,
)
from tests.runtime.test_client import ADA, FLOW, GreetInput

LOOSE: Flow[Any, Any, Any] = FLOW


@pytest.fixture
def client(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Client]:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    with Client(db_url) as client:
        yield client


def test_starts_with_one_key_collapse_into_one_pending_start(client: Client) -> None:
    grace: GreetInput = {"first": "Grace", "last": "Hopper"}
    first = client.debounce_start(FLOW, ADA, key="greet", period_s=60)
    last = client.debounce_start(FLOW, grace, key="greet", period_s=60, max_wait_s=90)
    other = client.debounce_start(FLOW, ADA, key="other", period_s=30)

    assert isinstance(first, PendingStart)
    assert (last.starts, last.input, last.first_at) == (2, grace, first.first_at)
    assert last.deadline_at is None  # the burst's first start set none
    assert last.start_at > first.start_at
    assert client.pending_starts() == [other, last]  # the soonest first
    assert client.pending_starts(FLOW) == [other, last]


def test_a_bad_input_a_bad_period_and_an_unknown_flow_start_nothing(client: Client) -> None:
    with pytest.raises(InvalidRunInputError, match=r"\$\.last"):
        client.debounce_start(LOOSE, {"first": "Ada"}, key="k", period_s=1)
    with pytest.raises(UsageError) as refused:
        client.debounce_start(FLOW, ADA, key="k", period_s=0)
    assert str(refused.value) == (
        "period_s must be more than 0 and at most 2592000 (30 days), not 0.\n"
        "HINT: Nothing was started or changed."
    )
    with pytest.raises(UsageError, match="A debounce key is text of 1 to 200 characters"):
        client.debounce_start(FLOW, ADA, key="", period_s=1)
    missing: Flow[Any, Any, Any] = Flow(slug="notCompiled", steps=(Step(slug="only"),))
    with pytest.raises(FlowNotFoundError):
        client.debounce_start(missing, {}, key="k", period_s=1)
    assert client.pending_starts() == []


def test_the_async_client_debounces_the_same(client: Client, db_url: str) -> None:
    async def main() -> list[PendingStart]:
        async with AsyncClient(db_url) as aclient:
            await aclient.debounce_start(FLOW, ADA, key="greet", period_s=60)
            with pytest.raises(UsageError):
                await aclient.debounce_start(FLOW, ADA, key="greet", period_s=-1)
            return await aclient.pending_starts(FLOW)

    [pending] = asyncio.run(main())
    assert client.pending_starts() == [pending]
