"""A worker entry file given a database URL no retry can fix exits 1 at once with one line that
names the problem (never a traceback, never the password); a real connection failure is still
retried. Each case runs a generated entry file as a process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import PROJECT, Workers


@pytest.fixture
def nowhere_workers(tmp_path: Path) -> Workers:
    return Workers("unused", tmp_path)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "postgresq://app:s3cret@localhost/app",
            'missing "=" after "postgresq://app:***@localhost/app" in connection info string',
        ),
        (
            "postgresql://app:s3cret@127.0.0.1:5432/app?sslmode=bogus",
            'invalid sslmode value: "bogus"',
        ),
        (
            "postgresql://app:s3cret@127.0.0.1:5432/app?port=abc",
            'invalid integer value "abc" for connection option "port"',
        ),
    ],
    ids=["malformed", "sslmode", "port"],
)
def test_a_bad_database_url_is_one_line_and_exit_1_at_once(
    nowhere_workers: Workers, url: str, problem: str
) -> None:
    try:
        worker = nowhere_workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=url)
        assert worker.wait(deadline=20.0) == 1
        lines = worker.log().splitlines()
    finally:
        nowhere_workers.close()
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1, lines
    assert errors[0].endswith(
        f"ERROR pgflow_gen.worker: ConfigError: The database URL is not valid: {problem}."
    )
    assert any(line.startswith("HINT: Check --database-url, PGFLOW_DATABASE_URL") for line in lines)
    assert "Traceback" not in "\n".join(lines)
    assert "s3cret" not in "\n".join(lines)
    assert not any("not reachable yet" in line for line in lines)


def test_a_server_that_is_not_there_yet_is_still_waited_for(nowhere_workers: Workers) -> None:
    try:
        worker = nowhere_workers.start(
            "e2e_plain", "worker", PGFLOW_DATABASE_URL="postgresql://app@127.0.0.1:1/app"
        )
        worker.wait_for_log("database not reachable yet")
    finally:
        nowhere_workers.close()


@pytest.mark.parametrize(
    ("typo", "reason"),
    [
        (
            "app.handlers:shot",
            "AttributeError: module 'app.handlers' has no attribute 'shot'. Did you mean: 'shout'?",
        ),
        (
            "app.handler:shout",
            "ModuleNotFoundError: No module named 'app.handler'. Did you mean: 'app.handlers'?",
        ),
    ],
    ids=["function", "module"],
)
def test_a_handler_path_that_does_not_import_is_one_line_and_exit_1(
    tmp_path: Path, typo: str, reason: str
) -> None:
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns(".*", "__pycache__"))
    spec = project / "flows" / "plain.yaml"
    spec.write_text(spec.read_text().replace("handler: app.handlers:shout", f"handler: {typo}"))
    built = subprocess.run(
        [sys.executable, "-m", "pgflow_gen.cli", "build", "flows", "--out", "app/pgflow"],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    worker = subprocess.run(
        [sys.executable, "-m", "app.pgflow.workers.e2e_plain.worker"],
        cwd=project, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PGFLOW_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"},
    )  # fmt: skip
    assert worker.returncode == 1
    lines = worker.stderr.splitlines()
    assert [line.split(" ERROR ", 1)[1] for line in lines if " ERROR " in line] == [
        f'pgflow_gen.worker: ConfigError: The handler "{typo}" of step "shout"'
        f" (flows/plain.yaml) does not import: {reason}"
    ]
    assert lines[-1].startswith("HINT: Fix `handler:` in flows/plain.yaml")
    assert "Traceback" not in worker.stderr


@pytest.mark.parametrize(
    "command", [["runs"], ["db", "migrate"], ["status", "00000000-0000-0000-0000-000000000000"]]
)
def test_a_command_outside_a_project_without_a_url_says_where_it_looked(
    tmp_path: Path, command: list[str]
) -> None:
    # A folder that is no project: no pyproject.toml with [tool.pgflow-gen], no embedded server.
    stray = tmp_path / "downloads"
    stray.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pgflow_gen.cli", *command],
        cwd=stray, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        "error: No database URL, and no pgflow-gen project here to start one for.",
        f"DETAIL: Looked in {stray.resolve()} and every folder above it for a pyproject.toml"
        " with [tool.pgflow-gen] or an embedded server (`pgflow-gen db start`).",
        "HINT: Run it from your project's folder, pass --database-url (or set"
        " PGFLOW_DATABASE_URL), or create a project with `pgflow-gen init`.",
    ]
    assert list(stray.iterdir()) == []  # no cluster started for it
