"""End-to-end harness: worker processes started from the generated entry files of the e2e
project (`tests/e2e/project`), runs started in SQL, and waits that poll with a deadline."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from pgflow_gen import cli
from tests.engine import Engine

PROJECT = Path(__file__).parent / "project"
DEADLINE_S = 60.0
POLL_S = 0.05  # how often a wait re-checks its condition, bounded by the deadline

T = TypeVar("T")


def eventually(check: Callable[[], T | None], what: str, deadline: float = DEADLINE_S) -> T:
    """Poll `check` until it returns something truthy; fail with `what` after the deadline."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline} s waiting for {what}")
        time.sleep(POLL_S)


class WorkerProcess:
    """One worker process, running `python -m <module>` in the e2e project."""

    def __init__(
        self,
        module: str,
        db_url: str,
        log_path: Path,
        *args: str,
        cwd: Path | str = PROJECT,
        **env: str,
    ) -> None:
        self.module = module
        self.log_path = log_path
        environment = {
            **os.environ,
            "PGFLOW_DATABASE_URL": db_url,
            "PGFLOW_POLL_INTERVAL": "1",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        environment.pop("DATABASE_URL", None)
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_log(self, text: str, deadline: float = DEADLINE_S) -> str:
        def found() -> str | None:
            log = self.log()
            if text in log:
                return log
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.module} exited before logging {text!r}:\n{log}")
            return None

        return eventually(found, f"{text!r} in the log of {self.module}", deadline)

    def started(self) -> WorkerProcess:
        self.wait_for_log(" started (")
        return self

    def signal(self, number: int) -> None:
        self.proc.send_signal(number)

    def wait(self, deadline: float = DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.module} did not exit:\n{self.log()}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class Workers:
    """Starts worker processes for one test and kills whatever is left at the end."""

    def __init__(self, db_url: str, logs: Path) -> None:
        self.db_url = db_url
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(
        self, flow_module: str, entry: str, *args: str, cwd: Path | str = PROJECT, **env: str
    ) -> WorkerProcess:
        """Start an entry file of the e2e project (or of the project at `cwd`)."""
        module = f"app.pgflow.workers.{flow_module}.{entry}"
        log_path = self.logs / f"{flow_module}.{entry}.{len(self.started)}.log"
        worker = WorkerProcess(module, self.db_url, log_path, *args, cwd=cwd, **env)
        self.started.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.started:
            worker.close()

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(self.started)


class Db(Engine):
    """The test database, seen from the test: the SQL test driver's helpers on an own
    connection, plus waiting for runs to finish."""

    def __init__(self, url: str) -> None:
        super().__init__(psycopg.connect(url, autocommit=True))

    def close(self) -> None:
        self.conn.close()

    def finished(self, run_id: uuid.UUID, deadline: float = DEADLINE_S) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] != "started" else None

        return eventually(done, f"run {run_id} to finish", deadline)

    def queue_ids(self, queue: str) -> list[int]:
        return [m["msg_id"] for m in self.queued_messages(queue)]


def answered(db_url: str, answer: str, *args: str) -> tuple[int, str]:
    """`pgflow-gen ARGS...` on a terminal (a pty) that types `answer` when asked `[y/N]`; the
    exit status and everything the terminal showed."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "pgflow_gen.cli", *args, "--database-url", db_url],
        stdin=terminal, stdout=terminal, stderr=terminal, close_fds=True,
    )  # fmt: skip
    os.close(terminal)
    seen = b""

    def asked() -> bool:
        nonlocal seen
        seen += os.read(controller, 4096)
        return b"[y/N]" in seen

    eventually(asked, "the question")
    os.write(controller, answer.encode() + b"\n")
    code = process.wait(timeout=60)
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    return code, seen.decode().replace("\r\n", "\n")


def run_cli(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, str, str]:
    """`pgflow-gen ARGS... --database-url DB_URL` in this process: its exit status, stdout and
    stderr (`capsys` is pytest's fixture)."""
    code = cli.main([*args, "--database-url", db_url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
