"""Every example in a docstring of the package runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pgflow_gen"
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if ">>>" in path.read_text(encoding="utf-8")
)


def test_the_package_has_examples() -> None:
    assert "pgflow_gen.runtime.inputs" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_of_a_module_hold(name: str) -> None:
    results = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert results.failed == 0
    source = (PACKAGE.parent / name.replace(".", "/")).with_suffix(".py").read_text()
    runnable = [line for line in source.splitlines() if ">>>" in line and "+SKIP" not in line]
    assert results.attempted >= len(runnable) > 0 or not runnable  # none was lost to a typo
