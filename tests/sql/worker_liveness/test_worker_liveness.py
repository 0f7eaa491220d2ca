"""pgflow.worker_liveness(): the one SQL spelling of the liveness rule, its Python twin, its
settings, and the functions that read it (queue_coverage, claim_tasks, the stall rule)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import psycopg
import pytest

from pgflow_gen.engine import statements
from pgflow_gen.runtime import errors
from pgflow_gen.runtime.worker import liveness
from pgflow_gen.runtime.worker.psycopg_session import PsycopgSession
from tests.engine import WORKER_ID, Engine

OTHER = uuid.UUID("00000000-0000-0000-0000-00000000cafe")


def rule(engine: Engine) -> tuple[float, float, float]:
    row = engine.one("select * from pgflow.worker_liveness()")
    return (
        row["heartbeat_interval"].total_seconds(),
        row["live_within"].total_seconds(),
        row["stalled_after"].total_seconds(),
    )


def test_the_default_rule_is_the_python_one(engine: Engine) -> None:
    d = liveness.DEFAULT
    assert rule(engine) == (d.heartbeat_interval, d.live_within, d.stalled_after)


def test_a_worker_session_reads_the_rule_it_is_given(db_url: str) -> None:
    async def read() -> liveness.Liveness:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("set pgflow.heartbeat_interval = '1s'")
            await conn.execute("set pgflow.live_within = '3s'")
            return await PsycopgSession(conn).liveness()

    assert asyncio.run(read()) == liveness.Liveness(1.0, 3.0, 30.0)


def test_settings_change_the_rule(engine: Engine) -> None:
    engine.conn.execute("set pgflow.heartbeat_interval = '2s'")
    engine.conn.execute("set pgflow.live_within = '10s'")
    engine.conn.execute("set pgflow.stalled_after = '1 min'")
    assert rule(engine) == (2.0, 10.0, 60.0)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("heartbeat_interval", "0s"), ("live_within", "6s"), ("stalled_after", "10s")],
)
def test_an_inconsistent_rule_is_refused(engine: Engine, setting: str, value: str) -> None:
    engine.conn.execute(f"set pgflow.{setting} = '{value}'")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="Inconsistent worker liveness"):
        rule(engine)


def test_queue_coverage_counts_live_workers_by_the_rule(engine: Engine) -> None:
    engine.flow("orders", {"slug": "pay"})
    engine.call("register_worker", OTHER, "orders", "w", flow_slug="orders")
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '20 s'")
    covered = "select covered from pgflow.queue_coverage()"
    assert engine.value(covered) is False  # 20 s is past the default 15 s
    engine.conn.execute("set pgflow.live_within = '1 min'")
    engine.conn.execute("set pgflow.stalled_after = '2 min'")
    assert engine.value(covered) is True


@pytest.mark.parametrize("workers", [statements.workers("0022"), statements.workers("0020")])
@pytest.mark.parametrize("age_s", [14.9, 15.0, 15.1])
def test_workers_and_coverage_read_one_rule_even_at_its_edge(
    engine: Engine, age_s: float, workers: str
) -> None:
    # `pgflow-gen workers`, the dashboard and its metrics (statements.workers, on either engine
    # of the support window) call a worker live exactly when `coverage` and `status`
    # (pgflow.queue_coverage) count it: in one transaction now() is one instant, so a heartbeat
    # exactly 15 s old is tested too.
    engine.flow("orders", {"slug": "pay"})
    engine.call("register_worker", OTHER, "orders", "w", flow_slug="orders")
    with engine.conn.transaction():
        engine.conn.execute(
            "update pgflow.workers set last_heartbeat_at = now() - make_interval(secs => %s)",
            (age_s,),
        )
        state = engine.one(workers, False)["state"]
        covered = engine.value("select covered from pgflow.queue_coverage()")
    assert (state == "live") is covered
    assert covered is (age_s < 15.0)


def test_a_stopped_or_silent_worker_that_claims_is_registered_again(engine: Engine) -> None:
    engine.flow("orders", {"slug": "pay"})
    engine.start("orders")
    engine.register("orders")
    engine.call("mark_worker_stopped", WORKER_ID)
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '1 hour'")
    [task] = engine.poll("orders")
    worker = engine.one("select * from pgflow.workers where worker_id = %s", WORKER_ID)
    assert worker["stopped_at"] is None
    assert engine.value("select now() - %s::timestamptz", worker["last_heartbeat_at"]) < timedelta(
        seconds=60
    )
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    assert engine.task(task.run_id, "pay")["status"] == "started"


@pytest.mark.parametrize(
    ("settings", "detail"),
    [
        ({"stalled_after": "10s"}, "Inconsistent worker liveness settings"),
        ({"live_within": "soon"}, 'invalid input syntax for type interval: "soon"'),
    ],
)
def test_a_worker_on_unusable_liveness_settings_stops_with_a_config_error(
    db_url: str, settings: dict[str, str], detail: str
) -> None:
    async def read() -> liveness.Liveness:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for name, value in settings.items():
                await conn.execute(f"set pgflow.{name} = '{value}'")
            return await PsycopgSession(conn).liveness()

    with pytest.raises(errors.ConfigError) as raised:
        asyncio.run(read())
    assert raised.value.message == "The database's worker liveness settings cannot be used."
    assert raised.value.detail is not None
    assert raised.value.detail.startswith(detail)
