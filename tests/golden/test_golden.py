"""Every golden case generates exactly its committed output (or its committed error text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden.golden import CASES, render_case

CASE_DIRS = sorted(p for p in CASES.iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case_matches_its_committed_output(case: Path) -> None:
    result = render_case(case)
    if isinstance(result, str):
        assert (case / "expected_error.txt").read_text() == result
        assert not (case / "expected").exists()
        return
    expected = case / "expected"
    committed = {p.relative_to(expected).as_posix() for p in expected.rglob("*") if p.is_file()}
    assert committed == set(result), "run `make regen` and review the diff"
    for relative, content in result.items():
        assert (expected / relative).read_text() == content, relative


def test_there_are_enough_cases() -> None:
    assert len(CASE_DIRS) >= 8


def test_output_is_reproducible() -> None:
    case = CASE_DIRS[0]
    assert render_case(case) == render_case(case)
