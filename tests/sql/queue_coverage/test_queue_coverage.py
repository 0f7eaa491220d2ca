"""queue_coverage: every persisted route against the live workers on exactly its queue."""

from __future__ import annotations

import uuid
from typing import Any

from tests.engine import Engine

STEPS: list[dict[str, Any]] = [{"slug": "classify"}, {"slug": "deliverSlack", "deps": ["classify"]}]


def worker(engine: Engine, queue: str, flow: str = "threads", **state: str) -> uuid.UUID:
    worker_id = uuid.uuid4()
    engine.conn.execute(
        "select pgflow.register_worker(%s, %s, 'tests', %s)", (worker_id, queue, flow)
    )
    for column, value in state.items():
        engine.conn.execute(
            f"update pgflow.workers set {column} = {value} where worker_id = %s", (worker_id,)
        )
    return worker_id


def coverage(engine: Engine, freshness: str | None = None) -> list[tuple[str, int, bool]]:
    query = "select * from pgflow.queue_coverage()"
    if freshness is not None:
        query = f"select * from pgflow.queue_coverage(interval '{freshness}')"
    return [(r["queue_name"], r["live_workers"], r["covered"]) for r in engine.all(query)]


def test_lists_every_route_uncovered_without_workers(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    rows = engine.all("select * from pgflow.queue_coverage()")
    assert [(r["flow_slug"], r["step_slug"], r["step_index"]) for r in rows] == [
        ("threads", "classify", 0),
        ("threads", "deliverSlack", 1),
    ]
    assert coverage(engine) == [
        ("threads__classify", 0, False),
        ("threads__deliverslack", 0, False),
    ]


def test_several_live_instances_are_one_covered_route(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    worker(engine, "threads__classify")
    worker(engine, "threads__classify")
    assert coverage(engine) == [
        ("threads__classify", 2, True),
        ("threads__deliverslack", 0, False),
    ]


def test_stopped_deprecated_and_stale_workers_do_not_count(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    worker(engine, "threads__classify", stopped_at="now()")
    worker(engine, "threads__classify", deprecated_at="now()")
    worker(engine, "threads__classify", last_heartbeat_at="now() - interval '16 seconds'")
    worker(engine, "threads__deliverslack")
    assert coverage(engine) == [
        ("threads__classify", 0, False),
        ("threads__deliverslack", 1, True),
    ]


def test_freshness_is_a_parameter(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    worker(engine, "threads__classify", last_heartbeat_at="now() - interval '16 seconds'")
    assert coverage(engine, "1 minute")[0] == ("threads__classify", 1, True)


def test_a_worker_on_another_spelling_of_the_queue_is_not_coverage(engine: Engine) -> None:
    engine.compile("threads", STEPS)
    worker(engine, "Threads__Classify")
    assert coverage(engine)[0] == ("threads__classify", 0, False)


def test_a_flow_mode_flow_has_one_route_per_step_on_its_queue(engine: Engine) -> None:
    engine.flow("plain", {"slug": "a"}, {"slug": "b", "deps_slugs": ["a"]})
    worker(engine, "plain", flow="plain")
    assert coverage(engine) == [("plain", 1, True), ("plain", 1, True)]
