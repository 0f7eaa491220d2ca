"""The engine's group roles (engine 0019, `pgflow-gen db roles`): each can do its part through
the engine's functions and nothing else, against real logins on the real engine."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgflow_gen.engine import roles
from tests.engine import Engine, shape_step
from tests.roles import Logins, refused

WORKER = uuid.UUID("00000000-0000-0000-0000-00000000a001")
SHAPE = {"steps": [shape_step("first"), shape_step("second", ("first",))]}
ROUTES = [
    {"stepSlug": "first", "queueName": "chain"},
    {"stepSlug": "second", "queueName": "chain"},
]


def compiled(engine: Engine) -> None:
    engine.value(
        "select pgflow.ensure_flow_compiled('chain', %s, 'flow', %s)", Jsonb(SHAPE), Jsonb(ROUTES)
    )


def test_every_public_engine_function_has_a_role_or_is_the_owners(
    conn: psycopg.Connection[Any],
) -> None:
    public = {
        row[0]
        for row in conn.execute(
            "select proname from pg_proc where pronamespace = 'pgflow'::regnamespace"
            " and proname not like '\\_%'"
        )
    }
    assigned = set(roles.EVERYONE).union(*roles.FUNCTIONS.values(), roles.OWNER_ONLY)
    assert public == assigned


def test_every_function_a_role_calls_runs_as_the_owner(conn: psycopg.Connection[Any]) -> None:
    granted = sorted(set().union(*roles.FUNCTIONS.values()))
    invoker = [
        row[0]
        for row in conn.execute(
            "select proname from pg_proc where pronamespace = 'pgflow'::regnamespace"
            " and proname = any(%s) group by proname having not bool_or(prosecdef)",
            (granted,),
        )
    ]
    assert invoker == []
    # No engine function runs for PUBLIC.
    assert conn.execute(
        "select count(*) from pg_proc where pronamespace = 'pgflow'::regnamespace"
        " and has_function_privilege('public', oid, 'execute')"
    ).fetchone() == (0,)


def test_a_worker_runs_a_flow_without_reading_any_table(engine: Engine, logins: Logins) -> None:
    compiled(engine)
    run_id = engine.start("chain", {"n": 1})
    worker = logins.login("worker")
    verified = worker.execute(
        "select pgflow.verify_flow_compiled('chain', %s, 'flow', %s)", (Jsonb(SHAPE), Jsonb(ROUTES))
    ).fetchone()
    assert verified is not None
    assert verified[0]["status"] == "verified"
    worker.execute("select pgflow.register_worker(%s, 'chain', 'w')", (WORKER,))
    worker.execute("select pgflow.heartbeat_worker(%s)", (WORKER,))
    for step in ("first", "second"):
        [task] = worker.execute(
            "select run_id, step_slug, task_index, attempt"
            " from pgflow.read_and_claim('chain', 'chain', %s, 10, 30)",
            (WORKER,),
        ).fetchall()
        assert task[1] == step
        assert worker.execute("select pgflow.run_input(%s)", (run_id,)).fetchone() == ({"n": 1},)
        worker.execute(
            "select pgflow.complete_task(%s, %s, %s, %s, %s)",
            (task[0], task[1], task[2], Jsonb({"done": step}), task[3]),
        )
    worker.execute("select pgflow.mark_worker_stopped(%s)", (WORKER,))
    assert engine.run(run_id)["status"] == "completed"


def test_a_worker_reads_no_table_and_changes_no_flow(engine: Engine, logins: Logins) -> None:
    compiled(engine)
    engine.start("chain", {"secret": "s"})
    worker = logins.login("worker")
    for table in ("pgflow.runs", "pgflow.step_tasks", "pgflow.step_states", "pgmq.q_chain"):
        refused(worker, f"select * from {table}")
    refused(
        worker,
        "select pgflow.ensure_flow_compiled('chain', %s, 'flow', %s)",
        Jsonb(SHAPE),
        Jsonb(ROUTES),
    )
    refused(worker, "select pgflow.delete_flow_and_data('chain')")
    refused(worker, "select pgflow.prune_data_older_than(interval '0 seconds')")
    refused(worker, "select pgflow.set_step_limits('chain', 'first', 1)")
    refused(worker, "select pgflow.reset_step_limits('chain', 'first')")
    refused(worker, "select pgflow.start_flow('chain', '{}')")
    refused(worker, "select * from pgmq.read('chain', 30, 10)")
    assert engine.value("select count(*) from pgflow.flows") == 1


def test_a_client_starts_and_reads_runs_but_cannot_claim(engine: Engine, logins: Logins) -> None:
    compiled(engine)
    client = logins.login("client")
    row = client.execute("select run_id from pgflow.start_flow('chain', '{\"n\": 2}')").fetchone()
    assert row is not None
    assert client.execute(
        "select status, input from pgflow.runs where run_id = %s", (row[0],)
    ).fetchone() == ("started", {"n": 2})
    refused(client, "select * from pgflow.read_and_claim('chain', 'chain', %s, 10, 30)", WORKER)
    refused(client, "select pgflow.register_worker(%s, 'chain', 'w')", WORKER)
    refused(client, "update pgflow.runs set status = 'completed'")
    refused(client, "delete from pgflow.runs")
    refused(client, "select pgflow.reset_step_limits('chain', 'first')")  # an operator's
    client.execute("select run_id from pgflow.cancel_run(%s, 'no longer needed')", (row[0],))
    assert engine.run(row[0])["status"] == "cancelled"
    # The audit trail is the engine's to write (engine 0020): the cancel is in it, as the client.
    refused(
        client,
        "insert into pgflow.operator_actions (action, actor, flow_slug, acted_at)"
        " values ('cancel', 'someone else', 'chain', '2001-01-01')",
    )
    [action] = engine.all("select action, actor, detail from pgflow.operator_actions")
    assert action == {
        "action": "cancel",
        "actor": logins.login_role("client"),
        "detail": {"reason": "no longer needed"},
    }


def test_a_reader_reads_everything_and_writes_nothing(engine: Engine, logins: Logins) -> None:
    compiled(engine)
    run_id = engine.start("chain", {"n": 3})
    reader = logins.login("reader")
    assert reader.execute("select count(*) from pgflow.runs").fetchone() == (1,)
    assert reader.execute("select queue_length from pgmq.metrics('chain')").fetchone() == (1,)
    assert reader.execute("select count(*) from pgflow.queue_coverage()").fetchone() == (2,)
    refused(reader, "select pgflow.start_flow('chain', '{}')")
    refused(reader, "select pgflow.cancel_run(%s, 'x')", run_id)
    refused(
        reader,
        "insert into pgflow.operator_actions (action, actor, flow_slug) values ('x', 'y', 'chain')",
    )
    refused(reader, "update pgflow.step_tasks set status = 'completed'")
    refused(reader, "delete from pgmq.q_chain")


def test_an_admin_compiles_limits_and_deletes_flows(engine: Engine, logins: Logins) -> None:
    admin = logins.login("admin")
    row = admin.execute(
        "select pgflow.ensure_flow_compiled('chain', %s, 'flow', %s)", (Jsonb(SHAPE), Jsonb(ROUTES))
    ).fetchone()
    assert row is not None
    assert row[0]["status"] == "compiled"
    admin.execute("select pgflow.set_step_limits('chain', 'first', 2)")
    admin.execute("select pgflow.reset_step_limits('chain', 'first')")
    admin.execute("select pgflow.pause_step('chain', 'second', 'maintenance')")
    admin.execute("select run_id from pgflow.start_flow('chain', '{}')")  # a client's too
    refused(admin, "select * from pgflow.read_and_claim('chain', 'chain', %s, 10, 30)", WORKER)
    admin.execute("select pgflow.delete_flow_and_data('chain')")
    assert engine.value("select count(*) from pgflow.flows") == 0


def test_a_queue_that_is_not_the_engines_is_out_of_reach(engine: Engine, logins: Logins) -> None:
    compiled(engine)
    engine.conn.execute("select pgmq.create('app_mail')")
    engine.conn.execute("select pgmq.send('app_mail', '{}')")
    worker = logins.login("worker")
    message = refused(
        worker, "select * from pgflow.set_vt_batch('app_mail', array[1]::bigint[], array[600])"
    )
    assert message == 'Queue "app_mail" is not a queue of the engine\'s flows.'
    refused(worker, "select pgflow.enable_insert_notifications('app_mail')")
    assert engine.value("select count(*) from pgmq.q_app_mail where vt > now()") == 0


def test_granting_twice_changes_nothing_and_is_recorded(
    conn: psycopg.Connection[Any], logins: Logins
) -> None:
    roles.apply(conn, roles.group_statements(conn, logins.names))
    assert roles.recorded(conn) == logins.names


def test_keyed_tasks_settle_when_a_clients_or_workers_transaction_commits(
    engine: Engine, logins: Logins
) -> None:
    """The commit-time settlement of concurrency keys (engine 0018, a deferred trigger) runs as
    the committing session's role, which may read no table: it runs as the owner."""
    keyed = {
        "steps": [
            shape_step("render", options={"concurrencyKey": "$.tenant", "concurrencyLimit": 1})
        ],
        "options": {},  # a described shape, as generated migrations send: its options apply
    }
    engine.value("select pgflow.ensure_flow_compiled('reports', %s)", Jsonb(keyed))
    client = logins.login("client")
    start = "select run_id from pgflow.start_flow('reports', %s)"
    runs = [client.execute(start, (Jsonb({"tenant": "a"}),)).fetchall()[0][0] for _ in range(2)]
    assert [engine.task(r, "render")["message_id"] is not None for r in runs] == [True, False]
    worker = logins.login("worker")
    worker.execute("select pgflow.register_worker(%s, 'reports', 'w')", (WORKER,))
    [task] = worker.execute(
        "select run_id, attempt from pgflow.read_and_claim('reports', 'reports', %s, 10, 30)",
        (WORKER,),
    ).fetchall()
    worker.execute("select pgflow.fail_task(%s, 'render', 0, 'no', %s, 'gone')", task)
    assert engine.task(runs[1], "render")["message_id"] is not None  # the place passed on
