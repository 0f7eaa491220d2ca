"""Upgrading a populated version-1 database to 0002 (per-step queues), as a real upgrade would:
existing flows, queues, task snapshots and queued messages survive untouched and their work then
completes; definitions that break the new naming rules make the upgrade fail atomically."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import errors, migrations
from tests.engine import Engine, shape_step

SNAPSHOT = {
    "flows": "select flow_slug, opt_max_attempts, opt_base_delay, opt_timeout from pgflow.flows"
    " order by 1",
    "steps": "select flow_slug, step_slug, step_index, queue_name from pgflow.steps order by 1, 3",
    "runs": "select run_id, flow_slug, status, input, remaining_steps from pgflow.runs order by 1",
    "tasks": "select run_id, step_slug, task_index, status, attempts_count, message_id, queue_name"
    " from pgflow.step_tasks order by 1, 2, 3",
    "queues": "select queue_name from pgmq.meta order by 1",
    "messages": "select msg_id, read_ct, message from pgmq.q_orderflow order by 1",
    "map_messages": "select msg_id, read_ct, message from pgmq.q_mapper order by 1",
}


def snapshot(engine: Engine) -> dict[str, list[Any]]:
    return {name: engine.all(query) for name, query in SNAPSHOT.items()}


@pytest.fixture
def version_1(empty_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert [m.version for m in migrations.migrate(conn, target="0001")] == ["0001"]
        yield Engine(conn)


def populate(engine: Engine) -> None:
    """Flows with mixed-case slugs, finished runs, runs in flight with queued and started tasks."""
    engine.flow(
        "orderFlow", {"slug": "fetchUser"}, {"slug": "save_it", "deps_slugs": ["fetchUser"]}
    )
    engine.conn.execute(
        "select pgflow.ensure_flow_compiled('Mapper', %s)",
        (Jsonb({"steps": [shape_step("double", stepType="map")]}),),
    )
    done = engine.start("orderFlow", {"n": 0})
    [task] = engine.poll("orderFlow", qty=1)
    assert task.run_id == done
    engine.complete(task, {"user": 0})
    [task] = engine.poll("orderFlow", qty=1)
    engine.complete(task, "saved")
    for n in (1, 2, 3):
        engine.start("orderFlow", {"n": n})
    engine.poll("orderFlow", qty=1)  # one started task, two queued ones
    engine.start("Mapper", [1, 2, 3])


def test_an_upgrade_keeps_everything_and_the_work_then_completes(version_1: Engine) -> None:
    engine = version_1
    populate(engine)
    before = snapshot(engine)
    assert [m.version for m in migrations.migrate(engine.conn, target="0002")] == ["0002"]
    assert snapshot(engine) == before
    assert {r["queue_mode"] for r in engine.all("select queue_mode from pgflow.flows")} == {"flow"}

    # The started task's handler finishes; the queued work is claimed with four-argument calls.
    [started] = engine.all("select * from pgflow.step_tasks where status = 'started'")
    engine.call("complete_task", started["run_id"], started["step_slug"], 0, Jsonb({"user": 1}))
    for _ in range(10):
        tasks = engine.poll("orderFlow") + engine.poll("Mapper")
        if not tasks:
            break
        for task in tasks:
            output = task.input * 2 if task.step_slug == "double" else {"user": task.input}
            engine.complete(task, output)
    runs = engine.all("select flow_slug, status, output from pgflow.runs order by started_at")
    assert {r["status"] for r in runs} == {"completed"}
    assert runs[-1]["output"] == {"double": [2, 4, 6]}


def test_upgraded_flows_verify_with_the_new_compiler(version_1: Engine) -> None:
    engine = version_1
    populate(engine)
    migrations.migrate(engine.conn)
    result = engine.value(
        "select pgflow.ensure_flow_compiled('Mapper', %s, 'flow', %s)",
        Jsonb({"steps": [shape_step("double", stepType="map")]}),
        Jsonb([{"stepSlug": "double", "queueName": "mapper"}]),
    )
    assert result["status"] == "verified"


def test_definitions_breaking_the_new_rules_abort_the_upgrade_atomically(
    version_1: Engine,
) -> None:
    engine = version_1
    populate(engine)
    engine.call("create_flow", "_legacy")  # never used
    engine.call("create_flow", "double__under")
    engine.call("create_flow", "Orders")
    engine.call("create_flow", "orders")
    engine.flow("fine", {"slug": "Fetch"}, {"slug": "fetch"}, {"slug": "trailing_"})
    before = snapshot(engine)

    with pytest.raises(errors.MigrationError) as raised:
        migrations.migrate(engine.conn)

    assert raised.value.detail is not None
    lines = raised.value.detail.splitlines()
    assert lines[0] == (
        "Engine migration 0002 cannot upgrade: 5 persisted definitions break the new naming rules."
    )
    assert sorted(lines[1:]) == sorted(
        [
            'flow "_legacy": it must start with a letter',
            'flow "double__under": "__" is reserved as the separator of generated queue names',
            'flow "orders": differs only in case from flow "Orders"'
            " (flow slugs must be unique ignoring case)",
            'flow "fine", step "fetch": differs only in case from step "Fetch"'
            " (step slugs must be unique ignoring case)",
            'flow "fine", step "trailing_": it must not end with an underscore',
        ]
    )
    assert raised.value.hint is not None
    assert "Nothing was changed" in raised.value.hint
    assert migrations.applied(engine.conn).keys() == {"0001"}
    assert snapshot(engine) == before
    assert (
        engine.value(
            "select count(*) from information_schema.columns where column_name = 'queue_mode'"
        )
        == 0
    )
