"""Debounced starts end to end (engine 0030): a burst of starts from a Client makes one run, which
an idle worker process's scheduler (the database has no schedule) starts once the burst is over,
woken by the burst's notification, and the worker runs it to the end with the last input."""

from __future__ import annotations

from typing import Any

from pgflow_gen.runtime import Client, Flow, Step
from tests.e2e.harness import Db, Workers, eventually

#: The e2e project's plain flow, as a caller without its generated module holds it.
PLAIN: Flow[Any, Any, Any] = Flow(
    slug="e2ePlain", steps=(Step(slug="shout"), Step(slug="wrap_up", dependencies=("shout",)))
)


def test_a_burst_makes_one_run_that_an_idle_worker_starts_and_runs(
    workers: Workers, db: Db
) -> None:
    worker = workers.start("e2e_plain", "worker").started()
    with Client(workers.db_url) as client:
        for name in ("ada", "grace", "hopper"):
            pending = client.debounce_start(PLAIN, {"name": name}, key="names", period_s=0.5)
    assert pending.starts == 3

    [run] = eventually(lambda: db.all("select run_id from pgflow.runs"), "the burst's run")
    assert db.finished(run["run_id"])["output"] == {"wrap_up": "HOPPER!"}
    assert db.value("select count(*) from pgflow.debounced_starts") == 0
    assert "debounced start names of flow e2ePlain started run" in worker.log()
    assert worker.stop() == 0
    assert "Traceback" not in worker.log()
