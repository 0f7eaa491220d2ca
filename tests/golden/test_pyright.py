"""pyright --strict over generated code (many users type-check with pyright or VS Code's Pylance):
every golden tree, the examples with their handlers and tests, and the end-to-end and benchmark
projects. pyright comes from PyPI with its own Node.js (`pyright[nodejs]`); nothing downloads at
run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden.test_typing import CASES, EXAMPLES, NEGATIVE, ROOT, SEVERAL, handler_stubs

PYRIGHT = Path(sys.executable).parent / "pyright"


def pyright(
    folder: Path,
    include: list[str],
    extra_paths: list[str] | None = None,
    *,
    type_ignores: bool = True,
) -> tuple[list[str], int]:
    """pyright's errors in `folder` (strict), as `file:line: message (rule)`, and the number of
    files it checked; `type_ignores=False` reports lines with a `# type: ignore` too."""
    config = {
        "typeCheckingMode": "strict",
        "pythonVersion": "3.11",
        "include": include,
        "extraPaths": extra_paths or [],
        "enableTypeIgnoreComments": type_ignores,
    }
    (folder / "pyrightconfig.json").write_text(json.dumps(config))
    try:
        result = subprocess.run(
            [str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable],
            cwd=folder,
            # No check for a newer pyright (a network call) on every run.
            env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        (folder / "pyrightconfig.json").unlink()
    report = json.loads(result.stdout)
    errors = [
        f"{Path(d['file']).relative_to(folder.resolve())}:{d['range']['start']['line'] + 1}:"
        f" {d['message']} ({d.get('rule', '')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    return errors, report["summary"]["filesAnalyzed"]


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_passes_pyright_strict(example: Path) -> None:
    include = ["app", *(["tests"] if (example / "tests").is_dir() else [])]
    errors, checked = pyright(example, include)
    assert errors == []
    assert checked >= len(list((example / "app" / "pgflow").rglob("*.py")))


@pytest.mark.slow
def test_golden_trees_pass_pyright_strict(tmp_path: Path) -> None:
    stubs = handler_stubs(tmp_path / "handlers")
    trees = sorted(
        str(p.relative_to(ROOT)) for p in CASES.glob("*/expected") if p.parent not in SEVERAL
    )
    errors, checked = pyright(ROOT, trees, extra_paths=[str(stubs)])
    assert errors == []
    assert checked == sum(len(list((ROOT / tree).rglob("*.py"))) for tree in trees)


@pytest.mark.slow
@pytest.mark.parametrize("case", SEVERAL, ids=[p.name for p in SEVERAL])
def test_golden_builds_of_several_flows_pass_pyright_strict(case: Path, tmp_path: Path) -> None:
    stubs = handler_stubs(tmp_path / "handlers")
    errors, checked = pyright(case, ["expected"], extra_paths=[str(stubs)])
    assert errors == []
    assert checked == len(list((case / "expected").rglob("*.py")))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["negative_signals.py", "negative_subflows.py", "negative_async_client.py"]
)
def test_pyright_finds_exactly_the_marked_mistakes_of_the_snippets(name: str) -> None:
    [(example, snippets)] = [(e, n) for e, n in NEGATIVE.items() if n.name == name]
    copy = example / "app" / snippets.name
    copy.write_text(snippets.read_text())
    try:
        errors, _ = pyright(example, [f"app/{snippets.name}"], type_ignores=False)
    finally:
        copy.unlink()
    marked = [
        number
        for number, line in enumerate(snippets.read_text().splitlines(), 1)
        if "# type: ignore[" in line
    ]
    assert sorted({int(error.split(":")[1]) for error in errors}) == marked, errors
