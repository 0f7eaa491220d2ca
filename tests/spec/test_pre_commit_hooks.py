"""The pre-commit hooks this repository offers (`.pre-commit-hooks.yaml`), run by pre-commit
itself on a temporary project: they pass on a clean project, `pgflow-gen-build-check` fails when
a spec changed without a rebuild, and `pgflow-gen-validate` fails on a broken spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgflow_gen import cli

REPOSITORY = Path(__file__).resolve().parents[2]
PYPROJECT = """\
[project]
name = "hooked"
version = "0"

[tool.pgflow-gen]
specs = ["flows"]
out = "app/pgflow"
"""
SPEC = """\
slug: hooked
steps:
  - slug: greet
    handler: app.handlers:greet
"""


def git(project: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=project, check=True, capture_output=True)


def hooks(project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`pre-commit try-repo` with this checkout (uncommitted changes included): both hooks."""
    pre_commit = Path(sys.executable).with_name("pre-commit")
    return subprocess.run(
        [str(pre_commit), "try-repo", str(REPOSITORY), "--all-files"],
        cwd=project,
        env={**os.environ, "PRE_COMMIT_HOME": str(home), "PGFLOW_DEBUG": ""},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.slow
def test_the_hooks_pass_a_clean_project_and_catch_stale_output_and_broken_specs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "flows").mkdir(parents=True)
    (project / "app").mkdir()
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "flows" / "hooked.yaml").write_text(SPEC)
    (project / "app" / "__init__.py").write_text("")
    (project / "app" / "handlers.py").write_text("def greet(flow_input, ctx, /):\n    return 1\n")
    monkeypatch.chdir(project)
    assert cli.main(["build"]) == cli.EXIT_OK
    git(project, "init", "-q")
    git(project, "add", "-A")
    home = tmp_path / "pre-commit-home"

    clean = hooks(project, home)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "pgflow-gen validate" in clean.stdout
    assert "pgflow-gen build --check" in clean.stdout

    (project / "flows" / "hooked.yaml").write_text(
        SPEC + "  - slug: shout\n    depends_on: [greet]\n    handler: app.handlers:greet\n"
    )
    git(project, "add", "-A")
    stale = hooks(project, home)
    assert stale.returncode == 1
    assert "run `pgflow-gen build` and commit the result" in stale.stdout

    (project / "flows" / "hooked.yaml").write_text(SPEC.replace("greet\n", "Greet Me\n", 1))
    git(project, "add", "-A")
    broken = hooks(project, home)
    assert broken.returncode == 1
    assert "flows/hooked.yaml:3:" in broken.stdout  # the located error of validate
