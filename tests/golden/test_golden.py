"""Every golden case generates exactly its committed output (or its committed error text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden.golden import CASES, render_case

CASE_DIRS = sorted(p for p in CASES.iterdir() if p.is_dir())
ROOT = Path(__file__).parents[2]


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


RENDER_ALL = """
import json, sys
from tests.golden.golden import CASES, render_case
cases = sorted(p for p in CASES.iterdir() if p.is_dir())
json.dump({case.name: render_case(case) for case in cases}, sys.stdout)
"""


def render_in_a_process(hash_seed: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    result = subprocess.run(
        [sys.executable, "-c", RENDER_ALL],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rendered: dict[str, object] = json.loads(result.stdout)
    return rendered


def test_output_is_identical_in_processes_with_different_hash_seeds() -> None:
    first, second = render_in_a_process("1"), render_in_a_process("2")
    assert set(first) == {case.name for case in CASE_DIRS}
    assert first == second
    assert first == {case.name: render_case(case) for case in CASE_DIRS}
