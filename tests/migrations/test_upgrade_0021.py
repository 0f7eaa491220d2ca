"""Upgrading 0020 to 0021 (schedules read their cron expression, leaner claims): work claimed on
0020 finishes, a schedule keeps its last slot and starts the slots its cron expression names,
and a caller's other slots, which 0020 started, start nothing."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest

from tests.engine import Engine
from tests.upgrades import claimed_work_finishes, engine_at, upgrade_to

UTC = datetime.UTC
NIGHTLY = {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "input": {},
           "catchUp": "all"}  # fmt: skip


@pytest.fixture
def version_20(empty_db_url: str) -> Iterator[Engine]:
    with engine_at(empty_db_url, "0020") as engine:
        yield engine


def upgrade(engine: Engine) -> None:
    upgrade_to(engine, "0021")


def start_slots(engine: Engine, slots: list[datetime.datetime]) -> list[datetime.datetime]:
    rows = engine.all(
        "select slot from pgflow.start_scheduled_runs('reports', 'nightly', %s)", slots
    )
    return [row["slot"] for row in rows]


def test_work_claimed_on_0020_finishes(version_20: Engine) -> None:
    engine = version_20
    claimed_work_finishes(engine, upgrade)


def test_a_schedule_starts_only_the_slots_its_cron_names_after_the_upgrade(
    version_20: Engine,
) -> None:
    engine = version_20
    engine.compile("reports", [{"slug": "build"}], options={}, schedules=[NIGHTLY])
    # 02:00 in Berlin is 01:00 UTC in winter; 0020 also took a whole minute the cron does not name.
    named = datetime.datetime(2025, 12, 1, 1, 0, tzinfo=UTC)
    assert start_slots(engine, [named, named + datetime.timedelta(hours=5)]) == [
        named,
        named + datetime.timedelta(hours=5),
    ]

    upgrade(engine)

    assert engine.value("select last_slot_at from pgflow.schedules") == named + datetime.timedelta(
        hours=5
    )
    next_days = [named + datetime.timedelta(days=d) for d in (1, 2)]
    others = [day + datetime.timedelta(minutes=m) for day in next_days for m in (-60, 1, 60)]
    assert start_slots(engine, others) == []
    assert start_slots(engine, next_days) == next_days
    assert engine.value("select count(*) from pgflow.runs") == 4
