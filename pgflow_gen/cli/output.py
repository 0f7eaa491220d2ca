"""What commands print: tables for people (rows as aligned columns, each value one short cell),
and JSON for scripts (`--format json`: one document on stdout, times in ISO 8601 with their
offset, ids as strings; the schema of each command is in docs/cli.md)."""

from __future__ import annotations

import datetime
import json
import sys
import uuid
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


def first_line(text: str | None, limit: int | None = None) -> str | None:
    """The first line of a stored error (its `Type: message`), cut at `limit` characters."""
    if text is None:
        return None
    line = text.split("\n", 1)[0]
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


def print_json(document: Any, out: TextIO | None = None) -> None:
    """Print `document` as indented JSON."""
    print(json.dumps(document, indent=2, default=_json_value), file=out or sys.stdout)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
