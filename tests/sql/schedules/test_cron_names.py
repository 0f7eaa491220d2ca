"""The engine reads a schedule's cron expression as the scheduler's croniter does (engine 0021):
for random expressions of the standard syntax, in time zones with and without daylight saving,
`pgflow._cron_names` says yes to every slot croniter yields, forwards and backwards across the
clock changes, and no to every other second but some in the hour after the clock skipped local
time (where croniter moves some of the skipped slots); syntax it does not read answers null."""

from __future__ import annotations

import datetime
import random
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from tests.engine import Engine

UTC = datetime.UTC
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
#: Instants near clock changes (and not): where croniter's slots are the least regular.
AROUND = [
    datetime.datetime(2026, 3, 29, 0, 30, tzinfo=UTC),  # Berlin springs forward at 01:00 UTC
    datetime.datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # and falls back at 01:00 UTC
    datetime.datetime(2026, 3, 8, 6, 30, tzinfo=UTC),  # New York at 07:00 UTC
    datetime.datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # and 06:00 UTC
    datetime.datetime(2026, 4, 4, 14, 30, tzinfo=UTC),  # Lord Howe: half an hour, 15:00 UTC
    datetime.datetime(2026, 10, 3, 15, 30, tzinfo=UTC),  # and back at 15:30 UTC
    datetime.datetime(2028, 2, 28, 22, 0, tzinfo=UTC),  # a leap day
]
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def field(rng: random.Random, low: int, high: int, names: list[str] | None = None) -> str:
    """A random field of the syntax the engine reads."""

    def value(v: int) -> str:
        return names[v - low] if names and rng.random() < 0.3 else str(v)

    items = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        kind = rng.choice(["star", "step", "one", "one", "range", "range_step", "from_step"])
        a, b = sorted(rng.sample(range(low, high + 1), 2))
        step = rng.randint(2, max(2, (high - low) // 2))
        items.append(
            {
                "star": "*",
                "step": f"*/{step}",
                "one": value(a),
                "range": f"{value(a)}-{value(b)}",
                "range_step": f"{value(a)}-{value(b)}/{step}",
                "from_step": f"{a}/{step}",
            }[kind]
        )
    if "*" in items and len(items) > 1:
        items = ["*"]
    return ",".join(items)


def expression(rng: random.Random) -> str:
    fields = [
        field(rng, 0, 59) if rng.random() < 0.7 else "0",
        field(rng, 0, 23) if rng.random() < 0.6 else "*",
        field(rng, 1, 31) if rng.random() < 0.4 else "*",
        field(rng, 1, 12, MONTHS) if rng.random() < 0.2 else "*",
        field(rng, 0, 6, DAYS) if rng.random() < 0.4 else "*",
    ]
    if rng.random() < 0.15:
        fields.append(field(rng, 0, 59))
    return " ".join(fields)


def croniter_yields(cron: str, zone: str, instant: datetime.datetime) -> bool:
    """Whether croniter yields `instant` as a slot of `cron`: going forwards or backwards (in the
    hour a clock change repeats, it yields the first one's slots from either)"""
    tick = datetime.timedelta(microseconds=1)
    before = (instant - tick).astimezone(ZoneInfo(zone))
    after = (instant + tick).astimezone(ZoneInfo(zone))
    yielded = [
        croniter(cron, before).get_next(datetime.datetime),
        croniter(cron, after).get_prev(datetime.datetime),
    ]
    # In UTC: Python never finds an ambiguous local time equal to a time of another zone.
    return instant in [slot.astimezone(UTC) for slot in yielded]


def after_a_gap(zone: str, instant: datetime.datetime) -> bool:
    """Whether `instant` is within the hour after the clock skipped some local time: there the
    engine names a slot when a skipped time up to that far before it is named, as croniter
    moves some of those forwards (`30 2 * * *` to 03:00 on the day Berlin skips 02:00-03:00),
    though not all (`45 * * * *` skips 02:45)."""
    hour = datetime.timedelta(hours=1)
    offset = instant.astimezone(ZoneInfo(zone)).utcoffset()
    earlier = (instant - hour).astimezone(ZoneInfo(zone)).utcoffset()
    return offset is not None and earlier is not None and offset > earlier


def named(engine: Engine, cases: list[tuple[str, str, datetime.datetime]]) -> list[bool | None]:
    rows = engine.conn.execute(
        "select pgflow._cron_names(c, z, s) from unnest(%s::text[], %s::text[], %s::timestamptz[])"
        " with ordinality as x(c, z, s, n) order by n",
        ([c for c, _, _ in cases], [z for _, z, _ in cases], [s for _, _, s in cases]),
    ).fetchall()
    return [row[0] for row in rows]


def test_the_engine_names_exactly_croniters_slots(engine: Engine) -> None:
    rng = random.Random(20261205)
    cases: list[tuple[str, str, datetime.datetime]] = []
    expected: list[bool] = []
    for _ in range(300):
        cron, zone = expression(rng), rng.choice(ZONES)
        around = rng.choice(AROUND) + datetime.timedelta(minutes=rng.randint(-90, 90))
        local = around.astimezone(ZoneInfo(zone))
        forwards, backwards = croniter(cron, local), croniter(cron, local)
        slots = {forwards.get_next(datetime.datetime).astimezone(UTC) for _ in range(8)}
        slots |= {backwards.get_prev(datetime.datetime).astimezone(UTC) for _ in range(8)}
        for slot in slots:
            cases.append((cron, zone, slot))
            expected.append(True)
        # Near misses: whole seconds around each slot and around the instant itself.
        unit = 1 if len(cron.split()) == 6 else 60
        for instant in [*slots, around]:
            for shift in (-2, -1, 1, 2):
                other = (instant + datetime.timedelta(seconds=shift * unit)).replace(microsecond=0)
                if unit == 60:
                    other = other.replace(second=0)
                cases.append((cron, zone, other))
                expected.append(croniter_yields(cron, zone, other))
    answers = named(engine, cases)
    wrong = [
        (case, answer)
        for case, answer, truth in zip(cases, answers, expected, strict=True)
        if answer is not truth and not (answer and after_a_gap(*case[1:]))
    ]
    assert wrong == [], f"{len(wrong)} of {len(cases)} answers differ from croniter: {wrong[:5]}"
    assert sum(expected) > 2000  # slots croniter yields
    assert len(expected) - sum(expected) > 2000  # and seconds it does not


@pytest.mark.parametrize(
    "cron", ["0 0 L * *", "0 0 15W * *", "0 0 * * 5#2", "H * * * *", "0 0 * * 5-7", "5 5-5 * * *"]
)
def test_syntax_the_engine_does_not_read_answers_null(engine: Engine, cron: str) -> None:
    slot = datetime.datetime(2026, 12, 4, 0, 0, tzinfo=UTC)
    assert named(engine, [(cron, "UTC", slot)]) == [None]
