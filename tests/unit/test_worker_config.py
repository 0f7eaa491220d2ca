"""Worker settings and assignments are checked before a worker connects anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from pgflow_gen.runtime import Flow, Step, errors, with_step_queues
from pgflow_gen.runtime.worker import assignment_for, start_worker
from pgflow_gen.runtime.worker_config import Tuning, check, overrides


def handler(value: Any, ctx: Any, /) -> Any:
    return value


FLOW: Flow[str, object, object] = Flow(
    slug="orders", steps=(Step(slug="fetch"), Step(slug="store", dependencies=("fetch",)))
)
QUEUED = with_step_queues(FLOW)


def test_flags_win_over_environment_variables() -> None:
    found = overrides(
        ["--max-concurrent", "3", "--database-url", "postgresql://x/y"],
        {"PGFLOW_MAX_CONCURRENT": "9", "PGFLOW_SHUTDOWN_GRACE": "0", "PGFLOW_NOTIFICATIONS": "off"},
    )
    assert found == {
        "max_concurrent": 3,
        "shutdown_grace": 0.0,
        "notifications": False,
        "database_url": "postgresql://x/y",
    }
    Tuning(**{k: v for k, v in found.items() if k != "database_url"})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PGFLOW_MAX_CONCURRENT": "0"}, "PGFLOW_MAX_CONCURRENT"),
        ({"PGFLOW_BATCH_SIZE": "many"}, "PGFLOW_BATCH_SIZE"),
        ({"PGFLOW_POLL_INTERVAL": "nan"}, "PGFLOW_POLL_INTERVAL"),
        ({"PGFLOW_NOTIFICATIONS": "maybe"}, "PGFLOW_NOTIFICATIONS"),
    ],
)
def test_bad_values_are_config_errors_naming_their_source(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        overrides([], environ)


def test_values_given_in_code_are_checked_too() -> None:
    with pytest.raises(errors.ConfigError, match="max_concurrent=0"):
        check({"max_concurrent": 0})


def test_a_step_worker_gets_its_own_queue_and_the_complete_route_map() -> None:
    assignment = assignment_for(QUEUED, step_slug="store", handler=handler, handlers=None)
    assert (assignment.queue_mode, assignment.queue_name, assignment.step_slug) == (
        "step",
        "orders__store",
        "store",
    )
    assert list(assignment.route_map) == [
        {"stepSlug": "fetch", "queueName": "orders__fetch"},
        {"stepSlug": "store", "queueName": "orders__store"},
    ]


@pytest.mark.parametrize("step_slug", [None, "unknown", "Store"])
def test_a_step_queued_flow_needs_one_of_its_step_slugs(step_slug: str | None) -> None:
    with pytest.raises(errors.ConfigError) as raised:
        assignment_for(QUEUED, step_slug=step_slug, handler=handler, handlers=None)
    assert raised.value.hint == 'Valid step slugs: "fetch", "store".'


def test_a_plain_flow_rejects_a_step_slug() -> None:
    with pytest.raises(errors.ConfigError, match="takes no step_slug"):
        assignment_for(FLOW, step_slug="fetch", handler=handler, handlers=None)


def test_a_plain_flow_needs_a_handler_for_every_step_and_no_other() -> None:
    with pytest.raises(errors.ConfigError) as raised:
        assignment_for(FLOW, step_slug=None, handler=None, handlers={"fetch": handler, "x": 1})
    assert str(raised.value).startswith(
        'The handlers of flow "orders" do not match its steps: missing "store"; unknown "x".'
    )
    plain = assignment_for(
        FLOW, step_slug=None, handler=None, handlers={"fetch": handler, "store": handler}
    )
    assert (plain.queue_mode, plain.queue_name) == ("flow", "orders")


def test_start_worker_checks_before_connecting_and_exits_1_with_one_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No database is configured or reachable here: the check fails first.
    with pytest.raises(SystemExit) as raised:
        start_worker(QUEUED, step_slug=None, handler=handler, database_url="postgresql://nowhere/x")  # type: ignore[call-overload]
    assert raised.value.code == 1
    assert 'ConfigError: Step-queued flow "orders" needs a step_slug.' in caplog.text


@pytest.mark.parametrize(
    "values",
    [{"batch_size": 2.5}, {"max_concurrent": True}, {"poll_interval": "1"}, {"worker_name": 3}],
)
def test_settings_given_in_code_must_have_their_type(values: dict[str, Any]) -> None:
    with pytest.raises(errors.ConfigError, match="Invalid worker setting"):
        check(values)
    check({"poll_interval": 2, "shutdown_grace": 0.5, "notifications": False})
