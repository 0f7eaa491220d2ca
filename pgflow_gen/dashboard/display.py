"""How the pages write times, durations and counts (the templates' filters).

>>> import datetime as dt
>>> moment = dt.datetime(2026, 12, 3, 8, 15, 2, 123000, tzinfo=dt.timezone.utc)
>>> when(moment)
'2026-12-03 08:15:02 UTC'
>>> duration(moment, moment + dt.timedelta(milliseconds=1530))
'1.5 s'
>>> seconds(4000)
'1 h 6 min'
>>> count(1234567)
'1,234,567'
"""

from __future__ import annotations

import datetime

_UTC = datetime.UTC


def when(moment: datetime.datetime | None) -> str:
    """A moment in UTC to the second, or a dash."""
    if moment is None:
        return "—"
    return moment.astimezone(_UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(start: datetime.datetime | None, end: datetime.datetime | None) -> str:
    """The time from start to end, in the unit that reads best, or a dash."""
    if start is None or end is None:
        return "—"
    return seconds((end - start).total_seconds())


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 10:
        return f"{value:.1f} s"
    if value < 60:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{value // 60:.0f} min {value % 60:.0f} s"
    if value < 86400:
        return f"{value // 3600:.0f} h {value % 3600 // 60:.0f} min"
    return f"{value // 86400:.0f} d {value % 86400 // 3600:.0f} h"


def ago(moment: datetime.datetime | None, now: datetime.datetime | None = None) -> str:
    """How long ago, or a dash."""
    if moment is None:
        return "—"
    now = now or datetime.datetime.now(_UTC)
    return f"{seconds(max((now - moment).total_seconds(), 0))} ago"


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"
