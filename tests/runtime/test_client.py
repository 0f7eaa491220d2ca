"""The Client against the real engine: typed starts, input validation, event-driven waits."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
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
    InvalidStepLimitsError,
    RunExistsError,
    RunFinishedError,
    RunNotFoundError,
    Step,
    StepFailure,
    StepNotFoundError,
    with_step_queues,
)
from pgflow_gen.runtime.client import POOL_SIZE
from pgflow_gen.runtime.errors import ConfigError, DatabaseError
from tests.e2e.harness import eventually
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
def client(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Client]:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    with Client(db_url) as client:
        yield client


def client_backends(conn: psycopg.Connection[Any]) -> list[int]:
    """The backends connected to the test database, but for the test's own."""
    rows = conn.execute(
        "select pid from pg_stat_activity"
        " where datname = current_database() and pid <> pg_backend_pid() order by pid"
    ).fetchall()
    return [row[0] for row in rows]


def one_backend(conn: psycopg.Connection[Any]) -> list[int]:
    """The client's one backend, once a backend whose client hung up a moment ago is gone."""

    def single() -> list[int] | None:
        found = client_backends(conn)
        return found if len(found) == 1 else None

    return eventually(single, "one backend of the client")


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


def test_cancel_run_ends_a_run_that_wait_then_returns(client: Client) -> None:
    run = client.start_flow(FLOW, ADA)
    finished: list[Any] = []
    waiter = threading.Thread(target=lambda: finished.append(run.wait(timeout=30)))
    waiter.start()

    cancelled = client.cancel_run(run.run_id, "no longer needed")

    assert (cancelled.status, cancelled.cancel_reason) == ("cancelled", "no longer needed")
    assert cancelled.cancelled_at is not None
    assert cancelled.finished
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    [done] = finished
    assert (done.status, done.cancel_reason, done.failure) == (
        "cancelled", "no longer needed", None,
    )  # fmt: skip


def test_cancelling_a_finished_or_unknown_run_is_a_typed_error(client: Client) -> None:
    run = client.start_flow(FLOW, ADA)
    client.cancel_run(run.run_id)
    with pytest.raises(RunFinishedError) as refused:
        client.cancel_run(run.run_id, "again")
    assert refused.value.message == (
        f"Run {run.run_id} is cancelled already; only a started run can be cancelled."
    )
    assert refused.value.hint == "Nothing was changed."
    assert client.get_run(run.run_id).cancel_reason is None  # the first cancel gave none
    missing = uuid.uuid4()
    with pytest.raises(RunNotFoundError, match=f"Run {missing} does not exist."):
        client.cancel_run(missing)


