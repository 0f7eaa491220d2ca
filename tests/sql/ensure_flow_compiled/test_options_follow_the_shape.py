"""Options (retries, delays, timeouts) are not part of the compared shape: verifying a flow
applies the shape's options in place, says what changed, and leaves the attempts in flight their
claim's timeout."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.engine import Engine
from tests.sql.ensure_flow_compiled.test_ensure_flow_compiled import ensure, local, step


def shape(flow: dict[str, Any], fetch: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "steps": [step("fetch", **({"options": fetch} if fetch else {})), step("save", "fetch")],
        "options": flow,
    }


def options(engine: Engine) -> dict[str, Any]:
    flow = engine.one("select opt_max_attempts, opt_base_delay, opt_timeout from pgflow.flows")
    steps = engine.all(
        "select step_slug, opt_max_attempts, opt_base_delay, opt_timeout, opt_start_delay"
        " from pgflow.steps order by step_index"
    )
    return {"flow": flow, "steps": steps}


def test_verifying_applies_changed_options_and_lists_them(engine: Engine) -> None:
    ensure(engine, shape({"maxAttempts": 3, "timeout": 60}, {"timeout": 30}))
    result = ensure(
        engine, shape({"maxAttempts": 5, "timeout": 60}, {"timeout": 10, "startDelay": 2})
    )
    assert result["status"] == "verified"
    assert result["optionsUpdated"] == [
        {"step": None, "option": "maxAttempts", "from": 3, "to": 5},
        {"step": "fetch", "option": "timeout", "from": 30, "to": 10},
        {"step": "fetch", "option": "startDelay", "from": None, "to": 2},
    ]
    assert result["summary"] == (
        'verified; options updated: flow maxAttempts 3 -> 5, step "fetch" timeout 30 -> 10,'
        ' step "fetch" startDelay the flow\'s -> 2'
    )
    assert options(engine) == {
        "flow": {"opt_max_attempts": 5, "opt_base_delay": 5, "opt_timeout": 60},
        "steps": [
            {"step_slug": "fetch", "opt_max_attempts": None, "opt_base_delay": None,
             "opt_timeout": 10, "opt_start_delay": 2},
            {"step_slug": "save", "opt_max_attempts": None, "opt_base_delay": None,
             "opt_timeout": None, "opt_start_delay": None},
        ],
    }  # fmt: skip


def test_an_option_left_out_of_a_step_goes_back_to_the_flows(engine: Engine) -> None:
    ensure(engine, shape({"timeout": 60}, {"timeout": 30, "maxAttempts": 2}))
    result = ensure(engine, shape({"timeout": 60}))
    assert [(c["option"], c["from"], c["to"]) for c in result["optionsUpdated"]] == [
        ("maxAttempts", 2, None),
        ("timeout", 30, None),
    ]
    assert engine.value("select opt_timeout from pgflow.steps where step_slug = 'fetch'") is None


def test_unchanged_options_verify_as_before(engine: Engine) -> None:
    ensure(engine, shape({"timeout": 60}, {"timeout": 30}))
    assert ensure(engine, shape({"timeout": 60}, {"timeout": 30})) == {
        "status": "verified",
        "mismatchKind": None,
        "differences": [],
    }


def test_a_shape_without_options_changes_none(engine: Engine) -> None:
    ensure(engine, shape({"maxAttempts": 7}, {"timeout": 30}))
    bare = {"steps": [step("fetch"), step("save", "fetch")]}
    assert "optionsUpdated" not in ensure(engine, bare)
    assert engine.value("select opt_max_attempts from pgflow.flows") == 7
    assert engine.value("select opt_timeout from pgflow.steps where step_slug = 'fetch'") == 30


def test_the_change_is_notified_on_pgflow_flows(engine: Engine) -> None:
    ensure(engine, shape({"timeout": 60}))
    engine.conn.execute("listen pgflow_flows")
    ensure(engine, shape({"timeout": 20}))
    [event] = list(engine.conn.notifies(timeout=5, stop_after=1))
    assert json.loads(event.payload) == {
        "event": "flow:options_updated",
        "flow_slug": "shaped",
        "changes": [{"step": None, "option": "timeout", "from": 60, "to": 20}],
    }


def test_an_attempt_in_flight_keeps_the_timeout_it_was_claimed_with(engine: Engine) -> None:
    ensure(engine, shape({"timeout": 60}, {"timeout": 100}))
    run_id = engine.start("shaped")
    [task] = engine.poll("shaped")
    assert task.timeout == 100
    ensure(engine, shape({"timeout": 60}, {"timeout": 5}))
    engine.backdate_started(run_id, "fetch", 60)  # past the new 5 s + 30 s, within 100 s + 30 s
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 0
    engine.backdate_started(run_id, "fetch", 131)
    assert engine.value("select pgflow.requeue_stalled_tasks()") == 1


@pytest.mark.parametrize(("runs", "said"), [(3, "3 runs"), (1, "1 run")])
def test_a_local_recompile_says_how_many_runs_it_deleted(
    engine: Engine, runs: int, said: str
) -> None:
    ensure(engine, shape({"timeout": 60}))
    for _ in range(runs):
        engine.start("shaped")
    local(engine)
    result = ensure(engine, {"steps": [step("only")], "options": {}})
    assert (result["status"], result["deletedRuns"]) == ("recompiled", runs)
    assert result["summary"] == f"recompiled: {said} deleted"
