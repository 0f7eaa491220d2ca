"""A step-queued flow run by one worker process per step, each polling its own queue."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.e2e.harness import PROJECT, Db, WorkerProcess, Workers, eventually

FIRST, SECOND, SIDE = "e2esteps__first", "e2esteps__second", "e2esteps__side"


def step_completed(db: Db, run_id: uuid.UUID, step_slug: str) -> bool:
    return bool(db.state(run_id, step_slug)["status"] == "completed")


def hold_first(workers: Workers, db: Db, tmp_path: Path) -> tuple[WorkerProcess, uuid.UUID, Path]:
    """Start every step's worker and one run whose `first` handler waits for `gate` to exist."""
    gate = tmp_path / "gate"
    start_all(workers)
    run_id = db.start("e2eSteps", {"n": 1, "gate": str(gate)})
    first = workers.started[0]
    # The task is started when it is claimed, a moment before its handler runs: wait for the
    # handler itself, so a signal sent next finds it running.
    first.wait_for_log(f"waiting for gate {gate}")
    assert db.task(run_id, "first")["status"] == "started"
    return first, run_id, gate


def start_all(workers: Workers, *first_args: str) -> None:
    workers.start("e2e_steps", "first", *first_args).started()
    workers.start("e2e_steps", "second").started()
    workers.start("e2e_steps", "side").started()


def test_two_steps_on_separate_queues_execute_one_dag_and_one_run(workers: Workers, db: Db) -> None:
    start_all(workers)
    run_id = db.start("e2eSteps", {"n": 1})
    run = db.finished(run_id)
    assert (run["status"], run["output"]) == ("completed", {"second": 4, "side": "side 1"})
    queues = {r["step_slug"]: r["queue_name"] for r in db.all("select * from pgflow.step_tasks")}
    assert queues == {"first": FIRST, "second": SECOND, "side": SIDE}
    routes = db.all("select queue_name, live_workers from pgflow.queue_coverage() order by 1")
    assert [(r["queue_name"], r["live_workers"]) for r in routes] == [
        (FIRST, 1),
        (SECOND, 1),
        (SIDE, 1),
    ]


def test_each_worker_logs_only_its_own_step_and_queue(workers: Workers, db: Db) -> None:
    start_all(workers)
    for worker, queue in zip(workers, (FIRST, SECOND, SIDE), strict=True):
        line = next(x for x in worker.log().splitlines() if " started (" in x)
        assert f"queue {queue}" in line
        others = {FIRST, SECOND, SIDE} - {queue}
        assert not any(other in line for other in others)


def test_retries_then_success(workers: Workers, db: Db) -> None:
    start_all(workers)
    run_id = db.start("e2eSteps", {"n": 1, "fail_first": 1})
    run = db.finished(run_id)
    assert run["status"] == "completed"
    task = db.task(run_id, "first")
    assert task["attempts_count"] == 2
    summary, blank, traceback = task["error_message"].split("\n", 2)
    assert (summary, blank) == ("RuntimeError: planned failure on attempt 1", "")
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert 'app/handlers.py", line ' in traceback  # where the handler raised
    assert traceback.endswith("RuntimeError: planned failure on attempt 1")
    # The worker logged it at WARNING, with the traceback.
    log = workers.started[0].log()
    assert (
        f"WARNING pgflow_gen.worker: task {run_id}/first[0] attempt 1 failed: RuntimeError:" in log
    )
    assert 'raise RuntimeError(f"planned failure on attempt {ctx.attempt}")' in log


