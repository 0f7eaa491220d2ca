"""mypy --strict over generated code: every golden flow module, the examples with their
handlers, and negative snippets that must fail (ignores marked with the expected error code)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import golden

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "golden" / "cases"
# The examples, and the project the end-to-end tests run (its handlers are typed the same way).
EXAMPLES = [
    *sorted(p for p in (ROOT / "examples").iterdir() if (p / "app").is_dir()),
    ROOT / "tests" / "e2e" / "project",
    ROOT / "benchmarks" / "project",
]
#: Golden builds of several flows, whose modules import each other as package `expected`: each
#: is type-checked from its own folder.
SEVERAL = sorted(p for p in CASES.iterdir() if (p / "flows").is_dir() and (p / "expected").is_dir())
NEGATIVE_EXAMPLE = ROOT / "examples" / "community_threads"
#: Negative snippets (tests/typing/) and the example each is checked against.
NEGATIVE = {
    NEGATIVE_EXAMPLE: ROOT / "tests" / "typing" / "negative_handlers.py",
    ROOT / "examples" / "human_approval": ROOT / "tests" / "typing" / "negative_signals.py",
    ROOT / "examples" / "subflows": ROOT / "tests" / "typing" / "negative_subflows.py",
    ROOT / "examples" / "plain_flow": ROOT / "tests" / "typing" / "negative_async_client.py",
}


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


def handler_stubs(folder: Path) -> Path:
    """A module for every handler the golden specs name, each attribute a function that takes
    and returns anything, so the worker entry files type-check without the users' code."""
    attributes: dict[str, set[str]] = {}
    built = (case for case in CASES.iterdir() if (case / "expected").is_dir())
    for spec in (spec for case in built for spec in golden.specs(case)):
        for module, attribute in re.findall(r"handler: ([\w.]+):(\w+)", spec.read_text()):
            attributes.setdefault(module, set()).add(attribute)
    for module, names in attributes.items():
        parts = module.split(".")
        for end in range(1, len(parts)):
            package = folder.joinpath(*parts[:end], "__init__.py")
            package.parent.mkdir(parents=True, exist_ok=True)
            package.touch()
        path = folder.joinpath(*parts[:-1], f"{parts[-1]}.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        functions = "".join(
            f"\n\ndef {name}(*args: Any, **kwargs: Any) -> Any: ...\n" for name in sorted(names)
        )
        path.write_text(f"from typing import Any\n{functions}")
    return folder


@pytest.fixture(scope="session")
def golden_flow_modules_result(
    tmp_path_factory: pytest.TempPathFactory,
) -> subprocess.CompletedProcess[str]:
    """mypy over every generated Python file of the golden cases: flow modules, packages and
    worker entry files (against stub handlers)."""
    files = sorted(
        str(p.relative_to(ROOT))
        for p in CASES.glob("*/expected/**/*.py")
        if not any(p.is_relative_to(case) for case in SEVERAL)
    )
    assert any("/workers/" in f for f in files), "no golden worker entry files"
    stubs = handler_stubs(tmp_path_factory.mktemp("handlers"))
    return mypy(
        "--explicit-package-bases", "--namespace-packages", "--config-file", os.devnull, *files,
        cwd=ROOT, mypypath=stubs,
    )  # fmt: skip


@pytest.mark.slow
def test_golden_flow_modules_pass_mypy_strict(
    golden_flow_modules_result: subprocess.CompletedProcess[str],
) -> None:
    assert golden_flow_modules_result.returncode == 0, golden_flow_modules_result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("case", SEVERAL, ids=[p.name for p in SEVERAL])
def test_golden_builds_of_several_flows_pass_mypy_strict(case: Path, tmp_path: Path) -> None:
    stubs = handler_stubs(tmp_path)
    result = mypy("--config-file", os.devnull, "-p", "expected", cwd=case, mypypath=stubs)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_passes_mypy_strict(example: Path) -> None:
    extra = [str(NEGATIVE[example])] if example in NEGATIVE else []
    tests = ["tests"] if (example / "tests").is_dir() else []  # written with the testing kit
    result = mypy(
        "--config-file", os.devnull, "--warn-unused-ignores", "--explicit-package-bases", "app",
        *tests, *extra,
        cwd=example, mypypath=example,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_the_negative_snippets_target_an_example() -> None:
    assert set(NEGATIVE) <= set(EXAMPLES)
    assert set(NEGATIVE.values()) == set((ROOT / "tests" / "typing").glob("*.py"))


@pytest.mark.slow
def test_mypy_says_which_step_and_which_handler_type_a_decorated_handler_misses(
    tmp_path: Path,
) -> None:
    snippet = tmp_path / "wrong_handler.py"
    snippet.write_text(
        "from app.pgflow.community_threads_v1 import Input, Steps\n"
        "from pgflow_gen.runtime import Context\n\n\n"
        "@Steps.deliver_slack\n"
        "def notify(flow_input: Input, ctx: Context[Input], /) -> int:\n"
        "    return 1\n"
    )
    result = mypy("--config-file", os.devnull, str(snippet), cwd=NEGATIVE_EXAMPLE,
                  mypypath=NEGATIVE_EXAMPLE)  # fmt: skip
    [error] = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert error.endswith(
        'error: Value of type variable "_MustBeDeliverSlackHandler" of "deliver_slack" of'
        ' "Steps" cannot be "Callable[[Input, Context[Input]], int]"  [type-var]'
    ), error
