"""The public surface and the import arrows of STYLE.md, direct and transitive."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
    "pgflow_gen.runtime": (
        "pgflow_gen.spec",
        "pgflow_gen.codegen",
        "pgflow_gen.cli",
        "jinja2",
        "pgflow_gen.dashboard",
        "starlette",
        "uvicorn",
    ),
    "pgflow_gen.dashboard": ("pgflow_gen.spec", "pgflow_gen.codegen", "pgflow_gen.cli"),
    # The engine's edge sits below everything that talks to the engine.
    "pgflow_gen.engine": (
        "pgflow_gen.runtime",
        "pgflow_gen.spec",
        "pgflow_gen.codegen",
        "pgflow_gen.cli",
        "pgflow_gen.dashboard",
        "pgflow_gen.testing",
    ),
    "pgflow_gen.spec": ("pgflow_gen.codegen", "pgflow_gen.runtime", "pgflow_gen.cli"),
    "pgflow_gen.codegen": ("pgflow_gen.runtime", "pgflow_gen.cli", "psycopg"),
    "pgflow_gen.errors": ("pgflow_gen.runtime", "pgflow_gen.spec", "pgflow_gen.codegen", "psycopg"),
}
# `import pgflow_gen` stays light: no runtime, no database driver, no template engine.
FORBIDDEN_FOR_PACKAGE_ROOT = ("pgflow_gen.runtime", "pgflow_gen.spec", "pgflow_gen.codegen",
                              "psycopg", "jinja2")  # fmt: skip
ROOT = PACKAGE.parent
GENERATED_TREES = [
    *sorted((ROOT / "tests" / "golden" / "cases").glob("*/expected")),
    *sorted((ROOT / "examples").glob("*/app/pgflow")),
    ROOT / "tests" / "e2e" / "project" / "app" / "pgflow",
    ROOT / "benchmarks" / "project" / "app" / "pgflow",
]


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


def import_graph() -> dict[str, set[str]]:
    """Each package module -> what it imports: package modules (a package also imports its
    `__init__`, as Python runs it first) and other top-level names."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in imports_of(path):
            if imported.startswith("pgflow_gen"):
                # `from pgflow_gen.codegen import names` names a module or an attribute.
                parts = imported.split(".")
                while parts and ".".join(parts) not in modules:
                    parts.pop()
                for end in range(1, len(parts) + 1):
                    edges.add(".".join(parts[:end]))
            else:
                edges.add(imported.split(".")[0])
        parents = name.split(".")[:-1]
        edges.update(".".join(parents[:end]) for end in range(1, len(parents) + 1))
        edges.discard(name)
        graph[name] = edges
    return graph


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    pending = [start]
    while pending:
        for imported in graph.get(pending.pop(), set()):
            if imported not in seen:
                seen.add(imported)
                pending.append(imported)
    return seen


def test_imports_point_down_transitively() -> None:
    graph = import_graph()
    violations = []
    for name in sorted(graph):
        reached = closure(graph, name)
        for owner, forbidden in FORBIDDEN.items():
            if name == owner or name.startswith(owner + "."):
                violations += [
                    f"{name} reaches {m}" for m in sorted(reached) if m.startswith(forbidden)
                ]
    assert violations == []


def test_the_graph_sees_transitive_imports() -> None:
    # The dev loop builds code (jinja2) and starts the embedded server, two modules away each.
    reached = closure(import_graph(), "pgflow_gen.cli.devloop")
    assert {"pgflow_gen.runtime.embedded", "psycopg", "jinja2", "pgflow_gen.naming"} <= reached


@pytest.mark.parametrize(
    "module", ["pgflow_gen", "pgflow_gen.codegen.build", "pgflow_gen.spec.loader"]
)
def test_importing_the_generator_loads_no_database_driver(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = ('psycopg', 'pgflow_gen.runtime')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(heavy))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == []


def test_the_package_root_is_light() -> None:
    reached = closure(import_graph(), "pgflow_gen")
    assert sorted(m for m in reached if m.startswith(FORBIDDEN_FOR_PACKAGE_ROOT)) == []


@pytest.mark.parametrize("tree", GENERATED_TREES, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_files_import_only_the_runtime(tree: Path) -> None:
    files = sorted(tree.rglob("*.py"))
    assert files
    for path in files:
        ours = {m for m in imports_of(path) if m.startswith("pgflow_gen")}
        assert {m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in ours} <= {
            "pgflow_gen.runtime"
        }, path
