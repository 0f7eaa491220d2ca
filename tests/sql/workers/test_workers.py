from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.engine import Engine

WORKER = uuid.UUID("00000000-0000-0000-0000-00000000beef")


def register(engine: Engine) -> None:
    engine.flow("orders", {"slug": "ship"})  # a worker registers for a route that exists
    engine.call("register_worker", WORKER, "orders", "orders-worker", flow_slug="orders")


def test_registers_a_worker_with_its_queue(engine: Engine) -> None:
    register(engine)
    row = engine.one("select * from pgflow.workers")
    assert (row["worker_id"], row["queue_name"], row["flow_slug"], row["function_name"]) == (
        WORKER,
        "orders",
        "orders",
        "orders-worker",
    )


def test_a_heartbeat_refreshes_the_worker_and_says_it_is_not_deprecated(engine: Engine) -> None:
    register(engine)
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '1 hour'")
    assert engine.value("select pgflow.heartbeat_worker(%s)", WORKER) is False
    age = engine.value("select now() - last_heartbeat_at from pgflow.workers")
    assert age.total_seconds() < 60


def test_a_heartbeat_tells_a_deprecated_worker_to_stop(engine: Engine) -> None:
    register(engine)
    engine.conn.execute("update pgflow.workers set deprecated_at = now()")
    assert engine.value("select pgflow.heartbeat_worker(%s)", WORKER) is True


def test_a_heartbeat_of_an_unknown_worker_raises(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.NoDataFound, match="is not registered"):
        engine.value("select pgflow.heartbeat_worker(%s)", WORKER)


def test_marking_a_worker_stopped_is_idempotent(engine: Engine) -> None:
    register(engine)
    engine.call("mark_worker_stopped", WORKER)
    first = engine.value("select stopped_at from pgflow.workers")
    engine.call("mark_worker_stopped", WORKER)
    assert first is not None
    assert engine.value("select stopped_at from pgflow.workers") == first


def test_registering_again_revives_a_stopped_worker(engine: Engine) -> None:
    register(engine)
    engine.call("mark_worker_stopped", WORKER)
    register(engine)
    assert engine.value("select stopped_at from pgflow.workers") is None
