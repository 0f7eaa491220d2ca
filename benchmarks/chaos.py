"""Chaos soak: a step-queued flow with a map step and a join (`chaosFlow`), one worker process per
step, while a random step worker is SIGKILLed every 1-2 s (and restarted at once, as a process
manager would) and PostgreSQL is crash-restarted (`pg_ctl stop -m immediate`); then everything
drains. A slow-database phase: nothing dies, but the workers' statements are cancelled at random
(`pg_cancel_backend`), another session holds `for update` locks on started runs for longer than
the stall threshold, and the workers' role has a low `statement_timeout`. And a backlog run: RUNS
runs queued with no worker, then the workers start.

    .venv/bin/python benchmarks/chaos.py [--runs 200] [--chaos 30] [--crashes 2] [--repeat 2]
    .venv/bin/python benchmarks/chaos.py --only slow [--runs 200] [--chaos 30]
    .venv/bin/python benchmarks/chaos.py --only backlog [--backlog 10000]

Soak report: runs completed with the correct output (target: all), runs lost (not completed by
the deadline; target: 0), runs failed (no handler here ever fails, so a failed run was failed by
the database; target: 0), handler executions and duplicates (at-least-once: executions beyond one
per task, bounded by (kills + crashes) x max_concurrent: 0 in the slow-database phase), the time
from the end of the chaos until every run finished, and the exit codes of the workers stopped
with SIGTERM at the end (target: all 0). Backlog report: time until every run completed and each
worker's peak resident memory next to its memory right after startup.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import embedded, migrations

PROJECT = Path(__file__).parent / "project"
FLOW = "chaosFlow"
STEPS = ("split", "square", "side", "join")
MAX_CONCURRENT = 10
MIGRATION = PROJECT / "app" / "pgflow" / "migrations" / f"{FLOW}.sql"
#: The slow-database phase: the workers' own role, its statement timeout, a fast liveness rule
#: (so that a lock held for HOLD_S outlasts the stall threshold), and how long a lock is held.
WORKER_ROLE = "pgflow_chaos_worker"
WORKER_STATEMENT_TIMEOUT = "500ms"
FAST_LIVENESS = {"heartbeat_interval": "0.5s", "live_within": "1.5s", "stalled_after": "3s"}
HOLD_S = 4.0


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

    def __init__(
        self, step: str, url: str, logs: Path, marks: Path, work_s: float, phase: str = "soak"
    ) -> None:
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
        self.phase = phase
        self.generation = 0
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.generation += 1
        module = f"app.pgflow.workers.chaos_flow.{self.step}"
        with self.log_path.open("wb") as log:
            # The child keeps its own descriptor of the log.
            return subprocess.Popen(
                [sys.executable, "-m", module], cwd=PROJECT, env=self.env, stdout=log, stderr=log
            )

    @property
    def log_path(self) -> Path:
        return self.logs / f"{self.phase}.{self.step}.{self.generation}.log"

    @property
    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

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
    phase: str = "soak"
    completed_correct: int = 0
    wrong_output: int = 0
    failed: int = 0
    lost: int = 0
    tasks: int = 0
    executions: int = 0
    duplicates: int = 0
    kills: int = 0
    crashes: int = 0
    cancels: int = 0
    lock_holds: int = 0
    drain_s: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def duplicate_bound(self) -> int:
        return (self.kills + self.crashes) * MAX_CONCURRENT

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.completed_correct == self.runs
            and self.duplicates <= self.duplicate_bound
            and set(self.exit_codes) == {0}
        )

    def lines(self) -> list[str]:
        trouble = (
            f"statements cancelled {self.cancels}, run-row locks held {HOLD_S:g} s"
            f" {self.lock_holds} times, statement_timeout {WORKER_STATEMENT_TIMEOUT}"
            if self.phase == "slow database"
            else f"kills {self.kills}, crash restarts {self.crashes}"
        )
        return [
            f"runs {self.runs}: completed with the correct output {self.completed_correct},"
            f" wrong output {self.wrong_output}, failed {self.failed}, lost {self.lost}",
            f"{trouble}; tasks {self.tasks}, handler executions {self.executions}, duplicates"
            f" {self.duplicates} (bound {self.duplicate_bound})",
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
    """Kills and crash restarts while runs start (see the module docstring)."""
    rng = random.Random(seed)

    def chaos(report: SoakReport, workers: dict[str, StepWorker]) -> None:
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

    return _soak(
        server, SoakReport(runs=runs), chaos, server.url(), chaos_s=chaos_s, width=width,
        work_s=work_s, drain_deadline_s=drain_deadline_s, logs=logs,
    )  # fmt: skip


def slow_database(
    server: embedded.EmbeddedServer,
    *,
    runs: int = 200,
    chaos_s: float = 30.0,
    width: int = 3,
    work_s: float = 0.05,
    seed: int | None = None,
    drain_deadline_s: float = 300.0,
    logs: Path | None = None,
) -> SoakReport:
    """A database that misbehaves without dying (see the module docstring): statements
    cancelled at random, run rows locked past the stall threshold, a low statement timeout."""
    rng = random.Random(seed)
    url = server.url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login superuser").format(sql.Identifier(WORKER_ROLE)))
        conn.execute(
            sql.SQL("alter role {} set statement_timeout = {}").format(
                sql.Identifier(WORKER_ROLE), sql.Literal(WORKER_STATEMENT_TIMEOUT)
            )
        )
        for name, value in FAST_LIVENESS.items():
            conn.execute(
                sql.SQL("alter database {} set {} = {}").format(
                    sql.Identifier(conn.info.dbname),
                    sql.Identifier("pgflow", name),
                    sql.Literal(value),
                )
            )
    holders: list[threading.Thread] = []

    def trouble(report: SoakReport, workers: dict[str, StepWorker]) -> None:
        began = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            while time.monotonic() - began < chaos_s:
                time.sleep(rng.uniform(0.02, 0.1))
                report.cancels += _cancel_a_worker_statement(conn, rng)
                first = not holders and time.monotonic() - began > 1.0
                if (first or rng.random() < 0.05) and not any(h.is_alive() for h in holders):
                    holder = threading.Thread(target=_hold_run_rows, args=(url, rng.random()))
                    holder.start()
                    holders.append(holder)
                    report.lock_holds += 1
        for holder in holders:
            holder.join()

    return _soak(
        server, SoakReport(runs=runs, phase="slow database"), trouble,
        conninfo.make_conninfo(url, user=WORKER_ROLE), chaos_s=chaos_s, width=width,
        work_s=work_s, drain_deadline_s=drain_deadline_s, logs=logs,
    )  # fmt: skip


def _cancel_a_worker_statement(conn: psycopg.Connection[Any], rng: random.Random) -> int:
    """pg_cancel_backend on one worker backend running a statement now; 1 if one was."""
    pids = [
        row[0]
        for row in conn.execute(
            "select pid from pg_stat_activity where usename = %s and state = 'active'"
            " and pid <> pg_backend_pid()",
            (WORKER_ROLE,),
        ).fetchall()
    ]
    if not pids:
        return 0
    row = conn.execute("select pg_cancel_backend(%s)", (rng.choice(pids),)).fetchone()
    return 1 if row and row[0] else 0


def _hold_run_rows(url: str, share: float) -> None:
    """Lock a share of the started runs' rows `for update` for HOLD_S: their completions wait."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "select run_id from pgflow.runs where status = 'started' and random() < %s for update",
            (share,),
        )
        time.sleep(HOLD_S)  # holding the locks is the point: a stalled session, not a wait
        conn.rollback()


