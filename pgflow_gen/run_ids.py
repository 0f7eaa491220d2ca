"""Run ids as people type them: the whole id, or its first characters (8 or more hex digits,
dashes anywhere), as the dashboard's search box and the CLI's run commands take them. A leaf
module: the CLI and the dashboard both read prefixes through it.

>>> id_range("0b6f-1")
(UUID('0b6f1000-0000-0000-0000-000000000000'), UUID('0b6f1fff-ffff-ffff-ffff-ffffffffffff'))
>>> parse("0B6F1A2C"), parse("0b6f1a2c-0000-4000-8000-000000000001")
('0b6f1a2c', UUID('0b6f1a2c-0000-4000-8000-000000000001'))
>>> short(uuid.UUID("0b6f1a2c-0000-4000-8000-000000000001"))
'0b6f1a2c'
"""

from __future__ import annotations

import re
import uuid

#: The fewest characters of an id a command takes for the whole id.
MIN_PREFIX = 8
_HEX = re.compile(r"[0-9a-f]+")


def id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The first and the last run id that start with `prefix` (hex digits, dashes ignored)."""
    digits = prefix.replace("-", "").lower()[:32]
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def short(run_id: uuid.UUID) -> str:
    """The run id as short as the commands take it (its first MIN_PREFIX hex digits)."""
    return run_id.hex[:MIN_PREFIX]


def parse(text: str) -> uuid.UUID | str:
    """A whole run id, or the prefix (hex digits, lower case) of one; ValueError otherwise."""
    digits = text.strip().replace("-", "").lower()
    if len(digits) == 32 and _HEX.fullmatch(digits):
        return uuid.UUID(digits)
    if MIN_PREFIX <= len(digits) < 32 and _HEX.fullmatch(digits):
        return digits
    raise ValueError(
        f"invalid run id {text!r}: give the whole id, or its first {MIN_PREFIX} characters or more"
    )
