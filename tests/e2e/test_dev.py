"""`pgflow-gen dev` on a project made by `init`: every worker runs, a handler edit restarts them
with the new code, a broken spec keeps them running, Ctrl-C stops them all and exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import eventually

BIN = Path(sys.executable).parent


class Dev:
    def __init__(self, project: Path, url: str) -> None:
        self.log_path = project.parent / "dev.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [str(BIN / "pgflow-gen"), "dev"],
            cwd=project,
            env={**os.environ, "PGFLOW_DATABASE_URL": url, "NO_COLOR": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # As a background job of a shell starts it (CI does): Ctrl-C must work anyway.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, pattern: str, count: int = 1) -> str:
        def seen() -> str | None:
            log = self.log()
            if len(re.findall(pattern, log)) >= count:
                return log
            if self.proc.poll() is not None:
                raise AssertionError(f"dev exited ({self.proc.returncode}):\n{log}")
            return None

        return eventually(seen, f"{count} x {pattern!r} in the dev log")

    def pids(self) -> dict[str, int]:
        """The newest pid of each worker."""
        return {
            name: int(pid) for name, pid in re.findall(r"started (\S+) \(pid (\d+)\)", self.log())
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    made = subprocess.run(
        [str(BIN / "pgflow-gen"), "init", "hello"], cwd=tmp_path, capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    return tmp_path / "hello"


@pytest.fixture
def dev(project: Path, db_url: str) -> Iterator[Dev]:
    running = Dev(project, db_url)
    yield running
    running.close()


def start_and_wait(project: Path, url: str) -> str:
    result = subprocess.run(
        [str(BIN / "pgflow-gen"), "start", "hello", "--input", '{"name": "Ada"}', "--wait",
         "--timeout", "60", "--database-url", url],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()[-1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dev_runs_the_workers_restarts_them_on_a_change_and_stops_them_all(
    project: Path, dev: Dev, db_url: str
) -> None:
    dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
    assert "built 1 spec(s): 9 written" in dev.log()
    assert start_and_wait(project, db_url) == 'completed: {"shout": "HELLO, ADA!"}'
    first = dev.pids()

    handlers = project / "app" / "handlers.py"
    handlers.write_text(handlers.read_text().replace('.upper() + "!"', '.upper() + "?!"'))
    dev.wait_for(r"worker hello-(greet|shout) started \(", count=4)
    assert "changed: app.handlers" in dev.log()
    assert start_and_wait(project, db_url) == 'completed: {"shout": "HELLO, ADA?!"}'
    second = dev.pids()
    assert set(second) == {"hello-greet", "hello-shout"}
    assert not any(alive(pid) for pid in first.values())

    spec = project / "flows" / "hello.yaml"
    spec.write_text(spec.read_text().replace("depends_on: [greet]", "depends_on: [gret]"))
    log = dev.wait_for(r"the running workers keep running")
    assert "flows/hello.yaml:" in log
    assert "gret" in log
    assert dev.pids() == second
    assert all(alive(pid) for pid in second.values())

    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(timeout=60) == 0
    log = dev.log()
    assert "stopped (hello-greet 0, hello-shout 0)" in log
    assert "Traceback" not in log
    assert not any(alive(pid) for pid in second.values())


def test_dev_outside_a_project_says_what_it_needs(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "pgflow-gen"), "dev"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        "error: pgflow-gen dev needs `specs` and `out` under [tool.pgflow-gen] in pyproject.toml."
    )
