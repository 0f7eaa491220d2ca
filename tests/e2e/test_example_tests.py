"""Each example's own tests (written with the testing kit, `pgflow_gen.testing`) pass, run as a
user runs them: `pytest` in the example's folder, the kit's plugin found through its entry point."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "tests").is_dir())


def test_every_example_with_handlers_has_tests() -> None:
    with_handlers = {p.name for p in (ROOT / "examples").iterdir() if (p / "app").is_dir()}
    assert with_handlers == {p.name for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_examples_own_tests_pass(example: Path, admin_url: str) -> None:
    # As the README says to run them; the example's pytest.ini, not this repository's settings.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "-q", "-p", "no:cacheprovider", "tests"],
        cwd=example,
        env={**os.environ, "PGFLOW_TEST_DATABASE_URL": admin_url},
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
    assert "failed" not in result.stdout


@pytest.mark.parametrize(
    ("guide", "files"), [("testing.md", 2), ("workers.md", 1), ("starting-runs.md", 2)]
)
def test_the_guides_show_the_example_files_as_they_are(guide: str, files: int) -> None:
    text = (ROOT / "docs" / guide).read_text()
    shown = re.findall(r"```python\n# (examples/\S+)\n(.*?)```", text, re.DOTALL)
    assert len(shown) == files
    for path, code in shown:
        assert (ROOT / path).read_text() == code, path


def test_the_embedding_example_runs_every_step_worker_in_one_event_loop(db_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.service"],
        cwd=ROOT / "examples" / "community_threads",
        env={**os.environ, "PGFLOW_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Can someone help me?: completed {'deliverSlack': 'posted thread needing help (route"
        " help)', 'thankHelpers': ['thanks, ada!', 'thanks, grace!']}",
        "BUY NOW: completed {'thankHelpers': []}",
    ]
    assert result.stderr.count(" started (flow communityThreadsV1, step ") == 4
    assert result.stderr.count(": stopped by its application, draining ") == 4
    assert "Traceback" not in result.stderr
