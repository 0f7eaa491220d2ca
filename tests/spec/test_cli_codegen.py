"""`pgflow-gen validate`, `build` and `graph` as a user runs them: exit codes and output."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pgflow_gen import cli

EXAMPLE = Path(__file__).parents[2] / "examples" / "community_threads"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(EXAMPLE / "flows", tmp_path / "flows")
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_validate_exits_0_for_valid_specs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["validate", "flows"]) == cli.EXIT_OK
    assert "1 spec file valid" in capsys.readouterr().out


def test_validate_exits_2_and_reports_json(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "flows" / "bad.yaml").write_text("slug: bad__slug\nsteps: []\n")
    assert cli.main(["validate", "flows", "--format", "json"]) == cli.EXIT_USAGE
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    [error] = report["errors"]
    assert (error["code"], error["file"], error["line"], error["path"]) == (
        "invalid_slug",
        "flows/bad.yaml",
        1,
        "slug",
    )
    assert set(error) == {
        "code",
        "file",
        "line",
        "column",
        "path",
        "flow_slug",
        "step_slug",
        "step_index",
        "message",
        "detail",
        "hint",
    }


def test_build_then_check_is_current(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    assert (project / "app" / "pgflow" / "community_threads_v1.py").is_file()
    assert cli.main(["build", "flows", "--out", "app/pgflow", "--check"]) == cli.EXIT_OK


def test_check_exits_1_with_a_diff_when_stale(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.main(["build", "flows", "--out", "app/pgflow"])
    procfile = project / "app" / "pgflow" / "Procfile"
    procfile.write_text(procfile.read_text() + "extra: line\n")
    capsys.readouterr()
    assert cli.main(["build", "flows", "--out", "app/pgflow", "--check"]) == cli.EXIT_FAILURE
    out = capsys.readouterr().out
    assert "--- a/Procfile" in out
    assert "-extra: line" in out
    assert procfile.read_text().endswith("extra: line\n")


def test_build_exits_2_on_invalid_specs_and_writes_nothing(project: Path) -> None:
    (project / "flows" / "bad.yaml").write_text(
        "slug: fine\nsteps:\n  - {slug: a, handler: nope}\n"
    )
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_USAGE
    assert not (project / "app" / "pgflow").exists()


def test_build_reads_its_defaults_from_pyproject(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.pgflow-gen]\nspecs = ["flows"]\nout = "app/pgflow"\n'
    )
    assert cli.main(["build"]) == cli.EXIT_OK
    assert (project / "app" / "pgflow" / "Procfile").is_file()


def test_build_without_paths_or_config_is_a_usage_error(project: Path) -> None:
    assert cli.main(["build"]) == cli.EXIT_USAGE


def test_graph_prints_mermaid_with_queues_and_conditions(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["graph", "flows/community_threads.yaml"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("%% flow communityThreadsV1 (queue mode: step)\nflowchart TD\n")
    assert "queue: communitythreadsv1__deliverslack" in out
    assert "when_unmet: skip" in out
    assert "  classify --> deliverSlack\n" in out


def test_graph_prints_dot(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["graph", "--format", "dot", "flows/community_threads.yaml"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith('digraph "communityThreadsV1" {')
    assert '"listHelpers" -> "thankHelpers";' in out


def test_graph_prints_the_dags_metadata_as_json(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["graph", "flows", "--format", "json"]) == cli.EXIT_OK
    [flow] = json.loads(capsys.readouterr().out)["flows"]
    assert (flow["source"], flow["flow_slug"], flow["queue_mode"]) == (
        "flows/community_threads.yaml", "communityThreadsV1", "step",
    )  # fmt: skip
    steps = {step["slug"]: step for step in flow["steps"]}
    assert list(steps) == ["classify", "deliverSlack", "listHelpers", "thankHelpers"]
    assert steps["deliverSlack"]["if"] == {"classify": {"route": "help"}}
    assert steps["deliverSlack"]["queue_name"] == "communitythreadsv1__deliverslack"
    thank = steps["thankHelpers"]
    assert (thank["type"], thank["array"], thank["edges_from"]) == (
        "map", "listHelpers", ["listHelpers"],
    )  # fmt: skip


def test_graph_without_paths_reads_the_projects_specs(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["graph"]) == cli.EXIT_USAGE
    assert "set `specs` under [tool.pgflow-gen]" in capsys.readouterr().err
    (project / "pyproject.toml").write_text('[tool.pgflow-gen]\nspecs = ["flows"]\n')
    assert cli.main(["graph"]) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith("%% flow communityThreadsV1")


def write_flow(folder: Path, name: str, slug: str) -> None:
    (folder / name).write_text(f"slug: {slug}\nsteps:\n  - slug: only\n    handler: app.h:only\n")


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        ("sameFlow", "SameFlow", 'flow slug ignoring case "sameflow"'),
        ("fooBar", "foo_bar", 'flow module "foo_bar"'),
    ],
)
def test_validate_and_build_report_flows_that_collide(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    first: str,
    second: str,
    shared: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flows").mkdir()
    write_flow(tmp_path / "flows", "a.yaml", first)
    write_flow(tmp_path / "flows", "b.yaml", second)

    assert cli.main(["validate", "flows"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f'flows/b.yaml:1:1: error[name_collision] (slug): Flow "{second}" and flow "{first}"'
        f" of flows/a.yaml share the {shared}."
    )
    assert cli.main(["build", "flows", "--out", "app/pgflow", "--package", "app.pgflow"]) == 2
    assert "error[name_collision]" in capsys.readouterr().err
    assert not (tmp_path / "app").exists()


def test_a_flow_named_like_a_folder_of_the_output_gets_its_own_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flows").mkdir()
    write_flow(tmp_path / "flows", "w.yaml", "workers")
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    assert (tmp_path / "app" / "pgflow" / "workers_.py").is_file()
    assert (tmp_path / "app" / "pgflow" / "workers" / "workers_" / "worker.py").is_file()


PRICED = """\
slug: priced
input: {type: array, items: {type: number}}
steps:
  - slug: priceLines
    handler: app.pricing:price_line
