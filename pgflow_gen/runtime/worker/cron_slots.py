"""When a flow's schedule is due: the cron arithmetic of the scheduler (engine 0017).

The engine keeps each schedule (`pgflow.schedules`: cron, time zone, catch-up policy, the last
slot started or passed over) and promises one run per slot (`pgflow.start_scheduled_runs`); this
module decides which slots to start now, with croniter in the schedule's time zone:

- a slot is *on time* while it is at most GRACE_S old; an older one was *missed* (nothing ran
  the scheduler then);
- `catch_up: none` starts the on-time slots and passes over the missed ones;
- `latest` starts the latest due slot, on time or not, and passes over the others;
- `all` starts every due slot, oldest first, at most MAX_CATCH_UP of them (the latest ones);
  older ones are passed over and counted.

>>> import datetime as dt
>>> utc = dt.UTC
>>> every_5 = Schedule("f", "s", "*/5 * * * *", "UTC", "all",
...                    last_slot_at=dt.datetime(2026, 1, 1, 12, 0, tzinfo=utc))
>>> plan = due(every_5, dt.datetime(2026, 1, 1, 12, 16, tzinfo=utc))
>>> [s.strftime("%H:%M") for s in plan.slots], plan.passed_through.strftime("%H:%M")
(['12:05', '12:10', '12:15'], '12:15')
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from croniter import croniter

#: A slot older than this when the scheduler sees it was missed (catch_up decides).
GRACE_S = 60
#: The most slots `catch_up: all` starts at once (the latest ones).
MAX_CATCH_UP = 100
_TICK = datetime.timedelta(microseconds=1)


@dataclass(frozen=True)
class Schedule:
    """A schedule as the engine keeps it."""

    flow_slug: str
    name: str
    cron: str
    timezone: str
    catch_up: str
    last_slot_at: datetime.datetime | None = None
    created_at: datetime.datetime | None = None
    paused: bool = False


@dataclass(frozen=True)
class Plan:
    """What to do now: the slots to start, oldest first, and the latest slot handled (started
    or passed over; None: nothing is due), with how many missed slots were passed over."""

    slots: list[datetime.datetime] = field(default_factory=list)
    passed_through: datetime.datetime | None = None
    passed_over: int = 0
    #: More slots were missed than were looked at (MAX_CATCH_UP): `passed_over` is a floor.
    more_passed_over: bool = False


def due(schedule: Schedule, now: datetime.datetime) -> Plan:
    """The slots of `schedule` to start at `now` (an aware datetime)."""
    zone = ZoneInfo(schedule.timezone)
    since = schedule.last_slot_at or schedule.created_at or now
    backwards = croniter(schedule.cron, (now + _TICK).astimezone(zone))
    latest: datetime.datetime = backwards.get_prev(datetime.datetime)
    if latest <= since:
        return Plan()
    wanted: list[datetime.datetime] = [latest]
    limit = 1 if schedule.catch_up == "latest" else MAX_CATCH_UP
    older: datetime.datetime = backwards.get_prev(datetime.datetime)
    while older > since and len(wanted) < limit:
        wanted.append(older)
        older = backwards.get_prev(datetime.datetime)
    more = older > since  # slots beyond those looked at: at least one more
    if schedule.catch_up == "none":
        on_time = now - datetime.timedelta(seconds=GRACE_S)
        started = [slot for slot in wanted if slot >= on_time]
        passed = len(wanted) - len(started) + (1 if more else 0)
        return Plan(sorted(started), latest, passed, more)
    return Plan(sorted(wanted), latest, 1 if more else 0, more)


def next_slot(schedule: Schedule, now: datetime.datetime) -> datetime.datetime:
    """The schedule's first slot after `now`."""
    zone = ZoneInfo(schedule.timezone)
    found: datetime.datetime = croniter(schedule.cron, now.astimezone(zone)).get_next(
        datetime.datetime
    )
    return found
