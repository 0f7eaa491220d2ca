"""start_flow with an idempotency key: a second start of the flow with that key returns the
existing run as it is and starts nothing, also when the starts race; keys are per flow and live
as long as their run."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.engine import Engine


def start(engine: Engine, flow: str, input: Any, key: str | None, **extra: Any) -> dict[str, Any]:
    [run] = engine.call("start_flow", flow, Jsonb(input), idempotency_key=key, **extra)
    return run


def counts(engine: Engine) -> tuple[int, int, int]:
    return (
        engine.value("select count(*) from pgflow.runs"),
        engine.value("select count(*) from pgflow.step_states"),
        engine.value("select count(*) from pgmq.q_orders"),
    )


def test_a_second_start_with_the_key_returns_the_run_and_starts_nothing(
    engine: Engine, db_url: str
) -> None:
    engine.flow("orders", {"slug": "charge"})
    first = start(engine, "orders", {"order": 1}, "order-1")
    before = counts(engine)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"listen pgflow_run_{first['run_id'].hex}")
        again = start(engine, "orders", {"order": "something else"}, "order-1")
        assert list(listener.notifies(timeout=0.3)) == []  # no event: nothing happened
    assert again == first  # the same row: its input, status and times
    assert counts(engine) == before == (1, 1, 1)
    assert first["idempotency_key"] == "order-1"


def test_the_run_comes_back_whatever_its_status(engine: Engine) -> None:
    engine.flow("orders", {"slug": "charge"})
    run = start(engine, "orders", {}, "k")
    engine.call("cancel_run", run["run_id"], "gone")
    again = start(engine, "orders", {}, "k")
    assert (again["run_id"], again["status"]) == (run["run_id"], "cancelled")


def test_keys_are_per_flow_and_a_run_without_a_key_is_always_new(engine: Engine) -> None:
    engine.flow("orders", {"slug": "charge"})
    engine.flow("refunds", {"slug": "refund"})
    order = start(engine, "orders", {}, "same")
    refund = start(engine, "refunds", {}, "same")
    assert order["run_id"] != refund["run_id"]
    plain = {start(engine, "orders", {}, None)["run_id"] for _ in range(2)}
    assert len(plain) == 2


def test_the_key_wins_over_a_run_id(engine: Engine) -> None:
    engine.flow("orders", {"slug": "charge"})
    first = start(engine, "orders", {}, "k", run_id=uuid.uuid4())
    again = start(engine, "orders", {}, "k", run_id=uuid.uuid4())
    assert again["run_id"] == first["run_id"]


def test_concurrent_starts_with_one_key_make_one_run(engine: Engine, db_url: str) -> None:
    engine.flow("orders", {"slug": "charge"})
    barrier = threading.Barrier(8)
    seen: list[uuid.UUID] = []
    failures: list[BaseException] = []

    def racer() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
                barrier.wait(timeout=30)
                row = conn.execute(
                    "select * from pgflow.start_flow('orders', '{}', idempotency_key => 'race')"
                ).fetchone()
                assert row is not None
                seen.append(row["run_id"])
        except BaseException as exc:  # reported below, with the others
            failures.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert len(seen) == 8
    assert len(set(seen)) == 1
    assert counts(engine) == (1, 1, 1)


def test_pruning_a_run_frees_its_key(engine: Engine) -> None:
    engine.flow("orders", {"slug": "charge"})
    first = start(engine, "orders", {}, "k")
    [task] = engine.poll("orders")
    engine.complete(task, "done")
    engine.conn.execute("update pgflow.runs set completed_at = now() - interval '2 days'")
    assert engine.value("select pgflow.prune_data_older_than(interval '1 day')")["runs"] == 1
    again = start(engine, "orders", {}, "k")
    assert again["run_id"] != first["run_id"]
    assert again["status"] == "started"
