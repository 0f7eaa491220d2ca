"""Worker settings and assignments are checked before a worker connects anywhere."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgflow_gen.runtime import (
    Flow,
    Step,
    errors,
    run_main,
    with_step_queues,
)
from pgflow_gen.runtime.worker import settings as worker_config
from pgflow_gen.runtime.worker.process import assignment_for, start_worker
from pgflow_gen.runtime.worker.settings import WorkerSettings, check, overrides


def handler(value: Any, ctx: Any, /) -> Any:
    return value


FLOW: Flow[str, object, object] = Flow(
    slug="orders", steps=(Step(slug="fetch"), Step(slug="store", dependencies=("fetch",)))
)
QUEUED = with_step_queues(FLOW)
BOTH = {"fetch": handler, "store": handler}


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
    WorkerSettings(**{k: v for k, v in found.items() if k != "database_url"})


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


def test_a_settings_object_is_checked_when_it_is_made() -> None:
    with pytest.raises(errors.ConfigError, match=r"connect_timeout=0\b") as raised:
        WorkerSettings(connect_timeout=0)
    assert raised.value.hint == "connect_timeout must be seconds above 0."
    assert WorkerSettings(poll_interval=1).poll_interval == 1


def test_keywords_win_over_the_settings_object_and_overrides_over_both() -> None:
    base = WorkerSettings(max_concurrent=4, batch_size=50, check_outputs=False)
    merged = worker_config.settings(
        base, {"max_concurrent": 8, "batch_size": None}, {"max_concurrent": 2}
    )
    assert merged == WorkerSettings(max_concurrent=2, batch_size=50, check_outputs=False)
    assert worker_config.settings(None, {}) == WorkerSettings()


def test_an_unknown_setting_or_a_settings_of_another_type_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="Unknown worker setting 'max_concurent'") as bad:
        worker_config.settings(None, {"max_concurent": 3})
    assert bad.value.hint == (
        "Worker settings are batch_size, check_outputs, connect_timeout, max_concurrent,"
        " metrics_host, metrics_port, notifications, poll_interval, prepared_statements,"
        " read_visibility, recovery_interval, schedules, shutdown_grace, worker_name"
        " (docs/workers.md)."
    )
    with pytest.raises(errors.ConfigError, match="settings must be a WorkerSettings, got dict"):
        worker_config.settings({"max_concurrent": 3}, {})  # type: ignore[arg-type]


def test_every_setting_has_a_variable_and_a_flag() -> None:
    fields = {f.name for f in dataclasses.fields(WorkerSettings)}
    switches = {"notifications", "prepared_statements", "check_outputs", "schedules"}
    environ = {f"PGFLOW_{name.upper()}": "3" for name in fields - switches - {"worker_name"}}
    assert set(overrides([], environ)) == fields - switches - {"worker_name"}
    flags = [f"--{name.replace('_', '-')}=on" for name in sorted(switches)]
    assert overrides([*flags, "--worker-name", "w"], {}) == {
        "notifications": True, "prepared_statements": True, "check_outputs": True,
        "schedules": True, "worker_name": "w",
    }  # fmt: skip
    assert overrides([], {"PGFLOW_SCHEDULES": "off"}) == {"schedules": False}


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


@pytest.fixture
def listening_url() -> Iterator[tuple[str, socket.socket]]:
    """A database URL whose port accepts TCP connections nobody answers: it records whether a
    connection was attempted."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        yield f"postgresql://nobody@127.0.0.1:{port}/x?connect_timeout=1", listener


