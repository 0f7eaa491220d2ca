from __future__ import annotations

import pytest

from pgflow_gen import cli


def test_without_a_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == cli.EXIT_USAGE
    assert "usage: pgflow-gen" in capsys.readouterr().err


def test_an_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["frobnicate"])
    assert raised.value.code == cli.EXIT_USAGE


def test_db_sql_prints_the_engine_migrations(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "sql"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "create schema if not exists pgflow;" in out
    assert "insert into pgflow.schema_migrations" in out
    assert "pgmq.meta" not in out.split("create schema if not exists pgflow;")[0]


def test_db_sql_with_pgmq_prepends_pgmq(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["db", "sql", "--with-pgmq"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    pgmq_starts = out.index("CREATE TABLE IF NOT EXISTS pgmq.meta")
    assert pgmq_starts < out.index("create schema if not exists pgflow")
