"""Run and step transitions notify `pgflow_run_<run id without dashes>`, never with outputs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from tests.engine import Engine


def listen(db_url: str, run_id: uuid.UUID) -> psycopg.Connection[Any]:
    listener = psycopg.connect(db_url, autocommit=True)
    listener.execute(f"listen pgflow_run_{run_id.hex}")
    return listener


def received(listener: psycopg.Connection[Any], count: int) -> list[dict[str, Any]]:
    """The first `count` events (committed already, so the timeout is only a safety bound)."""
    return [json.loads(n.payload) for n in listener.notifies(timeout=10, stop_after=count)]


def test_a_run_announces_its_transitions_in_order(engine: Engine, db_url: str) -> None:
    engine.flow("chain", {"slug": "first"}, {"slug": "second", "deps_slugs": ["first"]})
    run_id = uuid.uuid4()
    with listen(db_url, run_id) as listener:
        engine.call("start_flow", "chain", {"big": "x" * 10_000}, run_id=run_id)
        for _ in range(2):
            [task] = engine.poll("chain")
            engine.complete(task, {"big": "y" * 10_000})
        events = received(listener, 6)
    assert [(e["event"], e["step_slug"]) for e in events] == [
        ("run:started", None),
        ("step:started", "first"),
        ("step:completed", "first"),
        ("step:started", "second"),
        ("step:completed", "second"),
        ("run:completed", None),
    ]
    assert all(set(e) == {"event", "run_id", "step_slug", "status"} for e in events)
    assert {e["run_id"] for e in events} == {str(run_id)}


def test_failures_and_skips_are_announced(engine: Engine, db_url: str) -> None:
    engine.flow(
        "mixed",
        {"slug": "gate", "required_input_pattern": {"go": True}},
        {"slug": "bad", "max_attempts": 1},
    )
    run_id = uuid.uuid4()
    with listen(db_url, run_id) as listener:
        engine.call("start_flow", "mixed", {"go": False}, run_id=run_id)
        [bad] = engine.poll("mixed")
        engine.fail(bad)
        events = received(listener, 5)
    assert [(e["event"], e["step_slug"], e["status"]) for e in events] == [
        ("run:started", None, "started"),
        ("step:skipped", "gate", "skipped"),
        ("step:started", "bad", "started"),
        ("step:failed", "bad", "failed"),
        ("run:failed", None, "failed"),
    ]
