"""Counts in words with their noun in agreement ("1 task", "2 tasks"). A leaf module: the CLI,
the worker's logs, the dashboard and the testing kit count through it, so no message says
"1 task(s)".

>>> counted(1, "key"), counted(1_200, "task"), counted(0, "run")
('1 key', '1,200 tasks', '0 runs')
>>> counted(2, "match", "matches")
'2 matches'
"""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` (with thousands separators) and `noun`, plural unless the count is one."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
