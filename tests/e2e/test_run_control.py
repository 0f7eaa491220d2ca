"""Run control with worker processes: cancelling a run stops its running handlers at once (an
async one at its next await, a sync one told through ctx.cancelled and abandoned), sends
nothing for them, and leaves the worker serving other runs. A forged cancellation (any role may
NOTIFY) stops nothing: the worker asks the engine first (engine 0020)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pgflow_gen import naming
from tests.e2e.harness import Db, Workers, eventually
from tests.roles import Logins

STOP_WITHIN_S = 2.0


def test_cancelling_a_run_stops_its_60_s_handlers_within_2_s(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    worker = workers.start("e2e_control", "worker").started()
    run_id = db.start("e2eControl", {"seconds": 60, "marks": str(tmp_path)})
    eventually(
        lambda: db.value(
            "select count(*) = 2 from pgflow.step_tasks where run_id = %s and status = 'started'",
            run_id,
        ),
        "both handlers to start",
    )

    cancelled_at = time.monotonic()
    db.call("cancel_run", run_id, "the test is done with it")

    def both_stopped() -> str | None:
        log = worker.log()
        return log if log.count("stopped: the run was cancelled") == 2 else None

    log = eventually(both_stopped, "both handlers to stop", deadline=30)
    elapsed = time.monotonic() - cancelled_at
    assert elapsed < STOP_WITHIN_S, f"the handlers stopped {elapsed:.2f} s after the cancel"
    assert f"run {run_id} was cancelled: stopping 2 handlers" in log
    assert "slowAsync[0] attempt 1 stopped: the run was cancelled: it was cancelled" in log
    # The sync handler waits on ctx.cancelled, so it returns at once: the worker discards its
    # result, or abandons its thread a moment before it returns.
    assert (
        "slowSync[0] attempt 1 stopped: the run was cancelled: its result is discarded" in log
        or "slowSync[0] attempt 1 stopped: the run was cancelled: its thread cannot be stopped"
        " and was abandoned (ctx.cancelled is set)"
        in log
    ), log
    assert (tmp_path / "async-cancelled-1").exists()  # CancelledError at its next await
    eventually(lambda: (tmp_path / "sync-cancelled-1").exists(), "ctx.cancelled to be seen")

    run = db.run(run_id)
    assert (run["status"], run["cancel_reason"]) == ("cancelled", "the test is done with it")
    assert {t["status"] for t in db.all(
        "select status from pgflow.step_tasks where run_id = %s", run_id
    )} == {"cancelled"}  # fmt: skip
    assert "ignored the" not in log  # nothing was sent for the stopped handlers

    # The worker goes on with other runs (the abandoned thread returned its slot).
    quick = db.start("e2eControl", {"seconds": 0.1, "marks": str(tmp_path)})
    assert db.finished(quick)["output"] == {"slowAsync": "done", "slowSync": "done"}
    assert worker.stop() == 0


def test_a_forged_cancellation_from_a_role_without_any_grant_stops_no_handler(
    workers: Workers, db: Db, logins: Logins, tmp_path: Path
) -> None:
    worker = workers.start("e2e_control", "worker").started()
    run_id = db.start("e2eControl", {"seconds": 3, "marks": str(tmp_path)})
    eventually(
        lambda: db.value(
            "select count(*) = 2 from pgflow.step_tasks where run_id = %s and status = 'started'",
            run_id,
        ),
        "both handlers to start",
    )
    nobody = logins.connect(logins.create_login(f"{logins.prefix}_nobody"))  # no grant at all
    queue = db.value("select queue_name from pgflow.step_tasks where run_id = %s limit 1", run_id)
    forged = json.dumps({"event": "run:cancelled", "run_id": str(run_id)})
    sent = 0

    def forge_until_finished() -> bool:
        """One forged notification each poll (every POLL_S) while the run is started."""
        nonlocal sent
        nobody.execute("select pg_notify(%s, %s)", (naming.pgmq_insert_channel(queue), forged))
        sent += 1
        return bool(db.run(run_id)["status"] != "started")

    eventually(forge_until_finished, "the run to finish", deadline=60)

    assert db.run(run_id)["output"] == {"slowAsync": "done", "slowSync": "done"}
    log = worker.log()
    assert sent >= 2, sent
    assert "stopped: the run was cancelled" not in log
    assert f"ignored a run:cancelled notification for run {run_id}: the engine says" in log
    assert worker.stop() == 0


def test_a_paused_step_waits_under_load_across_a_worker_restart_and_resumes_at_once(
    workers: Workers, db: Db
) -> None:
    for step in ("first", "second", "side"):
        workers.start("e2e_steps", step).started()
    db.call("pause_step", "e2eSteps", "second", "the downstream API is down")
    runs = [db.start("e2eSteps", {"n": n}) for n in range(20)]

    def upstream_done() -> bool:
        return bool(db.value(
            "select count(*) = 40 from pgflow.step_tasks"
            " where step_slug in ('first', 'side') and status = 'completed'"
        ))  # fmt: skip

    eventually(upstream_done, "the steps before and beside the paused one to finish")
    second = next(w for w in workers if w.module.endswith(".second"))
    second.wait_for_log("a step of flow e2eSteps is paused")
    # The paused step's worker restarts: the pause is the engine's, so it holds.
    assert second.stop() == 0
    workers.start("e2e_steps", "second").started()
    waiting = db.all(
        "select status, attempts_count from pgflow.step_tasks where step_slug = 'second'"
    )
    assert waiting == [{"status": "queued", "attempts_count": 0}] * 20
    assert {db.run(run_id)["status"] for run_id in runs} == {"started"}

    [row] = db.call("resume_step", "e2eSteps", "second")
    assert row["resume_step"] > 0  # the held messages, shown at once
    for run_id in runs:
        assert db.finished(run_id)["status"] == "completed"
    assert (
        db.value("select max(attempts_count) from pgflow.step_tasks where step_slug = 'second'")
        == 1
    )
    assert not any("unclaimed" in w.log() for w in workers)