def _soak(
    server: embedded.EmbeddedServer,
    report: SoakReport,
    chaos: Callable[[SoakReport, dict[str, StepWorker]], None],
    worker_url: str,
    *,
    chaos_s: float,
    width: int,
    work_s: float,
    drain_deadline_s: float,
    logs: Path | None,
) -> SoakReport:
    """Start the step workers, start runs while `chaos` runs, drain, and score."""
    url = server.url()
    logs = logs or Path(tempfile.mkdtemp(prefix="pgflow-chaos-logs-"))
    marks = logs / f"{report.phase.replace(' ', '-')}.executions"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(MIGRATION.read_text())
    workers = {
        step: StepWorker(step, worker_url, logs, marks, work_s, report.phase.replace(" ", "-"))
        for step in STEPS
    }
    try:
        for worker in workers.values():
            worker.wait_started()
        inputs = [{"n": n, "width": width} for n in range(report.runs)]
        starter = Starter(url, inputs, pace_s=chaos_s * 0.8 / max(report.runs, 1))
        starter.start()
        chaos(report, workers)
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
    parser.add_argument("--only", choices=("soak", "slow", "backlog"))
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
            ok &= result.ok
    if args.only in (None, "slow"):
        for repeat in range(1, args.repeat + 1):
            with crashable_server() as server:
                result = slow_database(server, runs=args.runs, chaos_s=args.chaos, seed=args.seed)
            print(f"slow database {repeat}:")
            for line in result.lines():
                print(f"  {line}")
            ok &= result.ok
    if args.only in (None, "backlog"):
        with crashable_server() as server:
            outcome = backlog(server, runs=args.backlog)
        for line in outcome.lines():
            print(line)
        ok &= outcome.completed == outcome.runs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
