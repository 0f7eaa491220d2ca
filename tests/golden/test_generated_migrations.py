"""Every generated flow migration (golden cases and examples) runs on the real engine: the first
application compiles the flow with its queue mode and routes, a second one verifies it, and the
persisted routes are the ones the Python resolver computed. A case with table triggers has the
tables in its `setup.sql`, applied first."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pgflow_gen import naming

ROOT = Path(__file__).parents[2]
MIGRATIONS = sorted(
    [
        *ROOT.glob("tests/golden/cases/*/expected/migrations/*.sql"),
        *ROOT.glob("examples/*/app/pgflow/migrations/*.sql"),
    ]
)


@pytest.mark.parametrize("path", MIGRATIONS, ids=[str(p.relative_to(ROOT)) for p in MIGRATIONS])
def test_a_generated_migration_compiles_then_verifies(db_url: str, path: Path) -> None:
    text = path.read_text()
    setup = path.parents[2] / "setup.sql"
    with psycopg.connect(db_url, autocommit=True) as conn:
        if setup.exists():
            conn.execute(setup.read_bytes())
        conn.execute(text.encode())
        conn.execute(text.encode())  # idempotent: the second application verifies
        [(flow_slug, mode)] = conn.execute(
            "select flow_slug, queue_mode from pgflow.flows"
        ).fetchall()
        steps = conn.execute(
            "select step_slug, queue_name, case when subflow_slug is null then step_type"
            " else 'subflow' end from pgflow.steps"
            " where flow_slug = %s order by step_index",
            (flow_slug,),
        ).fetchall()
        listed = {r[0] for r in conn.execute("select queue_name from pgmq.meta").fetchall()}
    routes = naming.resolve_queue_routes(flow_slug, [s for s, _, _ in steps], mode)
    assert [(r.step_slug, r.queue_name) for r in routes] == [(s, q) for s, q, _ in steps]
    # Every step route gets its queue, but a signal or subflow step's: no worker runs its tasks.
    expected_queues = {q for _, q, kind in steps if kind not in ("signal", "subflow")}
    expected_queues |= {flow_slug.lower()} if mode == "flow" else set()
    assert listed == expected_queues


def test_a_generated_migration_refuses_a_changed_flow_in_production(db_url: str) -> None:
    [path] = [p for p in MIGRATIONS if p.match("examples/community_threads/*/*/*/*.sql")]
    text = path.read_text()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(text.encode())
        conn.execute("update pgflow.steps set queue_name = queue_name || 'x' where step_index = 0")
        with pytest.raises(psycopg.errors.RaiseException, match="differs from its definition"):
            conn.execute(text.encode())
