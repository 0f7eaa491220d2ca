"""pgflow.worker_states(live_within): every registered worker with its state, the one place the
liveness rule decides live, stale, deprecated and stopped (engine 0022); queue_coverage counts
its live workers, and `pgflow-gen workers`, the dashboard and the metrics read it."""

from __future__ import annotations

import uuid

import pytest

from pgflow_gen.engine import statements
from tests.engine import Engine
from tests.roles import Logins, refused

LIVE = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
STALE = uuid.UUID("00000000-0000-0000-0000-0000000000a2")
DEPRECATED = uuid.UUID("00000000-0000-0000-0000-0000000000a3")
STOPPED = uuid.UUID("00000000-0000-0000-0000-0000000000a4")


def four_workers(engine: Engine) -> None:
    """One worker in each state on the route orders/pay; each silent for 20 s but LIVE."""
    engine.flow("orders", {"slug": "pay"})
    for worker in (LIVE, STALE, DEPRECATED, STOPPED):
        engine.call("register_worker", worker, "orders", f"w-{worker.hex[-2:]}", flow_slug="orders")
    engine.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '20 s'"
        " where worker_id <> %s",
        (LIVE,),
    )
    engine.conn.execute("update pgflow.workers set deprecated_at = now() where worker_id = %s",
                        (DEPRECATED,))  # fmt: skip
    engine.call("mark_worker_stopped", STOPPED)


def states(engine: Engine, query: str = "select * from pgflow.worker_states()") -> dict[str, str]:
    return {row["function_name"]: row["state"] for row in engine.all(query)}


def test_each_worker_has_one_state(engine: Engine) -> None:
    four_workers(engine)
    assert states(engine) == {"w-a1": "live", "w-a2": "stale", "w-a3": "deprecated",
                              "w-a4": "stopped"}  # fmt: skip
    row = engine.one("select * from pgflow.worker_states() where worker_id = %s", LIVE)
    assert (row["flow_slug"], row["step_slug"], row["queue_name"]) == ("orders", None, "orders")


def test_the_window_defaults_to_the_liveness_rule_and_can_be_given(engine: Engine) -> None:
    four_workers(engine)
    engine.conn.execute("set pgflow.live_within = '1 min'")
    engine.conn.execute("set pgflow.stalled_after = '2 min'")
    assert states(engine)["w-a2"] == "live"  # 20 s is within the rule's minute
    given = "select * from pgflow.worker_states(interval '10 s')"
    assert states(engine, given)["w-a2"] == "stale"
    # A stopped or deprecated worker is never live, however wide the window.
    wide = "select * from pgflow.worker_states(interval '1 day')"
    assert states(engine, wide) == {"w-a1": "live", "w-a2": "live", "w-a3": "deprecated",
                                    "w-a4": "stopped"}  # fmt: skip


def test_coverage_counts_exactly_the_live_ones(engine: Engine) -> None:
    four_workers(engine)
    assert engine.one("select live_workers, covered from pgflow.queue_coverage()") == {
        "live_workers": 1,
        "covered": True,
    }
    engine.conn.execute("update pgflow.workers set last_heartbeat_at = now() - interval '1 min'")
    assert engine.one("select live_workers, covered from pgflow.queue_coverage()") == {
        "live_workers": 0,
        "covered": False,
    }


@pytest.mark.parametrize("statement", [statements.workers("0022"), statements.workers("0020")])
def test_the_workers_statement_on_either_engine_of_the_window_reads_the_same(
    engine: Engine, statement: str
) -> None:
    four_workers(engine)
    assert [(row["function_name"], row["state"]) for row in engine.all(statement, True)] == [
        (row["function_name"], row["state"])
        for row in engine.all(
            "select * from pgflow.worker_states() order by queue_name, started_at"
        )
    ]
    # Without `all`, a worker stopped within the hour shows; one stopped earlier does not.
    assert "w-a4" in {row["function_name"] for row in engine.all(statement, False)}
    engine.conn.execute(
        "update pgflow.workers set stopped_at = now() - interval '61 minutes' where worker_id = %s",
        (STOPPED,),
    )
    assert "w-a4" not in {row["function_name"] for row in engine.all(statement, False)}
    assert "w-a4" in {row["function_name"] for row in engine.all(statement, True)}


def test_a_reader_reads_states_and_a_worker_may_not(logins: Logins, engine: Engine) -> None:
    four_workers(engine)
    reader = logins.login("reader")
    count = reader.execute("select count(*) from pgflow.worker_states()").fetchone()
    assert count == (4,)
    # Workers read no table: the states of other workers are not theirs to list.
    worker = logins.login("worker")
    assert "permission denied for function worker_states" in refused(
        worker, "select * from pgflow.worker_states()"
    )
