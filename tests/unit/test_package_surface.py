"""The public surface and the import arrows of STYLE.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pgflow_gen

PACKAGE = Path(pgflow_gen.__file__).parent

# module prefix -> prefixes of pgflow_gen modules it must not import
FORBIDDEN = {
    "pgflow_gen.naming": (
        "pgflow_gen.runtime",
        "pgflow_gen.spec",
        "pgflow_gen.codegen",
        "pgflow_gen.cli",
    ),
    "pgflow_gen.runtime": ("pgflow_gen.spec", "pgflow_gen.codegen", "pgflow_gen.cli", "jinja2"),
    "pgflow_gen.spec": ("pgflow_gen.codegen", "pgflow_gen.runtime", "pgflow_gen.cli"),
    "pgflow_gen.codegen": ("pgflow_gen.runtime", "pgflow_gen.cli"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (the order ruff's RUF022 keeps)."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_and_complete() -> None:
    assert pgflow_gen.__all__ == sorted(pgflow_gen.__all__, key=isort_key)
    for name in pgflow_gen.__all__:
        assert hasattr(pgflow_gen, name), name


def test_imports_point_down() -> None:
    violations = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        for owner, forbidden in FORBIDDEN.items():
            if name == owner or name.startswith(owner + "."):
                for imported in imports_of(path):
                    if imported.startswith(forbidden):
                        violations.append(f"{name} imports {imported}")
    assert violations == []
