"""The support window: a process reads the engine's version once, from the migrations table, and
refuses an engine older than the window (or none) with one line saying to migrate; a worker role
whose grants an older release made tells the window's oldest engine from an older one by the
catalog."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgflow_gen import cli
from pgflow_gen.engine import support
from pgflow_gen.runtime import errors, migrations
from pgflow_gen.runtime.sql import shipped
from tests.roles import Logins

NEWEST = shipped.available()[-1].version


def refusal(conn: psycopg.Connection[Any]) -> str:
    with pytest.raises(errors.DatabaseError) as refused:
        support.require(conn)
    assert refused.value.message == "The database has no pgflow engine (or an older one)."
    assert refused.value.hint == "Run `pgflow-gen db migrate` against this database first."
    return str(refused.value.detail)


def test_the_window_holds_this_release_and_the_oldest_engine_it_names() -> None:
    assert support.OLDEST < NEWEST
    support.check(NEWEST)
    support.check(support.OLDEST)
    [oldest] = [m for m in shipped.available() if m.version == support.OLDEST]
    name = support.OLDEST_MARKER.split("(")[0]
    assert f"create function {name}(" in oldest.sql  # the marker came with OLDEST


def test_the_version_comes_from_the_migrations_table(conn: psycopg.Connection[Any]) -> None:
    assert support.require(conn) == NEWEST
    conn.execute("delete from pgflow.schema_migrations where version >= %s", (support.OLDEST,))
    before = max(m.version for m in shipped.available() if m.version < support.OLDEST)
    assert refusal(conn) == (
        f"Its engine is at migration {before}; this release works with migration"
        f" {support.OLDEST} and later."
    )


def test_a_database_without_the_engine_is_refused(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert refusal(conn) == "It has no engine migrations (pgflow.schema_migrations)."


def test_a_worker_role_reads_the_version_or_tells_it_by_the_catalog(
    conn: psycopg.Connection[Any], logins: Logins
) -> None:
    worker = logins.login("worker")
    assert support.require(worker) == NEWEST  # `db roles` grants workers the migrations table
    # Grants an older release made: no read of the table, so the catalog decides.
    conn.execute(f'revoke select on pgflow.schema_migrations from "{logins.names.of("worker")}"')
    assert support.require(worker) == support.OLDEST
    conn.execute(f"drop function {support.OLDEST_MARKER}")  # as an engine before OLDEST
    assert refusal(worker) == (
        f"Its engine is older than migration {support.OLDEST}, which this release needs."
    )


def test_the_db_commands_upgrade_an_engine_older_than_the_window(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        migrations.migrate(conn, target="0019")
    assert cli.main(["runs", "--database-url", empty_db_url]) == 1
    assert "Its engine is at migration 0019" in capsys.readouterr().err
    assert cli.main(["db", "status", "--database-url", empty_db_url]) == 0
    assert "0020_engine_integrity pending" in capsys.readouterr().out
    assert cli.main(["db", "migrate", "--database-url", empty_db_url]) == 0
    capsys.readouterr()
    assert cli.main(["runs", "--database-url", empty_db_url]) == 0


def test_the_cli_shows_runs_on_the_oldest_engine_of_the_window(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Statements that read what a later migration added (subflows, engine 0028) are chosen by
    # the engine's version: on an older one they read no subflow runs.
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        migrations.migrate(conn, target=support.OLDEST)
        conn.execute("select pgflow.create_flow('old')")
        conn.execute("select pgflow.add_step('old', 'only')")
        [(run_id,)] = conn.execute("select run_id from pgflow.start_flow('old', '{}')").fetchall()

    for args in (
        ["status", str(run_id), "--format", "json"],
        ["runs", "--format", "json"],
        ["runs", "--parent", str(run_id), "--format", "json"],
        ["prune", "--older-than", "1d", "--dry-run", "--format", "json"],
    ):
        assert cli.main([*args, "--database-url", empty_db_url]) == 0, args
        out = json.loads(capsys.readouterr().out)
        if args[0] == "status":
            assert (out["subflow_runs"], out["steps"][0]["subflow_slug"]) == ([], None)
        elif args[0] == "runs":
            expected = [] if "--parent" in args else [(str(run_id), None)]
            assert [(r["run_id"], r["parent_run_id"]) for r in out["runs"]] == expected
        else:
            assert out["runs"] == 0
    # What a later migration adds and the CLI cannot read around says so, in one line.
    assert cli.main(["runs", "--pending", "--database-url", empty_db_url]) == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[0]
        .endswith(
            f"The engine is at migration {support.OLDEST}; debounced starts need migration 0030."
        )
    )
