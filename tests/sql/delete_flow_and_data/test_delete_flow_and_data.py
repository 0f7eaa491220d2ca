from __future__ import annotations

from tests.engine import Engine


def test_removes_the_definition_runs_and_queue(engine: Engine) -> None:
    engine.flow("gone", {"slug": "a"}, {"slug": "b", "deps_slugs": ["a"]})
    engine.start("gone")
    engine.call("delete_flow_and_data", "gone")
    for table in ("flows", "steps", "deps", "runs", "step_states", "step_tasks"):
        assert engine.value(f"select count(*) from pgflow.{table}") == 0
    assert engine.value("select count(*) from pgmq.meta where queue_name = 'gone'") == 0


def test_keeps_a_queue_another_flow_still_uses(engine: Engine) -> None:
    engine.flow("Orders", {"slug": "a"})
    engine.flow("orders", {"slug": "a"})
    engine.start("orders")
    engine.call("delete_flow_and_data", "Orders")
    assert engine.value("select count(*) from pgmq.meta where queue_name = 'orders'") == 1
    assert len(engine.queued_messages("orders")) == 1


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