def test_a_second_start_with_an_idempotency_key_returns_the_first_run(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    first = client.start_flow(FLOW, ADA, idempotency_key="greet-ada")
    grace: GreetInput = {"first": "Grace", "last": "Hopper"}
    again = client.start_flow(FLOW, grace, idempotency_key="greet-ada")
    assert again.run_id == first.run_id
    assert (again.input, again.idempotency_key) == (ADA, "greet-ada")
    other = client.start_flow(FLOW, ADA, idempotency_key="greet-ada-2")
    assert other.run_id != first.run_id
    assert conn.execute("select count(*) from pgflow.runs").fetchone() == (2,)


def test_pause_step_holds_a_step_until_resume_step(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    pause = client.pause_step(FLOW, "fullName", "maintenance")
    assert (pause.flow_slug, pause.step_slug, pause.reason) == (
        "greetUser",
        "fullName",
        "maintenance",
    )
    run = client.start_flow(FLOW, ADA)
    engine = Engine(conn)
    assert engine.poll("greetUser") == []  # held
    assert client.resume_step(FLOW, "fullName") == 1
    [task] = engine.poll("greetUser")
    assert (task.run_id, task.step_slug) == (run.run_id, "fullName")
    assert client.resume_step(FLOW, "fullName") == 0


def test_pausing_a_step_the_flow_lacks_is_a_typed_error(client: Client) -> None:
    untyped: Flow[Any, Any, Any] = FLOW  # a slug from outside Python is not type-checked
    with pytest.raises(StepNotFoundError) as refused:
        client.pause_step(untyped, "full_name")
    assert refused.value.message == 'Flow "greetUser" has no step "full_name".'
    missing: Flow[Any, Any, Any] = Flow(slug="otherFlow", steps=FLOW.steps)
    with pytest.raises(FlowNotFoundError) as unknown:
        client.resume_step(missing, "fullName")
    assert unknown.value.message == 'Flow "otherFlow" does not exist.'


def test_wait_gives_up_after_its_timeout(client: Client) -> None:
    run = client.start_flow(FLOW, ADA)
    with pytest.raises(TimeoutError, match="still running"):
        run.wait(timeout=0.2)


#: The greeting flow as a migration compiles it: with its input's JSON Schema.
SCHEMA = {
    "type": "object",
    "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
    "required": ["first", "last"],
    "additionalProperties": False,
}


def test_a_flow_started_by_its_slug_is_checked_against_its_compiled_schema(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    # `pgflow-gen start` and scripts have a slug, not the generated module.
    compiled: Flow[Any, Any, Any] = Flow(slug="greetUser", steps=FLOW.steps, input_schema=SCHEMA)
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(compiled.shape())))
    with Client(db_url) as client:
        with pytest.raises(InvalidRunInputError, match=r"last") as raised:
            client.start_flow("greetUser", {"first": "Ada"})
        assert raised.value.message.startswith('Invalid input for flow "greetUser"')
        with pytest.raises(InvalidRunInputError, match="not JSON-serialisable"):
            client.start_flow("greetUser", {"first": float("nan"), "last": "x"})
        assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)
        wanted = uuid.uuid4()
        run = client.start_flow("greetUser", ADA, run_id=wanted, idempotency_key="k")
        assert (run.run_id, run.status, run.input) == (wanted, "started", dict(ADA))
        again = client.start_flow("greetUser", ADA, run_id=uuid.uuid4(), idempotency_key="k")
        assert again.run_id == wanted
        with pytest.raises(FlowNotFoundError, match='Flow "greetUsr" does not exist'):
            client.start_flow("greetUsr", ADA)


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


def test_calls_share_one_pooled_connection(client: Client, conn: psycopg.Connection[Any]) -> None:
    runs = [client.start_flow(FLOW, ADA) for _ in range(5)]
    for run in runs:
        client.get_run(run.run_id)
        run.unserved_steps()
    with client.connection() as pooled:
        # A backend ends a moment after its client hangs up: the first call's probe may linger.
        assert one_backend(conn) == [pooled.info.backend_pid]
    client.close()
    eventually(lambda: client_backends(conn) == [], "no backend")  # closed now, not when collected
    assert client.get_run(runs[0].run_id).status == "started"  # a closed client opens again


