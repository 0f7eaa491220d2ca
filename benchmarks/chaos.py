"""Chaos soak: a step-queued flow with a map step and a join (`chaosFlow`), one worker process per
step, while a random step worker is SIGKILLed every 1-2 s (and restarted at once, as a process
manager would) and PostgreSQL is crash-restarted (`pg_ctl stop -m immediate`); then everything
drains. And a backlog run: RUNS runs queued with no worker, then the workers start.

    .venv/bin/python benchmarks/chaos.py [--runs 200] [--chaos 30] [--crashes 2] [--repeat 2]
    .venv/bin/python benchmarks/chaos.py --only backlog [--backlog 10000]

Soak report: runs completed with the correct output (target: all), runs lost (not completed by
the deadline; target: 0), handler executions and duplicates (at-least-once: executions beyond one
per task, bounded by (kills + crashes) x max_concurrent), the time from the end of the chaos until
every run finished, and the exit codes of the workers stopped with SIGTERM at the end (target: all
0). Backlog report: time until every run completed and each worker's peak resident memory next to
its memory right after startup.

Uses a fresh embedded PostgreSQL with the server's durable defaults (fsync on) in a temporary
folder: the soak needs a server it may crash. Workers run from `benchmarks/project`.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import embedded, migrations

PROJECT = Path(__file__).parent / "project"
FLOW = "chaosFlow"
STEPS = ("split", "square", "side", "join")
MAX_CONCURRENT = 10
MIGRATION = PROJECT / "app" / "pgflow" / "migrations" / f"{FLOW}.sql"


def expected_output(n: int, width: int) -> int:
    return n + sum((n + i) ** 2 for i in range(width))


@contextmanager
def crashable_server() -> Iterator[embedded.EmbeddedServer]:
    """A migrated embedded server with durable settings, which the caller may crash."""
    base = Path(tempfile.mkdtemp(prefix="pgflow-chaos-"))
    server = embedded.EmbeddedServer(base, embedded.default_bin_dir(), fast=False, local=False)
    try:
        with psycopg.connect(server.ensure_started(), autocommit=True) as conn:
            migrations.migrate(conn)
        yield server
    finally:
        server.destroy()


class StepWorker:
    """One step's worker process; `restart` starts a new one after a kill."""

    def __init__(self, step: str, url: str, logs: Path, marks: Path, work_s: float) -> None:
        self.step = step
        self.url = url
        self.logs = logs
        self.env = {
            **os.environ,
            "PGFLOW_DATABASE_URL": url,
            "PGFLOW_CHAOS_MARKS": str(marks),
            "PGFLOW_CHAOS_WORK_S": str(work_s),
            "PGFLOW_RECOVERY_INTERVAL": "1",
            "PGFLOW_POLL_INTERVAL": "1",
            "PGFLOW_MAX_CONCURRENT": str(MAX_CONCURRENT),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DATABASE_URL", None)
        self.generation = 0
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.generation += 1
        module = f"app.pgflow.workers.chaos_flow.{self.step}"
        with (self.logs / f"{self.step}.{self.generation}.log").open("wb") as log:
            # The child keeps its own descriptor of the log.
            return subprocess.Popen(
                [sys.executable, "-m", module], cwd=PROJECT, env=self.env, stdout=log, stderr=log
            )

    @property
    def log_text(self) -> str:
        return (self.logs / f"{self.step}.{self.generation}.log").read_text(errors="replace")

    def wait_started(self, deadline: float = 60.0) -> None:
        end = time.monotonic() + deadline
        while " started (" not in self.log_text:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"worker {self.step} did not start:\n{self.log_text}")
            time.sleep(0.05)

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = self._spawn()

    def rss_kib(self) -> int:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0
        line = next((x for x in status.splitlines() if x.startswith("VmRSS:")), "VmRSS: 0 kB")
        return int(line.split()[1])

    def terminate(self, deadline: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class SoakReport:
    runs: int
    completed_correct: int = 0
    wrong_output: int = 0
    failed: int = 0
    lost: int = 0
    tasks: int = 0
    executions: int = 0
    duplicates: int = 0
    kills: int = 0
    crashes: int = 0
    drain_s: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def duplicate_bound(self) -> int:
        return (self.kills + self.crashes) * MAX_CONCURRENT

    def lines(self) -> list[str]:
        return [
            f"runs {self.runs}: completed with the correct output {self.completed_correct},"
            f" wrong output {self.wrong_output}, failed {self.failed}, lost {self.lost}",
            f"kills {self.kills}, crash restarts {self.crashes}; tasks {self.tasks}, handler"
            f" executions {self.executions}, duplicates {self.duplicates}"
            f" (bound {self.duplicate_bound})",
            f"drain after the chaos {self.drain_s:.1f} s; worker exit codes after SIGTERM"
            f" {self.exit_codes}",
        ]


class Starter(threading.Thread):
    """Starts runs at a steady pace, each with its own run id; a start that fails while the
    server is down is retried (start_flow with the same run id is idempotent here: a unique
    violation means it had been written)."""

    def __init__(self, url: str, inputs: list[dict[str, int]], pace_s: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.pending = [(uuid.uuid4(), value) for value in inputs]
        self.pace_s = pace_s
        self.started: dict[uuid.UUID, dict[str, int]] = {}

    def run(self) -> None:
        for run_id, value in self.pending:
            while not self._start(run_id, value):
                time.sleep(0.2)
            self.started[run_id] = value
            time.sleep(self.pace_s)

    def _start(self, run_id: uuid.UUID, value: dict[str, int]) -> bool:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(
                    "select from pgflow.start_flow(%s, %s, %s)", (FLOW, Jsonb(value), run_id)
                )
        except psycopg.errors.UniqueViolation:
            return True
        except psycopg.OperationalError:
            return False
        return True


def soak(
    server: embedded.EmbeddedServer,
    *,
    runs: int = 200,
    chaos_s: float = 30.0,
    crashes: int = 2,
    width: int = 3,
    work_s: float = 0.05,
    seed: int | None = None,
    drain_deadline_s: float = 300.0,
    logs: Path | None = None,
) -> SoakReport:
    rng = random.Random(seed)
    url = server.url()
    logs = logs or Path(tempfile.mkdtemp(prefix="pgflow-chaos-logs-"))
    marks = logs / "executions"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MIGRATION.read_text())
    workers = {step: StepWorker(step, url, logs, marks, work_s) for step in STEPS}
    report = SoakReport(runs=runs)
    try:
        for worker in workers.values():
            worker.wait_started()
        inputs = [{"n": n, "width": width} for n in range(runs)]
        starter = Starter(url, inputs, pace_s=chaos_s * 0.8 / max(runs, 1))
        starter.start()
        began = time.monotonic()
        crash_at = [began + chaos_s * (i + 1) / (crashes + 1) for i in range(crashes)]
        while time.monotonic() - began < chaos_s:
            time.sleep(rng.uniform(1.0, 2.0))
            if crash_at and time.monotonic() >= crash_at[0]:
                crash_at.pop(0)
                server.stop(immediate=True)
                server.ensure_started()
                report.crashes += 1
            else:
                workers[rng.choice(STEPS)].kill_and_restart()
                report.kills += 1
        chaos_end = time.monotonic()
        starter.join(timeout=drain_deadline_s)
        finished = _drain(url, list(starter.started), drain_deadline_s)
        report.drain_s = time.monotonic() - chaos_end
        _score(report, url, starter.started, finished, marks)
        for worker in workers.values():
            # A worker restarted just now may still be importing its modules, where Python
            # itself dies of a SIGTERM; the stop is measured on workers that are running.
            worker.wait_started()
    finally:
        report.exit_codes = [worker.terminate() for worker in workers.values()]
    return report


def _drain(url: str, run_ids: list[uuid.UUID], deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "select count(*) from pgflow.runs"
                    " where run_id = any(%s) and status = 'started'",
                    (run_ids,),
                ).fetchone()
            if row is not None and row[0] == 0:
                return True
        except psycopg.OperationalError:
            pass
        time.sleep(0.5)
    return False


def _score(
    report: SoakReport,
    url: str,
    started: dict[uuid.UUID, dict[str, int]],
    finished: bool,
    marks: Path,
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "select run_id, status, output from pgflow.runs where run_id = any(%s)",
            (list(started),),
        ).fetchall()
        report.tasks = int(
            conn.execute(
                "select count(*) from pgflow.step_tasks where run_id = any(%s)", (list(started),)
            ).fetchone()[0]  # type: ignore[index]
        )
    by_id = {row[0]: row for row in rows}
    for run_id, value in started.items():
        row = by_id.get(run_id)
        if row is None or row[1] == "started":
            report.lost += 1
        elif row[1] == "failed":
            report.failed += 1
        elif row[2] == {"join": expected_output(value["n"], value["width"])}:
            report.completed_correct += 1
        else:
            report.wrong_output += 1
    report.lost += (len(started) < report.runs and report.runs - len(started)) or 0
    counts = collections.Counter(
        tuple(line.split()[:3]) for line in marks.read_text().splitlines() if line.strip()
    )
    report.executions = sum(counts.values())
    report.duplicates = sum(count - 1 for count in counts.values())
    if not finished:
        print("  (the drain deadline passed)")


@dataclass
class BacklogReport:
    runs: int
    completed: int
    seconds: float
    rss_start_kib: dict[str, int]
    rss_peak_kib: dict[str, int]

    def lines(self) -> list[str]:
        memory = ", ".join(
            f"{step} {self.rss_start_kib[step] / 1024:.0f} -> {self.rss_peak_kib[step] / 1024:.0f}"
            for step in STEPS
        )
        return [
            f"backlog of {self.runs} runs: {self.completed} completed in {self.seconds:.1f} s"
            f" ({self.runs / self.seconds:.0f} runs/s)",
            f"worker resident memory, MiB after startup -> peak: {memory}",
        ]


def backlog(server: embedded.EmbeddedServer, *, runs: int = 10_000) -> BacklogReport:
    url = server.url()
    logs = Path(tempfile.mkdtemp(prefix="pgflow-backlog-logs-"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MIGRATION.read_text())
        conn.execute(
            "select count(*) from generate_series(1, %s) as n,"
            " lateral pgflow.start_flow(%s, jsonb_build_object('n', n, 'width', 1)) as r",
            (runs, FLOW),
        )
    workers = {step: StepWorker(step, url, logs, logs / "executions", 0.0) for step in STEPS}
    began = time.monotonic()
    try:
        for worker in workers.values():
            worker.wait_started()
        start_rss = {step: worker.rss_kib() for step, worker in workers.items()}
        peak = dict(start_rss)
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                for step, worker in workers.items():
                    peak[step] = max(peak[step], worker.rss_kib())
                row = conn.execute(
                    "select count(*) from pgflow.runs where status = 'completed'"
                ).fetchone()
                completed = int(row[0]) if row else 0
                if completed == runs or time.monotonic() - began > 1800:
                    break
                time.sleep(0.5)
        seconds = time.monotonic() - began
    finally:
        for worker in workers.values():
            worker.terminate()
    return BacklogReport(runs, completed, seconds, start_rss, peak)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--chaos", type=float, default=30.0, help="seconds of kills (30)")
    parser.add_argument("--crashes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--only", choices=("soak", "backlog"))
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    ok = True
    if args.only in (None, "soak"):
        for repeat in range(1, args.repeat + 1):
            with crashable_server() as server:
                result = soak(
                    server, runs=args.runs, chaos_s=args.chaos, crashes=args.crashes,
                    seed=args.seed,
                )  # fmt: skip
            print(f"soak {repeat}:")
            for line in result.lines():
                print(f"  {line}")
            ok &= result.lost == 0 and result.completed_correct == result.runs
            ok &= set(result.exit_codes) == {0}
    if args.only in (None, "backlog"):
        with crashable_server() as server:
            outcome = backlog(server, runs=args.backlog)
        for line in outcome.lines():
            print(line)
        ok &= outcome.completed == outcome.runs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
