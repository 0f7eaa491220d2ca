"""Errors that are not retried: a handler's PermanentError, or an exception of a class its step
(or flow) lists in `retry_not_on`, fails the task at once whatever attempts are left, and the
stored error says so and why; every other error is retried as before. A name that does not
import is a ConfigError before anything connects."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgflow_gen.runtime import (
    Context,
    Flow,
    FlowOptions,
    PermanentError,
    Step,
    StepOptions,
    errors,
    start_worker,
)
from pgflow_gen.runtime.worker import permanent
from pgflow_gen.testing import FlowDatabase


class CardDeclined(PermanentError):
    pass


def flow(**step_options: Any) -> Flow[Any, Any, Any]:
    return Flow(
        slug="charge",
        options=FlowOptions(max_attempts=3, base_delay=1, retry_not_on=("KeyError",)),
        steps=(Step(slug="pay", options=StepOptions(**step_options)),),
    )


def attempts_and_error(pgflow: FlowDatabase, run_id: object) -> tuple[int, str]:
    with pgflow.connect() as conn:
        row = conn.execute(
            "select attempts_count, error_message from pgflow.step_tasks where run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.parametrize(
    ("raised", "why"),
    [
        (PermanentError("card 4242 was declined"), "the handler raised PermanentError"),
        (CardDeclined("card 4242"), "the handler raised CardDeclined, a PermanentError"),
        (
            json.JSONDecodeError("bad", "{", 0),
            "JSONDecodeError, a ValueError, is listed in the step's retry.not_on (ValueError)",
        ),
    ],
)
def test_a_permanent_failure_fails_the_task_at_once(
    pgflow: FlowDatabase, raised: Exception, why: str
) -> None:
    def pay(flow_input: Any, ctx: Context[Any], /) -> Any:
        raise raised

    run = pgflow.run_flow(flow(retry_not_on=("ValueError",)), handlers={"pay": pay}, input={})

    assert run.status == "failed"
    attempts, error = attempts_and_error(pgflow, run.run_id)
    assert attempts == 1
    summary, note, *_ = error.split("\n")
    assert summary.startswith(type(raised).__name__)
    assert note == f"Not retried (attempt 1 of 3): {why}"
    assert run.failure is not None
    assert run.failure.attempts == 1


def test_the_flows_list_applies_unless_the_step_has_its_own(pgflow: FlowDatabase) -> None:
    def pay(flow_input: Any, ctx: Context[Any], /) -> Any:
        raise KeyError("card")

    run = pgflow.run_flow(flow(), handlers={"pay": pay}, input={})
    assert attempts_and_error(pgflow, run.run_id)[0] == 1  # the flow's KeyError

    run = pgflow.run_flow(flow(retry_not_on=()), handlers={"pay": pay}, input={})
    attempts, error = attempts_and_error(pgflow, run.run_id)
    assert attempts == 3  # the step's own (empty) list: retried
    assert "Not retried" not in error


def test_other_errors_are_retried_as_before(pgflow: FlowDatabase) -> None:
    tries: list[int] = []

    def pay(flow_input: Any, ctx: Context[Any], /) -> Any:
        tries.append(ctx.attempt)
        if len(tries) < 3:
            raise RuntimeError("the gateway timed out")
        return "paid"

    run = pgflow.run_flow(flow(retry_not_on=("ValueError",)), handlers={"pay": pay}, input={})
    assert (run.status, tries) == ("completed", [1, 2, 3])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ValueErorr", 'retry.not_on names "ValueErorr", which does not import'),
        ("app.nowhere:Declined", 'retry.not_on names "app.nowhere:Declined", which does not'),
        ("json:dumps", 'retry.not_on names "json:dumps", which is not an exception class.'),
    ],
)
def test_a_name_that_is_no_exception_class_is_a_config_error_before_connecting(
    name: str, message: str
) -> None:
    def pay(flow_input: Any, ctx: Context[Any], /) -> Any:
        return None

    with pytest.raises(errors.ConfigError) as refused:
        start_worker(
            flow(retry_not_on=(name,)),
            handlers={"pay": pay},
            database_url="postgresql://nobody@127.0.0.1:1/none",
        )
    assert refused.value.message.startswith(message)


def test_resolve_takes_builtin_names_and_import_paths() -> None:
    resolved = permanent.resolve(["ValueError", "json:JSONDecodeError"])
    assert [(r.cls, r.listed) for r in resolved] == [
        (ValueError, "ValueError"),
        (json.JSONDecodeError, "json:JSONDecodeError"),
    ]
    assert permanent.reason(RuntimeError("x"), resolved) is None