def test_a_connection_the_database_dropped_is_replaced(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    # What a server restart or an idle timeout does to a pooled connection.
    run = client.start_flow(FLOW, ADA)
    [dropped] = one_backend(conn)
    conn.execute("select pg_terminate_backend(%s)", (dropped,))
    for _ in range(3):
        assert client.get_run(run.run_id).run_id == run.run_id
    # The pool may open a spare while it replaces the dropped one; never more than its size.
    replacements = eventually(
        lambda: [pid for pid in client_backends(conn) if pid != dropped] or None, "a replacement"
    )
    assert 1 <= len(replacements) <= POOL_SIZE


def test_several_threads_share_the_pool_up_to_its_size(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (FLOW.slug, Jsonb(FLOW.shape())))
    barrier = threading.Barrier(6)
    seen: list[int] = []
    with Client(db_url, pool_size=2) as client:

        def start() -> None:
            barrier.wait()
            client.start_flow(FLOW, ADA)
            with client.connection() as pooled:
                seen.append(pooled.info.backend_pid)

        threads = [threading.Thread(target=start) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert conn.execute("select count(*) from pgflow.runs").fetchone() == (6,)
    assert len(set(seen)) <= 2


def test_pooled_connections_prepare_nothing(client: Client) -> None:
    # Safe behind a transaction-pooling PgBouncer before 1.21, as a connection per call was.
    runs = [client.start_flow(FLOW, ADA) for _ in range(8)]
    for run in runs:
        client.get_run(run.run_id)
    with client.connection() as pooled:
        assert pooled.execute("select count(*) from pg_prepared_statements").fetchone() == (0,)


def test_a_run_id_in_use_is_a_typed_error_and_starts_nothing(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    run_id = uuid.uuid4()
    client.start_flow(FLOW, ADA, run_id=run_id)
    with pytest.raises(RunExistsError) as raised:
        client.start_flow(FLOW, ADA, run_id=run_id)
    assert raised.value.code == "run_exists"
    assert str(raised.value).splitlines()[0] == (
        "A run with this run_id exists already; nothing was started."
    )
    assert conn.execute("select count(*) from pgflow.runs").fetchone() == (1,)


def test_a_pool_size_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="pool_size=0"):
        Client(pool_size=0)


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


def test_start_flows_starts_a_run_per_input_in_order(client: Client) -> None:
    grace: GreetInput = {"first": "Grace", "last": "Hopper"}
    runs = client.start_flows(FLOW, [ADA, grace])
    assert [run.input for run in runs] == [ADA, grace]
    assert all(run.status == "started" and run.flow_slug == "greetUser" for run in runs)
    assert runs[0].run_id != runs[1].run_id
    assert client.get_run(runs[1].run_id).input == grace


def test_start_flows_with_keys_returns_the_run_a_key_has_already(client: Client) -> None:
    [first] = client.start_flows(FLOW, [ADA], idempotency_keys=["ada"])
    again = client.start_flows(FLOW, [ADA, ADA], idempotency_keys=["ada", None])
    assert again[0].run_id == first.run_id
    assert again[0].idempotency_key == "ada"
    assert again[1].run_id != first.run_id


def test_start_flows_names_the_bad_input_and_starts_none(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    bad: Any = {"first": "Ada"}
    with pytest.raises(InvalidRunInputError, match=r"^Input 2 of 3: ") as caught:
        client.start_flows(FLOW, [ADA, bad, ADA])
    assert "last" in str(caught.value)
    with pytest.raises(ValueError, match="2 idempotency keys for 1 inputs"):
        client.start_flows(FLOW, [ADA], idempotency_keys=["a", "b"])
    assert client.start_flows(FLOW, []) == []
    assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)


def test_start_flows_of_a_flow_not_compiled_raises_flow_not_found(client: Client) -> None:
    other: Flow[Any, Any, Any] = Flow(slug="notCompiled", steps=(Step(slug="only"),))
    with pytest.raises(FlowNotFoundError):
        client.start_flows(other, [{}])


def test_set_step_limits_sets_reads_and_clears_a_steps_limits(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    limits = client.set_step_limits(FLOW, "fullName", max_in_flight=2)
    assert limits is not None
    assert (limits.step_slug, limits.max_in_flight, limits.rate_limit, limits.set_by) == (
        "fullName", 2, None, "operator",
    )  # fmt: skip
    client.start_flow(FLOW, ADA)
    client.start_flow(FLOW, ADA)
    client.start_flow(FLOW, ADA)
    assert len(Engine(conn).poll("greetUser")) == 2  # the cap holds the third back
    [read] = client.step_limits(FLOW)
    assert (read.in_flight, read.window_starts, read.in_words) == (2, 0, "2/2 in flight")
    assert client.step_limits() == [read]
    assert client.set_step_limits(FLOW, "fullName") is None
    assert client.step_limits() == []


def test_reset_step_limits_gives_the_step_its_specs(client: Client) -> None:
    client.set_step_limits(FLOW, "fullName", max_in_flight=2, rate_limit=5, rate_period_s=60)
    assert client.reset_step_limits(FLOW, "fullName") is None  # the spec sets none
    assert client.step_limits() == []
    with pytest.raises(StepNotFoundError):
        client.reset_step_limits(FLOW, "nope")


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_in_flight": 0}, "Step limits must be whole numbers from 1"),
        ({"rate_limit": 10}, "A rate limit needs both rate_limit"),
    ],
)
def test_wrong_step_limits_are_a_typed_error(
    client: Client, limits: dict[str, int], message: str
) -> None:
    with pytest.raises(InvalidStepLimitsError) as refused:
        client.set_step_limits(FLOW, "fullName", **limits)
    assert refused.value.message.startswith(message)
    assert client.step_limits() == []
