from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
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


def test_each_command_is_found_in_the_group_that_registers_it() -> None:
    for group in cli_app.GROUPS:
        top = cli_parser.parser(prog="pgflow-gen")
        commands = cli_parser.Commands(top.add_subparsers())
        importlib.import_module(f"pgflow_gen.cli.{group}").register(commands)
        registered = next(
            action.choices for action in top._actions
            if isinstance(action, argparse._SubParsersAction)
        )  # fmt: skip
        assert {c: group for c in registered} == {
            c: g for c, g in cli_app.GROUP_OF.items() if g == group
        }


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status", "x"], "status"),
        (["--format", "json", "coverage"], "coverage"),
        (["--database-url", "postgresql:///x", "--debug", "runs"], "runs"),
        (["--format=json", "flows"], "flows"),
        (["--version"], None),
        ([], None),
    ],
)
def test_the_command_is_the_first_word_that_is_no_global_option(
    argv: list[str], command: str | None
) -> None:
    assert cli_app._named_command(argv) == command


@pytest.mark.parametrize(
    "argv", [["--version"], ["validate", "--help"], ["build", "--help"], ["graph", "--help"]]
)
def test_commands_without_a_database_load_no_database_driver(argv: list[str]) -> None:
    probe = (
        "import contextlib, io, sys\n"
        "from pgflow_gen.cli import app\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    app.main({argv!r})\n"
        "heavy = ('psycopg', 'pgflow_gen.runtime.client', 'pgflow_gen.runtime.worker.process')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("command", [["runs"], ["start", "x", "--input", "{}"]])
def test_a_database_command_still_reports_a_database_error_in_one_line(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code = cli.main([*command, "--database-url", "postgresql://nobody@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILURE
    assert err.startswith("error: cannot reach the database: ")
    assert "Traceback" not in err
