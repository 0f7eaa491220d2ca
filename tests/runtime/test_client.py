"""The Client against the real engine: typed starts, input validation, event-driven waits."""

from __future__ import annotations

import threading
import uuid
from typing import Any, NotRequired

import psycopg
import pytest
from psycopg.types.json import Jsonb
from typing_extensions import TypedDict

from pgflow_gen.runtime import (
    Client,
    Flow,
    InvalidRunInputError,
    RunNotFoundError,
    Step,
    with_step_queues,
)
from tests.engine import Engine


class GreetInput(TypedDict):
    first: str
    last: str
    title: NotRequired[str]


ADA: GreetInput = {"first": "Ada", "last": "Lovelace"}
FLOW: Flow[Any, GreetInput, Any] = Flow(
    slug="greetUser",
    steps=(Step(slug="fullName"), Step(slug="greeting", dependencies=("fullName",))),
    input_type=GreetInput,
)


@pytest.fixture
def client(conn: psycopg.Connection[Any], db_url: str) -> Client:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    return Client(db_url)


def test_start_flow_validates_and_starts_a_run(client: Client) -> None:
    run = client.start_flow(FLOW, ADA)
    assert (run.status, run.flow_slug, run.input) == (
        "started", "greetUser", {"first": "Ada", "last": "Lovelace"},
    )  # fmt: skip
    assert client.get_run(run.run_id).run_id == run.run_id


def test_a_step_queued_flow_starts_the_same_way(client: Client) -> None:
    run = client.start_flow(with_step_queues(FLOW), ADA)
    assert run.status == "started"


def test_an_invalid_input_names_the_field_and_writes_nothing(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    untyped: Flow[Any, Any, Any] = FLOW  # inputs from outside Python are not type-checked
    with pytest.raises(InvalidRunInputError, match=r"last: Field required") as raised:
        client.start_flow(untyped, {"first": "Ada"})
    assert raised.value.hint is not None
    with pytest.raises(InvalidRunInputError, match=r"first: Input should be a valid string"):
        client.start_flow(untyped, {"first": 1, "last": "x"})
    assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)


def test_an_input_that_is_not_json_is_rejected(client: Client) -> None:
    plain: Flow[Any, Any, Any] = Flow(slug="greetUser", steps=FLOW.steps)
    with pytest.raises(InvalidRunInputError, match="not JSON-serialisable"):
        client.start_flow(plain, {"first": float("nan")})
    with pytest.raises(InvalidRunInputError, match="not JSON-serialisable"):
        client.start_flow(plain, {"when": object()})


def test_wait_returns_once_the_run_completes(client: Client, conn: psycopg.Connection[Any]) -> None:
    run = client.start_flow(FLOW, ADA)
    finished: list[Any] = []
    waiter = threading.Thread(target=lambda: finished.append(run.wait(timeout=30)))
    waiter.start()
    engine = Engine(conn)
    for _ in range(2):
        [task] = engine.poll("greetUser")
        engine.complete(task, "done")
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    [done] = finished
    assert (done.status, done.output) == ("completed", {"greeting": "done"})
    assert done.completed_at is not None


def test_wait_gives_up_after_its_timeout(client: Client) -> None:
    run = client.start_flow(FLOW, ADA)
    with pytest.raises(TimeoutError, match="still running"):
        run.wait(timeout=0.2)


def test_an_unknown_run_is_an_error(client: Client) -> None:
    with pytest.raises(RunNotFoundError):
        client.get_run(uuid.uuid4())