"""


@pytest.fixture
def priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with the spec PRICED and a package `app` (its handler module written by the
    test), as the current folder."""
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "priced.yaml").write_text(PRICED)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").touch()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_validate_check_handlers_imports_each_handler_and_names_the_near_match(
    priced: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path = priced
    (tmp_path / "app" / "pricing.py").write_text("def price_lines(values, ctx):\n    return 1\n")
    assert cli.main(["validate", "flows"]) == cli.EXIT_OK  # the spec alone is valid
    capsys.readouterr()

    assert cli.main(["validate", "flows", "--check-handlers"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "flows/priced.yaml:5:5: error[handler_not_importable] (steps[0].handler): The handler"
        ' "app.pricing:price_line" of step "priceLines" does not import: \'app.pricing\' has no'
        " attribute 'price_line'.",
        '  hint: Did you mean "price_lines"? Handler names are exact.',
        "1 problem in 1 file",
    ]
    assert "app.pricing" not in sys.modules  # forgotten: the next import reads the file anew

    (tmp_path / "flows" / "priced.yaml").write_text(PRICED.replace("price_line", "price_lines"))
    assert cli.main(["validate", "flows", "--check-handlers"]) == cli.EXIT_OK


def test_check_handlers_says_to_build_when_a_handler_imports_code_not_generated_yet(
    priced: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (priced / "app" / "pricing.py").write_text("from app.pgflow.priced import Steps\n")
    assert cli.main(["validate", "flows", "--check-handlers"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ModuleNotFoundError: No module named 'app.pgflow'" in err
    assert (
        "  hint: The module imports 'app.pgflow', which is missing: if that is the generated" in err
    )
    assert "Traceback" not in err


def test_build_warns_of_a_misspelt_handler_once_its_module_imports_the_new_code(
    priced: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The module imports the code the build writes: build checks after writing it."""
    (priced / "app" / "pricing.py").write_text(
        "from app.pgflow.priced import Steps\n\n\ndef price_lines(values, ctx):\n    return 1\n"
    )
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "wrote   app/pgflow/priced.py" in captured.out
    assert captured.err.splitlines() == [
        "flows/priced.yaml:5:5: warning[handler_not_importable] (steps[0].handler): The handler"
        ' "app.pricing:price_line" of step "priceLines" does not import: \'app.pricing\' has no'
        " attribute 'price_line'.",
        '  hint: Did you mean "price_lines"? Handler names are exact.',
    ]
    assert "app.pricing" not in sys.modules


@pytest.mark.parametrize(
    "module",
    [
        "raise RuntimeError('needs the production settings')\n",  # does not import cleanly
        "def price_line(values, ctx):\n    return 1\n",  # holds its handler
        None,  # not written yet: the build's other warning says so
    ],
    ids=["fails-to-import", "right", "not-written"],
)
def test_build_says_nothing_of_handlers_that_do_not_import_cleanly_or_are_right(
    priced: Path, capsys: pytest.CaptureFixture[str], module: str | None
) -> None:
    if module is not None:
        (priced / "app" / "pricing.py").write_text(module)
    assert cli.main(["build", "flows", "--out", "app/pgflow"]) == cli.EXIT_OK
    err = capsys.readouterr().err
    assert "handler_not_importable" not in err
    assert "Traceback" not in err
    assert ("is not found under" in err) == (module is None)
