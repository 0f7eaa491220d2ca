from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.engine import Engine
from tests.locks import wait_until_blocked


def test_removes_the_definition_runs_and_queue(engine: Engine) -> None:
    engine.flow("gone", {"slug": "a"}, {"slug": "b", "deps_slugs": ["a"]})
    engine.start("gone")
    engine.call("delete_flow_and_data", "gone")
    for table in ("flows", "steps", "deps", "runs", "step_states", "step_tasks"):
        assert engine.value(f"select count(*) from pgflow.{table}") == 0
    assert engine.value("select count(*) from pgmq.meta where queue_name = 'gone'") == 0


def test_does_nothing_for_an_unknown_flow(engine: Engine) -> None:
    engine.flow("kept", {"slug": "a"})
    engine.call("delete_flow_and_data", "missing")
    assert engine.value("select count(*) from pgflow.flows") == 1


def test_leaves_other_flows_untouched(engine: Engine) -> None:
    engine.flow("gone", {"slug": "a"})
    engine.flow("kept", {"slug": "a"})
    kept_run = engine.start("kept")
    engine.start("gone")
    engine.call("delete_flow_and_data", "gone")
    assert engine.run(kept_run)["status"] == "started"
    assert len(engine.queued_messages("kept")) == 1


def test_a_deletion_racing_a_callback_waits_for_it_instead_of_deadlocking(
    engine: Engine, db_url: str
) -> None:
    engine.flow("busy", {"slug": "a"}, {"slug": "b", "deps_slugs": ["a"]})
    run_id = engine.start("busy")
    [task] = engine.poll("busy")
    outcomes: dict[str, Any] = {}

    def run(name: str, sql: str, *params: Any) -> threading.Thread:
        def target() -> None:
            try:
                with psycopg.connect(db_url, autocommit=True) as conn:
                    outcomes[f"{name}_pid"] = conn.info.backend_pid
                    conn.execute(sql, params)
                    outcomes[name] = "ok"
            except psycopg.Error as exc:
                outcomes[name] = exc

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    with psycopg.connect(db_url) as holder:
        holder.execute(
            "select 1 from pgflow.step_states where run_id = %s and step_slug = 'a' for update",
            (run_id,),
        )
        completer = run("complete", "select pgflow.complete_task(%s, 'a', 0, '1')", task.run_id)
        wait_until_blocked(engine.conn, outcomes, "complete_pid")
        deleter = run("delete", "select pgflow.delete_flow_and_data('busy')")
        wait_until_blocked(engine.conn, outcomes, "delete_pid")
        holder.rollback()
    completer.join(timeout=60)
    deleter.join(timeout=60)
    assert (outcomes["complete"], outcomes["delete"]) == ("ok", "ok")
    assert engine.value("select count(*) from pgflow.flows") == 0
