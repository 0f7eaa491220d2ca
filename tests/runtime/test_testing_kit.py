"""The testing kit: `pgflow.run_flow` runs whole flows in process through the real engine (its
claims, completions, retries, conditions and maps), and `fake_context` stands in for a worker."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

from pgflow_gen.runtime import (
    Context,
    Flow,
    FlowOptions,
    InvalidRunInputError,
    Step,
    StepOptions,
    TypedDict,
    WorkerSettings,
    errors,
    with_step_queues,
)
from pgflow_gen.testing import FlowDatabase, RunStuckError, fake_context


class Numbers(TypedDict):
    numbers: list[int]


NUMBERS: Flow[str, Numbers, Any] = Flow(
    slug="kitNumbers",
    options=FlowOptions(max_attempts=3, base_delay=3600, timeout=30),
    input_type=Numbers,
    input_schema={
        "type": "object",
        "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}},
        "required": ["numbers"],
    },
    steps=(
        Step(slug="pick"),
        Step(slug="double", step_type="map", dependencies=("pick",)),
        Step(
            slug="celebrate",
            dependencies=("pick",),
            required_input_pattern={"pick": [100]},
            when_unmet="skip",
        ),
        Step(slug="total", dependencies=("double",)),
    ),
)


def pick(flow_input: Numbers, ctx: Context[Numbers], /) -> list[int]:
    return flow_input["numbers"]


def double(item: int, ctx: Context[Numbers], /) -> int:
    return item * 2


def celebrate(deps: dict[str, Any], ctx: Context[Numbers], /) -> str:
    return "a hundred!"


async def total(deps: dict[str, list[int]], ctx: Context[Numbers], /) -> int:
    flow_input = await ctx.flow_input_async()  # loaded from the run: dependent steps lack it
    return sum(deps["double"]) + len(flow_input["numbers"])


HANDLERS = {"pick": pick, "double": double, "celebrate": celebrate, "total": total}


def step_rows(pgflow: FlowDatabase, run_id: object) -> dict[str, tuple[str, int]]:
    with pgflow.connect() as conn:
        rows = conn.execute(
            "select step_slug, status, remaining_tasks, initial_tasks from pgflow.step_states"
            " where run_id = %s",
            (run_id,),
        ).fetchall()
    return {slug: (status, initial) for slug, status, _, initial in rows}


def test_a_flow_runs_in_process_with_its_map_and_a_skipped_condition(
    pgflow: FlowDatabase,
) -> None:
    run = pgflow.run_flow(NUMBERS, handlers=HANDLERS, input=Numbers(numbers=[1, 2, 3]))
    assert run.status == "completed"
    assert run.output == {"total": 15}  # a skipped leaf step has no output
    steps = step_rows(pgflow, run.run_id)
    assert steps["double"] == ("completed", 3)  # one task per item
    assert steps["celebrate"][0] == "skipped"


def test_a_condition_that_holds_runs_its_step(pgflow: FlowDatabase) -> None:
    run = pgflow.run_flow(NUMBERS, handlers=HANDLERS, input=Numbers(numbers=[100]))
    assert run.status == "completed"
    assert run.output is not None
    assert run.output["celebrate"] == "a hundred!"
    assert run.output["total"] == 201


def test_a_step_queued_flow_runs_every_step_from_its_own_queue(pgflow: FlowDatabase) -> None:
    queued = with_step_queues(NUMBERS)
    run = pgflow.run_flow(queued, handlers=HANDLERS, input=Numbers(numbers=[4]))
    assert (run.status, run.output) == ("completed", {"total": 9})
    with pgflow.connect() as conn:
        queues = {row[0] for row in conn.execute("select queue_name from pgmq.list_queues()")}
    assert {route.queue_name for route in queued.routes} <= queues


def test_retries_run_at_once_instead_of_waiting_out_their_backoff(pgflow: FlowDatabase) -> None:
    # base_delay is an hour: only skipping the backoff lets the third attempt run.
    attempts: list[int] = []

    def flaky(item: int, ctx: Context[Numbers], /) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} lost its connection")
        return item

    run = pgflow.run_flow(
        NUMBERS, handlers={**HANDLERS, "double": flaky}, input=Numbers(numbers=[5]), timeout=30
    )
    assert run.status == "completed"
    assert attempts == [1, 2, 3]
    with pgflow.connect() as conn:
        row = conn.execute(
            "select attempts_count, status from pgflow.step_tasks where step_slug = 'double'"
        ).fetchone()
    assert row == (3, "completed")


def test_a_failing_step_fails_the_run_with_its_error_after_every_attempt(
    pgflow: FlowDatabase,
) -> None:
    def broken(flow_input: Numbers, ctx: Context[Numbers], /) -> list[int]:
        raise ValueError(f"no numbers on attempt {ctx.attempt}")

    run = pgflow.run_flow(NUMBERS, handlers={**HANDLERS, "pick": broken}, input=Numbers(numbers=[]))
    assert run.status == "failed"
    assert run.failure is not None
    assert (
        run.failure.describe()
        == 'step "pick" task 0, attempt 3: ValueError: no numbers on attempt 3'
    )
    assert 'raise ValueError(f"no numbers on attempt {ctx.attempt}")' in (run.failure.error or "")


def test_a_step_timeout_fails_the_attempt(pgflow: FlowDatabase) -> None:
    quick: Flow[str, None, Any] = Flow(
        slug="kitTimeout",
        options=FlowOptions(max_attempts=1, timeout=30),
        steps=(Step(slug="slow", options=StepOptions(timeout=1)),),
    )

    async def slow(flow_input: object, ctx: Context[object], /) -> None:
        await asyncio.sleep(60)

    began = time.monotonic()
    run = pgflow.run_flow(quick, handlers={"slow": slow}, input=None)
    assert run.status == "failed"
    assert run.failure is not None
    assert run.failure.summary.startswith('HandlerTimeoutError: Step "slow" ran past its timeout')
    assert time.monotonic() - began < 60  # cancelled, not waited for


def test_an_output_of_the_wrong_type_fails_every_attempt(pgflow: FlowDatabase) -> None:
    typed: Flow[str, None, Any] = Flow(
        slug="kitOutputs",
        options=FlowOptions(max_attempts=2),
        steps=(
            Step(
                slug="total",
                output_schema={"type": "object", "properties": {"total": {"type": "number"}}},
            ),
        ),
    )

    def total(flow_input: object, ctx: Context[object], /) -> dict[str, str]:
        return {"total": "nine"}

    run = pgflow.run_flow(typed, handlers={"total": total}, input=None)
    assert run.status == "failed"
    assert run.failure is not None
    assert run.failure.describe() == (
        'step "total" task 0, attempt 2: OutputValidationError: Step "total" returned an output'
        " that does not match its type: $.total: expected number, got string."
    )
    # Turned off as for a worker, the output is stored as the handler returned it.
    unchecked = pgflow.run_flow(
        typed,
        handlers={"total": total},
        input=None,
        settings=WorkerSettings(check_outputs=False),
    )
    assert (unchecked.status, unchecked.output) == ("completed", {"total": {"total": "nine"}})


def test_wrong_handlers_and_a_wrong_input_start_nothing(pgflow: FlowDatabase) -> None:
    with pytest.raises(errors.ConfigError, match='missing "total"; unknown "totl"'):
        pgflow.run_flow(
            NUMBERS,
            handlers={"pick": pick, "double": double, "celebrate": celebrate, "totl": total},
            input=Numbers(numbers=[1]),
        )
    with pytest.raises(InvalidRunInputError, match="numbers"):
        pgflow.run_flow(NUMBERS, handlers=HANDLERS, input=Numbers(numbers=["one"]))  # type: ignore[list-item]
    with pgflow.connect() as conn:
        assert conn.execute("select count(*) from pgflow.runs").fetchone() == (0,)


def test_a_task_held_by_another_worker_is_reported_stuck(pgflow: FlowDatabase) -> None:
    # Step "later" waits an hour to start; meanwhile "first" lets another worker claim it, as a
    # stray worker process on the same database would. Nothing is left to run in process.
    held: Flow[str, None, Any] = Flow(
        slug="kitHeld",
        steps=(Step(slug="first"), Step(slug="later", options=StepOptions(start_delay=3600))),
    )

    def first(flow_input: object, ctx: Context[object], /) -> None:
        conn = ctx.connection
        elsewhere = uuid.uuid4()
        conn.execute(
            "select pgflow.register_worker(%s, 'kitheld', 'elsewhere', 'kitHeld', null)",
            (elsewhere,),
        )
        conn.execute(
            "select pgmq.set_vt('kitheld', msg_id, 0) from pgmq.q_kitheld"
            " where message->>'step_slug' = 'later'"
        )
        ids = [row[0] for row in conn.execute("select msg_id from pgmq.read('kitheld', 30, 10)")]
        conn.execute(
            "select from pgflow.claim_tasks('kitHeld', %s, %s, 'kitheld')", (ids, elsewhere)
        )

    with pytest.raises(RunStuckError) as raised:
        pgflow.run_flow(held, handlers={"first": first, "later": first}, input=None)
    assert "step later: started, 1 task remaining" in (raised.value.detail or "")
    assert raised.value.hint == "Is another worker running on this database?"


def test_run_flow_async_runs_on_the_tests_own_loop(pgflow: FlowDatabase) -> None:
    async def main() -> Any:
        with pytest.raises(RuntimeError, match=r"await pgflow\.run_flow_async"):
            pgflow.run_flow(NUMBERS, handlers=HANDLERS, input=Numbers(numbers=[1]))
        return await pgflow.run_flow_async(NUMBERS, handlers=HANDLERS, input=Numbers(numbers=[1]))

    run = asyncio.run(main())
    assert (run.status, run.output) == ("completed", {"total": 3})


def test_fake_context_calls_a_handler_without_a_database() -> None:
    ctx = fake_context(Numbers(numbers=[7]), step_slug="pick", attempt=2, timeout=5)
    assert pick(ctx.flow_input(), ctx) == [7]
    assert (ctx.step_slug, ctx.attempt, ctx.task_index) == ("pick", 2, 0)
    assert 0 < ctx.time_left() <= 5
    assert not ctx.shutdown.is_set()
    assert asyncio.run(total({"double": [2, 4]}, fake_context(Numbers(numbers=[1, 2])))) == 8
    with pytest.raises(RuntimeError, match="no database connection"):
        _ = fake_context(None).connection


def test_fake_context_hands_over_a_connection_the_test_owns(pgflow: FlowDatabase) -> None:
    with pgflow.connect() as conn:
        ctx = fake_context(Numbers(numbers=[]), connection=conn)
        assert ctx.connection.execute("select 41 + 1").fetchone() == (42,)


def test_a_sync_handler_past_its_timeout_does_not_hold_up_the_retry(pgflow: FlowDatabase) -> None:
    release = threading.Event()
    attempts: list[int] = []

    def stuck_once(flow_input: object, ctx: Context[object], /) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            release.wait(60)  # a thread that cannot be stopped: abandoned at the timeout
        return "done"

    flow: Flow[str, None, Any] = Flow(
        slug="kitStuck",
        options=FlowOptions(max_attempts=2, base_delay=3600, timeout=30),
        steps=(Step(slug="stuck", options=StepOptions(timeout=1)),),
    )
    try:
        run = pgflow.run_flow(flow, handlers={"stuck": stuck_once}, input=None)
    finally:
        release.set()
    assert (run.status, run.output, attempts) == ("completed", {"stuck": "done"}, [1, 2])
