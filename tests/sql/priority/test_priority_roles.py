"""Who may give a run a priority (engine 0031), with real login roles: a client starts runs with
one, as it starts runs; workers and readers start none; and no role but the engine's writes a
priority into a queue's messages."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.engine import Engine
from tests.roles import Logins, refused

START = "select priority from pgflow.start_flow('plain', '{}', priority => 5)"


def test_a_client_starts_runs_with_a_priority(engine: Engine, logins: Logins) -> None:
    engine.flow("plain", {"slug": "only"})
    client = logins.login("client")
    assert client.execute(START).fetchone() == (5,)
    rows = client.execute(
        "select priority from pgflow.start_flows('plain', %s::jsonb[], priority => 7)",
        ([Jsonb(1), Jsonb(2)],),
    ).fetchall()
    assert rows == [(7,), (7,)]


def test_workers_and_readers_start_no_prioritised_run(engine: Engine, logins: Logins) -> None:
    engine.flow("plain", {"slug": "only"})
    for kind in ("worker", "reader"):
        conn: psycopg.Connection[Any] = logins.login(kind)
        assert "permission denied for function start_flow" in refused(conn, START)
    assert engine.value("select count(*) from pgflow.runs") == 0


def test_no_role_but_the_engines_writes_a_priority_into_a_queue(
    engine: Engine, logins: Logins
) -> None:
    engine.flow("plain", {"slug": "only"})
    run_id = engine.start("plain")
    forged = Jsonb({"flow_slug": "plain", "run_id": str(run_id), "step_slug": "only",
                    "task_index": 0, "priority": 1000})  # fmt: skip
    for kind in ("worker", "client"):
        conn = logins.login(kind)
        refused(conn, "insert into pgmq.q_plain (vt, message) values (now(), %s)", forged)
        refused(conn, "update pgmq.q_plain set message = %s", forged)
    assert [
        m["message"].get("priority") for m in engine.all("select message from pgmq.q_plain")
    ] == [None]
