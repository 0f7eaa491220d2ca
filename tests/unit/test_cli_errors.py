"""The CLI never shows a traceback for a user's mistake: internal errors are one line (exit 70),
a closed pipe ends quietly, a broken config file is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgflow_gen import cli
from pgflow_gen.codegen import build

CLI = [sys.executable, "-m", "pgflow_gen.cli"]


@pytest.fixture
def broken_generator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def explode(*args: object, **kwargs: object) -> dict[str, str]:
        raise RuntimeError("the generator broke\nsecond line")

    monkeypatch.setattr(build, "generate_loaded", explode)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flows").mkdir()
    (tmp_path / "app").mkdir()


@pytest.mark.usefixtures("broken_generator")
def test_an_internal_error_is_one_line_and_exit_70(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_INTERNAL
    captured = capsys.readouterr()
    assert captured.err == (
        "internal error: RuntimeError: the generator broke; rerun with --debug for the traceback\n"
    )


@pytest.mark.usefixtures("broken_generator")
@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--debug", "build", "flows", "--out", "app/pgflow"], None),
        (["build", "flows", "--out", "app/pgflow", "--debug"], None),
        (["build", "flows", "--out", "app/pgflow"], "1"),
    ],
)
def test_debug_shows_the_traceback(
    argv: list[str],
    env: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if env is not None:
        monkeypatch.setenv("PGFLOW_DEBUG", env)
    assert cli.main(argv) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "RuntimeError: the generator broke" in err
    assert err.endswith("rerun with --debug for the traceback\n")


@pytest.mark.parametrize("argv", [["db", "sql"], ["validate", "--format", "json", "nowhere"]])
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, as after `| head -0`
    try:
        result = subprocess.run(
            [*CLI, *argv], stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (cli.EXIT_BROKEN_PIPE, b"")


def test_a_broken_pyproject_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.pgflow-gen\n")
    assert cli.main(["build"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: pyproject.toml is not valid TOML: ")
    (tmp_path / "pyproject.toml").write_text('[tool.pgflow-gen]\nspecs = "flows"\n')
    assert cli.main(["build"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: [tool.pgflow-gen] specs in pyproject.toml must be a list of paths.\n"
        "DETAIL: Got 'flows'.\n"
    )
    (tmp_path / "pyproject.toml").write_text('[tool.pgflow-gen]\nouts = "app"\n')
    assert cli.main(["build"]) == cli.EXIT_USAGE
    assert 'Unknown key "outs"' in capsys.readouterr().err


def test_an_unwritable_output_folder_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = Path(__file__).parents[2] / "examples" / "community_threads" / "flows"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "pgflow").write_text("a file where the output folder should be")
    code = cli.main(["build", str(example), "--out", "app/pgflow", "--package", "app.pgflow"])
    assert code == cli.EXIT_USAGE
    assert capsys.readouterr().err == "error: --out app/pgflow exists and is not a folder.\n"


def test_bad_option_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://nobody@/nodb?host=/nonexistent-socket-dir"
    assert cli.main(["runs", "--limit", "0", "--database-url", url]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "error: --limit must be at least 1.\n"
    assert cli.main(["coverage", "--freshness", "0", "--database-url", url]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "error: --freshness must be above 0 seconds.\n"
    assert os.environ.get("PGFLOW_DEBUG") is None


@pytest.mark.parametrize(
    ("url", "first_line"),
    [
        (
            "postgresq://app:s3cret@localhost/app",
            'error: The database URL is not valid: missing "=" after'
            ' "postgresq://app:***@localhost/app" in connection info string.',
        ),
        (
            "postgresql://app:s3cret@127.0.0.1:5432/app?sslmode=bogus",
            'error: The database URL is not valid: invalid sslmode value: "bogus".',
        ),
    ],
    ids=["malformed", "sslmode"],
)
def test_a_bad_database_url_is_one_message_without_the_password(
    capsys: pytest.CaptureFixture[str], url: str, first_line: str
) -> None:
    assert cli.main(["runs", "--database-url", url]) == cli.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.splitlines()[0] == first_line
    assert err.splitlines()[1].startswith("HINT: Check --database-url, PGFLOW_DATABASE_URL")
    assert "s3cret" not in err
    assert "Traceback" not in err
