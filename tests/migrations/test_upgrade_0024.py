"""Upgrading 0023 to 0024 (the signal sweep reads the runs under way; the recompile summary
counts its noun): work claimed on 0023 finishes, and a signal wait begun on 0023 runs out after
the upgrade as it would have before, while a wait of a finished run stays as it is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_23(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0023") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0024")


def test_work_claimed_on_0023_finishes(version_23: Engine) -> None:
    claimed_work_finishes(version_23, upgrade)


def test_a_wait_begun_on_0023_runs_out_after_the_upgrade(version_23: Engine) -> None:
    engine = version_23
    engine.compile(
        "review",
        [{"slug": "approval", "stepType": "signal", "options": {"timeout": 60}},
         {"slug": "publish", "deps": ["approval"]}],
        mode="flow",
    )  # fmt: skip
    waiting, cancelled = engine.start("review"), engine.start("review")
    engine.call("cancel_run", cancelled)
    engine.conn.execute("update pgflow.step_states set started_at = now() - interval '61 s'")

    upgrade(engine)
    engine.value("select pgflow.requeue_stalled_tasks()")

    assert engine.state(waiting, "approval")["status"] == "failed"
    assert engine.run(waiting)["status"] == "failed"
    assert engine.run(cancelled)["status"] == "cancelled"
    assert engine.state(cancelled, "approval")["error_message"] is None
