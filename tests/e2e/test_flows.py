"""A plain flow (one worker for every step), map fan-out, conditions and skips, deprecation."""

from __future__ import annotations

from tests.e2e.harness import Db, Workers


def test_a_plain_flow_with_compliant_slugs_runs_on_its_default_queue(
    workers: Workers, db: Db
) -> None:
    workers.start("e2e_plain", "worker").started()
    run_ids = [db.start("e2ePlain", {"name": name}) for name in ("ada", "grace")]
    outputs = [db.finished(run_id)["output"] for run_id in run_ids]
    assert outputs == [{"wrap_up": "ADA!"}, {"wrap_up": "GRACE!"}]
    assert {r["queue_name"] for r in db.all("select queue_name from pgflow.step_tasks")} == {
        "e2eplain"
    }
    assert db.value("select queue_mode from pgflow.flows") == "flow"


def start_fanout(workers: Workers) -> None:
    for entry in ("pick", "numbers", "double", "celebrate"):
        workers.start("e2e_fanout", entry).started()


def test_a_map_step_fans_out_and_a_met_condition_runs_its_step(workers: Workers, db: Db) -> None:
    start_fanout(workers)
    run_id = db.start("e2eFanout", {"numbers": [4, 5, 6]})
    run = db.finished(run_id)
    assert run["output"] == {"double": [8, 10, 12], "celebrate": "big!"}
    tasks = db.all(
        "select queue_name from pgflow.step_tasks where step_slug = 'double' order by task_index"
    )
    assert [t["queue_name"] for t in tasks] == ["e2efanout__double"] * 3


def test_an_unmet_condition_skips_its_step_and_an_empty_map_completes(
    workers: Workers, db: Db
) -> None:
    start_fanout(workers)
    run_id = db.start("e2eFanout", {"numbers": []})
    run = db.finished(run_id)
    assert (run["status"], run["output"]) == ("completed", {"double": []})
    state = db.state(run_id, "celebrate")
    assert (state["status"], state["skip_reason"]) == ("skipped", "condition_unmet")


def test_a_deprecated_worker_drains_and_stops(workers: Workers, db: Db) -> None:
    worker = workers.start("e2e_plain", "worker").started()
    db.conn.execute("update pgflow.workers set deprecated_at = now()")
    worker.wait_for_log("deprecated by an operator")
    assert worker.wait() == 0
    assert db.value("select stopped_at is not null from pgflow.workers") is True


def test_without_notifications_the_long_poll_fallback_keeps_work_moving(
    workers: Workers, db: Db
) -> None:
    # As behind a transaction-pooling PgBouncer, where LISTEN does not work.
    worker = workers.start(
        "e2e_plain", "worker", PGFLOW_NOTIFICATIONS="off", PGFLOW_POLL_INTERVAL="0.2"
    ).started()
    assert "insert notifications off; polling every 0.20 s" in worker.log()
    run_ids = [db.start("e2ePlain", {"name": f"n{i}"}) for i in range(3)]
    assert [db.finished(r)["status"] for r in run_ids] == ["completed"] * 3
    assert db.value("select count(*) from pgmq.notify_insert_throttle") == 0


def test_a_freed_slot_wakes_the_poller_without_waiting_for_the_long_poll(
    workers: Workers, db: Db
) -> None:
    # One slot and a long poll of 10 minutes: every next task must come from a wake-up (an
    # insert notification, or the slot freed once the result was sent), never from the long poll.
    workers.start(
        "e2e_plain", "worker", "--max-concurrent", "1", PGFLOW_POLL_INTERVAL="600"
    ).started()
    run_ids = [db.start("e2ePlain", {"name": f"n{i}"}) for i in range(5)]
    assert [db.finished(r)["status"] for r in run_ids] == ["completed"] * 5
