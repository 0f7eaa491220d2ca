"""Invariants of pgflow.step_states that hold whatever writes the table (engine migration 0004)."""

from __future__ import annotations

import psycopg
import pytest

from tests.engine import Engine


def test_a_started_step_must_know_its_task_count(engine: Engine) -> None:
    engine.flow("plain", {"slug": "only"})
    run_id = engine.start("plain", {})
    assert engine.state(run_id, "only")["status"] == "started"
    with pytest.raises(psycopg.errors.CheckViolation, match="initial_tasks_is_known_when_started"):
        engine.conn.execute(
            "update pgflow.step_states set initial_tasks = null where run_id = %s", (run_id,)
        )


def test_a_waiting_dependent_map_may_not_know_its_size_yet(engine: Engine) -> None:
    engine.flow(
        "fanout",
        {"slug": "list"},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
    )
    run_id = engine.start("fanout", {})
    state = engine.state(run_id, "each")
    assert (state["status"], state["initial_tasks"]) == ("created", None)
    [task] = engine.poll("fanout")
    engine.complete(task, [1, 2])
    state = engine.state(run_id, "each")
    assert (state["status"], state["initial_tasks"]) == ("started", 2)


def test_a_chain_of_sixty_empty_maps_completes(engine: Engine) -> None:
    """pgflow refuses cascades deeper than 50 steps; here the cascade is a loop bounded by the
    number of steps, so a long chain of empty maps completes in one call (documented in
    docs/pgflow-differences.md)."""
    steps: list[dict[str, object]] = [{"slug": "m0", "step_type": "map"}]
    steps += [
        {"slug": f"m{i}", "deps_slugs": [f"m{i - 1}"], "step_type": "map"} for i in range(1, 60)
    ]
    engine.flow("longChain", *steps)
    run_id = engine.start("longChain", [])
    run = engine.run(run_id)
    assert run["status"] == "completed"
    assert run["output"] == {"m59": []}
    statuses = engine.all(
        "select status, count(*) as n from pgflow.step_states where run_id = %s group by status",
        run_id,
    )
    assert statuses == [{"status": "completed", "n": 60}]
