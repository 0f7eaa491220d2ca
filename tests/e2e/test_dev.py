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

import psycopg
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
        """Stop dev as a user does (it stops its workers), and kill whatever outlives it: a dev
        killed outright would leave its workers running after the test."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in {int(pid) for pid in re.findall(r"\(pid (\d+)\)", self.log())}:
            try:  # only a worker of this project, not a process that took over its pid
                if b"app.pgflow.workers" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass
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
    assert "built 1 spec: 9 written" in dev.log()
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


SLEEPY_GREET = """
import subprocess
import time


@Steps.greet
def greet(flow_input: Input, ctx: Context[Input], /) -> str:
    if flow_input["name"] == "Child":  # a handler with a child process of its own
        subprocess.run(["sh", "-c", "sleep 4141 & wait"], check=False)
    if flow_input["name"] == "Slow":  # a handler that keeps its worker draining
        time.sleep(60)
    return f"Hello, {flow_input['name']}"
"""


def sleepy(project: Path) -> None:
    """Give the init project's greet handler the two slow cases above."""
    handlers = project / "app" / "handlers.py"
    text = handlers.read_text()
    start = text.index("@Steps.greet")
    end = text.index("@Steps.shout")
    handlers.write_text(text[:start] + SLEEPY_GREET.lstrip() + "\n\n" + text[end:])


def start_run(project: Path, url: str, name: str) -> None:
    result = subprocess.run(
        [str(BIN / "pgflow-gen"), "start", "hello", "--input", f'{{"name": "{name}"}}',
         "--database-url", url],
        cwd=project, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def sleepers() -> list[int]:
    """The processes `sleep 4141` (a handler's child) still running."""
    found = subprocess.run(["pgrep", "-f", "sleep 4141"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def test_a_handlers_child_process_stops_with_its_worker(project: Path, db_url: str) -> None:
    sleepy(project)
    dev = Dev(project, db_url)
    try:
        dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
        start_run(project, db_url, "Child")
        eventually(sleepers, "the handler's child process")
        dev.proc.send_signal(signal.SIGINT)
        assert dev.proc.wait(timeout=60) == 0
    finally:
        dev.close()
    assert sleepers() == []  # the whole process group was stopped
    assert "did not stop in time" not in dev.log()  # it stopped within the grace period


def test_ctrl_c_during_a_restart_wave_stops_it_at_once(project: Path, db_url: str) -> None:
    sleepy(project)
    dev = Dev(project, db_url)
    try:
        dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
        start_run(project, db_url, "Slow")  # greet's worker now drains for long when stopped
        eventually(lambda: "Slow" in _running_inputs(db_url), "the slow handler running")
        handlers = project / "app" / "handlers.py"
        handlers.write_text(handlers.read_text() + "\n# a change\n")
        dev.wait_for(r"changed: app\.handlers")
        dev.proc.send_signal(signal.SIGINT)
        assert dev.proc.wait(timeout=60) == 0
    finally:
        dev.close()
    log = dev.log()
    wave = log[log.index("changed: app.handlers") :]
    assert "started hello-" not in wave  # the wave was stopped: nothing started after the change
    assert "stopped (" in wave


def test_workers_drain_within_the_time_dev_gives_them_and_say_so(
    project: Path, db_url: str
) -> None:
    sleepy(project)
    dev = Dev(project, db_url)
    try:
        dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
        start_run(project, db_url, "Slow")  # greet's handler sleeps past any grace
        eventually(lambda: "Slow" in _running_inputs(db_url), "the slow handler running")
        dev.proc.send_signal(signal.SIGINT)
        assert dev.proc.wait(timeout=60) == 0
    finally:
        dev.close()
    log = dev.log()
    assert "worker hello-greet: received SIGTERM, draining 1 handler for up to 8.0 s" in log
    assert "worker hello-greet: 1 handler still running after the grace period" in log
    assert "did not stop in time" not in log  # it gave up itself; dev killed nothing
    # Every line, dev's first one too, has its prefix column at one width.
    assert len({line.index(" | ") for line in log.splitlines() if " | " in line}) == 1


def _running_inputs(url: str) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select r.input::text from pgflow.step_tasks t join pgflow.runs r using (run_id)"
            " where t.status = 'started'"
        ).fetchall()
    return " ".join(row[0] for row in rows)


def test_a_change_no_worker_imports_restarts_nothing(project: Path, dev: Dev) -> None:
    dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
    before = dev.pids()
    test_file = project / "tests" / "test_hello.py"
    test_file.write_text(test_file.read_text() + "\n# a change\n")
    dev.wait_for(r"changed: tests\.test_hello \(no worker imports it: none restarts\)")
    assert dev.pids() == before
    assert all(alive(pid) for pid in before.values())


def test_a_crashed_worker_starts_again_after_a_pause(project: Path, dev: Dev) -> None:
    dev.wait_for(r"worker hello-(greet|shout) started \(", count=2)
    crashed = dev.pids()["hello-greet"]
    os.kill(crashed, signal.SIGKILL)
    dev.wait_for(r"hello-greet exited with status -9; starting it again in 1 s")
    dev.wait_for(r"worker hello-greet started \(", count=2)
    assert dev.pids()["hello-greet"] != crashed
