"""`pgflow-gen init` creates a project that builds, type-checks and passes its own test, and
never writes over a file that exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, check=False
    )


def test_a_new_project_builds_type_checks_and_passes_its_test(
    tmp_path: Path, admin_url: str
) -> None:
    created = run(str(BIN / "pgflow-gen"), "init", "my flows", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    project = tmp_path / "my flows"
    assert created.stdout.splitlines() == [
        "created my flows/.gitignore",
        "created my flows/pyproject.toml",
        "created my flows/flows/hello.yaml",
        "created my flows/app/__init__.py",
        "created my flows/app/handlers.py",
        "created my flows/tests/test_hello.py",
        "",
        "next:",
        "  cd my flows",
        "  pgflow-gen build   # generate app/pgflow from flows/hello.yaml",
        "  pytest -q          # run tests/test_hello.py through the engine",
        "  pgflow-gen dev     # run every worker; rebuild and restart on changes",
    ]
    assert 'name = "my-flows"' in (project / "pyproject.toml").read_text()

    built = run(str(BIN / "pgflow-gen"), "build", cwd=project)
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines()[-1] == "9 written, 0 removed, 0 unchanged"
    typed = run(str(BIN / "mypy"), "--no-incremental", cwd=project)
    assert typed.returncode == 0, typed.stdout
    formatted = run(str(BIN / "ruff"), "format", "--check", "--no-cache", ".", cwd=project)
    assert formatted.returncode == 0, formatted.stdout
    linted = run(str(BIN / "ruff"), "check", "--no-cache", ".", cwd=project)
    assert linted.returncode == 0, linted.stdout
    tested = run(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        cwd=project, PGFLOW_TEST_DATABASE_URL=admin_url,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout


def test_init_writes_nothing_when_one_of_its_files_exists(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "handlers.py").write_text("# mine\n")
    refused = run(str(BIN / "pgflow-gen"), "init", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[0] == (
        "error: . already has app/handlers.py; init writes nothing over existing files."
    )
    assert "Traceback" not in refused.stderr
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "app",
        "app/handlers.py",
    ]
    assert (tmp_path / "app" / "handlers.py").read_text() == "# mine\n"


def test_init_refuses_a_file_as_its_folder(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    refused = run(str(BIN / "pgflow-gen"), "init", "taken", cwd=tmp_path)
    assert (refused.returncode, refused.stderr) == (
        2,
        "error: taken exists and is not a folder.\n",
    )
