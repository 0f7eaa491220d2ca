"""Values and text as Python source: literals, condition patterns and docstrings that are valid
and already `ruff format` clean whatever the spec's strings hold."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from pgflow_gen.codegen import layout

_QUOTE_RUN = re.compile(r'"(?=")')


def string(text: str) -> str:
    """A Python string literal in the quotes `ruff format` picks: double, unless the text holds
    more double quotes than single ones (`'say "hi"'`)."""
    double = json.dumps(text)  # escapes backslashes, quotes, control and non-ASCII characters
    if text.count('"') <= text.count("'"):
        return double
    return "'" + double[1:-1].replace('\\"', '"').replace("'", "\\'") + "'"


def literal(value: Any) -> str:
    """A `Literal[...]` member: a string, an integer, a boolean or None.

    >>> literal("a"), literal(3), literal(True), literal(None)
    ('"a"', '3', 'True', 'None')
    """
    if isinstance(value, str):
        return string(value)
    if value is None or isinstance(value, bool | int):
        return repr(value)
    raise ValueError(f"Literal values must be strings, integers, booleans or null, got {value!r}")


def value(data: Any) -> layout.Expr:
    """A JSON value as a Python expression (true/false/null spelled the Python way).

    >>> layout.flat(value({"a": [True, None, 1.5, "x"]}))
    '{"a": [True, None, 1.5, "x"]}'
    """
    if isinstance(data, dict):
        entries = tuple(layout.Pair(string(k), ": ", value(v)) for k, v in data.items())
        return layout.Group("", "{", "}", entries)
    if isinstance(data, list):
        return layout.Group("", "[", "]", tuple(value(v) for v in data))
    if isinstance(data, str):
        return layout.Atom(string(data))
    if data is None or isinstance(data, bool):
        return layout.Atom(repr(data))
    # ruff writes exponents without "+" (1e16, not 1e+16).
    return layout.Atom(json.dumps(data, allow_nan=False).replace("e+", "e"))


def docstring(text: str | None, *, indent: int, lead: str | None = None) -> str | None:
    """A complete docstring (quotes included) for `text`, its later lines indented by `indent`
    spaces; None when there is nothing to say.

    `lead` is trusted text (no quotes) that opens the docstring as its own paragraph. In `text`,
    runs of whitespace and control characters become single spaces, paragraphs (separated by a
    blank line) are kept and wrapped to the line length, backslashes and the quotes that could
    meet others are escaped, and so are non-ASCII characters: no spec text can end the string
    early or leave work for the formatter or the linter.
    """
    width = layout.LINE_LENGTH - indent - 6  # room for the quotes on both sides of a one-liner
    paragraphs = [] if lead is None else [lead]
    # A backslash starts an escape, and three quotes in a row end the string.
    escaped = (
        _ascii(_QUOTE_RUN.sub('\\\\"', p.replace("\\", "\\\\"))) for p in _paragraphs(text or "")
    )
    paragraphs += [p for p in escaped if p]
    lines: list[str] = []
    for paragraph in paragraphs:
        if lines:
            lines.append("")
        lines += _wrap(paragraph, width)
    if lines and _ends_with_bare_quote(lines[-1]):
        lines[-1] = lines[-1][:-1] + '\\"'  # a last quote would meet the closing quotes
    if lines and lead is None and lines[0].startswith('"'):
        lines[0] = "\\" + lines[0]  # and a first one the opening quotes
    if len(lines) <= 1:
        return f'"""{lines[0]}"""' if lines else None
    pad = " " * indent
    body = "\n".join(f"{pad}{line}" if line else "" for line in lines[1:])
    return f'"""{lines[0]}\n{body}\n{pad}"""'


def _ascii(text: str) -> str:
    """Non-ASCII characters as escapes: ruff flags the ones that look like ASCII (RUF002), and
    string literals of generated code are ASCII too."""
    return "".join(
        c if c.isascii() else (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        for c in text
    )


def _ends_with_bare_quote(line: str) -> bool:
    """Whether `line` ends with a quote that no backslash escapes (an even number precede it)."""
    if not line.endswith('"'):
        return False
    backslashes = len(line[:-1]) - len(line[:-1].rstrip("\\"))
    return backslashes % 2 == 0


def _paragraphs(text: str) -> list[str]:
    printable = "".join(c if c.isprintable() or c == "\n" else " " for c in text)
    blocks = [""]
    for line in printable.split("\n"):
        if line.strip():
            blocks[-1] = f"{blocks[-1]} {line.strip()}".strip()
        elif blocks[-1]:
            blocks.append("")
    return [" ".join(block.split()) for block in blocks]


def _wrap(paragraph: str, width: int) -> list[str]:
    """Greedy word wrap by display width (wide characters count twice, as ruff counts them); a
    word longer than the width stands on a line of its own."""
    lines: list[str] = []
    for word in paragraph.split(" "):
        if lines and _width(lines[-1]) + 1 + _width(word) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)
