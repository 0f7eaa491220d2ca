"""Least privilege end to end (engine 0019): each step's generated worker runs with its step's
own role, a client role starts the run, a reader role watches it with the CLI, an admin role
applies the flows and prunes, a plain flow's worker (and its scheduler) runs with the worker
role, and a worker with another step's role stops at startup with one clear line."""

from __future__ import annotations

import json
import uuid

import pytest
from psycopg import sql

from tests.e2e.harness import PROJECT, Db, Workers, eventually, run_cli
from tests.roles import Logins

MIGRATIONS = PROJECT / "app" / "pgflow" / "migrations"
STEPS_MIGRATION = MIGRATIONS / "e2eSteps.sql"
PLAIN_MIGRATION = MIGRATIONS / "e2ePlain.sql"
SCHEDULED_MIGRATION = MIGRATIONS / "e2eScheduled.sql"


def test_every_step_runs_with_its_own_role(
    workers: Workers, db: Db, logins: Logins, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute(STEPS_MIGRATION.read_text())  # the admin's part: the flow is compiled
    step_roles = {r.step_slug: r.role for r in logins.add_step_roles("e2eSteps")}
    for step, role in step_roles.items():
        workers.start("e2e_steps", step, PGFLOW_DATABASE_URL=logins.url_of(role)).started()

    client_url = logins.url_of(logins.login_role("client"))
    code, out, err = run_cli(
        capsys, client_url, "start", "e2eSteps", "--input", '{"n": 1}', "--format", "json"
    )
    assert (code, err) == (0, "")
    run_id = uuid.UUID(json.loads(out)["run_id"])
    run = db.finished(run_id)
    assert (run["status"], run["output"]) == ("completed", {"second": 4, "side": "side 1"})
    # Each task was claimed by the worker of its own step's role:
    claimed = db.all(
        "select t.step_slug, w.step_slug as worker_step from pgflow.step_tasks t"
        " join pgflow.workers w on w.worker_id = t.last_worker_id order by 1"
    )
    assert [(r["step_slug"], r["worker_step"]) for r in claimed] == [
        ("first", "first"),
        ("second", "second"),
        ("side", "side"),
    ]

    reader_url = logins.url_of(logins.login_role("reader"))
    code, out, err = run_cli(capsys, reader_url, "status", str(run_id), "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out)["run"]["status"] == "completed"
    code, out, err = run_cli(capsys, reader_url, "start", "e2eSteps", "--input", '{"n": 2}')
    assert code == 1
    assert "error: permission denied for function start_flow" in err
    assert "This needs a role the engine grants it (pgflow-gen db roles" in err
    assert "Traceback" not in err


def test_a_worker_with_another_steps_role_stops_at_startup(
    workers: Workers, db: Db, logins: Logins
) -> None:
    db.conn.execute(STEPS_MIGRATION.read_text())
    step_roles = {r.step_slug: r.role for r in logins.add_step_roles("e2eSteps")}
    worker = workers.start(
        "e2e_steps", "first", PGFLOW_DATABASE_URL=logins.url_of(step_roles["second"])
    )
    assert worker.wait() == 1
    log = worker.log()
    assert f'Role "{step_roles["second"]}" may not work on step "first" of flow "e2eSteps".' in log
    assert "HINT: Run each step's worker with that step's own role" in log
    assert "Traceback" not in log
    assert db.value("select count(*) from pgflow.workers") == 0


def test_a_worker_of_a_flow_nobody_compiled_says_who_may(
    workers: Workers, db: Db, logins: Logins
) -> None:
    worker_url = logins.url_of(logins.login_role("worker"))
    worker = workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=worker_url)
    assert worker.wait() == 1
    log = worker.log()
    assert "this worker's role may not compile it" in log
    assert "Apply the flow's migration as an admin first (`pgflow-gen db apply`)." in log
    assert "Traceback" not in log
    assert db.value("select count(*) from pgflow.flows") == 0


def test_an_admin_applies_the_flows_and_a_worker_role_runs_a_plain_flow(
    workers: Workers, db: Db, logins: Logins, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = logins.login_role("admin")
    admin_url = logins.url_of(admin)
    # e2eOrdered's table trigger: its deployer may put triggers on the application's table.
    db.conn.execute(
        sql.SQL("grant trigger on public.e2e_orders to {}").format(sql.Identifier(admin))
    )
    code, out, err = run_cli(capsys, admin_url, "db", "apply", str(PROJECT / "app" / "pgflow"))
    assert (code, err) == (0, "")
    assert "e2ePlain.sql" in out
    assert "e2ePlain" in {r["flow_slug"] for r in db.all("select flow_slug from pgflow.flows")}
    worker_url = logins.url_of(logins.login_role("worker"))
    workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=worker_url).started()
    run_id = db.start("e2ePlain", {"name": "Ada"})
    assert db.finished(run_id)["output"] == {"wrap_up": "ADA!"}

    def pruned() -> bool:
        # A run whose row a worker holds right now is pruned by the next call (by design).
        code, _, err = run_cli(capsys, admin_url, "prune", "--older-than", "0s", "--yes")
        assert (code, err) == (0, "")
        # Only this run: the worker also starts e2eScheduled's runs (its scheduler).
        return bool(db.value("select count(*) from pgflow.runs where run_id = %s", run_id) == 0)

    eventually(pruned, "the admin's prune to delete the finished run")
    # The worker's scheduler (list_schedules, start_scheduled_runs) works with the worker role:
    eventually(
        lambda: db.value("select count(*) from pgflow.runs where flow_slug = 'e2eScheduled'"),
        "a scheduled run started by the worker role's scheduler",
    )


READER_COMMANDS = [
    ["runs"],
    ["flows"],
    ["workers"],
    ["limits"],
    ["schedules"],
    ["db", "status"],
]


def test_each_cli_command_runs_with_the_least_role_it_needs(
    db: Db, logins: Logins, capsys: pytest.CaptureFixture[str]
) -> None:
    db.conn.execute(PLAIN_MIGRATION.read_text())
    db.conn.execute(SCHEDULED_MIGRATION.read_text())
    run_id = db.start("e2ePlain", {"name": "Ada"})
    url = {kind: logins.url_of(logins.login_role(kind)) for kind in ("reader", "client", "admin")}

    for command in READER_COMMANDS:
        code, out, err = run_cli(capsys, url["reader"], *command)
        assert (code, err) == (0, ""), command
        assert out, command
    code, out, err = run_cli(capsys, url["reader"], "status", str(run_id))
    assert (code, err) == (0, "")
    code, out, err = run_cli(capsys, url["reader"], "coverage")
    assert (code, err) == (1, "")  # 1: no worker serves the queues, as coverage says
    assert "e2eplain" in out

    admin_commands = [
        ["pause", "e2ePlain", "shout", "--reason", "maintenance"],
        ["resume", "e2ePlain", "shout"],
        ["limits", "e2ePlain", "shout", "--max-in-flight", "2"],
        ["schedules", "pause", "e2eScheduled", "everySecond"],
        ["schedules", "resume", "e2eScheduled", "everySecond"],
    ]
    for command in admin_commands:
        code, out, err = run_cli(capsys, url["client"], *command)
        assert code == 1, command
        assert "permission denied for function" in err, command
        assert "Traceback" not in err
        code, out, err = run_cli(capsys, url["admin"], *command)
        assert (code, err) == (0, ""), command

    code, out, err = run_cli(capsys, url["reader"], "cancel", str(run_id), "--yes")
    assert code == 1
    assert "permission denied for function cancel_run" in err
    code, out, err = run_cli(capsys, url["client"], "cancel", str(run_id), "--yes")
    assert (code, err) == (0, "")
    assert db.run(run_id)["status"] == "cancelled"


def test_a_worker_started_with_a_readers_role_says_which_role_it_needs(
    workers: Workers, db: Db, logins: Logins
) -> None:
    db.conn.execute(PLAIN_MIGRATION.read_text())
    reader_url = logins.url_of(logins.login_role("reader"))
    worker = workers.start("e2e_plain", "worker", PGFLOW_DATABASE_URL=reader_url)
    assert worker.wait() == 1
    log = worker.log()
    assert 'FlowCompilationError: Flow "e2ePlain" could not be verified.' in log
    assert "permission denied for function verify_flow_compiled" in log
    assert "HINT: This needs a role the engine grants it (pgflow-gen db roles" in log
    assert "Traceback" not in log
    assert db.value("select count(*) from pgflow.workers") == 0
