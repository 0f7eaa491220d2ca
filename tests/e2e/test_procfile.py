"""The generated Procfile runs as it is under honcho: every process it names starts, registers
under that same name, and stops cleanly when honcho is told to stop: Ctrl-C (SIGINT to honcho)
while a task is in flight lets the task complete, and every worker exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.e2e.harness import PROJECT, Db, eventually

PROCFILE = PROJECT / "app" / "pgflow" / "Procfile"


def process_names() -> list[str]:
    return [
        line.split(":", 1)[0]
        for line in PROCFILE.read_text().splitlines()
        if line and not line.startswith("#")
    ]


def test_every_procfile_name_is_one_a_process_manager_accepts() -> None:
    names = process_names()
    assert names
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", name) for name in names), names


def test_every_procfile_line_execs_its_worker() -> None:
    # Procfile runners start a line under /bin/sh: `exec` makes the worker the process they
    # signal and wait for (without it the shell dies of SIGTERM and honcho reports -15).
    commands = [line.split(":", 1)[1].strip() for line in PROCFILE.read_text().splitlines()
                if line and not line.startswith("#")]  # fmt: skip
    assert commands
    assert all(command.startswith("exec python -m app.pgflow.workers.") for command in commands)


def test_honcho_runs_the_generated_procfile_and_every_worker_registers(
    db: Db, db_url: str, tmp_path: Path
) -> None:
    names = process_names()
    honcho = Path(sys.executable).with_name("honcho")
    log_path = tmp_path / "honcho.log"
    # As in an activated virtual environment: the Procfile's `python` is this interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PGFLOW_DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(honcho), "--no-colour", "-f", str(PROCFILE.relative_to(PROJECT)), "start"],
            cwd=PROJECT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def registered() -> bool:
            rows = db.all("select function_name from pgflow.workers where stopped_at is null")
            return sorted(r["function_name"] for r in rows) == sorted(names)

        try:
            eventually(registered, "every Procfile process to register")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log_path.read_text()}") from None
        gate = tmp_path / "gate"
        run_id = db.start("e2eSteps", {"n": 3, "gate": str(gate)})
        eventually(lambda: db.task(run_id, "first")["status"] == "started", "a task in flight")
        process.send_signal(signal.SIGINT)  # Ctrl-C: honcho sends every worker SIGTERM
        eventually(lambda: "sending SIGTERM" in log_path.read_text(), "honcho to stop them")
        gate.touch()  # the handler in flight finishes within honcho's 5 s
        process.wait(timeout=60)
        eventually(
            lambda: db.value("select count(*) from pgflow.workers where stopped_at is null") == 0,
            "every worker to drain and mark itself stopped",
        )
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = log_path.read_text()
    assert db.task(run_id, "first")["status"] == "completed", output
    assert "SIGKILL" not in output
    for name in names:
        started = rf"^\S+ {re.escape(name)}\.1\s+\| .* worker {re.escape(name)} started"
        assert re.search(started, output, re.MULTILINE), (name, output)
        assert re.search(rf"\| {re.escape(name)}\.1 stopped \(rc=0\)", output), (name, output)
