from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from pgflow_gen import cli
from pgflow_gen.runtime import database, embedded, migrations
from tests.engine import Engine


def test_db_migrate_installs_pgmq_and_the_engine(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["db", "migrate", "--database-url", empty_db_url]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "installed PGMQ" in out
    assert "applying 0001_initial" in out
    assert cli.main(["db", "migrate", "--database-url", empty_db_url]) == cli.EXIT_OK
    assert "engine is up to date" in capsys.readouterr().out


def test_db_migrate_honours_pgflow_database_url(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PGFLOW_DATABASE_URL", empty_db_url)
    assert cli.main(["db", "migrate", "--target", "0001"]) == cli.EXIT_OK
    assert "applied 1 migration" in capsys.readouterr().out


def test_db_status_lists_versions_and_migrations(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["db", "status", "--database-url", db_url]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert f"PGMQ {migrations.pgmq_sql()[1]}" in out
    assert "0001_initial applied" in out


def test_an_unknown_target_exits_1_with_a_hint(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["db", "migrate", "--database-url", db_url, "--target", "0999"]) == 1
    err = capsys.readouterr().err
    assert "Unknown migration target '0999'" in err
    assert "HINT: Known migrations: 0001" in err


def test_an_unreachable_database_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://nobody@/nodb?host=/nonexistent-socket-dir&connect_timeout=2"
    assert cli.main(["db", "migrate", "--database-url", url]) == 1
    assert "cannot reach the database" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["runs"], ["db", "status"]])
def test_piping_into_a_closed_reader_ends_quietly(db_url: str, command: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `pgflow-gen runs | head -1` once head has exited
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pgflow_gen.cli", *command, "--database-url", db_url],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (cli.EXIT_BROKEN_PIPE, b"")


@pytest.mark.slow
def test_a_command_from_a_subfolder_uses_the_project_roots_embedded_server(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pgflow-gen]\nspecs = ["flows"]\n')
    (tmp_path / "app").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in database.ENV_VARS}
    server = embedded.EmbeddedServer.for_project(tmp_path)

    def db_url(cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgflow_gen.cli", "db", "url"],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    try:
        first = db_url(tmp_path / "app")
        assert (first.returncode, first.stdout) == (0, server.url() + "\n"), first.stderr
        assert first.stderr == f"starting the embedded PostgreSQL of {tmp_path.resolve()}\n"
        assert not embedded.project_base_dir(tmp_path / "app").exists()  # no second cluster
        again = db_url(tmp_path)
        assert (again.returncode, again.stdout, again.stderr) == (0, server.url() + "\n", "")
    finally:
        server.destroy()


def test_db_stop_names_the_live_workers_it_stops_the_database_under(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pgflow-gen]\nspecs = ["flows"]\n')
    env = {k: v for k, v in os.environ.items() if k not in database.ENV_VARS}
    server = embedded.EmbeddedServer.for_project(tmp_path)

    def cli_in(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgflow_gen.cli", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    try:
        assert cli_in("db", "migrate").returncode == 0
        with psycopg.connect(server.url(), autocommit=True) as conn:
            engine = Engine(conn)
            engine.flow("orders", {"slug": "pay"})
            engine.call("register_worker", uuid.uuid4(), "orders", "orders-pay", flow_slug="orders")
            engine.call("register_worker", uuid.uuid4(), "orders", "gone", flow_slug="orders")
            conn.execute(
                "update pgflow.workers set stopped_at = now() where function_name = 'gone'"
            )
        stopped = cli_in("db", "stop")
        assert (stopped.returncode, stopped.stdout) == (0, "stopped\n")
        assert stopped.stderr == (
            "stopping the database under 1 live worker: orders-pay (orders); they wait for it"
            " and go on when it starts again (or stop them first)\n"
        )
        again = cli_in("db", "stop")
        assert (again.returncode, again.stdout, again.stderr) == (0, "not running\n", "")
    finally:
        server.destroy()
