"""What upgrade tests share: an engine migrated to a given version and upgraded by exactly the
next one, the events runs announced, and what every upgrade test checks first (work started and
claimed on the older engine, and runs started after the upgrade, finish on the newer one)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pgflow_gen.runtime import migrations
from tests.engine import Engine

#: A run's events as (event, step slug, status), in the order they were announced.
Events = dict[uuid.UUID, list[tuple[str, str | None, str]]]


@contextmanager
def engine_at(url: str, version: str) -> Iterator[Engine]:
    """The empty database at `url` migrated to engine `version`, no further."""
    with psycopg.connect(url, autocommit=True) as conn:
        applied = [m.version for m in migrations.migrate(conn, target=version)]
        assert applied[-1] == version
        yield Engine(conn)


def upgrade_to(engine: Engine, version: str) -> None:
    """Apply engine migration `version`, which must be the only one missing."""
    assert [m.version for m in migrations.migrate(engine.conn, target=version)] == [version]


def announced(listener: psycopg.Connection[Any], count: int) -> Events:
    """The next `count` events on the channels `listener` listens to, by run; then it stops
    listening. (Sent by committed transactions: the timeout only bounds a wait for events that
    never come.)"""
    events: Events = {}
    for note in listener.notifies(timeout=30, stop_after=count):
        event = json.loads(note.payload)
        events.setdefault(uuid.UUID(event["run_id"]), []).append(
            (event["event"], event["step_slug"], event["status"])
        )
    listener.execute("unlisten *")
    return events


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
