"""A step's timeout is enforced by its worker: past it an async handler is cancelled, a sync
handler's thread is abandoned (told through ctx.cancelled, its late result discarded), the
attempt fails with a HandlerTimeoutError and retries per the step's policy. Meanwhile the
task's message stays hidden, and the worker warns about none of its own tasks."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import Db, Workers


def test_handlers_past_their_timeout_fail_their_attempts_and_retry(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    worker = workers.start("e2e_timeouts", "worker").started()
    # Each handler would take 12 s; the steps' timeout is 3 s and they have 2 attempts.
    run_id = db.start("e2eTimeouts", {"seconds": 12, "marks": str(tmp_path)})

    run = db.finished(run_id)

    assert run["status"] == "failed"
    failed = db.all(
        "select step_slug, attempts_count, error_message from pgflow.step_tasks"
        " where run_id = %s and status = 'failed'",
        run_id,
    )
    assert failed  # the first step to run out of attempts failed the run
    for task in failed:
        step = task["step_slug"]
        assert task["attempts_count"] == 2
        assert task["error_message"].startswith(
            f'HandlerTimeoutError: Step "{step}" ran past its timeout of 3 s (attempt 2): '
        )
    # Both handlers were stopped at their first deadline: the async one cancelled, the sync one
    # told through ctx.cancelled.
    assert (tmp_path / "async-cancelled-1").exists()
    assert (tmp_path / "sync-cancelled-1").exists()
    log = worker.log()
    assert "attempt 1 failed: HandlerTimeoutError: " in log
    assert "unclaimed" not in log  # its own in-flight messages stayed its own

    # The abandoned threads returned; the worker goes on with new work.
    quick = db.start("e2eTimeouts", {"seconds": 0.1, "marks": str(tmp_path)})
    assert db.finished(quick)["output"] == {"slowAsync": "done", "slowSync": "done"}


def test_a_handler_within_its_timeout_completes_on_its_first_attempt(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    worker = workers.start("e2e_timeouts", "worker").started()
    run_id = db.start("e2eTimeouts", {"seconds": 2, "marks": str(tmp_path)})
    assert db.finished(run_id)["status"] == "completed"
    assert (
        db.value("select max(attempts_count) from pgflow.step_tasks where run_id = %s", run_id) == 1
    )
    assert "unclaimed" not in worker.log()
