"""`if` / `if_not` containment patterns and `when_unmet`, evaluated once when a step is ready."""

from __future__ import annotations

from tests.engine import Engine


def test_a_root_step_runs_when_the_input_contains_its_pattern(engine: Engine) -> None:
    engine.flow("gate", {"slug": "vip", "required_input_pattern": {"tier": "gold"}})
    run_id = engine.start("gate", {"tier": "gold", "name": "Ada"})
    assert engine.state(run_id, "vip")["status"] == "started"


def test_an_unmet_root_condition_skips_the_step(engine: Engine) -> None:
    engine.flow("gate", {"slug": "vip", "required_input_pattern": {"tier": "gold"}})
    run_id = engine.start("gate", {"tier": "free"})
    state = engine.state(run_id, "vip")
    assert (state["status"], state["skip_reason"]) == ("skipped", "condition_unmet")
    assert engine.tasks(run_id, "vip") == []
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", None)


def test_if_not_skips_the_step_when_the_input_contains_the_pattern(engine: Engine) -> None:
    engine.flow("gate", {"slug": "notify", "forbidden_input_pattern": {"muted": True}})
    run_id = engine.start("gate", {"muted": True})
    assert engine.state(run_id, "notify")["status"] == "skipped"


def test_if_and_if_not_must_both_hold(engine: Engine) -> None:
    engine.flow(
        "gate",
        {
            "slug": "both",
            "required_input_pattern": {"kind": "order"},
            "forbidden_input_pattern": {"test": True},
        },
    )
    met = engine.start("gate", {"kind": "order"})
    unmet = engine.start("gate", {"kind": "order", "test": True})
    assert engine.state(met, "both")["status"] == "started"
    assert engine.state(unmet, "both")["status"] == "skipped"


def test_when_unmet_fail_fails_the_step_and_the_run(engine: Engine) -> None:
    engine.flow(
        "strict",
        {"slug": "other"},
        {"slug": "must", "required_input_pattern": {"ok": True}, "when_unmet": "fail"},
    )
    run_id = engine.start("strict", {"ok": False})
    state = engine.state(run_id, "must")
    assert (state["status"], state["error_message"]) == ("failed", "Condition not met")
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "other")["status"] == "cancelled"
    assert engine.queued_messages("strict") == []


def test_a_dependent_condition_sees_its_dependencies_outputs(engine: Engine) -> None:
    engine.flow(
        "route",
        {"slug": "classify"},
        {
            "slug": "help",
            "deps_slugs": ["classify"],
            "required_input_pattern": {"classify": {"route": "help"}},
        },
        {
            "slug": "spam",
            "deps_slugs": ["classify"],
            "required_input_pattern": {"classify": {"route": "spam"}},
        },
    )
    run_id = engine.start("route")
    [classify] = engine.poll("route")
    engine.complete(classify, {"route": "help"})
    assert engine.state(run_id, "help")["status"] == "started"
    assert engine.state(run_id, "spam")["status"] == "skipped"


def test_a_skipped_dependency_is_absent_from_the_dependents_input(engine: Engine) -> None:
    engine.flow(
        "optional",
        {"slug": "maybe", "required_input_pattern": {"extra": True}},
        {"slug": "always"},
        {"slug": "join", "deps_slugs": ["maybe", "always"]},
    )
    engine.start("optional", {"extra": False})
    [always] = engine.poll("optional")
    engine.complete(always, "A")
    [join] = engine.poll("optional")
    assert join.input == {"always": "A"}


def test_skip_cascade_skips_every_descendant(engine: Engine) -> None:
    engine.flow(
        "cascade",
        {"slug": "gate", "required_input_pattern": {"go": True}, "when_unmet": "skip-cascade"},
        {"slug": "child", "deps_slugs": ["gate"]},
        {"slug": "grandchild", "deps_slugs": ["child"]},
        {"slug": "independent"},
    )
    run_id = engine.start("cascade", {"go": False})
    reasons = {s: engine.state(run_id, s)["skip_reason"] for s in ("gate", "child", "grandchild")}
    assert reasons == {
        "gate": "condition_unmet",
        "child": "dependency_skipped",
        "grandchild": "dependency_skipped",
    }
    assert engine.run(run_id)["remaining_steps"] == 1
    [independent] = engine.poll("cascade")
    engine.complete(independent, 1)
    assert engine.run(run_id)["output"] == {"independent": 1}


def test_plain_skip_lets_dependents_run(engine: Engine) -> None:
    engine.flow(
        "soft",
        {"slug": "gate", "required_input_pattern": {"go": True}},
        {"slug": "child", "deps_slugs": ["gate"]},
    )
    run_id = engine.start("soft", {"go": False})
    [child] = engine.poll("soft")
    assert child.input == {}
    engine.complete(child, "ran")
    assert engine.run(run_id)["output"] == {"child": "ran"}


def test_a_map_whose_only_dependency_was_skipped_completes_empty(engine: Engine) -> None:
    engine.flow(
        "mapgate",
        {"slug": "list", "required_input_pattern": {"go": True}},
        {"slug": "each", "deps_slugs": ["list"], "step_type": "map"},
    )
    run_id = engine.start("mapgate", {"go": False})
    each = engine.state(run_id, "each")
    assert (each["status"], each["output"]) == ("completed", [])
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"each": []})


def test_a_run_whose_leaves_were_all_skipped_completes_with_null_output(engine: Engine) -> None:
    engine.flow(
        "nothing",
        {"slug": "root"},
        {"slug": "leaf", "deps_slugs": ["root"], "required_input_pattern": {"root": "yes"}},
    )
    run = engine.run_to_end("nothing", {"root": "no"})
    assert (run["status"], run["output"]) == ("completed", None)


def test_the_condition_is_not_evaluated_again_after_the_step_started(engine: Engine) -> None:
    engine.flow(
        "once",
        {"slug": "root"},
        {"slug": "gated", "deps_slugs": ["root"], "required_input_pattern": {"root": 1}},
    )
    run_id = engine.start("once")
    [root] = engine.poll("once")
    engine.complete(root, 1)
    engine.conn.execute(
        "update pgflow.step_states set output = '2' where run_id = %s and step_slug = 'root'",
        (run_id,),
    )
    [gated] = engine.poll("once")
    engine.complete(gated, "done")
    assert engine.run(run_id)["status"] == "completed"


def test_a_cascade_reaching_a_step_with_another_running_parent_still_completes_the_run(
    engine: Engine,
) -> None:
    engine.flow(
        "join",
        {"slug": "gate", "required_input_pattern": {"go": True}, "when_unmet": "skip-cascade"},
        {"slug": "slow"},
        {"slug": "both", "deps_slugs": ["gate", "slow"]},
        {"slug": "after_slow", "deps_slugs": ["slow"]},
    )
    run_id = engine.start("join", {"go": False})
    assert engine.state(run_id, "both")["status"] == "skipped"
    [slow] = engine.poll("join")
    engine.complete(slow, "S")
    [after] = engine.poll("join")
    engine.complete(after, "A")
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"after_slow": "A"})