def test_a_blocked_step_does_not_starve_another_steps_ready_work(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    start_all(workers, "--max-concurrent", "1")
    blocked = db.start("e2eSteps", {"n": 0, "gate": str(gate)})
    eventually(lambda: db.task(blocked, "first")["status"] == "started", "first to start")
    waiting = [db.start("e2eSteps", {"n": n}) for n in range(1, 6)]
    # `first` has one slot, held by the gated task: every other run's `first` waits, yet `side`
    # (independently ready, on its own queue and workers) completes for every run.
    for run_id in [blocked, *waiting]:
        side_done = functools.partial(step_completed, db, run_id, "side")
        eventually(side_done, f"side of run {run_id}")
    assert {db.task(r, "first")["status"] for r in waiting} == {"queued"}
    gate.touch()
    for run_id in [blocked, *waiting]:
        assert db.finished(run_id)["status"] == "completed"


def test_a_worker_that_reads_its_own_running_tasks_message_hides_it_again_quietly(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    first, run_id, gate = hold_first(workers, db, tmp_path)
    message_id = db.task(run_id, "first")["message_id"]
    # Something made the message visible while its handler runs (an operator, a clock jump).
    db.conn.execute(f"update pgmq.q_{FIRST} set vt = now() where msg_id = %s", (message_id,))
    eventually(
        lambda: db.value(f"select read_ct from pgmq.q_{FIRST} where msg_id = %s", message_id) == 2,
        "the worker to read the message again",
    )

    # Its lease is back: hidden until about the step's timeout (30 s) after the claim + 2 s.
    def lease_back() -> float | None:
        rows = db.all(
            f"select extract(epoch from vt - now()) as left from pgmq.q_{FIRST}"
            " where msg_id = %s and vt > now() + interval '15 seconds'",
            message_id,
        )
        return float(rows[0]["left"]) if rows else None  # None until the worker restored it

    hidden_for = eventually(lease_back, "the lease to be restored")
    assert 15 < hidden_for <= 32
    task = db.task(run_id, "first")
    assert (task["status"], task["attempts_count"]) == ("started", 1)
    assert "unclaimed" not in first.log()  # its own task: nothing to warn about
    gate.touch()
    assert db.finished(run_id)["status"] == "completed"
    assert first.proc.poll() is None


def test_unmatched_and_wrong_route_messages_warn_stay_and_valid_work_continues(
    workers: Workers, db: Db
) -> None:
    start_all(workers)
    # An operator's mistakes: a body that is no task key, and a copy of a real task key of
    # another step (wrong route), sent straight into this step's queue.
    run_id = db.start("e2eSteps", {"n": 3})
    db.finished(run_id)
    wrong_route = db.task(run_id, "second")
    with db.conn.transaction():  # both visible at once, so that one read takes both
        stray = [
            db.value("select pgmq.send(%s, '{\"hello\": 1}'::jsonb)", FIRST),
            db.value(
                "select pgmq.send(%s, jsonb_build_object('flow_slug', 'e2eSteps', 'run_id',"
                " %s::uuid, 'step_slug', 'second', 'task_index', 0))",
                FIRST,
                wrong_route["run_id"],
            ),
        ]
    workers.started[0].wait_for_log(f"unclaimed, ids {stray[0]}, {stray[1]}")
    assert set(stray) <= set(db.queue_ids(FIRST))
    after = db.start("e2eSteps", {"n": 5})
    assert db.finished(after)["output"] == {"second": 12, "side": "side 5"}
    assert db.task(run_id, "second") == wrong_route


def test_sigterm_drains_the_handler_in_flight_then_stops(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    first, run_id, gate = hold_first(workers, db, tmp_path)
    first.signal(signal.SIGTERM)
    first.wait_for_log("received SIGTERM, draining 1 handler")
    gate.touch()
    assert first.wait() == 0
    assert db.task(run_id, "first")["status"] == "completed"
    stopped = db.value(
        "select stopped_at is not null from pgflow.workers where queue_name = %s", FIRST
    )
    assert stopped is True
    assert db.finished(run_id)["status"] == "completed"


def test_a_sigkilled_workers_task_is_recovered_and_the_run_completes(
    workers: Workers, db: Db, tmp_path: Path
) -> None:
    first, run_id, gate = hold_first(workers, db, tmp_path)
    first.signal(signal.SIGKILL)
    first.wait()
    gate.touch()
    # Its worker is gone: no heartbeat for 30 s (here: pretended). A new worker's periodic
    # recovery sweep requeues the task, well before its timeout, and the new worker runs it.
    db.conn.execute(
        "update pgflow.workers set last_heartbeat_at = now() - interval '31 seconds'"
        " where queue_name = %s",
        (FIRST,),
    )
    workers.start("e2e_steps", "first", PGFLOW_RECOVERY_INTERVAL="0.2").started()
    run = db.finished(run_id)
    assert run["status"] == "completed"
    assert db.task(run_id, "first")["requeued_count"] == 1


def test_step_workers_starting_at_once_converge_on_one_definition(workers: Workers, db: Db) -> None:
    started = [workers.start("e2e_steps", entry) for entry in ("first", "second", "side", "first")]
    logs = [worker.started().log() for worker in started]
    assert sum("flow e2eSteps compiled" in log for log in logs) == 1
    assert sum("flow e2eSteps verified" in log for log in logs) == 3
    assert db.value("select count(*) from pgflow.flows") == 1
    assert db.value("select count(*) from pgmq.meta") == 3


def test_a_changed_flow_is_refused_before_registration(workers: Workers, db: Db) -> None:
    # The database holds another definition under the same slug (production: not local).
    db.conn.execute(
        "select pgflow.ensure_flow_compiled('e2eSteps', %s::jsonb, 'flow')",
        (
            '{"steps": [{"slug": "first"}, {"slug": "second", "dependencies": ["first"]},'
            ' {"slug": "side"}]}',
        ),
    )
    worker = workers.start("e2e_steps", "second")
    assert worker.wait() == 1
    log = worker.log()
    assert "ERROR pgflow_gen.worker: FlowRoutingMismatchError: " in log
    assert "Traceback" not in log
    assert 'Queue mode of flow "e2eSteps" differs: expected "step", persisted "flow"' in log
    assert db.value("select count(*) from pgflow.workers") == 0


def test_an_engine_older_than_the_worker_is_refused_before_registration(
    workers: Workers, db: Db
) -> None:
    # As an engine older than the support window: its migrations table ends at 0019.
    db.conn.execute("delete from pgflow.schema_migrations where version >= '0020'")
    worker = workers.start("e2e_steps", "first")
    assert worker.wait() == 1
    log = worker.log()
    assert "Traceback" not in log
    assert "ERROR pgflow_gen.worker: DatabaseError: The database has no pgflow engine (or an" in log
    assert (
        "Its engine is at migration 0019; this release works with migration 0020 and later." in log
    )
    assert db.value("select count(*) from pgflow.workers") == 0
    assert db.value("select count(*) from pgflow.flows") == 0


def test_a_second_sigterm_ends_the_drain_at_once(workers: Workers, db: Db, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # never opened: the handler would wait for the whole grace period
    first = workers.start("e2e_steps", "first", PGFLOW_SHUTDOWN_GRACE="600").started()
    run_id = db.start("e2eSteps", {"n": 1, "gate": str(gate)})
    first.wait_for_log(f"waiting for gate {gate}")
    first.signal(signal.SIGTERM)
    first.wait_for_log("draining 1 handler for up to 600.0 s")
    first.signal(signal.SIGTERM)
    assert first.wait() == 0  # within the harness deadline, far below the 600 s grace
    assert (
        "worker e2eSteps-first: received SIGTERM again, stopping without waiting for 1"
        " handler; their tasks stay started and stall recovery will requeue them"
    ) in first.log()
    assert "after the grace period" not in first.log()
    assert db.task(run_id, "first")["status"] == "started"  # left to stall recovery


def test_an_entry_files_help_describes_its_worker_and_every_flag() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "app.pgflow.workers.e2e_steps.first", "--help"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: python -m app.pgflow.workers.e2e_steps.first ")
    text = " ".join(shown.stdout.split())
    assert "worker of flow e2eSteps, step first, queue e2esteps__first" in text
    flags = ("--max-concurrent", "--batch-size", "--poll-interval", "--shutdown-grace",
             "--worker-name", "--notifications", "--schedules", "--recovery-interval",
             "--prepared-statements",
             "--check-outputs", "--connect-timeout", "--read-visibility", "--metrics-port",
             "--metrics-host", "--database-url")  # fmt: skip
    for flag in flags:  # each flag is explained, with its default
        assert re.search(rf"{flag} [A-Z_]+ [A-Za-z].*?\(default: ", text), flag
    assert text.count("(default: ") == len(flags)


def test_a_retry_wakes_its_worker_when_its_delay_ends_not_at_the_next_poll(
    workers: Workers, db: Db
) -> None:
    # The first step's worker polls once a minute: only the engine saying when the retry's
    # message shows again (read_and_claim's notice) wakes it within the test's deadline.
    start_all(workers, "--poll-interval", "60")
    run_id = db.start("e2eSteps", {"n": 1, "fail_first": 1})
    assert db.finished(run_id, deadline=30)["status"] == "completed"
    assert db.task(run_id, "first")["attempts_count"] == 2  # retried after base_delay * 2 = 2 s
