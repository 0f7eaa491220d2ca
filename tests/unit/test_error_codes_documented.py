"""docs/errors.md lists every error code that validate, build and the CLI can emit."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pgflow_gen

PACKAGE = Path(pgflow_gen.__file__).parent
DOC = PACKAGE.parent / "docs" / "errors.md"


def emitted_codes() -> set[str]:
    """Codes in the source: `Problem("code", ...)` / `problem("code", ...)` calls and
    `code = "..."` class attributes of the typed errors."""
    codes: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                first = node.args[0]
                if name in ("Problem", "problem") and isinstance(first, ast.Constant):
                    codes.add(str(first.value))
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    target = None
                    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                        target, value = statement.targets[0], statement.value
                    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                        target, value = statement.target, statement.value
                    if (
                        isinstance(target, ast.Name)
                        and target.id == "code"
                        and isinstance(value, ast.Constant)
                    ):
                        codes.add(str(value.value))
    return codes


def documented_codes() -> set[str]:
    return set(re.findall(r"^### `([a-z0-9_]+)`$", DOC.read_text(encoding="utf-8"), re.MULTILINE))


def test_the_scan_finds_codes_of_each_kind() -> None:
    codes = emitted_codes()
    assert {"yaml_syntax", "unknown_dependency", "invalid_slug", "usage_error"} <= codes


def test_every_emitted_code_is_documented() -> None:
    assert sorted(emitted_codes() - documented_codes()) == []


def test_every_documented_code_exists() -> None:
    assert sorted(documented_codes() - emitted_codes()) == []
