"""Upgrading 0027 to 0028 (subflows: new columns on steps and runs, and start_flow, retry_run and
cancel_run moved onto bodies that subflows share): work claimed on 0027 finishes; a flow compiled
on 0027 verifies unchanged; a run failed or started on 0027 is retried or cancelled as before;
and the upgraded engine runs a subflow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to

STEPS: list[dict[str, Any]] = [{"slug": "fetch"}, {"slug": "store", "deps": ["fetch"]}]


@pytest.fixture
def version_27(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0027") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0028")


def test_work_claimed_on_0027_finishes(version_27: Engine) -> None:
    claimed_work_finishes(version_27, upgrade)


def test_a_flow_compiled_on_0027_verifies_and_its_runs_go_on(version_27: Engine) -> None:
    engine = version_27
    assert engine.compile("sync", STEPS, mode="step")["status"] == "compiled"
    failed = engine.start("sync", {"page": 1})
    running = engine.start("sync", {"page": 2})
    first = next(t for t in engine.poll("sync", "sync__fetch", step="fetch") if t.run_id == failed)
    engine.call("fail_task", first.run_id, first.step_slug, first.task_index, "down", first.attempt,
                "not worth retrying")  # fmt: skip
    assert engine.run(failed)["status"] == "failed"

    upgrade(engine)

    assert engine.compile("sync", STEPS, mode="step")["status"] == "verified"
    assert engine.one(
        "select count(*) filter (where parent_run_id is not null) as children,"
        " count(*) as runs from pgflow.runs"
    ) == {"children": 0, "runs": 2}
    [retried] = engine.call("retry_run", failed)
    assert (retried["status"], retried["retry_count"]) == ("started", 1)
    [cancelled] = engine.call("cancel_run", running, "upgraded")
    assert cancelled["status"] == "cancelled"
    [fetch] = engine.poll("sync", "sync__fetch", step="fetch")
    assert fetch.run_id == failed
    engine.complete(fetch, {"rows": 2}, fenced=True)
    [store] = engine.poll("sync", "sync__store", step="store")
    engine.complete(store, "stored", fenced=True)
    assert engine.run(failed)["status"] == "completed"


def test_the_upgraded_engine_runs_a_subflow(version_27: Engine) -> None:
    engine = version_27
    engine.flow("sync", {"slug": "fetch"}, {"slug": "store", "deps_slugs": ["fetch"]})

    upgrade(engine)

    engine.flow("nightly", {"slug": "each", "step_type": "map", "subflow_slug": "sync"})
    run_id = engine.start("nightly", [{"page": 1}, {"page": 2}])
    while tasks := engine.poll("sync"):
        for task in tasks:
            engine.complete(task, task.step_slug, fenced=True)
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == (
        "completed",
        {"each": [{"store": "store"}, {"store": "store"}]},
    )
