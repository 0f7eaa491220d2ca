"""mypy --strict over generated code: every golden flow module, the examples with their
handlers, and negative snippets that must fail (ignores marked with the expected error code)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "golden" / "cases"
# The examples, and the project the end-to-end tests run (its handlers are typed the same way).
EXAMPLES = [
    *sorted(p for p in (ROOT / "examples").iterdir() if (p / "app").is_dir()),
    ROOT / "tests" / "e2e" / "project",
    ROOT / "benchmarks" / "project",
]
NEGATIVE_EXAMPLE = ROOT / "examples" / "community_threads"


def mypy(*args: str, cwd: Path, mypypath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if mypypath is not None:
        env["MYPYPATH"] = str(mypypath)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="session")
def golden_flow_modules_result() -> subprocess.CompletedProcess[str]:
    modules = sorted(str(p.relative_to(ROOT)) for p in CASES.glob("*/expected/*.py"))
    assert modules, "no golden flow modules"
    return mypy(
        "--explicit-package-bases", "--namespace-packages", "--config-file", os.devnull, *modules,
        cwd=ROOT,
    )  # fmt: skip


@pytest.mark.slow
def test_golden_flow_modules_pass_mypy_strict(
    golden_flow_modules_result: subprocess.CompletedProcess[str],
) -> None:
    assert golden_flow_modules_result.returncode == 0, golden_flow_modules_result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_passes_mypy_strict(example: Path) -> None:
    extra = (
        [str(ROOT / "tests" / "typing" / "negative_handlers.py")]
        if example == NEGATIVE_EXAMPLE
        else []
    )
    result = mypy(
        "--config-file", os.devnull, "--warn-unused-ignores", "--explicit-package-bases", "app",
        *extra,
        cwd=example, mypypath=example,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_the_negative_snippets_target_an_example() -> None:
    assert NEGATIVE_EXAMPLE in EXAMPLES
