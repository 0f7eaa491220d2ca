"""Tables for people: rows as aligned columns, each value as one short cell."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, TextIO


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Print rows as aligned columns under their headers.

    >>> import sys
    >>> table([("a", 1), ("bcd", 22)], ["name", "n"], sys.stdout)
    name  n
    ----  --
    a     1
    bcd   22
    """
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [list(headers), ["-" * w for w in widths], *cells]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def cell(value: Any) -> str:
    """A value as a person reads it in a table: `-` for none, local time, compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, datetime.datetime):
        return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
