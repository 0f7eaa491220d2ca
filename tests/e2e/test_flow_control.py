"""Flow control end to end, with worker processes started from the generated entry files: the
spec's `max_in_flight` caps a step across three workers of `max_concurrent: 10` each, and its
`rate_limit` keeps the step's starts within the limit and close to it while work is plentiful.
The limits come from the spec, through the workers' compilation of the flow."""

from __future__ import annotations

import datetime
from typing import Any

from psycopg.types.json import Jsonb

from tests.e2e.harness import Db, Workers, eventually
from tests.e2e.test_worker_metrics import scrape

SAMPLE_S = 0.05


def start_runs(db: Db, flow_slug: str, inputs: list[dict[str, Any]]) -> None:
    db.conn.execute(
        "select pgflow.start_flows(%s, %s::jsonb[])", (flow_slug, [Jsonb(i) for i in inputs])
    )


def test_three_workers_never_start_more_than_the_steps_cap(workers: Workers, db: Db) -> None:
    started = [
        workers.start(
            "e2e_capped", "capped", **({"PGFLOW_METRICS_PORT": "0"} if n == 0 else {})
        ).started()
        for n in range(3)
    ]
    [limits] = db.all("select max_in_flight, set_by from pgflow.step_limits")
    assert limits == {"max_in_flight": 4, "set_by": "spec"}
    start_runs(db, "e2eCapped", [{"seconds": 0.1}] * 40)

    samples: list[int] = []

    def all_done() -> bool:
        samples.append(
            db.value(
                "select count(*) from pgflow.step_tasks"
                " where flow_slug = 'e2eCapped' and status = 'started'"
            )
        )
        return bool(db.value("select count(*) from pgflow.runs where status = 'completed'") == 40)

    eventually(all_done, "40 completed runs")  # samples every 50 ms meanwhile
    assert max(samples) <= 4, samples
    # Each worker could run ten at once: only the engine's cap keeps them at four. (Which
    # worker runs them does not matter; the one that frees a place usually takes it.)
    assert max(samples) == 4, samples
    assert len(samples) >= 10  # at least 40 x 0.1 s / 4 in flight

    def limited() -> float | None:
        samples = scrape(started[0])
        key = (
            "pgflow_worker_limited_claims_total",
            (("flow", "e2eCapped"), ("queue", "e2ecapped__capped")),
        )
        return samples.get(key)

    # Its claims were cut short by the cap at least once (a worker with nothing in flight
    # asks for ten).
    eventually(limited, "a limited claim in the first worker's metrics")
    for worker in started:
        assert worker.stop() == 0
        assert "Traceback" not in worker.log()
        assert "unclaimed" not in worker.log()


def test_a_rate_limit_holds_across_workers_and_is_used_while_work_waits(
    workers: Workers, db: Db
) -> None:
    started = [workers.start("e2e_metered", "metered").started() for _ in range(3)]
    count, period = 10, datetime.timedelta(seconds=2)
    start_runs(db, "e2eMetered", [{"n": n} for n in range(120)])

    def ten_seconds_of_starts() -> list[datetime.datetime] | None:
        starts: list[datetime.datetime] = [
            row[0]
            for row in db.conn.execute(
                "select started_at from pgflow.step_tasks"
                " where flow_slug = 'e2eMetered' and started_at is not null order by started_at"
            )
        ]
        if not starts or starts[-1] - starts[0] < datetime.timedelta(seconds=10.5):
            return None
        return starts

    starts = eventually(ten_seconds_of_starts, "ten seconds of starts", deadline=60)
    # Within the limit: no window of 2 s holds more than 10 starts.
    for n, at in enumerate(starts):
        in_window = [s for s in starts[: n + 1] if s > at - period]
        assert len(in_window) <= count, (at, len(in_window))
    # Close to it: the first 10 s started at least 80 % of the 50 the limit allows.
    first_ten = [s for s in starts if s < starts[0] + datetime.timedelta(seconds=10)]
    assert 40 <= len(first_ten) <= 50, len(first_ten)
    assert db.value("select max(attempts_count) from pgflow.step_tasks") == 1  # no attempt used
    for worker in started:
        assert worker.stop() == 0
        assert "Traceback" not in worker.log()


def test_a_tenants_backlog_does_not_hold_back_another_tenants_task(
    workers: Workers, db: Db
) -> None:
    """Two workers of `max_concurrent: 10`, a step keyed by tenant with at most 2 per tenant:
    tenant a never has more than 2 tasks started, and tenant b's one task, queued behind a's 30,
    starts while a's backlog is still waiting."""
    for _ in range(2):
        workers.start("e2e_fair", "work").started()
    start_runs(db, "e2eFair", [{"tenant": "a", "seconds": 0.1}] * 30)
    start_runs(db, "e2eFair", [{"tenant": "b", "seconds": 0}])

    samples: list[int] = []

    def all_done() -> bool:
        samples.append(
            db.value(
                "select count(*) from pgflow.step_tasks as t join pgflow.runs as r using (run_id)"
                " where t.flow_slug = 'e2eFair' and t.status = 'started'"
                " and r.input ->> 'tenant' = 'a'"
            )
        )
        return bool(db.value("select count(*) from pgflow.runs where status = 'completed'") == 31)

    eventually(all_done, "31 completed runs")
    assert max(samples) <= 2, samples
    assert max(samples) == 2, samples
    [order] = db.all(
        "select count(*) filter (where a.started_at > b.started_at) as a_after_b"
        " from pgflow.step_tasks as a join pgflow.runs as ra on ra.run_id = a.run_id,"
        " pgflow.step_tasks as b join pgflow.runs as rb on rb.run_id = b.run_id"
        " where ra.input ->> 'tenant' = 'a' and rb.input ->> 'tenant' = 'b'"
    )
    # Without the key, b's message sits behind a's 30 and b starts last; with it, b waits
    # behind at most the 2 of a's that hold a place.
    assert order["a_after_b"] >= 20, order
    assert db.value("select count(*) from pgflow.concurrency_keys") == 0
