"""Upgrading 0028 to 0029 (fork_run, and runs.forked_from_run_id and forked_from_step): work
claimed on 0028 finishes, and a run that finished on 0028 is forked on 0029."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to


@pytest.fixture
def version_28(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0028") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0029")


def test_work_claimed_on_0028_finishes(version_28: Engine) -> None:
    claimed_work_finishes(version_28, upgrade)


def test_a_run_finished_on_0028_is_forked_on_0029(version_28: Engine) -> None:
    engine = version_28
    engine.flow("sync", {"slug": "fetch"}, {"slug": "store", "deps_slugs": ["fetch"]})
    old = engine.start("sync", {"page": 1})
    while tasks := engine.poll("sync"):
        for task in tasks:
            engine.complete(task, f"{task.step_slug} on 0028", fenced=True)

    upgrade(engine)

    [fork] = engine.call("fork_run", old, "store")
    assert (fork["forked_from_run_id"], fork["forked_from_step"]) == (old, "store")
    assert engine.run(old)["forked_from_run_id"] is None
    [store] = engine.poll("sync")
    assert store.input == {"fetch": "fetch on 0028"}
    engine.complete(store, "store on 0029", fenced=True)
    assert engine.run(fork["run_id"])["output"] == {"store": "store on 0029"}