def _no_connection_attempted(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda url: start_worker(FLOW, step_slug="fetch", handler=handler, database_url=url),  # type: ignore[call-overload]
            'Flow "orders" uses its default queue, so its worker takes no step_slug',
        ),
        (
            lambda url: start_worker(QUEUED, handlers={"fetch": handler}, database_url=url),  # type: ignore[call-overload]
            'A worker of step-queued flow "orders" runs one step: pass step_slug and handler,',
        ),
        (
            lambda url: start_worker(QUEUED, step_slug=None, handler=handler, database_url=url),  # type: ignore[call-overload]
            'Step-queued flow "orders" needs a step_slug.',
        ),
        (
            lambda url: start_worker(QUEUED, step_slug="nope", handler=handler, database_url=url),
            'Step-queued flow "orders" has no step "nope".',
        ),
        (
            lambda url: start_worker(FLOW, handlers=BOTH, database_url=url, max_concurrent=0),
            "Invalid worker setting max_concurrent=0.",
        ),
        (
            lambda url: start_worker(FLOW, handlers=BOTH, database_url=url, max_concurent=3),  # type: ignore[call-overload]
            "Unknown worker setting 'max_concurent'.",
        ),
        (
            lambda url: start_worker(
                FLOW, handlers=BOTH, database_url=url,
                settings=WorkerSettings(batch_size=5), batch_size=0,
            ),
            "Invalid worker setting batch_size=0.",
        ),
    ],
)  # fmt: skip
def test_start_worker_raises_config_errors_before_connecting(
    listening_url: tuple[str, socket.socket], call: Callable[[str], None], message: str
) -> None:
    url, listener = listening_url
    with pytest.raises(errors.ConfigError) as raised:
        call(url)
    assert str(raised.value).startswith(message)
    assert _no_connection_attempted(listener)


def test_start_worker_raises_database_error_for_an_unreachable_database() -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(errors.DatabaseError, match="cannot connect to the database"):
        start_worker(
            FLOW,
            handlers={"fetch": handler, "store": handler},
            database_url=f"postgresql://nobody@127.0.0.1:{port}/x",
            connect_timeout=0.5,
        )
    # The error ended that call only: the process may call start_worker again.
    with pytest.raises(errors.ConfigError, match="needs a step_slug"):
        start_worker(QUEUED, step_slug=None, handler=handler)  # type: ignore[call-overload]


def test_run_main_logs_one_line_and_returns_1_for_a_typed_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def main() -> None:
        start_worker(QUEUED, step_slug=None, handler=handler, database_url="postgresql://x/y")  # type: ignore[call-overload]

    assert run_main(main) == 1
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().startswith(
        'ConfigError: Step-queued flow "orders" needs a step_slug.'
    )
    assert record.exc_info is None
    assert run_main(lambda: None) == 0

    def broken() -> None:
        raise ValueError("a bug, not a user's mistake")

    with pytest.raises(ValueError, match="a bug"):
        run_main(broken)


@pytest.mark.parametrize(
    "values",
    [{"batch_size": 2.5}, {"max_concurrent": True}, {"poll_interval": "1"}, {"worker_name": 3}],
)
def test_settings_given_in_code_must_have_their_type(values: dict[str, Any]) -> None:
    with pytest.raises(errors.ConfigError, match="Invalid worker setting"):
        check(values)
    check({"poll_interval": 2, "shutdown_grace": 0.5, "notifications": False})


def test_a_sigterm_while_the_worker_starts_stops_it_cleanly_without_connecting(
    listening_url: tuple[str, socket.socket],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A process manager may stop a worker it has just started: the signal arrives while the
    # settings are checked, before the event loop runs, and must not kill the process.
    url, listener = listening_url
    checked = worker_config.check

    def check_then_get_stopped(settings: dict[str, Any]) -> None:
        checked(settings)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(worker_config, "check", check_then_get_stopped)
    before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.INFO, logger="pgflow_gen.worker"):
        start_worker(FLOW, handlers=BOTH, database_url=url)
    assert "worker orders stopped before it started" in caplog.messages
    assert "worker orders: received SIGTERM, draining 0 handlers for up to 30.0 s" in (
        caplog.messages
    )
    assert _no_connection_attempted(listener)
    assert signal.getsignal(signal.SIGTERM) is before


def test_docs_workers_md_lists_every_setting_with_its_flag_variable_and_default() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "workers.md").read_text()
    table = doc.split("| setting | flag | environment variable | default | meaning |", 1)[1]
    rows = [row.split("|")[1:5] for row in table.split("\n\n", 1)[0].splitlines()[2:]]
    listed = {cells[0].strip().strip("`"): cells for cells in rows}
    assert set(listed) == {f.name for f in dataclasses.fields(WorkerSettings)}
    for name, (_, flag, variable, _default) in listed.items():
        assert flag.strip() == f"`--{name.replace('_', '-')}`"
        assert variable.strip() == f"`PGFLOW_{name.upper()}`"
