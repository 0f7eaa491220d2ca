"""Schedules (engine 0017): a flow's shape stores its schedules (added, changed, removed, each
checked); start_scheduled_runs starts one run per slot whoever calls and however often (the
slot's idempotency key, the schedule's last slot), passes over what it is told to, and starts
nothing while the schedule is paused; resuming passes over the pause."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import psycopg
import pytest

from tests.engine import Engine

UTC = datetime.UTC
#: A past slot: the engine starts no slot later than now (engine 0020).
SLOT = datetime.datetime(2025, 12, 3, 2, 0, tzinfo=UTC)


def nightly(**extra: Any) -> dict[str, Any]:
    return {"name": "nightly", "cron": "0 2 * * *", "timezone": "UTC", "input": {"n": 1},
            "catchUp": "none", **extra}  # fmt: skip


def compile_with(engine: Engine, *schedules: dict[str, Any]) -> dict[str, Any]:
    return engine.compile(
        "reports", [{"slug": "build"}], options={"maxAttempts": 3}, **_schedules(schedules)
    )


def _schedules(schedules: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return {"schedules": list(schedules)} if schedules else {}


def stored(engine: Engine) -> dict[str, dict[str, Any]]:
    return {
        r["schedule_name"]: r
        for r in engine.all("select * from pgflow.schedules where flow_slug = 'reports'")
    }


def start(engine: Engine, slots: list[datetime.datetime], passed: Any = None) -> list[Any]:
    return engine.all(
        "select * from pgflow.start_scheduled_runs('reports', 'nightly', %s, %s)", slots, passed
    )


def test_the_shape_adds_changes_and_removes_schedules(engine: Engine) -> None:
    compile_with(engine, nightly(), nightly(name="hourly", cron="0 * * * *"))
    assert set(stored(engine)) == {"nightly", "hourly"}
    engine.conn.execute("update pgflow.schedules set last_slot_at = %s", (SLOT,))

    compile_with(engine, nightly(input={"n": 2}, timezone="Europe/Paris"))

    [row] = stored(engine).values()
    assert (row["input"], row["timezone"], row["last_slot_at"]) == ({"n": 2}, "Europe/Paris", SLOT)
    compile_with(engine)
    assert stored(engine) == {}


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"cron": "0 2 * * *"}, 'a schedule needs a "name" and a "cron" string'),
        (nightly(timezone="Mars/Olympus"), 'unknown time zone "Mars/Olympus"'),
        (nightly(catchUp="some"), 'has catchUp "some"'),
        (nightly(priority=1001), "has priority 1001; it takes a whole number from 0 to 1000"),
        (nightly(priority=-1), "has priority -1"),
        (nightly(priority=2.5), "has priority 2.5"),
        (nightly(priority="5"), 'has priority "5"'),
    ],
)
def test_a_wrong_schedule_refuses_the_shape(
    engine: Engine, schedule: dict[str, Any], message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        compile_with(engine, schedule)
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_each_slot_starts_one_run_however_often_it_is_asked(engine: Engine) -> None:
    compile_with(engine, nightly())
    [first] = start(engine, [SLOT])
    assert first["created"] is True
    assert start(engine, [SLOT]) == []  # at or before the last slot: passed over
    run = engine.run(first["run_id"])
    assert (run["input"], run["idempotency_key"]) == (
        {"n": 1},
        "schedule:nightly:2025-12-03T02:00:00Z",
    )
    # Even with its last slot moved back (a restart from an old row), the key keeps it once.
    engine.conn.execute("update pgflow.schedules set last_slot_at = null")
    [again] = start(engine, [SLOT])
    assert (again["run_id"], again["created"]) == (first["run_id"], False)
    assert engine.value("select count(*) from pgflow.runs") == 1
    assert stored(engine)["nightly"]["last_run_id"] == first["run_id"]


def test_slots_passed_over_start_nothing_and_move_the_last_slot(engine: Engine) -> None:
    compile_with(engine, nightly())
    later = SLOT + datetime.timedelta(days=2)
    assert start(engine, [], later) == []
    assert stored(engine)["nightly"]["last_slot_at"] == later
    assert start(engine, [SLOT]) == []
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_five_callers_racing_for_the_same_slots_start_each_once(
    engine: Engine, db_url: str
) -> None:
    compile_with(engine, nightly())
    slots = [SLOT + datetime.timedelta(days=d) for d in range(3)]
    barrier = threading.Barrier(5)
    errors: list[BaseException] = []

    def race() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                barrier.wait()
                conn.execute(
                    "select * from pgflow.start_scheduled_runs('reports', 'nightly', %s)", (slots,)
                )
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=race) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    keys = [r["idempotency_key"] for r in engine.all("select idempotency_key from pgflow.runs")]
    assert sorted(keys) == [f"schedule:nightly:2025-12-0{d}T02:00:00Z" for d in (3, 4, 5)]


def test_a_paused_schedule_starts_nothing_and_resuming_passes_over_the_pause(
    engine: Engine,
) -> None:
    compile_with(engine, nightly())
    paused = engine.one("select * from pgflow.pause_schedule('reports', 'nightly')")
    assert paused["paused_at"] is not None
    assert start(engine, [SLOT]) == []
    assert engine.value("select count(*) from pgflow.runs") == 0
    compile_with(engine, nightly(input={"n": 5}))  # a new deploy keeps the pause
    assert stored(engine)["nightly"]["paused_at"] == paused["paused_at"]
    resumed = engine.one("select * from pgflow.resume_schedule('reports', 'nightly')")
    assert resumed["paused_at"] is None
    assert resumed["last_slot_at"] >= datetime.datetime.now(UTC) - datetime.timedelta(minutes=1)
    assert start(engine, [SLOT]) == []  # a slot of the pause


def test_unknown_schedules_are_typed_errors(engine: Engine) -> None:
    compile_with(engine, nightly())
    for call in ("pause_schedule", "resume_schedule"):
        with pytest.raises(psycopg.errors.NoDataFound, match='has no schedule "weekly"'):
            engine.conn.execute(f"select pgflow.{call}('reports', 'weekly')")
    with pytest.raises(psycopg.errors.NoDataFound):
        engine.conn.execute("select pgflow.start_scheduled_runs('reports', 'weekly', '{}')")


def test_deleting_the_flow_deletes_its_schedules(engine: Engine) -> None:
    compile_with(engine, nightly())
    engine.call("delete_flow_and_data", "reports")
    assert engine.value("select count(*) from pgflow.schedules") == 0


def test_a_schedules_runs_have_its_priority_and_a_change_of_it_is_stored(engine: Engine) -> None:
    compile_with(engine, nightly(priority=7))
    assert stored(engine)["nightly"]["priority"] == 7
    [first] = start(engine, [SLOT])
    assert engine.run(first["run_id"])["priority"] == 7

    compile_with(engine, nightly())  # no priority: 0
    assert stored(engine)["nightly"]["priority"] == 0
    [second] = start(engine, [SLOT + datetime.timedelta(days=1)])
    assert engine.run(second["run_id"])["priority"] == 0
