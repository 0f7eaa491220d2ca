"""The SQL engine on its own: define a two-step flow, start a run, and play the worker's part
with plain SQL calls (read, start_tasks, complete_task) until the run completes.

Run it with `make demo`; it uses the project's embedded PostgreSQL (or PGFLOW_DATABASE_URL).
"""

from __future__ import annotations

import json
import uuid

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.runtime import database, migrations

FLOW = "greetUserDemo"
WORKER_ID = uuid.uuid4()


def handle(step_slug: str, task_input: dict[str, object], flow_input: object) -> object:
    if step_slug == "fullName":
        assert isinstance(flow_input, dict)
        return f"{flow_input['first']} {flow_input['last']}"
    return f"Hello, {task_input['fullName']}!"


def main() -> None:
    url = database.resolve_url()
    print(f"database: {url}")
    with psycopg.connect(url, autocommit=True) as conn:
        for migration in migrations.migrate(conn):
            print(f"applied engine migration {migration.version}_{migration.name}")
        conn.execute("select pgflow.create_flow(%s)", (FLOW,))
        conn.execute("select pgflow.add_step(%s, 'fullName')", (FLOW,))
        conn.execute("select pgflow.add_step(%s, 'greeting', array['fullName'])", (FLOW,))
        queue = FLOW.lower()
        conn.execute(
            "select pgflow.register_worker(%s, %s, 'sql-demo', %s)", (WORKER_ID, queue, FLOW)
        )

        run_id = conn.execute(
            "select run_id from pgflow.start_flow(%s, %s)",
            (FLOW, Jsonb({"first": "Ada", "last": "Lovelace"})),
        ).fetchone()[0]  # type: ignore[index]
        print(f"started run {run_id}")

        while True:
            ids = [r[0] for r in conn.execute("select msg_id from pgmq.read(%s, 30, 10)", (queue,))]
            tasks = conn.execute(
                "select run_id, step_slug, task_index, input, flow_input"
                " from pgflow.start_tasks(%s, %s, %s, %s)",
                (FLOW, ids, WORKER_ID, queue),
            ).fetchall()
            if not tasks:
                break
            for task_run, step_slug, task_index, task_input, flow_input in tasks:
                output = handle(step_slug, task_input, flow_input)
                conn.execute(
                    "select pgflow.complete_task(%s, %s, %s, %s)",
                    (task_run, step_slug, task_index, Jsonb(output)),
                )
                print(f"  {step_slug} -> {json.dumps(output)}")

        status, output = conn.execute(
            "select status, output from pgflow.runs where run_id = %s", (run_id,)
        ).fetchone()  # type: ignore[misc]
        print(f"run {run_id}: {status}, output {json.dumps(output)}")
        conn.execute("select pgflow.mark_worker_stopped(%s)", (WORKER_ID,))
        if status != "completed":
            raise SystemExit(1)


if __name__ == "__main__":
    main()
