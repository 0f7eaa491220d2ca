"""docs/specs.md lists every name a generated flow module exports, and every listed name
occurs in the generated goldens."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "specs.md").read_text()
TABLE = DOC.split("Every name a flow module exports", 1)[1].split("\n\n", 2)[1]


def documented() -> list[re.Pattern[str]]:
    names = [
        name
        for row in TABLE.splitlines()[2:]
        for name in re.findall(r"`([A-Za-z_<>]+)`", row.split("|")[1])
    ]
    return [
        re.compile(
            "^"
            + name.replace("<Step>", "[A-Z][A-Za-z0-9]*").replace("<Path>", "[A-Z0-9][A-Za-z0-9]*")
            + "$"
        )
        for name in names
    ]


def exported() -> set[str]:
    found: set[str] = set()
    for module in (ROOT / "tests" / "golden" / "cases").glob("*/expected/*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                found |= set(ast.literal_eval(node.value))
    return found


def test_every_exported_name_is_documented() -> None:
    patterns = documented()
    undocumented = {n for n in exported() if not any(p.match(n) for p in patterns)}
    assert not undocumented


def test_every_documented_name_is_generated_somewhere() -> None:
    names = exported()
    assert len(documented()) == 21
    for pattern in documented():
        assert any(pattern.match(name) for name in names), pattern.pattern
