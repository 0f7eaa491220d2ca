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
    FlowNotFoundError,
    InvalidRunInputError,
    RunNotFoundError,
    Step,
    StepFailure,
    with_step_queues,
)
from pgflow_gen.runtime.errors import DatabaseError
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


def test_a_flow_that_is_not_compiled_is_a_typed_error_with_the_engines_hint(
    db_url: str,
) -> None:
    with pytest.raises(FlowNotFoundError) as raised:
        Client(db_url).start_flow(FLOW, ADA)
    assert raised.value.message == 'Flow "greetUser" does not exist.'
    assert raised.value.hint == "Check the slug (it is case-sensitive) or compile the flow first."


def test_an_unreachable_database_is_a_database_error() -> None:
    with pytest.raises(DatabaseError, match="Cannot connect to the database"):
        Client("postgresql://nobody@127.0.0.1:1/x?connect_timeout=2").start_flow(FLOW, ADA)


def test_a_failed_run_says_which_step_failed_after_how_many_attempts_and_why(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("update pgflow.flows set opt_max_attempts = 2, opt_base_delay = 0")
    run = client.start_flow(FLOW, ADA)
    engine = Engine(conn)
    for attempt in (1, 2):
        [task] = engine.poll("greetUser")
        error = f"KeyError: 'first'\n\nTraceback (most recent call last):\n  attempt {attempt}"
        engine.fail(task, error, fenced=True)

    done = run.wait(timeout=30)

    assert done.status == "failed"
    assert done.failure == StepFailure(
        step_slug="fullName",
        task_index=0,
        attempts=2,
        error="KeyError: 'first'\n\nTraceback (most recent call last):\n  attempt 2",
    )
    assert done.failure.describe() == "step \"fullName\" task 0, attempt 2: KeyError: 'first'"
    assert client.get_run(run.run_id).failure == done.failure
    assert client.start_flow(FLOW, ADA).failure is None


def test_unserved_steps_are_the_ones_with_queued_tasks_and_no_live_worker(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    run = client.start_flow(FLOW, ADA)
    [unserved] = run.unserved_steps()
    assert (unserved.step_slug, unserved.queue_name, unserved.queued_tasks) == (
        "fullName",
        "greetuser",
        1,
    )
    Engine(conn).register("greetuser")  # a live worker on the queue
    assert run.unserved_steps() == []
