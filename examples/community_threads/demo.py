"""`make demo`: the community_threads flow end to end on the embedded PostgreSQL.

Starts one worker process per step from the generated Procfile (each compiles or verifies the
flow, then polls its own queue), starts 50 runs with the typed client, shows their progress,
prints the results and the queue coverage, and stops the workers with SIGTERM (they drain).

Run it from the repository root: `.venv/bin/python examples/community_threads/demo.py`.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from app.pgflow.community_threads_v1 import FLOW, Input  # noqa: E402

from pgflow_gen.cli.output import table  # noqa: E402
from pgflow_gen.errors import PgflowError  # noqa: E402
from pgflow_gen.runtime import Client, database, migrations, project_root  # noqa: E402

RUNS = 50
TEXTS = (
    "Can someone help me configure the worker pool?",
    "BUY NOW: cheap followers",
    "Sharing my benchmark results",
    "help: my flow never finishes",
)
DEADLINE_S = 120.0


def procfile(path: Path) -> dict[str, str]:
    entries = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            # `exec` is for Procfile runners, which start each line under a shell.
            entries[name.strip()] = command.strip().removeprefix("exec ")
    return entries


def start_workers(url: str, logs: Path) -> dict[str, subprocess.Popen[bytes]]:
    env = {**os.environ, "PGFLOW_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    started = {}
    for name, command in procfile(HERE / "app" / "pgflow" / "Procfile").items():
        args = command.split()
        if args[0] == "python":
            args[0] = sys.executable
        log = (logs / f"{name}.log").open("wb")
        started[name] = subprocess.Popen(args, cwd=HERE, env=env, stdout=log, stderr=log)
        print(f"  started {name}: {command}")
    return started


def wait_for_coverage(url: str, workers: dict[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "select count(*) filter (where covered), count(*) from pgflow.queue_coverage()"
                " where flow_slug = %s",
                (FLOW.slug,),
            ).fetchone()
            if row and row[1] and row[0] == row[1]:
                return
            dead = [name for name, proc in workers.items() if proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SystemExit(f"workers did not come up ({', '.join(dead) or 'timeout'})")
            time.sleep(0.1)  # display poll, bounded by the deadline


def progress(done: int, total: int, width: int = 40) -> str:
    filled = width * done // total
    return f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs finished"


def main() -> None:
    url = database.resolve_url()
    print(f"database: {url}")
    with psycopg.connect(url, autocommit=True) as conn:
        for migration in migrations.migrate(conn):
            print(f"applied engine migration {migration.version}_{migration.name}")

    logs = Path(tempfile.mkdtemp(prefix="pgflow-demo-"))
    print(f"starting the {FLOW.slug} step workers (logs in {logs}):")
    workers = start_workers(url, logs)
    try:
        wait_for_coverage(url, workers)
        client = Client(url)
        inputs: list[Input] = [
            {"thread_id": f"t{i}", "text": TEXTS[i % len(TEXTS)]} for i in range(RUNS)
        ]
        started = time.monotonic()
        runs = [client.start_flow(FLOW, run_input) for run_input in inputs]
        with psycopg.connect(url, autocommit=True) as conn:
            ids = [run.run_id for run in runs]
            while True:
                row = conn.execute(
                    "select count(*) from pgflow.runs where run_id = any(%s)"
                    " and status <> 'started'",
                    (ids,),
                ).fetchone()
                done = row[0] if row else 0
                print(progress(done, RUNS), end="", flush=True)
                if done == RUNS:
                    break
                if time.monotonic() - started > DEADLINE_S:
                    raise SystemExit("\nruns did not finish in time")
                time.sleep(0.1)  # display refresh, bounded by the deadline
        print(f" in {time.monotonic() - started:.1f} s\n")

        finished = [run.wait(timeout=10) for run in runs]
        routes = collections.Counter(
            "help" if run.output and "deliverSlack" in run.output else "no help needed"
            for run in finished
        )
        print("results:")
        for run in finished[:4]:
            print(f"  {run.run_id} {run.status}: {run.output}")
        statuses = collections.Counter(run.status for run in finished)
        print(f"  ... {dict(routes)}, statuses {dict(statuses)}\n")

        with psycopg.connect(url, autocommit=True) as conn:
            coverage = conn.execute(
                "select step_slug, queue_name, live_workers,"
                " case when covered then 'yes' else 'NO' end"
                " from pgflow.queue_coverage() where flow_slug = %s",
                (FLOW.slug,),
            ).fetchall()
        print("queue coverage:")
        table(coverage, ["step", "queue", "live workers", "covered"], sys.stdout)
    finally:
        print("\nstopping the workers (SIGTERM, they drain) ...")
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(timeout=60) for name, proc in workers.items()}
        print(f"  exit codes: {codes}")
        if database.configured_url() is None:
            root = project_root.find(Path.cwd())
            print(
                f"\nThe embedded PostgreSQL of {root} keeps running, for the next `make demo`"
                f" or `pgflow-gen` command; stop it with `{_pgflow_gen()} db stop` from {root}."
            )


def _pgflow_gen() -> str:
    """The `pgflow-gen` beside this Python (`.venv/bin/pgflow-gen` from the checkout's root), so
    the line works as printed although the virtual environment is not activated."""
    command = Path(sys.executable).parent / "pgflow-gen"
    if not command.is_file():
        return "pgflow-gen"
    try:
        return str(command.relative_to(Path.cwd()))
    except ValueError:
        return str(command)


if __name__ == "__main__":
    try:
        main()
    except PgflowError as exc:
        raise SystemExit(f"error: {exc}") from None
