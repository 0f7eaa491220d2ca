"""A PostgreSQL restart in the middle of runs: workers reconnect, results finished while the
server was down are reported afterwards, and every run completes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import Client, embedded
from pgflow_gen.runtime.errors import DatabaseError
from tests.e2e.harness import Db, Workers, eventually
from tests.e2e.project.app.pgflow import e2e_plain


@pytest.fixture
def own_workers(own_server: embedded.EmbeddedServer, tmp_path: Path) -> Iterator[Workers]:
    workers = Workers(own_server.url(), tmp_path)
    yield workers
    workers.close()


@pytest.mark.slow
def test_a_postgresql_restart_mid_run_loses_nothing(
    own_server: embedded.EmbeddedServer, own_workers: Workers, tmp_path: Path
) -> None:
    url, workers = own_server.url(), own_workers
    db = Db(url)
    try:
        for entry in ("first", "second", "side"):
            workers.start("e2e_steps", entry).started()
        gate = tmp_path / "gate"
        held = [db.start("e2eSteps", {"n": n, "gate": str(gate)}) for n in range(5)]
        eventually(
            lambda: db.value("select count(*) from pgflow.step_tasks where status = 'started'"
                             " and step_slug = 'first'") == 5,
            "five first tasks in flight",
        )  # fmt: skip
        db.close()
        own_server.stop()
        gate.touch()  # the handlers finish while the server is down
        for worker in workers:
            worker.wait_for_log("lost the database connection")
        own_server.ensure_started()
        db = Db(url)
        later = [db.start("e2eSteps", {"n": n}) for n in range(5, 10)]
        for run_id in [*held, *later]:
            run = db.finished(run_id)
            assert run["status"] == "completed"
            assert run["output"]["second"] == (run["input"]["n"] + 1) * 2
        # No retry was needed: the results made while the server was down were reported after.
        attempts = db.all("select attempts_count from pgflow.step_tasks where step_slug = 'first'")
        assert {a["attempts_count"] for a in attempts} == {1}
        for worker in workers:
            assert worker.proc.poll() is None
            # One line when the database went, one when it was back: no line per retry.
            log = worker.wait_for_log("the database connection is back after ")
            assert log.count("lost the database connection") == 1, log
            assert log.count("the database connection is back after ") == 1, log
            assert "database unreachable" not in log
    finally:
        db.close()


@pytest.mark.slow
def test_sigterm_stops_an_idle_worker_while_the_database_is_down(
    own_server: embedded.EmbeddedServer, own_workers: Workers
) -> None:
    # The default grace period (30 s) is for handlers in flight; an idle worker with nothing to
    # report tries to mark itself stopped for a few seconds only, says why it could not, exits 0.
    worker = own_workers.start("e2e_plain", "worker").started()
    own_server.stop()
    worker.wait_for_log("lost the database connection")
    worker.signal(signal.SIGTERM)
    assert worker.wait(deadline=20.0) == 0
    log = worker.log()
    line = next(x for x in log.splitlines() if "could not mark worker" in x)
    assert "stopped within 3 s (" in line
    reason = line.split("stopped within 3 s (", 1)[1].split(")", 1)[0]
    assert reason.strip()  # names why: the server is unreachable
    assert "Traceback" not in log


def test_sigterm_stops_a_worker_still_waiting_for_its_database(
    own_server: embedded.EmbeddedServer, own_workers: Workers
) -> None:
    # A worker that starts before its database retries; stopped meanwhile, it stops at once,
    # cleanly: exit 0, no error, nothing registered.
    own_server.stop()
    worker = own_workers.start("e2e_plain", "worker")
    worker.wait_for_log("database not reachable yet")
    worker.signal(signal.SIGTERM)
    assert worker.wait(deadline=10.0) == 0
    log = worker.log()
    assert "worker e2ePlain stopped before it started" in log
    assert "ERROR" not in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_client_keeps_working_across_a_postgresql_restart(
    own_server: embedded.EmbeddedServer,
) -> None:
    url = own_server.url()
    flow = e2e_plain.FLOW
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("select pgflow.ensure_flow_compiled(%s, %s)", (flow.slug, Jsonb(flow.shape())))
    with Client(url) as client:
        before = client.start_flow(flow, e2e_plain.Input(name="before"))
        own_server.stop()
        with pytest.raises(DatabaseError, match="Cannot connect to the database"):
            client.get_run(before.run_id)
        own_server.ensure_started()
        # The pooled connection died with the server: the next call gets a new one.
        after = client.start_flow(flow, e2e_plain.Input(name="after"))
        assert client.get_run(before.run_id).status == "started"
        assert after.run_id != before.run_id
