"""`pgflow-gen db roles` (engine 0019): prints or applies the group roles, step roles with
--per-step, and says clearly what is wrong; `db migrate` grants the recorded roles again."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgflow_gen import cli
from pgflow_gen.runtime import migrations
from tests.engine import Engine
from tests.roles import Logins


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    return Engine(conn)


def roles_named(conn: psycopg.Connection[Any], prefix: str) -> list[tuple[str, bool]]:
    return [
        (row[0], row[1])
        for row in conn.execute(
            "select rolname, rolcanlogin from pg_roles where rolname like %s order by 1",
            (f"{prefix}\\_%",),
        )
    ]


def test_printing_changes_nothing(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["db", "roles", "--prefix", "printonly", "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert 'create role "printonly_worker" nologin;' in out
    assert (
        'grant execute on function "pgflow"."read_and_claim"(flow_slug text, queue_name text,'
        ' worker_id uuid, qty integer, vt integer, step_slug text) to "printonly_worker";' in out
    )
    assert 'grant select on all tables in schema "pgflow" to "printonly_reader";' in out
    assert roles_named(conn, "printonly") == []
    assert conn.execute("select count(*) from pgflow.engine_roles").fetchone() == (0,)


def test_applying_grants_and_per_step_makes_a_login_per_step(
    engine: Engine, logins: Logins, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.compile("orders", [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}])
    prefix = logins.prefix
    args = ["db", "roles", "--prefix", prefix, "--per-step", "orders", "--apply"]
    logins.created += [f"{prefix}_orders__charge", f"{prefix}_orders__mail"]  # dropped after
    assert cli.main([*args, "--database-url", db_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"roles: {prefix}_reader, {prefix}_client, {prefix}_worker, {prefix}_admin granted",
        f'step role: {prefix}_orders__charge (step "charge" of flow "orders")',
        f'step role: {prefix}_orders__mail (step "mail" of flow "orders")',
        "next: give each step role its secret (alter role ... password '...')",
    ]
    assert roles_named(engine.conn, prefix) == [
        (f"{prefix}_admin", False),
        (f"{prefix}_client", False),
        (f"{prefix}_orders__charge", True),
        (f"{prefix}_orders__mail", True),
        (f"{prefix}_reader", False),
        (f"{prefix}_worker", False),
    ]
    assert engine.all("select role_name, step_slug from pgflow.step_roles order by 1") == [
        {"role_name": f"{prefix}_orders__charge", "step_slug": "charge"},
        {"role_name": f"{prefix}_orders__mail", "step_slug": "mail"},
    ]
    assert cli.main([*args, "--database-url", db_url]) == 0  # again: nothing new, no error


def test_step_roles_whose_step_is_gone_are_named(
    engine: Engine, logins: Logins, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine.compile("orders", [{"slug": "charge"}, {"slug": "mail", "deps": ["charge"]}])
    made = logins.add_step_roles("orders")
    engine.value("select count(*) from pgflow.delete_flow_and_data('orders')")
    engine.compile("orders", [{"slug": "charge"}])  # applied again without "mail"
    mail = made[1].role
    expected = (
        f'step role {mail} works on nothing: step "mail" of flow "orders" does not exist'
        f" (apply the flow again, or drop role {mail})"
    )
    base = ["db", "roles", "--prefix", logins.prefix, "--database-url", db_url]

    assert cli.main(base) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"-- {expected}"
    assert cli.main([*base, "--apply"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"warning: {expected}"


def test_migrate_grants_the_recorded_roles_again(
    engine: Engine, logins: Logins, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start_flow = "pgflow.start_flow(text, jsonb, uuid, text, int)"
    client = logins.names.client
    engine.conn.execute(f"revoke execute on function {start_flow} from {client}")
    assert cli.main(["db", "migrate", "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert f"granted again: {logins.names.reader}, {client}," in out
    assert engine.value("select has_function_privilege(%s, %s, 'execute')", client, start_flow)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix", "Bad-Prefix"], "error: --prefix 'Bad-Prefix' is not a role name prefix."),
        (["--prefix", "far_too_long_prefix"], "is not a role name prefix"),
        (["--per-step", "single"], 'error: Flow "single" uses one queue for all its steps'),
        (["--per-step", "nowhere"], 'error: Flow "nowhere" is not compiled in this database.'),
    ],
)
def test_a_wrong_call_says_what_is_wrong_in_one_line_and_a_hint(
    engine: Engine,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    engine.flow("single", {"slug": "only"})
    assert cli.main(["db", "roles", *args, "--database-url", db_url]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert "HINT: " in captured.err
    assert "Traceback" not in captured.err
    assert roles_named(engine.conn, "bad") == []


def test_an_engine_before_roles_says_to_migrate(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        migrations.migrate(conn, target="0018")
    assert cli.main(["db", "roles", "--database-url", empty_db_url]) == 1
    err = capsys.readouterr().err
    assert "error: This database's engine has no roles yet (engine migration 0019)." in err
    assert "HINT: Run `pgflow-gen db migrate` first." in err
