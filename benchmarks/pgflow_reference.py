"""pgflow's own SQL engine, for same-run comparisons: the migrations of the `@pgflow/core` npm
package (Apache-2.0), fetched with `npm pack` once into `benchmarks/.pgflow-core/` (not
committed) and applied to a database of its own (both engines use the schema `pgflow`).

Two adaptations, both in pgflow's favour: PGMQ is installed as plain SQL by our migrator (the
embedded server has no `pgmq` extension to create), and Supabase's `realtime.send`, which
pgflow calls on every run and step event, is a function that does nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from pgflow_gen.runtime import migrations

VERSION = "0.8.1"
CACHE = Path(__file__).resolve().parent / ".pgflow-core" / VERSION

REALTIME_STUB = """
create schema if not exists realtime;
create or replace function realtime.send(
    payload jsonb, event text, topic text, private boolean default true
) returns void language sql as $$ select $$;
"""


class ReferenceUnavailable(RuntimeError):
    """pgflow's SQL could not be fetched (no npm, or no registry)."""


def migration_files() -> list[Path]:
    """pgflow's migrations in the order they apply, fetched on first use."""
    folder = CACHE / "package" / "dist" / "supabase" / "migrations"
    if not folder.is_dir():
        _fetch()
    return sorted(folder.glob("*.sql"))


def _fetch() -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise ReferenceUnavailable("npm is not installed; pgflow's SQL comes from its npm package")
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [npm, "pack", f"@pgflow/core@{VERSION}", "--silent"],
            cwd=scratch,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ReferenceUnavailable(f"npm pack @pgflow/core@{VERSION}: {done.stderr.strip()}")
        (archive,) = Path(scratch).glob("*.tgz")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as packed:
            packed.extractall(CACHE, filter="data")


def install(conn: psycopg.Connection[Any]) -> None:
    """pgflow's engine into the (empty) database of `conn`, an autocommit connection."""
    migrations.ensure_pgmq(conn)
    conn.execute(REALTIME_STUB)
    for path in migration_files():
        script = path.read_text().replace(
            'CREATE EXTENSION IF NOT EXISTS "pgmq" WITH SCHEMA "pgmq";', ""
        )
        with conn.transaction():
            conn.execute(script.encode())


def define_chain(conn: psycopg.Connection[Any], flow: str, steps: tuple[str, ...]) -> None:
    """A sequential chain of `steps` in pgflow's engine."""
    conn.execute("select pgflow.create_flow(%s)", (flow,))
    for index, step in enumerate(steps):
        deps = [steps[index - 1]] if index else []
        conn.execute("select pgflow.add_step(%s, %s, %s::text[])", (flow, step, deps))


def register_worker(conn: psycopg.Connection[Any], worker_id: Any, queue: str) -> None:
    """A row in pgflow's workers table, which its start_tasks records as the task's worker."""
    conn.execute(
        "insert into pgflow.workers (worker_id, queue_name, function_name)"
        " values (%s, %s, 'bench')",
        (worker_id, queue),
    )


def run_tasks(conn: psycopg.Connection[Any], flow: str, worker_id: Any, batch: int) -> int:
    """What pgflow's worker does with one batch, as autocommit calls: read up to `batch`
    messages of the flow's queue, start their tasks, and complete each (pgflow completes one
    task per call). Returns how many tasks it completed (0: the queue had nothing visible)."""
    ids = [r[0] for r in conn.execute("select msg_id from pgmq.read(%s, 30, %s)", (flow, batch))]
    if not ids:
        return 0
    tasks = conn.execute(
        "select run_id, step_slug, task_index from pgflow.start_tasks(%s, %s::bigint[], %s)",
        (flow, ids, worker_id),
    ).fetchall()
    for run_id, step_slug, task_index in tasks:
        conn.execute(
            "select 1 from pgflow.complete_task(%s, %s, %s, '{\"ok\": true}'::jsonb)",
            (run_id, step_slug, task_index),
        )
    return len(tasks)
