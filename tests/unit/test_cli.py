from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgflow_gen import cli
from pgflow_gen.cli import app as cli_app
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.runtime.sql import shipped


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


def test_version_names_the_package_and_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["--version"])
    assert raised.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("pgflow-gen ")
    assert out.endswith(f"(engine {shipped.available()[-1].version})")


def _all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _all_parsers(sub)


def test_every_option_has_help_that_shows_its_default() -> None:
    formatter = cli_parser.HelpFormatter("pgflow-gen")
    checked = 0
    for parser in _all_parsers(cli_app._parser()):
        assert parser.formatter_class is cli_parser.HelpFormatter, parser.prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            where = f"{parser.prog} {action.option_strings or action.dest}"
            assert action.help, f"{where} has no help"
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in (formatter._get_help_string(action) or ""), where
            checked += 1
    assert checked > 40


SPEC = "slug: {slug}\nsteps:\n  - slug: one\n    handler: app.h:one\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--format", "json", "validate", "{dir}"],
        ["validate", "{dir}", "--format", "json"],
        ["--format", "text", "validate", "{dir}", "--format", "json"],  # after the command wins
    ],
)
def test_global_options_go_before_or_after_the_command(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(SPEC.format(slug="flowA"))
    assert cli.main([arg.format(dir=tmp_path) for arg in argv]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"ok": True, "errors": []}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--format", "json", "build"], "error: pgflow-gen build has no --format option."),
        (["--format", "dot", "validate", "x.yaml"], "error: --format dot is not a format of"
         " pgflow-gen validate."),
        (["--database-url", "postgresql://x/y", "db", "sql"], "error: pgflow-gen db sql does"
         " not use a database (--database-url)."),
    ],
)  # fmt: skip
def test_a_global_option_the_command_does_not_take_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[0] == message


def test_the_database_url_goes_before_the_command_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--database-url", "postgresql://a@b/c", "db", "url"]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == "postgresql://a@b/c"


def test_graph_takes_a_folder_and_draws_every_flow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(SPEC.format(slug="flowA"))
    (tmp_path / "b.yaml").write_text(SPEC.format(slug="flowB"))
    assert cli.main(["graph", str(tmp_path), "--format", "dot"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.count("digraph") == 2
    assert out.index("flowA") < out.index("flowB")
