"""Run priority end to end (engine 0031): a backlog of runs is waiting when one urgent run starts;
the generated worker process, claiming one task at a time, runs the urgent run's two steps
first, then the backlog first in, first out."""

from __future__ import annotations

from typing import Any

from pgflow_gen.runtime import Client, Flow, Step
from tests.e2e.harness import Db, Workers, eventually

#: The e2e project's plain flow, as a caller without its generated module holds it.
PLAIN: Flow[Any, Any, Any] = Flow(
    slug="e2ePlain", steps=(Step(slug="shout"), Step(slug="wrap_up", dependencies=("shout",)))
)
BACKLOG = 12


def test_a_worker_runs_the_urgent_run_before_the_backlog(workers: Workers, plain: Db) -> None:
    with Client(workers.db_url) as client:
        backlog = client.start_flows(PLAIN, [{"name": f"n{i}"} for i in range(BACKLOG)])
        urgent = client.start_flow(PLAIN, {"name": "urgent"}, priority=10)

    worker = workers.start("e2e_plain", "worker", "--max-concurrent", "1").started()
    eventually(
        lambda: plain.value("select count(*) = %s from pgflow.runs where status = 'completed'",
                            BACKLOG + 1) or None,
        "every run completed",
    )  # fmt: skip
    order = [
        (row["run_id"], row["step_slug"])
        for row in plain.all(
            "select run_id, step_slug from pgflow.step_tasks order by started_at, run_id"
        )
    ]
    assert order[:2] == [(urgent.run_id, "shout"), (urgent.run_id, "wrap_up")]
    shouts = [run for run, step in order[2:] if step == "shout"]
    assert shouts == [run.run_id for run in backlog]
    assert worker.stop() == 0
    assert "Traceback" not in worker.log()
