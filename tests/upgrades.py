"""What every upgrade test checks first: work started and claimed on the older engine, and runs
started after the upgrade, finish on the newer one (the fenced completions the workers send)."""

from __future__ import annotations

from collections.abc import Callable

from tests.engine import Engine


def claimed_work_finishes(engine: Engine, upgrade: Callable[[Engine], None]) -> None:
    engine.flow("sync", {"slug": "fetch"}, {"slug": "store", "deps_slugs": ["fetch"]})
    before = [engine.start("sync", {"page": n}) for n in range(3)]
    claimed = engine.poll("sync", qty=2)

    upgrade(engine)

    after = [engine.start("sync", {"page": n}) for n in range(3, 5)]
    for task in claimed:
        assert engine.complete(task, {"rows": 1}, fenced=True)["status"] == "completed"
    while tasks := engine.poll("sync"):
        for task in tasks:
            engine.complete(task, {"rows": 1}, fenced=True)
    assert {engine.run(r)["status"] for r in before + after} == {"completed"}
