"""Managed PostgreSQL without a superuser (engine 0019, docs/security.md): a role with CREATEROLE
that owns its database installs PGMQ and the engine, creates and grants the group roles, and a
worker login in them runs a flow; nothing of it needs a superuser."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgflow_gen import cli
from tests.engine import shape_step
from tests.roles import login_url

WORKER = uuid.UUID("00000000-0000-0000-0000-00000000d001")


@pytest.fixture
def owned(admin_url: str) -> Iterator[tuple[str, str, str]]:
    """(the owner's URL of a database it owns, the password, the prefix of every role made)."""
    prefix = f"m{uuid.uuid4().hex[:8]}"
    owner, password, dbname = f"{prefix}_owner", secrets.token_hex(8), f"{prefix}_db"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("create role {} login createrole nosuperuser password {}").format(
                sql.Identifier(owner), sql.Literal(password)
            )
        )
        admin.execute(
            sql.SQL("create database {} owner {}").format(
                sql.Identifier(dbname), sql.Identifier(owner)
            )
        )
        try:
            yield login_url(admin_url, owner, password, dbname), password, prefix
        finally:
            admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(dbname)))
            made = [
                row[0]
                for row in admin.execute(
                    "select rolname from pg_roles where rolname like %s and rolname <> %s",
                    (f"{prefix}\\_%", owner),
                )
            ]
            for role in made:
                admin.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("drop role {}").format(sql.Identifier(owner)))


def test_an_owner_without_superuser_migrates_grants_and_a_worker_runs(
    owned: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, password, prefix = owned
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(
            "select rolsuper from pg_roles where rolname = current_user"
        ).fetchone() == (False,)
    assert cli.main(["db", "migrate", "--database-url", url]) == 0
    assert cli.main(["db", "roles", "--prefix", prefix, "--apply", "--database-url", url]) == 0
    assert f"roles: {prefix}_reader" in capsys.readouterr().out

    worker_role = f"{prefix}_app_worker"
    with psycopg.connect(url, autocommit=True) as owner:
        owner.execute(
            sql.SQL("create role {} login password {} in role {}").format(
                sql.Identifier(worker_role),
                sql.Literal(password),
                sql.Identifier(f"{prefix}_worker"),
            )
        )
        owner.execute(
            "select pgflow.ensure_flow_compiled('nightly', %s)",
            (Jsonb({"steps": [shape_step("report")]}),),
        )
        run_id = owner.execute("select run_id from pgflow.start_flow('nightly', '{}')").fetchone()
        assert run_id is not None
    with psycopg.connect(login_url(url, worker_role, password), autocommit=True) as worker:
        worker.execute("select pgflow.register_worker(%s, 'nightly', 'w')", (WORKER,))
        [task] = worker.execute(
            "select run_id, attempt from pgflow.read_and_claim('nightly', 'nightly', %s, 1, 30)",
            (WORKER,),
        ).fetchall()
        worker.execute("select pgflow.complete_task(%s, 'report', 0, '{}', %s)", task)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("select input from pgflow.runs")
    with psycopg.connect(url, autocommit=True) as owner:
        status: Any = owner.execute(
            "select status from pgflow.runs where run_id = %s", run_id
        ).fetchone()
        assert status == ("completed",)
