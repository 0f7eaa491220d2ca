"""Schedules: which slots are due under each catch-up policy, with a controlled clock; and the
scheduler against the real engine: five schedulers ticking at once start each slot once, a
scheduler that starts again inside a slot starts nothing more, and catch-up after downtime."""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

import psycopg
import pytest

from pgflow_gen.runtime.worker import cron_slots
from pgflow_gen.runtime.worker.cron_slots import MAX_CATCH_UP, Schedule, due
from pgflow_gen.runtime.worker.scheduler import MAX_SLEEP_S, Scheduler
from tests.engine import Engine


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    return Engine(conn)


UTC = datetime.UTC


def at(hour: int, minute: int, second: int = 0, day: int = 3) -> datetime.datetime:
    return datetime.datetime(2026, 12, day, hour, minute, second, tzinfo=UTC)


NOON = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def every_5(catch_up: str, last: datetime.datetime | None = NOON, **extra: Any) -> Schedule:
    return Schedule("reports", "often", "*/5 * * * *", "UTC", catch_up, last_slot_at=last, **extra)


def hhmm(slots: list[datetime.datetime]) -> list[str]:
    return [slot.strftime("%H:%M") for slot in slots]


# -- which slots are due ---------------------------------------------------------------------


def test_all_starts_every_slot_since_the_last_one_oldest_first() -> None:
    plan = due(every_5("all"), at(12, 16))
    assert (hhmm(plan.slots), plan.passed_through, plan.passed_over) == (
        ["12:05", "12:10", "12:15"], at(12, 15), 0,
    )  # fmt: skip


def test_none_starts_only_the_slots_on_time_and_passes_over_the_missed() -> None:
    on_time = due(every_5("none"), at(12, 15, 30))  # 12:15 is 30 s old: on time
    assert (hhmm(on_time.slots), on_time.passed_through, on_time.passed_over) == (
        ["12:15"], at(12, 15), 2,
    )  # fmt: skip
    late = due(every_5("none"), at(12, 16, 30))  # 90 s old: missed
    assert (late.slots, late.passed_through, late.passed_over) == ([], at(12, 15), 3)


def test_latest_starts_the_latest_slot_only() -> None:
    plan = due(every_5("latest"), at(13, 1))
    assert (hhmm(plan.slots), plan.passed_through) == (["13:00"], at(13, 0))


def test_all_is_bounded_to_the_latest_slots() -> None:
    every_minute = Schedule("reports", "often", "* * * * *", "UTC", "all", last_slot_at=at(9, 0))
    plan = due(every_minute, at(12, 0, 30))
    assert len(plan.slots) == MAX_CATCH_UP
    assert (plan.slots[0], plan.slots[-1]) == (at(10, 21), at(12, 0))
    assert (plan.passed_over, plan.more_passed_over) == (1, True)


def test_nothing_is_due_before_the_next_slot_and_a_new_schedule_counts_from_its_creation() -> None:
    assert due(every_5("all"), at(12, 4, 59)) == cron_slots.Plan()
    new = every_5("all", last=None, created_at=at(12, 3))
    assert hhmm(due(new, at(12, 16)).slots) == ["12:05", "12:10", "12:15"]


def test_the_cron_is_read_in_the_schedules_time_zone() -> None:
    paris = Schedule("reports", "nightly", "0 2 * * *", "Europe/Paris", "latest",
                     last_slot_at=at(0, 0, day=2))  # fmt: skip
    plan = due(paris, at(1, 30))  # 02:30 in Paris: the 02:00 slot is 01:00 UTC
    assert [slot.astimezone(UTC) for slot in plan.slots] == [at(1, 0)]
    assert cron_slots.next_slot(paris, at(1, 30)).astimezone(UTC) == at(1, 0, day=4)


# -- the scheduler against the engine ----------------------------------------------------------


def define(engine: Engine, catch_up: str = "all", last: datetime.datetime | None = None) -> None:
    engine.compile(
        "reports",
        [{"slug": "build"}],
        options={"maxAttempts": 3},
        schedules=[{"name": "often", "cron": "*/5 * * * *", "timezone": "UTC",
                    "input": {"n": 1}, "catchUp": catch_up}],
    )  # fmt: skip
    engine.conn.execute("update pgflow.schedules set last_slot_at = %s", (last or at(12, 0),))


def keys(engine: Engine) -> list[str]:
    return sorted(
        r["idempotency_key"] for r in engine.all("select idempotency_key from pgflow.runs")
    )


async def tick_all(db_url: str, now: datetime.datetime, count: int) -> None:
    conns = [await psycopg.AsyncConnection.connect(db_url, autocommit=True) for _ in range(count)]
    try:
        log = logging.getLogger("tests.schedules")
        await asyncio.gather(*(Scheduler(log, clock=lambda: now).tick(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()


def test_five_schedulers_ticking_at_once_start_each_slot_once(engine: Engine, db_url: str) -> None:
    define(engine)
    asyncio.run(tick_all(db_url, at(12, 16), 5))
    assert keys(engine) == [f"schedule:often:2026-12-03T12:{m}:00Z" for m in ("05", "10", "15")]
    asyncio.run(tick_all(db_url, at(12, 21), 5))
    assert len(keys(engine)) == 4


def test_a_scheduler_started_again_inside_a_slot_starts_nothing_more(
    engine: Engine, db_url: str
) -> None:
    define(engine, "none", last=at(12, 0))
    asyncio.run(tick_all(db_url, at(12, 5, 10), 1))
    asyncio.run(tick_all(db_url, at(12, 5, 20), 1))  # a new process, same slot
    assert keys(engine) == ["schedule:often:2026-12-03T12:05:00Z"]


@pytest.mark.parametrize(("catch_up", "started"), [("none", 0), ("latest", 1), ("all", 6)])
def test_catch_up_after_downtime(engine: Engine, db_url: str, catch_up: str, started: int) -> None:
    define(engine, catch_up, last=at(12, 0))
    asyncio.run(tick_all(db_url, at(12, 33), 1))  # down from 12:00 to 12:33
    assert len(keys(engine)) == started
    assert engine.value("select last_slot_at from pgflow.schedules") == at(12, 30)


def test_a_tick_says_when_the_next_slot_is(engine: Engine, db_url: str) -> None:
    define(engine, last=at(12, 0))

    async def tick() -> float:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            return await Scheduler(logging.getLogger("t"), clock=lambda: at(12, 3)).tick(conn)

    # The next slot (12:05) is 120 s away: the scheduler sleeps at most MAX_SLEEP_S, then reads
    # the schedules again (a new or resumed one).
    assert asyncio.run(tick()) == MAX_SLEEP_S
