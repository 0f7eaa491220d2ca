"""A worker process started from its generated entry file serves Prometheus metrics when asked
(`PGFLOW_METRICS_PORT`): what it claimed, how its handlers ended and how long they took, what
it holds in flight; and a port it cannot have is one line and exit 1."""

from __future__ import annotations

import re
import socket
import urllib.request
import uuid

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import Db, WorkerProcess, Workers, eventually


def scrape(worker: WorkerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = re.search(r"metrics at http://([\d.]+):(\d+)/metrics", worker.log())
    assert found is not None, worker.log()
    with urllib.request.urlopen(f"http://{found[1]}:{found[2]}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_worker_counts_its_tasks_by_outcome(workers: Workers, db: Db) -> None:
    # No PGFLOW_METRICS_HOST: loopback by default (0.0.0.0 until the integrity release).
    worker = workers.start("e2e_steps", "first", PGFLOW_METRICS_PORT="0").started()
    worker.wait_for_log("metrics at http://127.0.0.1:")
    done = [db.start("e2eSteps", {"n": n}) for n in range(3)]
    retried = db.start("e2eSteps", {"n": 9, "fail_first": 1})  # fails once, then completes
    for run_id in [*done, retried]:

        def first_done(run: uuid.UUID = run_id) -> bool:
            return bool(db.task(run, "first")["status"] == "completed")

        eventually(first_done, f"the first step of run {run_id}")

    labels = (("flow", "e2eSteps"), ("queue", "e2esteps__first"), ("step", "first"))

    def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        samples = scrape(worker)
        claimed = samples.get(("pgflow_worker_tasks_claimed_total", labels))
        return samples if claimed == 5 else None  # 3 + the retried one twice

    samples = eventually(settled, "five claims in the metrics")
    outcome = {
        name: samples.get(
            ("pgflow_worker_tasks_finished_total", tuple(sorted((*labels, ("outcome", name)))))
        )
        for name in ("completed", "failed")
    }
    assert outcome == {"completed": 4, "failed": 1}
    completed_count = tuple(sorted((*labels, ("outcome", "completed"))))
    assert samples[("pgflow_worker_handler_duration_seconds_count", completed_count)] == 4
    assert samples[("pgflow_worker_tasks_in_flight", labels)] == 0
    assert worker.stop() == 0


def test_a_metrics_port_in_use_is_one_line_and_exit_1(workers: Workers, db: Db) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = workers.start(
            "e2e_steps", "first", PGFLOW_METRICS_PORT=str(port), PGFLOW_METRICS_HOST="127.0.0.1"
        )
        assert worker.wait() == 1
    log = worker.log()
    assert f"Cannot serve metrics on 127.0.0.1:{port}: Address already in use." in log
    assert "Traceback" not in log
    assert db.value("select count(*) from pgflow.workers") == 0  # it never registered
