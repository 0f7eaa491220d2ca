"""A handler with the wrong signature is reported at its own line in the user's handler module
(the `@Steps.<step>` decorator's), with the step's generated Protocol in the message: by
`mypy app/handlers.py` alone and by pyright, not only in a generated entry file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.golden.test_pyright import pyright
from tests.golden.test_typing import ROOT, mypy

EXAMPLE = ROOT / "examples" / "community_threads"
GOOD = "def classify(flow_input: Input, ctx: Context[Input], /) -> ClassifyOutput:"
MISTAKES = {
    "returns an int": "def classify(flow_input: Input, ctx: Context[Input], /) -> int:",
    "takes a str": "def classify(flow_input: str, ctx: Context[Input], /) -> ClassifyOutput:",
    "takes no ctx": "def classify(flow_input: Input, /) -> ClassifyOutput:",
}


@pytest.fixture(params=sorted(MISTAKES))
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, int]:
    """A copy of the example whose classify handler has one mistake, and the line of its
    `@Steps.classify` decorator."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE / "app", project / "app")
    handlers = project / "app" / "handlers.py"
    source = handlers.read_text()
    assert GOOD in source
    handlers.write_text(source.replace(GOOD, MISTAKES[request.param]))
    lines = handlers.read_text().splitlines()
    return project, lines.index("@Steps.classify") + 1


@pytest.mark.slow
def test_mypy_reports_the_mistake_at_the_handler(broken: tuple[Path, int]) -> None:
    project, line = broken
    result = mypy(
        "--config-file", "/dev/null", "--explicit-package-bases", "app/handlers.py",
        cwd=project, mypypath=project,
    )  # fmt: skip
    errors = [x for x in result.stdout.splitlines() if ": error:" in x]
    assert_at_the_handler(errors, f"app/handlers.py:{line}: error:")


@pytest.mark.slow
def test_pyright_reports_the_mistake_at_the_handler(broken: tuple[Path, int]) -> None:
    project, line = broken
    errors, _ = pyright(project, ["app"])
    # pyright then ignores the decorator, so the entry file's assignment is reported as well.
    assert_at_the_handler(errors, f"app/handlers.py:{line}:", also="app/pgflow/workers/")


def assert_at_the_handler(errors: list[str], decorator_line: str, also: str = "") -> None:
    """The mistake is an error at the decorator naming the Protocol; every other error (the body
    of a mistaken handler may have its own) is in the handler module, or under `also`."""
    at_decorator = [x for x in errors if x.startswith(decorator_line)]
    assert at_decorator, errors
    assert "ClassifyHandler" in at_decorator[0]
    elsewhere = [
        x for x in errors if not x.startswith(("app/handlers.py:", also or "app/handlers"))
    ]
    assert elsewhere == []
