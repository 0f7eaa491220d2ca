"""`pgflow-gen init` creates a project that builds, type-checks and passes its own test, installs
as its README says, and never writes over a file that exists."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from pgflow_gen.codegen import origin
from pgflow_gen.runtime import embedded
from tests import packaging

BIN = Path(sys.executable).parent
DEADLINE_S = 120.0


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
        "created my flows/README.md",
        "created my flows/pyproject.toml",
        "created my flows/flows/hello.yaml",
        "created my flows/app/__init__.py",
        "created my flows/app/handlers.py",
        "created my flows/tests/test_hello.py",
        "",
        "next:",
        "  cd my flows",
        "  python3 -m venv .venv && . .venv/bin/activate",
        "  pip install -e '.[test]'   # pgflow-gen as installed for init, pytest, mypy",
        "  pgflow-gen build           # generate app/pgflow from flows/hello.yaml",
        "  pytest -q                  # run tests/test_hello.py through the engine",
        "  pgflow-gen dev             # run every worker; rebuild and restart on changes",
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


def test_the_project_depends_on_pgflow_gen_as_this_one_was_installed(tmp_path: Path) -> None:
    created = run(str(BIN / "pgflow-gen"), "init", "p", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    wanted = origin.installed_requirement()
    assert wanted.startswith("pgflow-gen[embedded,dashboard]")
    pyproject = (tmp_path / "p" / "pyproject.toml").read_text()
    assert f'dependencies = ["{wanted}"]' in pyproject
    assert 'test = ["pytest>=8", "mypy>=1.10"]' in pyproject
    assert f"(`{wanted}`)" in (tmp_path / "p" / "README.md").read_text()


def readme_blocks(project: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (project / "README.md").read_text(), re.DOTALL)


@pytest.mark.slow
def test_a_new_project_installs_and_runs_as_its_readme_says(tmp_path: Path) -> None:
    """From the wheel, as a user gets pgflow-gen: a fresh virtual environment runs `init`, and
    the generated README's commands, run word for word, install the project into a virtual
    environment of its own, build it, pass its test, run `dev` and finish a run."""
    wheel = packaging.build_wheel(tmp_path / "dist")
    tool = tmp_path / "tool"
    venv.EnvBuilder(with_pip=True).create(tool)
    installed = run(
        str(tool / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[embedded]",
        cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    created = run(str(tool / "bin" / "pgflow-gen"), "init", "hello-project", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    project = tmp_path / "hello-project"
    assert f"@ {wheel.as_uri()}" in (project / "pyproject.toml").read_text()

    install, check, dev, start = readme_blocks(project)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PGFLOW_DATABASE_URL", "DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join([str(tool / "bin"), env.get("PATH", "")])
    try:
        shown = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", install + check], cwd=project, env=env,
            capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "9 written, 0 removed, 0 unchanged" in shown.stdout
        assert re.search(r"^2 passed", shown.stdout, re.MULTILINE), shown.stdout
        assert (project / ".venv" / "bin" / "pgflow-gen").is_file()

        activate = ". .venv/bin/activate && exec "
        log = project / "dev.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                ["bash", "-c", activate + dev.strip()], cwd=project, env=env, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            _wait_for(log, r"worker hello-(greet|shout) started \(", count=2)
            finished = subprocess.run(
                ["bash", "-c", activate + start.strip()], cwd=project, env=env,
                capture_output=True, text=True, check=False, timeout=DEADLINE_S,
            )  # fmt: skip
            assert finished.returncode == 0, finished.stdout + finished.stderr
            assert 'completed: {"shout": "HELLO, ADA!"}' in finished.stdout
        finally:
            worker.send_signal(signal.SIGINT)
            assert worker.wait(timeout=DEADLINE_S) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        embedded.EmbeddedServer.for_project(project).destroy()


def _wait_for(log: Path, pattern: str, count: int) -> None:
    end = time.monotonic() + DEADLINE_S
    while len(re.findall(pattern, log.read_text())) < count:
        assert time.monotonic() < end, f"dev never logged {pattern!r}:\n{log.read_text()}"
        time.sleep(0.05)
